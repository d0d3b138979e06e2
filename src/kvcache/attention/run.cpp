// CPU decode run (cpu_decode.hpp): (0) tensor-API appends, (1) every query row prepared once per (sequence, kv head)
// — loaded, rotated (Hadamard keys), scaled, summed — (2) every task walks its key range in page / window tiles
// through kv::tile_update, (3) the splits of every row are merged with the one lse-merge formula (core/merge.hpp),
// normalized, rotated back (Hadamard values) and stored with the row's lse.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/float16.hpp"
#include "core/merge.hpp"
#include "kvcache/attention/cpu_decode_impl.hpp"
#include "kvcache/attention/decode_tile.hpp"

namespace flashkv {
void hadamard_rotate(float* x, int32_t n, const float* signs, bool inverse);  // kvcache/cache/paged_cache.cpp
}

namespace flashkv::kv {
namespace {

constexpr int64_t kTile = kCpuDecodeTile;
static_assert(kCpuDecodeTile == kDecodeTile, "one tile size");

float load(const void* base, DType t, int64_t off) {
  switch (t) {
    case DType::float32: return static_cast<const float*>(base)[off];
    case DType::float16: return fp16_to_float(static_cast<const uint16_t*>(base)[off]);
    default: return bf16_to_float(static_cast<const uint16_t*>(base)[off]);
  }
}

void store(void* base, DType t, int64_t off, float x) {
  switch (t) {
    case DType::float32: static_cast<float*>(base)[off] = x; break;
    case DType::float16: static_cast<uint16_t*>(base)[off] = float_to_fp16(x); break;
    default: static_cast<uint16_t*>(base)[off] = float_to_bf16(x); break;
  }
}

/// (page, slot) of stream slot i of sequence b: the page table, or a contiguous per-sequence cache (page = b).
struct Locator {
  const core::DecodeKV& kv;
  int64_t b;
  void operator()(int64_t i, int64_t* page, int32_t* slot) const {
    if (kv.page_table == nullptr) {
      *page = b;
      *slot = static_cast<int32_t>(i);
    } else {
      *page = kv.page_table[b * kv.page_table_stride + i / kv.page_size];
      *slot = static_cast<int32_t>(i % kv.page_size);
    }
  }
};

}  // namespace

void CpuDecodeWork::run(const core::DecodeProblem& p) {
  if (p.k_new != nullptr) append_new_rows(p);
  if (p.total_q == 0) return;
  prepare_queries(p);
  run_tasks(p);
  merge_and_store(p);
}

// ---- 0. tensor API: append k_new / v_new at positions seqlens[b] + i (16-bit rows, the cache's dtype) --------------
void CpuDecodeWork::append_new_rows(const core::DecodeProblem& p) {
  const core::DecodeKV& kv = p.kv;
  const int64_t H = num_heads_kv_, d = d_, B = batch_;
  {
    const int64_t esize = p.dtype == DType::float32 ? 4 : 2;
    for (int64_t b = 0; b < B; ++b) {
      const Locator loc{kv, b};
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        int64_t page;
        int32_t slot;
        loc(kv.seqlens[b] + i, &page, &slot);
        for (int half = 0; half < 2; ++half) {
          const uint8_t* src = static_cast<const uint8_t*>(half == 0 ? p.k_new : p.v_new);
          const core::Strides3& st = half == 0 ? p.k_new_strides : p.v_new_strides;
          for (int64_t h = 0; h < H; ++h) {
            uint8_t* dst = const_cast<uint8_t*>(kv.pages[half].row(page, static_cast<int32_t>(h), slot));
            std::memcpy(dst, src + (b * st.batch + i * st.row + h * st.head) * esize, static_cast<size_t>(d * esize));
          }
        }
      }
    }
  }
}

// ---- 1. queries: loaded, rotated, scaled and summed once per (sequence, kv head) -------------------------------------
void CpuDecodeWork::prepare_queries(const core::DecodeProblem& p) {
  const core::DecodeKV& kv = p.kv;
  const int64_t H = num_heads_kv_, g = g_, d = d_, B = batch_;
  const int32_t di = static_cast<int32_t>(d);
  const float scale = p.softmax_scale;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_) if (small_work_ == false)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, hk = bh % H;
    const int64_t nqb = rules_[static_cast<size_t>(b)].seqlen_q;
    for (int64_t qi = 0; qi < nqb; ++qi) {
      for (int64_t hh = 0; hh < g; ++hh) {
        const int64_t r = bh_row0_[static_cast<size_t>(bh)] + qi * g + hh;
        float* qr = qprep_.data() + r * d;
        const int64_t off = b * p.q_strides.batch + (q_begin_[static_cast<size_t>(b)] + qi) * p.q_strides.row +
                            (hk * g + hh) * p.q_strides.head;
        for (int64_t c = 0; c < d; ++c) qr[c] = load(p.q, p.dtype, off + c);
        if (kv.rot_k) hadamard_rotate(qr, di, kv.rot_signs, false);
        float sum = 0.0f;
        for (int64_t c = 0; c < d; ++c) {
          qr[c] *= scale;
          sum += qr[c];
        }
        qsum_[static_cast<size_t>(r)] = sum;
      }
    }
  }

}

