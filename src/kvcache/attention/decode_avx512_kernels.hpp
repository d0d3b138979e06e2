// Fused decode tile kernels (AVX-512), shared by decode_avx512.cpp and decode_avx512_fp16.cpp: each translation unit
// includes this file inside its own `#pragma GCC target` region and anonymous namespace, after defining
// FKV_CVTPH(h) (16 fp16 in a __m256i -> __m512: vcvtph2ps, or vcvtph2psx where AVX512-FP16 is available, one uop
// fewer). Not a public header. See decode_fused.hpp for the contracts and decode_avx512.cpp for conversion costs.
//
// NOLINTBEGIN — included in an anonymous namespace on purpose (internal linkage per translation unit).
#pragma once

#define FKV_AI inline __attribute__((always_inline))

template <int... I, class F>
FKV_AI void static_for(std::integer_sequence<int, I...>, F&& f) {
  (f(std::integral_constant<int, I>{}), ...);
}

/// Channels [16c, 16c + 16) of one packed row as float ("raw", see decode_fused.hpp). c is a compile-time constant.
template <KVCode C, int D, int Cc>
FKV_AI __m512 load_chunk(const uint8_t* row) {
  if constexpr (C == KVCode::f32) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + 16 * Cc);
  } else if constexpr (C == KVCode::f16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 32 * Cc)));
  } else if constexpr (C == KVCode::bf16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 32 * Cc));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else if constexpr (C == KVCode::e4m3) {
    // S.EEEE.MMM sign-extended to 16 bits, << 7 and bit 14 cleared: S.0EEEE.MMM0000000 = value · 2^-8 as fp16.
    __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * Cc)));
    w = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(static_cast<int16_t>(0xBFFF)));
    return FKV_CVTPH(w);
  } else if constexpr (C == KVCode::e5m2) {
    const __m256i w = _mm256_slli_epi16(
        _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * Cc))), 8);
    return FKV_CVTPH(w);
  } else if constexpr (C == KVCode::u8) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * Cc))));
  } else {
    static_assert(C == KVCode::u4 || C == KVCode::u2, "every KVCode has a conversion");
    constexpr int kBits = C == KVCode::u4 ? 4 : 2;
    constexpr int kPlaneLen = D * kBits / 8;
    constexpr int kPlane = 16 * Cc / kPlaneLen, kOff = 16 * Cc - kPlane * kPlaneLen;
    __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + kOff)));
    if constexpr (kPlane > 0) x = _mm512_srli_epi32(x, kPlane * kBits);
    // vpermps reads the low 4 index bits: a 16-entry table maps them to the code value (i or i & 3)
    const __m512 lut = kBits == 4 ? _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
                                  : _mm512_setr_ps(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
    return _mm512_permutexvar_ps(x, lut);
  }
}

/// Channels [16c, 16c + 32) as two float vectors (c even). fp8 converts 32 codes per widening (one vpmovsxbw /
/// vpmovzxbw and one shift for both halves); the other encodings are two load_chunk calls.
template <KVCode C, int D, int Cc>
FKV_AI void load_pair(const uint8_t* row, __m512& a, __m512& b) {
  if constexpr (C == KVCode::e4m3 || C == KVCode::e5m2) {
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 16 * Cc));
    __m512i w;
    if constexpr (C == KVCode::e4m3) {
      w = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(bytes), 7),
                           _mm512_set1_epi16(static_cast<int16_t>(0xBFFF)));
    } else {
      w = _mm512_slli_epi16(_mm512_cvtepu8_epi16(bytes), 8);
    }
    a = FKV_CVTPH(_mm512_castsi512_si256(w));
    b = FKV_CVTPH(_mm512_extracti64x4_epi64(w, 1));
  } else {
    a = load_chunk<C, D, Cc>(row);
    b = load_chunk<C, D, Cc + 1>(row);
  }
}

FKV_AI __m512 red1(__m512 a, __m512 b) { return _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b)); }
FKV_AI __m512 red2(__m512 a, __m512 b) {
  const __m512d x = _mm512_castps_pd(a), y = _mm512_castps_pd(b);
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
}
FKV_AI __m512 red3(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
}
/// Lane l of the result = the sum of the 16 lanes of a[l] (transpose-add tree: 15 adds, 30 shuffles).
FKV_AI __m512 reduce16(const __m512* a) {
  const __m512 x0 = red1(a[0], a[1]), x1 = red1(a[2], a[3]), x2 = red1(a[4], a[5]), x3 = red1(a[6], a[7]);
  const __m512 x4 = red1(a[8], a[9]), x5 = red1(a[10], a[11]), x6 = red1(a[12], a[13]), x7 = red1(a[14], a[15]);
  const __m512 y0 = red2(x0, x1), y1 = red2(x2, x3), y2 = red2(x4, x5), y3 = red2(x6, x7);
  return red3(red3(y0, y1), red3(y2, y3));
}

