// flashkv demo: the main job in one command — the shipped model run once per KV format (fp32 reference, bf16,
// fp8_e4m3, int8, int4, int4 KIVI, int2 KIVI + residual), one side-by-side table, then the generated texts.
#pragma once

#include <string>
#include <vector>

#include "eval/evaluation.hpp"

namespace flashkv::eval {

/// The demo's formats: fp32, bf16, fp8_e4m3, int8, int4, int4_kivi, int2_kivi+r32 (page_size 32; KIVI group
/// G = min(32, head_dim), since KIVI groups V over G channels).
std::vector<KVCacheSpec> demo_formats(int32_t head_dim = 128);
/// The KIVI group size used by demo_formats(head_dim).
int32_t demo_kivi_group(int32_t head_dim);

struct DemoOptions {
  std::string prompt;            ///< "" = generate from BOS
  int32_t steps = 0;             ///< generated tokens per format; 0 = up to the context end
  int32_t samples = 7;           ///< extra sequences sampled from the fp32 model for the teacher-forced metrics
  uint64_t seed = 1;
  std::vector<KVCacheSpec> formats;  ///< empty = demo_formats(model head_dim)
};

struct DemoResult {
  std::vector<int32_t> prompt_tokens;
  std::vector<FormatRow> rows;   ///< one per format, fp32 first when present
  int32_t sequences = 0;         ///< teacher-forced sequences (the fp32 greedy text + samples)
  int64_t positions = 0;         ///< predicted positions per format
};

/// Runs the demo: greedy generation with every format (decode tok/s = best of 3 identical runs; greedy divergence vs
/// the fp32 cache's text) and
/// the teacher-forced metrics (mean KL, top-1, Δll) on the fp32 greedy text plus `samples` sampled sequences.
DemoResult run_demo(const LoadedModel& lm, const DemoOptions& options, const Progress& progress = {});

}  // namespace flashkv::eval
