// flashkv bench engine --batch: decode tokens/s of B sequences decoded together (continuous batching's steady state)
// per KV format × context × batch, how many sequences of a context fit the page pool, and the bytes every decode step
// must read (the memory-bound floor's numerator).
//
// PROTOCOL (per format one Engine: max_context = the largest context, max_sequences = the largest batch, the page pool
// = pool_bytes / page_bytes pages, or enough for the largest numeric batch at the largest context when pool_bytes = 0):
//   per context C, per batch B in ascending order (P points at C):
//     the point decodes sequences 0 .. B−1. Sequences new to this point are filled to depth D = C − P·(warmup + n_gen)
//     tokens (not timed) with Engine::append_synthetic (synthetic = true: seeded synthetic K/V written straight into
//     the cache, no model compute) or with Engine::extend over arbitrary token ids in ubatch-token chunks
//     (synthetic = false: a real prefill through the cache); the others continue from where the previous point left
//     them (no refill), so no sequence passes C and a point's sequences attend between D and C tokens: each row
//     reports the mean and the largest count attended.
//     Up to `warmup` untimed steps, then up to n_gen timed steps (with point_seconds > 0 each loop stops, after at
//     least one step, once point_seconds have passed). A step = Engine::decode of the B sequences (one token each, the
//     tokens sampled by the previous step) + Engine::sample (greedy, on the engine's device): the generation loop's
//     step, which ends with the sampled tokens on the host. Wall clock (steady_clock) per step.
//   B = 0 means "max": the most sequences of C tokens the pool holds, min(batch_cap, pool_pages / pages of a C-token
//   sequence) — a C-token sequence's pages by kv_memory_estimate (the cache's exact formula); a numeric B above it is
//   reported "does not fit" (never clamped). At capacity_context == C that number is also MEASURED: sequences are
//   filled to C tokens one by one until the engine refuses one with CapacityError (or probe_cap sequences are held),
//   then all are removed.
//   Bytes per step: weight_bytes (the engine's device copy: bf16 matrices + float32 norms + B float32 embedding rows on
//   cuda; everything float32 on the cpu) + Σ_b the codes + metadata (+ 16-bit windows) of the n_b tokens sequence b
//   attends (kv_memory_estimate), averaged over the timed steps.
//   A pool the device refuses (CapacityError at construction) is retried 10% smaller, twice (noted in the format's
//   message).
// A format the engine cannot run (UnsupportedError: e.g. KIVI on cuda) is reported with its message, not dropped.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "flashkv/engine.hpp"

namespace flashkv::eval {

struct BatchDecodeOptions {
  std::vector<int32_t> contexts = {1024};  ///< C, each >= (distinct batches) · (warmup + n_gen) + 1
  std::vector<int32_t> batches = {1};      ///< B >= 1, or 0 = "max"
  int32_t warmup = 2, n_gen = 16;
  double point_seconds = 0.0;  ///< > 0: stop timing a point after this many seconds (at least one timed step)
  int32_t batch_cap = 1024;    ///< "max" is at most this many sequences
  int64_t pool_bytes = 0;      ///< KV page pool per format (0: enough for the largest numeric batch at the largest C)
  int32_t capacity_context = 0;  ///< > 0: measure how many sequences of this context fit (must be one of contexts)
  int32_t probe_cap = 8192;      ///< the capacity probe stops at this many sequences
  bool synthetic = true;         ///< fill: Engine::append_synthetic (true) or Engine::extend (false)
  int32_t ubatch = 512;          ///< tokens per extend call when !synthetic
  uint64_t seed = 1;             ///< synthetic K/V and the first step's token ids
  double time_budget = 0.0;      ///< > 0: points not started within this many seconds are reported "skipped"
  EngineOptions engine;
};

struct BatchDecodeRow {
  std::string kv_cache;  ///< KVCacheSpec::label()
  int32_t context = 0, batch = 0;
  int32_t depth = 0;       ///< fill depth of this context's sequences
  bool is_max = false;     ///< this batch is the most sequences of this context that fit
  std::string status;      ///< "ok" | "does not fit" | "context > model" | "skipped" | "error"
  std::string message;     ///< why, when status != "ok"
  int32_t warmup = 0, steps = 0;  ///< steps run (warm-up ones may stop early, see point_seconds)
  double fill_seconds = 0.0;
  std::vector<double> step_ms;  ///< per timed step
  double step_ms_mean = 0.0, step_ms_median = 0.0, step_ms_min = 0.0;
  double tokens_per_s = 0.0;    ///< batch · steps / timed seconds
  double context_mean = 0.0;    ///< tokens attended per sequence and timed step (its own token included), mean
  int32_t context_max = 0;      ///< ... the largest
  double kv_read_bytes_per_step = 0.0, weight_bytes_per_step = 0.0;
};

struct BatchCapacity {
  std::string kv_cache;
  int32_t context = 0;
  int64_t page_bytes = 0, pool_pages = 0, pages_per_sequence = 0;
  int64_t kv_bytes_per_sequence = 0;  ///< pages_per_sequence · page_bytes
  int64_t fit = 0;                    ///< pool_pages / pages_per_sequence (the pool's arithmetic)
  int64_t max_batch = 0;              ///< min(fit, batch_cap): the "max" batch at this context
  int64_t measured = -1;              ///< sequences filled to C before the engine refused one (-1: not measured)
  std::string measured_stop;          ///< what stopped the probe: the CapacityError message, or "probe_cap"
};

struct BatchFormat {
  std::string kv_cache;
  std::string status;   ///< "ok" | "unsupported" | "error"
  std::string message;
  double engine_seconds = 0.0;  ///< Engine construction (weights upload, pool allocation)
  int64_t pool_bytes = 0, page_bytes = 0, pool_pages = 0;
};

struct BatchDecodeResult {
  std::vector<BatchFormat> formats;
  std::vector<BatchCapacity> capacity;
  std::vector<BatchDecodeRow> rows;
};

/// Runs the protocol for every format. Throws Error naming 'contexts', 'batches', 'warmup', 'n_gen', 'batch_cap',
/// 'pool_bytes', 'capacity_context', 'ubatch' for invalid options (before any engine is built). `on_row` streams rows.
BatchDecodeResult run_batch_decode(const Model& model, const std::vector<KVCacheSpec>& specs,
                                   const BatchDecodeOptions& options,
                                   const std::function<void(const BatchDecodeRow&)>& on_row = {});

/// The result as text: one line per row (format, context, batch, step ms, tok/s, GB read per step, status) and one
/// per (format, context) capacity; and as JSON ({"formats": [...], "capacity": [...], "rows": [...]}, units in the
/// key names). batch_report.cpp.
std::string batch_decode_table(const BatchDecodeResult& r);
nlohmann::json batch_decode_to_json(const BatchDecodeResult& r);

/// Bytes of the engine's weights one decode step of `batch` sequences reads on `device` (see the file comment).
double decode_weight_bytes(const ModelConfig& c, Device device, int32_t batch);

}  // namespace flashkv::eval
