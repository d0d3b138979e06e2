// DecodeProblem: one validated attention-over-a-paged-KV-cache call (decode, chunked prefill, speculative), reduced to
// sizes, pointers and the KV description, independent of the device. Produced by core::make_decode_problem (the
// flash-attn style tensor API, flashkv::paged_decode) or from a PagedKVCache (flashkv::plan_decode / run_decode,
// src/kvcache/api/decode.cpp); run by the CPU KV attention (src/kvcache/attention/) or a device backend's decode hook
// (core::DecodeBackend, src/core/backend.hpp; CUDA: src/cuda/decode_cuda.cpp).
//
// Conventions (as core::AttentionProblem): strides in ELEMENTS (int64) for q / out / k_new / v_new, BYTES for the KV
// pages (kv::HalfPages); the last dimension is contiguous. Row (b, i, h) of q lives at q + b·q_strides.batch +
// (q_begin(b) + i)·q_strides.row + h·q_strides.head, q_begin(b) = cu_seqlens_q[b] when is_varlen else 0; lse element
// (b, h, i) at lse + b·lse_strides.batch + h·lse_strides.head + (q_begin(b) + i)·lse_strides.row (natural log).
// Query i of the n_q_b queries of sequence b sits at position seqlen_k_b − n_q_b + i (bottom-right alignment); with
// causal it sees keys j <= that position, with window_size_left = W only j >= position − W (core::MaskRule with
// seqlen_q = n_q_b, seqlen_k = seqlen_k_b).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/problem.hpp"
#include "flashkv/types.hpp"
#include "kvcache/format/traits.hpp"
#include "kvcache/page_layout.hpp"

namespace flashkv::core {

/// Where the keys and values of the batch are: pages (any device, kv::HalfPages per half of the selected layer),
/// their format (kv::KVHalfFormat per half), page table, lengths, windows and rotation.
struct DecodeKV {
  Device device = Device::cpu;  ///< where pages, page_table and seqlens live
  int32_t device_index = 0;
  int32_t page_size = 16;           ///< tokens per page (power of two, 16..256)
  kv::HalfPages pages[2];           ///< K, V of the selected layer
  kv::KVHalfFormat format[2];       ///< K, V
  const float* head_scales[2] = {nullptr, nullptr};  ///< host: static fp8 scale per kv-head (head_static), else nullptr
  /// The same scales already on `device` ([num_heads_kv] float32; a device PagedKVCache keeps a copy), or nullptr: the
  /// device side then uploads head_scales itself (an allocation and a copy: not capturable in a CUDA graph).
  const float* device_head_scales[2] = {nullptr, nullptr};
  kv::TokenRegions regions;         ///< sinks / quantized stream / residual ring (all zero: every token paged)
  /// Windows only: per sequence the base of its bf16 window buffer on `device` (kv::WindowGeometry; layer, half and
  /// head applied through `window`), a [batch] array in host memory; nullptr when regions.has_window() is false.
  const uint16_t* const* window_bases = nullptr;
  kv::WindowGeometry window;
  int32_t layer = 0;                ///< layer of `pages` / the window buffers
  /// Hadamard rotation of the quantized halves (host: ±1 diagonal [head_dim]); q is rotated when rot_k, the output
  /// rotated back when rot_v.
  const float* rot_signs = nullptr;
  bool rot_k = false, rot_v = false;

