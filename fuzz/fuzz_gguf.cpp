// libFuzzer target: GGUF v3 files (metadata, tensor infos, F32/F16/BF16/Q8_0 data, embedded vocabulary). Any input
// must load or raise flashkv::IoError; a loaded vocabulary must encode/decode without crashing.
#include <cstdint>

#include "flashkv/error.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    flashkv::Model m = flashkv::load_gguf_from_bytes({data, size});
    volatile float s = flashkv::fuzz::touch_model(m);
    (void)s;
    if (m.embedded_tokenizer) {
      auto ids = m.embedded_tokenizer->encode("fuzz \xC3\xA9 text", true, true);
      volatile size_t n = m.embedded_tokenizer->decode(ids).size();
      (void)n;
    }
  } catch (const flashkv::IoError&) {
  }
  return 0;
}