// ---- the K or V half of one tile: packed (fused kernels) or decoded by the codec -----------------------------------
HalfTile CpuDecodeWork::half_tile(const core::DecodeProblem& p, int64_t b, int32_t hk, int half, int64_t n, int64_t t0,
                                  int64_t t1, FactoredTile& ft) const {
  const core::DecodeKV& kv = p.kv;
  const int64_t d = d_;
  const int32_t di = static_cast<int32_t>(d);

    HalfTile h;
    const int64_t S = kv.regions.sink_tokens, nq = kv.regions.quant_count(n);
    const CpuHalfPlan& plan = half_[half];
    const HalfPages& hp = kv.pages[half];
    const KVHalfFormat& f = plan.fmt;
    if (t0 >= S && t0 < S + nq) {
      int64_t page;
      int32_t slot;
      Locator{kv, b}(t0 - S, &page, &slot);
      if (plan.fused) {
        const uint8_t* meta = f.meta_bytes_per_unit > 0 ? hp.page_head_meta(page, hk) : nullptr;
        h.packed = true;
        h.code = f.code;
        h.scaling = f.scaling;
        h.rb = hp.slot_stride;
        h.codes = hp.row(page, hk, slot);
        h.mul = plan.mul;
        h.ng = f.groups_per_token();
        h.group = f.scaling == KVScaling::token_affine ? f.group : di;
        switch (f.scaling) {
          case KVScaling::head_static: h.mul = plan.scales[static_cast<size_t>(hk)]; break;
          case KVScaling::token_f32:
          case KVScaling::token_affine: h.meta = meta + f.meta_offset(slot); break;
          case KVScaling::channel_affine:
            h.meta = meta;
            h.kivi_g = f.tokens_per_unit;
            h.slot0 = slot;
            h.kivi_meta_bytes = f.meta_bytes_per_unit;
            break;
          default: break;
        }
        return h;
      }
      const KVCodec& codec = *codec_[half];
      const uint8_t* meta = f.meta_bytes_per_unit > 0 ? hp.page_head_meta(page, hk) : nullptr;
      if (hp.rows_contiguous(f.code_bytes)) {
        codec.decode_factored(hk, hp.page_head(page, hk), meta, slot, static_cast<int32_t>(t1 - t0), ft);
      } else {  // strided rows (16-bit cache tensors: no metadata): row by row
        ft.group = 0;
        ft.per_channel = false;
        for (int64_t t = t0; t < t1; ++t) {
          codec.decode(hk, hp.row(page, hk, static_cast<int32_t>(slot + (t - t0))), nullptr, 0, 1, ft.raw + (t - t0) * d);
        }
      }
      h.dec = &ft;
      return h;
    }
    const uint16_t* w = kv.window_bases[b] + kv.window.offset(kv.layer, half, hk, kv.regions.win_slot(t0));
    if (fused_window_) {  // bf16 window rows: contiguous slots (the tiles split at the ring's wrap)
      h.packed = true;
      h.code = KVCode::bf16;
      h.rb = 2 * d;
      h.codes = reinterpret_cast<const uint8_t*>(w);
      return h;
    }
    ft.group = 0;
    ft.per_channel = false;
    for (int64_t i = 0; i < (t1 - t0) * d; ++i) ft.raw[i] = bf16_to_float(w[i]);
    h.dec = &ft;
    return h;
  }

