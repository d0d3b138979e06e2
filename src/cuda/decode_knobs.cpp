// The CUDA decode's tuning knobs (decode_cuda.hpp): environment variables read once per process, each an A/B switch
// of the split-KV decode for benchmarks; any value outside its set is an Error naming the variable.
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/decode_cuda.hpp"
#include "flashkv/error.hpp"

namespace flashkv::cuda {

DecodeCombine decode_combine_mode() {
  static const DecodeCombine mode = [] {
    const char* e = std::getenv("FLASHKV_DECODE_COMBINE");
    if (e == nullptr || std::strcmp(e, "fused") == 0) return DecodeCombine::fused;
    if (std::strcmp(e, "kernel") == 0) return DecodeCombine::kernel;
    throw Error("FLASHKV_DECODE_COMBINE", "fused or kernel (how the split-KV decode merges its splits)",
                std::string("'") + e + "'");
  }();
  return mode;
}

int32_t decode_l2_prefetch_blocks() {
  // read once; FLASHKV_DECODE_L2_PREFETCH=N (0..16 blocks, 0 = off) is a tuning knob of the packed-page decode. Off by
  // default: on the H200 every packed format decoded faster without it (run7 call 4, bench/results/h200-2026-12-01-run7:
  // e.g. batch 64 / 32k fp8_e4m3 1649 vs 1939 us, int8 2367 vs 2473 us, int4 1887 vs 1990 us with 2 blocks).
  static const int32_t blocks = [] {
    const char* e = std::getenv("FLASHKV_DECODE_L2_PREFETCH");
    if (e == nullptr) return int32_t{0};
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    if (end == e || *end != '\0' || v < 0 || v > 16) {
      throw Error("FLASHKV_DECODE_L2_PREFETCH", "an integer in [0, 16] (key blocks prefetched into L2 ahead of the "
                  "quantized decode's cp.async ring; 0 = off)", std::string("'") + e + "'");
    }
    return static_cast<int32_t>(v);
  }();
  return blocks;
}

bool decode_keys_m() {
  // read once; FLASHKV_DECODE_KEYS_M=0 runs the 16-row loop where the keys-as-M loop would (the A/B of
  // bench/results/h200-2026-12-03-run13; the default, 1, is the keys-as-M loop: half the MMAs at <= 8 query rows)
  static const bool on = [] {
    const char* e = std::getenv("FLASHKV_DECODE_KEYS_M");
    if (e == nullptr || std::strcmp(e, "1") == 0) return true;
    if (std::strcmp(e, "0") == 0) return false;
    throw Error("FLASHKV_DECODE_KEYS_M", "0 or 1 (whether the packed-page decode runs its keys-as-M loop for CTAs of "
                "<= 8 query rows)", std::string("'") + e + "'");
  }();
  return on;
}

}  // namespace flashkv::cuda
