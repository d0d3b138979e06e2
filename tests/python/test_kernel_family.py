"""kernel= (flashkv::KernelFamily, C ABI opts.kernel_family): the CUDA kernel family is an explicit option, checked
like every other argument. On the CPU only "auto" is accepted; the CUDA behaviour (auto/sm80/sm90/sm90ws on Hopper and
elsewhere) is tested by the GPU suites (tests/cuda, CudaKernels.FamilyIsDecidedOncePerCall)."""
import ctypes

import numpy as np
import pytest

import flashkv
from flashkv import _library as L


def test_kernel_auto_is_the_default_and_runs_on_the_cpu(rng):
    q = rng.standard_normal((1, 8, 2, 16)).astype(np.float32)
    a = flashkv.attention(q, q, q, causal=True)
    b = flashkv.attention(q, q, q, causal=True, kernel="auto")
    np.testing.assert_array_equal(a, b)
    out, lse = flashkv.attention(q, q, q, return_lse=True, kernel="auto")
    flashkv.attention_backward(out, q, q, q, out, lse, kernel="auto")


@pytest.mark.parametrize("kernel", ["sm80", "sm90", "sm90ws"])
def test_a_cuda_family_on_cpu_tensors_is_unsupported(rng, kernel):
    q = rng.standard_normal((1, 8, 2, 16)).astype(np.float32)
    with pytest.raises(L.UnsupportedError, match=f"kernel_family '{kernel}'"):
        flashkv.attention(q, q, q, kernel=kernel)
    out, lse = flashkv.attention(q, q, q, return_lse=True)
    with pytest.raises(L.UnsupportedError, match="CPU"):
        flashkv.attention_backward(out, q, q, q, out, lse, kernel=kernel)


def test_an_unknown_family_names_the_argument(rng):
    q = rng.standard_normal((1, 8, 2, 16)).astype(np.float32)
    with pytest.raises(ValueError, match="argument 'kernel'.*'sm100'"):
        flashkv.attention(q, q, q, kernel="sm100")


def test_c_abi_field_is_checked_and_old_struct_sizes_mean_auto(rng):
    q = rng.standard_normal((1, 8, 2, 16)).astype(np.float32)
    o = L.default_options()
    assert o.struct_size == ctypes.sizeof(L.AttentionOptions)
    assert o.kernel_family == 0
    from flashkv._tensor import new_output, to_tensor

    tq = to_tensor(q, "q")
    out = new_output(tq, tq.shape, "out")
    fwd = L.lib().flashkv_attention_forward
    o.kernel_family = 7
    status = fwd(tq.ptr, tq.ptr, tq.ptr, out.ptr, None, ctypes.byref(o))
    assert status != L.OK
    assert "opts.kernel_family" in L.lib().flashkv_last_error().decode()
    # A caller compiled before the field existed (struct_size without it) gets "auto", whatever the memory holds.
    o.struct_size = L.AttentionOptions.kernel_family.offset
    L.check(fwd(tq.ptr, tq.ptr, tq.ptr, out.ptr, None, ctypes.byref(o)))
