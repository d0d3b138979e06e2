// flashkv bench serve: a continuous-batching replay of N seeded requests through one Engine (CPU or CUDA), reporting
// decode throughput and per-token latency percentiles — the serving view of a KV format (issue 14).
//
// PROTOCOL (per KV format; every request arrives at t = 0, served first come, first served):
//   request i: a prompt of Lp tokens and an output of Lo tokens, Lp ~ U[prompt_min, prompt_max] and
//   Lo ~ U[output_min, output_max] (integers, std::mt19937_64 seeded with `seed`; prompt ids uniform over the vocabulary).
//   Loop until every request is done:
//     admit   while fewer than max_batch sequences are live and requests wait: add_sequence + prefill of the next
//             prompt (+ greedy sample of its first token: time to first token, TTFT); a prefill refused with
//             CapacityError (the page pool is full) waits for a retirement (an error when nothing is live: the prompt
//             can never fit);
//     decode  one Engine::decode step over every live sequence (greedy, sampled on the engine's device); a step refused
//             with CapacityError preempts the most recently admitted sequence (its pages freed, the request restarted
//             later from its prompt, as vLLM's recompute preemption; no admission until a sequence retires) and
//             retries;
//     retire  sequences that produced Lo tokens (or reached the context) are removed (their pages go back to the pool).
//   Inter-token latency (ITL) of a sequence = time between two of its consecutive tokens (decode steps and any
//   prefill that stalled them). decode tok/s = tokens produced by decode steps / time in decode steps; throughput =
//   all generated tokens / wall time.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "flashkv/engine.hpp"

namespace flashkv::eval {

struct ServeOptions {
  int32_t requests = 64;
  int32_t prompt_min = 32, prompt_max = 256;  ///< prompt tokens, uniform (1 <= min <= max)
  int32_t output_min = 16, output_max = 128;  ///< generated tokens, uniform (1 <= min <= max)
  int32_t max_batch = 16;                     ///< live sequences at most (the engine's max_sequences)
  /// Page pool (EngineOptions::kv_capacity_pages): 0 = enough for max_batch sequences of prompt_max + output_max.
  int64_t kv_capacity_pages = 0;
  uint64_t seed = 1;
  EngineOptions engine;  ///< device (kv_capacity_pages is set from the field above)
};

struct ServeResult {
  std::string label;                     ///< KVCacheSpec::label()
  int32_t requests = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;
  int32_t decode_steps = 0, preemptions = 0, deferred_admissions = 0;
  double wall_seconds = 0, prefill_seconds = 0, decode_seconds = 0;
  double decode_tokens_per_s = 0, throughput_tokens_per_s = 0;
  double mean_batch = 0;                 ///< mean live sequences per decode step
  int32_t max_batch_seen = 0;
  double itl_ms_p50 = 0, itl_ms_p90 = 0, itl_ms_p99 = 0, itl_ms_max = 0;  ///< inter-token latency, milliseconds
  double ttft_ms_p50 = 0, ttft_ms_p99 = 0;                               ///< from t = 0 (queueing included)
  int64_t kv_pool_pages = 0;
  double kv_bytes_per_token = 0;         ///< at the largest batch seen
  CudaGraphStats graphs;                 ///< the CUDA engine's graph counters at the end (zero on the CPU)
};

/// Runs the protocol for every spec. Throws Error naming 'requests', 'prompt_min' / 'prompt_max', 'output_min' /
/// 'output_max' (out of order, < 1, or prompt_max + output_max above the model's context), 'max_batch'; the Engine's
/// errors (UnsupportedError for a device / format it cannot run). `on_result` is called after each spec.
std::vector<ServeResult> run_serve(const Model& model, const std::vector<KVCacheSpec>& specs, const ServeOptions& options,
                                   const std::function<void(const ServeResult&)>& on_result = {});

/// Nearest-rank percentile (q in [0, 100]) of `values` (copied and sorted); 0 for an empty list.
double percentile(std::vector<double> values, double q);

/// Markdown table, one row per result.
std::string serve_table(const std::vector<ServeResult>& results);

}  // namespace flashkv::eval
