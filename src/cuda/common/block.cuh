// Block info of one CTA: which (batch, head) and which rows it owns, the sequence bounds (varlen) and the range of the
// other operand's blocks it must visit (FA3's BlockMN / SeqlenInfo), for the forward (a query block walking K/V
// blocks) and the backward (a key block walking query blocks). Shared by both kernel families.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/mask.hpp"
#include "cuda/common/seqlen.cuh"
#include "cuda/params.hpp"

namespace flashkv::cuda::attn {

/// Grid coordinate handed out by a tile scheduler (common/scheduler.cuh).
struct TileCoord {
  int block;  ///< query block (forward) or key block (backward)
  int h;      ///< query head
  int b;      ///< batch entry
};

/// A forward CTA: query rows [m0, m0 + rows_q) of (b, h), reading kv head hk; visible K/V blocks [n_min, n_max).
struct FwdBlock {
  SeqInfo si;
  core::MaskRule rule;
  int m0, rows_q, h, hk, b, n_min, n_max;

  /// Sequence bounds and rows; valid() is false for a block past this sequence's end (the CTA returns).
  template <int kBlockM>
  __device__ __forceinline__ static FwdBlock make(const FwdParams& p, TileCoord c) {
    FwdBlock k;
    k.h = c.h, k.b = c.b;
    k.si = seq_info(p, c.b);
    k.m0 = c.block * kBlockM;
    return k;
  }
  __device__ __forceinline__ bool valid() const { return m0 < si.seqlen_q; }
  /// The rest, once the block is known to be valid.
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ void set_key_range(const FwdParams& p) {
    rows_q = min(kBlockM, si.seqlen_q - m0);
    hk = h / (p.num_heads / p.num_heads_kv);
    rule = core::MaskRule{si.seqlen_q, si.seqlen_k, p.window_left, p.window_right};
    int64_t key_first, key_last;
    rule.block_key_range(m0, m0 + rows_q, &key_first, &key_last);
    n_min = static_cast<int>(key_first / kBlockN);
    n_max = key_last > key_first ? static_cast<int>((key_last + kBlockN - 1) / kBlockN) : n_min;
  }
  /// True when row i (in the sequence) sees no key under the mask rule.
  __device__ __forceinline__ bool row_empty(int i) const { return rule.row_first(i) >= rule.row_last(i); }
  /// True when K/V block n is a boundary tile (diagonal, window edge or past seqlen_k): element masks needed.
  template <int kBlockN>
  __device__ __forceinline__ bool needs_mask(int n) const {
    const int n0 = n * kBlockN;
    return n0 + kBlockN > si.seqlen_k || !rule.tile_fully_visible(m0, m0 + rows_q, n0, n0 + kBlockN);
  }
  /// Calls step(n, std::true_type / std::false_type) for the visible K/V blocks from the last to the first: the
  /// boundary tiles at the top (diagonal / past seqlen_k) with masks, then the fully visible ones without, then
  /// (sliding window) the masked ones at the left edge (FA2's split of masked and unmasked iterations).
  template <int kBlockN, class Step>
  __device__ __forceinline__ void for_each_kv_block(Step&& step) const {
    for (int n = n_max - 1; n >= n_min; --n) {
      if (needs_mask<kBlockN>(n)) {
        step(n, std::true_type{});
      } else {
        step(n, std::false_type{});
      }
    }
  }
  template <class T>
  __device__ __forceinline__ const T* q(const FwdParams& p) const {
    return static_cast<const T*>(p.q) + b * p.q_s.batch + (si.q_row0 + m0) * p.q_s.row + h * p.q_s.head;
  }
  template <class T>
  __device__ __forceinline__ const T* k(const FwdParams& p) const {
    return static_cast<const T*>(p.k) + b * p.k_s.batch + si.k_row0 * p.k_s.row + hk * p.k_s.head;
  }
  template <class T>
  __device__ __forceinline__ const T* v(const FwdParams& p) const {
    return static_cast<const T*>(p.v) + b * p.v_s.batch + si.k_row0 * p.v_s.row + hk * p.v_s.head;
  }
  template <class T>
  __device__ __forceinline__ T* out(const FwdParams& p) const {
    return static_cast<T*>(p.out) + b * p.out_s.batch + (si.q_row0 + m0) * p.out_s.row + h * p.out_s.head;
  }
};

/// A backward CTA: keys [n0, n0 + rows_k) of kv head hk for query head h of batch b; query blocks [m_min, m_max).
struct BwdBlock {
  SeqInfo si;
  core::MaskRule rule;
  int n_block, n0, rows_k, h, hk, b, m_min, m_max;

  template <int kBlockN>
  __device__ __forceinline__ static BwdBlock make(const FwdParams& p, TileCoord c) {
    BwdBlock k;
    k.n_block = c.block, k.h = c.h, k.b = c.b;
    k.si = seq_info(p, c.b);
    k.n0 = c.block * kBlockN;
    return k;
  }
  __device__ __forceinline__ bool valid() const { return n0 < si.seqlen_k; }
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ void set_query_range(const FwdParams& p) {
    rows_k = min(kBlockN, si.seqlen_k - n0);
    hk = h / (p.num_heads / p.num_heads_kv);
    rule = core::MaskRule{si.seqlen_q, si.seqlen_k, p.window_left, p.window_right};
    int64_t q_first, q_last;
    rule.block_query_range(n0, n0 + rows_k, &q_first, &q_last);
    m_min = static_cast<int>(q_first / kBlockM);
    m_max = q_last > q_first ? static_cast<int>((q_last + kBlockM - 1) / kBlockM) : m_min;
  }
  /// True when the (query block m, this key block) tile needs element masks: it crosses seqlen_q/seqlen_k or the
  /// causal/window boundary. The fully visible blocks in between carry no mask code.
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ bool needs_mask(int m) const {
    const int m0 = m * kBlockM;
    return n0 + kBlockN > si.seqlen_k || m0 + kBlockM > si.seqlen_q ||
           !rule.tile_fully_visible(m0, m0 + kBlockM, n0, n0 + kBlockN);
  }
  /// Calls step(m, std::true_type / std::false_type) for the query blocks that see this key block, in order.
  template <int kBlockM, int kBlockN, class Step>
  __device__ __forceinline__ void for_each_q_block(Step&& step) const {
    for (int m = m_min; m < m_max; ++m) {
      if (needs_mask<kBlockM, kBlockN>(m)) {
        step(m, std::true_type{});
      } else {
        step(m, std::false_type{});
      }
    }
  }
};

}  // namespace flashkv::cuda::attn
