// PagedKVCache::attention — attention of query tokens against the packed cache, computed tile by tile.
//
// Work decomposition (flash-decoding; Dao, Haziza, Massa, Sizov, "Flash-Decoding for long-context inference", 2023):
// one task per (sequence, kv-head, split of the visible key range). A task holds the g = num_heads / num_heads_kv
// query heads × n_q query tokens that share the kv-head (GQA packing), walks its key range in tiles (a page of the
// quantized stream, or a run of sink / residual slots) and updates an online softmax (running max m, sum l,
// unnormalized accumulator; FlashAttention, Dao et al. 2022, Alg. 1) with each tile (kv::tile_update,
// decode_tile.cpp). A tile's K and V are read in place from the packed page by the fused AVX-512 kernels where the
// format allows (plan_half below; the bf16 window likewise), else decoded once by the codec into a small factored
// float tile (KVCodec::decode_factored); either way the format's scale / min is applied once per key, on the score or
// on p, not once per element. Splits are merged with their log-sum-exp: M = max m_s, L = Σ l_s·e^{m_s−M},
// out = Σ acc_s·e^{m_s−M} / L, lse = M + log L. The whole cache is never dequantized at once.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include <omp.h>

#include "core/float16.hpp"
#include "core/mask.hpp"
#include "core/validate.hpp"
#include "kvcache/cache/cache_impl.hpp"
#include "kvcache/attention/decode_tile.hpp"

