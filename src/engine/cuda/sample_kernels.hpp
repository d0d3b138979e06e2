// Token sampling on the device over float32 logits [rows, vocab] (row-major, device memory): the distribution of
// flashkv::Sampler (src/engine/sampler.cpp) — greedy argmax, temperature, top-k, top-p (nucleus; Holtzman et al.,
// "The Curious Case of Neural Text Degeneration", ICLR 2020, §3.1) — with the uniform draw u supplied by the host's
// xorshift64* stream, so a seed gives the same draws on both devices.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace flashkv::engine_cuda {

/// One row's sampling parameters (SamplerConfig's meaning; validated by the Sampler).
struct RowSampling {
  float temperature = 0.0f;  ///< 0 = argmax (lowest id on ties; a NaN logit never wins unless it is id 0, as the CPU)
  float top_p = 1.0f;        ///< (0, 1]
  int32_t top_k = 0;         ///< 0 = off
  float u = 0.0f;            ///< the draw in [0, 1) (unused when temperature = 0)
};

/// Device workspace of sample_rows(), grown on demand (sort keys / ids, kept-set flags, parameters, tokens).
class SampleWorkspace {
 public:
  SampleWorkspace();
  ~SampleWorkspace();
  SampleWorkspace(const SampleWorkspace&) = delete;
  SampleWorkspace& operator=(const SampleWorkspace&) = delete;
  struct Buffers;
  std::unique_ptr<Buffers> b;
};

/// Returns one token per row of `logits` [rows, vocab] (device float32), row r drawn with params[r] (host array of
/// `rows` entries). For temperature > 0 the row's distribution is Sampler::distribution's: p_i = exp((l_i − max) / T) /
/// Σ (float64), then, when top_k is in (0, vocab), the top_k most probable tokens and, when top_p < 1, the smallest
/// prefix (order by probability, ties to the lower id: a stable sort by logit) whose cumulative mass reaches top_p of
/// the kept mass; renormalized. The token is the first id (ascending) whose running CDF exceeds u, skipping zero
/// probabilities; the last positive-probability id when rounding leaves u above the top. One upload of the parameters
/// and one download of the tokens (page-locked staging; the workspace grows only when `rows` or vocab does), then
/// synchronizes `stream` once.
std::vector<int32_t> sample_rows(const float* logits, int64_t vocab, const RowSampling* params, int rows,
                                 SampleWorkspace& ws, cudaStream_t stream);

}  // namespace flashkv::engine_cuda
