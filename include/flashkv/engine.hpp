// flashkv/engine.hpp — a Llama-architecture generation engine on the CPU or a CUDA GPU (EngineOptions::device): a model
// (flashkv/model.hpp) whose prefill runs flashkv's exact tiled causal attention and whose decode reads a quantized paged
// KV cache (flashkv/kvcache.hpp), the generation loop, and loading a model with its tokenizer by name or path.
//
// This header includes the pieces it builds on: flashkv/model.hpp (checkpoints, GGUF, named models),
// flashkv/tokenizer.hpp (SentencePiece and byte-level BPE, ChatML), flashkv/sampler.hpp (samplers).
//
// ERRORS: IoError for files (CLI exit code 2), Error naming the argument for bad arguments, CapacityError when the
// engine's sequences or KV pages are exhausted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "flashkv/kvcache.hpp"
#include "flashkv/model.hpp"
#include "flashkv/sampler.hpp"
#include "flashkv/tokenizer.hpp"
#include "flashkv/types.hpp"

namespace flashkv {

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

/// The PagedKVCache configuration an Engine builds for `spec` on a model of configuration `c`: layers, KV heads and
/// head_dim from `c`; formats, page size, windows and rotation from `spec`; pool size and device left at their
/// defaults (the Engine sets them from EngineOptions). For the memory formula (kv_memory_estimate) of an engine's
/// cache before building it. Throws Error naming 'kv_cache_dtype' for a bad format string.
KVCacheConfig kv_cache_config(const ModelConfig& c, const KVCacheSpec& spec);

/// Memory used by the engine's KV cache (from PagedKVCache::memory_report()).
struct KVMemory {
  std::size_t bytes = 0;             ///< codes + metadata + residual + page slack, all layers, all sequences
  std::size_t tokens = 0;            ///< cached tokens summed over sequences
  double bytes_per_token = 0.0;      ///< all layers, K and V
  double effective_bits = 0.0;       ///< bits per cached element, everything counted
  double bf16_bytes_per_token = 0.0; ///< 2 · layers · num_heads_kv · head_dim · 2
};

/// Where an Engine runs and how large its KV page pool is.
struct EngineOptions {
  /// Device::cpu (default): float32 weights, OpenBLAS matmuls, the host PagedKVCache. Device::cuda (a library built
  /// with the CUDA backend, FLASHKV_CUDA=ON): the weights are uploaded once to device `device_index` in bfloat16
  /// (token embedding and norm weights stay float32), matmuls run through cuBLAS (bf16 in, float32 accumulate, float32
  /// residual stream and logits), prefill through flashkv's CUDA attention (bf16, or fp16 with an fp16 cache), decode
  /// and extend through the CUDA paged decode of a device PagedKVCache. The CUDA engine needs a kv_cache_dtype the
  /// device decodes: "bf16", "fp16" or a compiled quantized format (fp8_e4m3, fp8_e4m3_dynamic, int8, int4[_gN] at
  /// head_dim 64 / 128 in the default build), without sinks, residual window, KIVI or rotation (UnsupportedError
  /// naming the spec otherwise; never a silent CPU fallback). UnsupportedError when the library has no CUDA backend or
  /// no CUDA device is present.
  Device device = Device::cpu;
  int32_t device_index = 0;
  /// Pages of the KV pool (0 = max_sequences · (ceil(max_context / page_size) + 1), enough for every sequence at full
  /// context). A smaller pool admits sequences on demand: pages are taken as sequences grow and given back by
  /// remove_sequence; a prefill / extend / decode whose new tokens need more pages than are free throws CapacityError
  /// before anything is computed or written. >= 0.
  int64_t kv_capacity_pages = 0;
  /// Device::cuda only (ignored on the CPU): capture each decode step (every sequence one token) into a CUDA graph
  /// and replay it. Graphs are kept per bucket — batch size, page-table stride (the longest sequence's pages rounded
  /// up to a power of two) and the split-KV count the decode's heuristic picks — and every per-step value (token ids,
  /// positions, lengths, page tables) is read from device tables uploaded before the replay, so a bucket's graph
  /// replays the same kernels with the same arguments as launching them one by one would: the results are identical
  /// with graphs on or off. A step outside every held bucket is captured on first sight (at most 64 graphs are kept,
  /// least recently used dropped); a step whose capture fails runs eagerly and the capture is retried on the bucket's
  /// next steps (three failures in all leave the bucket eager) — counted and named in Engine::cuda_graph_stats() and
  /// printed with FLASHKV_LOG=1, never silent. false: every step is launched kernel
  /// by kernel (the A/B baseline; the same device tables, batched appends and single synchronization per step).
  /// Prefill and extend calls always run eagerly.
  bool cuda_graphs = true;
  /// Device::cpu: round the activations to 16 bits exactly where the CUDA engine does — each RMSNorm's output (the
  /// GEMM inputs: attention, feed-forward and final norm), q / k / v after RoPE, the attention output and the SwiGLU
  /// output, to bfloat16 (q / k / v and the attention output to float16 with an fp16 cache, the attention output then
  /// to bfloat16 for the Wo GEMM, as on the device); round to nearest even. The residual stream, GEMM accumulation and
  /// logits stay float32. On a model whose matrices are rounded to bfloat16 (as the CUDA engine uploads them), the CPU
  /// engine then computes what the CUDA engine computes up to float32 summation order and the rounding inside the
  /// attention kernels: the device's arithmetic emulated on the CPU, with the CPU's KV codecs (what the evaluation tests
  /// calibrate the GPU-vs-CPU comparison on, tests/eval/eval_noise.hpp). Default false: float32 activations. The CUDA
  /// engine always rounds there; the field changes nothing on it.
  bool bf16_activations = false;
};

/// How the CUDA engine ran its decode steps (EngineOptions::cuda_graphs); all zero on the CPU.
struct CudaGraphStats {
  int64_t graph_steps = 0;       ///< decode steps replayed from a captured graph
  int64_t eager_steps = 0;       ///< decode steps launched kernel by kernel (graphs off, or a failed capture)
  int64_t captures = 0;          ///< graphs captured and instantiated (one per bucket first seen)
  int64_t capture_failures = 0;  ///< captures that failed (their step ran eagerly; a bucket retries up to 3 times)
  int64_t evictions = 0;         ///< graphs dropped (least recently used) to keep at most 64
  int32_t graphs = 0;            ///< executable graphs held now
  std::string last_capture_error;  ///< why the last failed capture failed ("" if none did)
};

/// Parses a device name into EngineOptions::device / device_index (other fields keep their defaults): "cpu", "cuda"
/// (device 0) or "cuda:N" (N: 0..999). What `--device`, the C ABI's options.device and Python's device= mean. Throws
/// Error naming `argument` (expected "cpu, cuda or cuda:N") for anything else.
EngineOptions parse_engine_device(const std::string& device, const std::string& argument = "device");

/// One model + one KV cache holding up to `max_sequences` sequences of up to `max_context` tokens each (0 = the
/// model's seq_len; must be <= seq_len). `model` is referenced, not copied: it must outlive the engine. The cache is a
/// PagedKVCache with page_size from the spec and a pool of options.kv_capacity_pages pages (default
/// max_sequences · (ceil(max_context / page_size) + 1)), in host memory (cpu) or device memory (cuda).
/// Throws Error naming 'kv_cache_dtype', 'page_size', 'max_context', 'options.kv_capacity_pages', ... for a spec the
/// cache rejects (e.g. a KIVI group that does not divide head_dim); UnsupportedError for a device / spec this build or
/// machine cannot run (see EngineOptions).
/// Not thread-safe; each call is internally parallel (OpenMP/BLAS on the CPU; on CUDA the engine's own stream, a
/// prefill / extend / decode returning once its work is enqueued: sample(), a non-empty logits_out or the next call
/// waits for it).
class Engine {
 public:
  Engine(const Model& model, const KVCacheSpec& spec, int32_t max_sequences = 1, int32_t max_context = 0,
         const EngineOptions& options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Model& model() const { return model_; }
  const KVCacheSpec& spec() const { return spec_; }
  const EngineOptions& options() const { return options_; }
  Device device() const { return options_.device; }
  /// Tokens one sequence may hold (the constructor's max_context, or the model's seq_len).
  int32_t max_context() const;

  /// Starts a new empty sequence; returns its id. Throws CapacityError when max_sequences are live.
  int32_t add_sequence();
  /// Frees a sequence's pages. Throws Error for an unknown id.
  void remove_sequence(int32_t seq);
  /// Tokens currently cached for `seq`.
  int32_t length(int32_t seq) const;

  /// Prefill: runs `tokens` (n >= 1, token ids < vocab_size) of an EMPTY sequence through the model with exact tiled
  /// causal attention over the un-quantized K/V (flashkv::attention_forward), then appends all K/V to the cache
  /// (quantized on write). logits_out: [n, vocab] if all_logits, else [vocab] for the last token; may be empty (the
  /// last token's logits are still kept in the engine for sample()).
  /// Throws Error if the sequence is not empty, a token is out of range or the prompt exceeds max_context();
  /// CapacityError when the pool lacks the pages the prompt needs (nothing computed or written).
  void prefill(int32_t seq, std::span<const int32_t> tokens, std::span<float> logits_out, bool all_logits = false);

  /// Chunked prefill through the cache: appends `tokens` (n >= 1) to sequence `seq` (empty or not; positions continue
  /// from length(seq)). Each layer first writes the chunk's K/V into the cache (quantized on write), then the chunk's
  /// queries attend over the cache — history and chunk alike read back from the (quantized) pages, causal within the
  /// chunk (PagedKVCache::attention with n_q = n) — so later tokens see exactly what serving would show them. With an
  /// fp32 cache this computes the same function as prefill() (different summation order).
  /// logits_out as prefill(). Throws Error when length(seq) + n > max_context() or a token is out of range.
  void extend(int32_t seq, std::span<const int32_t> tokens, std::span<float> logits_out, bool all_logits = false);

  /// Decode one token for each of the sequences `seqs` (batch B = seqs.size(), distinct ids): appends its K/V to the
  /// cache, then attends over the cache (packed pages, quantized formats dequantized on the fly).
  /// logits_out: [B, vocab], or empty (the logits stay in the engine, on its device, for sample()). Throws Error when a
  /// sequence is full (max_context), a token is out of range or an id repeats; CapacityError when the sequences that
  /// start a new page need more pages than are free (checked before anything is computed or written). On CUDA the
  /// K / V the model computed are checked for values the cache cannot store (non-finite; beyond fp16 where it stores
  /// fp16) inside the append kernels: an Error naming k / v, the layer, the sequence and the element is thrown by
  /// the first call that waits for the step (sample(), this call with logits_out, or the next prefill / extend /
  /// decode) — the CPU engine throws it from the step itself.
  void decode(std::span<const int32_t> seqs, std::span<const int32_t> tokens, std::span<float> logits_out);

  /// Draws one token per row of the logits the last prefill / extend / decode call produced (prefill / extend: its
  /// last token, one row; decode: one row per sequence, in call order), row i with samplers[i] (samplers.size() must
  /// equal the row count; Error 'samplers' otherwise, or before any call). On the engine's device: the CPU runs
  /// Sampler::sample; CUDA computes argmax (temperature 0, lowest id on ties) or the distribution of
  /// Sampler::distribution (softmax in float64 of logits / temperature, top-k then top-p over the order by probability
  /// with ties to the lower id) and inverts its CDF in token-id order at u = samplers[i]->next_uniform() — the same
  /// random stream and the same distribution as the CPU sampler (tokens can differ only where u falls within float64
  /// rounding of a CDF step).
  std::vector<int32_t> sample(std::span<Sampler* const> samplers);

  /// Benchmark support (`flashkv bench engine --fill synthetic`): appends `n_tokens` (>= 1) tokens of synthetic K/V
  /// to every layer of sequence `seq` (positions length(seq) ..) WITHOUT running the model, so that a decode can be
  /// timed at a context of thousands of tokens over hundreds of sequences without their prefill. K/V element (half,
  /// layer, position, kv-head, channel) is one of the 256 values (k − 128) / 64, k uniform from a counter-based hash of
  /// those coordinates and `seed` (src/engine/synthetic_kv.hpp): exact in every dtype, the same on the CPU and the
  /// GPU, quantized on write like the model's K/V. Later logits therefore belong to no prompt; what is real is the
  /// cache (its format, size, pages) and the cost of writing and reading it. Clears the kept logits (sample() needs a
  /// prefill / extend / decode call first).
  /// Throws Error naming 'seq' (not live), 'n_tokens' (< 1, or length(seq) + n_tokens > max_context());
  /// CapacityError when the pool lacks the pages (checked first: nothing written).
  void append_synthetic(int32_t seq, int32_t n_tokens, uint64_t seed = 0);

  KVMemory memory() const;

  /// The CUDA engine's graph counters (EngineOptions::cuda_graphs); all zero on the CPU.
  CudaGraphStats cuda_graph_stats() const;

 private:
  struct Impl;
  const Model& model_;
  KVCacheSpec spec_;
  EngineOptions options_;
  std::unique_ptr<Impl> impl_;
};

/// The BLAS the engine's matrix products run on: OpenBLAS's configuration, kernel family, threading and file, e.g.
/// "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY SkylakeX MAX_THREADS=64 | core SkylakeX | openmp | /usr/lib/...". OpenBLAS
/// is loaded at first use: the OpenMP build when installed (it shares flashkv's OpenMP threads), and with
/// OPENBLAS_CORETYPE=SkylakeX on AVX-512 CPUs unless the variable is already set (OpenBLAS 0.3.21 falls back to slow
/// generic kernels on CPUs it does not know). $FLASHKV_BLAS names another OpenBLAS file. IoError if none loads.
std::string engine_blas_info();

/// Why generation stopped.
enum class StopReason : int32_t { steps = 0, bos = 1, eos = 2, context = 3 };
/// "steps" | "bos" | "eos" (any end-of-generation token other than BOS) | "context".
const char* stop_reason_name(StopReason r);

struct GenerationResult {
  std::vector<int32_t> prompt_tokens;  ///< the tokens fed before sampling (with BOS if the tokenizer adds one)
  std::vector<int32_t> tokens;         ///< generated tokens (without the stop token)
  std::vector<std::vector<float>> logits;  ///< per generated step [vocab] when keep_logits was set
  StopReason stop = StopReason::steps;
  int32_t stop_token = -1;             ///< the end-of-generation token sampled (StopReason bos/eos), else −1
  double prefill_seconds = 0.0;        ///< the prefill / extend of the prompt with the sampling of the first token
  /// decode steps: each decode() with the sampling of its token (excludes the prefill and the first token's sampling)
  double decode_seconds = 0.0;
  int32_t decode_steps = 0;
  KVMemory kv;                         ///< measured at the end, before the sequence is released
};

/// Options of generate() / generate_in().
struct GenerateOptions {
  int32_t steps = 256;       ///< maximum tokens to generate (>= 1)
  bool keep_logits = false;  ///< GenerationResult::logits gets each step's logits
  /// Never stop at Model::stop_tokens: they are emitted like any token and generation runs `steps` tokens or to the
  /// context end (llama.cpp's --ignore-eos; used to compare long greedy runs).
  bool ignore_stop_tokens = false;
  std::function<void(int32_t, int32_t)> on_token;  ///< (prev, token) for each emitted token (streaming)
};

/// Generates up to `steps` tokens after `prompt_tokens` (1 <= n <= max_context; llama2.c prompts start with BOS,
/// SmolLM2's do not): prefill, then sample → decode ... Stops when the sampler draws one of Model::stop_tokens (the
/// token is not returned), after `steps` tokens, or when the context is full. Throws Error naming "steps" / "prompt".
GenerationResult generate(Engine& engine, std::span<const int32_t> prompt_tokens, Sampler& sampler,
                          const GenerateOptions& options);
/// The same with positional options (on_token streaming, keep_logits).
GenerationResult generate(Engine& engine, std::span<const int32_t> prompt_tokens, int32_t steps, Sampler& sampler,
                          const std::function<void(int32_t, int32_t)>& on_token = {}, bool keep_logits = false);

/// Like generate() on a sequence the caller owns (add_sequence(); not removed): feeds `tokens` (n >= 1; prefill() when
/// the sequence is empty, extend() otherwise), then samples. The sampled stop token is NOT fed to the model, so a
/// multi-turn caller starts its next chunk with it (ChatML: "<|im_end|>\n<|im_start|>user\n..."). The result's
/// prompt_tokens are `tokens`; prefill_seconds times this chunk.
GenerationResult generate_in(Engine& engine, int32_t seq, std::span<const int32_t> tokens, Sampler& sampler,
                             const GenerateOptions& options);

/// A model with the tokenizer to use with it.
struct LoadedModel {
  Model model;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::string alias;  ///< the alias it was loaded by ("" for a path)
};
/// Loads `model_path` (any format, see load_model) and its tokenizer: `tokenizer_path` when non-empty (llama2.c
/// tokenizer file), else the vocabulary embedded in a GGUF file. Throws IoError when no tokenizer is available or
/// its vocabulary size differs from the model's.
LoadedModel load_model_with_tokenizer(const std::string& model_path, const std::string& tokenizer_path);
/// resolve_model(name_or_path, tokenizer_path) then load_model_with_tokenizer: what `--model` means in every command
/// (`--model smollm2-135m`, `--model aidreams260k`, `--model path/to/file.gguf`).
LoadedModel load_named_model(const std::string& name_or_path, const std::string& tokenizer_path = "");
/// The tokenizer of a named model or file: the GGUF's embedded vocabulary (no weights are read), or the llama2.c
/// tokenizer file (`tokenizer_path` or the alias's; its size comes from the model file's header).
std::shared_ptr<const Tokenizer> load_named_tokenizer(const std::string& name_or_path,
                                                      const std::string& tokenizer_path = "");

}  // namespace flashkv