namespace flashkv {

namespace {

constexpr int64_t kTile = kv::kDecodeTile;  // max tokens per tile

float load_q(const TensorView& t, int64_t i, int64_t h, int64_t c) {
  const int64_t off = i * t.strides[0] + h * t.strides[1] + c * t.strides[2];
  switch (t.dtype) {
    case DType::float32: return static_cast<const float*>(t.data)[off];
    case DType::float16: return fp16_to_float(static_cast<const uint16_t*>(t.data)[off]);
    default: return bf16_to_float(static_cast<const uint16_t*>(t.data)[off]);
  }
}

void store_out(const TensorView& t, int64_t i, int64_t h, int64_t c, float x) {
  const int64_t off = i * t.strides[0] + h * t.strides[1] + c * t.strides[2];
  switch (t.dtype) {
    case DType::float32: static_cast<float*>(t.data)[off] = x; break;
    case DType::float16: static_cast<uint16_t*>(t.data)[off] = float_to_fp16(x); break;
    default: static_cast<uint16_t*>(t.data)[off] = float_to_bf16(x); break;
  }
}

struct Task {
  int32_t b;         // index into seq_ids
  int32_t hk;        // kv head
  int64_t k0, k1;    // key positions
  int64_t part;      // offset (in rows) of this task's partial results
};

/// How the fused kernels read one half's packed pages: straight from the format trait (every format has a fused
/// path on CPUs with AVX-512 at head_dim 64 / 128 / 256); fused == false: the codec decodes the tile.
struct HalfPlan {
  bool fused = false;
  kv::KVHalfFormat fmt;
  float mul = 1.0f;           // token_f32 multiplier (e4m3: 2^8)
  std::vector<float> scales;  // head_static: per kv-head multiplier (static fp8 scale, e4m3: × 2^8)
};

HalfPlan plan_half(const kv::KVCodec& codec, int32_t d) {
  HalfPlan p;
  p.fmt = codec.format();
  if (!kv::fused_supported(d)) return p;
  p.fused = true;
  const float mul = p.fmt.code == kv::KVCode::e4m3 ? 256.0f : 1.0f;  // the e4m3 route yields value · 2^-8
  if (p.fmt.scaling == kv::KVScaling::token_f32) p.mul = mul;
  if (p.fmt.scaling == kv::KVScaling::head_static) {
    p.scales = codec.head_scales();
    for (float& x : p.scales) {
      x *= mul;
      if (!std::isfinite(x)) return HalfPlan{false, p.fmt, 1.0f, {}};
    }
  }
  return p;
}

}  // namespace

void PagedKVCache::attention(std::span<const int64_t> seq_ids, std::span<const int32_t> cu_seqlens_q, int32_t layer,
                             const TensorView& q, const TensorView& out, const TensorView* lse,
                             const KVAttentionOptions& options) const {
  const Impl& m = *impl_;
  const int64_t H = m.cfg.num_heads_kv, d = m.cfg.head_dim;
  m.check_layer(layer);
  const int64_t batch = static_cast<int64_t>(seq_ids.size());
  if (static_cast<int64_t>(cu_seqlens_q.size()) != batch + 1) {
    throw Error("cu_seqlens_q", "batch + 1 = " + std::to_string(batch + 1) + " entries",
                std::to_string(cu_seqlens_q.size()));
  }
  core::check_rank_and_layout(q, "q", 3, "[total_q, num_heads, head_dim]");
  if (q.dtype != DType::float32 && q.dtype != DType::float16 && q.dtype != DType::bfloat16) {
    throw TypeError("q.dtype", "float32, float16 or bfloat16", dtype_name(q.dtype));
  }
  if (q.device != Device::cpu) throw TypeError("q.device", "cpu", device_name(q.device));
  const int64_t total_q = q.shape[0], num_heads = q.shape[1];
  core::check_dim(q, "q", 2, d, "head_dim");
  if (num_heads < 1 || num_heads % H != 0) {
    throw Error("q", "num_heads (shape[1]) a positive multiple of num_heads_kv " + std::to_string(H),
                std::to_string(num_heads));
  }
  if (cu_seqlens_q[0] != 0) throw Error("cu_seqlens_q", "cu_seqlens_q[0] == 0", std::to_string(cu_seqlens_q[0]));
  for (int64_t b = 0; b < batch; ++b) {
    if (cu_seqlens_q[b + 1] < cu_seqlens_q[b]) {
      throw Error("cu_seqlens_q", "non-decreasing values", "cu_seqlens_q[" + std::to_string(b + 1) + "] = " +
                  std::to_string(cu_seqlens_q[b + 1]) + " < " + std::to_string(cu_seqlens_q[b]));
    }
    (void)m.seq(seq_ids[b], "seq_ids");
  }
  if (cu_seqlens_q[batch] != total_q) {
    throw Error("cu_seqlens_q", "last entry == q.shape[0] = " + std::to_string(total_q),
                std::to_string(cu_seqlens_q[batch]));
  }
  core::check_rank_and_layout(out, "out", 3, "[total_q, num_heads, head_dim]");
  core::check_dtype(out, "out", q.dtype);
  if (out.device != Device::cpu) throw TypeError("out.device", "cpu", device_name(out.device));
  core::check_dim(out, "out", 0, total_q, "total_q");
  core::check_dim(out, "out", 1, num_heads, "num_heads");
  core::check_dim(out, "out", 2, d, "head_dim");
  if (lse != nullptr) {
    if (lse->ndim != 2) throw Error("lse", "2 dimensions [num_heads, total_q]", lse->describe());
    core::check_dtype(*lse, "lse", DType::float32);
    if (lse->device != Device::cpu) throw TypeError("lse.device", "cpu", device_name(lse->device));
    core::check_dim(*lse, "lse", 0, num_heads, "num_heads");
    core::check_dim(*lse, "lse", 1, total_q, "total_q");
    core::check_data(*lse, "lse");
  }
  core::check_data(q, "q");
  core::check_data(out, "out");
  const float scale = options.softmax_scale.value_or(1.0f / std::sqrt(static_cast<float>(d)));
  if (!std::isfinite(scale) || scale <= 0.0f) {
    throw Error("options.softmax_scale", "finite and > 0", std::to_string(scale));
  }
  if (options.window_size_left < -1) {
    throw Error("options.window_size_left", ">= -1", std::to_string(options.window_size_left));
  }
  if (!std::isfinite(options.softcap) || options.softcap < 0.0f) {
    throw Error("options.softcap", "finite and >= 0", std::to_string(options.softcap));
  }
  if (options.num_splits < 0 || options.num_splits > 1024) {
    throw Error("options.num_splits", "0..1024", std::to_string(options.num_splits));
  }
  if (options.num_threads < 0) throw Error("options.num_threads", ">= 0", std::to_string(options.num_threads));
  if (total_q == 0) return;

  const int64_t g = num_heads / H;
  const int threads = options.num_threads > 0 ? options.num_threads : omp_get_max_threads();

  // ---- tasks --------------------------------------------------------------------------------------------------------
  std::vector<const Impl::Seq*> seqp(static_cast<size_t>(batch));
  std::vector<core::MaskRule> rules(static_cast<size_t>(batch));
  std::vector<Task> tasks;
  std::vector<int64_t> task_begin(static_cast<size_t>(batch * H + 1), 0);  // tasks of (b, hk)
  int64_t part_rows = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const Impl::Seq& s = m.seq(seq_ids[b]);
    seqp[static_cast<size_t>(b)] = &s;
    const int64_t n = s.n[static_cast<size_t>(layer)], nqb = cu_seqlens_q[b + 1] - cu_seqlens_q[b];
    core::MaskRule rule{nqb, n, options.window_size_left, options.causal ? 0 : -1};
    rules[static_cast<size_t>(b)] = rule;
    int64_t lo = 0, hi = 0;
    rule.block_key_range(0, nqb, &lo, &hi);
    const int64_t len = std::max<int64_t>(hi - lo, 0);
    int64_t ns = options.num_splits;
    if (ns == 0) {
      const int64_t want = (2 * threads + batch * H - 1) / (batch * H);
      ns = std::min<int64_t>(want, len / 512);
    }
    ns = std::max<int64_t>(1, std::min<int64_t>(ns, (len + 15) / 16));
    const int64_t chunk = ((len + ns - 1) / ns + 15) / 16 * 16;
    for (int64_t hk = 0; hk < H; ++hk) {
      task_begin[static_cast<size_t>(b * H + hk)] = static_cast<int64_t>(tasks.size());
      if (nqb == 0) continue;
      int64_t k0 = lo;
      do {
        const int64_t k1 = std::min(hi, k0 + chunk);
        tasks.push_back(Task{static_cast<int32_t>(b), static_cast<int32_t>(hk), k0, std::max(k0, k1), part_rows});
        part_rows += g * nqb;
        k0 = k1;
      } while (k0 < hi);
    }
  }
  task_begin[static_cast<size_t>(batch * H)] = static_cast<int64_t>(tasks.size());
  std::vector<float> part_acc(static_cast<size_t>(part_rows * d));
  std::vector<float> part_m(static_cast<size_t>(part_rows)), part_l(static_cast<size_t>(part_rows));

