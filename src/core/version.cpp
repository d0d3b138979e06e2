#include "flashkv/attention.hpp"

namespace flashkv {
const char* version() { return FLASHKV_VERSION_STRING; }
}  // namespace flashkv
