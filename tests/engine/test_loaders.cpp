// Loader round trips (legacy → v1 → GGUF F32/F16/BF16/Q8_0) and corrupt / truncated / mismatched files → IoError.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/float16.hpp"
#include "flashkv/error.hpp"
#include "test_util.hpp"

using namespace flashkv;
using namespace flashkv::test;

namespace {

struct Tensor {
  const char* name;
  const float* Model::*top;
  const float* LayerWeights::*layer;
  std::size_t (*size)(const ModelConfig&);
};

std::vector<std::pair<std::string, std::vector<float>>> all_weights(const Model& m) {
  const auto& c = m.config;
  const std::size_t D = c.dim, H = c.hidden_dim, V = c.vocab_size, KV = c.kv_dim(), Q = c.num_heads * c.head_dim;
  std::vector<std::pair<std::string, std::vector<float>>> out;
  auto add = [&](std::string n, const float* p, std::size_t k) { out.emplace_back(std::move(n), std::vector<float>(p, p + k)); };
  add("embed", m.token_embedding, V * D);
  for (std::size_t l = 0; l < m.layers.size(); ++l) {
    const auto& L = m.layers[l];
    const std::string p = std::to_string(l) + ".";
    add(p + "attn_norm", L.attn_norm, D);
    add(p + "wq", L.wq, Q * D);
    add(p + "wk", L.wk, KV * D);
    add(p + "wv", L.wv, KV * D);
    add(p + "wo", L.wo, D * Q);
    add(p + "ffn_norm", L.ffn_norm, D);
    add(p + "w1", L.w1, H * D);
    add(p + "w2", L.w2, D * H);
    add(p + "w3", L.w3, H * D);
  }
  add("final_norm", m.final_norm, D);
  add("classifier", m.classifier, V * D);
  return out;
}

void expect_same_config(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.hidden_dim, b.hidden_dim);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.num_heads, b.num_heads);
  EXPECT_EQ(a.num_heads_kv, b.num_heads_kv);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.seq_len, b.seq_len);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.shared_classifier, b.shared_classifier);
  EXPECT_FLOAT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_FLOAT_EQ(a.norm_eps, b.norm_eps);
}

}  // namespace

TEST(Llama2c, ShippedModelHeader) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  Model m = load_model(model_path());
  EXPECT_EQ(m.format, CheckpointFormat::llama2c_legacy);
  EXPECT_EQ(m.config.dim, 64);
  EXPECT_EQ(m.config.hidden_dim, 172);
  EXPECT_EQ(m.config.n_layers, 4);
  EXPECT_EQ(m.config.num_heads, 4);
  EXPECT_EQ(m.config.num_heads_kv, 4);
  EXPECT_EQ(m.config.head_dim, 16);
  EXPECT_EQ(m.config.vocab_size, 512);
  EXPECT_EQ(m.config.seq_len, 128);
  EXPECT_TRUE(m.config.shared_classifier);
  EXPECT_EQ(m.classifier, m.token_embedding);
  // Memory-mapped: the embedding points right after the 28-byte header of the file image.
  auto bytes = read_bytes(model_path());
  EXPECT_EQ(std::memcmp(m.token_embedding, bytes.data() + 28, 64 * sizeof(float)), 0);
}

TEST(Llama2c, V1RoundTripIsBitExact) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  Model a = load_model(model_path());
  const std::string p = temp_path("v1.bin");
  write_llama2c_v1(a, p);
  Model b = load_model(p);
  EXPECT_EQ(b.format, CheckpointFormat::llama2c_v1);
  expect_same_config(a.config, b.config);
  auto wa = all_weights(a), wb = all_weights(b);
  ASSERT_EQ(wa.size(), wb.size());
  for (std::size_t i = 0; i < wa.size(); ++i) EXPECT_EQ(wa[i].second, wb[i].second) << wa[i].first;
}

TEST(Gguf, F32RoundTripIsBitExactWithVocabulary) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  Model a = load_model(model_path());
  Tokenizer tok = Tokenizer::load_llama2c(tokenizer_path(), a.config.vocab_size);
  const std::string p = temp_path("f32.gguf");
  write_gguf(a, tok, p, GgufType::f32);
  Model b = load_model(p);
  EXPECT_EQ(b.format, CheckpointFormat::gguf);
  expect_same_config(a.config, b.config);
  auto wa = all_weights(a), wb = all_weights(b);
  for (std::size_t i = 0; i < wa.size(); ++i) EXPECT_EQ(wa[i].second, wb[i].second) << wa[i].first;
  ASSERT_TRUE(b.embedded_tokenizer);
  ASSERT_EQ(b.embedded_tokenizer->vocab_size(), tok.vocab_size());
  for (int32_t i = 0; i < tok.vocab_size(); ++i) {
    EXPECT_EQ(b.embedded_tokenizer->piece(i), tok.piece(i)) << i;
    EXPECT_EQ(b.embedded_tokenizer->score(i), tok.score(i)) << i;
  }
  EXPECT_EQ(b.embedded_tokenizer->bos_id(), 1);
  EXPECT_EQ(b.embedded_tokenizer->eos_id(), 2);
}

