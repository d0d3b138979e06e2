// flashkv eval: teacher-forced A/B evaluation of KV cache formats on a real model.
//
// PROTOCOL (as llama.cpp's KL-divergence mode and KVQuant §5 / KIVI §4 perplexity evaluations): a set of token
// sequences (sampled from the full-precision model, or read from text / token files) is replayed token by token —
// every position goes through Engine::decode, i.e. attends over the cache being evaluated — once with the reference
// cache (the float32 cache on the CPU; on CUDA the device's bf16 cache, or the CPU's fp32 one: EvalTarget) and once
// per format. Per predicted position t (the logits after feeding tokens[0..t]):
//   KL_t     = Σ_v p_ref(v) · (log p_ref(v) − log p_fmt(v))     nats, computed in float64 from log-softmax
//   top1_t   = [argmax p_fmt == argmax p_ref]                   (lowest id on ties)
//   Δll_t    = log p_fmt(tokens[t+1]) − log p_ref(tokens[t+1])  nats; perplexity ratio = exp(−mean Δll)
//   first greedy divergence = smallest t with top1_t = 0 (the step at which greedy decoding from this prefix would
//   first pick a different token); sequences without one count as their length (censored) and are reported apart.
// Identical logits give KL = 0 exactly and top-1 = 100% (the fp32 cache against itself is checked by the tests).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "flashkv/engine.hpp"

