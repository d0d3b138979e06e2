// Backward tile/warp-grid variants for head_dim 256 (tune_main.cu times them).
#include <cuda_bf16.h>

#include "../../../src/cuda/sm80/bwd_launch.cuh"
#include "../../../src/cuda/sm90/bwd_launch.cuh"
#include "tune.hpp"

using namespace flashkv::cuda;
using namespace flashkv::cuda::sm80;
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define W(NAME, ...) static tune::Register CAT(reg_, __LINE__)(NAME, 256, &run_bwd_cfg<__VA_ARGS__, __nv_bfloat16>);
W("64x64 w8 2/2/2", BwdConfig<256, 64, 64, 8, 2, 2, 2>)
#define W9(NAME, ...) static tune::Register CAT(reg9_, __LINE__)(NAME, 256, &run_bwd_sm90_cfg<__VA_ARGS__, __nv_bfloat16>);
W9("sm90 64x64 seq", sm90::BwdConfig<256, 64, 64, false>)
W9("sm90 64x64 ovl", sm90::BwdConfig<256, 64, 64, true>)
