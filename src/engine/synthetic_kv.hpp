// Synthetic K/V for benchmarks (Engine::append_synthetic, `flashkv bench engine --fill synthetic`): element
// (half, layer, position, kv-head, channel) of the cache's input is one of the 256 values (k − 128) / 64, k in [0, 256)
// uniform from a counter-based hash (the splitmix64 finalizer, Steele, Lea & Flood, OOPSLA 2014) of its coordinates
// and a seed. Every value has at most 7 significant bits, so it is exact in float32, bfloat16 and float16: the CPU and
// the CUDA backend append the same values whatever dtype they stage them in.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FLASHKV_SYNTH_HD __host__ __device__
#else
#define FLASHKV_SYNTH_HD
#endif

namespace flashkv::engine_detail {

FLASHKV_SYNTH_HD inline uint64_t synthetic_mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

/// The value of K (half 0) or V (half 1) at (layer, pos, head, channel) of a model with num_layers layers,
/// num_heads_kv KV heads and head_dim channels: in [−2, 127/64], a multiple of 1/64.
FLASHKV_SYNTH_HD inline float synthetic_kv_value(uint64_t seed, int half, int layer, int64_t pos, int head, int channel,
                                                 int num_layers, int num_heads_kv, int head_dim) {
  const uint64_t key =
      (((static_cast<uint64_t>(pos) * static_cast<uint64_t>(num_layers) + static_cast<uint64_t>(layer)) * 2u +
        static_cast<uint64_t>(half)) * static_cast<uint64_t>(num_heads_kv) + static_cast<uint64_t>(head)) *
          static_cast<uint64_t>(head_dim) + static_cast<uint64_t>(channel);
  const uint64_t h = synthetic_mix64(seed ^ synthetic_mix64(key + 0x9e3779b97f4a7c15ull));
  return static_cast<float>(static_cast<int>(h >> 56) - 128) * (1.0f / 64.0f);
}

}  // namespace flashkv::engine_detail