  // ---- per-task online softmax over tiles ---------------------------------------------------------------------------
  // Tiles of the quantized stream go to the fused kernels in place when the format allows (plan_half), the bf16 sink /
  // residual window likewise; anything else is decoded by the codec into a factored float tile first.
  const HalfPlan plans[2] = {plan_half(*m.kcodec, static_cast<int32_t>(d)), plan_half(*m.vcodec, static_cast<int32_t>(d))};
  const bool fused_window = kv::fused_supported(static_cast<int32_t>(d));
  auto half_tile = [&](const Impl::Seq& s, int32_t hk, int half, int64_t t0, int64_t t1, kv::FactoredTile& ft) {
    kv::HalfTile h;
    const int64_t S = m.cfg.sink_tokens, nq = s.nq[static_cast<size_t>(layer)];
    const HalfPlan& plan = plans[half];
    if (t0 >= S && t0 < S + nq) {
      if (plan.fused) {
        const kv::KVHalfFormat& f = plan.fmt;
        const int64_t i = t0 - S;
        const int32_t page = s.pages[static_cast<size_t>(i / m.cfg.page_size)];
        const int32_t slot = static_cast<int32_t>(i % m.cfg.page_size);
        const uint8_t* meta = m.meta_ptr(page, layer, half, hk);
        h.packed = true;
        h.code = f.code;
        h.scaling = f.scaling;
        h.rb = f.code_bytes;
        h.codes = m.code_ptr(page, layer, half, hk) + slot * h.rb;
        h.mul = plan.mul;
        h.ng = f.groups_per_token();
        h.group = f.scaling == kv::KVScaling::token_affine ? f.group : static_cast<int32_t>(d);
        switch (f.scaling) {
          case kv::KVScaling::head_static: h.mul = plan.scales[static_cast<size_t>(hk)]; break;
          case kv::KVScaling::token_f32:
          case kv::KVScaling::token_affine: h.meta = meta + f.meta_offset(slot); break;
          case kv::KVScaling::channel_affine:
            h.meta = meta;
            h.kivi_g = f.tokens_per_unit;
            h.slot0 = slot;
            h.kivi_meta_bytes = f.meta_bytes_per_unit;
            break;
          case kv::KVScaling::none: break;
        }
        return h;
      }
    } else if (fused_window) {  // bf16 window rows: contiguous slots (for_each_tile splits at the ring's wrap)
      h.packed = true;
      h.code = kv::KVCode::bf16;
      h.rb = 2 * d;
      h.codes = reinterpret_cast<const uint8_t*>(m.win_ptr(s, layer, half, hk) + m.win_slot(t0) * d);
      return h;
    }
    m.decode_range_factored(s, layer, half, hk, t0, t1, ft);
    h.dec = &ft;
    return h;
  };
  const float softcap = options.softcap;
  const int64_t ntasks = static_cast<int64_t>(tasks.size());
#pragma omp parallel num_threads(threads)
  {
    // K and V tiles in factored form for the generic path: raw [kTile][d], alpha / beta [groups][n], cs / cz
    // [kTile / 16][d]
    std::vector<float> kbuf(static_cast<size_t>(kTile * d * 3 + 2 * (kTile / 16) * d)), vbuf(kbuf.size());
    auto tile_of = [&](std::vector<float>& b) {
      kv::FactoredTile t;
      t.raw = b.data();
      t.alpha = t.raw + kTile * d;
      t.beta = t.alpha + kTile * d;
      t.cs = t.beta + kTile * d;
      t.cz = t.cs + (kTile / 16) * d;
      return t;
    };
    kv::FactoredTile kft = tile_of(kbuf), vft = tile_of(vbuf);
    kv::TileScratch scr(g, d);
    std::vector<float> qrow, qsum;
#pragma omp for schedule(dynamic, 1)
    for (int64_t ti = 0; ti < ntasks; ++ti) {
      const Task& T = tasks[static_cast<size_t>(ti)];
      const Impl::Seq& s = *seqp[static_cast<size_t>(T.b)];
      const core::MaskRule& rule = rules[static_cast<size_t>(T.b)];
      const int64_t nqb = rule.seqlen_q, q_off = cu_seqlens_q[T.b];
      const int64_t rows = g * nqb;
      qrow.resize(static_cast<size_t>(rows * d));
      for (int64_t qi = 0; qi < nqb; ++qi) {
        for (int64_t hh = 0; hh < g; ++hh) {
          float* qr = qrow.data() + (qi * g + hh) * d;
          for (int64_t c = 0; c < d; ++c) qr[c] = load_q(q, q_off + qi, T.hk * g + hh, c);
          if (m.rot_k) hadamard_rotate(qr, static_cast<int32_t>(d), m.rot_signs.data(), false);
          for (int64_t c = 0; c < d; ++c) qr[c] *= scale;
        }
      }
      qsum.resize(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        float sum = 0.0f;
        for (int64_t c = 0; c < d; ++c) sum += qrow[static_cast<size_t>(r * d + c)];
        qsum[static_cast<size_t>(r)] = sum;
      }
      float* acc = part_acc.data() + T.part * d;
      float* mm = part_m.data() + T.part;
      float* ll = part_l.data() + T.part;
      std::fill(acc, acc + rows * d, 0.0f);
      std::fill(mm, mm + rows, -std::numeric_limits<float>::infinity());
      std::fill(ll, ll + rows, 0.0f);
      m.for_each_tile(s, layer, T.k0, T.k1, kTile, [&](int64_t t0, int64_t t1) {
        // rows of this tile's visible band
        int64_t qa = 0, qb = 0;
        rule.block_query_range(t0, t1, &qa, &qb);
        if (qb <= qa) return;
        const kv::HalfTile kt = half_tile(s, T.hk, 0, t0, t1, kft);
        const kv::HalfTile vt = half_tile(s, T.hk, 1, t0, t1, vft);
        kv::tile_update(rule, qa, qb, g, d, t0, t1, qrow.data(), qsum.data(), kt, vt, softcap, acc, mm, ll, scr);
      });
    }
  }

