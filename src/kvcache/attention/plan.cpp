// CPU decode plan (cpu_decode.hpp): per sequence the mask rule and the visible key range, split into num_splits
// chunks (the heuristic fills the threads: enough tasks for 2 per thread, chunks of at least 512 keys, 16-aligned);
// per half whether the fused AVX-512 kernels read it (every format at head_dim 64 / 128 / 256 on CPUs with AVX-512)
// or the codec decodes its tiles; the partial-state workspace. Computed once, run for every layer of the step.
#include <algorithm>
#include <cmath>
#include <string>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "kvcache/attention/cpu_decode.hpp"
#include "kvcache/attention/cpu_decode_impl.hpp"
#include "kvcache/attention/decode_fused.hpp"
#include "kvcache/attention/decode_tile.hpp"

namespace flashkv::kv {
namespace {

CpuHalfPlan plan_half(const KVHalfFormat& f, const float* head_scales, int64_t num_heads_kv, int32_t d) {
  CpuHalfPlan p;
  p.fmt = f;
  if (head_scales != nullptr) p.scales.assign(head_scales, head_scales + num_heads_kv);
  if (!fused_supported(d) || !fused_code(f.code) || !fused_scaling(f.scaling)) return p;
  const float mul = f.code == KVCode::e4m3 ? 256.0f : 1.0f;  // the e4m3 route yields value · 2^-8
  if (f.scaling == KVScaling::token_f32) p.mul = mul;
  if (f.scaling == KVScaling::head_static) {
    if (p.scales.empty()) p.scales.assign(static_cast<size_t>(num_heads_kv), 1.0f);
    for (float& x : p.scales) {
      x *= mul;
      if (!std::isfinite(x)) {  // 2^8·scale overflows: the codec path (exact) instead
        p.scales.assign(head_scales, head_scales + num_heads_kv);
        return p;
      }
    }
  }
  p.fused = true;
  return p;
}

std::string code_name(const KVHalfFormat& f) {
  static const char* names[] = {"fp32", "bf16", "fp16", "e4m3", "e5m2", "u8", "u4", "u2"};
  static const char* scalings[] = {"", "/static", "/token", "/token-group", "/channel"};
  std::string s = names[static_cast<int>(f.code)];
  s += scalings[static_cast<int>(f.scaling)];
  if (f.scaling == KVScaling::token_affine && f.group != f.head_dim) s += std::to_string(f.group);
  if (f.scaling == KVScaling::channel_affine) s += std::to_string(f.group);
  return s;
}

/// The kv_cache_dtype name of a half when the problem carries it, else the trait's description.
std::string format_label(const core::DecodeKV& kv, int half) {
  return kv.format_name[half] != nullptr && kv.format_name[half][0] != '\0' ? std::string(kv.format_name[half])
                                                                           : code_name(kv.format[half]);
}

}  // namespace

CpuDecodeWork::CpuDecodeWork(const core::DecodeProblem& p)
    : batch_(p.batch), num_heads_kv_(p.num_heads_kv), g_(p.group_size()), d_(p.head_dim) {
#if defined(_OPENMP)
  threads_ = p.num_threads > 0 ? p.num_threads : omp_get_max_threads();
#else
  threads_ = 1;
#endif
  const int64_t H = num_heads_kv_, B = batch_;
  rules_.resize(static_cast<size_t>(B));
  q_begin_.resize(static_cast<size_t>(B));
  bh_row0_.assign(static_cast<size_t>(B * H + 1), 0);
  task_begin_.assign(static_cast<size_t>(B * H + 1), 0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = p.seqlen_k_of(b), nqb = p.seqlen_q_of(b);
    q_begin_[static_cast<size_t>(b)] = p.q_begin(b);
    const core::MaskRule rule{nqb, n, p.window_size_left, p.causal ? 0 : -1};
    rules_[static_cast<size_t>(b)] = rule;
    int64_t lo = 0, hi = 0;
    rule.block_key_range(0, nqb, &lo, &hi);
    const int64_t len = std::max<int64_t>(hi - lo, 0);
    int64_t ns = p.num_splits;
    if (ns == 0) {
      const int64_t want = (2 * threads_ + B * H - 1) / (B * H);
      ns = std::min<int64_t>(want, len / 512);
    }
    ns = std::max<int64_t>(1, std::min<int64_t>(ns, (len + 15) / 16));
    const int64_t chunk = ((len + ns - 1) / ns + 15) / 16 * 16;
    for (int64_t hk = 0; hk < H; ++hk) {
      const size_t bh = static_cast<size_t>(b * H + hk);
      task_begin_[bh] = static_cast<int64_t>(tasks_.size());
      // rows of the prepared-query buffer: sequences packed in order (varlen cu_seqlens_q, fixed b · seqlen_q)
      const int64_t packed_row0 = p.is_varlen ? p.q_begin(b) : b * p.seqlen_q;
      bh_row0_[bh] = (packed_row0 * H + hk * nqb) * g_;
      if (nqb == 0) continue;
      int64_t k0 = lo, splits = 0;
      do {
        const int64_t k1 = std::min(hi, k0 + chunk);
        tasks_.push_back(CpuDecodeTask{static_cast<int32_t>(b), static_cast<int32_t>(hk), k0, std::max(k0, k1),
                                       part_rows_});
        part_rows_ += g_ * nqb;
        k0 = k1;
        ++splits;
      } while (k0 < hi);
      max_splits_ = std::max<int32_t>(max_splits_, static_cast<int32_t>(splits));
    }
  }
  task_begin_[static_cast<size_t>(B * H)] = static_cast<int64_t>(tasks_.size());
  bh_row0_[static_cast<size_t>(B * H)] = p.total_q * H * g_;
  small_work_ = part_rows_ * d_ <= (int64_t{1} << 16);
  part_acc_.resize(static_cast<size_t>(part_rows_ * d_));
  part_m_.resize(static_cast<size_t>(part_rows_));
  part_l_.resize(static_cast<size_t>(part_rows_));
  qprep_.resize(static_cast<size_t>(p.total_q * p.num_heads * d_));
  qsum_.resize(static_cast<size_t>(p.total_q * p.num_heads));

  const int32_t d = static_cast<int32_t>(d_);
  for (int half = 0; half < 2; ++half) {
    half_[half] = plan_half(p.kv.format[half], p.kv.head_scales[half], H, d);
    std::vector<float> scales = half_[half].scales;
    if (!half_[half].fused) {
      if (scales.empty()) scales.assign(static_cast<size_t>(H), 1.0f);
    } else if (p.kv.head_scales[half] != nullptr) {
      scales.assign(p.kv.head_scales[half], p.kv.head_scales[half] + H);
    } else {
      scales.assign(static_cast<size_t>(H), 1.0f);
    }
    codec_[half] = std::make_unique<KVCodec>(p.kv.format[half], p.kv.page_size, std::move(scales));
  }
  fused_window_ = fused_supported(d);
  const bool all_fused = half_[0].fused && half_[1].fused;
  path_ = std::string("kv_decode cpu ") + (all_fused ? "fused-avx512" : (half_[0].fused || half_[1].fused ? "mixed" : "generic")) +
          " k=" + format_label(p.kv, 0) + " v=" + format_label(p.kv, 1) + " hdim" + std::to_string(d_) +
          " splits" + std::to_string(max_splits_);
  if (p.kv.regions.has_window()) path_ += " windows";
  if (p.kv.rot_k || p.kv.rot_v) path_ += " hadamard";
  if (p.is_varlen && p.max_seqlen_q > 1) path_ += " varlen";
}

std::unique_ptr<core::DecodeWork> plan_cpu_decode(const core::DecodeProblem& p) {
  return std::make_unique<CpuDecodeWork>(p);
}

}  // namespace flashkv::kv
