// CPU decode-attention benchmark over the quantized paged KV cache (Google Benchmark).
//
// One decode step (1 query token, 32 query heads, 8 KV heads, head_dim 128, batch 1, one layer) against a cache of
// 4k–32k tokens stored as bf16 / fp8 / int8 / int4 / int4-KIVI / int2-KIVI. Reports time per token (the step) and the
// cache bytes read per step; ratios vs bf16 are computed by bench/results/cpu-decode-*.md.
//
//   build/<dir>/bin/bench_kv_decode --benchmark_format=json --benchmark_out=bench/results/cpu-decode-<date>.json
//   env: FLASHKV_BENCH_CONTEXTS="4096,8192,16384,32768"  FLASHKV_BENCH_PAGE_SIZE=64  FLASHKV_BENCH_THREADS=0 (all)
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "flashkv/diagnostics.hpp"
#include "flashkv/kvcache.hpp"

namespace {

constexpr int32_t kHeadsKV = 8, kHeads = 32, kHeadDim = 128;

int32_t num_threads() {
  const char* e = std::getenv("FLASHKV_BENCH_THREADS");
  return e ? std::atoi(e) : 0;
}

int32_t page_size() {
  const char* e = std::getenv("FLASHKV_BENCH_PAGE_SIZE");
  return e ? std::atoi(e) : 64;
}

std::vector<int64_t> contexts() {
  const char* e = std::getenv("FLASHKV_BENCH_CONTEXTS");
  std::vector<int64_t> v;
  std::stringstream ss(e ? e : "4096,8192,16384,32768");
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoll(item));
  return v;
}

void BM_decode(benchmark::State& state, const std::string& dtype) {
  const int64_t ctx = state.range(0);
  flashkv::KVCacheConfig cfg;
  cfg.num_layers = 1;
  cfg.num_heads_kv = kHeadsKV;
  cfg.head_dim = kHeadDim;
  cfg.page_size = page_size();
  cfg.with_kv_cache_dtype(dtype);
  cfg.capacity_pages = ctx / cfg.page_size + 2;
  flashkv::PagedKVCache cache(cfg);
  cache.add_sequence(0);
  std::mt19937 g(1234);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  const int64_t chunk = 1024;
  std::vector<float> k(static_cast<size_t>(chunk * kHeadsKV * kHeadDim)), v(k.size());
  for (int64_t t = 0; t < ctx; t += chunk) {
    const int64_t m = std::min(chunk, ctx - t);
    for (auto& x : k) x = n01(g);
    for (auto& x : v) x = n01(g);
    cache.append(0, 0, flashkv::TensorView::contiguous(k.data(), flashkv::DType::float32, {m, kHeadsKV, kHeadDim}),
                 flashkv::TensorView::contiguous(v.data(), flashkv::DType::float32, {m, kHeadsKV, kHeadDim}));
  }
  std::vector<float> q(static_cast<size_t>(kHeads * kHeadDim)), out(q.size());
  for (auto& x : q) x = n01(g);
  const int64_t ids[] = {0};
  const int32_t cu[] = {0, 1};
  const auto qv = flashkv::TensorView::contiguous(q.data(), flashkv::DType::float32, {1, kHeads, kHeadDim});
  const auto ov = flashkv::TensorView::contiguous(out.data(), flashkv::DType::float32, {1, kHeads, kHeadDim});
  flashkv::KVAttentionOptions opt;
  opt.num_threads = num_threads();
  for (auto _ : state) {
    cache.attention(ids, cu, 0, qv, ov, nullptr, opt);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  const flashkv::KVMemoryReport r = cache.memory_report();
  state.counters["context"] = static_cast<double>(ctx);
  state.counters["cache_bytes"] = static_cast<double>(r.total_bytes);
  state.counters["bits_per_element"] = r.bits_per_element;
  state.counters["bytes_per_second"] =
      benchmark::Counter(static_cast<double>(r.total_bytes), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(dtype + " [" + flashkv::last_kernel_path() + "]");  // the kernel path taken (issue 10 item 4)
}

}  // namespace

int main(int argc, char** argv) {
  for (const char* dtype : {"bf16", "fp8_e4m3", "fp8_e4m3_dynamic", "int8", "int4", "int4_kivi", "int2_kivi"}) {
    auto* b = benchmark::RegisterBenchmark((std::string("decode/") + dtype).c_str(), BM_decode, std::string(dtype));
    for (int64_t c : contexts()) b->Arg(c);
    b->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
