// flashkv/attention.hpp — exact attention, forward and backward (FlashAttention algorithm).
//
// out = softmax(mask(softcap(q·kᵀ · softmax_scale))) · v, computed exactly (never approximated), tile by tile with an
// online softmax (running max m, running sum l, unnormalized accumulator O; Dao et al., "FlashAttention", NeurIPS 2022,
// §3.1 Alg. 1) and the FA2 work partitioning (Dao, "FlashAttention-2", 2023, §3.1–3.2: Q-block outer loop, one final
// division by l). Backward recomputes P from lse (FA2 §3.1.2 Alg. 2): D = rowsum(dout∘out), P = exp(S·scale − lse),
// dV = Pᵀ·dout, dP = dout·Vᵀ, dS = P∘(dP − D), dQ = dS·K·scale, dK = dSᵀ·Q·scale.
//
// LAYOUT (bshd, as flash-attn):
//   q    [batch, seqlen_q, num_heads,    head_dim]
//   k    [batch, seqlen_k, num_heads_kv, head_dim]
//   v    [batch, seqlen_k, num_heads_kv, head_dim_v]
//   out  [batch, seqlen_q, num_heads,    head_dim_v]       (caller-allocated, same dtype as q)
//   lse  [batch, num_heads, seqlen_q] float32, natural log (caller-allocated; optional in forward)
// Varlen (packed): q [total_q, num_heads, head_dim], k/v [total_k, num_heads_kv, head_dim(_v)],
//   cu_seqlens_q/k int32 [batch+1] (cu[0] = 0, non-decreasing, cu[batch] = total), lse [num_heads, total_q].
// Strides arbitrary except the last dimension, which must be contiguous.
//
// DTYPES: q, k, v, out, dout, dq, dk, dv all float32, float16 or bfloat16 (one dtype for all); accumulation in float32.
//   FP8 (forward only, CUDA, kernel family sm90ws on Hopper): q, k, v float8_e4m3fn, out bfloat16, lse float32, with
//   optional dequantization scales AttentionOptions::q_descale / k_descale / v_descale (float32, per tensor: shape []
//   or [1]; or per (batch, kv head): shape [batch, num_heads_kv], any strides). The result is attention on the
//   dequantized values q8·q_descale, k8·k_descale, v8·v_descale (query head h uses the descales of its kv head):
//   s = (q8·k8)·q_descale·k_descale·softmax_scale (float32 scores), P = exp(s − m) rounded to e4m3 for P·V (scaled by
//   2^8 first, FA3's max offset), out = (P·v8)·v_descale / l in float32, rounded once to bfloat16; lse from the
//   unrounded P. Accuracy: the FA3-paper outlier study and the error bound of the tests are in docs/gpu.md ("FP8").
//   Incoherent processing (a Hadamard rotation of q and k along head_dim, FA3 §3.3) is a host-side step:
//   python/flashkv/fp8.py. FP8 on the CPU, on other GPUs or families, or in a backward is an UnsupportedError.
//
// MASK (position i of the query, j of the key, both 0-based within their sequence; shift = seqlen_k − seqlen_q):
//   visible(i, j) = (window_size_left  < 0 || j >= i + shift − window_size_left)
//                && (window_size_right < 0 || j <= i + shift + window_size_right)
//   causal = true is the same as window_size_right = 0 (bottom-right aligned, as flash-attn ≥ 2.1); combining
//   causal = true with window_size_right > 0 is rejected (flashkv::Error naming window_size_right).
//   A model with a sliding window of W tokens uses (W − 1, 0).
// SOFTCAP: if softcap > 0, score ← softcap · tanh(score / softcap), where score = q·k · softmax_scale; applied before
//   masking.
// EDGES: a query row with no visible key gets out = 0 exactly, lse = −inf and zero gradients; seqlen_k = 0 gives zeros.
//   Masking never produces NaN; logits of any finite magnitude are handled.
//
// NON-FINITE INPUTS (NaN, ±inf; every algorithm, forward and backward, dense and varlen, every device). Let J_i be the
//   keys query row i sees (the MASK rule, within its sequence). Masked keys are exactly absent: nothing about them
//   (their K, V, NaN or inf) affects row i. Over J_i the result is the definition evaluated in IEEE arithmetic with
//   float32 accumulation and a NaN-propagating max:
//     s_ij = softcap(softmax_scale · q_i·k_j);  m_i = max_{j∈J_i} s_ij (NaN if any s_ij is NaN);
//     p_ij = exp(s_ij − m_i);  l_i = Σ_j p_ij;  out_i = Σ_j p_ij v_j / l_i;  lse_i = m_i + log l_i.
//   Hence, per row:
//     J_i empty                                  -> out_i = 0, lse_i = −inf (the only case with lse = −inf)
//     a visible s_ij NaN or +inf                 -> out_i all NaN, lse_i NaN   (+inf: exp(inf − inf) = NaN)
//     every visible s_ij = −inf                  -> out_i all NaN, lse_i NaN   (exp(−inf − (−inf)) = NaN)
//     some, not all, visible s_ij = −inf         -> those keys get p = 0 exactly; the rest is normal
//     v_jc NaN/inf for a visible j               -> out_ic NaN or ±inf (IEEE; 0·inf = NaN); lse_i unaffected
//     rows that do not see the bad key           -> unaffected (the same bits as without it)
//   A score is ±inf when q·k leaves the float32 range (|q·k| > 3.4e38) or an input is ±inf; softcap maps ±inf to
//   ±softcap (finite). Backward (from out and lse as the forward returns them): P_ij = exp(s_ij − lse_i) for j ∈ J_i
//   and exactly 0 otherwise, D_i = Σ_c dout_ic·out_ic, dS_ij = P_ij (dP_ij − D_i) (softcap: times 1 − tanh²) for
//   j ∈ J_i and exactly 0 otherwise, dv_j = Σ_{i: j∈J_i} P_ij dout_i, dq_i = scale Σ_{j∈J_i} dS_ij k_j,
//   dk_j = scale Σ_{i: j∈J_i} dS_ij q_i — evaluated in IEEE arithmetic, so a NaN/inf reaches exactly the gradients
//   whose sums contain it (a masked pair is never 0·x). Nothing is checked or reported: like FlashAttention and
//   PyTorch, the library propagates non-finite values instead of raising.
//   CUDA follows the rule too: where a boundary tile's GEMM could multiply a masked 0 with a non-finite value, the
//   output rows that are not finite are recomputed from the definition (docs/gpu.md, "Non-finite inputs"), so a
//   non-finite input costs the heads it reaches a slow path; calls whose outputs are all finite never take it. A row
//   (or key) such a recompute repaired holds the exact values within float32 rounding, not necessarily the same bits
//   as the call without the bad value.
// GQA/MQA: num_heads % num_heads_kv == 0; query head h reads kv head h / (num_heads / num_heads_kv).
//
// ERRORS: flashkv::Error naming the argument with expected vs actual for wrong rank/shape, dtype mismatch
//   (flashkv::TypeError), head_dim 0 or > 256, num_heads not a multiple of num_heads_kv, bad cu_seqlens, null pointers,
//   window sizes < −1, softcap < 0 or non-finite, softmax_scale non-finite or <= 0; UnsupportedError for a device/variant
//   that this build cannot run. Tensors on different devices are a TypeError. The values inside cu_seqlens are checked
//   (cu[0] = 0, non-decreasing, cu[batch] = total, every length <= max_seqlen) when they live on the CPU; a device
//   backend trusts them. Nothing is written when an error is thrown.
//
// DEVICES: Device::cpu runs the CPU kernels (src/cpu/, docs/attention-cpu.md: tiled FA2 order, OpenMP over
//   (batch, head, query block), float32 accumulation); Device::cuda runs the registered CUDA backend, or throws
//   UnsupportedError("flashkv was built without the CUDA backend" / "no CUDA device"). Never a silent fallback.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "flashkv/types.hpp"

