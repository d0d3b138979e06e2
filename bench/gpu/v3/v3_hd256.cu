// hd256 variants (see v3_hd64.cu).
#include "v3_variants.cuh"
using bf16 = __nv_bfloat16;
using v3::WsSchedule;
V3_VARIANT("full", 256, 80, 2, bf16, );
V3_VARIANT("no_tma", 256, 80, 2, bf16, .tma = false);
V3_VARIANT("no_ws", 256, 80, 2, bf16, .warp_specialized = false);
V3_VARIANT("no_pingpong", 256, 80, 2, bf16, .pingpong = false);
V3_VARIANT("no_overlap", 256, 80, 2, bf16, .intra_overlap = false);
V3_VARIANT("no_cond_rescale", 256, 80, 2, bf16, .cond_rescale = false);
V3_VARIANT("rescale_early", 256, 80, 2, bf16, .defer_rescale = false);
V3_VARIANT_SCHED("single_tile", WsSchedule::kSingleTile, 256, 80, 2, bf16, );
V3_VARIANT_SCHED("persistent", WsSchedule::kPersistent, 256, 80, 2, bf16, );
V3_VARIANT("emu1", 256, 80, 2, bf16, .exp2_emu_eighths = 1);
V3_VARIANT("n64", 256, 64, 2, bf16, );
V3_VARIANT("fp16", 256, 80, 2, __half, );
