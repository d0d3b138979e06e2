#!/usr/bin/env python3
"""CLI checks run by ctest: `check_cli.py <flashkv binary> <check>`; prints 'N passed, M failed' and exits 1 on failure.

checks: bench_json (tiny bench, JSON validated), explain (both explain commands), bad_args (exit 2 + one line),
docs (every `flashkv ...` / `scripts/flashkv ...` command shown in docs/engine.md, and README.md's engine commands,
runs and exits 0)."""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

passed = failed = 0


def expect(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {what}", file=sys.stderr)


def run(binary, *args, timeout=300):
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=timeout)


def check_bench_json(binary):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.json"
        r = run(binary, "bench", "attention", "--seqlen", "96,200", "--head-dim", "32", "--heads", "2",
                "--repeats", "2", "--causal", "--json", str(path))
        expect(r.returncode == 0, f"bench exit code {r.returncode}: {r.stderr}")
        expect("GFLOP/s" in r.stdout and "peak" in r.stdout, "table header with GFLOP/s and peak")
        expect("[bench]" in r.stderr, "progress goes to stderr")
        data = json.loads(path.read_text())
        for key in ("command", "date", "machine", "config", "results"):
            expect(key in data, f"JSON has '{key}'")
        expect(data["command"].startswith("flashkv bench attention") and "--causal" in data["command"],
               f"exact command recorded: {data['command']}")
        expect(data["machine"]["peak_gflops_fp32"] > 0, "peak FMA rate measured")
        res = data["results"]
        expect(len(res) == 6, f"2 seqlens x 3 variants = 6 results, got {len(res)}")
        expect({r["variant"] for r in res} == {"naive", "v1", "v2"}, "variants naive, v1, v2")
        for e in res:
            expect(not e["skipped"], f"{e['variant']} {e['seqlen']} not skipped")
            expect(e["gflops"] > 0 and e["time_ms_best"] > 0 and e["time_ms_median"] >= e["time_ms_best"],
                   f"timings {e}")
            expect(e["bytes_moved"] > 0, f"bytes moved {e}")
            expect(0 < e["cpu_share_best"] <= 1.5, f"cpu share of the best call in (0, 1] (+ clock slack): {e}")
        by = {(e["variant"], e["seqlen"]): e for e in res}
        for s in (96, 200):
            expect(by[("naive", s)]["bytes_moved"] > by[("v2", s)]["bytes_moved"],
                   f"naive moves more bytes than v2 at seqlen {s}")
            expect(by[("naive", s)]["extra_memory_bytes_model"] > by[("v2", s)]["extra_memory_bytes_model"],
                   f"naive needs more scratch than v2 at seqlen {s}")
        # flops formula: 4*b*h*s*s*d/2 (causal) / time
        e = by[("v2", 200)]
        flops = 4 * 1 * 2 * 200 * 200 * 32 / 2
        expect(abs(e["gflops"] - flops / (e["time_ms_best"] * 1e-3) * 1e-9) <= 1e-6 * e["gflops"] + 1e-9,
               "GFLOP/s follows the FA formula")
        # naive skipped when its scratch exceeds the limit
        r = run(binary, "bench", "attention", "--seqlen", "512", "--head-dim", "16", "--heads", "1", "--repeats", "1",
                "--variant", "naive", "--max-naive-memory", "0.0001", "--quiet")
        expect(r.returncode == 0 and "skipped" in r.stdout, f"naive skipped over the memory limit: {r.stdout}")
        expect(r.stderr == "", "--quiet prints nothing on stderr")


def check_explain(binary):
    r = run(binary, "explain", "online-softmax", "--seqlen-k", "13", "--block-n", "4", "--head-dim", "6", "--seed", "3")
    expect(r.returncode == 0, f"explain online-softmax exit {r.returncode}: {r.stderr}")
    expect("final O/l equals the exact softmax result" in r.stdout, "equality line")
    expect(r.stdout.count("tile ") >= 4 and "alpha = exp(m_old - m_new)" in r.stdout, "one block per tile (4 tiles)")
    r = run(binary, "explain", "online-softmax", "--rows", "3")
    expect(r.returncode == 0 and len(re.findall(r"^query row \d+:", r.stdout, re.M)) == 3,
           "a small query block of 3 rows")
    r = run(binary, "explain", "tiles", "--seqlen", "2048", "--head-dim", "64")
    expect(r.returncode == 0, f"explain tiles exit {r.returncode}: {r.stderr}")
    for word in ("naive", "v1", "v2", "S", "P", "O", "bytes moved"):
        expect(word in r.stdout, f"explain tiles mentions {word}")
    r1 = run(binary, "explain", "tiles", "--seqlen", "1024", "--head-dim", "64", "--variant", "v1")
    expect(r1.returncode == 0 and "== v1" in r1.stdout and "== naive" not in r1.stdout and "== v2" not in r1.stdout,
           "--variant selects one variant")


