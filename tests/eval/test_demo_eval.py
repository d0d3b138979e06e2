"""End to end on the shipped 260K model: `flashkv demo`, `flashkv eval` (--text with llama-perplexity's protocol,
--samples, --tokens), `eval passkey`, `bench engine`, with assertions on the numbers that must hold: the fp32 cache
against itself gives KL = 0 exactly and top-1 = 100%; averaged over several seeds KL(int8) < KL(int4) < KL(int2);
bf16 is closer than int4; KIVI groups are fitted to head_dim 16; outputs (table, JSON, SVG) are written; every error
path exits 2 with one line. (The real model's runs are in test_smollm2_eval.py.)"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import shipped_model  # noqa: E402

CLI = os.environ.get("FLASHKV_CLI", "flashkv")
MODELS, MODEL, TOK = str(shipped_model.MODELS), str(shipped_model.MODEL), str(shipped_model.TOKENIZER)
pytestmark = pytest.mark.skipif(not shipped_model.PRESENT, reason=shipped_model.MISSING_REASON)
SEEDS = [int(os.environ.get("FLASHKV_TEST_SEED", "11")) + i for i in range(3)]
print("seeds", SEEDS)


def run_cli(*args, timeout=120):
    env = dict(os.environ, FLASHKV_MODELS_DIR=MODELS)
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "demo.json"
    # No time bound here: speed is a benchmark (docs/eval.md), not a test on a shared machine (85 s seen under load).
    p = run_cli("demo", "--model", MODEL, "--tokenizer", TOK, "--json", str(out), timeout=600)
    assert p.returncode == 0, p.stderr
    return p.stdout, json.loads(out.read_text())


def test_demo_table_and_texts(demo):
    stdout, j = demo
    labels = [f["label"] for f in j["formats"]]
    assert labels[:5] == ["fp32", "bf16", "fp8_e4m3", "int8", "int4"]
    assert labels[5] == "int4_kivi_g16" and labels[6] == "int2_kivi_g16 r32"  # G fitted to head_dim 16
    for l in labels:
        assert "| " + l in stdout
    for col in ["bytes/token", "eff. bits", "prefill tok/s", "decode tok/s", "PPL", "mean KLD", "same top-1",
                "greedy div"]:
        assert col in stdout
    assert "llama-perplexity protocol" in stdout and "GPL-3" in stdout
    assert "passkey: the prompt does not fit" in stdout  # 128-token context
    assert stdout.count("Echoes of vectors unfold") >= 2
    for key in ("command", "date", "machine"):
        assert key in j
    assert j["command"].split()[1] == "demo"


def test_demo_fp32_against_itself_is_exact(demo):
    fp32 = demo[1]["formats"][0]
    assert fp32["mean_kl"] == 0.0 and fp32["max_kl"] == 0.0
    assert fp32["top1"] == 1.0
    assert fp32["greedy_divergence"] == -1
    assert fp32["delta_ppl"] == 0.0
    assert fp32["effective_bits"] == 32.0


def test_demo_quality_ordering_and_bytes(demo):
    f = {x["label"].split()[0]: x for x in demo[1]["formats"]}
    assert 0 < f["bf16"]["mean_kl"] < f["int4"]["mean_kl"]
    assert f["int8"]["mean_kl"] < f["int4"]["mean_kl"]
    assert f["bf16"]["bytes_per_token"] == f["fp32"]["bytes_per_token"] / 2
    assert f["int4"]["bytes_per_token"] < f["int8"]["bytes_per_token"] < f["bf16"]["bytes_per_token"]
    for x in demo[1]["formats"]:
        assert x["decode_tok_s"] > 0
        assert x["greedy_text"].startswith('"Echoes')


def test_eval_text_llama_perplexity_protocol(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(open("/usr/share/common-licenses/GPL-3").read()[:6000])
    out = tmp_path / "t.json"
    p = run_cli("eval", "--model", MODEL, "--tokenizer", TOK, "--kv-cache", "fp32", "bf16", "int4", "int4_kivi",
                "--text", str(text), "--ctx", "128,64", "--chunks", "3", "--ubatch", "48", "--json", str(out),
                "--no-progress")
    assert p.returncode == 0, p.stderr
    j = json.loads(out.read_text())
    assert [r["n_ctx"] for r in j["results"]] == [128, 64]
    for r in j["results"]:
        assert r["chunks"] == 3 and r["scored_tokens"] == 3 * (r["n_ctx"] // 2 - 1)
        rows = {x["label"]: x for x in r["formats"]}
        assert rows["fp32"]["stats"]["kld_mean"] == 0.0 and rows["fp32"]["stats"]["same_top1"] == 1.0
        assert rows["fp32"]["stats"]["ppl"] == r["reference"]["ppl"]
        assert 0 < rows["bf16"]["stats"]["kld_mean"] < rows["int4"]["stats"]["kld_mean"]
        assert "int4_kivi_g16" in rows
    assert "n_ctx 128: 3 chunk(s), 189 scored tokens" in p.stdout
    assert j["text"]["tokens"] > 3 * 128 and "command" in j and "load_average_at_start" in j["machine"]


def test_eval_passkey_and_bench_engine_on_the_shipped_model(tmp_path):
    # The 128-token context cannot hold a passkey prompt: a clear error naming the option.
    p = run_cli("eval", "passkey", "--model", MODEL, "--tokenizer", TOK, "--contexts", "128", "--no-progress")
    assert p.returncode == 2 and "contexts" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    out = tmp_path / "s.json"
    p = run_cli("bench", "engine", "--model", MODEL, "--tokenizer", TOK, "--kv-cache", "bf16", "int4_kivi",
                "--contexts", "128", "--n-prompt", "32", "--n-gen", "8", "--repeats", "2", "--json", str(out))
    assert p.returncode == 0, p.stderr
    j = json.loads(out.read_text())
    assert [r["label"] for r in j["results"]] == ["bf16", "int4_kivi_g16"]
    for r in j["results"]:
        assert r["depth"] == 88 and len(r["pp_tok_s"]) == 2 and r["pp_mean"] > 0 and r["tg_mean"] > 0
    assert "[bench engine]" in p.stderr and "load average" in p.stderr


@pytest.fixture(scope="module")
def eval_runs(tmp_path_factory):
    runs = []
    d = tmp_path_factory.mktemp("eval")
    for s in SEEDS:
        out = d / f"eval{s}.json"
        plot = d / f"eval{s}.svg"
        p = run_cli("eval", "--model", MODEL, "--tokenizer", TOK, "--kv-cache", "fp32", "int8", "int4", "int2_kivi_g16",
                    "--samples", "4", "--seed", str(s), "--json", str(out), "--plot", str(plot), "--no-progress")
        assert p.returncode == 0, p.stderr
        runs.append((p.stdout, json.loads(out.read_text()), plot.read_text()))
    return runs


def test_eval_fp32_self_and_kl_ordering_over_seeds(eval_runs):
    kl = {"int8": 0.0, "int4": 0.0, "int2_kivi_g16": 0.0}
    for _, j, _ in eval_runs:
        rows = {r["label"]: r for r in j["formats"]}
        assert rows["fp32"]["mean_kl"] == 0.0 and rows["fp32"]["top1"] == 1.0
        assert rows["fp32"]["diverged"] == 0
        assert j["sequences"] == 4 and rows["int8"]["positions"] == 4 * 128
        for k in kl:
            kl[k] += rows[k]["mean_kl"] / len(eval_runs)
    print("mean KL over seeds", kl)
    assert 0 < kl["int8"] < kl["int4"] < kl["int2_kivi_g16"]


def test_eval_outputs(eval_runs):
    stdout, j, svg = eval_runs[0]
    assert "| int2_kivi_g16" in stdout and "mean KL" in stdout
    assert svg.startswith("<svg") and "int4" in svg and svg.rstrip().endswith("</svg>")
    assert all("effective_bits" in r and "ppl_ratio" in r for r in j["formats"])


def test_eval_token_files(tmp_path):
    toks = tmp_path / "t.tok"
    toks.write_text("1 300 301 302 303\n\n1 400 401\n")
    p = run_cli("eval", "--model", MODEL, "--tokenizer", TOK, "--kv-cache", "int8", "--tokens", str(toks), "--no-progress")
    assert p.returncode == 0, p.stderr
    assert "| int8" in p.stdout


@pytest.mark.parametrize("args,needle", [
    (["--kv-cache", "int5"], "kv_cache_dtype"),
    (["--kv-cache", "int4+q9"], "kv-cache"),
    (["--samples", "0"], "samples"),
    (["--length", "500"], "length"),
    (["--tokens", "/nonexistent.tok"], "nonexistent"),
    (["--kv-cache", "int4_kivi_g32"], "int4_kivi_g16"),   # explicit G that does not fit: the spelling that does
    (["--kv-cache", "int4_g32"], "use int4"),
    (["--kv-cache", ""], "kv-cache"),
    (["--text", "/usr/share/common-licenses/GPL-3", "--ctx", "512"], "ctx"),
    (["--text", "/usr/share/common-licenses/GPL-3", "--ctx", "64,,128"], "ctx"),
    (["--ctx", "64"], "text"),
    (["--json", "/nonexistent-dir/x.json"], "json"),
    (["--plot", "/proc/x.svg"], "plot"),
])
def test_eval_errors_exit_2(args, needle):
    p = run_cli("eval", "--model", MODEL, "--tokenizer", TOK, "--no-progress", *args)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and needle in lines[0], p.stderr


def test_eval_bad_token_id_and_missing_model(tmp_path):
    toks = tmp_path / "bad.tok"
    toks.write_text("1 2 9999\n")
    p = run_cli("eval", "--model", MODEL, "--tokenizer", TOK, "--tokens", str(toks), "--no-progress")
    assert p.returncode == 2 and "9999" in p.stderr
    p = run_cli("eval", "--kv-cache", "int8")
    assert p.returncode == 2 and "model" in p.stderr
    p = run_cli("demo", "--model", "/nonexistent.bin")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1


def test_convert_errors_and_types(tmp_path):
    for t in ["f16", "bf16", "q8_0"]:
        out = tmp_path / f"m.{t}.gguf"
        p = run_cli("convert", "--model", MODEL, "--tokenizer", TOK, "--type", t, "-o", str(out))
        assert p.returncode == 0, p.stderr
        g = run_cli("generate", "--model", str(out), "--temperature", "0", "--steps", "16", "--json")
        assert g.returncode == 0, g.stderr
        assert json.loads(g.stdout)["text"].startswith('"Echoes')
    p = run_cli("convert", "--model", MODEL, "--tokenizer", TOK, "--type", "q4_0", "-o", str(tmp_path / "x"))
    assert p.returncode == 2 and "type" in p.stderr
    p = run_cli("convert", "--model", MODEL, "-o", str(tmp_path / "x"))
    assert p.returncode == 2 and "tokenizer" in p.stderr
