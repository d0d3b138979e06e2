// flashkv eval --text: perplexity and teacher-forced KL(fp32 cache ‖ format) on real text, with llama.cpp's
// llama-perplexity protocol so that numbers compare like for like with its KV cache types.
//
// PROTOCOL (llama.cpp tools/perplexity/perplexity.cpp, `--kl-divergence` mode, read from commit 0c1e57098):
//   - the whole text is tokenized once (BOS first iff the tokenizer adds one; no special-token parsing);
//   - chunk c is tokens [c·n_ctx, (c+1)·n_ctx) (a trailing partial chunk is dropped; at most max_chunks chunks);
//     when the tokenizer adds BOS, the chunk's first token is replaced by BOS (llama.cpp does the same);
//   - every chunk starts from an empty cache and is fed in ubatches of `ubatch` tokens through Engine::extend, i.e.
//     each ubatch's K/V are written into the cache under test (quantized on write) and its queries attend over the
//     stored cache — as llama.cpp's ubatches and a serving engine's chunked prefill do — so the quantized history is
//     what later tokens see;
//   - scored positions: j in [n_ctx/2, n_ctx − 1) of each chunk, predicting token j + 1 (n_ctx/2 − 1 per chunk).
// The reference (the fp32 cache on the CPU; on CUDA the device's bf16 cache or the CPU's fp32 one: EvalTarget) runs in
// lockstep (same chunk, same ubatches) with every format.
// Per scored position (log-softmax in float64 from the float32 logits; p = reference, q = format):
//   nll        = −log q(next)                              PPL = exp(mean nll) ± PPL·σ(nll)/√(n−1)
//   KLD        = Σ_v p(v)(log p(v) − log q(v))            mean ± σ/√(n−1); 99th percentile; max (all nats)
//   Δp         = q(next) − p(next)                         RMS Δp = sqrt(mean Δp²)
//   same top-1 = argmax q == argmax p (lowest id on ties)  share ± sqrt(s(1−s)/(n−1))
//   ΔPPL       = PPL(format) − PPL(fp32), ± with the covariance of the two nll streams (llama.cpp's formula)
// Differences from llama.cpp that do not change the definitions: its reference is its own f16 cache, stored as
// 16-bit log-probs, and its KL sum skips reference terms below e^−16; here the reference is exact (fp32 cache, float64
// sums, all terms). Uncertainties are llama.cpp's (independent-token approximations).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "eval/evaluation.hpp"

namespace flashkv::eval {

struct PerplexityOptions {
  int32_t n_ctx = 512;      ///< tokens per chunk (<= the model's context)
  int32_t ubatch = 512;     ///< tokens per Engine::extend call (llama.cpp's n_ubatch default)
  int32_t max_chunks = 0;   ///< 0 = every full chunk of the text
  int32_t bos_id = -1;      ///< >= 0: replace each chunk's first token with it (the tokenizer adds BOS)
};

/// Statistics of one cache over the scored positions.
struct TextStats {
  int64_t scored = 0;
  double ppl = 0.0, ppl_err = 0.0;
  double delta_ppl = 0.0, delta_ppl_err = 0.0;   ///< vs the fp32 cache
  double kld_mean = 0.0, kld_err = 0.0, kld_p99 = 0.0, kld_max = 0.0, kld_median = 0.0;
  double rms_dp = 0.0, rms_dp_err = 0.0;          ///< fraction (× 100 for %)
  double same_top1 = 0.0, same_top1_err = 0.0;    ///< fraction
};

struct TextRow {
  KVCacheSpec spec;
  std::string label;
  double bytes_per_token = 0.0;   ///< at n_ctx cached tokens (all layers, K and V, everything counted)
  double effective_bits = 0.0;
  double ratio_vs_bf16 = 0.0;
  double prefill_tok_s = 0.0;     ///< tokens / second of this cache's extend calls (lockstep, indicative only)
  TextStats stats;
};

struct TextResult {
  int32_t n_ctx = 0, ubatch = 0, chunks = 0;
  int64_t text_tokens = 0;        ///< tokens of the whole text
  TextStats reference;            ///< the reference cache (its ppl; KLD = 0)
  KVCacheSpec reference_spec;     ///< fp32 (CPU) or bf16 (CUDA)
  std::string reference_device = "cpu";  ///< where the reference ran: "cpu" or "cuda:N"
  std::string device = "cpu";            ///< where the formats ran
  double reference_bits = 32.0;   ///< effective bits of the reference cache
  std::vector<TextRow> rows;      ///< one per format, in the order given
};

/// Tokens of a text file for the protocol above (BOS first iff tok.add_bos()).
std::vector<int32_t> text_tokens(const Tokenizer& tok, const std::string& text);

/// Runs the protocol on `target` (the reference on target.reference_options(), the formats on target.engine). Throws
/// Error naming 'n_ctx' (< 4 or > the model's context), 'ubatch' (< 1), 'text' (fewer than n_ctx tokens), or whatever
/// the cache rejects for a spec; UnsupportedError (before any work) for a format the device cannot run. Progress
/// counts tokens fed (all caches).
TextResult evaluate_text(const Model& model, const std::vector<KVCacheSpec>& specs, const std::vector<int32_t>& tokens,
                         const PerplexityOptions& options, const Progress& progress = {},
                         const EvalTarget& target = {});

/// The statistics above from per-position values (exposed for the tests): nll_ref / nll_fmt (−log p(next)),
/// kld, dp (q(next) − p(next)), same (0/1).
TextStats text_stats(const std::vector<double>& nll_ref, const std::vector<double>& nll_fmt,
                     const std::vector<double>& kld, const std::vector<double>& dp, const std::vector<uint8_t>& same);

/// Per-position comparison of two logit rows (float64 log-softmax): KL(p‖q), log p(next), log q(next), argmax
/// agreement. Identical rows give KL = 0 exactly.
struct RowCompare {
  double kld = 0.0, logp_next = 0.0, logq_next = 0.0;
  bool same_top1 = true;
};
RowCompare compare_rows(const float* ref, const float* fmt, int32_t vocab, int32_t next);

}  // namespace flashkv::eval
