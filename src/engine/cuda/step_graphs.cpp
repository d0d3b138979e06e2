// Decode-step buckets and their CUDA graphs (step_graphs.hpp).
#include "engine/cuda/step_graphs.hpp"

#include <algorithm>
#include <exception>

#include "core/path_log.hpp"
#include "cuda/check.hpp"

namespace flashkv::engine_cuda {

std::string StepKey::describe() const {
  return "batch " + std::to_string(batch) + ", page-table stride " + std::to_string(stride) + ", splits " +
         std::to_string(splits);
}

StepBucket* StepGraphs::find(const StepKey& key) {
  for (auto& b : buckets_) {
    if (b->key == key) {
      b->last_use = ++clock_;
      return b.get();
    }
  }
  return nullptr;
}

StepBucket& StepGraphs::add(const StepKey& key, DecodePlan plan) {
  if (buckets_.size() >= kMaxBuckets) {
    auto lru = std::min_element(buckets_.begin(), buckets_.end(),
                                [](const auto& a, const auto& b) { return a->last_use < b->last_use; });
    if ((*lru)->exec != nullptr) {
      cudaGraphExecDestroy((*lru)->exec);  // an in-flight replay completes first (freed asynchronously)
      ++stats_.evictions;
    }
    buckets_.erase(lru);  // its plan's workspace is freed in stream order (cudaFreeAsync)
  }
  auto b = std::make_unique<StepBucket>();
  b->key = key;
  b->plan = std::move(plan);
  b->last_use = ++clock_;
  buckets_.push_back(std::move(b));
  return *buckets_.back();
}

bool StepGraphs::capture(StepBucket& b, cudaStream_t stream, const std::function<void()>& issue) {
  std::string err;
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) {
    err = std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(e);
  } else {
    try {
      issue();
    } catch (const std::exception& x) {
      err = x.what();
    }
    e = cudaStreamEndCapture(stream, &graph);  // always: ends (or discards) the capture
    if (err.empty() && e != cudaSuccess) err = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(e);
  }
  if (err.empty()) {
    e = cudaGraphInstantiate(&b.exec, graph, 0);
    if (e != cudaSuccess) {
      err = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(e);
      b.exec = nullptr;
    }
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (!err.empty()) {
    (void)cudaGetLastError();  // the capture's errors are not sticky; the stream is usable again
    ++b.failed_captures;
    ++stats_.capture_failures;
    stats_.last_capture_error = err;
    core::record_path("engine cuda decode: graph capture FAILED (" + b.key.describe() + "): " + err +
                      (b.failed_captures < kMaxCaptureFailures ? "; this step runs eagerly, the capture is retried"
                                                               : "; this bucket runs eagerly from now on"));
    return false;
  }
  ++stats_.captures;
  core::record_path("engine cuda decode: graph captured (" + b.key.describe() + "; " + b.plan.path() + ")");
  return true;
}

void StepGraphs::launch(StepBucket& b, cudaStream_t stream) {
  cuda::check_cuda(cudaGraphLaunch(b.exec, stream), "engine: decode step graph launch");
  ++stats_.graph_steps;
}

void StepGraphs::clear() {
  for (auto& b : buckets_)
    if (b->exec != nullptr) cudaGraphExecDestroy(b->exec);
  buckets_.clear();
}

CudaGraphStats StepGraphs::stats() const {
  CudaGraphStats s = stats_;
  s.graphs = static_cast<int32_t>(std::count_if(buckets_.begin(), buckets_.end(),
                                                [](const auto& b) { return b->exec != nullptr; }));
  return s;
}

}  // namespace flashkv::engine_cuda