TEST(Gguf, HalfAndQ8RoundTripsWithinFormatBounds) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  Model a = load_model(model_path());
  Tokenizer tok = Tokenizer::load_llama2c(tokenizer_path(), a.config.vocab_size);
  auto wa = all_weights(a);
  for (GgufType t : {GgufType::f16, GgufType::bf16, GgufType::q8_0}) {
    const std::string p = temp_path("t" + std::to_string(static_cast<int>(t)) + ".gguf");
    write_gguf(a, tok, p, t);
    Model b = load_gguf(p);
    auto wb = all_weights(b);
    for (std::size_t i = 0; i < wa.size(); ++i) {
      const auto& x = wa[i].second;
      const auto& y = wb[i].second;
      ASSERT_EQ(x.size(), y.size());
      const bool is_norm = wa[i].first.find("norm") != std::string::npos;
      // q8_0 falls back to f16 for matrices whose rows (in_features) are not a multiple of 32 (w2: 172).
      const bool q8_fallback = t == GgufType::q8_0 && wa[i].first.find("w2") != std::string::npos;
      for (std::size_t j = 0; j < x.size(); ++j) {
        float expect = x[j];
        if (!is_norm && (t == GgufType::f16 || q8_fallback)) expect = fp16_to_float(float_to_fp16(x[j]));
        if (!is_norm && t == GgufType::bf16) expect = bf16_to_float(float_to_bf16(x[j]));
        if (!is_norm && t == GgufType::q8_0 && !q8_fallback) {
          // |error| <= d/2 (+ fp16 rounding of d) with d = amax/127 of the 32-block.
          const std::size_t b0 = j / 32 * 32;
          float amax = 0.0f;
          for (std::size_t k = b0; k < b0 + 32; ++k) amax = std::max(amax, std::fabs(x[k]));
          const float d = fp16_to_float(float_to_fp16(amax / 127.0f));
          ASSERT_LE(std::fabs(y[j] - x[j]), 0.5f * d + 127.0f * std::fabs(d - amax / 127.0f) + 1e-7f)
              << wa[i].first << "[" << j << "]";
          continue;
        }
        ASSERT_EQ(y[j], expect) << wa[i].first << "[" << j << "]";
      }
    }
  }
}

// ---- corrupt files ----------------------------------------------------------------------------------------------

TEST(Corrupt, MissingFileIsIoError) {
  EXPECT_THROW(load_model(model_dir() + "/does-not-exist.bin"), IoError);
  EXPECT_THROW(Tokenizer::load_llama2c(model_dir() + "/nope.tok", 512), IoError);
}

TEST(Corrupt, TruncatedLlama2cAtEveryRegion) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  auto bytes = read_bytes(model_path());
  for (std::size_t n : {std::size_t{0}, std::size_t{3}, std::size_t{27}, std::size_t{28}, std::size_t{1000},
                        bytes.size() / 2, bytes.size() - 4, bytes.size() - 1}) {
    std::vector<uint8_t> b(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(load_llama2c_from_bytes(b), IoError) << "prefix " << n;
  }
  auto longer = bytes;
  longer.push_back(0);
  EXPECT_THROW(load_llama2c_from_bytes(longer), IoError);
}

TEST(Corrupt, BadLlama2cHeaders) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  auto bytes = read_bytes(model_path());
  auto patched = [&](int field, int32_t value) {
    auto b = bytes;
    std::memcpy(b.data() + 4 * field, &value, 4);
    return b;
  };
  EXPECT_THROW(load_llama2c_from_bytes(patched(3, 3)), IoError);    // n_heads 3 does not divide dim 64
  EXPECT_THROW(load_llama2c_from_bytes(patched(4, 3)), IoError);    // n_kv_heads 3 does not divide n_heads 4
  EXPECT_THROW(load_llama2c_from_bytes(patched(0, -64)), IoError);  // negative dim
  EXPECT_THROW(load_llama2c_from_bytes(patched(5, INT32_MIN)), IoError);
  EXPECT_THROW(load_llama2c_from_bytes(patched(2, 1 << 30)), IoError);  // absurd layer count
  EXPECT_THROW(load_llama2c_from_bytes(patched(5, -512)), IoError);     // unshared classifier: size mismatch
  // Version 2 (int8) of the versioned format is not supported: clear error.
  Model a = load_model(model_path());
  const std::string p = temp_path("v1c.bin");
  write_llama2c_v1(a, p);
  auto v1 = read_bytes(p);
  auto v2 = v1;
  v2[4] = 2;
  EXPECT_THROW(load_llama2c_from_bytes(v2), IoError);
  auto bad_flag = v1;
  bad_flag[36] = 7;
  EXPECT_THROW(load_llama2c_from_bytes(bad_flag), IoError);
  v1.resize(v1.size() - 8);
  EXPECT_THROW(load_llama2c_from_bytes(v1), IoError);
}

