// Every byte and every piece of bookkeeping of a PagedKVCache (host or device), for "the same cache" checks: the
// code and metadata pools, each sequence's window buffer, page list and lengths, and the free list (through the
// library's internal kv::CacheAccess).
#pragma once

#include <algorithm>
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

/// cache_bytes with every code and metadata byte that no cached token owns set to 0: what a reader of the cache can
/// observe (decode reads slots < nq of each sequence's pages, and the metadata units holding them). A device append
/// that throws on a bad value may leave its other rows in the slots past the lengths (kvcache.md, "Appends"); those
/// bytes are not compared here.
inline CacheBytes visible_cache_bytes(const flashkv::PagedKVCache& c) {
  const flashkv::PagedKVCache::Impl& m = flashkv::kv::CacheAccess::impl(c);
  CacheBytes all = cache_bytes(c);
  CacheBytes v = all;
  std::fill(v.codes.begin(), v.codes.end(), uint8_t{0});
  std::fill(v.meta.begin(), v.meta.end(), uint8_t{0});
  const int32_t P = m.cfg.page_size;
  for (const auto& [id, s] : m.seqs) {
    for (int32_t layer = 0; layer < m.cfg.num_layers; ++layer) {
      const int64_t nq = s.nq[static_cast<size_t>(layer)];
      for (int64_t t = 0; t < nq; ++t) {
        const int32_t page = s.pages[static_cast<size_t>(t / P)], slot = static_cast<int32_t>(t % P);
        for (int half = 0; half < 2; ++half) {
          const flashkv::kv::KVHalfFormat& f = m.codec(half).format();
          for (int32_t h = 0; h < m.cfg.num_heads_kv; ++h) {
            const int64_t co = m.geom.code_offset(page, layer, half, h, slot);
            std::copy_n(all.codes.begin() + co, m.geom.code_bytes[half], v.codes.begin() + co);
            if (m.geom.meta_bytes_per_page_head[half] > 0) {
              const int64_t mo = m.geom.meta_offset(page, layer, half, h) + f.meta_offset(slot);
              std::copy_n(all.meta.begin() + mo, f.meta_bytes_per_unit, v.meta.begin() + mo);
            }
          }
        }
      }
    }
  }
  return v;
}

}  // namespace kvtest
