// CUDA backend entry points: AttentionProblem -> kernel parameters, layout normalization (padding), dispatch to the
// compiled instantiation, and registration in the core::DeviceBackend table.
#include "cuda/attention_cuda.hpp"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "core/backend.hpp"
#include "core/path_log.hpp"
#include "core/scaling.hpp"
#include "cuda/check.hpp"
#include "cuda/common/tile_size.hpp"
#include "cuda/kernels.hpp"
#include "cuda/util.hpp"
#include "flashkv/error.hpp"

namespace flashkv::cuda {
namespace {

TensorStrides strides_of(const core::Strides3& s) { return TensorStrides{s.batch, s.row, s.head}; }

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
bool strides_ok(const core::Strides3& s) { return s.batch % 8 == 0 && s.row % 8 == 0 && s.head % 8 == 0; }
bool strides16_ok(const core::Strides3& s) { return s.batch % 16 == 0 && s.row % 16 == 0 && s.head % 16 == 0; }

void check_supported(const core::AttentionProblem& pr) {
  if (pr.dtype == DType::float8_e4m3fn && pr.is_backward) {  // validation rejects it first; kept for direct callers
    throw UnsupportedError("flashkv: the CUDA backend has no float8_e4m3fn backward (FP8 attention is forward-only)");
  }
  if (pr.dtype != DType::bfloat16 && pr.dtype != DType::float16 && pr.dtype != DType::float8_e4m3fn) {
    throw UnsupportedError(std::string("flashkv: the CUDA backend computes in bfloat16 or float16; dtype ") +
                           dtype_name(pr.dtype) + " is only supported on the CPU");
  }
  if (pr.head_dim_v != pr.head_dim) {
    throw UnsupportedError("flashkv: the CUDA backend requires head_dim_v == head_dim (got head_dim " +
                           std::to_string(pr.head_dim) + ", head_dim_v " + std::to_string(pr.head_dim_v) + ")");
  }
  if (!pr.is_backward && pr.algorithm == Algorithm::naive) {
    throw UnsupportedError(
        "flashkv: algorithm 'naive' is not implemented on CUDA (use 'tiled' or 'v1'; the benchmark's naive baseline "
        "is PyTorch's materializing attention)");
  }
  if (pr.max_seqlen_q > INT32_MAX || pr.max_seqlen_k > INT32_MAX || pr.num_heads > 65535 || pr.batch > 65535) {
    throw UnsupportedError("flashkv: CUDA backend limits: seqlen < 2^31, num_heads <= 65535, batch <= 65535");
  }
}

void fill_common(const core::AttentionProblem& pr, FwdParams& p) {
  p.q = pr.q;
  p.k = pr.k;
  p.v = pr.v;
  p.out = pr.out;
  p.lse = pr.lse;
  p.q_s = strides_of(pr.q_strides);
  p.k_s = strides_of(pr.k_strides);
  p.v_s = strides_of(pr.v_strides);
  p.out_s = strides_of(pr.out_strides);
  p.lse_batch = pr.lse_strides.batch;
  p.lse_head = pr.lse_strides.head;
  p.lse_row = pr.lse_strides.row;
  p.cu_seqlens_q = pr.is_varlen ? pr.cu_seqlens_q : nullptr;
  p.cu_seqlens_k = pr.is_varlen ? pr.cu_seqlens_k : nullptr;
  p.batch = static_cast<int32_t>(pr.batch);
  p.num_heads = static_cast<int32_t>(pr.num_heads);
  p.num_heads_kv = static_cast<int32_t>(pr.num_heads_kv);
  p.head_dim = static_cast<int32_t>(pr.head_dim);
  p.seqlen_q = static_cast<int32_t>(pr.max_seqlen_q);
  p.seqlen_k = static_cast<int32_t>(pr.max_seqlen_k);
  p.total_q = pr.total_q;
  p.total_k = pr.total_k;
  p.window_left = pr.window_size_left;
  p.window_right = pr.window_size_right;
  p.softmax_scale = pr.softmax_scale;
  const core::ScoreScaling sc = core::resolve_scaling(pr.softmax_scale, pr.softcap);
  p.softcap = sc.softcap;
  p.score_scale = sc.score_scale;
  p.softmax_scale_log2 = sc.softmax_scale_log2;
  auto descale = [](const core::AttentionProblem::Descale& d) { return DescaleView{d.ptr, d.batch, d.head}; };
  p.q_descale = descale(pr.q_descale);
  p.k_descale = descale(pr.k_descale);
  p.v_descale = descale(pr.v_descale);
}

/// The path report of one call (core::record_path): e.g. "attention_forward cuda sm90 fwd hdim128 bfloat16 causal
/// tiles 128x128" or "attention_forward cuda sm90ws fwd hdim128 bfloat16 tiles 128x176 persistent", plus "head_dim
/// 59 padded" when a larger compiled head dim runs, "small-smem" when the tile table's small-shared-memory
/// configuration ran, "padded-copy" when the inputs were copied.
void record(const char* entry, const core::AttentionProblem& pr, const KernelEntry& ke, const char* kind,
            const LaunchInfo& info, bool padded_copy, const char* extra) {
  std::string d = std::string(entry) + " cuda " + kernel_arch_name(ke.arch) + " " + kind + " hdim" +
                  std::to_string(ke.head_dim) + " " + dtype_name(pr.dtype);
  if (pr.is_varlen) d += " varlen";
  if (pr.causal) {
    d += " causal";
  } else if (pr.window_size_left >= 0 || pr.window_size_right >= 0) {
    d += " window";
  }
  if (pr.softcap > 0.f) d += " softcap";
  if (extra != nullptr) d += std::string(" ") + extra;
  d += " tiles " + std::to_string(info.block_m) + "x" + std::to_string(info.block_n);
  if (info.small_smem) d += " small-smem";
  if (info.schedule != nullptr) d += std::string(" ") + info.schedule;
  if (ke.head_dim != pr.head_dim) d += " head_dim " + std::to_string(pr.head_dim) + " padded";
  if (padded_copy) d += " padded-copy";
  core::record_path(std::move(d));
}

int64_t round_up8(int64_t d) { return (d + 7) / 8 * 8; }
/// The head dim the kernels see: a multiple of 16 bytes (8 16-bit elements, 16 FP8 elements).
int64_t padded_head_dim(const core::AttentionProblem& pr) {
  return pr.dtype == DType::float8_e4m3fn ? (pr.head_dim + 15) / 16 * 16 : round_up8(pr.head_dim);
}

/// Rows/batch of a tensor as seen by pad_copy (packed varlen tensors are one batch of total rows).
struct RowsView {
  int64_t batch, rows;
};
RowsView q_rows(const core::AttentionProblem& pr) {
  return pr.is_varlen ? RowsView{1, pr.total_q} : RowsView{pr.batch, pr.seqlen_q};
}
RowsView k_rows(const core::AttentionProblem& pr) {
  return pr.is_varlen ? RowsView{1, pr.total_k} : RowsView{pr.batch, pr.seqlen_k};
}
TensorStrides contiguous_strides(const core::AttentionProblem& pr, int64_t rows, int64_t heads, int64_t dpad) {
  return TensorStrides{pr.is_varlen ? 0 : rows * heads * dpad, heads * dpad, dpad};
}

/// A padded contiguous copy of one [batch, rows, heads, head_dim] operand of elem_bytes-byte elements.
struct Padded {
  DeviceBuffer buf;
  TensorStrides s;
  Padded(const core::AttentionProblem& pr, const void* src, const core::Strides3& src_s, RowsView rv, int64_t heads,
         int64_t dpad, bool copy_in, cudaStream_t st, int elem_bytes = 2)
      : buf(static_cast<size_t>(rv.batch * rv.rows * heads * dpad) * elem_bytes, st),
        s(contiguous_strides(pr, rv.rows, heads, dpad)) {
    if (copy_in) {
      pad_copy(src, strides_of(src_s), buf.get(), rv.batch, rv.rows, heads, pr.head_dim, dpad, st, elem_bytes);
    }
  }
};

/// TMA tensor maps (the sm90ws forward's q/k/v) take positive strides only: a zero (broadcast) row or head stride, or
/// a zero batch stride of a fixed-length tensor, goes through the padded copy instead.
bool tma_strides_ok(const core::Strides3& s, bool varlen) {
  return s.row > 0 && s.head > 0 && (varlen || s.batch > 0);
}

/// Whether the inputs must be copied into padded contiguous buffers first (head_dim not a multiple of 8, pointers or
/// strides not 16-byte aligned; for a TMA kernel also non-positive strides).
bool needs_padding(const core::AttentionProblem& pr, bool tma = false) {
  const bool fp8 = pr.dtype == DType::float8_e4m3fn;  // 1-byte inputs: 16-byte rows are 16 elements
  auto in_ok = [&](const core::Strides3& st) { return fp8 ? strides16_ok(st) : strides_ok(st); };
  bool ok = pr.head_dim % (fp8 ? 16 : 8) == 0 && aligned16(pr.q) && aligned16(pr.k) && aligned16(pr.v) &&
            aligned16(pr.out) && in_ok(pr.q_strides) && in_ok(pr.k_strides) && in_ok(pr.v_strides) &&
            strides_ok(pr.out_strides);
  if (tma) {
    ok = ok && tma_strides_ok(pr.q_strides, pr.is_varlen) && tma_strides_ok(pr.k_strides, pr.is_varlen) &&
         tma_strides_ok(pr.v_strides, pr.is_varlen);
  }
  if (pr.is_backward) {
    ok = ok && aligned16(pr.dout) && aligned16(pr.dq) && aligned16(pr.dk) && aligned16(pr.dv) &&
         strides_ok(pr.dout_strides) && strides_ok(pr.dq_strides) && strides_ok(pr.dk_strides) &&
         strides_ok(pr.dv_strides);
  }
  return !ok;
}

LaunchInfo run_backward(const core::AttentionProblem& pr, BwdParams& p, const KernelEntry& ke, cudaStream_t st) {
  const int64_t dround = ke.head_dim;
  const int64_t group = pr.num_heads / pr.num_heads_kv;
  p.head_dim_rounded = static_cast<int32_t>(dround);
  p.deterministic = pr.deterministic;
  // Workspaces: dq accumulator, D and lse*log2(e), per-query-head dk/dv for GQA, turn counters (deterministic).
  DeviceBuffer dq_accum(static_cast<size_t>(pr.total_q * pr.num_heads * dround) * 4, st);
  // dsum carries the non-finite fix-up's flag behind its last element (one allocation less per call).
  DeviceBuffer dsum(pr.total_q > 0 ? static_cast<size_t>(pr.total_q * pr.num_heads + 1) * 4 : 0, st);
  DeviceBuffer lse2(static_cast<size_t>(pr.total_q * pr.num_heads) * 4, st);
  const size_t kv_accum_bytes = group > 1 ? static_cast<size_t>(pr.total_k * pr.num_heads * dround) * 4 : 0;
  DeviceBuffer dk_accum(kv_accum_bytes, st), dv_accum(kv_accum_bytes, st);
  // Turn counters per (batch, head, query block) for the smallest kBlockM of this family's tile table entry.
  const int64_t min_block_m = bwd_min_block_m(ke.arch == KernelArch::sm90, ke.head_dim);
  const int64_t m_blocks = (pr.max_seqlen_q + min_block_m - 1) / min_block_m;
  DeviceBuffer sem(pr.deterministic ? static_cast<size_t>(pr.batch * pr.num_heads * m_blocks) * 4 : 0, st);
  p.dq_accum = dq_accum.as<float>();
  p.dsum = dsum.as<float>();
  p.nonfinite_flag = pr.total_q > 0 ? reinterpret_cast<int32_t*>(p.dsum + pr.total_q * pr.num_heads) : nullptr;
  p.lse_log2 = lse2.as<float>();
  p.dk_accum = dk_accum.as<float>();
  p.dv_accum = dv_accum.as<float>();
  p.dq_semaphore = sem.as<int32_t>();
  p.num_m_blocks = static_cast<int32_t>(m_blocks);
  return ke.bwd()(p, st);
}

}  // namespace

bool cuda_device_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void attention_forward_cuda(const core::AttentionProblem& pr, void* stream) {
  check_supported(pr);
  const KernelKind kind = pr.algorithm == Algorithm::v1_order ? KernelKind::fwd_v1 : KernelKind::fwd;
  const int64_t dpad = padded_head_dim(pr);
  const int in_bytes = static_cast<int>(dtype_size(pr.dtype));
  DeviceGuard guard(pr.device_index);
  const CallShape shape{pr.max_seqlen_k, pr.causal || pr.window_size_left >= 0 || pr.window_size_right >= 0,
                        pr.is_varlen, pr.softcap > 0.f};
  const KernelEntry& ke = select_kernel(kind, pr.kernel_family, dpad, pr.dtype, shape);
  auto st = static_cast<cudaStream_t>(stream);
  if (pr.batch == 0 || pr.num_heads == 0 || pr.total_q == 0) return;
  FwdParams p;
  fill_common(pr, p);
  // FA1 loop order keeps O, m, l in global memory between K/V steps (float32 workspaces).
  const int64_t v1_bm = fwd_v1_tile().block_m;
  const int64_t v1_rows = kind == KernelKind::fwd_v1 ? (pr.max_seqlen_q + v1_bm - 1) / v1_bm * v1_bm : 0;
  DeviceBuffer v1_o(static_cast<size_t>(pr.batch * pr.num_heads * v1_rows * ke.head_dim) * 4, st);
  DeviceBuffer v1_ml(static_cast<size_t>(pr.batch * pr.num_heads * v1_rows * 2) * 4, st);
  p.v1_o = v1_o.as<float>();
  p.v1_ml = v1_ml.as<float>();
  p.v1_rows = static_cast<int32_t>(v1_rows);
  const char* kind_name = kind == KernelKind::fwd_v1 ? "fwd_v1" : "fwd";
  if (!needs_padding(pr, ke.arch == KernelArch::sm90ws)) {
    record("attention_forward", pr, ke, kind_name, ke.fwd()(p, st), false, nullptr);
  } else {
    const RowsView qr = q_rows(pr), kr = k_rows(pr);
    Padded q(pr, pr.q, pr.q_strides, qr, pr.num_heads, dpad, true, st, in_bytes);
    Padded k(pr, pr.k, pr.k_strides, kr, pr.num_heads_kv, dpad, true, st, in_bytes);
    Padded v(pr, pr.v, pr.v_strides, kr, pr.num_heads_kv, dpad, true, st, in_bytes);
    Padded o(pr, nullptr, pr.out_strides, qr, pr.num_heads, dpad, false, st);
    p.q = q.buf.get(), p.k = k.buf.get(), p.v = v.buf.get(), p.out = o.buf.get();
    p.q_s = q.s, p.k_s = k.s, p.v_s = v.s, p.out_s = o.s;
    p.head_dim = static_cast<int32_t>(dpad);
    const LaunchInfo info = ke.fwd()(p, st);
    record("attention_forward", pr, ke, kind_name, info, true, nullptr);
    unpad_copy(o.buf.get(), pr.out, strides_of(pr.out_strides), qr.batch, qr.rows, pr.num_heads, pr.head_dim, dpad,
               st);
  }
}

void attention_backward_cuda(const core::AttentionProblem& pr, void* stream) {
  check_supported(pr);
  const int64_t dpad = round_up8(pr.head_dim);
  DeviceGuard guard(pr.device_index);
  const KernelEntry& ke = select_kernel(KernelKind::bwd, pr.kernel_family, dpad, pr.dtype);
  auto st = static_cast<cudaStream_t>(stream);
  if (pr.batch == 0 || pr.num_heads == 0) return;
  BwdParams p;
  fill_common(pr, p);
  p.dout = pr.dout;
  p.dq = pr.dq;
  p.dk = pr.dk;
  p.dv = pr.dv;
  p.dout_s = strides_of(pr.dout_strides);
  p.dq_s = strides_of(pr.dq_strides);
  p.dk_s = strides_of(pr.dk_strides);
  p.dv_s = strides_of(pr.dv_strides);
  const char* mode = pr.deterministic ? "deterministic" : "atomic";
  if (!needs_padding(pr)) {
    record("attention_backward", pr, ke, "bwd", run_backward(pr, p, ke, st), false, mode);
    return;
  }
  const RowsView qr = q_rows(pr), kr = k_rows(pr);
  const int64_t h = pr.num_heads, hk = pr.num_heads_kv;
  Padded q(pr, pr.q, pr.q_strides, qr, h, dpad, true, st);
  Padded k(pr, pr.k, pr.k_strides, kr, hk, dpad, true, st);
  Padded v(pr, pr.v, pr.v_strides, kr, hk, dpad, true, st);
  Padded o(pr, pr.out, pr.out_strides, qr, h, dpad, true, st);
  Padded dO(pr, pr.dout, pr.dout_strides, qr, h, dpad, true, st);
  Padded dq(pr, nullptr, pr.dq_strides, qr, h, dpad, false, st);
  Padded dk(pr, nullptr, pr.dk_strides, kr, hk, dpad, false, st);
  Padded dv(pr, nullptr, pr.dv_strides, kr, hk, dpad, false, st);
  p.q = q.buf.get(), p.k = k.buf.get(), p.v = v.buf.get(), p.out = o.buf.get(), p.dout = dO.buf.get();
  p.dq = dq.buf.get(), p.dk = dk.buf.get(), p.dv = dv.buf.get();
  p.q_s = q.s, p.k_s = k.s, p.v_s = v.s, p.out_s = o.s, p.dout_s = dO.s, p.dq_s = dq.s, p.dk_s = dk.s, p.dv_s = dv.s;
  p.head_dim = static_cast<int32_t>(dpad);
  record("attention_backward", pr, ke, "bwd", run_backward(pr, p, ke, st), true, mode);
  unpad_copy(dq.buf.get(), pr.dq, strides_of(pr.dq_strides), qr.batch, qr.rows, h, pr.head_dim, dpad, st);
  unpad_copy(dk.buf.get(), pr.dk, strides_of(pr.dk_strides), kr.batch, kr.rows, hk, pr.head_dim, dpad, st);
  unpad_copy(dv.buf.get(), pr.dv, strides_of(pr.dv_strides), kr.batch, kr.rows, hk, pr.head_dim, dpad, st);
}

namespace {
void forward_hook(const core::AttentionProblem& pr, void* stream) { attention_forward_cuda(pr, stream); }
void backward_hook(const core::AttentionProblem& pr, void* stream) { attention_backward_cuda(pr, stream); }
const core::DeviceBackend kCudaBackend{&forward_hook, &backward_hook, &cuda_device_available, "cuda"};
const bool kRegistered = (core::register_device_backend(Device::cuda, &kCudaBackend), true);
}  // namespace

}  // namespace flashkv::cuda
