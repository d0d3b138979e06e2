// flashkv/engine.hpp — a Llama-architecture generation engine on the CPU: checkpoint loaders (llama2.c, GGUF v3),
// the llama2.c BPE tokenizer, samplers, and a model whose prefill runs flashkv's exact tiled causal attention and whose
// decode reads a quantized paged KV cache (flashkv/kvcache.hpp).
//
// ARCHITECTURE (Touvron et al., "LLaMA", 2023, §2.2; reference implementation: Karpathy's llama2.c run.c):
//   x = embed[token]; for each layer:
//     h = rmsnorm(x)·attn_norm;  q = Wq h, k = Wk h, v = Wv h  (num_heads / num_heads_kv heads of head_dim)
//     RoPE (Su et al., "RoFormer", 2021, §3.4.2) on q and k as llama2.c defines it: INTERLEAVED pairs (x[2i], x[2i+1])
//       of each head rotated by angle pos · rope_theta^(−2i/head_dim), rope_theta = 10000 for llama2.c checkpoints;
//     x += Wo · attention(q, k, v) (causal, GQA, softmax_scale = 1/sqrt(head_dim))
//     h = rmsnorm(x)·ffn_norm;  x += W2 (silu(W1 h) ∘ W3 h)                       (SwiGLU; Shazeer 2020)
//   logits = Wcls · rmsnorm(x)·final_norm.   rmsnorm(x) = x / sqrt(mean(x²) + norm_eps) (Zhang & Sennrich 2019).
// All weights are float32 row-major [out_features, in_features]; matrix products go through BLAS (cblas_sgemm).
//
// ERRORS: every truncated, corrupt or inconsistent file raises flashkv::IoError (CLI exit code 2) naming the file and
// what was expected vs found; bad arguments raise flashkv::Error naming the argument.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace flashkv {

// ---------------------------------------------------------------------------------------------------------------------
// Model description and weights
// ---------------------------------------------------------------------------------------------------------------------

/// Hyper-parameters of a Llama-architecture model. Counts are in elements / tokens.
struct ModelConfig {
  int32_t dim = 0;            ///< model width (embedding size)
  int32_t hidden_dim = 0;     ///< SwiGLU inner width
  int32_t n_layers = 0;
  int32_t num_heads = 0;      ///< query heads
  int32_t num_heads_kv = 0;   ///< key/value heads (GQA when < num_heads); num_heads % num_heads_kv == 0
  int32_t vocab_size = 0;
  int32_t seq_len = 0;        ///< maximum context in tokens
  int32_t head_dim = 0;       ///< dim / num_heads
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  bool shared_classifier = true;  ///< classifier weights are the token embedding

  int32_t kv_dim() const { return num_heads_kv * head_dim; }
  /// Throws IoError (naming `source`) unless every count is positive, dim % num_heads == 0,
  /// num_heads % num_heads_kv == 0, head_dim is even and the sizes stay below sane limits (2^31 elements).
  void validate(const std::string& source) const;
};

/// Where the weights came from.
enum class CheckpointFormat : int32_t { llama2c_legacy = 0, llama2c_v1 = 1, gguf = 2 };
const char* checkpoint_format_name(CheckpointFormat f);  ///< "llama2c-legacy" | "llama2c-v1" | "gguf"

/// Per-layer weight pointers (float32, row-major [out, in]); valid as long as the owning Model lives.
struct LayerWeights {
  const float* attn_norm = nullptr;  ///< [dim]
  const float* wq = nullptr;         ///< [num_heads·head_dim, dim]
  const float* wk = nullptr;         ///< [num_heads_kv·head_dim, dim]
  const float* wv = nullptr;         ///< [num_heads_kv·head_dim, dim]
  const float* wo = nullptr;         ///< [dim, num_heads·head_dim]
  const float* ffn_norm = nullptr;   ///< [dim]
  const float* w1 = nullptr;         ///< [hidden_dim, dim]  (gate)
  const float* w2 = nullptr;         ///< [dim, hidden_dim]  (down)
  const float* w3 = nullptr;         ///< [hidden_dim, dim]  (up)
};

