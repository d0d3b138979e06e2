// flashkv/model.hpp — Llama-architecture checkpoints on the CPU: the model description, the loaders (llama2.c, GGUF v3
// with ggml's quantized block formats dequantized on load), the GGUF writer, GGUF inspection, and the named models
// that `scripts/setup` fetches (`smollm2-135m`).
//
// ARCHITECTURE (Touvron et al., "LLaMA", 2023, §2.2; reference implementation: Karpathy's llama2.c run.c):
//   x = embed[token]; for each layer:
//     h = rmsnorm(x)·attn_norm;  q = Wq h, k = Wk h, v = Wv h  (num_heads / num_heads_kv heads of head_dim)
//     RoPE (Su et al., "RoFormer", 2021, §3.4.2) on q and k in the INTERLEAVED-pair layout: pairs (x[2i], x[2i+1]) of
//       each head rotated by angle pos · rope_theta^(−2i/head_dim). This is llama2.c's layout and ggml's "normal" rope
//       of the GGUF `llama` architecture (llama.cpp's converter permutes Hugging Face's Q/K rows so that it holds);
//     x += Wo · attention(q, k, v) (causal, GQA, softmax_scale = 1/sqrt(head_dim))
//     h = rmsnorm(x)·ffn_norm;  x += W2 (silu(W1 h) ∘ W3 h)                       (SwiGLU; Shazeer 2020)
//   logits = Wcls · rmsnorm(x)·final_norm.   rmsnorm(x) = x / sqrt(mean(x²) + norm_eps) (Zhang & Sennrich 2019).
// All weights are float32 row-major [out_features, in_features] (the engine's compute type); matrix products go through
// BLAS (cblas_sgemm / cblas_sgemv).
//
// ERRORS: every truncated, corrupt or inconsistent file raises flashkv::IoError (CLI exit code 2) naming the file,
// the tensor or metadata key, and what was expected vs found; bad arguments raise flashkv::Error naming the argument.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace flashkv {

