// FP8 hd128 variants: the library configuration (common/tile_size.hpp fwd_tile_sm90ws_fp8: N192, 2 stages, default
// Fp8WsOptions) as "full", each option switched in turn ("serial_max": the library before branch fp8-speed), FA3's FP8
// tile (hopper/tile_size.h: 128 x 224), narrower tiles and 3 stages.
#include "v3_fp8_variants.cuh"
V3_FP8_VARIANT("full", 128, 192, 2, );
V3_FP8_VARIANT("serial_max", 128, 192, 2, .row_max_tree = false);
V3_FP8_VARIANT("mask_per_tile", 128, 192, 2, .hoist_mask_test = false);
V3_FP8_VARIANT("ilp2", 128, 192, 2, .transpose_ilp = 2);
V3_FP8_VARIANT("no_pingpong", 128, 192, 2, .pingpong = false);
V3_FP8_VARIANT("emu1", 128, 192, 2, .exp2_emu_eighths = 1);
V3_FP8_VARIANT("emu2", 128, 192, 2, .exp2_emu_eighths = 2);
V3_FP8_VARIANT("n224", 128, 224, 2, );
V3_FP8_VARIANT("n160", 128, 160, 2, );
V3_FP8_VARIANT("n128", 128, 128, 2, );
V3_FP8_VARIANT("n160_s3", 128, 160, 3, );
V3_FP8_VARIANT("n128_s3", 128, 128, 3, );
