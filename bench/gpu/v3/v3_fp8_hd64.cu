// FP8 hd64 variants (see v3_fp8_hd128.cu): library N192; FA3 runs 192 x 160 without its scheduler barrier (three
// consumer warpgroups, which this mainloop does not have: the nearest here is N160 with pingpong off). hd64 is the
// MUFU-bound head dim (twice as many exponentials per FLOP as hd128), hence the exp2 emulation shares.
#include "v3_fp8_variants.cuh"
V3_FP8_VARIANT("full", 64, 192, 2, );
V3_FP8_VARIANT("serial_max", 64, 192, 2, .row_max_tree = false);
V3_FP8_VARIANT("mask_per_tile", 64, 192, 2, .hoist_mask_test = false);
V3_FP8_VARIANT("ilp2", 64, 192, 2, .transpose_ilp = 2);
V3_FP8_VARIANT("no_pingpong", 64, 192, 2, .pingpong = false);
V3_FP8_VARIANT("emu1", 64, 192, 2, .exp2_emu_eighths = 1);
V3_FP8_VARIANT("emu2", 64, 192, 2, .exp2_emu_eighths = 2);
V3_FP8_VARIANT("emu3", 64, 192, 2, .exp2_emu_eighths = 3);
V3_FP8_VARIANT("emu4", 64, 192, 2, .exp2_emu_eighths = 4);
V3_FP8_VARIANT("n160", 64, 160, 2, );
V3_FP8_VARIANT("n160_no_pp", 64, 160, 2, .pingpong = false);
V3_FP8_VARIANT("n128", 64, 128, 2, );
V3_FP8_VARIANT("n256", 64, 256, 2, );
V3_FP8_VARIANT("n192_s3", 64, 192, 3, );