namespace flashkv::eval {

/// One entry of a --kv-cache list: "DTYPE[+rN][+sN][+hadamard][+pN]" where DTYPE is a kv_cache_dtype string of
/// kvcache.hpp, rN the residual window, sN sink tokens, pN the page size. Throws Error('kv-cache', grammar, item).
KVCacheSpec parse_format_item(const std::string& item, const KVCacheSpec& defaults = {});

/// The CLI's cache options: either kv_cache (a kv_cache_dtype string) or both kv_k and kv_v (→ "k:K,v:V");
/// rotate is "none" or "hadamard". Throws Error naming the option ('kv-cache', 'kv-k', 'rotate', ...).
KVCacheSpec spec_from_options(const std::string& kv_cache, const std::string& kv_k, const std::string& kv_v,
                              int32_t residual, int32_t sinks, const std::string& rotate, int32_t page_size);

/// The spec as it runs on a model of this head_dim (generate, eval and demo all call it): a KIVI format without an
/// explicit group ("int4_kivi", default G = 32) gets the largest allowed group that fits when 32 does not (G must
/// divide the page size, and head_dim for values): int4_kivi on head_dim 16 runs as int4_kivi_g16. An explicit group
/// that does not fit throws Error naming 'kv-cache' with the spelling that works. Aliases become canonical names.
KVCacheSpec fit_kv_spec(const KVCacheSpec& spec, int32_t head_dim);

/// Progress callback: (done, total) units of work.
using Progress = std::function<void(int64_t, int64_t)>;

/// Where an evaluation runs (eval, eval --text, eval passkey, demo) and what it compares against.
///   engine: the EngineOptions of the formats under test (Device::cpu, or Device::cuda with device_index).
///   reference: the unquantized run every format is compared with (KL, top-1, Δll, PPL, answer divergence):
///     cpu_reference = false (default): the SAME device with the widest KV cache it stores — the fp32 cache on the
///       CPU; the bf16 cache on CUDA (the CUDA engine computes K/V in bf16, so its bf16 cache holds them exactly; it has
///       no fp32 cache) — so the metrics measure the KV format alone, not the device's arithmetic;
///     cpu_reference = true: the CPU engine (float32 weights) with the fp32 cache; on CUDA the metrics then include the
///       device's own error (bf16 weights and activations), which its bf16 row shows by itself.
struct EvalTarget {
  EngineOptions engine;
  bool cpu_reference = false;
  /// The reference's EngineOptions (the CPU's when cpu_reference or engine.device is the CPU).
  EngineOptions reference_options() const;
  /// fp32 on the CPU, bf16 on CUDA (page_size 32, no windows).
  KVCacheSpec reference_spec() const;
  /// "cpu" or "cuda:N": the candidates' device, the reference's.
  std::string device_name() const;
  std::string reference_device() const;
  /// "fp32 cache on cpu", "bf16 cache on cuda:0".
  std::string reference_name() const;
  /// `spec` runs exactly as the reference does (the same cache on the same device): not run twice.
  bool is_reference(const KVCacheSpec& spec) const;
  /// "device cuda:0; reference = bf16 cache on cuda:0" (the line the commands print).
  std::string describe() const;
};

/// Why `spec` cannot run on `options`' device for `model`: the UnsupportedError's one-line message (a device / build
/// without CUDA, a format, window or head dim the device does not decode), or "" when it runs. Builds a one-page
/// engine (on CUDA: the weights are uploaded once more). Other errors (a spec the cache rejects) propagate.
std::string unsupported_reason(const Model& model, const KVCacheSpec& spec, const EngineOptions& options);

/// A format left out of a default format list because the device cannot run it.
struct SkippedFormat {
  KVCacheSpec spec;
  std::string label;
  std::string reason;  ///< unsupported_reason()
};

/// Checks the device (its own widest cache: a build without the CUDA backend or a machine without the device is an
/// error), the reference and every spec on `target` BEFORE any work: throws the first UnsupportedError (a list the
/// user gave: nothing is silently dropped or run elsewhere). Specs equal to the reference are not probed twice.
void check_target(const Model& model, const std::vector<KVCacheSpec>& specs, const EvalTarget& target);
/// For a command's DEFAULT list: the device and the reference are checked as check_target() does (throws); the specs
/// the device cannot run are returned in `skipped` with the reason and left out of the result (order kept).
std::vector<KVCacheSpec> runnable_specs(const Model& model, const std::vector<KVCacheSpec>& specs,
                                        const EvalTarget& target, std::vector<SkippedFormat>& skipped);

/// Logits of a teacher-forced replay: logits[s] is [len_s, vocab] (the prediction after each fed token).
struct Replay {
  std::vector<std::vector<float>> logits;
  double seconds = 0.0;      ///< wall time of all decode calls
  int64_t tokens = 0;        ///< tokens fed (all sequences)
  KVMemory kv;               ///< cache memory with every sequence fully cached
};

/// Feeds every sequence token by token through Engine::decode, `batch` sequences at a time (all when batch <= 0), on
/// the engine of `engine` (CPU by default). Sequences must be non-empty and at most seq_len long. Deterministic on the
/// CPU: the same inputs give bit-identical logits.
Replay replay(const Model& model, const KVCacheSpec& spec, const std::vector<std::vector<int32_t>>& sequences,
              int32_t batch = 0, const Progress& progress = {}, const EngineOptions& engine = {});

/// Per-format quality metrics against a reference replay of the same sequences.
struct Metrics {
  double mean_kl = 0.0;        ///< nats per predicted token
  double max_kl = 0.0;
  double top1 = 0.0;           ///< fraction in [0, 1]
  double delta_ll = 0.0;       ///< mean log-likelihood difference per token (nats); < 0 = worse
  double ppl_ratio = 1.0;      ///< exp(−delta_ll)
  double mean_first_divergence = 0.0;  ///< mean step of first top-1 disagreement (censored at the length)
  int32_t diverged = 0;        ///< sequences with at least one disagreement
  int32_t sequences = 0;
  int64_t positions = 0;       ///< predicted positions compared
};
/// Compares `test` with `ref` (same sequences). Δll uses the next token of each sequence (last position excluded).
Metrics compare(const Replay& ref, const Replay& test, const std::vector<std::vector<int32_t>>& sequences,
                int32_t vocab_size);
/// The same metrics for each sequence alone (element s: sequence s; `sequences` = 1): the blocks of a paired
/// comparison of two evaluations of the same sequences (their spread is the evaluation's sampling noise).
std::vector<Metrics> compare_per_sequence(const Replay& ref, const Replay& test,
                                          const std::vector<std::vector<int32_t>>& sequences, int32_t vocab_size);

/// `n` sequences of `length` tokens (BOS first) sampled from the model at `temperature` by the reference engine of
/// `target` (default: the CPU with the float32 cache; on CUDA the device's bf16 cache unless target.cpu_reference)
/// (seeded: the same seed and engine give the same sequences). Sampling continues through BOS/EOS tokens (the
/// llama2.c training stream separates texts with BOS), so every sequence has exactly `length` tokens.
/// length in [2, seq_len].
std::vector<std::vector<int32_t>> sample_sequences(const Model& model, int32_t n, int32_t length, uint64_t seed,
                                                   float temperature = 1.0f, const EvalTarget& target = {});

/// Text file → BOS + tokens, split into chunks of at most seq_len tokens (each chunk starts with BOS).
std::vector<std::vector<int32_t>> sequences_from_text(const Tokenizer& tok, const std::string& text, int32_t seq_len);
/// Token file: one sequence per non-empty line, whitespace-separated integer ids. Throws IoError for a malformed
/// token, Error for an id outside the vocabulary or a line longer than seq_len.
std::vector<std::vector<int32_t>> sequences_from_token_file(const std::string& path, int32_t vocab_size,
                                                            int32_t seq_len);

/// One row of the eval / demo table.
struct FormatRow {
  KVCacheSpec spec;
  std::string label;
  double bytes_per_token = 0.0;
  double effective_bits = 0.0;
  double ratio_vs_bf16 = 0.0;   ///< bf16 bytes per token / bytes per token
  double decode_tok_s = 0.0;
  Metrics metrics;
  std::vector<Metrics> per_sequence;  ///< compare_per_sequence (eval's replay; empty in the demo)
  // demo only: free-running greedy generation with this cache
  std::vector<int32_t> greedy_tokens;
  std::string greedy_text;
  int32_t greedy_divergence = -1;  ///< first generated step that differs from the fp32 cache's text; −1 = none
};

/// Evaluates every format of `specs` on `sequences` on `target`: check_target() first (UnsupportedError before any
/// work), then the reference (target.reference_spec() on target.reference_options()) is replayed, then each format
/// on target.engine. Progress counts tokens.
std::vector<FormatRow> evaluate(const Model& model, const std::vector<KVCacheSpec>& specs,
                                const std::vector<std::vector<int32_t>>& sequences, int32_t batch = 0,
                                const Progress& progress = {}, const EvalTarget& target = {});

}  // namespace flashkv::eval