class Tokenizer;

/// A loaded model. Weights point into a read-only memory mapping of the file where the file stores float32 at
/// 4-byte-aligned offsets (llama2.c, GGUF F32), otherwise into owned buffers (F16/BF16/Q8_0 dequantized on load).
/// Move-only.
class Model {
 public:
  Model() = default;
  Model(Model&&) noexcept = default;
  Model& operator=(Model&&) noexcept = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  ModelConfig config;
  CheckpointFormat format = CheckpointFormat::llama2c_legacy;
  std::string path;                        ///< file it was loaded from ("<memory>" for in-memory buffers)
  const float* token_embedding = nullptr;  ///< [vocab_size, dim]
  std::vector<LayerWeights> layers;        ///< [n_layers]
  const float* final_norm = nullptr;       ///< [dim]
  const float* classifier = nullptr;       ///< [vocab_size, dim] (== token_embedding when shared)
  std::shared_ptr<const Tokenizer> embedded_tokenizer;  ///< GGUF only: the vocabulary stored in the file

  /// Number of bytes of weights the model reads per token (all float32 tensors, classifier counted once if shared).
  std::size_t weight_bytes() const;

  // Storage (internal): keeps the mapping / dequantized buffers alive.
  std::shared_ptr<const void> storage_keepalive;
  std::vector<std::unique_ptr<float[]>> owned;
};

/// Loads a checkpoint, detecting the format from its first bytes: "GGUF" → GGUF v3; uint32 0x616b3432 ("ak42") →
/// llama2.c versioned (version 1 = float32 only); otherwise the llama2.c legacy format. Throws IoError.
Model load_model(const std::string& path);

/// llama2.c legacy: int32 dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len; then float32 weights
/// in llama2.c order (token_embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, freq_cis_real/imag
/// [seq_len·head_dim/2 each, ignored], wcls if vocab_size < 0). A positive vocab_size means a shared classifier.
/// llama2.c v1: uint32 magic 0x616b3432, int32 version = 1, the same 7 int32, uint8 shared_classifier, zero padding to
/// 256 bytes, then float32 weights: attn_norm×L, ffn_norm×L, final_norm, token_embedding, wq×L, wk×L, wv×L, wo×L,
/// w1×L, w2×L, w3×L, [wcls]. The file size must match exactly (legacy: trailing wcls optional only when shared).
Model load_llama2c(const std::string& path);
/// Same as load_llama2c on an in-memory image (copied). Used by the fuzz targets.
Model load_llama2c_from_bytes(std::span<const uint8_t> bytes);

/// Writes `model` as a llama2.c version-1 (float32) checkpoint. Throws IoError if the file cannot be written.
void write_llama2c_v1(const Model& model, const std::string& path);

/// GGUF tensor element types this engine reads (values are GGUF's ggml_type ids).
enum class GgufType : uint32_t { f32 = 0, f16 = 1, q8_0 = 8, bf16 = 30 };
/// Parses "f32" | "f16" | "bf16" | "q8_0"; throws Error naming `argument` otherwise.
GgufType parse_gguf_type(const std::string& name, const std::string& argument = "type");

/// GGUF v3 with general.architecture = "llama": tensors token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v,
/// attn_output, ffn_norm, ffn_gate, ffn_down, ffn_up}, output_norm, [output] (absent = shared classifier); types F32,
/// F16, BF16, Q8_0 (blocks of 32: fp16 scale + 32 int8; dequantized on load); llama.* metadata for the shape
/// (embedding_length, feed_forward_length, block_count, attention.head_count[_kv], context_length,
/// rope.freq_base, attention.layer_norm_rms_epsilon). The embedded vocabulary (tokenizer.ggml.model = "llama":
/// tokens, scores, bos/eos ids) becomes Model::embedded_tokenizer. RoPE is applied in the interleaved-pair layout
/// (ggml's "normal" rope for the llama architecture), so Q/K weights are stored unpermuted.
Model load_gguf(const std::string& path);
Model load_gguf_from_bytes(std::span<const uint8_t> bytes);

