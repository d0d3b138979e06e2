// Times every registered forward/backward variant (tune.hpp) on the FA3-paper shapes (16k tokens per batch, hidden
// 2048, bf16) with CUDA events (3 warm-up runs, median of `reps`), and checks each variant's outputs against the
// first registered variant of the same (mode, head_dim) — the sm80 tile-table configuration — on the same random
// inputs. The previous release is measured side by side by bench/gpu/bench_attention.py --prev-library (its
// libflashkv.so built from the pinned commit), not here.
//   bench/gpu/tune/build.sh OUT && OUT/tune_kernels [fwd|bwd|all] [head_dims e.g. 64,128] [seqlens e.g. 512,8192]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tune.hpp"

using namespace flashkv::cuda;
using T = __nv_bfloat16;

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

__global__ void fill(T* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ (seed * 0x9e3779b9u);
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    x[i] = __float2bfloat16(((h & 0xffff) / 32768.f - 1.f) * 1.7f);
  }
}
__global__ void max_abs_diff(const T* a, const T* b, size_t n, float* out) {
  float m = 0.f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float d = fabsf(__bfloat162float(a[i]) - __bfloat162float(b[i]));
    m = fmaxf(m, d != d ? INFINITY : d);
  }
  atomicMax(reinterpret_cast<int*>(out), __float_as_int(m));  // non-negative floats order like ints
}

static float diff(const T* a, const T* b, size_t n) {
  float* d;
  CK(cudaMalloc(&d, 4));
  CK(cudaMemset(d, 0, 4));
  max_abs_diff<<<1024, 256>>>(a, b, n, d);
  float h;
  CK(cudaMemcpy(&h, d, 4, cudaMemcpyDeviceToHost));
  CK(cudaFree(d));
  return h;
}

static int env_int(const char* name, int dflt) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : dflt;
}

template <class F>
static float time_ms(F&& f, int reps) {
  for (int i = 0; i < env_int("TUNE_WARMUP", 3); ++i) f();
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(e0));
    f();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms);
  }
  CK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

static std::vector<int> parse(const char* s, std::vector<int> dflt) {
  if (!s || !*s) return dflt;
  std::vector<int> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p) ++p;
  }
  return v;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "all";
  const auto dims = parse(argc > 2 ? argv[2] : nullptr, {64, 128, 256});
  const auto seqs = parse(argc > 3 ? argv[3] : nullptr, {512, 2048, 8192});
  const int reps = env_int("TUNE_REPS", 15);
  const int causal_only = env_int("TUNE_CAUSAL", -1);  // -1: both
  const char* filter = std::getenv("TUNE_FILTER");     // substring of the variant names to run (after the reference)
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs; %zu variants\n", prop.name, prop.multiProcessorCount, tune::registry().size());
  const size_t n = size_t(16384) * 2048;
  T *q, *k, *v, *o, *o2, *dout, *dq, *dk, *dv, *dq0, *dk0, *dv0;
  for (T** x : {&q, &k, &v, &o, &o2, &dout, &dq, &dk, &dv, &dq0, &dk0, &dv0}) CK(cudaMalloc(x, n * sizeof(T)));
  float *lse, *dq_accum, *dsum, *lse2;
  CK(cudaMalloc(&lse, size_t(16384) * 64 * 4));
  CK(cudaMalloc(&dsum, size_t(16384) * 64 * 4));
  CK(cudaMalloc(&lse2, size_t(16384) * 64 * 4));
  CK(cudaMalloc(&dq_accum, n * 4));
  fill<<<1024, 256>>>(q, n, 1), fill<<<1024, 256>>>(k, n, 2), fill<<<1024, 256>>>(v, n, 3);
  fill<<<1024, 256>>>(dout, n, 4);
  CK(cudaDeviceSynchronize());
  std::printf("%-6s %4s %6s %6s %-24s %9s %9s %10s\n", "mode", "d", "seqlen", "causal", "variant", "ms", "TFLOP/s",
              "maxdiff");
  for (int d : dims)
    for (int s : seqs)
      for (int causal : {0, 1}) {
        if (causal_only >= 0 && causal != causal_only) continue;
        const int b = 16384 / s, h = 2048 / d;
        BwdParams p;
        p.q = q, p.k = k, p.v = v, p.out = o, p.lse = lse;
        p.q_s = p.k_s = p.v_s = p.out_s = TensorStrides{int64_t(s) * h * d, int64_t(h) * d, d};
        p.lse_batch = int64_t(h) * s, p.lse_head = s, p.lse_row = 1;
        p.batch = b, p.num_heads = p.num_heads_kv = h, p.head_dim = d, p.seqlen_q = p.seqlen_k = s;
        p.window_right = causal ? 0 : -1;
        p.softmax_scale = 1.f / std::sqrt(float(d));
        p.softmax_scale_log2 = p.softmax_scale * 1.4426950408889634f;
        p.dout = dout, p.dq = dq, p.dk = dk, p.dv = dv;
        p.dout_s = p.dq_s = p.dk_s = p.dv_s = p.q_s;
        p.dq_accum = dq_accum, p.dsum = dsum, p.lse_log2 = lse2;
        p.head_dim_rounded = d, p.num_m_blocks = (s + 63) / 64 + 1;
        p.total_q = p.total_k = int64_t(b) * s;
        const double fl = 4.0 * b * h * double(s) * s * d / (causal ? 2 : 1);
        bool first = true;
        if (mode == "fwd" || mode == "all")
          for (auto& var : tune::registry()) {
            if (var.bwd || var.head_dim != d) continue;
            if (!first && filter && var.name.find(filter) == std::string::npos) continue;
            FwdParams fp = p;
            fp.out = first ? o : o2;
            const float ms = time_ms([&] { var.fwd(fp, nullptr); }, reps);
            const float md = first ? 0.f : diff(o, o2, size_t(b) * s * h * d);
            std::printf("%-6s %4d %6d %6d %-24s %9.3f %9.1f %10.4g\n", "fwd", d, s, causal, var.name.c_str(), ms,
                        fl / ms / 1e9, md);
            std::fflush(stdout);
            first = false;
          }
        if (mode == "bwd" || mode == "all") {
          // out and lse from the first forward variant of this head dim
          for (auto& var : tune::registry())
            if (!var.bwd && var.head_dim == d) {
              FwdParams fp = p;
              var.fwd(fp, nullptr);
              break;
            }
          CK(cudaDeviceSynchronize());
          first = true;
          for (auto& var : tune::registry()) {
            if (!var.bwd || var.head_dim != d) continue;
            if (!first && filter && var.name.find(filter) == std::string::npos) continue;
            BwdParams bp = p;
            const float ms = time_ms([&] { var.bwd_fn(bp, nullptr); }, reps);
            float md = 0.f;
            const size_t cnt = size_t(b) * s * h * d;
            if (first) {
              CK(cudaMemcpy(dq0, dq, cnt * 2, cudaMemcpyDeviceToDevice));
              CK(cudaMemcpy(dk0, dk, cnt * 2, cudaMemcpyDeviceToDevice));
              CK(cudaMemcpy(dv0, dv, cnt * 2, cudaMemcpyDeviceToDevice));
            } else {
              md = std::max({diff(dq, dq0, cnt), diff(dk, dk0, cnt), diff(dv, dv0, cnt)});
            }
            std::printf("%-6s %4d %6d %6d %-24s %9.3f %9.1f %10.4g\n", "bwd", d, s, causal, var.name.c_str(), ms,
                        2.5 * fl / ms / 1e9, md);
            std::fflush(stdout);
            first = false;
          }
        }
      }
  return 0;
}
