// flashkv bench engine: prefill and decode speed of the whole model per KV format at a given context, measured the way
// llama.cpp's llama-bench measures `-p N_PROMPT -n N_GEN -d DEPTH` so the two compare on the same machine.
//
// PROTOCOL (per format, per context C, per repetition; tokens are arbitrary ids, as llama-bench's):
//   depth D = C − n_gen − n_prompt tokens are prefilled through the cache (Engine::extend, ubatch tokens per call;
//   not timed); then
//   decode (tg): n_gen tokens, one Engine::decode call each, timed   → tg tok/s = n_gen / seconds, at depth D..D+n_gen
//   prefill (pp): n_prompt tokens, Engine::extend in ubatches, timed  → pp tok/s = n_prompt / seconds, at D+n_gen..C
// so both end at context C. llama-bench's equivalents: `-n n_gen -p 0 -d D` and `-p n_prompt -n 0 -d D+n_gen`.
// Mean and sample standard deviation over the repetitions (each a fresh sequence).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "eval/evaluation.hpp"

namespace flashkv::eval {

struct SpeedOptions {
  std::vector<int32_t> contexts = {2048, 8192};
  int32_t n_prompt = 512;
  int32_t n_gen = 128;
  int32_t repeats = 3;
  int32_t ubatch = 512;
  EngineOptions engine;  ///< where the engine runs (device; the pool is the default full size)
};

struct SpeedRow {
  KVCacheSpec spec;
  std::string label;
  int32_t context = 0, depth = 0;
  double pp_mean = 0.0, pp_sd = 0.0, tg_mean = 0.0, tg_sd = 0.0;  ///< tokens / second
  std::vector<double> pp, tg;                                     ///< per repetition
  double bytes_per_token = 0.0, effective_bits = 0.0;             ///< at context C
  CudaGraphStats graphs;  ///< the CUDA engine's graph counters after the row (zero on the CPU)
};

/// Runs the protocol for every (format, context). Throws Error naming 'contexts' (C − n_gen − n_prompt < 0 or C above
/// the model's context), 'n_prompt', 'n_gen', 'repeats'. `on_row` is called after each row (for streaming output).
std::vector<SpeedRow> run_speed(const Model& model, const std::vector<KVCacheSpec>& specs, const SpeedOptions& options,
                                const std::function<void(const SpeedRow&)>& on_row = {});

}  // namespace flashkv::eval
