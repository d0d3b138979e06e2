// libFuzzer target: llama2.c checkpoints (legacy and "ak42" v1). Any input must either load (and every weight be
// readable) or raise flashkv::IoError — never crash, hang or read out of bounds.
#include <cstdint>

#include "flashkv/error.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    flashkv::Model m = flashkv::load_llama2c_from_bytes({data, size});
    volatile float s = flashkv::fuzz::touch_model(m);
    (void)s;
  } catch (const flashkv::IoError&) {
  }
  return 0;
}
