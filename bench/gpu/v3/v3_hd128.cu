// hd128 variants (see v3_hd64.cu).
#include "v3_variants.cuh"
using bf16 = __nv_bfloat16;
using v3::WsSchedule;
V3_VARIANT("full", 128, 176, 2, bf16, );
V3_VARIANT("no_tma", 128, 176, 2, bf16, .tma = false);
V3_VARIANT("no_ws", 128, 176, 2, bf16, .warp_specialized = false);
V3_VARIANT("no_pingpong", 128, 176, 2, bf16, .pingpong = false);
V3_VARIANT("no_overlap", 128, 176, 2, bf16, .intra_overlap = false);
V3_VARIANT("no_cond_rescale", 128, 176, 2, bf16, .cond_rescale = false);
V3_VARIANT("rescale_early", 128, 176, 2, bf16, .defer_rescale = false);
V3_VARIANT_SCHED("single_tile", WsSchedule::kSingleTile, 128, 176, 2, bf16, );
V3_VARIANT_SCHED("persistent", WsSchedule::kPersistent, 128, 176, 2, bf16, );
V3_VARIANT("emu1", 128, 176, 2, bf16, .exp2_emu_eighths = 1);
V3_VARIANT("n144", 128, 144, 2, bf16, );
V3_VARIANT("no_pp_emu1", 128, 176, 2, bf16, .pingpong = false, .exp2_emu_eighths = 1);
V3_VARIANT("n128", 128, 128, 2, bf16, );
V3_VARIANT("n128_s3", 128, 128, 3, bf16, );
V3_VARIANT("fp16", 128, 176, 2, __half, );
