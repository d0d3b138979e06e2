// The CUDA graphs of the engine's decode steps (EngineOptions::cuda_graphs, docs/engine.md "CUDA engine").
//
// A decode step's launches depend on the host only through its bucket, StepKey = (batch, page-table stride, split
// count): every per-step value — token ids, positions, lengths before the append, cu_seqlens_q, page table — is read
// by the kernels from the engine's device tables, which are re-uploaded before each step (kvcache/api/
// cache_step.hpp says why a plan made for one step of a bucket runs every other step of it exactly as a fresh plan
// would). So one bucket = one decode plan (made at its first step) and, with graphs on, one executable graph captured
// from the same launches the eager path makes: replaying it computes bit for bit what launching them would.
//
// Buckets are captured on first sight and kept (least recently used dropped beyond kMaxBuckets). A capture that fails
// (a CUDA / cuBLAS call refused under capture, another thread's device-wide synchronization) runs that step eagerly and
// is retried on the bucket's next steps, at most kMaxCaptureFailures times in all; every failure is counted in
// CudaGraphStats (capture_failures, last_capture_error) and printed with FLASHKV_LOG=1; never silent.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "flashkv/decode.hpp"
#include "flashkv/engine.hpp"

namespace flashkv::engine_cuda {

struct StepKey {
  int32_t batch = 0;
  int64_t stride = 0;  ///< page-table row stride (pages)
  int32_t splits = 0;  ///< split-KV count of the decode plan
  bool operator==(const StepKey& o) const { return batch == o.batch && stride == o.stride && splits == o.splits; }
  std::string describe() const;
};

/// One bucket: the decode plan of its steps and, once captured, the executable graph of the whole step.
struct StepBucket {
  StepKey key;
  DecodePlan plan;
  cudaGraphExec_t exec = nullptr;
  int32_t failed_captures = 0;  ///< after kMaxCaptureFailures the bucket stays eager
  uint64_t last_use = 0;
};

class StepGraphs {
 public:
  static constexpr size_t kMaxBuckets = 64;
  /// A bucket whose capture failed is retried on its next steps (another thread's device-wide synchronization can
  /// invalidate a capture), until it has failed this many times.
  static constexpr int32_t kMaxCaptureFailures = 3;
  explicit StepGraphs(bool enabled) : enabled_(enabled) {}
  ~StepGraphs() { clear(); }
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  bool enabled() const { return enabled_; }
  /// The bucket of `key` (marked used), or nullptr.
  StepBucket* find(const StepKey& key);
  /// Adds the bucket of `key` with its plan, dropping the least recently used one beyond kMaxBuckets.
  StepBucket& add(const StepKey& key, DecodePlan plan);
  /// Whether `b` should be captured now: graphs on, not captured yet, fewer than kMaxCaptureFailures failures.
  bool wants_capture(const StepBucket& b) const {
    return enabled_ && b.exec == nullptr && b.failed_captures < kMaxCaptureFailures;
  }
  /// Captures `issue` (the step's launches on `stream`, which must be idle of other captures) into b.exec and
  /// instantiates it. False when any part fails: the failure counted, the reason recorded and logged, the CUDA error
  /// state cleared; nothing was executed (a captured stream runs nothing), so the caller runs the step eagerly.
  bool capture(StepBucket& b, cudaStream_t stream, const std::function<void()>& issue);
  /// Replays b.exec on `stream`.
  void launch(StepBucket& b, cudaStream_t stream);
  /// Destroys every bucket (graphs and plans).
  void clear();

  CudaGraphStats stats() const;
  void count_eager() { ++stats_.eager_steps; }

 private:
  bool enabled_;
  std::vector<std::unique_ptr<StepBucket>> buckets_;
  uint64_t clock_ = 0;
  CudaGraphStats stats_;
};

}  // namespace flashkv::engine_cuda