/// Hyper-parameters of a Llama-architecture model. Counts are in elements / tokens.
struct ModelConfig {
  int32_t dim = 0;            ///< model width (embedding size)
  int32_t hidden_dim = 0;     ///< SwiGLU inner width
  int32_t n_layers = 0;
  int32_t num_heads = 0;      ///< query heads
  int32_t num_heads_kv = 0;   ///< key/value heads (GQA when < num_heads); num_heads % num_heads_kv == 0
  int32_t vocab_size = 0;
  int32_t seq_len = 0;        ///< maximum context in tokens (GGUF: llama.context_length)
  int32_t head_dim = 0;       ///< dim / num_heads
  float rope_theta = 10000.0f;  ///< GGUF: llama.rope.freq_base (SmolLM2: 100000)
  float norm_eps = 1e-5f;       ///< GGUF: llama.attention.layer_norm_rms_epsilon
  bool shared_classifier = true;  ///< classifier weights are the token embedding (GGUF: no output.weight)

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
/// 4-byte-aligned offsets (llama2.c, GGUF F32), otherwise into owned float32 buffers (every other GGUF type is
/// dequantized on load). Move-only.
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
  /// Token ids that end generation (generate() stops when it samples one; the token is not returned).
  /// llama2.c: {1 (BOS), 2 (EOS)} — the llama2.c convention; GGUF: the tokenizer's end-of-generation set
  /// (Tokenizer::end_of_generation(): eos, plus control tokens such as <|im_end|>, <|endoftext|>, <|eot_id|>).
  std::vector<int32_t> stop_tokens{1, 2};
  int32_t bos_token = 1;  ///< BOS id (StopReason::bos is reported when a stop token equals it: llama2.c)
  /// Per-tensor storage type in the file ("F32", "Q4_1", ...), in load order, for `flashkv inspect`.
  std::vector<std::pair<std::string, std::string>> tensor_types;

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

/// GGUF tensor element types this engine reads (values are ggml's ggml_type ids). Block layouts (ggml-common.h; all
/// little-endian, fp16 = IEEE binary16; q are unsigned codes unless stated; "d·q" products are exact in float32, so
/// each dequantized value is the float32 nearest to the exact block formula):
///   F32, F16, BF16                 1 value per element
///   Q4_0  32 values, 18 B: fp16 d, 16 B nibbles (value j: low nibble of byte j, value j+16: high nibble); x = d·(q−8)
///   Q4_1  32 values, 20 B: fp16 d, fp16 m, 16 B nibbles as Q4_0;                                       x = d·q + m
///   Q5_0  32 values, 22 B: fp16 d, u32 qh (bit j = 5th bit of value j), 16 B nibbles as Q4_0;          x = d·(q−16)
///   Q5_1  32 values, 24 B: fp16 d, fp16 m, u32 qh, 16 B nibbles;                                        x = d·q + m
///   Q8_0  32 values, 34 B: fp16 d, 32 int8 q;                                                          x = d·q
///   Q4_K  256 values, 144 B: fp16 d, fp16 dmin, 12 B of 6-bit (scale, min) pairs for 8 sub-blocks of 32, 128 B
///         nibbles (64-value chunk c: low nibbles of bytes 32c..32c+31 = sub-block 2c, high nibbles = 2c+1);
///         x = d·scale·q − dmin·min. Pair j < 4: scale = b[j] & 63, min = b[j+4] & 63; j >= 4: scale = (b[j+4] & 15)
///         | (b[j−4] >> 6) << 4, min = (b[j+4] >> 4) | (b[j] >> 6) << 4.
///   Q5_K  256 values, 176 B: fp16 d, fp16 dmin, 12 B scales as Q4_K, 32 B qh (bit c·2 / c·2+1 of byte l = 5th bit of
///         value l of sub-block 2c / 2c+1), 128 B nibbles as Q4_K;       x = d·scale·q − dmin·min
///   Q6_K  256 values, 210 B: 128 B low nibbles ql, 64 B 2-bit highs qh, 16 int8 scales (one per 16 values), fp16 d;
///         128-value half h, l in [0, 32): value l ← ql[64h+l] low | (qh[32h+l] & 3) << 4, value l+32 ← ql[64h+l+32] low |
///         (qh >> 2 & 3) << 4, value l+64 ← ql[64h+l] high | (qh >> 4 & 3) << 4, value l+96 ← ql[64h+l+32] high |
///         (qh >> 6 & 3) << 4;  x = d·scale[value / 16]·(q − 32)
enum class GgufType : uint32_t {
  f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_0 = 8, q4_k = 12, q5_k = 13, q6_k = 14, bf16 = 30,
};
/// "F32", "F16", "Q4_0", ..., "Q6_K", "BF16" (ggml's names); "type<N>" for other ids.
std::string gguf_type_name(uint32_t type);
/// Parses "f32" | "f16" | "bf16" | "q8_0" (the types write_gguf can produce); throws Error naming `argument` otherwise.
GgufType parse_gguf_type(const std::string& name, const std::string& argument = "type");

/// GGUF v3 with general.architecture = "llama": tensors token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v,
/// attn_output, ffn_norm, ffn_gate, ffn_down, ffn_up}, output_norm, [output] (absent = shared classifier, as in
/// SmolLM2); any GgufType above (dequantized to float32 on load, non-finite results rejected naming the tensor);
/// llama.* metadata for the shape (embedding_length, feed_forward_length, block_count, attention.head_count[_kv],
/// context_length, rope.freq_base, rope.dimension_count (must equal head_dim), attention.layer_norm_rms_epsilon).
/// The embedded vocabulary becomes Model::embedded_tokenizer: tokenizer.ggml.model "llama" (SentencePiece pieces +
/// scores) or "gpt2" (byte-level BPE: tokens, merges, token_type, pre, add_bos_token, chat_template); see
/// flashkv/tokenizer.hpp. Bounds: every tensor's data must lie inside the file (IoError naming the tensor otherwise).
Model load_gguf(const std::string& path);
Model load_gguf_from_bytes(std::span<const uint8_t> bytes);
/// Only the embedded vocabulary of a GGUF file (no weights are read): IoError when it has none.
std::shared_ptr<const Tokenizer> load_gguf_vocabulary(const std::string& path);

/// Writes a GGUF v3 file (alignment 32) of `model` with every matrix stored as `matrix_type` (f32/f16/bf16/q8_0; 1-D
/// norms stay F32; with q8_0, matrices whose rows are not a multiple of 32 values are stored as F16, as llama.cpp
/// does) and `tokenizer`'s vocabulary embedded (SentencePiece: ' ' written as U+2581; byte-level BPE: tokens,
/// merges, token types, pre-tokenizer, add_bos_token, chat template). Throws IoError / Error.
void write_gguf(const Model& model, const Tokenizer& tokenizer, const std::string& path,
                GgufType matrix_type = GgufType::f32);

// ---------------------------------------------------------------------------------------------------------------------
// GGUF inspection (any architecture): metadata and tensor table, one tensor dequantized
// ---------------------------------------------------------------------------------------------------------------------

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  ///< ggml order: ne[0] is the fastest-varying (row length)
  uint32_t type = 0;         ///< ggml_type id (GgufType values are the supported ones)
  uint64_t offset = 0;       ///< bytes from the start of the tensor data section
  uint64_t bytes = 0;        ///< payload size (0 when the type is unsupported)
};
struct GgufInfo {
  uint32_t version = 0;
  std::vector<std::pair<std::string, std::string>> metadata;  ///< key → value as text (arrays: "[N × type]")
  std::vector<GgufTensorInfo> tensors;                        ///< file order
};
/// Reads the header, metadata and tensor table of a GGUF v3 file (bounds-checked; IoError on any inconsistency).
GgufInfo read_gguf_info(const std::string& path);
/// Dequantizes one tensor to float32 in ggml element order (ne[0] fastest). IoError naming the tensor when it is
/// missing, of an unsupported type, or its data runs past the end of the file.
std::vector<float> read_gguf_tensor(const std::string& path, const std::string& name);