/// KG > 0: keys with per-(token, group of KG channels) factors, dequantized in registers (x = alpha·raw + beta, one
/// FMA per converted vector, shared by the four query rows).
template <KVCode C, int D, int KG>
__attribute__((flatten)) void scores_t(const float* q, int rows, const uint8_t* codes, int64_t rb, int n, float* S,
                                       int lds, const float* alpha, const float* beta) {
  constexpr int kNg = KG > 0 ? D / KG : 1;
  for (int r0 = 0; r0 < rows; r0 += 4) {
    const int nr = std::min(4, rows - r0);
    const float* qr[4];
    for (int i = 0; i < 4; ++i) qr[i] = q + static_cast<int64_t>(r0 + std::min(i, nr - 1)) * D;
    for (int j0 = 0; j0 < n; j0 += 4) {
      const int nk = std::min(4, n - j0);
      const uint8_t* kr[4];
      int kj[4];
      for (int k = 0; k < 4; ++k) {
        kj[k] = j0 + std::min(k, nk - 1);
        kr[k] = codes + static_cast<int64_t>(kj[k]) * rb;
      }
      __m512 acc[16];
      for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
      static_for(std::make_integer_sequence<int, D / 32>{}, [&](auto cp) {
        constexpr int c = 2 * decltype(cp)::value;
        __m512 ka[4], kb[4];
        for (int k = 0; k < 4; ++k) {
          load_pair<C, D, c>(kr[k], ka[k], kb[k]);
          if constexpr (KG > 0) {  // 32 channels [16c, 16c + 32) lie in one group (KG >= 32)
            constexpr int g = 16 * c / (KG > 0 ? KG : 1);
            const __m512 a = _mm512_set1_ps(alpha[kj[k] * kNg + g]), b = _mm512_set1_ps(beta[kj[k] * kNg + g]);
            ka[k] = _mm512_fmadd_ps(ka[k], a, b);
            kb[k] = _mm512_fmadd_ps(kb[k], a, b);
          }
        }
        for (int i = 0; i < 4; ++i) {
          const __m512 qa = _mm512_loadu_ps(qr[i] + 16 * c), qb = _mm512_loadu_ps(qr[i] + 16 * c + 16);
          for (int k = 0; k < 4; ++k) {
            acc[4 * i + k] = _mm512_fmadd_ps(qa, ka[k], acc[4 * i + k]);
            acc[4 * i + k] = _mm512_fmadd_ps(qb, kb[k], acc[4 * i + k]);
          }
        }
      });
      const __m512 s = reduce16(acc);  // lane 4·i + k = row r0 + i, key j0 + k
      const __mmask8 km = static_cast<__mmask8>((1u << nk) - 1u);
      float* s0 = S + static_cast<int64_t>(r0) * lds + j0;
      _mm_mask_storeu_ps(s0, km, _mm512_castps512_ps128(s));
      if (nr > 1) _mm_mask_storeu_ps(s0 + lds, km, _mm512_extractf32x4_ps(s, 1));
      if (nr > 2) _mm_mask_storeu_ps(s0 + 2 * lds, km, _mm512_extractf32x4_ps(s, 2));
      if (nr > 3) _mm_mask_storeu_ps(s0 + 3 * lds, km, _mm512_extractf32x4_ps(s, 3));
    }
  }
}

