// What an Engine (include/flashkv/engine.hpp) runs on: the CPU backend (engine.cpp) or the CUDA backend
// (src/engine/cuda/, built with FLASHKV_CUDA=ON, registered at static-initialization time through
// register_cuda_engine()). The Engine validates every argument, the sequence ids and the page budget first; a backend
// then only computes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "flashkv/engine.hpp"
#include "flashkv/kvcache.hpp"
#include "flashkv/model.hpp"
#include "flashkv/sampler.hpp"

namespace flashkv::engine_detail {

/// A run of `n` consecutive tokens of sequence `seq` starting at position `pos0`; rows [row0, row0 + n) of a call.
struct Segment {
  int32_t seq, pos0, n, row0;
};

class EngineBackend {
 public:
  virtual ~EngineBackend() = default;
  /// The backend's KV cache (host or device memory); sequence ids are the Engine's.
  virtual PagedKVCache& cache() = 0;
  virtual const PagedKVCache& cache() const = 0;
  /// The forward pass over all rows of `segs` (tokens [total rows] in row order, ids already checked). fresh: one
  /// segment at position 0 attended with attention_forward over its un-quantized K/V before they go into the cache;
  /// otherwise every segment's K/V are appended first and its rows attend over the cache (causal, bottom-right).
  /// Then the logits [rows, vocab] float32 of rows [first, first + rows) are computed and kept for sample(); copied
  /// into logits_out when it is non-empty (its size is checked by the Engine).
  virtual void run(std::span<const Segment> segs, std::span<const int32_t> tokens, bool fresh, int32_t first,
                   int32_t rows, std::span<float> logits_out) = 0;
  /// One token per kept logit row [row0, row0 + samplers.size()), row row0 + i with samplers[i] (rows checked by the
  /// Engine). See Engine::sample.
  virtual std::vector<int32_t> sample(std::span<Sampler* const> samplers, int32_t row0) = 0;
  /// Appends `n` tokens of synthetic K/V (synthetic_kv.hpp) at positions pos0 .. pos0 + n − 1 to every layer of `seq`
  /// (pages already checked by the Engine). This default stages them on the host (float32) and appends them with
  /// PagedKVCache::append — every cache, host or device; a backend may stage them on its device instead.
  virtual void append_synthetic(int32_t seq, int32_t pos0, int32_t n, uint64_t seed);
  /// Frees a sequence's pages (the Engine checked the id). The CUDA backend first waits for its enqueued work (no step
  /// still reads them) and orders its later work after the cache's own device work (the 0xFF fill of the freed pages),
  /// so the next step may reuse them.
  virtual void remove_sequence(int32_t seq) { cache().remove_sequence(seq); }
  virtual CudaGraphStats cuda_graph_stats() const { return {}; }
};

/// Builds the CUDA backend for `model` with a device cache of `cache_config` (device already set to cuda) for up to
/// `max_sequences` sequences of up to `context` tokens. Throws UnsupportedError for what the device cannot run.
using CudaEngineFactory = std::unique_ptr<EngineBackend> (*)(const Model& model, const KVCacheConfig& cache_config,
                                                             int32_t context, int32_t max_sequences,
                                                             const EngineOptions& options);
/// Registers the CUDA backend's factory (the CUDA engine layer does, from a static initializer).
void register_cuda_engine(CudaEngineFactory factory);
/// The registered factory, or nullptr in a build without the CUDA engine.
CudaEngineFactory cuda_engine_factory();

/// RoPE tables of the interleaved-pair convention (model.hpp): cos / sin [context, head_dim / 2] of the angle
/// pos · rope_theta^(−2i/head_dim), computed in double and rounded to float. Shared by both backends so that they
/// rotate with the same float32 factors.
void rope_tables(const ModelConfig& c, int32_t context, std::vector<float>& cos_out, std::vector<float>& sin_out);

}  // namespace flashkv::engine_detail
