// Forward tile/feature variants for head_dim 128 (tune_main.cu times them).
#include <cuda_bf16.h>

#include "../../../src/cuda/sm80/fwd_launch.cuh"
#include "../../../src/cuda/sm90/fwd_launch.cuh"
#include "tune.hpp"

using namespace flashkv::cuda;
using namespace flashkv::cuda::sm80;
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define V(NAME, ...) static tune::Register CAT(reg_, __LINE__)(NAME, 128, &run_fwd_cfg<__VA_ARGS__, __nv_bfloat16>);
V("128x64 w4", FwdConfig<128, 128, 64, 4>)
#define V9(NAME, ...) static tune::Register CAT(reg9_, __LINE__)(NAME, 128, &run_fwd_sm90_cfg<__VA_ARGS__, __nv_bfloat16>);
V9("sm90 128x128", sm90::FwdConfig<128, 128, 128>)
V9("sm90 128x64", sm90::FwdConfig<128, 128, 64>)
V9("sm90 192x128", sm90::FwdConfig<128, 192, 128>)
