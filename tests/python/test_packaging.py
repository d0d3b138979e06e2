"""`pip install .` builds libflashkv.so and ships it in the wheel (slow: a full Release build of the library, several
minutes on 2 cores). Runs only with FLASHKV_FULL_TESTS=1; the default suite covers the package from the source tree."""
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(os.environ.get("FLASHKV_FULL_TESTS") != "1", reason="set FLASHKV_FULL_TESTS=1")


def test_wheel_ships_the_library_and_works(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(wheels)],
                   check=True, timeout=1800)
    (whl,) = wheels.glob("flashkv-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    assert "flashkv/_native/libflashkv.so" in names and "flashkv/__init__.py" in names
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(whl)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("FLASHKV_LIBRARY", "PYTHONPATH")}
    code = (
        "import flashkv, numpy as np\n"
        "q = np.random.default_rng(0).standard_normal((1, 33, 2, 16)).astype(np.float32)\n"
        "out = flashkv.attention(q, q, q, causal=True)\n"
        "assert out.shape == q.shape and np.isfinite(out).all()\n"
        "print(flashkv.library_path())\n"
    )
    r = subprocess.run([str(py), "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, check=True)
    assert str(venv) in r.stdout and "_native/libflashkv.so" in r.stdout
