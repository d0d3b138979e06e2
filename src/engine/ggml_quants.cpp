// ggml block formats → float32 (see flashkv::GgufType in flashkv/model.hpp for the layouts). Written from the block
// definitions: each function reads one block's scale fields and codes and writes its values in element order.
#include "engine/ggml_quants.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/float16.hpp"

namespace flashkv::engine_detail {

namespace {

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_float(h);
}

void deq_f32(const uint8_t* src, float* dst, int64_t n) { std::memcpy(dst, src, static_cast<std::size_t>(n) * 4); }

void deq_f16(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = half_at(src + 2 * i);
}

void deq_bf16(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = bf16_to_float(h);
  }
}

// 32-value blocks. Nibble layout shared by Q4_0/Q4_1/Q5_0/Q5_1: byte j holds value j (low) and value j + 16 (high).
void deq_q4_0(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 18, dst += 32) {
    const float d = half_at(src);
    const uint8_t* qs = src + 2;
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>((qs[j] & 0x0F) - 8);
      dst[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
    }
  }
}

void deq_q4_1(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 20, dst += 32) {
    const float d = half_at(src), m = half_at(src + 2);
    const uint8_t* qs = src + 4;
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>(qs[j] & 0x0F) + m;
      dst[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
    }
  }
}

void deq_q5_0(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 22, dst += 32) {
    const float d = half_at(src);
    uint32_t qh;
    std::memcpy(&qh, src + 2, 4);
    const uint8_t* qs = src + 6;
    for (int j = 0; j < 16; ++j) {
      const int lo = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      dst[j] = d * static_cast<float>(lo - 16);
      dst[j + 16] = d * static_cast<float>(hi - 16);
    }
  }
}

void deq_q5_1(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 24, dst += 32) {
    const float d = half_at(src), m = half_at(src + 2);
    uint32_t qh;
    std::memcpy(&qh, src + 4, 4);
    const uint8_t* qs = src + 8;
    for (int j = 0; j < 16; ++j) {
      const int lo = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      dst[j] = d * static_cast<float>(lo) + m;
      dst[j + 16] = d * static_cast<float>(hi) + m;
    }
  }
}

void deq_q8_0(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 34, dst += 32) {
    const float d = half_at(src);
    for (int j = 0; j < 32; ++j) dst[j] = d * static_cast<float>(static_cast<int8_t>(src[2 + j]));
  }
}