/// Writes a GGUF v3 file (alignment 32) of `model` with every matrix stored as `matrix_type` (1-D norms stay F32;
/// with q8_0, matrices whose rows are not a multiple of 32 values are stored as F16, as llama.cpp does) and
/// `tokenizer`'s vocabulary embedded (SentencePiece style: ' ' written as U+2581). Throws IoError / Error.
void write_gguf(const Model& model, const Tokenizer& tokenizer, const std::string& path,
                GgufType matrix_type = GgufType::f32);

// ---------------------------------------------------------------------------------------------------------------------
// Tokenizer (llama2.c / SentencePiece-BPE: merges chosen by highest piece score, byte fallback <0xXX>)
// ---------------------------------------------------------------------------------------------------------------------

class Tokenizer {
 public:
  /// pieces[i] is the UTF-8 text of token i (spaces as ' '), scores[i] its merge score.
  Tokenizer(std::vector<std::string> pieces, std::vector<float> scores, int32_t bos_id = 1, int32_t eos_id = 2,
            int32_t unk_id = 0);
  /// llama2.c tokenizer file: int32 max_token_length, then vocab_size × (float32 score, int32 length, bytes).
  /// Throws IoError on a missing, truncated or inconsistent file (length < 0 or > max_token_length).
  static Tokenizer load_llama2c(const std::string& path, int32_t vocab_size);
  static Tokenizer from_llama2c_bytes(std::span<const uint8_t> bytes, int32_t vocab_size,
                                      const std::string& source = "<memory>");
  /// Writes the llama2.c tokenizer file format.
  void write_llama2c(const std::string& path) const;

  /// Encodes UTF-8 text as llama2.c does: optional BOS, a dummy-prefix ' ' piece when the text is non-empty, one token
  /// per UTF-8 code point (or one <0xXX> byte token per byte when the code point is not a piece; unk_id if the
  /// vocabulary has no byte pieces), then repeatedly merges the adjacent pair whose concatenation is the piece of
  /// highest score; optional EOS.
  std::vector<int32_t> encode(std::string_view text, bool bos = true, bool eos = false) const;
  /// Text of `token` following `prev_token`: drops the leading space after BOS, turns <0xXX> into the raw byte.
  /// Throws Error for an out-of-range token id.
  std::string decode_piece(int32_t prev_token, int32_t token) const;
  /// Concatenation of decode_piece over `tokens` (the first token's predecessor is BOS).
  std::string decode(std::span<const int32_t> tokens) const;

  int32_t vocab_size() const { return static_cast<int32_t>(pieces_.size()); }
  const std::string& piece(int32_t id) const { return pieces_.at(static_cast<std::size_t>(id)); }
  float score(int32_t id) const { return scores_.at(static_cast<std::size_t>(id)); }
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t unk_id() const { return unk_id_; }
  /// Id of the piece with exactly this text, or −1.
  int32_t lookup(std::string_view piece) const;

 private:
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<int32_t> sorted_;    // ids sorted by piece (for lookup)
  std::vector<int32_t> byte_ids_;  // [256], −1 when the vocabulary has no <0xXX> piece for the byte
  int32_t bos_id_, eos_id_, unk_id_;
};

// ---------------------------------------------------------------------------------------------------------------------
// Sampling
// ---------------------------------------------------------------------------------------------------------------------

struct SamplerConfig {
  float temperature = 0.0f;  ///< 0 = greedy (argmax, lowest id on ties); > 0 divides the logits
  float top_p = 1.0f;        ///< nucleus (Holtzman et al. 2020, §3.1): smallest set with cumulative prob >= top_p
  int32_t top_k = 0;         ///< keep the k most probable tokens (0 = off); applied before top_p
  uint64_t seed = 42;        ///< xorshift64* state; the same seed gives the same tokens
  /// Throws Error naming "temperature" (< 0 or non-finite), "top_p" (not in (0, 1]) or "top_k" (< 0).
  void validate() const;
};