def check_bad_args(binary):
    cases = [
        (["bench", "attention", "--seqlen", "0"], "--seqlen"),
        (["bench", "attention", "--head-dim", "300"], "--head-dim"),
        (["bench", "attention", "--variant", "v9"], "--variant"),
        (["bench", "attention", "--dtype", "int8"], "--dtype"),
        (["bench", "attention", "--repeats", "abc"], "--repeats"),
        (["bench", "attention", "--json", "/nonexistent-dir/x.json", "--seqlen", "64", "--head-dim", "16",
          "--heads", "1", "--repeats", "1", "--quiet"], "--json"),
        (["explain", "online-softmax", "--block-n", "0"], "--block-n"),
        (["explain", "online-softmax", "--seqlen-k", "4", "--block-n", "9"], "--block-n"),
        (["explain", "tiles", "--variant", "v7"], "--variant"),
        (["explain", "tiles", "--seqlen", "0"], "--seqlen"),
        (["bench", "nothing"], ""),
        (["--no-such-flag"], ""),
    ]
    for args, name in cases:
        r = run(binary, *args)
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        expect(r.returncode == 2, f"{args}: exit code {r.returncode} (want 2): {r.stderr}")
        expect(len(lines) == 1, f"{args}: one line on stderr, got {len(lines)}: {r.stderr!r}")
        expect(name in r.stderr, f"{args}: message names {name}: {r.stderr!r}")


REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("FLASHKV_MODELS_DIR", REPO.parent / "shared" / "models"))


def documented_commands(path):
    """Commands in the ```sh / ``` blocks of a markdown file: lines starting with `flashkv ` or `scripts/flashkv `,
    joined over trailing backslashes, trailing `# comment` dropped."""
    cmds, block, pending = [], False, ""
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            block = not block and line.strip() in ("```", "```sh", "```bash")
            continue
        if not block:
            continue
        text = pending + line.strip()
        if text.endswith("\\"):
            pending = text[:-1] + " "
            continue
        pending = ""
        text = re.sub(r"\s+#\s.*$", "", text).strip()
        if text.startswith("flashkv ") or text.startswith("scripts/flashkv "):
            cmds.append(text)
    return cmds


def check_docs(binary):
    """Every documented command is a tested command: run each (placeholders M.bin / T.bin = the shipped model and
    tokenizer, ../shared/models = the models folder, scripts/flashkv = the built binary) in a temporary directory, so
    the files it writes land there. Commands that name a model that is not installed are reported and skipped."""
    # README.md: the engine / evaluation commands (the attention benchmark and `eval kv` examples take minutes on 2
    # cores and have their own tests); docs/engine.md: every command.
    engine_cmds = ("demo", "generate", "eval", "convert", "chat", "bench engine")
    readme = [c for c in documented_commands(REPO / "README.md")
              if c.split(" ", 1)[1].startswith(engine_cmds) and not c.split(" ", 1)[1].startswith("eval kv")]
    cmds = readme + documented_commands(REPO / "docs" / "engine.md")
    expect(len(cmds) >= 8, f"found the documented commands ({len(cmds)})")
    subst = {"M.bin": str(MODELS / "aidreams260K.bin"), "T.bin": str(MODELS / "aidreams260K.tok512.bin"),
             "../shared/models": str(MODELS)}
    with tempfile.TemporaryDirectory() as tmp:
        for cmd in cmds:
            argv = shlex.split(cmd)
            argv = [binary] + argv[1:]
            argv = [subst.get(a, a.replace("../shared/models", str(MODELS))) for a in argv]
            env = dict(os.environ, FLASHKV_MODELS_DIR=str(MODELS))
            t0 = time.time()
            r = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp, env=env)
            dt = time.time() - t0
            if r.returncode != 0 and "not installed" in r.stderr:
                print(f"SKIP (model not installed): {cmd}")
                continue
            print(f"{dt:6.1f} s  exit {r.returncode}  {cmd}")
            expect(r.returncode == 0, f"documented command exits 0: {cmd}\n{r.stderr[-800:]}")


def main():
    binary, check = os.path.abspath(sys.argv[1]), sys.argv[2]
    {"bench_json": check_bench_json, "explain": check_explain, "bad_args": check_bad_args,
     "docs": check_docs}[check](binary)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