TEST(Corrupt, GgufTruncatedAndPatched) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  Model a = load_model(model_path());
  Tokenizer tok = Tokenizer::load_llama2c(tokenizer_path(), a.config.vocab_size);
  const std::string p = temp_path("c.gguf");
  write_gguf(a, tok, p, GgufType::q8_0);
  auto bytes = read_bytes(p);
  ASSERT_NO_THROW(load_gguf_from_bytes(bytes));
  for (std::size_t n : {std::size_t{0}, std::size_t{4}, std::size_t{8}, std::size_t{23}, std::size_t{100},
                        std::size_t{5000}, bytes.size() / 2, bytes.size() - 1})
    EXPECT_THROW(load_gguf_from_bytes({bytes.data(), n}), IoError) << "prefix " << n;
  auto bad_magic = bytes;
  bad_magic[0] = 'X';
  EXPECT_THROW(load_gguf_from_bytes(bad_magic), IoError);
  auto bad_version = bytes;
  bad_version[4] = 2;
  EXPECT_THROW(load_gguf_from_bytes(bad_version), IoError);
  // Unknown tensor type: patch the type field of the first tensor info (token_embd: q8_0 = 8 → 2 = Q4_0).
  const std::string name = "token_embd.weight";
  auto it = std::search(bytes.begin(), bytes.end(), name.begin(), name.end());
  ASSERT_NE(it, bytes.end());
  const std::size_t type_off = static_cast<std::size_t>(it - bytes.begin()) + name.size() + 4 + 2 * 8;
  ASSERT_EQ(bytes[type_off], 8);
  auto bad_type = bytes;
  bad_type[type_off] = 2;
  EXPECT_THROW(load_gguf_from_bytes(bad_type), IoError);
  // Head count that does not divide: patch llama.attention.head_count (u32 after its key and type).
  const std::string key = "llama.attention.head_count";
  auto kt = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
  ASSERT_NE(kt, bytes.end());
  auto bad_heads = bytes;
  const std::size_t val_off = static_cast<std::size_t>(kt - bytes.begin()) + key.size() + 4;
  ASSERT_EQ(bad_heads[val_off], 4);
  bad_heads[val_off] = 3;
  EXPECT_THROW(load_gguf_from_bytes(bad_heads), IoError);
}

TEST(Corrupt, RandomByteFlipsNeverCrash) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  Model a = load_model(model_path());
  Tokenizer tok = Tokenizer::load_llama2c(tokenizer_path(), a.config.vocab_size);
  const std::string p = temp_path("r.gguf");
  write_gguf(a, tok, p, GgufType::f16);
  const auto gguf = read_bytes(p);
  const auto legacy = read_bytes(model_path());
  std::mt19937_64 rng(test_seed());
  int errors = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const bool g = trial % 2 == 0;
    auto b = g ? gguf : legacy;
    const std::size_t header = g ? 12000 : 28;  // flip inside the metadata / header region
    for (int f = 0; f < 3; ++f) b[rng() % header] ^= static_cast<uint8_t>(1u << (rng() % 8));
    try {
      if (g) load_gguf_from_bytes(b); else load_llama2c_from_bytes(b);
    } catch (const IoError&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 0);
}

TEST(Corrupt, TokenizerFiles) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  auto bytes = read_bytes(tokenizer_path());
  EXPECT_NO_THROW(Tokenizer::from_llama2c_bytes(bytes, 512));
  EXPECT_THROW(Tokenizer::from_llama2c_bytes(bytes, 513), IoError);  // vocab mismatch: truncated
  EXPECT_THROW(Tokenizer::from_llama2c_bytes(bytes, 511), IoError);  // vocab mismatch: trailing bytes
  EXPECT_THROW(Tokenizer::from_llama2c_bytes({bytes.data(), 100}, 512), IoError);
  auto bad_len = bytes;
  const int32_t huge = 1 << 20;
  std::memcpy(bad_len.data() + 8, &huge, 4);  // length of piece 0
  EXPECT_THROW(Tokenizer::from_llama2c_bytes(bad_len, 512), IoError);
  EXPECT_THROW(Tokenizer::from_llama2c_bytes(bytes, 0), Error);
}