/// Seeded sampler. Ties in probability are broken by the lower token id, so results do not depend on sort stability.
class Sampler {
 public:
  explicit Sampler(SamplerConfig config);
  /// Draws one token id from `logits` [vocab] (float32, not modified). Throws Error if logits is empty.
  int32_t sample(std::span<const float> logits);
  /// Probabilities after temperature, top-k and top-p (renormalized; zeros outside the kept set). Used by the tests.
  std::vector<double> distribution(std::span<const float> logits) const;
  /// Next uniform in [0, 1) from the xorshift64* stream (24-bit resolution).
  float next_uniform();
  const SamplerConfig& config() const { return config_; }

 private:
  SamplerConfig config_;
  uint64_t state_;
};

// ---------------------------------------------------------------------------------------------------------------------
// KV cache selection and the inference engine
// ---------------------------------------------------------------------------------------------------------------------

/// Which KV cache the engine decodes from (mapped onto flashkv::KVCacheConfig, see flashkv/kvcache.hpp).
struct KVCacheSpec {
  /// kv_cache_dtype grammar of kvcache.hpp: "fp32", "bf16", "fp8_e4m3", "int8", "int4", "int4_kivi", "int2_kivi",
  /// "k:int8,v:int4", "int4_g32", ...
  std::string kv_cache_dtype = "fp32";
  int32_t residual = 0;    ///< most recent tokens kept in bf16 (KIVI residual window)
  int32_t sinks = 0;       ///< first tokens kept in bf16
  bool rotate = false;     ///< randomized Walsh–Hadamard rotation before quantization (head_dim a power of two)
  uint64_t rotation_seed = 0;
  int32_t page_size = 32;  ///< tokens per page (power of two, 16–256, a multiple of the KIVI group)
  /// Table label, e.g. "int2_kivi r32", "k:int8,v:int4 s4 hadamard".
  std::string label() const;
};

/// Memory used by the engine's KV cache (from PagedKVCache::memory_report()).
struct KVMemory {
  std::size_t bytes = 0;             ///< codes + metadata + residual + page slack, all layers, all sequences
  std::size_t tokens = 0;            ///< cached tokens summed over sequences
  double bytes_per_token = 0.0;      ///< all layers, K and V
  double effective_bits = 0.0;       ///< bits per cached element, everything counted
  double bf16_bytes_per_token = 0.0; ///< 2 · layers · num_heads_kv · head_dim · 2
};

/// One model + one KV cache holding up to `max_sequences` sequences of up to seq_len tokens. `model` is referenced,
/// not copied: it must outlive the engine. The cache is a PagedKVCache with page_size from the spec and a pool of
/// max_sequences · (ceil(seq_len / page_size) + 1) pages. Throws Error naming 'kv_cache_dtype', 'page_size', ... for
/// a spec the cache rejects (e.g. a KIVI group that does not divide head_dim).
/// Not thread-safe; each call is internally parallel (OpenMP/BLAS).
class Engine {
 public:
  /// max_context: tokens one sequence may hold (0 = the model's seq_len; must be <= seq_len); sizes the page pool.
  Engine(const Model& model, const KVCacheSpec& spec, int32_t max_sequences = 1, int32_t max_context = 0);
  /// Tokens one sequence may hold (the constructor's max_context, or the model's seq_len).
  int32_t max_context() const;
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Model& model() const { return model_; }
  const KVCacheSpec& spec() const { return spec_; }

  /// Starts a new empty sequence; returns its id. Throws CapacityError when max_sequences are live.
  int32_t add_sequence();
  /// Frees a sequence's pages. Throws Error for an unknown id.
  void remove_sequence(int32_t seq);
  /// Tokens currently cached for `seq`.
  int32_t length(int32_t seq) const;

