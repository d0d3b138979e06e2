// Internal helpers shared by the loaders.
#pragma once

#include <string>

namespace flashkv::engine_detail {

/// Upper bounds that keep every size computation far from overflow (and reject garbage headers early).
constexpr int64_t kMaxDim = 1 << 16;
constexpr int64_t kMaxHidden = 1 << 18;
constexpr int64_t kMaxLayers = 1 << 10;
constexpr int64_t kMaxVocab = 1 << 22;
constexpr int64_t kMaxSeqLen = 1 << 22;
constexpr int64_t kMaxHeads = 1 << 12;

}  // namespace flashkv::engine_detail
