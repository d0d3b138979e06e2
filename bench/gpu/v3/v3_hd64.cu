// hd64 variants: the full kernel, the FA3 §4.2-style ablation (one optimization off at a time: TMA, warp
// specialization, pingpong, intra-warpgroup overlap, conditional rescale, deferred rescale, persistence; software
// exp2 on), tile alternatives, fp16.
#include "v3_variants.cuh"
using bf16 = __nv_bfloat16;
using v3::WsSchedule;
V3_VARIANT("full", 64, 192, 2, bf16, );
V3_VARIANT("no_tma", 64, 192, 2, bf16, .tma = false);
V3_VARIANT("no_ws", 64, 192, 2, bf16, .warp_specialized = false);
V3_VARIANT("no_pingpong", 64, 192, 2, bf16, .pingpong = false);
V3_VARIANT("no_overlap", 64, 192, 2, bf16, .intra_overlap = false);
V3_VARIANT("no_cond_rescale", 64, 192, 2, bf16, .cond_rescale = false);
V3_VARIANT("rescale_early", 64, 192, 2, bf16, .defer_rescale = false);
V3_VARIANT_SCHED("single_tile", WsSchedule::kSingleTile, 64, 192, 2, bf16, );
V3_VARIANT_SCHED("persistent", WsSchedule::kPersistent, 64, 192, 2, bf16, );
V3_VARIANT("emu1", 64, 192, 2, bf16, .exp2_emu_eighths = 1);
V3_VARIANT("emu2", 64, 192, 2, bf16, .exp2_emu_eighths = 2);
V3_VARIANT("no_pp_emu1", 64, 192, 2, bf16, .pingpong = false, .exp2_emu_eighths = 1);
V3_VARIANT("n128", 64, 128, 2, bf16, );
V3_VARIANT("n128_s3", 64, 128, 3, bf16, );
V3_VARIANT("fp16", 64, 192, 2, __half, );
