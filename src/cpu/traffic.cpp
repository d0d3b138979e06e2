// Analytic traffic model (include/flashkv/traffic.hpp): walks each variant's loop structure over the tile grid of
// one (batch, head) with the kernels' block-skipping rule (src/core/mask.hpp) and counts the bytes each loop moves.
#include "flashkv/traffic.hpp"

#include <algorithm>
#include <string>

#include "core/mask.hpp"
#include "cpu/tile_math.hpp"
#include "flashkv/error.hpp"

namespace flashkv {

// The model's default tile is the CPU forward kernels' tile: `flashkv explain tiles` and `flashkv bench attention`
// print tile sizes from these defaults.
static_assert(TrafficShape{}.block_m == cpu::kBlockM && TrafficShape{}.block_n == cpu::kBlockN,
              "TrafficShape's default block_m/block_n must equal the CPU kernels' kBlockM/kBlockN");

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_shape(const TrafficShape& s) {
  auto positive = [](int64_t v, const char* name, bool allow_zero) {
    if (v < (allow_zero ? 0 : 1)) {
      throw Error(name, allow_zero ? ">= 0" : ">= 1", std::to_string(v));
    }
  };
  positive(s.batch, "batch", true);
  positive(s.num_heads, "num_heads", false);
  positive(s.seqlen_q, "seqlen_q", true);
  positive(s.seqlen_k, "seqlen_k", true);
  positive(s.head_dim, "head_dim", false);
  positive(s.head_dim_v, "head_dim_v", true);
  positive(s.block_m, "block_m", false);
  positive(s.block_n, "block_n", false);
  positive(s.num_workers, "num_workers", false);
  if (s.dtype != DType::float32 && s.dtype != DType::float16 && s.dtype != DType::bfloat16) {
    throw TypeError("dtype", "float32, float16 or bfloat16", dtype_name(s.dtype));
  }
  if (s.window_size_left < -1) throw Error("window_size_left", ">= -1", std::to_string(s.window_size_left));
  if (s.window_size_right < -1) throw Error("window_size_right", ">= -1", std::to_string(s.window_size_right));
}

core::MaskRule mask_of(const TrafficShape& s) {
  return core::MaskRule{s.seqlen_q, s.seqlen_k, s.window_size_left, s.causal ? 0 : s.window_size_right};
}

void finish(TrafficEstimate& t, const TrafficShape& s, double heads, double fast_floats, double slow_floats) {
  t.q_read *= heads;
  t.k_read *= heads;
  t.v_read *= heads;
  t.out_write *= heads;
  t.lse_write *= heads;
  t.o_acc_read *= heads;
  t.o_acc_write *= heads;
  t.stats_read *= heads;
  t.stats_write *= heads;
  t.s_write *= heads;
  t.s_read *= heads;
  t.p_write *= heads;
  t.p_read *= heads;
  t.tiles_visited *= static_cast<int64_t>(heads);
  t.tiles_total = ceil_div(s.seqlen_q, s.block_m) * ceil_div(s.seqlen_k, s.block_n) * static_cast<int64_t>(heads);
  t.bytes_read = t.q_read + t.k_read + t.v_read + t.o_acc_read + t.stats_read + t.s_read + t.p_read;
  t.bytes_written = t.out_write + t.lse_write + t.o_acc_write + t.stats_write + t.s_write + t.p_write;
  t.bytes_total = t.bytes_read + t.bytes_written;
  t.fast_memory_bytes = 4.0 * fast_floats;
  t.extra_memory_bytes = static_cast<double>(s.num_workers) * 4.0 * (fast_floats + slow_floats);
  t.flops = attention_forward_flops(s);
  t.arithmetic_intensity = t.bytes_total > 0 ? t.flops / t.bytes_total : 0.0;
}

}  // namespace

double attention_forward_flops(const TrafficShape& s) {
  const double dv = static_cast<double>(s.head_dim_v > 0 ? s.head_dim_v : s.head_dim);
  const double f = 2.0 * static_cast<double>(s.batch) * static_cast<double>(s.num_heads) *
                   static_cast<double>(s.seqlen_q) * static_cast<double>(s.seqlen_k) *
                   (static_cast<double>(s.head_dim) + dv);
  return s.causal ? 0.5 * f : f;
}

