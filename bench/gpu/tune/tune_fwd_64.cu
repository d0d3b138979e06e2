// Forward tile/feature variants for head_dim 64 (tune_main.cu times them).
#include <cuda_bf16.h>

#include "../../../src/cuda/sm80/fwd_launch.cuh"
#include "tune.hpp"

using namespace flashkv::cuda;
using namespace flashkv::cuda::sm80;
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define V(NAME, ...) static tune::Register CAT(reg_, __LINE__)(NAME, 64, &run_fwd_cfg<__VA_ARGS__, __nv_bfloat16>);
V("128x64 w4", FwdConfig<64, 128, 64, 4>)
V("128x128 w4", FwdConfig<64, 128, 128, 4>)
V("128x64 w4 norskip", FwdConfig<64, 128, 64, 4, false>)
