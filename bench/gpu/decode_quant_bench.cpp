// Timing helper of bench/gpu/bench_decode_quant.py (issue #12): device PagedKVCaches per kv_cache_dtype, filled by the
// device append (quantize on write) from random bf16 CUDA tensors — one sequence per call, then every sequence in one
// batched call — then one decode step (plan_decode once per batch
// shape, run_decode timed with CUDA events, L2 flushed before every call) per batch x context; plus the HBM read /
// write anchors of the same run. One JSON object per line on stdout; the Python script turns them into tables.
//
//   flashkv_bench_decode_quant --formats bf16,fp8_e4m3,int8,int4 --batches 1,16,64 --contexts 4096,32768
//                              [--heads 32 --heads-kv 8 --head-dim 128 --page-size 64 --calls 30]
//                              [--splits 0]   (num_splits of each plan, a list: 0 = the heuristic's; for sweeps)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/decode_cuda.hpp"
#include "flashkv/decode.hpp"
#include "flashkv/kvcache.hpp"

namespace {

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t a = 0;
  while (a <= s.size()) {
    const size_t b = s.find(',', a);
    const std::string t = s.substr(a, b == std::string::npos ? std::string::npos : b - a);
    if (!t.empty()) out.push_back(t);
    if (b == std::string::npos) break;
    a = b + 1;
  }
  return out;
}

}  // namespace

// decode_quant_bench_kernels.cu
void bench_fill_bf16(uint16_t* x, int64_t n, uint64_t seed);
void bench_read(const void* x, int64_t bytes, int* sink, int blocks);

namespace {

struct Timer {
  cudaEvent_t a, b;
  Timer() { ok(cudaEventCreate(&a), "event"), ok(cudaEventCreate(&b), "event"); }
  ~Timer() { cudaEventDestroy(a), cudaEventDestroy(b); }
  template <class F>
  double ms(F&& f) {
    ok(cudaEventRecord(a), "record");
    f();
    ok(cudaEventRecord(b), "record");
    ok(cudaEventSynchronize(b), "sync");
    float t = 0;
    ok(cudaEventElapsedTime(&t, a, b), "elapsed");
    return t;
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> formats = {"bf16", "fp8_e4m3", "fp8_e4m3_dynamic", "int8", "int4"};
  std::vector<int64_t> batches = {1, 16, 64}, contexts = {4096, 32768};
  std::vector<int64_t> splits_list = {0};
  int heads = 32, heads_kv = 8, head_dim = 128, page_size = 64, calls = 30;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    auto ints = [&] {
      std::vector<int64_t> r;
      for (const std::string& s : split(v)) r.push_back(std::stoll(s));
      return r;
    };
    if (k == "--formats") formats = split(v);
    else if (k == "--batches") batches = ints();
    else if (k == "--contexts") contexts = ints();
    else if (k == "--heads") heads = std::stoi(v);
    else if (k == "--heads-kv") heads_kv = std::stoi(v);
    else if (k == "--head-dim") head_dim = std::stoi(v);
    else if (k == "--page-size") page_size = std::stoi(v);
    else if (k == "--calls") calls = std::stoi(v);
    else if (k == "--splits") splits_list = ints();
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (!flashkv::cuda::decode_backend_registered()) return 1;  // links the backend's static registration
  const int64_t max_batch = *std::max_element(batches.begin(), batches.end());
  Timer timer;
  // anchors: HBM read (a streaming XOR over 4 GiB) and write (memset of 4 GiB), best of 5
  const int64_t anchor_bytes = int64_t{4} << 30;
  void* big = nullptr;
  int* sink = nullptr;
  ok(cudaMalloc(&big, anchor_bytes), "malloc anchor");
  ok(cudaMalloc(reinterpret_cast<void**>(&sink), 4), "malloc sink");
  ok(cudaMemset(big, 1, anchor_bytes), "memset");
  int sms = 0;
  ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "sms");
  double rd = 1e30, wr = 1e30, cp = 1e30;
  char* half_big = static_cast<char*>(big) + anchor_bytes / 2;
  for (int r = 0; r < 5; ++r) {
    rd = std::min(rd, timer.ms([&] { bench_read(big, anchor_bytes, sink, sms * 8); }));
    wr = std::min(wr, timer.ms([&] { ok(cudaMemsetAsync(big, r, anchor_bytes), "memset"); }));
    cp = std::min(cp, timer.ms([&] {
      ok(cudaMemcpyAsync(half_big, big, anchor_bytes / 2, cudaMemcpyDeviceToDevice), "copy");
    }));
  }
  // copy: bytes read + bytes written of a 2 GiB device-to-device copy per second (the HBM traffic an append makes)
  std::printf("{\"kind\": \"anchor\", \"read_TBps\": %.4f, \"write_TBps\": %.4f, \"copy_TBps\": %.4f}\n",
              anchor_bytes / rd / 1e9, anchor_bytes / wr / 1e9, anchor_bytes / cp / 1e9);
  std::fflush(stdout);
  const int64_t flush_bytes = int64_t{256} << 20;  // > L2 (50 MB on H200): every decode call reads from HBM

