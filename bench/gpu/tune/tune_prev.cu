// The previous release's sm80 forward/backward kernels (commit edcd204, copied to prev_*_kernel.cuh in namespace
// sm80_prev) as the "our own previous version" anchor of the tuning runs.
#include <cuda_bf16.h>

#include "../../../src/cuda/sm80/bwd_launch.cuh"
#include "prev_bwd_kernel.cuh"
#include "prev_fwd_kernel.cuh"
#include "tune.hpp"

using namespace flashkv::cuda;
using T = __nv_bfloat16;

template <class Cfg>
void prev_fwd(const FwdParams& p, cudaStream_t st) {
  auto kernel = sm80_prev::fwd_kernel<Cfg, T>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  const dim3 grid((p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM, p.num_heads, p.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, st>>>(p);
}

template <class Cfg>
void prev_bwd(const BwdParams& p, cudaStream_t st) {
  const int64_t threads = p.total_q * p.num_heads * 32;
  sm80::bwd_preprocess_kernel<T><<<static_cast<unsigned>((threads + 255) / 256), 256, 0, st>>>(p);
  auto kernel = sm80_prev::bwd_kernel<Cfg, T>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  const dim3 grid((p.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN, p.num_heads, p.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, st>>>(p);
  const int64_t nq = p.total_q * p.num_heads * (p.head_dim / 2);
  sm80::bwd_convert_dq_kernel<T><<<static_cast<unsigned>((nq + 255) / 256), 256, 0, st>>>(p);
}

static tune::Register r1("prev 128x64 w4", 64, &prev_fwd<sm80_prev::FwdConfig<64, 128, 64, 4>>);
static tune::Register r2("prev 128x64 w4", 128, &prev_fwd<sm80_prev::FwdConfig<128, 128, 64, 4>>);
static tune::Register r3("prev 128x64 w8", 256, &prev_fwd<sm80_prev::FwdConfig<256, 128, 64, 8>>);
static tune::Register r4("prev 64x128 w8", 64, &prev_bwd<sm80_prev::BwdConfig<64, 64, 128, 8, 4, 4, 2>>);
static tune::Register r5("prev 64x128 w8", 128, &prev_bwd<sm80_prev::BwdConfig<128, 64, 128, 8, 4, 4, 2>>);
static tune::Register r6("prev 64x64 w8", 256, &prev_bwd<sm80_prev::BwdConfig<256, 64, 64, 8, 2, 2, 2>>);
