// Fragment view: one thread's share of a float32 accumulator tile, indexed (mt, nt, hh, e) for both kernel families.
//
// The mma.sync m16n8 accumulator (sm80: float c[kMT][kNT][4]) and the wgmma m64nN accumulator (sm90: float d[N/2]
// per thread, the warp's 16 rows of the warpgroup's 64) have the same register layout (PTX ISA, "Matrix Fragments for
// mma.m16n8k16" and "wgmma .m64nNk16 register fragment D"): with lane = 4g + t, element
//   (mt, nt, hh, e)  ->  row 16*mt + 8*hh + g,  column 8*nt + 2*t + e,  register (mt*kNT + nt)*4 + 2*hh + e.
// sm90's d[j*4 + 2*hh + e] is therefore Frag<1, N/8>(j, hh, e), and its O chunks o[c][..] of kOChunk columns are one
// flat Frag<1, kHeadDim/8> too. Every shared collective (softmax, masks, epilogues, the non-finite fix-up, the
// backward's P/dS and dK/dV stores) is written once against this view. All indices must be compile-time constants
// after unrolling so that the array stays in registers.
#pragma once

namespace flashkv::cuda::attn {

template <int kMT_, int kNT_>
struct Frag {
  static constexpr int kMT = kMT_;  ///< 16-row tiles
  static constexpr int kNT = kNT_;  ///< 8-column tiles
  static constexpr int kSize = kMT * kNT * 4;
  float* d;
  __device__ __forceinline__ float& operator()(int mt, int nt, int hh, int e) const {
    return d[(mt * kNT + nt) * 4 + 2 * hh + e];
  }
};

/// View of an mma.sync accumulator array.
template <int kMT, int kNT>
__device__ __forceinline__ Frag<kMT, kNT> frag(float (&a)[kMT][kNT][4]) {
  return Frag<kMT, kNT>{&a[0][0][0]};
}
/// View of a wgmma accumulator (one warp's 16 rows): N/2 registers = N/8 column tiles.
template <int N>
__device__ __forceinline__ Frag<1, N / 4> frag(float (&a)[N]) {
  return Frag<1, N / 4>{&a[0]};
}
/// View of a wgmma accumulator kept in column chunks (float o[kChunks][kChunk / 2]), contiguous in registers.
template <int kChunks, int N>
__device__ __forceinline__ Frag<1, kChunks * N / 4> frag(float (&a)[kChunks][N]) {
  return Frag<1, kChunks * N / 4>{&a[0][0]};
}

template <class F>
__device__ __forceinline__ void zero(F f) {
#pragma unroll
  for (int i = 0; i < F::kSize; ++i) f.d[i] = 0.f;
}

/// True when any element of the fragment is +-inf or NaN.
template <class F>
__device__ __forceinline__ bool any_nonfinite(F f) {
  bool bad = false;
#pragma unroll
  for (int i = 0; i < F::kSize; ++i) bad |= (__float_as_uint(f.d[i]) & 0x7F800000u) == 0x7F800000u;
  return bad;
}

}  // namespace flashkv::cuda::attn