namespace flashkv {

/// Which loop structure computes the forward pass. Results are identical up to float32 rounding; the variants exist
/// to compare the memory traffic of the FlashAttention versions (see bench/, `flashkv explain tiles` and
/// flashkv/traffic.hpp). The backward pass has one algorithm (FA2 Alg. 2) and ignores this field.
enum class Algorithm : int32_t {
  tiled = 0,     ///< FA2 order (default): Q-block outer, K/V inner, O/m/l kept in fast memory, one final division.
  v1_order = 1,  ///< FA1 (2022) order: K/V-block outer, Q inner; O, m, l re-read and re-written every step.
  naive = 2,     ///< standard attention: S = QKᵀ and P = softmax(S) materialized in full (O(N²) extra memory).
};
const char* algorithm_name(Algorithm a);  ///< "tiled" | "v1" | "naive"

/// Which CUDA kernel family runs a call on a CUDA device (docs/gpu.md). The family is decided once per call, from the
/// device, the build and the call's shape: on a compute-capability-9.0 GPU, when this build carries sm_90a code and the
/// head dim has a Hopper kernel, `automatic` takes for a forward the sm90ws kernel (TMA + wgmma, warp-specialized,
/// FlashAttention-3 §3.1-3.2) where the H200 measured it faster than sm90 (fixed-length calls without softcap with
/// seqlen_k >= 2048, or head_dim 256, or head_dim 128 without a causal/window mask; docs/gpu.md "Which kernel
/// runs"), else the sm90 kernel (wgmma with
/// cp.async; also every backward); on other GPUs the sm80 (mma.sync, FA2-class) kernels. The environment variable
/// FLASHKV_CUDA_SM80_ONLY (anything but "" or "0", read once per process) makes `automatic` mean sm80. `sm80` / `sm90`
/// / `sm90ws` ask for one family: a family the GPU or the build cannot run for this call (sm90/sm90ws on a non-Hopper
/// GPU, in a build without sm_90a code, or for a head dim it has no kernel for; v1_order, which exists only as sm80;
/// a backward with sm90ws, which is forward-only) is an UnsupportedError naming it, never a silent fallback. A head dim
/// without a kernel of its own runs zero-padded on the family's next larger one (the path report says so). CPU
/// tensors accept only `automatic`.
enum class KernelFamily : int32_t {
  automatic = 0,  ///< "auto"
  sm80 = 1,       ///< "sm80": mma.sync + ldmatrix + cp.async (Ampere and later)
  sm90 = 2,       ///< "sm90": wgmma with cp.async loads (Hopper, sm_90a)
  sm90ws = 3,     ///< "sm90ws": TMA + wgmma, producer/consumer warpgroups, pingpong (Hopper, sm_90a; forward only)
};
const char* kernel_family_name(KernelFamily f);  ///< "auto" | "sm80" | "sm90" | "sm90ws"

struct AttentionOptions {
  std::optional<float> softmax_scale;  ///< default 1/sqrt(head_dim)
  bool causal = false;                 ///< bottom-right aligned; equivalent to window_size_right = 0
  int32_t window_size_left = -1;       ///< −1 = unbounded (tokens)
  int32_t window_size_right = -1;      ///< −1 = unbounded (tokens)
  float softcap = 0.0f;                ///< 0 = off
  Algorithm algorithm = Algorithm::tiled;
  bool deterministic = false;          ///< CUDA backward: true = dq summed in a fixed order, bit-identical
                                       ///< run to run (about half the speed); false (default, as in
                                       ///< FlashAttention) = float32 atomics. The CPU is always deterministic.
  int32_t num_threads = 0;             ///< CPU: 0 = OpenMP default (OMP_NUM_THREADS); must be >= 0
  void* stream = nullptr;              ///< CUDA: cudaStream_t (nullptr = legacy default stream)
  KernelFamily kernel_family = KernelFamily::automatic;  ///< CUDA: which kernel family runs (see KernelFamily)
  /// FP8 forward only (q, k, v float8_e4m3fn; DTYPES above): dequantization scales, float32 on q's device, shape []
  /// or [1] (per tensor) or [batch, num_heads_kv] (per sequence and kv head; strides >= 0, 0 broadcasts). nullptr
  /// means 1. Given with other dtypes: flashkv::Error naming it. The views must stay valid during the call only.
  const TensorView* q_descale = nullptr;
  const TensorView* k_descale = nullptr;
  const TensorView* v_descale = nullptr;
};

/// Fixed-length forward. `lse` may be nullptr. See the file comment for shapes, mask and errors.
void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                       const TensorView* lse, const AttentionOptions& options = {});

/// Fixed-length backward. out/lse must come from attention_forward with the same options; dq, dk, dv are
/// caller-allocated like q, k, v (overwritten, not accumulated into). dout has out's shape. For GQA/MQA dk/dv sum the
/// contributions of every query head of the group. Rows with lse = −inf get zero gradients. CPU: float32
/// accumulation, results rounded once to the dtype, bit-identical for any thread count.
void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, const AttentionOptions& options = {});

/// Varlen (packed) forward. max_seqlen_q/k are upper bounds of the per-sequence lengths (checked).
void attention_varlen_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, int64_t max_seqlen_q,
                              int64_t max_seqlen_k, const TensorView& out, const TensorView* lse,
                              const AttentionOptions& options = {});

/// Varlen (packed) backward; lse is [num_heads, total_q].
void attention_varlen_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, int64_t max_seqlen_q,
                               int64_t max_seqlen_k, const TensorView& out, const TensorView& lse,
                               const TensorView& dout, const TensorView& dq, const TensorView& dk,
                               const TensorView& dv, const AttentionOptions& options = {});

/// Library version "MAJOR.MINOR.PATCH".
const char* version();

}  // namespace flashkv