// ---------------------------------------------------------------------------------------------------------------------
// Named models (`--model smollm2-135m`) and their files
// ---------------------------------------------------------------------------------------------------------------------

/// A model known by name. Fetched models live in fetched_models_dir(); the 260K test model in shipped_models_dir().
struct ModelAlias {
  std::string name;         ///< "smollm2-135m", "aidreams260k"
  std::string file;         ///< file name inside its directory
  std::string tokenizer;    ///< separate tokenizer file ("" = embedded in the GGUF)
  std::string description;  ///< one line for --help and error messages
  std::string setup;        ///< command that brings the file ("scripts/setup ...")
  bool fetched = true;      ///< true: fetched_models_dir(); false: the test-model directory shipped_models_dir()
};
/// Every alias, in display order.
const std::vector<ModelAlias>& model_aliases();

/// Where scripts/setup puts fetched models: $FLASHKV_MODEL_HOME if set, else `<source tree>/models` (compiled in).
std::string fetched_models_dir();
/// Directory holding the 260K test model (aidreams260K.bin + aidreams260K.tok512.bin): $FLASHKV_MODELS_DIR if set; else
/// the first that holds aidreams260K.bin of `fetched_models_dir()/aidreams260k` (scripts/setup copies it there) and
/// `<source tree>/../shared/models` (the reference folder beside a clone, compiled in); else the former, so that a
/// missing-model error names the folder scripts/setup fills. Never throws.
std::string shipped_models_dir();

/// A model argument resolved to files.
struct ResolvedModel {
  std::string model_path;
  std::string tokenizer_path;  ///< "" = use the vocabulary embedded in the model file
  std::string alias;           ///< the alias used, "" for a plain path
};
/// `name_or_path` is an alias (model_aliases()) or a file path. An alias whose file is missing throws IoError
/// "model 'smollm2-135m' is not installed: expected PATH; run scripts/setup (it fetches ...)". A non-alias that is no
/// existing file and contains no '/' or '.' throws Error naming 'model' with the list of aliases (a typo); other paths
/// are returned as they are (the loader reports a missing file). `tokenizer_path` (may be empty) overrides the alias's
/// tokenizer file. Nothing is ever downloaded at run time.
ResolvedModel resolve_model(const std::string& name_or_path, const std::string& tokenizer_path = "");

}  // namespace flashkv