  // ---- merge splits, normalize, rotate back, store -----------------------------------------------------------------
  const int64_t nbh = batch * H;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t bh = 0; bh < nbh; ++bh) {
    const int64_t b = bh / H, hk = bh % H;
    const int64_t t_begin = task_begin[static_cast<size_t>(bh)], t_end = task_begin[static_cast<size_t>(bh + 1)];
    const int64_t nqb = cu_seqlens_q[b + 1] - cu_seqlens_q[b];
    std::vector<float> o(static_cast<size_t>(d));
    for (int64_t r = 0; r < g * nqb; ++r) {
      float M = -std::numeric_limits<float>::infinity();
      for (int64_t t = t_begin; t < t_end; ++t) M = std::max(M, part_m[static_cast<size_t>(tasks[t].part + r)]);
      float L = 0.0f;
      std::fill(o.begin(), o.end(), 0.0f);
      if (M != -std::numeric_limits<float>::infinity()) {
        for (int64_t t = t_begin; t < t_end; ++t) {
          const int64_t pr = tasks[static_cast<size_t>(t)].part + r;
          if (part_m[static_cast<size_t>(pr)] == -std::numeric_limits<float>::infinity()) continue;
          const float w = std::exp(part_m[static_cast<size_t>(pr)] - M);
          L += part_l[static_cast<size_t>(pr)] * w;
          const float* a = part_acc.data() + pr * d;
          for (int64_t c = 0; c < d; ++c) o[static_cast<size_t>(c)] += w * a[c];
        }
      }
      const int64_t qi = r / g, hq = hk * g + r % g;
      if (L > 0.0f) {
        const float inv = 1.0f / L;
        for (int64_t c = 0; c < d; ++c) o[static_cast<size_t>(c)] *= inv;
        if (m.rot_v) hadamard_rotate(o.data(), static_cast<int32_t>(d), m.rot_signs.data(), true);
      }
      const int64_t tq = cu_seqlens_q[b] + qi;
      for (int64_t c = 0; c < d; ++c) store_out(out, tq, hq, c, o[static_cast<size_t>(c)]);
      if (lse != nullptr) {
        const float lv = L > 0.0f ? M + std::log(L) : -std::numeric_limits<float>::infinity();
        static_cast<float*>(lse->data)[hq * lse->strides[0] + tq * lse->strides[1]] = lv;
      }
    }
  }
}

}  // namespace flashkv
