// hd64 variants: full kernel, the FA3 §4.2-style ablation (one optimization off at a time), exp2-share and tile
// alternatives, fp16.
#include "v3_variants.cuh"
using bf16 = __nv_bfloat16;
V3_VARIANT("full", 64, 192, 2, bf16, .exp2_emu_eighths = 2);
V3_VARIANT("no_tma", 64, 192, 2, bf16, .tma = false, .exp2_emu_eighths = 2);
V3_VARIANT("no_ws", 64, 192, 2, bf16, .warp_specialized = false, .exp2_emu_eighths = 2);
V3_VARIANT("no_pingpong", 64, 192, 2, bf16, .pingpong = false, .exp2_emu_eighths = 2);
V3_VARIANT("no_overlap", 64, 192, 2, bf16, .intra_overlap = false, .exp2_emu_eighths = 2);
V3_VARIANT("no_emu", 64, 192, 2, bf16, .exp2_emu_eighths = 0);
V3_VARIANT("no_cond_rescale", 64, 192, 2, bf16, .exp2_emu_eighths = 2, .cond_rescale = false);
V3_VARIANT("emu1", 64, 192, 2, bf16, .exp2_emu_eighths = 1);
V3_VARIANT("emu3", 64, 192, 2, bf16, .exp2_emu_eighths = 3);
V3_VARIANT("n128", 64, 128, 2, bf16, .exp2_emu_eighths = 2);
V3_VARIANT("n128_s3", 64, 128, 3, bf16, .exp2_emu_eighths = 2);
V3_VARIANT("s3", 64, 192, 3, bf16, .exp2_emu_eighths = 2);
V3_VARIANT("fp16", 64, 192, 2, __half, .exp2_emu_eighths = 2);
