"""flashkv.Engine(device="cuda") on the shipped 260K model: greedy tokens equal the CPU engine's (bf16 weights on the
GPU, bf16 cache on both; on the H200 run5 measured 100/100 greedy tokens from "The machine" this way, and 100/100
from BOS against the fp32-cache CPU engine, max |dlogit| 4e-4: bench/results/h200-2026-12-01-run5), batched decode through add / step equal to generate_tokens on the GPU, the
stats, and the CUDA engine's typed refusals (fp32 / KIVI caches, a device index out of range).

Skipped (the file exits 77) without a CUDA device or with a library built without the CUDA backend; with both, an
UnsupportedError (e.g. cuBLAS not found: set FLASHKV_CUBLAS or LD_LIBRARY_PATH) is a failure, not a skip.
On the GPU machine: scripts/gpu-run engine (it sets FLASHKV_MODELS_DIR, FLASHKV_CUBLAS and FLASHKV_LIBRARY)."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import flashkv

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import shipped_model  # noqa: E402

MODEL, TOK = shipped_model.MODEL, shipped_model.TOKENIZER


def _gpu_present() -> bool:
    if any(Path("/dev").glob("nvidia[0-9]*")):
        return True
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def gpu():
    if not shipped_model.PRESENT:
        pytest.skip(shipped_model.MISSING_REASON)
    try:
        e = flashkv.Engine(MODEL, TOK, device="cuda", max_sequences=4)
    except flashkv.UnsupportedError as err:
        if "built with the CUDA backend" in str(err) or not _gpu_present():
            pytest.skip(f"no CUDA engine here: {err}")
        raise
    with e:
        yield e


@pytest.fixture(scope="module")
def cpu():
    with flashkv.Engine(MODEL, TOK, kv_cache_dtype="bf16") as e:
        yield e


@pytest.mark.parametrize("prompt", ["", "The machine"])
def test_greedy_tokens_equal_the_cpu(gpu, cpu, prompt):
    assert gpu.device == "cuda:0" and gpu.kv_cache_dtype == "bf16"  # the CUDA default cache, as the CLI
    want = cpu.generate_tokens(prompt, 100, temperature=0, stop_at_eos=False)
    got = gpu.generate_tokens(prompt, 100, temperature=0, stop_at_eos=False)
    same = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
    print(f"cuda greedy from {prompt!r}: {same}/{len(want)} tokens equal the CPU's; "
          f"decode {gpu.last_stats['decode_tokens_per_s']:.0f} tok/s")
    assert got == want
    assert gpu.generate(prompt, 100, temperature=0, stop_at_eos=False) == cpu.detokenize(want)
    s = gpu.last_stats
    assert s["device"] == "cuda:0" and s["generated_tokens"] == 100 and s["decode_steps"] == 99
    assert s["kv_tokens"] == s["prompt_tokens"] + 99 and s["decode_tokens_per_s"] > 0


def test_batch_equals_generate_on_the_gpu(gpu):
    prompts = ["The machine", "Once upon a time", "", "Echoes of light in the"]
    limits = [30, 12, 25, 18]
    refs = [gpu.generate_tokens(p, n, temperature=0, stop_at_eos=False) for p, n in zip(prompts, limits)]
    got, seq_of = {}, {}
    for i, (p, n) in enumerate(zip(prompts, limits)):
        ev = gpu.add(p, n, temperature=0, stop_at_eos=False)
        got[i], seq_of[ev.seq] = [ev.token], i
    while seq_of:
        for ev in gpu.step():
            got[seq_of[ev.seq]].append(ev.token)
            if ev.stop is not None:
                assert ev.stop == "steps"
                gpu.retire(ev.seq)
                del seq_of[ev.seq]
    assert [got[i] for i in range(len(prompts))] == refs


def test_sampled_is_reproducible_on_the_gpu(gpu):
    a = gpu.generate_tokens("The machine", 50, temperature=0.8, top_k=40, top_p=0.9, seed=7)
    assert a == gpu.generate_tokens("The machine", 50, temperature=0.8, top_k=40, top_p=0.9, seed=7)
    assert len(a) > 0


def test_cuda_refusals_are_typed(gpu):
    with pytest.raises(flashkv.UnsupportedError):
        flashkv.Engine(MODEL, TOK, device="cuda", kv_cache_dtype="fp32")
    with pytest.raises(flashkv.UnsupportedError):
        flashkv.Engine(MODEL, TOK, device="cuda", kv_cache_dtype="int4_kivi")
    with pytest.raises(ValueError, match="device_index"):
        flashkv.Engine(MODEL, TOK, device="cuda:999")
