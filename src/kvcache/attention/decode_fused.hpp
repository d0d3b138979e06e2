// Fused decode-attention tile kernels (AVX-512): score a tile of keys and accumulate P·V straight from the packed
// codes of a page (or the bf16 window buffer), converting each code vector in registers right before its FMAs — no
// float copy of the tile is written. The kernels are templated on the format trait's KVCode (kvcache/format/
// traits.hpp): every code kind — fp32, bf16, fp16, fp8 e4m3 / e5m2, u8 / u4 / u2 — has a conversion. The affine part
// of a format (per-token scale / min, KIVI per-channel key scale, fp8 scale) is applied outside, once per key on the
// score or on p (see decode_tile.cpp), so the inner loop is "convert 16 codes + 4 FMAs" (four GQA query rows share
// each converted vector); keys with several channel groups per token (int8 / int4 _gN) are dequantized in registers
// (one extra FMA per 16 codes, shared by the four rows). Implemented in decode_avx512.cpp; fused_supported() is false
// on builds or CPUs without AVX-512, where the generic tile path (KVCodec::decode_factored) runs instead.
#pragma once

#include <cstdint>

#include "kvcache/format/traits.hpp"

namespace flashkv::kv {

// "raw" below is the value the kernels multiply with for a code: fp32 / bf16 / fp16 / e5m2 exact; e4m3 its value ·
// 2^-8 (the fp16 route, see format/codec.cpp); u8 / u4 / u2 the integer code (planar packing, format/traits.hpp).

/// The code kinds and scalings the fused kernels convert in registers (decode_avx512_kernels.hpp); a format with
/// another one (a newly added KVCode / KVScaling) runs through the codec's tiles until a conversion is added there.
constexpr bool fused_code(KVCode c) {
  switch (c) {
    case KVCode::f32: case KVCode::bf16: case KVCode::f16: case KVCode::e4m3: case KVCode::e5m2:
    case KVCode::u8: case KVCode::u4: case KVCode::u2: return true;
  }
  return false;
}
constexpr bool fused_scaling(KVScaling s) {
  switch (s) {
    case KVScaling::none: case KVScaling::head_static: case KVScaling::token_f32: case KVScaling::token_affine:
    case KVScaling::channel_affine: return true;
  }
  return false;
}

/// True when the fused kernels run on this build and CPU (GCC x86-64, AVX-512F/BW/VL/DQ + F16C at run time) for
/// head_dim d (64, 128 or 256).
bool fused_supported(int32_t d);

/// S[r·lds + j] = Σ_c q[r·d + c] · x(j, c) for r < rows, j < n (four rows × four keys per block, lanes reduced with a
/// transpose-add tree), x(j, c) = raw(codes + j·rb)[c] — or, when alpha != nullptr (keys with ng = d / group channel
/// groups per token, group 32, 64 or 128), x(j, c) = alpha[j·ng + c / group] · raw + beta[j·ng + c / group].
void fused_scores(KVCode code, const float* q, int rows, int d, const uint8_t* codes, int64_t rb, int n, float* S,
                  int lds, const float* alpha = nullptr, const float* beta = nullptr, int group = 0);

/// O[r·d + c] += Σ_j w[r·ldw + j·ng + c / group] · raw(codes + j·rb)[c] for r < rows, c < d, j < n (weights
/// token-major, ng = d / group). group: channels per weight group (16, 32, or a multiple of 64; d = one weight per row
/// and key).
void fused_pv(KVCode code, const float* w, int64_t ldw, int64_t ng, int group, int rows, int d,
              const uint8_t* codes, int64_t rb, int n, float* O);

/// The same kernels built with vcvtph2psx (decode_avx512_fp16.cpp; AVX512-FP16 at run time); fused_scores /
/// fused_pv use them for KVCode::e4m3 / e5m2 when fp16_convert_supported().
bool fp16_convert_supported();
void fused_scores_fp16cvt(KVCode code, const float* q, int rows, int d, const uint8_t* codes, int64_t rb, int n,
                          float* S, int lds, const float* alpha, const float* beta, int group);
void fused_pv_fp16cvt(KVCode code, const float* w, int64_t ldw, int64_t ng, int group, int rows, int d,
                      const uint8_t* codes, int64_t rb, int n, float* O);

/// n fp16 values (little-endian) -> float.
void fp16_to_float_n(const uint8_t* src, int n, float* dst);

/// Per-token [fp16 scale, fp16 min] metadata of n tokens × ng channel groups (4 bytes per group) -> token-major
/// alpha[t·ng + g] = scale, beta[t·ng + g] = min.
void token_meta(const uint8_t* meta, int n, int ng, float* alpha, float* beta);

/// Online-softmax step (cpu::online_softmax_scores_to_p) for rows r < rows of scores sc[r·ld + j], j < n: updates
/// m[r], l[r], overwrites the scores with p and returns the accumulator rescale factor in alpha[r]. A row with a NaN /
/// +inf score is poisoned: m[r] = l[r] = alpha[r] = NaN (the caller's accumulator row becomes NaN through alpha), p = 0;
/// a poisoned row (m[r] NaN) is left alone afterwards (p = 0, alpha = 1).
void softmax_rows(float* sc, int64_t ld, int rows, int n, float* m, float* l, float* alpha);

/// V weights of the factored P·V̂ (token-major, ng a power of two ≤ 16): w[r·ng·ldp + j·ng + g] = p[r·ldp + j] ·
/// alpha[j·ng + g] and, when beta and z are given, z[r·ng + g] = Σ_j p[r·ldp + j] · beta[j·ng + g].
void pv_weights(const float* p, int64_t ldp, int rows, int n, const float* alpha, const float* beta, int ng, float* w,
                float* z);

/// KIVI keys: qe[r][c] = q[r][c] · cs[c], bias[r] = q_r · cz for r < rows (d % 16 == 0).
void fold_channel_scale_n(const float* q, int rows, int d, const float* cs, const float* cz, float* qe, float* bias);

}  // namespace flashkv::kv