// ---- 2. tasks: online softmax over tiles -------------------------------------------------------------------------------
void CpuDecodeWork::run_tasks(const core::DecodeProblem& p) {
  const core::DecodeKV& kv = p.kv;
  const int64_t H = num_heads_kv_, g = g_, d = d_;
  const float softcap = p.softcap;
  const int64_t ntasks = static_cast<int64_t>(tasks_.size());
#pragma omp parallel num_threads(threads_)
  {
    // K and V tiles in factored form for the generic path: raw [kTile][d], alpha / beta [groups][n], cs / cz
    // [kTile / 16][d]
    std::vector<float> kbuf(static_cast<size_t>(kTile * d * 3 + 2 * (kTile / 16) * d)), vbuf(kbuf.size());
    auto tile_of = [&](std::vector<float>& buf) {
      FactoredTile t;
      t.raw = buf.data();
      t.alpha = t.raw + kTile * d;
      t.beta = t.alpha + kTile * d;
      t.cs = t.beta + kTile * d;
      t.cz = t.cs + (kTile / 16) * d;
      return t;
    };
    FactoredTile kft = tile_of(kbuf), vft = tile_of(vbuf);
    TileScratch scr(g, d);
#pragma omp for schedule(dynamic, 1)
    for (int64_t ti = 0; ti < ntasks; ++ti) {
      const CpuDecodeTask& T = tasks_[static_cast<size_t>(ti)];
      const core::MaskRule& rule = rules_[static_cast<size_t>(T.b)];
      const int64_t rows = g * rule.seqlen_q;
      const int64_t r0 = bh_row0_[static_cast<size_t>(T.b * H + T.hk)];
      float* acc = part_acc_.data() + T.part * d;
      float* mm = part_m_.data() + T.part;
      float* ll = part_l_.data() + T.part;
      std::fill(acc, acc + rows * d, 0.0f);
      std::fill(mm, mm + rows, -std::numeric_limits<float>::infinity());
      std::fill(ll, ll + rows, 0.0f);
      kv.regions.for_each_tile(rule.seqlen_k, kv.page_table == nullptr ? 0 : kv.page_size, T.k0, T.k1, kTile,
                               [&](int64_t t0, int64_t t1) {
        int64_t qa = 0, qb = 0;  // rows of this tile's visible band
        rule.block_query_range(t0, t1, &qa, &qb);
        if (qb <= qa) return;
        const HalfTile kt = half_tile(p, T.b, T.hk, 0, rule.seqlen_k, t0, t1, kft);
        const HalfTile vt = half_tile(p, T.b, T.hk, 1, rule.seqlen_k, t0, t1, vft);
        tile_update(rule, qa, qb, g, d, t0, t1, qprep_.data() + r0 * d, qsum_.data() + r0, kt, vt, softcap, acc, mm,
                    ll, scr);
      });
    }
  }

}

// ---- 3. merge splits (core/merge.hpp), normalize, rotate back, store ------------------------------------------------
void CpuDecodeWork::merge_and_store(const core::DecodeProblem& p) {
  const core::DecodeKV& kv = p.kv;
  const int64_t H = num_heads_kv_, g = g_, d = d_, B = batch_;
  const int32_t di = static_cast<int32_t>(d);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_) if (small_work_ == false)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, hk = bh % H;
    const core::MaskRule& rule = rules_[static_cast<size_t>(b)];
    const int64_t t_begin = task_begin_[static_cast<size_t>(bh)], t_end = task_begin_[static_cast<size_t>(bh + 1)];
    std::vector<float> o(static_cast<size_t>(d));
    for (int64_t r = 0; r < g * rule.seqlen_q; ++r) {
      const int64_t qi = r / g, hq = hk * g + r % g;
      float M = -std::numeric_limits<float>::infinity();
      for (int64_t t = t_begin; t < t_end; ++t) M = core::merge_max(M, part_m_[static_cast<size_t>(tasks_[t].part + r)]);
      float L = 0.0f;
      std::fill(o.begin(), o.end(), 0.0f);
      for (int64_t t = t_begin; t < t_end; ++t) {
        const int64_t pr = tasks_[static_cast<size_t>(t)].part + r;
        const float w = core::merge_weight(part_m_[static_cast<size_t>(pr)], M);
        L = core::merge_accumulate(L, w, part_l_[static_cast<size_t>(pr)]);
        const float* a = part_acc_.data() + pr * d;
        for (int64_t c = 0; c < d; ++c) o[static_cast<size_t>(c)] = core::merge_accumulate(o[static_cast<size_t>(c)], w, a[c]);
      }
      const bool has_keys = rule.row_last(qi) > rule.row_first(qi);
      const float inv = core::merged_inv_sum(L, has_keys);
      if (inv != 0.0f) {
        for (int64_t c = 0; c < d; ++c) o[static_cast<size_t>(c)] *= inv;
        if (kv.rot_v) hadamard_rotate(o.data(), di, kv.rot_signs, true);
      }
      const int64_t row = q_begin_[static_cast<size_t>(b)] + qi;
      const int64_t off = b * p.out_strides.batch + row * p.out_strides.row + hq * p.out_strides.head;
      for (int64_t c = 0; c < d; ++c) store(p.out, p.dtype, off + c, o[static_cast<size_t>(c)]);
      if (p.lse != nullptr) {
        p.lse[b * p.lse_strides.batch + hq * p.lse_strides.head + row * p.lse_strides.row] =
            core::merged_lse(M, L, has_keys);
      }
    }
  }
}

}  // namespace flashkv::kv
