// FP8 hd256 variants (see v3_fp8_hd128.cu): library N96; FA3's FP8 tile is 128 x 128.
#include "v3_fp8_variants.cuh"
V3_FP8_VARIANT("full", 256, 96, 2, );
V3_FP8_VARIANT("serial_max", 256, 96, 2, .row_max_tree = false);
V3_FP8_VARIANT("mask_per_tile", 256, 96, 2, .hoist_mask_test = false);
V3_FP8_VARIANT("ilp2", 256, 96, 2, .transpose_ilp = 2);
V3_FP8_VARIANT("no_pingpong", 256, 96, 2, .pingpong = false);
V3_FP8_VARIANT("emu1", 256, 96, 2, .exp2_emu_eighths = 1);
V3_FP8_VARIANT("n128", 256, 128, 2, );
V3_FP8_VARIANT("n64", 256, 64, 2, );
V3_FP8_VARIANT("n64_s3", 256, 64, 3, );