/// One 64-channel quarter-block (chunks 4H..4H+3) of up to four output rows over all n keys; accumulators stay in
/// registers for the whole tile. KG: channels per weight group if < 64 (16 or 32), else 0 (one weight per row, key
/// and 64-channel block).
template <KVCode C, int D, int KG, int H>
FKV_AI void pv_block(const float* const* wr, int64_t ng, int group, int nr, const uint8_t* codes, int64_t rb,
                     int n, float* const* orow) {
  __m512 acc[4][4];
  for (int i = 0; i < 4; ++i) {
    for (int cc = 0; cc < 4; ++cc) {
      acc[i][cc] = i < nr ? _mm512_loadu_ps(orow[i] + 16 * (4 * H + cc)) : _mm512_setzero_ps();
    }
  }
  const int64_t gh = KG == 0 ? static_cast<int64_t>(64 * H / group) : 0;
  for (int j = 0; j < n; ++j) {
    const uint8_t* row = codes + static_cast<int64_t>(j) * rb;
    __m512 v0, v1, v2, v3;
    load_pair<C, D, 4 * H>(row, v0, v1);
    load_pair<C, D, 4 * H + 2>(row, v2, v3);
    for (int i = 0; i < 4; ++i) {
      if constexpr (KG == 0) {
        const __m512 p = _mm512_set1_ps(wr[i][j * ng + gh]);
        acc[i][0] = _mm512_fmadd_ps(p, v0, acc[i][0]);
        acc[i][1] = _mm512_fmadd_ps(p, v1, acc[i][1]);
        acc[i][2] = _mm512_fmadd_ps(p, v2, acc[i][2]);
        acc[i][3] = _mm512_fmadd_ps(p, v3, acc[i][3]);
      } else if constexpr (KG == 32) {
        const __m512 pa = _mm512_set1_ps(wr[i][j * ng + 2 * H]);
        const __m512 pb = _mm512_set1_ps(wr[i][j * ng + 2 * H + 1]);
        acc[i][0] = _mm512_fmadd_ps(pa, v0, acc[i][0]);
        acc[i][1] = _mm512_fmadd_ps(pa, v1, acc[i][1]);
        acc[i][2] = _mm512_fmadd_ps(pb, v2, acc[i][2]);
        acc[i][3] = _mm512_fmadd_ps(pb, v3, acc[i][3]);
      } else {
        acc[i][0] = _mm512_fmadd_ps(_mm512_set1_ps(wr[i][j * ng + 4 * H]), v0, acc[i][0]);
        acc[i][1] = _mm512_fmadd_ps(_mm512_set1_ps(wr[i][j * ng + 4 * H + 1]), v1, acc[i][1]);
        acc[i][2] = _mm512_fmadd_ps(_mm512_set1_ps(wr[i][j * ng + 4 * H + 2]), v2, acc[i][2]);
        acc[i][3] = _mm512_fmadd_ps(_mm512_set1_ps(wr[i][j * ng + 4 * H + 3]), v3, acc[i][3]);
      }
    }
  }
  for (int i = 0; i < nr; ++i) {
    for (int cc = 0; cc < 4; ++cc) _mm512_storeu_ps(orow[i] + 16 * (4 * H + cc), acc[i][cc]);
  }
}

template <KVCode C, int D, int KG>
__attribute__((flatten)) void pv_t(const float* w, int64_t ldw, int64_t ng, int group, int rows,
                                   const uint8_t* codes, int64_t rb, int n, float* O) {
  for (int r0 = 0; r0 < rows; r0 += 4) {
    const int nr = std::min(4, rows - r0);
    const float* wr[4];
    float* orow[4];
    for (int i = 0; i < 4; ++i) {
      wr[i] = w + static_cast<int64_t>(r0 + std::min(i, nr - 1)) * ldw;
      orow[i] = O + static_cast<int64_t>(r0 + std::min(i, nr - 1)) * D;
    }
    static_for(std::make_integer_sequence<int, D / 64>{}, [&](auto hh) {
      pv_block<C, D, KG, decltype(hh)::value>(wr, ng, group, nr, codes, rb, n, orow);
    });
  }
}

template <KVCode C, int D>
void scores_code(const float* q, int rows, const uint8_t* codes, int64_t rb, int n, float* S, int lds,
                 const float* alpha, const float* beta, int group) {
  if (alpha == nullptr) {
    scores_t<C, D, 0>(q, rows, codes, rb, n, S, lds, nullptr, nullptr);
  } else if (group == 32) {
    scores_t<C, D, 32>(q, rows, codes, rb, n, S, lds, alpha, beta);
  } else if (group == 64 || D < 128) {
    scores_t<C, D, (D >= 64 ? 64 : 32)>(q, rows, codes, rb, n, S, lds, alpha, beta);
  } else {
    scores_t<C, D, (D >= 128 ? 128 : 32)>(q, rows, codes, rb, n, S, lds, alpha, beta);
  }
}

