// Device token sampling (sample_kernels.hpp): one 1024-thread block per row; float64 softmax, CUB block scans for the
// top-p prefix and the CDF, a CUB segmented radix sort (stable, descending) for the order by probability.
#include "engine/cuda/sample_kernels.hpp"

#include <cub/cub.cuh>

#include <climits>
#include <cstring>
#include <string>

#include "cuda/check.hpp"
#include "cuda/util.hpp"
#include "engine/cuda/dev_mem.hpp"
#include "flashkv/error.hpp"

namespace flashkv::engine_cuda {
namespace {

constexpr int kThreads = 1024;
using BlockScan = cub::BlockScan<double, kThreads>;
using BlockReduceD = cub::BlockReduce<double, kThreads>;

struct MaxIgnoringNaN {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }  // fmaxf(x, NaN) = x
};
using BlockReduceF = cub::BlockReduce<float, kThreads>;
struct MaxD {
  __device__ double operator()(double a, double b) const { return a > b ? a : b; }
};

/// The CPU argmax: the first id attaining the maximum over non-NaN logits; id 0 when logits[0] is NaN.
__device__ int32_t block_argmax(const float* l, int64_t V, int* s_idx, float* s_val) {
  float best = -INFINITY;
  int64_t bi = INT64_MAX;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float v = l[i];
    if (v > best || (v == best && i < bi)) best = v, bi = i;
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, off);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, off);
    if (ov > best || (ov == best && oi < bi)) best = ov, bi = oi;
  }
  if ((threadIdx.x & 31) == 0) s_val[threadIdx.x >> 5] = best, s_idx[threadIdx.x >> 5] = static_cast<int>(bi < INT_MAX ? bi : INT_MAX);
  __syncthreads();
  int32_t out = 0;
  if (threadIdx.x == 0) {
    float b = -INFINITY;
    int i0 = INT_MAX;
    for (int w = 0; w < kThreads / 32; ++w)
      if (s_val[w] > b || (s_val[w] == b && s_idx[w] < i0)) b = s_val[w], i0 = s_idx[w];
    out = (isnan(l[0]) || i0 == INT_MAX) ? 0 : i0;
  }
  return out;
}