TrafficEstimate estimate_traffic(Algorithm algorithm, const TrafficShape& shape) {
  check_shape(shape);
  TrafficShape s = shape;
  if (s.head_dim_v == 0) s.head_dim_v = s.head_dim;
  const double e = static_cast<double>(dtype_size(s.dtype));
  const double n = static_cast<double>(s.seqlen_q), m = static_cast<double>(s.seqlen_k);
  const double d = static_cast<double>(s.head_dim), dv = static_cast<double>(s.head_dim_v);
  const int64_t br = s.block_m, bc = s.block_n;
  const double heads = static_cast<double>(s.batch * s.num_heads);
  const core::MaskRule mask = mask_of(s);
  // Per-worker float32 tiles: Q (Br×d), Kᵀ (d×Bc), V (Bc×dv), S/P (Br×Bc), O (Br×dv).
  const double fast = static_cast<double>(br) * d + d * static_cast<double>(bc) + static_cast<double>(bc) * dv +
                      static_cast<double>(br * bc) + static_cast<double>(br) * dv;
  TrafficEstimate t;
  t.algorithm = algorithm;
  switch (algorithm) {
    case Algorithm::tiled: {
      for (int64_t q0 = 0; q0 < s.seqlen_q; q0 += br) {
        const int64_t rows = std::min(br, s.seqlen_q - q0);
        int64_t kf = 0, kl = 0;
        mask.block_key_range(q0, q0 + rows, &kf, &kl);
        if (kf < kl) {
          const double keys = static_cast<double>(kl - kf);
          t.q_read += static_cast<double>(rows) * d * e;
          t.k_read += keys * d * e;
          t.v_read += keys * dv * e;
          t.tiles_visited += ceil_div(kl - kf, bc);
        }
      }
      t.out_write = n * dv * e;
      t.lse_write = n * 4.0;
      finish(t, s, heads, fast, 0.0);
      break;
    }
    case Algorithm::v1_order: {
      t.o_acc_write = n * dv * 4.0;  // O = 0, m = −inf, l = 0 initialised in slow memory
      t.stats_write = n * 8.0;
      for (int64_t k0 = 0; k0 < s.seqlen_k; k0 += bc) {
        const int64_t kc = std::min(bc, s.seqlen_k - k0);
        int64_t qf = 0, ql = 0;
        mask.block_query_range(k0, k0 + kc, &qf, &ql);
        if (qf >= ql) continue;
        const double rows = static_cast<double>(ql - qf);
        t.k_read += static_cast<double>(kc) * d * e;
        t.v_read += static_cast<double>(kc) * dv * e;
        t.q_read += rows * d * e;
        t.o_acc_read += rows * dv * 4.0;
        t.o_acc_write += rows * dv * 4.0;
        t.stats_read += rows * 8.0;
        t.stats_write += rows * 8.0;
        t.tiles_visited += ceil_div(ql - qf, br);
      }
      t.o_acc_read += n * dv * 4.0 + n * 8.0;  // final pass: O, m, l -> out, lse
      t.out_write = n * dv * e;
      t.lse_write = n * 4.0;
      finish(t, s, heads, fast, n * (dv + 2.0));
      break;
    }
    case Algorithm::naive: {
      const double tr = static_cast<double>(ceil_div(s.seqlen_q, br));
      t.q_read = n * d * e;
      t.k_read = tr * m * d * e;
      t.s_write = n * m * 4.0;
      t.s_read = n * m * 4.0;
      t.p_write = n * m * 4.0;
      t.p_read = n * m * 4.0;
      t.v_read = tr * m * dv * e;
      t.out_write = n * dv * e;
      t.lse_write = n * 4.0;
      t.tiles_visited = ceil_div(s.seqlen_q, br) * ceil_div(s.seqlen_k, bc);
      finish(t, s, heads, fast, n * m);
      break;
    }
    default:
      throw Error("algorithm", "tiled (0), v1_order (1) or naive (2)", std::to_string(static_cast<int>(algorithm)));
  }
  return t;
}

std::string traffic_formula(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::tiled:
      return "tiled (FA2): per head N·d·e (Q once) + Σ_i K_vis(i)·(d+dv)·e (K,V per Q block) + N·dv·e (O once) + 4N "
             "(lse); S, P, O, m, l stay in fast memory";
    case Algorithm::v1_order:
      return "v1 (FA1 order): per head Σ_j keys_j·(d+dv)·e (K,V once) + Σ_j Q_vis(j)·(d·e + 2·(dv+2)·4) (Q re-read, "
             "O,m,l read+written per K/V block) + N·(dv+2)·4·2 (init, final read) + N·dv·e + 4N";
    case Algorithm::naive:
      return "naive: per head N·d·e + Tr·M·(d+dv)·e (K, V per Q block) + 4·N·M·4 (S written, read; P written, read) "
             "+ N·dv·e + 4N";
  }
  return "unknown";
}

}  // namespace flashkv
