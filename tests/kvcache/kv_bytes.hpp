// Every byte and every piece of bookkeeping of a PagedKVCache (host or device), for "the same cache" checks: the
// code and metadata pools, each sequence's window buffer, page list and lengths, and the free list (through the
// library's internal kv::CacheAccess).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashkv/kvcache.hpp"
#include "kvcache/cache/cache_impl.hpp"

namespace kvtest {

struct CacheBytes {
  std::vector<uint8_t> codes, meta;
  struct Seq {
    int64_t id = 0;
    std::vector<int32_t> pages;
    std::vector<int64_t> n, nq;
    std::vector<uint8_t> window;
    bool operator==(const Seq&) const = default;
  };
  std::vector<Seq> seqs;
  std::vector<int32_t> free_list;
  bool operator==(const CacheBytes&) const = default;

  /// First difference, for a failure message ("" when equal).
  std::string diff(const CacheBytes& o) const {
    auto first = [](const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) -> std::string {
      if (a.size() != b.size()) return "sizes " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
      for (size_t i = 0; i < a.size(); ++i)
        if (a[i] != b[i]) return "byte " + std::to_string(i) + ": " + std::to_string(a[i]) + " vs " + std::to_string(b[i]);
      return "";
    };
    if (std::string d = first(codes, o.codes); !d.empty()) return "codes " + d;
    if (std::string d = first(meta, o.meta); !d.empty()) return "metadata " + d;
    if (seqs.size() != o.seqs.size()) return "sequence counts";
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (seqs[i].pages != o.seqs[i].pages) return "pages of sequence " + std::to_string(seqs[i].id);
      if (seqs[i].n != o.seqs[i].n || seqs[i].nq != o.seqs[i].nq) return "lengths of sequence " + std::to_string(seqs[i].id);
      if (std::string d = first(seqs[i].window, o.seqs[i].window); !d.empty())
        return "window of sequence " + std::to_string(seqs[i].id) + ": " + d;
    }
    if (free_list != o.free_list) return "free lists";
    return "";
  }
};

inline CacheBytes cache_bytes(const flashkv::PagedKVCache& c) {
  const flashkv::PagedKVCache::Impl& m = flashkv::kv::CacheAccess::impl(c);
  CacheBytes b;
  b.codes.resize(static_cast<size_t>(m.codes.bytes()));
  m.codes.read(0, b.codes.data(), m.codes.bytes());
  b.meta.resize(static_cast<size_t>(m.meta.bytes()));
  m.meta.read(0, b.meta.data(), m.meta.bytes());
  for (const auto& [id, s] : m.seqs) {
    CacheBytes::Seq q;
    q.id = id;
    q.pages = s.pages;
    q.n = s.n;
    q.nq = s.nq;
    q.window.resize(static_cast<size_t>(s.win.bytes()));
    s.win.read(0, q.window.data(), s.win.bytes());
    b.seqs.push_back(std::move(q));
  }
  b.free_list = m.free_list;
  return b;
}

}  // namespace kvtest