/// base + the lowest thread index whose `hit` is true, or −1; every thread gets the answer (block-wide vote).
__device__ int64_t first_hit(bool hit, int64_t base, int* s_idx, int64_t* s_found) {
  const unsigned ballot = __ballot_sync(0xffffffffu, hit);
  if ((threadIdx.x & 31) == 0) s_idx[threadIdx.x >> 5] = ballot ? static_cast<int>(threadIdx.x & ~31u) + __ffs(ballot) - 1 : INT_MAX;
  __syncthreads();
  if (threadIdx.x == 0) {
    int first = INT_MAX;
    for (int w = 0; w < kThreads / 32; ++w) first = min(first, s_idx[w]);
    *s_found = first != INT_MAX ? base + first : -1;
  }
  __syncthreads();
  const int64_t found = *s_found;
  __syncthreads();
  return found;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* __restrict__ logits, int64_t V,
                                                          const RowSampling* __restrict__ params,
                                                          const float* __restrict__ sorted_keys,
                                                          const int32_t* __restrict__ sorted_ids,
                                                          uint8_t* __restrict__ flags, int32_t* __restrict__ tokens) {
  __shared__ union {
    BlockScan::TempStorage scan;
    BlockReduceD::TempStorage red;
    BlockReduceF::TempStorage redf;
  } tmp;
  __shared__ int s_idx[kThreads / 32];
  __shared__ float s_val[kThreads / 32];
  __shared__ double s_d;
  __shared__ int64_t s_found;
  const int row = blockIdx.x;
  const RowSampling P = params[row];
  const float* l = logits + static_cast<int64_t>(row) * V;
  if (P.temperature == 0.0f) {
    const int32_t t = block_argmax(l, V, s_idx, s_val);
    if (threadIdx.x == 0) tokens[row] = t;
    return;
  }
  // max (NaN ignored, as std::max(mx, l) in the CPU loop), then Σ exp((l − max) / T) in float64
  float mxf = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) mxf = fmaxf(mxf, l[i]);
  mxf = BlockReduceF(tmp.redf).Reduce(mxf, MaxIgnoringNaN());
  if (threadIdx.x == 0) s_d = mxf;
  __syncthreads();
  const double mx = s_d, T = P.temperature;
  __syncthreads();
  double part = 0.0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) part += exp((static_cast<double>(l[i]) - mx) / T);
  part = BlockReduceD(tmp.red).Sum(part);
  if (threadIdx.x == 0) s_d = part;
  __syncthreads();
  const double sum = s_d;
  __syncthreads();
  auto prob = [&](float li) { return exp((static_cast<double>(li) - mx) / T) / sum; };

  const bool use_k = P.top_k > 0 && static_cast<int64_t>(P.top_k) < V;
  const bool use_p = P.top_p < 1.0f;
  double kept = 1.0;  // the renormalization of the kept set (1: every token, unnormalized p already sums to 1)
  bool filtered = false;
  if (use_k || use_p) {
    filtered = true;
    const float* sk = sorted_keys + static_cast<int64_t>(row) * V;
    const int32_t* sid = sorted_ids + static_cast<int64_t>(row) * V;
    int64_t keep = use_k ? P.top_k : V;
    auto prefix_mass = [&](int64_t n) {
      double acc = 0.0;
      for (int64_t j = threadIdx.x; j < n; j += kThreads) acc += prob(sk[j]);
      acc = BlockReduceD(tmp.red).Sum(acc);
      if (threadIdx.x == 0) s_d = acc;
      __syncthreads();
      const double r = s_d;
      __syncthreads();
      return r;
    };
    if (use_p) {
      const double target = static_cast<double>(P.top_p) * prefix_mass(keep);
      double carry = 0.0;
      for (int64_t base = 0; base < keep; base += kThreads) {  // smallest j with Σ_{i<=j} p_(i) >= target
        const int64_t j = base + threadIdx.x;
        const double pj = j < keep ? prob(sk[j]) : 0.0;
        double incl, total;
        BlockScan(tmp.scan).InclusiveSum(pj, incl, total);
        __syncthreads();
        const int64_t found = first_hit(j < keep && carry + incl >= target, base, s_idx, &s_found);
        if (found >= 0) {
          keep = found + 1 < keep ? found + 1 : keep;
          break;
        }
        carry += total;
      }
    }
    kept = prefix_mass(keep);
    uint8_t* f = flags + static_cast<int64_t>(row) * V;
    for (int64_t j = threadIdx.x; j < V; j += kThreads) f[sid[j]] = j < keep ? 1 : 0;
    __syncthreads();
  }
  // inverse CDF in token-id order over the kept tokens
  const double u = P.u;
  const uint8_t* f = flags + static_cast<int64_t>(row) * V;
  double carry = 0.0;
  int64_t last_pos = -1;  // this thread's largest id with q > 0 (rounding fallback)
  for (int64_t base = 0; base < V; base += kThreads) {
    const int64_t i = base + threadIdx.x;
    double q = 0.0;
    if (i < V && (!filtered || f[i] != 0)) q = prob(l[i]) / kept;
    if (q > 0.0) last_pos = i;
    double incl, total;
    BlockScan(tmp.scan).InclusiveSum(q, incl, total);
    __syncthreads();
    const int64_t found = first_hit(q > 0.0 && u < carry + incl, base, s_idx, &s_found);
    if (found >= 0) {
      if (threadIdx.x == 0) tokens[row] = static_cast<int32_t>(found);
      return;
    }
    carry += total;
  }
  // u at the very top of the CDF (rounding): the last id with positive probability (0 if none), as the CPU loop
  const double lp = BlockReduceD(tmp.red).Reduce(static_cast<double>(last_pos), MaxD());
  if (threadIdx.x == 0) tokens[row] = lp < 0 ? 0 : static_cast<int32_t>(lp);
}

__global__ void sort_prep_kernel(const float* __restrict__ logits, int64_t V, int rows, float* __restrict__ keys,
                                 int32_t* __restrict__ ids, int* __restrict__ offsets) {
  const int64_t total = V * rows;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    keys[i] = logits[i] + 0.0f;  // −0 → +0: equal probabilities must tie (and then order by id)
    ids[i] = static_cast<int32_t>(i % V);
    if (i % V == 0) offsets[i / V] = static_cast<int>(i);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) offsets[rows] = static_cast<int>(total);
}

}  // namespace

struct SampleWorkspace::Buffers {
  std::unique_ptr<cuda::DeviceBuffer> keys_in, keys_out, ids_in, ids_out, flags, offsets, params, tokens, temp;
  PinnedMem params_host, tokens_host;  ///< page-locked staging: the two copies per call are truly asynchronous
  size_t items = 0, rows = 0, temp_bytes = 0;
};

SampleWorkspace::SampleWorkspace() : b(std::make_unique<Buffers>()) {}
SampleWorkspace::~SampleWorkspace() = default;