// K-quants: 256-value super-blocks. The 12 scale bytes of Q4_K / Q5_K hold eight 6-bit (scale, min) pairs.
inline void scale_min_k4(int j, const uint8_t* s, int& sc, int& mn) {
  if (j < 4) {
    sc = s[j] & 63;
    mn = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

/// Q4_K and Q5_K share everything but the 5th bit: each 64-value chunk c holds sub-blocks 2c (low nibbles of its 32
/// bytes) and 2c+1 (high nibbles); `qh` (Q5_K only, else nullptr) adds bit 2c / 2c+1 of byte l as value bit 4.
void deq_k4_k5(const uint8_t* src, float* dst, int64_t nb, int block_bytes, const uint8_t* (*qh_of)(const uint8_t*),
               int qs_offset) {
  for (int64_t b = 0; b < nb; ++b, src += block_bytes, dst += 256) {
    const float d = half_at(src), dmin = half_at(src + 2);
    const uint8_t* scales = src + 4;
    const uint8_t* qh = qh_of(src);
    const uint8_t* qs = src + qs_offset;
    for (int c = 0; c < 4; ++c) {
      int sc0, m0, sc1, m1;
      scale_min_k4(2 * c, scales, sc0, m0);
      scale_min_k4(2 * c + 1, scales, sc1, m1);
      const float d0 = d * static_cast<float>(sc0), mm0 = dmin * static_cast<float>(m0);
      const float d1 = d * static_cast<float>(sc1), mm1 = dmin * static_cast<float>(m1);
      const uint8_t* q = qs + 32 * c;
      float* y = dst + 64 * c;
      for (int l = 0; l < 32; ++l) {
        const int lo = (q[l] & 0x0F) | (qh ? ((qh[l] >> (2 * c)) & 1) << 4 : 0);
        const int hi = (q[l] >> 4) | (qh ? ((qh[l] >> (2 * c + 1)) & 1) << 4 : 0);
        y[l] = d0 * static_cast<float>(lo) - mm0;
        y[l + 32] = d1 * static_cast<float>(hi) - mm1;
      }
    }
  }
}

void deq_q4_k(const uint8_t* src, float* dst, int64_t nb) {  // 144 B: d, dmin, scales[12], qs[128]
  deq_k4_k5(src, dst, nb, 144, [](const uint8_t*) -> const uint8_t* { return nullptr; }, 16);
}

void deq_q5_k(const uint8_t* src, float* dst, int64_t nb) {  // 176 B: d, dmin, scales[12], qh[32], qs[128]
  deq_k4_k5(src, dst, nb, 176, [](const uint8_t* blk) -> const uint8_t* { return blk + 16; }, 48);
}

void deq_q6_k(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 210, dst += 256) {
    const uint8_t* ql = src;
    const uint8_t* qh = src + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(src + 192);
    const float d = half_at(src + 208);
    for (int h = 0; h < 2; ++h) {  // two halves of 128 values
      const uint8_t* l4 = ql + 64 * h;
      const uint8_t* h2 = qh + 32 * h;
      float* y = dst + 128 * h;
      const int8_t* s = sc + 8 * h;
      for (int l = 0; l < 32; ++l) {
        const int q0 = ((l4[l] & 0x0F) | ((h2[l] & 3) << 4)) - 32;
        const int q1 = ((l4[l + 32] & 0x0F) | (((h2[l] >> 2) & 3) << 4)) - 32;
        const int q2 = ((l4[l] >> 4) | (((h2[l] >> 4) & 3) << 4)) - 32;
        const int q3 = ((l4[l + 32] >> 4) | (((h2[l] >> 6) & 3) << 4)) - 32;
        const int g = l / 16;  // value v of the half uses scale s[v / 16]
        y[l] = d * static_cast<float>(s[g]) * static_cast<float>(q0);
        y[l + 32] = d * static_cast<float>(s[g + 2]) * static_cast<float>(q1);
        y[l + 64] = d * static_cast<float>(s[g + 4]) * static_cast<float>(q2);
        y[l + 96] = d * static_cast<float>(s[g + 6]) * static_cast<float>(q3);
      }
    }
  }
}

constexpr GgmlTypeInfo kTypes[] = {
    {0, "F32", 1, 4, deq_f32},       {1, "F16", 1, 2, deq_f16},        {2, "Q4_0", 32, 18, deq_q4_0},
    {3, "Q4_1", 32, 20, deq_q4_1},   {6, "Q5_0", 32, 22, deq_q5_0},    {7, "Q5_1", 32, 24, deq_q5_1},
    {8, "Q8_0", 32, 34, deq_q8_0},   {12, "Q4_K", 256, 144, deq_q4_k}, {13, "Q5_K", 256, 176, deq_q5_k},
    {14, "Q6_K", 256, 210, deq_q6_k}, {30, "BF16", 1, 2, deq_bf16},
};

// ggml_type ids this engine does not read, for readable errors.
constexpr std::pair<uint32_t, const char*> kOtherNames[] = {
    {9, "Q8_1"},     {10, "Q2_K"},  {11, "Q3_K"},   {15, "Q8_K"},   {16, "IQ2_XXS"}, {17, "IQ2_XS"},
    {18, "IQ3_XXS"}, {19, "IQ1_S"}, {20, "IQ4_NL"}, {21, "IQ3_S"},  {22, "IQ2_S"},   {23, "IQ4_XS"},
    {24, "I8"},      {25, "I16"},   {26, "I32"},    {27, "I64"},    {28, "F64"},     {29, "IQ1_M"},
    {34, "TQ1_0"},   {35, "TQ2_0"}, {39, "MXFP4"},
};

}  // namespace

const GgmlTypeInfo* ggml_type_info(uint32_t type) {
  for (const auto& t : kTypes)
    if (t.id == type) return &t;
  return nullptr;
}

std::string ggml_type_name(uint32_t type) {
  if (const auto* t = ggml_type_info(type)) return t->name;
  for (const auto& [id, name] : kOtherNames)
    if (id == type) return name;
  return "type" + std::to_string(type);
}

std::string ggml_supported_types() {
  std::string s;
  for (const auto& t : kTypes) s += (s.empty() ? "" : ", ") + std::string(t.name);
  return s;
}

int64_t ggml_dequantize(const GgmlTypeInfo& type, const uint8_t* src, float* dst, int64_t n_values) {
  const int64_t nb = n_values / type.block_values;
  constexpr int64_t kChunk = 4096;  // values per task, rounded to whole blocks
  const int64_t blocks_per_task = std::max<int64_t>(1, kChunk / type.block_values);
  const int64_t tasks = (nb + blocks_per_task - 1) / blocks_per_task;
  int64_t first_bad = -1;
#pragma omp parallel for schedule(static) if (tasks > 8)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t b0 = t * blocks_per_task, b1 = std::min(nb, b0 + blocks_per_task);
    float* out = dst + b0 * type.block_values;
    type.dequantize(src + b0 * type.block_bytes, out, b1 - b0);
    const int64_t n = (b1 - b0) * type.block_values;
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(out[i])) {
#pragma omp critical(flashkv_dequant_bad)
        if (first_bad < 0 || b0 * type.block_values + i < first_bad) first_bad = b0 * type.block_values + i;
        break;
      }
    }
  }
  return first_bad;
}

}  // namespace flashkv::engine_detail