  /// [batch, max_pages] int32 on `device` (row stride page_table_stride); nullptr = contiguous per-sequence caches:
  /// page id of sequence b's j-th block is b (page_stride is then the sequence stride and page_size the capacity).
  const int32_t* page_table = nullptr;
  /// The page table in host memory when the caller has it (PagedKVCache plans: [batch, max_pages], row stride
  /// page_table_stride); a device plan uploads it when page_table is nullptr.
  const int32_t* host_page_table = nullptr;
  int64_t page_table_stride = 0;
  int64_t max_pages = 0;
  int64_t capacity = 0;             ///< tokens one sequence can hold (max_pages · page_size, or the contiguous length)
  /// Keys of sequence b = seqlens[b] + seqlen_add (seqlens int32 [batch] on `device`; seqlen_add = the appended
  /// tokens of the tensor API, 0 for a PagedKVCache).
  const int32_t* seqlens = nullptr;
  int64_t seqlen_add = 0;
  /// The same key counts on the host when known (always for CPU problems and PagedKVCache plans; for CUDA tensor
  /// problems after the capacity check read them back); nullptr otherwise.
  const int64_t* host_seqlens_k = nullptr;
  const char* format_name[2] = {"", ""};  ///< K, V kv_cache_dtype names (for the recorded kernel path)
  /// A PagedKVCache problem (its own formats, packed pages allowed), as opposed to flash-attn style cache tensors. With
  /// host_seqlens_k == nullptr it is a step over device tables (kvcache/api/cache_step.hpp): seqlens / page_table /
  /// cu_seqlens_q already on the device, DecodeProblem::max_seqlen_k the host's bound of the key counts, nothing read
  /// back.
  bool paged_cache = false;
  /// Tensor API with options.max_seqlen_k > 0: the caller's promise seqlens[b] <= max_seqlen_k, checked on the device
  /// (a broken promise gives NaN out / lse for that sequence and no append). 0 = lengths checked on the host.
  int64_t promised_max_seqlen = 0;
};

struct DecodeProblem {
  // ---- sizes ------------------------------------------------------------------------------------------------------
  int64_t batch = 0;
  int64_t num_heads = 0;
  int64_t num_heads_kv = 0;
  int64_t head_dim = 0;
  bool is_varlen = false;    ///< q [total_q, H, d] with cu_seqlens_q (PagedKVCache API), else q [batch, seqlen_q, H, d]
  int64_t seqlen_q = 0;      ///< fixed-length queries per sequence
  int64_t max_seqlen_q = 0;
  int64_t total_q = 0;
  const int32_t* host_cu_seqlens_q = nullptr;  ///< varlen: [batch + 1] on the host
  const int32_t* cu_seqlens_q = nullptr;       ///< varlen: [batch + 1] on kv.device (set by a device plan)
  int64_t max_seqlen_k = 0;  ///< upper bound of the key counts (host; from host_seqlens_k or the promise or capacity)

  // ---- queries and outputs ----------------------------------------------------------------------------------------
  DType dtype = DType::float32;  ///< of q and out (and k_new / v_new)
  Device device = Device::cpu;
  int32_t device_index = 0;
  const void* q = nullptr;
  void* out = nullptr;
  float* lse = nullptr;  ///< optional
  Strides3 q_strides, out_strides;
  LseStrides lse_strides;

  DecodeKV kv;

  // ---- append (tensor API): k_new / v_new [batch, seqlen_new, Hk, d] written at positions seqlens[b] + i first ----
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  Strides3 k_new_strides, v_new_strides;

  // ---- semantics and execution -------------------------------------------------------------------------------------
  float softmax_scale = 1.0f;     ///< resolved
  bool causal = true;
  int32_t window_size_left = -1;
  float softcap = 0.0f;
  int32_t num_splits = 0;         ///< requested (0 = heuristic)
  int32_t num_threads = 0;        ///< CPU (0 = OpenMP default)
  void* stream = nullptr;         ///< CUDA stream

  int64_t group_size() const { return num_heads / num_heads_kv; }
  int64_t q_begin(int64_t b) const { return is_varlen ? host_cu_seqlens_q[b] : 0; }
  int64_t seqlen_q_of(int64_t b) const {
    return is_varlen ? host_cu_seqlens_q[b + 1] - host_cu_seqlens_q[b] : seqlen_q;
  }
  int64_t seqlen_k_of(int64_t b) const { return kv.host_seqlens_k[b]; }  ///< needs host_seqlens_k
};

/// The work partition of one batch shape, computed once by a backend's plan and run for every layer with that shape
/// (FlashInfer's plan/run). run() takes the problem of one layer (same shape as the planned one: the caller checks).
class DecodeWork {
 public:
  virtual ~DecodeWork() = default;
  virtual void run(const DecodeProblem& problem) = 0;
  /// The kernel path, as recorded by core::record_path ("kv_decode cpu fused-avx512 ...", "kv_decode cuda split-kv
  /// ...").
  virtual std::string path() const = 0;
  /// Split-KV chunks per (sequence, kv head) (the largest, for the CPU where it varies by sequence).
  virtual int32_t num_splits() const = 0;
};

}  // namespace flashkv::core
