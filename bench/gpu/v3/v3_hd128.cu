// hd128 variants (see v3_hd64.cu).
#include "v3_variants.cuh"
using bf16 = __nv_bfloat16;
V3_VARIANT("full", 128, 176, 2, bf16, .exp2_emu_eighths = 1);
V3_VARIANT("no_tma", 128, 176, 2, bf16, .tma = false, .exp2_emu_eighths = 1);
V3_VARIANT("no_ws", 128, 176, 2, bf16, .warp_specialized = false, .exp2_emu_eighths = 1);
V3_VARIANT("no_pingpong", 128, 176, 2, bf16, .pingpong = false, .exp2_emu_eighths = 1);
V3_VARIANT("no_overlap", 128, 176, 2, bf16, .intra_overlap = false, .exp2_emu_eighths = 1);
V3_VARIANT("no_emu", 128, 176, 2, bf16, .exp2_emu_eighths = 0);
V3_VARIANT("no_cond_rescale", 128, 176, 2, bf16, .exp2_emu_eighths = 1, .cond_rescale = false);
V3_VARIANT("emu2", 128, 176, 2, bf16, .exp2_emu_eighths = 2);
V3_VARIANT("n128", 128, 128, 2, bf16, .exp2_emu_eighths = 1);
V3_VARIANT("n128_s3", 128, 128, 3, bf16, .exp2_emu_eighths = 1);
V3_VARIANT("n144", 128, 144, 2, bf16, .exp2_emu_eighths = 1);
V3_VARIANT("fp16", 128, 176, 2, __half, .exp2_emu_eighths = 1);
