"""Packaging: `python -m flashkv ...` runs the CLI and checks that package, library and CLI versions agree (from the
source tree); `pip install .` builds libflashkv.so and the CLI and ships both in the wheel (slow: a full Release build,
several minutes on 2 cores; FLASHKV_CUDA=OFF unless set) — that one runs only with FLASHKV_FULL_TESTS=1."""
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

full = pytest.mark.skipif(os.environ.get("FLASHKV_FULL_TESTS") != "1", reason="set FLASHKV_FULL_TESTS=1")


def _module_env():
    return {**os.environ, "PYTHONPATH": str(ROOT / "python")}


def test_python_m_flashkv_runs_the_cli_and_checks_versions():
    import flashkv

    cli = Path(flashkv.library_path()).resolve().parent.parent / "bin" / "flashkv"
    if not cli.is_file():
        pytest.skip(f"no CLI next to the library ({cli}); build the flashkv_cli target")
    r = subprocess.run([sys.executable, "-m", "flashkv", "--version"], env=_module_env(), capture_output=True,
                       text=True, timeout=60)
    v = flashkv.__version__
    assert r.returncode == 0 and r.stdout.strip() == f"flashkv package {v}, library {v}, cli {v}", r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "flashkv", "--help"], env=_module_env(), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "flashkv" in r.stdout
    r = subprocess.run([sys.executable, "-m", "flashkv", "no-such-command"], env=_module_env(), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0  # the CLI's own exit code comes through
    r = subprocess.run([sys.executable, "-m", "flashkv", "--help"], env={**_module_env(), "FLASHKV_CLI": "/nonexistent"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "cannot find the flashkv executable" in r.stderr


@full
def test_wheel_ships_the_library_and_works(tmp_path):
    wheels = tmp_path / "wheels"
    env = {**os.environ, "FLASHKV_CUDA": os.environ.get("FLASHKV_CUDA", "OFF")}  # the CPU wheel unless asked
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(wheels)],
                   check=True, timeout=1800, env=env)
    (whl,) = wheels.glob("flashkv-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    assert "flashkv/_native/libflashkv.so" in names and "flashkv/__init__.py" in names
    assert "flashkv/_native/flashkv" in names and "flashkv/__main__.py" in names and "flashkv/torch/_ops.py" in names
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
    r = subprocess.run([str(py), "-m", "flashkv", "--version"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.count(__import__("flashkv").__version__) == 3, r.stdout + r.stderr
