"""`flashkv kv-mem` and `flashkv eval kv` end to end: kv-mem's JSON equals the library formula (which equals a live
cache's memory_report, tested in C++ and in test_kvcache.py) and hand-computed bytes; eval kv produces its table,
JSON and heatmaps; bad input exits with code 2 and one clear line."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from flashkv.kvcache import kv_memory_estimate


def _flashkv() -> str:
    lib = os.environ.get("FLASHKV_LIBRARY")
    cands = []
    if lib:
        cands.append(Path(lib).resolve().parent.parent / "bin" / "flashkv")
    repo = Path(__file__).resolve().parents[2]
    cands += sorted(repo.glob("build/*/bin/flashkv"), key=lambda p: p.stat().st_mtime, reverse=True)
    for c in cands:
        if c.is_file():
            return str(c)
    pytest.skip("flashkv CLI binary not built")


def _run(*args):
    return subprocess.run([_flashkv(), *args], capture_output=True, text=True, timeout=240)


def test_kv_mem_json_equals_formula_and_hand_values():
    r = _run("kv-mem", "--model", "llama-3-8b", "--tokens", "128k", "--kv-cache", "bf16,int4,int2_kivi",
             "--residual", "128", "--memory", "141GB", "--json", "-")
    assert r.returncode == 0, r.stderr
    js = json.loads(r.stdout[r.stdout.index("{"):])
    assert js["model"] == {"layers": 32, "kv_heads": 8, "head_dim": 128, "source": js["model"]["source"]}
    rows = {f["kv_cache_dtype"]: f for f in js["formats"]}
    for fmt in ["bf16", "int4", "int2_kivi"]:
        est = kv_memory_estimate(32, 8, 128, 1, 131072, fmt, page_size=32, residual_tokens=128)
        for key in ["code_bytes", "metadata_bytes", "residual_bytes", "slack_bytes", "total_bytes"]:
            assert rows[fmt][key] == est[key], (fmt, key)
    # hand formula: int4 codes 2·L·T_q·H·d/2, metadata 2·L·T_q·H·4 with T_q = T − R
    tq = 131072 - 128
    assert rows["int4"]["code_bytes"] == 2 * 32 * tq * 8 * 64
    assert rows["int4"]["metadata_bytes"] == 2 * 32 * tq * 8 * 4
    assert rows["int4"]["residual_bytes"] == 2 * 32 * 8 * 128 * 2 * 128
    # sequences that fit next to the bf16 weights (8.03e9 params · 2 B) in 141 GB
    per_seq = rows["bf16"]["total_bytes"]
    assert rows["bf16"]["sequences_fit"] == (141 * 10**9 - round(8.03e9 * 2)) // per_seq == 7


def test_kv_mem_explicit_pair_and_config_json(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
                               "hidden_size": 512}))
    r = _run("kv-mem", "--model", str(tmp_path), "--kv-k", "int8", "--kv-v", "int4", "--tokens", "1000", "--json", "-")
    assert r.returncode == 0, r.stderr
    js = json.loads(r.stdout[r.stdout.index("{"):])
    assert (js["model"]["layers"], js["model"]["kv_heads"], js["model"]["head_dim"]) == (4, 2, 64)
    est = kv_memory_estimate(4, 2, 64, 1, 1000, "k:int8,v:int4", page_size=32)
    assert js["formats"][0]["total_bytes"] == est["total_bytes"]


@pytest.mark.parametrize("args,needle", [
    (["kv-mem", "--model", "llama-9b"], "model'"),
    (["kv-mem", "--layers", "2", "--kv-heads", "2", "--head-dim", "64", "--kv-cache", "int3"], "kv_cache_dtype"),
    (["kv-mem", "--model", "mistral-7b", "--memory", "12 parsecs"], "memory'"),
    (["kv-mem", "--model", "mistral-7b", "--kv-cache", "int4_kivi", "--page-size", "16"], "'page_size'"),
    (["eval", "kv", "--formats", "int5"], "kv_cache_dtype"),
    (["eval", "kv", "--distributions", "cauchy"], "'distribution'"),
])
def test_cli_errors_exit_2_with_one_line(args, needle):
    r = _run(*args)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr


def test_eval_kv_small_run(tmp_path):
    out = tmp_path / "r.json"
    r = _run("eval", "kv", "--formats", "bf16,int8,int2_kivi", "--distributions", "gaussian,outlier",
             "--tokens", "512", "--queries", "4", "--needle-contexts", "256,1k", "--needle-depths", "3",
             "--heatmap-dir", str(tmp_path), "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "needle test" in r.stdout and "int2_kivi" in r.stdout
    js = json.loads(out.read_text())
    rows = {(f["kv_cache_dtype"], f["distribution"]): f for f in js["formats"]}
    assert rows[("bf16", "gaussian")]["nmse_k"] < 1e-4
    assert rows[("int8", "gaussian")]["nmse_k"] < rows[("int2_kivi", "gaussian")]["nmse_k"]
    assert rows[("int2_kivi", "gaussian")]["attn_rel_err"] > rows[("int8", "gaussian")]["attn_rel_err"]
    needle = {n["kv_cache_dtype"]: n for n in js["needle"]}
    assert needle["bf16"]["success_rate"]["1024"] == 1.0
    assert len(needle["int8"]["cells"]) == 6
    svg = (tmp_path / "needle-int2_kivi.svg").read_text()
    assert svg.startswith("<svg") and "int2_kivi" in svg
