// In-process, interleaved variant of bench_kv_decode for noisy (shared) machines: builds the seven format caches once
// (same random K/V), then runs rounds in which every format does `inner` decode steps in turn, and prints the median
// over rounds of wall and thread-CPU time per step and the ratio to bf16. Same shapes as bench_kv_decode (32 query /
// 8 KV heads, head_dim 128, batch 1, page 64). CMake target `kv_decode_interleaved`:
//   build/<preset>/bin/kv_decode_interleaved CONTEXT ROUNDS THREADS    (env FMTS="bf16;int4;..." to pick formats,
//   INNER=n steps per format and round, default 8·8192/CONTEXT; INNER=1 with many rounds interleaves finest, which
//   spreads other processes' load most evenly over the formats). Prints the median (and min) over rounds.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string>
#include <vector>
#include <memory>
#include "flashkv/diagnostics.hpp"
#include "flashkv/kvcache.hpp"
static double tcpu() { timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static double twall() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(int argc, char** argv) {
  const int64_t ctx = argc > 1 ? atoll(argv[1]) : 8192; const int reps = argc > 2 ? atoi(argv[2]) : 15;
  const int threads = argc > 3 ? atoi(argv[3]) : 1;
  std::vector<std::string> fmts = {"bf16", "fp8_e4m3", "fp8_e4m3_dynamic", "int8", "int4", "int4_kivi", "int2_kivi"};
  if (getenv("FMTS")) {
    fmts.clear();
    std::string s = getenv("FMTS");
    size_t p;
    while ((p = s.find(";")) != std::string::npos) {
      fmts.push_back(s.substr(0, p));
      s = s.substr(p + 1);
    }
    fmts.push_back(s);
  }
  std::vector<std::unique_ptr<flashkv::PagedKVCache>> caches;
  std::mt19937 g(1234); std::normal_distribution<float> n01(0, 1);
  std::vector<float> k(ctx * 8 * 128), v(k.size()); for (auto& x : k) x = n01(g); for (auto& x : v) x = n01(g);
  for (auto& f : fmts) {
    flashkv::KVCacheConfig cfg; cfg.num_layers = 1; cfg.num_heads_kv = 8; cfg.head_dim = 128; cfg.page_size = 64;
    cfg.with_kv_cache_dtype(f); cfg.capacity_pages = ctx / 64 + 2;
    auto c = std::make_unique<flashkv::PagedKVCache>(cfg); c->add_sequence(0);
    c->append(0, 0, flashkv::TensorView::contiguous(k.data(), flashkv::DType::float32, {ctx, 8, 128}),
              flashkv::TensorView::contiguous(v.data(), flashkv::DType::float32, {ctx, 8, 128}));
    caches.push_back(std::move(c));
  }
  std::vector<float> q(32 * 128), out(q.size()); for (auto& x : q) x = n01(g);
  const int64_t ids[] = {0}; const int32_t cu[] = {0, 1};
  auto qv = flashkv::TensorView::contiguous(q.data(), flashkv::DType::float32, {1, 32, 128});
  auto ov = flashkv::TensorView::contiguous(out.data(), flashkv::DType::float32, {1, 32, 128});
  flashkv::KVAttentionOptions opt; opt.num_threads = threads;
  std::vector<std::vector<double>> tc(fmts.size()), tw(fmts.size());
  int inner = std::max<int>(1, int(8 * 8192 / ctx));
  if (getenv("INNER")) inner = std::max(1, atoi(getenv("INNER")));
  for (int r = 0; r < reps; ++r) for (size_t i = 0; i < fmts.size(); ++i) {
    double c0 = tcpu(), w0 = twall();
    for (int it = 0; it < inner; ++it) caches[i]->attention(ids, cu, 0, qv, ov, nullptr, opt);
    tc[i].push_back((tcpu() - c0) / inner * 1e3); tw[i].push_back((twall() - w0) / inner * 1e3);
  }
  std::vector<std::string> paths;  // the kernel path each format took (flashkv::last_kernel_path)
  for (size_t i = 0; i < fmts.size(); ++i) {
    caches[i]->attention(ids, cu, 0, qv, ov, nullptr, opt);
    paths.push_back(flashkv::last_kernel_path());
  }
  auto med = [](std::vector<double> x) { std::sort(x.begin(), x.end()); return x[x.size() / 2]; };
  auto mn = [](const std::vector<double>& x) { return *std::min_element(x.begin(), x.end()); };
  double bc = med(tc[0]), bw = med(tw[0]), bmin = mn(tw[0]);
  for (size_t i = 0; i < fmts.size(); ++i)
    printf("%-18s ctx %6ld thr %d  wall %7.3f ms (%.2fx)  cpu %7.3f ms (%.2fx)  min wall %7.3f ms (%.2fx)  [%s]\n",
           fmts[i].c_str(), (long)ctx, threads, med(tw[i]), bw / med(tw[i]), med(tc[i]), bc / med(tc[i]), mn(tw[i]),
           bmin / mn(tw[i]), paths[i].c_str());
}