std::vector<int32_t> sample_rows(const float* logits, int64_t vocab, const RowSampling* params, int rows,
                                 SampleWorkspace& ws, cudaStream_t stream) {
  std::vector<int32_t> out(static_cast<size_t>(rows));
  if (rows == 0) return out;
  if (vocab * rows > INT_MAX) {
    throw UnsupportedError("flashkv: device sampling of " + std::to_string(rows) + " rows x " + std::to_string(vocab) +
                           " logits exceeds 2^31 elements");
  }
  bool sort = false;
  for (int r = 0; r < rows; ++r) {
    const RowSampling& p = params[r];
    sort = sort || (p.temperature > 0.0f && ((p.top_k > 0 && p.top_k < vocab) || p.top_p < 1.0f));
  }
  SampleWorkspace::Buffers& b = *ws.b;
  const size_t items = static_cast<size_t>(vocab) * rows;
  if (b.rows < static_cast<size_t>(rows) || b.items < items) {
    b.items = items, b.rows = static_cast<size_t>(rows);
    b.keys_in = std::make_unique<cuda::DeviceBuffer>(items * 4, stream);
    b.keys_out = std::make_unique<cuda::DeviceBuffer>(items * 4, stream);
    b.ids_in = std::make_unique<cuda::DeviceBuffer>(items * 4, stream);
    b.ids_out = std::make_unique<cuda::DeviceBuffer>(items * 4, stream);
    b.flags = std::make_unique<cuda::DeviceBuffer>(items, stream);
    b.offsets = std::make_unique<cuda::DeviceBuffer>((static_cast<size_t>(rows) + 1) * 4, stream);
    b.params = std::make_unique<cuda::DeviceBuffer>(static_cast<size_t>(rows) * sizeof(RowSampling), stream);
    b.tokens = std::make_unique<cuda::DeviceBuffer>(static_cast<size_t>(rows) * 4, stream);
    b.params_host = PinnedMem(static_cast<size_t>(rows) * sizeof(RowSampling));
    b.tokens_host = PinnedMem(static_cast<size_t>(rows) * 4);
    b.temp.reset();
    b.temp_bytes = 0;
  }
  std::memcpy(b.params_host.as<void>(), params, static_cast<size_t>(rows) * sizeof(RowSampling));
  cuda::check_cuda(cudaMemcpyAsync(b.params->get(), b.params_host.as<void>(),
                                   static_cast<size_t>(rows) * sizeof(RowSampling), cudaMemcpyHostToDevice, stream),
                   "engine sampling: upload parameters");
  if (sort) {
    const int blocks = static_cast<int>(std::min<int64_t>((static_cast<int64_t>(items) + 255) / 256, 65535));
    sort_prep_kernel<<<blocks, 256, 0, stream>>>(logits, vocab, rows, b.keys_in->as<float>(), b.ids_in->as<int32_t>(),
                                                 b.offsets->as<int>());
    cuda::check_cuda(cudaGetLastError(), "engine sampling: sort prep");
    size_t need = 0;
    const int* off = b.offsets->as<int>();
    cuda::check_cuda(cub::DeviceSegmentedRadixSort::SortPairsDescending(
                         nullptr, need, b.keys_in->as<float>(), b.keys_out->as<float>(), b.ids_in->as<int32_t>(),
                         b.ids_out->as<int32_t>(), static_cast<int>(items), rows, off, off + 1, 0, 32, stream),
                     "engine sampling: sort size");
    if (need > b.temp_bytes) {
      b.temp = std::make_unique<cuda::DeviceBuffer>(need, stream);
      b.temp_bytes = need;
    }
    cuda::check_cuda(cub::DeviceSegmentedRadixSort::SortPairsDescending(
                         b.temp ? b.temp->get() : nullptr, need, b.keys_in->as<float>(), b.keys_out->as<float>(),
                         b.ids_in->as<int32_t>(), b.ids_out->as<int32_t>(), static_cast<int>(items), rows, off,
                         off + 1, 0, 32, stream),
                     "engine sampling: sort");
  }
  sample_kernel<<<rows, kThreads, 0, stream>>>(logits, vocab, b.params->as<RowSampling>(), b.keys_out->as<float>(),
                                               b.ids_out->as<int32_t>(), b.flags->as<uint8_t>(),
                                               b.tokens->as<int32_t>());
  cuda::check_cuda(cudaGetLastError(), "engine sampling: kernel");
  cuda::check_cuda(cudaMemcpyAsync(b.tokens_host.as<void>(), b.tokens->get(), out.size() * 4, cudaMemcpyDeviceToHost,
                                   stream),
                   "engine sampling: download tokens");
  cuda::check_cuda(cudaStreamSynchronize(stream), "engine sampling");
  std::memcpy(out.data(), b.tokens_host.as<void>(), out.size() * 4);
  return out;
}

}  // namespace flashkv::engine_cuda