  for (int64_t ctx : contexts) {
    // random bf16 K / V rows, distinct for every sequence: [max_batch, ctx, heads_kv, head_dim]
    const int64_t row_elems = static_cast<int64_t>(heads_kv) * head_dim;
    const int64_t seq_elems = ctx * row_elems;
    uint16_t *dk = nullptr, *dv = nullptr;
    ok(cudaMalloc(reinterpret_cast<void**>(&dk), max_batch * seq_elems * 2), "malloc k");
    ok(cudaMalloc(reinterpret_cast<void**>(&dv), max_batch * seq_elems * 2), "malloc v");
    bench_fill_bf16(dk, max_batch * seq_elems, 1), bench_fill_bf16(dv, max_batch * seq_elems, 2);
    ok(cudaDeviceSynchronize(), "fill");
    auto seq_view = [&](uint16_t* base, int64_t b) {
      return flashkv::TensorView::contiguous(base + b * seq_elems, flashkv::DType::bfloat16, {ctx, heads_kv, head_dim},
                                             flashkv::Device::cuda, 0);
    };
    const flashkv::TensorView kall = flashkv::TensorView::contiguous(
        dk, flashkv::DType::bfloat16, {max_batch, ctx, heads_kv, head_dim}, flashkv::Device::cuda, 0);
    const flashkv::TensorView vall = flashkv::TensorView::contiguous(
        dv, flashkv::DType::bfloat16, {max_batch, ctx, heads_kv, head_dim}, flashkv::Device::cuda, 0);
    for (const std::string& fmt : formats) {
      flashkv::KVCacheConfig cfg;
      cfg.num_layers = 1, cfg.num_heads_kv = heads_kv, cfg.head_dim = head_dim, cfg.page_size = page_size;
      cfg.with_kv_cache_dtype(fmt);
      cfg.device = flashkv::Device::cuda;
      cfg.capacity_pages = max_batch * ((ctx + page_size - 1) / page_size);
      std::string err;
      try {
        flashkv::PagedKVCache cache(cfg);
        std::vector<int64_t> ids;
        for (int64_t b = 0; b < max_batch; ++b) ids.push_back(b);
        auto report_append = [&](const char* mode, double seconds) {
          const flashkv::KVMemoryReport rep = cache.memory_report();
          std::printf("{\"kind\": \"append\", \"mode\": \"%s\", \"format\": \"%s\", \"context\": %lld, "
                      "\"sequences\": %lld, \"seconds\": %.6f, \"bytes_written\": %lld, \"bytes_input\": %lld}\n",
                      mode, fmt.c_str(), static_cast<long long>(ctx), static_cast<long long>(max_batch), seconds,
                      static_cast<long long>(rep.code_bytes + rep.metadata_bytes),
                      static_cast<long long>(2 * max_batch * seq_elems * 2));
          std::fflush(stdout);
        };
        // (1) one prefill append of ctx tokens per sequence and call (synchronous: checked, then returned); the
        // sequences are registered and the device idle before the clock starts
        for (int64_t b = 0; b < max_batch; ++b) cache.add_sequence(b);
        ok(cudaDeviceSynchronize(), "sync");
        auto t0 = std::chrono::steady_clock::now();
        for (int64_t b = 0; b < max_batch; ++b) cache.append(b, 0, seq_view(dk, b), seq_view(dv, b));
        report_append("per_sequence", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        // (2) every sequence in one batched call ([max_batch, ctx, heads_kv, head_dim]), best of 3 on fresh sequences
        double best = 1e30;
        for (int rep = 0; rep < 3; ++rep) {
          for (int64_t b = 0; b < max_batch; ++b) cache.remove_sequence(b);
          for (int64_t b = 0; b < max_batch; ++b) cache.add_sequence(b);
          ok(cudaDeviceSynchronize(), "sync");  // the freed pages' 0xFF fills are done
          t0 = std::chrono::steady_clock::now();
          cache.append(ids, 0, kall, vall);
          best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        report_append("batched", best);
        for (int64_t B : batches) {
          std::vector<int32_t> cu(static_cast<size_t>(B) + 1);
          for (int64_t b = 0; b <= B; ++b) cu[static_cast<size_t>(b)] = static_cast<int32_t>(b);
          void *q = nullptr, *out = nullptr;
          ok(cudaMalloc(&q, B * heads * head_dim * 2), "malloc q"), ok(cudaMalloc(&out, B * heads * head_dim * 2), "malloc out");
          bench_fill_bf16(static_cast<uint16_t*>(q), B * heads * head_dim, 3);
          const auto qv = flashkv::TensorView::contiguous(q, flashkv::DType::bfloat16, {B, heads, head_dim}, flashkv::Device::cuda, 0);
          const auto ov = flashkv::TensorView::contiguous(out, flashkv::DType::bfloat16, {B, heads, head_dim}, flashkv::Device::cuda, 0);
          const std::span<const int64_t> sid(ids.data(), static_cast<size_t>(B));
          for (const int64_t want_splits : splits_list) {
          flashkv::DecodeOptions dopt;
          dopt.num_splits = static_cast<int32_t>(want_splits);
          flashkv::DecodePlan plan = flashkv::plan_decode(cache, sid, cu, heads, 0, dopt);
          for (int w = 0; w < 3; ++w) flashkv::run_decode(cache, plan, 0, qv, ov, nullptr);
          std::vector<double> t;
          for (int c = 0; c < calls; ++c) {
            ok(cudaMemsetAsync(big, c, flush_bytes), "flush");
            t.push_back(timer.ms([&] { flashkv::run_decode(cache, plan, 0, qv, ov, nullptr); }));
          }
          const flashkv::KVFormatSpec kf = cfg.k_format, vf = cfg.v_format;
          const flashkv::KVFormatBytes kb = flashkv::kv_format_bytes(kf, true, head_dim, page_size);
          const flashkv::KVFormatBytes vb = flashkv::kv_format_bytes(vf, false, head_dim, page_size);
          const double per_token_head = kb.code_bytes_per_token_head + vb.code_bytes_per_token_head +
                                        static_cast<double>(kb.meta_bytes_per_group) / kb.tokens_per_group +
                                        static_cast<double>(vb.meta_bytes_per_group) / vb.tokens_per_group;
          const double kv_bytes = per_token_head * static_cast<double>(B * ctx * heads_kv);
          const double qo_bytes = 2.0 * B * heads * head_dim * 2;
          std::printf("{\"kind\": \"decode\", \"format\": \"%s\", \"batch\": %lld, \"context\": %lld, \"ms_median\": %.6f, "
                      "\"ms_min\": %.6f, \"kv_bytes\": %.0f, \"qo_bytes\": %.0f, \"num_splits\": %d, \"path\": \"%s\"}\n",
                      fmt.c_str(), static_cast<long long>(B), static_cast<long long>(ctx), median(t),
                      *std::min_element(t.begin(), t.end()), kv_bytes, qo_bytes, plan.num_splits(), plan.path().c_str());
          std::fflush(stdout);
          }
          cudaFree(q), cudaFree(out);
        }
      } catch (const std::exception& e) {
        err = e.what();
        for (char& ch : err)
          if (ch == '"' || ch == '\\' || ch == '\n') ch = ' ';
        std::printf("{\"kind\": \"error\", \"format\": \"%s\", \"context\": %lld, \"error\": \"%s\"}\n", fmt.c_str(),
                    static_cast<long long>(ctx), err.c_str());
        std::fflush(stdout);
      }
    }
    cudaFree(dk), cudaFree(dv);
  }
  cudaFree(big), cudaFree(sink);
  return 0;
}
