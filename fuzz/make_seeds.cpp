// Writes small valid seed inputs for the fuzz targets (built and run by scripts/fuzz):
//   <dir>/llama2c/{legacy,v1}.bin, <dir>/gguf/{f32,f16,bf16,q8_0}.gguf, <dir>/tokenizer/tok.bin
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "flashkv/engine.hpp"

using namespace flashkv;

static Model tiny(int32_t dim, int32_t hidden, int32_t vocab) {
  Model m;
  ModelConfig& c = m.config;
  c.dim = dim; c.hidden_dim = hidden; c.n_layers = 1; c.num_heads = 2; c.num_heads_kv = 1; c.vocab_size = vocab;
  c.seq_len = 8; c.head_dim = dim / 2; c.shared_classifier = true;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  auto make = [&](std::size_t n) {
    std::unique_ptr<float[]> p(new float[n]);
    for (std::size_t i = 0; i < n; ++i) p[i] = nd(rng);
    m.owned.push_back(std::move(p));
    return m.owned.back().get();
  };
  const std::size_t D = dim, H = hidden, V = vocab, KV = c.kv_dim();
  m.token_embedding = make(V * D);
  m.layers.resize(1);
  auto& L = m.layers[0];
  L.attn_norm = make(D); L.wq = make(D * D); L.wk = make(KV * D); L.wv = make(KV * D); L.wo = make(D * D);
  L.ffn_norm = make(D); L.w1 = make(H * D); L.w2 = make(D * H); L.w3 = make(H * D);
  m.final_norm = make(D);
  m.classifier = m.token_embedding;
  return m;
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  for (const char* sub : {"llama2c", "gguf", "tokenizer"}) std::filesystem::create_directories(dir + "/" + sub);
  std::vector<std::string> pieces = {"<unk>", "<s>", "</s>", " ", "a", "b", "ab", " ab", "<0x41>", "\xC3\xA9"};
  std::vector<float> scores = {0, 0, 0, -1, -2, -3, 4, 5, 0, -6};
  Tokenizer tok(pieces, scores);
  tok.write_llama2c(dir + "/tokenizer/tok.bin");
  Model small = tiny(4, 6, 10);
  write_llama2c_v1(small, dir + "/llama2c/v1.bin");
  {  // legacy: header + weights in llama2.c order + freq_cis
    std::ofstream f(dir + "/llama2c/legacy.bin", std::ios::binary);
    const auto& c = small.config;
    int32_t h[7] = {c.dim, c.hidden_dim, c.n_layers, c.num_heads, c.num_heads_kv, c.vocab_size, c.seq_len};
    f.write(reinterpret_cast<const char*>(h), sizeof h);
    auto put = [&](const float* p, std::size_t n) { f.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(4 * n)); };
    const auto& L = small.layers[0];
    const std::size_t D = c.dim, H = c.hidden_dim, KV = c.kv_dim();
    put(small.token_embedding, c.vocab_size * D); put(L.attn_norm, D); put(L.wq, D * D); put(L.wk, KV * D);
    put(L.wv, KV * D); put(L.wo, D * D); put(L.ffn_norm, D); put(L.w1, H * D); put(L.w2, D * H); put(L.w3, H * D);
    put(small.final_norm, D);
    std::vector<float> freq(static_cast<std::size_t>(c.seq_len) * c.head_dim, 0.0f);
    put(freq.data(), freq.size());
  }
  write_gguf(small, tok, dir + "/gguf/f32.gguf", GgufType::f32);
  write_gguf(small, tok, dir + "/gguf/f16.gguf", GgufType::f16);
  write_gguf(small, tok, dir + "/gguf/bf16.gguf", GgufType::bf16);
  write_gguf(tiny(32, 32, 10), tok, dir + "/gguf/q8_0.gguf", GgufType::q8_0);
  for (const char* p : {"/llama2c/legacy.bin", "/llama2c/v1.bin"}) load_llama2c(dir + p);  // seeds must be valid
  for (const char* p : {"/gguf/f32.gguf", "/gguf/q8_0.gguf"}) load_gguf(dir + p);
  std::printf("seeds written to %s\n", dir.c_str());
  return 0;
}