  /// Prefill: runs `tokens` (n >= 1, token ids < vocab_size) of an EMPTY sequence through the model with exact tiled
  /// causal attention over the un-quantized K/V (flashkv::attention_forward), then appends all K/V to the cache
  /// (quantized on write). logits_out: [n, vocab] if all_logits, else [vocab] for the last token; may be empty.
  /// Throws Error if the sequence is not empty, a token is out of range or the prompt exceeds seq_len.
  void prefill(int32_t seq, std::span<const int32_t> tokens, std::span<float> logits_out, bool all_logits = false);

  /// Chunked prefill through the cache: runs `tokens` (n >= 1) of sequence `seq`, which may already hold cached
  /// tokens (positions continue at length(seq)). Per layer the chunk's K/V are appended to the cache first
  /// (quantized on write) and the chunk's queries then attend over the cache (PagedKVCache::attention, causal,
  /// bottom-right aligned): every token sees the STORED history — earlier chunks and its own chunk — exactly as a
  /// serving engine's chunked prefill and llama.cpp's ubatches do, so a quantized format's error on the prompt is what
  /// later tokens see. With the fp32 cache it equals prefill() up to float rounding; with n = 1 it equals decode().
  /// logits_out: [n, vocab] if all_logits, else [vocab] for the last token; may be empty.
  /// Throws Error if a token is out of range or length(seq) + n exceeds seq_len (nothing is appended then).
  void extend(int32_t seq, std::span<const int32_t> tokens, std::span<float> logits_out, bool all_logits = false);

  /// Decode one token for each of the sequences `seqs` (batch B = seqs.size(), distinct ids): appends its K/V to the
  /// cache, then attends over the cache (packed pages, quantized formats dequantized on the fly).
  /// logits_out: [B, vocab]. Throws Error when a sequence is full (seq_len) or a token is out of range.
  void decode(std::span<const int32_t> seqs, std::span<const int32_t> tokens, std::span<float> logits_out);

  KVMemory memory() const;

 private:
  struct Impl;
  const Model& model_;
  KVCacheSpec spec_;
  std::unique_ptr<Impl> impl_;
};

/// Why generation stopped.
enum class StopReason : int32_t { steps = 0, bos = 1, eos = 2, context = 3 };
const char* stop_reason_name(StopReason r);

struct GenerationResult {
  std::vector<int32_t> prompt_tokens;  ///< including the leading BOS
  std::vector<int32_t> tokens;         ///< generated tokens (without the stop token)
  std::vector<std::vector<float>> logits;  ///< per generated step [vocab] when keep_logits was set
  StopReason stop = StopReason::steps;
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;         ///< decode steps only (excludes prefill and sampling of the first token)
  int32_t decode_steps = 0;
  KVMemory kv;                         ///< measured at the end, before the sequence is released
};

/// Generates up to `steps` tokens (steps >= 1) after `prompt_tokens` (must start with BOS; 1 <= n <= seq_len):
/// prefill, then sample → decode → sample ... Stops at BOS or EOS (llama2.c convention; the stop token is not
/// returned), after `steps` tokens, or when the context is full. `on_token(prev, token)` is called for each emitted
/// token (streaming). Throws Error naming "steps" / "prompt".
GenerationResult generate(Engine& engine, std::span<const int32_t> prompt_tokens, int32_t steps, Sampler& sampler,
                          const std::function<void(int32_t, int32_t)>& on_token = {}, bool keep_logits = false);

/// A model with the tokenizer to use with it.
struct LoadedModel {
  Model model;
  std::shared_ptr<const Tokenizer> tokenizer;
};
/// Loads `model_path` (any format, see load_model) and its tokenizer: `tokenizer_path` when non-empty (llama2.c
/// tokenizer file), else the vocabulary embedded in a GGUF file. Throws IoError when no tokenizer is available or
/// its vocabulary size differs from the model's.
LoadedModel load_model_with_tokenizer(const std::string& model_path, const std::string& tokenizer_path);

/// Directory holding the shipped test model: $FLASHKV_MODELS_DIR if set, else `default_dir`.
std::string models_dir(const std::string& default_dir);

}  // namespace flashkv
