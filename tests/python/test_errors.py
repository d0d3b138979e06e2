"""Every error path of the Python API raises ValueError/TypeError whose message names the argument."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import flashkv


def names(arg):
    """Regex matching the argument name as flashkv quotes it: 'q', 'q.dtype', 'q[...]'."""
    return rf"'(opts\.)?{arg}[.'\[]"


@pytest.fixture
def qkv(rng):
    q = rng.standard_normal((1, 8, 2, 16)).astype(np.float32)
    k = rng.standard_normal((1, 8, 2, 16)).astype(np.float32)
    v = rng.standard_normal((1, 8, 2, 16)).astype(np.float32)
    return q, k, v


def test_baseline_succeeds(qkv):
    q, k, v = qkv
    assert flashkv.attention(q, k, v).shape == q.shape


@pytest.mark.parametrize(
    "bad, exc, arg",
    [
        (lambda a: a.astype(np.float64), TypeError, "q"),
        (lambda a: a.astype(np.int32), TypeError, "q"),
        (lambda a: a.astype(np.int64), TypeError, "q"),
        (lambda a: a.astype(np.complex64), TypeError, "q"),
        (lambda a: a.astype(np.uint16), TypeError, "q"),  # uint16 without dtype="bfloat16"
        (lambda a: a.astype(">f4"), TypeError, "q"),  # non-native byte order
        (lambda a: a.tolist(), TypeError, "q"),  # not an array
        (lambda a: None, TypeError, "q"),
        (lambda a: a[..., ::2], ValueError, "q"),  # non-contiguous last dim
        (lambda a: a[:, ::-1], ValueError, "q"),  # negative strides
        (lambda a: a[0], ValueError, "q"),  # rank 3
        (lambda a: a[..., :8], ValueError, "k"),  # head_dim differs from k's
    ],
    ids=["float64", "int32", "int64", "complex64", "uint16", "bigendian", "list", "none", "last_dim_stride",
         "negative_stride", "rank3", "head_dim_mismatch"],
)
def test_bad_q(qkv, bad, exc, arg):
    q, k, v = qkv
    with pytest.raises(exc, match=names(arg)):
        flashkv.attention(bad(q), k, v)


def test_bad_k_v(qkv):
    q, k, v = qkv
    with pytest.raises(TypeError, match=names("k")):
        flashkv.attention(q, k.astype(np.float16), v)
    with pytest.raises(TypeError, match=names("v")):
        flashkv.attention(q, k, v.astype(np.float16))
    with pytest.raises(ValueError, match=names("v")):
        flashkv.attention(q, k, v[:, :5])  # seqlen_k differs
    with pytest.raises(ValueError, match=names("k")):
        flashkv.attention(q, np.zeros((1, 8, 3, 16), np.float32), np.zeros((1, 8, 3, 16), np.float32))  # 2 % 3
    big = np.zeros((1, 2, 1, 300), np.float32)
    with pytest.raises(ValueError, match=names("q")):
        flashkv.attention(big, big, big)  # head_dim > 256


@pytest.mark.parametrize(
    "opts, exc, arg",
    [
        ({"window_size": (-2, 0)}, ValueError, "window_size_left"),
        ({"window_size": (0, -5)}, ValueError, "window_size_right"),
        ({"window_size": "wide"}, ValueError, "window_size"),
        ({"window_size": (1, 2, 3)}, ValueError, "window_size"),
        ({"softcap": -1.0}, ValueError, "softcap"),
        ({"softcap": float("inf")}, ValueError, "softcap"),
        ({"softcap": "big"}, TypeError, "softcap"),
        ({"softmax_scale": float("nan")}, ValueError, "softmax_scale"),
        ({"softmax_scale": 0.0}, ValueError, "softmax_scale"),
        ({"softmax_scale": 1e300}, ValueError, "softmax_scale"),
        ({"softmax_scale": "x"}, TypeError, "softmax_scale"),
        ({"algorithm": "fast"}, ValueError, "algorithm"),
        ({"dtype": "int8"}, ValueError, "dtype"),
        ({"num_threads": -1}, ValueError, "num_threads"),
        ({"causal": True, "window_size": (-1, 4)}, ValueError, "window_size_right"),
        # values the C ABI's int32 fields cannot hold, and non-integers, are errors, never wrapped or truncated
        ({"window_size": (2**40, 0)}, ValueError, r"window_size\[0\]"),
        ({"window_size": (0, 2**32)}, ValueError, r"window_size\[1\]"),
        ({"window_size": (1.5, 0)}, TypeError, r"window_size\[0\]"),
        ({"num_threads": 2**40}, ValueError, "num_threads"),
        ({"num_threads": 1.5}, TypeError, "num_threads"),
        ({"num_threads": "2"}, TypeError, "num_threads"),
        ({"causal": "yes"}, TypeError, "causal"),
        ({"causal": 2}, TypeError, "causal"),
    ],
)
def test_bad_options(qkv, opts, exc, arg):
    q, k, v = qkv
    with pytest.raises(exc, match=names(arg)):
        flashkv.attention(q, k, v, **opts)


def test_numpy_scalars_and_int_flags_are_accepted(qkv):
    # np.float32(1 / sqrt(d)) is a natural softmax_scale; numpy ints for windows and threads; causal=1
    q, k, v = qkv
    ref = flashkv.attention(q, k, v, causal=True, window_size=(3, 0), softmax_scale=0.25, softcap=5.0, num_threads=1)
    out = flashkv.attention(q, k, v, causal=1, window_size=(np.int64(3), np.int32(0)), softmax_scale=np.float32(0.25),
                            softcap=np.float32(5.0), num_threads=np.int64(1))
    np.testing.assert_array_equal(out, ref)


def test_varlen_max_seqlen_must_be_an_int(rng):
    q = rng.standard_normal((10, 2, 16)).astype(np.float32)
    cq = np.array([0, 4, 10], np.int32)
    with pytest.raises(TypeError, match=names("max_seqlen_q")):
        flashkv.attention_varlen(q, q, q, cq, cq, max_seqlen_q=6.5)  # was truncated to 6
    with pytest.raises(TypeError, match=names("max_seqlen_k")):
        flashkv.attention_varlen(q, q, q, cq, cq, max_seqlen_k="6")
    assert flashkv.attention_varlen(q, q, q, cq, cq, max_seqlen_q=np.int64(6)).shape == q.shape


def test_bfloat16_dtype_mismatch(qkv):
    q, k, v = qkv
    with pytest.raises(TypeError, match=names("k")):  # q is bf16 bits, k float32
        flashkv.attention(q.view(np.uint16)[..., :16], k, v, dtype="bfloat16")


def test_backward_errors(qkv, rng):
    q, k, v = qkv
    out, lse = flashkv.attention(q, k, v, return_lse=True)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    with pytest.raises(ValueError, match=names("lse")):
        flashkv.attention_backward(dout, q, k, v, out, lse[:, :, :4])
    with pytest.raises(TypeError, match=names("lse")):
        flashkv.attention_backward(dout, q, k, v, out, lse.astype(np.float16))
    with pytest.raises(ValueError, match=names("dout")):
        flashkv.attention_backward(dout[:, :3], q, k, v, out, lse)
    with pytest.raises(TypeError, match=names("dout")):
        flashkv.attention_backward(dout.astype(np.float16), q, k, v, out, lse)
    with pytest.raises(ValueError, match=names("out")):
        flashkv.attention_backward(dout, q, k, v, out[:, :3], lse)
    with pytest.raises(TypeError, match=names("lse")):
        flashkv.attention_backward(dout, q, k, v, out, None)
    with pytest.raises(TypeError, match=names("deterministic")):
        flashkv.attention_backward(dout, q, k, v, out, lse, deterministic="yes")
    # the CPU backward is deterministic either way: both settings give identical gradients
    a = flashkv.attention_backward(dout, q, k, v, out, lse, deterministic=True)
    b = flashkv.attention_backward(dout, q, k, v, out, lse)
    for x, y in zip(a, b):
        assert np.array_equal(x, y)


def test_varlen_errors(rng):
    q = rng.standard_normal((10, 2, 16)).astype(np.float32)
    kv = rng.standard_normal((12, 2, 16)).astype(np.float32)
    cq, ck = np.array([0, 4, 10], np.int32), np.array([0, 5, 12], np.int32)
    assert flashkv.attention_varlen(q, kv, kv, cq, ck).shape == q.shape
    with pytest.raises(ValueError, match=names("cu_seqlens_q")):
        flashkv.attention_varlen(q, kv, kv, np.array([0, 11, 10], np.int32), ck)  # non-monotone
    with pytest.raises(ValueError, match=names("cu_seqlens_q")):
        flashkv.attention_varlen(q, kv, kv, np.array([0, 4, 9], np.int32), ck)  # last != total_q
    with pytest.raises(TypeError, match=names("cu_seqlens_k")):
        flashkv.attention_varlen(q, kv, kv, cq, ck.astype(np.float32))
    with pytest.raises(ValueError, match=names("cu_seqlens_k")):
        flashkv.attention_varlen(q, kv, kv, cq, np.array([0, 5, 2**31], np.int64))  # does not fit int32
    with pytest.raises(ValueError, match=names("cu_seqlens_q")):
        flashkv.attention_varlen(q, kv, kv, np.array([-1, 4, 10], np.int64), ck)
    with pytest.raises(TypeError, match=names("cu_seqlens_q")):
        flashkv.attention_varlen(q, kv, kv, [0.0, 4.0, 10.0], ck)
    with pytest.raises(ValueError, match=names("cu_seqlens_k")):
        flashkv.attention_varlen(q, kv, kv, cq, np.array([0, 12], np.int32))  # batch differs
    with pytest.raises(ValueError, match=names("max_seqlen_q")):
        flashkv.attention_varlen(q, kv, kv, cq, ck, max_seqlen_q=3)
    with pytest.raises(ValueError, match=names("q")):
        flashkv.attention_varlen(q[None], kv, kv, cq, ck)  # rank 4


def _run(code, env):
    e = dict(os.environ)
    e.update(env)
    py = Path(__file__).resolve().parents[2] / "python"
    e["PYTHONPATH"] = f"{py}{os.pathsep}{e.get('PYTHONPATH', '')}"
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=60)


def test_missing_library_is_a_clear_oserror(tmp_path):
    r = _run(
        "import flashkv, numpy as np\n"
        "try:\n    flashkv.attention(*[np.zeros((1, 1, 1, 8), np.float32)] * 3)\n"
        "except OSError as e:\n    print('OSError', e)\n",
        {"FLASHKV_LIBRARY": str(tmp_path / "nope.so")},
    )
    assert "OSError" in r.stdout and "FLASHKV_LIBRARY" in r.stdout and "nope.so" in r.stdout, r.stdout + r.stderr


def test_library_found_from_env_directory():
    lib = Path(flashkv.library_path())
    r = _run("import flashkv; print(flashkv.library_path())", {"FLASHKV_LIBRARY": str(lib.parent)})
    assert r.returncode == 0 and r.stdout.strip().endswith("libflashkv.so"), r.stdout + r.stderr
