"""CPU self-test of the FP8 correctness rule of the Hopper v3 GPU harness (bench/gpu/v3/fp8_check.py): the naive
baseline's FP8 GEMM pads to multiples of 16 and passes its operands in the layout torch._scaled_mm's CUDA path
requires (checked by a strict float32 stand-in, then by the CPU's own _scaled_mm), the baseline is attention, and the
rule (out and lse within 2x the naive's error) fails wrong kernels: an lse off by log 2, a missing or doubled
softmax_scale, a mask one key wider, P's 2^8 not undone, a NaN left in out, also against a baseline with a GPU-sized
lse error (a truncating-accumulator model)."""
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup installs it for the CI)")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "gpu" / "v3"))
import fp8_check  # noqa: E402


def test_fp8_check_layout_and_rule():
    fp8_check.selftest()
