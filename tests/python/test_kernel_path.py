"""flashkv.last_kernel_path() / FLASHKV_LOG (issue 10 item 4): every call names the kernel path it took."""
import os
import subprocess
import sys

import numpy as np

import flashkv


def test_last_kernel_path_names_the_cpu_algorithm(rng):
    q = rng.standard_normal((1, 8, 2, 16)).astype(np.float32)
    for algorithm in ("tiled", "v1", "naive"):
        flashkv.attention(q, q, q, causal=True, algorithm=algorithm)
        path = flashkv.last_kernel_path()
        assert path.startswith("attention_forward cpu " + algorithm + " float32 hdim16"), path
        assert path.endswith(" causal"), path
    out, lse = flashkv.attention(q, q, q, return_lse=True)
    flashkv.attention_backward(out, q, q, q, out, lse)
    assert flashkv.last_kernel_path() == "attention_backward cpu fa2-bwd float32 hdim16"


def test_flashkv_log_prints_one_line_per_call():
    code = (
        "import numpy as np, flashkv\n"
        "q = np.ones((1, 4, 1, 8), np.float32)\n"
        "flashkv.attention(q, q, q)\n"
        "flashkv.attention(q, q, q, algorithm='naive')\n"
    )
    pkg_parent = os.path.dirname(os.path.dirname(flashkv.__file__))
    env = dict(os.environ, FLASHKV_LOG="1", PYTHONPATH=pkg_parent + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    lines = [l for l in r.stderr.splitlines() if l.startswith("flashkv: ")]
    assert lines == ["flashkv: attention_forward cpu tiled float32 hdim8", "flashkv: attention_forward cpu naive float32 hdim8"], r.stderr
    env["FLASHKV_LOG"] = "0"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "flashkv: " not in r.stderr