template <int D>
void scores_d(KVCode code, const float* q, int rows, const uint8_t* codes, int64_t rb, int n, float* S, int lds,
              const float* alpha, const float* beta, int group) {
  switch (code) {
    case KVCode::f32: scores_code<KVCode::f32, D>(q, rows, codes, rb, n, S, lds, alpha, beta, group); break;
    case KVCode::bf16: scores_code<KVCode::bf16, D>(q, rows, codes, rb, n, S, lds, alpha, beta, group); break;
    case KVCode::f16: scores_code<KVCode::f16, D>(q, rows, codes, rb, n, S, lds, alpha, beta, group); break;
    case KVCode::e4m3: scores_code<KVCode::e4m3, D>(q, rows, codes, rb, n, S, lds, alpha, beta, group); break;
    case KVCode::e5m2: scores_code<KVCode::e5m2, D>(q, rows, codes, rb, n, S, lds, alpha, beta, group); break;
    case KVCode::u8: scores_code<KVCode::u8, D>(q, rows, codes, rb, n, S, lds, alpha, beta, group); break;
    case KVCode::u4: scores_code<KVCode::u4, D>(q, rows, codes, rb, n, S, lds, alpha, beta, group); break;
    case KVCode::u2: scores_code<KVCode::u2, D>(q, rows, codes, rb, n, S, lds, alpha, beta, group); break;
    default: break;  // not fused (decode_fused.hpp fused_code): never planned here
  }
}

template <KVCode C, int D>
void pv_code(const float* w, int64_t ldw, int64_t ng, int group, int rows, const uint8_t* codes, int64_t rb,
             int n, float* O) {
  if (group == 32) {
    pv_t<C, D, 32>(w, ldw, ng, group, rows, codes, rb, n, O);
  } else if (group == 16) {
    pv_t<C, D, 16>(w, ldw, ng, group, rows, codes, rb, n, O);
  } else {
    pv_t<C, D, 0>(w, ldw, ng, group, rows, codes, rb, n, O);
  }
}

template <int D>
void pv_d(KVCode code, const float* w, int64_t ldw, int64_t ng, int group, int rows, const uint8_t* codes,
          int64_t rb, int n, float* O) {
  switch (code) {
    case KVCode::f32: pv_code<KVCode::f32, D>(w, ldw, ng, group, rows, codes, rb, n, O); break;
    case KVCode::f16: pv_code<KVCode::f16, D>(w, ldw, ng, group, rows, codes, rb, n, O); break;
    case KVCode::bf16: pv_code<KVCode::bf16, D>(w, ldw, ng, group, rows, codes, rb, n, O); break;
    case KVCode::e4m3: pv_code<KVCode::e4m3, D>(w, ldw, ng, group, rows, codes, rb, n, O); break;
    case KVCode::e5m2: pv_code<KVCode::e5m2, D>(w, ldw, ng, group, rows, codes, rb, n, O); break;
    case KVCode::u8: pv_code<KVCode::u8, D>(w, ldw, ng, group, rows, codes, rb, n, O); break;
    case KVCode::u4: pv_code<KVCode::u4, D>(w, ldw, ng, group, rows, codes, rb, n, O); break;
    case KVCode::u2: pv_code<KVCode::u2, D>(w, ldw, ng, group, rows, codes, rb, n, O); break;
    default: break;  // not fused (decode_fused.hpp fused_code): never planned here
  }
}

/// The compiled head dims (fused_supported: 64, 128, 256) dispatched at run time.
FKV_AI void scores_any(KVCode code, const float* q, int rows, int d, const uint8_t* codes, int64_t rb, int n, float* S,
                       int lds, const float* alpha, const float* beta, int group) {
  if (d == 128) {
    scores_d<128>(code, q, rows, codes, rb, n, S, lds, alpha, beta, group);
  } else if (d == 64) {
    scores_d<64>(code, q, rows, codes, rb, n, S, lds, alpha, beta, group);
  } else {
    scores_d<256>(code, q, rows, codes, rb, n, S, lds, alpha, beta, group);
  }
}
FKV_AI void pv_any(KVCode code, const float* w, int64_t ldw, int64_t ng, int group, int rows, int d,
                   const uint8_t* codes, int64_t rb, int n, float* O) {
  if (d == 128) {
    pv_d<128>(code, w, ldw, ng, group, rows, codes, rb, n, O);
  } else if (d == 64) {
    pv_d<64>(code, w, ldw, ng, group, rows, codes, rb, n, O);
  } else {
    pv_d<256>(code, w, ldw, ng, group, rows, codes, rb, n, O);
  }
}

// NOLINTEND
