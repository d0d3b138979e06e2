#!/usr/bin/env python3
"""CLI checks run by ctest: `check_cli.py <flashkv binary> <check>`; prints 'N passed, M failed' and exits 1 on failure.

checks: bench_json (tiny bench, JSON validated), explain (both explain commands), bad_args (exit 2 + one line),
docs (every `flashkv ...` / `scripts/flashkv ...` command shown in docs/engine.md and docs/eval.md, and README.md's
engine commands, runs and exits 0; docs_cuda: the `--device cuda` ones, on a GPU machine), eval_device (eval / eval
passkey / demo --device and --reference)."""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import shipped_model  # noqa: E402

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


# cpu_share_best = process CPU time / (wall time x threads) over the best call. Linux adds the CPU time of the process's
# other running threads (the OpenMP workers) to CLOCK_PROCESS_CPUTIME_ID only at their scheduler ticks and context
# switches, so the clock read around a call of t ms can also carry up to one tick of each other thread's earlier time
# (at most 10 ms: HZ >= 100). A sub-millisecond call then shows shares far above 1 when a tick or a switch lands in it,
# which a loaded machine makes likely (next to another 2-thread job: 5.3 for a 0.42 ms call, 2.7 for 0.20 ms, 2 rows
# of 240). The bound is 1 + 5% slack + that tick, so it is tight only for calls of tens of milliseconds (the check's
# last run).
TICK_MS = 10.0


def cpu_share_bound(wall_ms, threads):
    return 1.05 + (threads - 1) * TICK_MS / (wall_ms * threads)


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
            expect(abs(e["gflops_per_cpu"] - e["gflops"] / e["cpu_share_best"]) <= 1e-9 * e["gflops_per_cpu"],
                   f"GFLOP/s per held core = GFLOP/s / cpu share: {e}")
            bound = cpu_share_bound(e["time_ms_best"], data["machine"]["threads"])
            expect(0 < e["cpu_share_best"] <= bound,
                   f"cpu share of the best call in (0, 1] (+ 5% + one scheduler tick of the other threads: {bound:.2f}): "
                   f"{e}")
            alg = {"naive": "naive", "v1": "v1", "v2": "tiled"}[e["variant"]]
            expect(e.get("kernel_path") == f"attention_forward cpu {alg} float32 hdim32 causal",
                   f"kernel path of the row names the kernel that ran: {e.get('kernel_path')!r}")
        expect("kernel path" in r.stdout and "attention_forward cpu tiled float32 hdim32 causal" in r.stdout,
               "the table prints the kernel path per row")
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
        # docs/cli.md: FLASHKV_LOG=1 prints one line per kernel-running call
        r = subprocess.run([binary, "bench", "attention", "--seqlen", "256", "--head-dim", "64", "--heads", "2",
                            "--repeats", "1", "--variant", "v2", "--quiet"], capture_output=True, text=True,
                           timeout=300, env=dict(os.environ, FLASHKV_LOG="1"))
        lines = [l for l in r.stderr.splitlines() if l.startswith("flashkv: ")]
        expect(r.returncode == 0 and lines == ["flashkv: attention_forward cpu tiled float32 hdim64"],
               f"FLASHKV_LOG=1: one line per call: {r.stderr!r}")
        # calls of ~20 ms (2 cores, quiet) or longer, where the cpu share's bound is tight (<= ~1.3)
        path = Path(tmp) / "long.json"
        r = run(binary, "bench", "attention", "--seqlen", "2048", "--head-dim", "64", "--heads", "2", "--repeats", "2",
                "--variant", "v2", "--quiet", "--json", str(path))
        expect(r.returncode == 0, f"bench exit code {r.returncode}: {r.stderr}")
        if r.returncode == 0:
            data = json.loads(path.read_text())
            e = data["results"][0]
            bound = cpu_share_bound(e["time_ms_best"], data["machine"]["threads"])
            expect(0 < e["cpu_share_best"] <= bound, f"cpu share of a long call in (0, {bound:.2f}]: {e}")


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
    # The 260K model missing from the folder FLASHKV_MODELS_DIR names: one line naming the file expected and the setup
    # command that brings it (no model is needed for this case).
    with tempfile.TemporaryDirectory() as empty:
        env = dict(os.environ, FLASHKV_MODELS_DIR=empty)
        for args in (["generate", "--model", "aidreams260k", "--prompt", "x"], ["eval", "--model", "aidreams260k"]):
            expect_user_error(binary, args, f"expected {empty}/aidreams260K.bin; run scripts/setup", env=env)


REPO = Path(__file__).resolve().parents[2]
MODELS = shipped_model.MODELS
DOCS_MODELS = "models/aidreams260k"  # where the docs' commands name the 260K model: scripts/setup copies it there


def documented_commands(path):
    """Commands in the ```sh / ``` blocks of a markdown file: lines starting with `flashkv ` or `scripts/flashkv `,
    joined over trailing backslashes, trailing `# comment` dropped."""
    cmds, fence, block, pending = [], False, False, ""
    for line in path.read_text().splitlines():
        if line.startswith("```"):  # a fence opens or closes a block; only sh / bash / plain blocks are commands
            fence = not fence
            block = fence and line.strip() in ("```", "```sh", "```bash")
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


def on_cuda(cmd):
    """A documented command that runs on the GPU (`--device cuda[:N]`): docs_cuda runs those, docs the others."""
    return re.search(r"--device[ =]cuda", cmd) is not None


def documented_engine_commands():
    # README.md: the engine / evaluation commands (the attention benchmark and `eval kv` examples take minutes on 2
    # cores and have their own tests); docs/engine.md and docs/eval.md: every command.
    engine_cmds = ("demo", "generate", "eval", "convert", "chat", "bench engine")
    readme = [c for c in documented_commands(REPO / "README.md")
              if c.split(" ", 1)[1].startswith(engine_cmds) and not c.split(" ", 1)[1].startswith("eval kv")]
    docs = [c for f in ("engine.md", "eval.md") for c in documented_commands(REPO / "docs" / f)]
    return list(dict.fromkeys(readme + docs))  # each command once


def check_docs(binary):
    """Every documented command is a tested command: run each (placeholders M.bin / T.bin = the 260K model and
    tokenizer, models/aidreams260k = the folder holding them, scripts/flashkv = the built binary) in a temporary
    directory, so the files it writes land there. Commands that name a model that is not installed (SmolLM2 before
    scripts/setup) are reported and skipped; without the 260K model itself the check is skipped (exit 77; CI's setup
    requires it). No command may name ../shared/models (a path that only works in a clone placed beside the reference
    folder). The `--device cuda` commands are docs_cuda's (run where a CUDA device is)."""
    if not shipped_model.PRESENT:  # scripts/setup warned (CI: FLASHKV_REQUIRE_TEST_MODEL=1 made it an error)
        print(f"skipped: {shipped_model.MISSING_REASON}")
        return 77
    cmds = [c for c in documented_engine_commands() if not on_cuda(c)]
    expect(len(cmds) >= 8, f"found the documented commands ({len(cmds)})")
    for c in documented_engine_commands():
        expect("shared/models" not in c, f"documented command names ../shared/models, which only a clone beside the "
                                         f"reference folder has (write {DOCS_MODELS}/... or --model aidreams260k): {c}")
    run_documented(binary, cmds)


def cuda_engine_available(binary):
    """None when `--device cuda` runs here, else the one-line reason (no CUDA backend in this build, no device)."""
    m = model_args()
    r = run(binary, "generate", *m, "--device", "cuda", "--steps", "1", "--temperature", "0", "--json")
    if r.returncode == 2 and ("options.device = cuda" in r.stderr or "cuBLAS" in r.stderr):
        return r.stderr.strip()
    return None


def check_docs_cuda(binary):
    """docs_cuda (ctest label gpu): every documented `--device cuda` command runs and exits 0 on a GPU machine, its
    --json file records the device; exit 77 (skipped) where the CUDA engine cannot run (the reason is printed)."""
    if not model_args():
        print(f"note: {shipped_model.MISSING_REASON}: skipped")
        return 77
    if not os.path.exists(binary):  # scripts/gpu-ci builds the library and GPU tests only, not the CLI
        print(f"skipped: the CLI is not built in this build directory ({binary}); scripts/gpu-build builds it")
        return 77
    why = cuda_engine_available(binary)
    if why:
        print(f"skipped: the CUDA engine does not run here: {why}")
        return 77
    cmds = [c for c in documented_engine_commands() if on_cuda(c)]
    expect(len(cmds) >= 6, f"found the documented --device cuda commands ({len(cmds)})")
    run_documented(binary, cmds, check_json_device=True)


def run_documented(binary, cmds, check_json_device=False):
    subst = {"M.bin": str(shipped_model.MODEL), "T.bin": str(shipped_model.TOKENIZER)}
    with tempfile.TemporaryDirectory() as tmp:
        for cmd in cmds:
            argv = shlex.split(cmd)
            argv = [binary] + argv[1:]
            argv = [subst.get(a, a.replace(DOCS_MODELS, str(MODELS))) for a in argv]
            env = dict(os.environ, FLASHKV_MODELS_DIR=str(MODELS))
            t0 = time.time()
            r = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp, env=env)
            dt = time.time() - t0
            if r.returncode != 0 and "not installed" in r.stderr:
                print(f"SKIP (model not installed): {cmd}")
                continue
            print(f"{dt:6.1f} s  exit {r.returncode}  {cmd}")
            expect(r.returncode == 0, f"documented command exits 0: {cmd}\n{r.stderr[-800:]}")
            i = argv.index("--json") if "--json" in argv else -1
            if check_json_device and r.returncode == 0 and 0 <= i < len(argv) - 1 and not argv[i + 1].startswith("--"):
                out = argv[i + 1]
                text = r.stdout if out == "-" else (Path(tmp) / out).read_text()
                j = json.loads(text[text.index("{"):])
                dev = argv[argv.index("--device") + 1]
                expect(j.get("device") == dev or j.get("config", {}).get("device") == dev,
                       f"{cmd}: the JSON records the device {dev}")
            if check_json_device and r.returncode == 0:
                print(r.stdout[-1500:])


def model_args():
    """--model / --tokenizer of the 260K model (tests/common/shipped_model.py, as the engine tests), or None when it is
    missing."""
    if not shipped_model.PRESENT:
        return None
    return ["--model", str(shipped_model.MODEL), "--tokenizer", str(shipped_model.TOKENIZER)]


def expect_user_error(binary, args, name, env=None):
    """Exit 2, exactly one line on stderr naming `name`, nothing on stdout (the check came before any work)."""
    r = subprocess.run([binary, *args], capture_output=True, text=True, timeout=300, env=env)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    expect(r.returncode == 2, f"{args}: exit code {r.returncode} (want 2): {r.stderr}")
    expect(len(lines) == 1, f"{args}: one line on stderr, got {len(lines)}: {r.stderr!r}")
    expect(name in r.stderr and "internal error" not in r.stderr, f"{args}: message names {name}: {r.stderr!r}")
    expect(r.stdout == "", f"{args}: nothing on stdout before the error: {r.stdout[:200]!r}")


def check_parsing(binary):
    """Issue 10 item 13: one parser for counts and lists; item 5: kv-mem checked arithmetic."""
    tiny = ["--head-dim", "16", "--heads", "1", "--repeats", "1", "--variant", "v2", "--quiet"]
    for args, name in [
        (["bench", "attention", "--seqlen", "64,,128", *tiny], "'64,,128' (item 2 is empty)"),
        (["bench", "attention", "--seqlen", ",64", *tiny], "--seqlen"),
        (["bench", "attention", "--seqlen", "64,", *tiny], "--seqlen"),
        (["bench", "attention", "--seqlen", "", *tiny], "empty list"),
        (["bench", "attention", "--seqlen", "2m", *tiny], "--seqlen"),
        (["bench", "attention", "--heads", "99999999999999999999", "--quiet"], "--heads"),
        (["bench", "attention", "--threads", "-1", "--quiet"], "--threads"),
        (["bench", "attention", "--seqlen", "1m", "--heads", "4096", "--head-dim", "256", "--quiet"], "fit in memory"),
        (["explain", "tiles", "--threads", "-2"], "--threads"),
        (["explain", "tiles", "--seqlen", "1k,2k"], "--seqlen"),
        (["kv-mem", "--model", "llama-3-8b", "--kv-cache", ""], "--kv-cache"),
        (["kv-mem", "--model", "llama-3-8b", "--kv-cache", "bf16,,int8"], "item 2 is empty"),
        (["kv-mem", "--model", "llama-3-8b", "--kv-cache", "bf16,"], "--kv-cache"),
        (["kv-mem", "--model", "llama-3-8b", "--tokens", "1.5k"], "--tokens"),
        (["kv-mem", "--model", "llama-3-8b", "--page-size", "3"], "page_size"),
        (["kv-mem", "--model", "llama-3-8b", "--tokens", "0"], "--tokens"),
        (["bench"], "subcommand"),
        (["explain"], "subcommand"),
        # item 5: sizes whose byte counts overflow int64 are refused, never printed as negative or tiny numbers
        (["kv-mem", "--tokens", "2147483647k", "--batch", "2147483647", "--model", "llama-3-8b", "--kv-cache", "bf16"],
         "--tokens/--batch"),
        (["kv-mem", "--tokens", "999999999999k", "--model", "llama-3-8b", "--kv-cache", "bf16"], "--tokens/--batch"),
        (["kv-mem", "--tokens", "99999999999999999999", "--model", "llama-3-8b"], "--tokens"),
        (["kv-mem", "--model", "llama-3-8b", "--memory", "1e30GB"], "--memory"),
        (["eval", "kv", "--formats", ",,", "--no-needle"], "--formats"),
        (["eval", "kv", "--formats", "bf16", "--needle-contexts", "1k,,2k"], "--needle-contexts"),
        (["eval", "kv", "--formats", "bf16", "--distributions", "gaussian,"], "--distributions"),
        (["eval", "kv", "--formats", "bf16", "--margin", "nan"], "--margin"),
        (["eval", "kv", "--formats", "int8", "--page-size", "7", "--no-needle"], "page_size"),
    ]:
        expect_user_error(binary, args, name)
    # 1k = 1024 wherever token counts are taken
    with tempfile.TemporaryDirectory() as tmp:
        j = Path(tmp) / "b.json"
        r = run(binary, "bench", "attention", "--seqlen", "1k", "--json", str(j), "--threads", "0", *tiny)
        expect(r.returncode == 0, f"bench --seqlen 1k: {r.stderr}")
        data = json.loads(j.read_text())
        expect([e["seqlen"] for e in data["results"]] == [1024], "bench --seqlen 1k = 1024")
        expect(data["machine"]["threads"] == os.cpu_count() or "OMP_NUM_THREADS" in os.environ,
               f"--threads 0 = all cores: {data['machine']['threads']} vs {os.cpu_count()}")
    r = run(binary, "eval", "kv", "--tokens", "1k", "--formats", "bf16,k:int8,v:int4", "--distributions", "gaussian",
            "--no-needle", "--json", "-")
    expect(r.returncode == 0, f"eval kv --tokens 1k with a k:/v: pair in --formats: {r.stderr}")
    if r.returncode == 0:
        js = json.loads(r.stdout[r.stdout.index("{"):])
        expect(js["settings"]["tokens"] == 1024, "eval kv --tokens 1k = 1024")
        expect([f["kv_cache_dtype"] for f in js["formats"]] == ["bf16", "k:int8,v:int4"], f"{js['formats']}")
    # --threads 0 means all cores in explain tiles too (it was an error there)
    r0, rn = run(binary, "explain", "tiles", "--threads", "0"), run(binary, "explain", "tiles", "--threads",
                                                                      str(os.cpu_count()))
    expect(r0.returncode == 0 and (r0.stdout == rn.stdout or "OMP_NUM_THREADS" in os.environ),
           f"explain tiles --threads 0 = --threads {os.cpu_count()}: {r0.stderr}")
    # kv-mem: the same list in commas, spaces, or both
    a = run(binary, "kv-mem", "--model", "llama-3-8b", "--kv-cache", "bf16,k:int8,v:int4", "--json", "-")
    b = run(binary, "kv-mem", "--model", "llama-3-8b", "--kv-cache", "bf16 k:int8,v:int4", "--json", "-")
    expect(a.returncode == 0 and a.stdout == b.stdout, "kv-mem --kv-cache: commas and spaces separate items alike")


def check_output_paths(binary):
    """Issue 10 item 6: every output path is checked before the work; a bad one is exit 2 with one line."""
    with tempfile.TemporaryDirectory() as tmp:
        cases = [
            (["bench", "attention", "--json", "/proc/x/b.json", "--quiet"], "--json"),
            (["bench", "attention", "--json", tmp, "--quiet"], "a directory"),
            (["kv-mem", "--model", "llama-3-8b", "--json", "/nonexistent-dir/k.json"], "--json"),
            (["eval", "kv", "--formats", "bf16", "--heatmap-dir", "/proc/x"], "--heatmap-dir"),
            (["eval", "kv", "--formats", "bf16", "--json", "/nonexistent-dir/e.json"], "--json"),
        ]
        m = model_args()
        if m:
            cases += [
                (["eval", *m, "--kv-cache", "int8", "--json", "/proc/x/e.json"], "--json"),
                (["eval", *m, "--kv-cache", "int8", "--plot", "/nonexistent-dir/p.svg"], "--plot"),
                (["eval", *m, "--kv-cache", "int8", "--text", tmp], "--text"),
                (["eval", *m, "--kv-cache", ""], "--kv-cache"),
                (["eval", *m, "--kv-cache", "bf16,,int8"], "--kv-cache"),
                (["demo", *m, "--json", "/proc/x/d.json"], "--json"),
                (["demo", *m, "--kv-cache", "int8,"], "--kv-cache"),
                (["convert", *m, "-o", "/proc/x/m.gguf"], "--output"),
                (["generate", *m, "--kv-cache", ""], "--kv-cache"),
                (["generate", *m, "--steps", "0"], "--steps"),
                (["generate", *m, "--device", "tpu"], "device"),
                (["generate", *m, "--device", "cuda:x"], "device"),
                (["generate", *m, "--cuda-graphs", "maybe"], "cuda-graphs"),
                (["bench", "serve", *m, "--prompt-len", "8:x"], "prompt-len"),
                (["bench", "serve", *m, "--output-len", "9:3"], "output-len"),
                (["bench", "serve", *m, "--output-len", "100", "--prompt-len", "40"], "output-len"),
                (["bench", "serve", *m, "--output-len", "60", "--prompt-len", "40", "--kv-pages", "1", "--page-size",
                  "16"], "kv_capacity_pages"),
                (["bench", "serve", *m, "--json", "/proc/x/s.json"], "--json"),
                (["bench", "engine", *m, "--device", "gpu"], "device"),
            ]
        else:
            print(f"note: {shipped_model.MISSING_REASON}: eval/demo/convert/generate cases skipped")
        for args, name in cases:
            expect_user_error(binary, args, name)
        if m:  # --device cuda: one typed line (exit 2) where the build or the machine has no CUDA, else it runs
            g = run(binary, "generate", *m, "--device", "cuda", "--steps", "4", "--temperature", "0", "--json")
            if g.returncode == 0:
                expect(json.loads(g.stdout)["device"] == "cuda", "generate --device cuda reports its device")
            else:
                expect_user_error(binary, ["generate", *m, "--device", "cuda"], "CUDA")
                expect_user_error(binary, ["bench", "serve", *m, "--device", "cuda", "--requests", "2", "--prompt-len",
                                           "8", "--output-len", "8"], "CUDA")
        expect(os.listdir(tmp) == [], "nothing left behind by the path checks")
        # an existing file given as --json is not modified by the check (only by the final write)
        j = Path(tmp) / "keep.json"
        j.write_text("old")
        r = run(binary, "kv-mem", "--model", "llama-3-8b", "--kv-cache", "bf16,", "--json", str(j))
        expect(r.returncode == 2 and j.read_text() == "old", "an existing output file is untouched when the run fails")


def check_eval_device(binary):
    """Issue 14: eval, eval --text, eval passkey and demo take --device cpu|cuda|cuda:N and --reference device|cpu.
    Bad values are one line, exit 2; --device cuda without the CUDA engine (no backend in this build, no device) is a
    typed one-line error, exit 2, before any work (nothing on stdout); on the CPU --reference cpu is the default's
    fp32 cache and the JSON records the device and the reference."""
    m = model_args()
    if not m:
        print(f"note: {shipped_model.MISSING_REASON}: skipped")
        return 77
    gpl = "/usr/share/common-licenses/GPL-3"
    ev = ["eval", *m, "--samples", "2", "--length", "24", "--no-progress"]
    pk = ["eval", "passkey", *m, "--contexts", "128", "--depths", "50", "--keys", "1", "--no-progress"]
    demo = ["demo", *m, "--steps", "4", "--no-progress"]
    for args, name in [
        ([*ev, "--device", "tpu"], "device"),
        ([*ev, "--device", "cuda:x"], "device"),
        ([*ev, "--device", "cuda:"], "device"),
        ([*ev, "--reference", "gpu"], "reference"),
        ([*ev, "--text", gpl, "--device", "gpu"], "device"),
        ([*pk, "--device", "cuda:-1"], "device"),
        ([*pk, "--reference", "host"], "reference"),
        ([*demo, "--device", "gpu"], "device"),
        ([*demo, "--reference", ""], "reference"),
    ]:
        expect_user_error(binary, args, name)
    why = cuda_engine_available(binary)
    if why:  # no CUDA engine here (CI): every form of --device cuda is the same typed line, before any work
        for args in ([*ev, "--device", "cuda"], [*ev, "--device", "cuda", "--kv-cache", "int8", "int4"],
                     [*ev, "--device", "cuda:0", "--reference", "cpu", "--kv-cache", "bf16"],
                     [*ev, "--device", "cuda", "--text", gpl, "--ctx", "64", "--chunks", "1"],
                     [*pk, "--device", "cuda", "--kv-cache", "int8"], [*demo, "--device", "cuda"],
                     [*demo, "--device", "cuda", "--reference", "cpu", "--kv-cache", "bf16"]):
            expect_user_error(binary, args, "CUDA")
    else:
        print("note: the CUDA engine runs here: the no-CUDA error paths are not checked (docs_cuda runs the device)")
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp) / "a.json", Path(tmp) / "b.json"
        ra = run(binary, *ev, "--kv-cache", "int8", "int4", "--json", str(a))
        rb = run(binary, *ev, "--kv-cache", "int8", "int4", "--reference", "cpu", "--device", "cpu", "--json", str(b))
        expect(ra.returncode == 0 and rb.returncode == 0, f"eval on the CPU: {ra.stderr} {rb.stderr}")
        if ra.returncode == 0 and rb.returncode == 0:
            ja, jb = json.loads(a.read_text()), json.loads(b.read_text())
            expect(ja["device"] == "cpu" and ja["target"]["reference"] == {"device": "cpu", "kv_cache_dtype": "fp32",
                                                                           "name": "fp32 cache on cpu"},
                   f"eval --json records the device and the reference: {ja.get('target')}")
            expect(ja["skipped"] == [], "nothing skipped on the CPU")
            expect([f["mean_kl"] for f in ja["formats"]] == [f["mean_kl"] for f in jb["formats"]],
                   "--reference cpu on the CPU is the default reference (the same KL)")
            expect("reference = fp32 cache" in ra.stdout, "the table names the reference")
        d = Path(tmp) / "d.json"
        r = run(binary, *demo, "--kv-cache", "bf16", "int8", "--json", str(d))
        expect(r.returncode == 0, f"demo on the CPU: {r.stderr}")
        if r.returncode == 0:
            jd = json.loads(d.read_text())
            expect(jd["device"] == "cpu" and jd["demo"]["device"] == "cpu" and jd["demo"]["skipped"] == [],
                   f"demo --json records the device: {jd.get('device')}")


def check_memory_wording(binary):
    """Issue 10 item 9: `generate` and `kv-mem` report KV memory vs bf16 with one formula and one wording."""
    m = model_args()
    if not m:
        print(f"note: {shipped_model.MISSING_REASON}: skipped")
        return 77
    for fmt in ("int8", "int4", "fp32"):
        g = run(binary, "generate", *m, "--steps", "4", "--temperature", "0", "--kv-cache", fmt, "--json")
        expect(g.returncode == 0, f"generate {fmt}: {g.stderr}")
        gj = json.loads(g.stdout)
        k = run(binary, "kv-mem", "--model", m[1], "--tokens", str(gj["kv_tokens"]), "--kv-cache", fmt, "--json", "-")
        expect(k.returncode == 0, f"kv-mem {fmt}: {k.stderr}")
        kj = json.loads(k.stdout[k.stdout.index("{"):])["formats"][0]
        expect(gj["kv_bytes"] == kj["total_bytes"], f"{fmt}: generate's bytes {gj['kv_bytes']} = kv-mem's "
               f"{kj['total_bytes']} for {gj['kv_tokens']} tokens")
        expect(abs(gj["kv_bf16_bytes"] / gj["kv_bytes"] - kj["ratio_vs_bf16"]) < 1e-9,
               f"{fmt}: one ratio vs bf16: generate {gj['kv_bf16_bytes'] / gj['kv_bytes']}, kv-mem {kj['ratio_vs_bf16']}")
        expect(gj["kv_vs_bf16"] == kj["vs_bf16"], f"{fmt}: one wording: {gj['kv_vs_bf16']!r} vs {kj['vs_bf16']!r}")
        t = run(binary, "generate", *m, "--steps", "4", "--temperature", "0", "--kv-cache", fmt)
        expect(kj["vs_bf16"] in t.stdout, f"{fmt}: the text line says {kj['vs_bf16']!r}: {t.stdout[-300:]!r}")


def check_bench_batch(binary):
    """`bench engine --batch` on the shipped model (CPU): every row's arithmetic (tok/s, mean context, bytes read per
    step from the model's shape and the format's bytes), the pool's capacity measured by filling until the engine
    refuses (= the page arithmetic), 'max' and 'does not fit' rows, an unsupported format reported, and typed errors."""
    m = model_args()
    if m is None:
        print(f"note: {shipped_model.MISSING_REASON}: skipped")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "b.json"
        r = run(binary, "bench", "engine", *m, "--kv-cache", "fp32", "int8", "--contexts", "64,100,200",
                "--batch", "1,4,16,max", "--fill", "synthetic", "--kv-pool", "1MiB", "--capacity-context", "100",
                "--batch-cap", "64", "--warmup", "1", "--n-gen", "5", "--json", str(path))
        expect(r.returncode == 0, f"bench engine --batch exit {r.returncode}: {r.stderr}")
        expect("[bench engine]" in r.stderr and "capacity:" in r.stdout, "progress on stderr, table on stdout")
        j = json.loads(path.read_text())
        c = j["model_config"]
        expect(j["config"]["fill"] == "synthetic" and "--batch" in j["command"], "config and command recorded")
        L, H, d, D, F, V = c["n_layers"], c["num_heads_kv"], c["head_dim"], c["dim"], c["hidden_dim"], c["vocab_size"]
        Q = c["num_heads"] * d
        # float32 weights on the CPU: projections + classifier (the tied embedding) + norms + the batch's rows
        mats = L * (D * (Q + 2 * H * d) + Q * D + 3 * F * D) + V * D
        per_token = {"fp32": 2 * L * H * d * 4, "int8": 2 * L * H * (d + 4)}  # codes + fp16 scale and min per head
        page = {k: 32 * v for k, v in per_token.items()}
        expect([f["status"] for f in j["formats"]] == ["ok", "ok"], f"formats ok: {j['formats']}")
        for f in j["formats"]:
            expect(f["page_bytes"] == page[f["kv_cache"]] and f["pool_pages"] == (1 << 20) // f["page_bytes"],
                   f"page bytes / pool of {f}")
        for cap in j["capacity"]:
            pages = -(-cap["context"] // 32)
            fit = cap["pool_pages"] // pages
            expect(cap["pages_per_sequence"] == pages and cap["fit"] == fit and cap["max_batch"] == min(fit, 64),
                   f"capacity arithmetic {cap}")
            if cap["context"] == 100:
                expect(cap["measured"] == fit and "lacks pages" in cap["measured_stop"],
                       f"measured by filling until CapacityError = the page arithmetic: {cap}")
            else:
                expect(cap["measured"] == -1, f"measured only at --capacity-context: {cap}")
        rows = j["rows"]
        ok = [x for x in rows if x["status"] == "ok"]
        expect({x["context"] for x in rows if x["status"] == "context > model"} == {200},
               "context 200 > the model's 128 is reported per row")
        for x in ok:
            fit = next(cp["fit"] for cp in j["capacity"] if cp["kv_cache"] == x["kv_cache"] and cp["context"] == x["context"])
            points = len({b for b in (1, 4, 16, min(fit, 64)) if b <= fit})  # the max merges with an equal batch
            expect(x["batch"] <= fit and 1 <= x["steps"] <= 5 and x["warmup"] == 1, f"row {x}")
            expect(x["depth"] == x["context"] - points * 6, f"fill depth C - points x (warmup + n_gen): {x}")
            expect(x["depth"] + 1 < x["context_mean"] <= x["context_max"] <= x["context"], f"contexts attended {x}")
            expect(abs(x["kv_read_bytes_per_step"] - x["batch"] * per_token[x["kv_cache"]] * x["context_mean"]) < 1e-6,
                   f"KV bytes per step = batch x bytes/token x tokens attended: {x}")
            expect(x["weight_bytes_per_step"] == 4 * (mats + (2 * L + 1) * D + x["batch"] * D), f"weight bytes {x}")
            expect(abs(x["tokens_per_s"] * sum(x["step_ms"]) / 1e3 - x["batch"] * x["steps"]) <
                   0.05 * x["batch"] * x["steps"], f"tok/s = batch x steps / timed seconds: {x}")
        for fmt in ("fp32", "int8"):
            for ctx in (64, 100):
                got = {x["batch"]: x for x in rows if x["kv_cache"] == fmt and x["context"] == ctx}
                fit = next(cp["fit"] for cp in j["capacity"] if cp["kv_cache"] == fmt and cp["context"] == ctx)
                mx = [b for b, x in got.items() if x["is_max"]]
                expect(mx == [min(fit, 64)] and got[mx[0]]["status"] == "ok", f"{fmt} {ctx}: the max row {got.keys()}")
                for b in (1, 4, 16):
                    expect(got[b]["status"] == ("ok" if b <= fit else "does not fit"), f"{fmt} {ctx} batch {b}")
        # fill = prefill (the model over arbitrary tokens) and an unsupported format on a device
        r = run(binary, "bench", "engine", *m, "--kv-cache", "bf16", "--contexts", "40", "--batch", "2",
                "--n-gen", "3", "--json", "-")
        expect(r.returncode == 0, f"--fill prefill: {r.stderr}")
        jp = json.loads(r.stdout[r.stdout.index("{"):])
        expect([x["status"] for x in jp["rows"]] == ["ok"] and jp["config"]["fill"] == "prefill", f"prefill {jp['rows']}")
        # a format the engine cannot run is reported with the engine's reason, never dropped: here the CUDA device of
        # a CPU build (or of a machine without a GPU); on a GPU, KIVI formats (bench/gpu/engine_bench.py)
        r = run(binary, "bench", "engine", *m, "--device", "cuda", "--kv-cache", "bf16", "int2_kivi", "--contexts", "40",
                "--batch", "1", "--fill", "synthetic", "--n-gen", "3", "--json", "-")
        if r.returncode == 0 and '"unsupported"' in r.stdout:
            ju = json.loads(r.stdout[r.stdout.index("{"):])
            expect(len(ju["formats"]) == 2 and all(f["status"] == "unsupported" and "CUDA" in f["message"]
                                                   for f in ju["formats"]) and ju["rows"] == [],
                   f"unsupported formats reported: {ju['formats']}")
            expect("unsupported" in r.stdout.split("{")[0], "the table names the unsupported formats")
        else:
            print("note: a CUDA device is present: the unsupported-format case runs on the GPU")
    bad = [(["--batch", "1,x"], "--batch"), (["--batch", "0"], "--batch"), (["--batch", "max"], "--kv-pool"),
           (["--batch", "1", "--fill", "random"], "--fill"), (["--batch", "1", "--kv-pool", "12XB"], "--kv-pool"),
           (["--batch", "1", "--contexts", "8", "--n-gen", "8"], "--contexts"),
           (["--batch", "1,2", "--contexts", "20", "--n-gen", "8", "--warmup", "2"], "--contexts"),
           (["--batch", "1", "--capacity-context", "99", "--kv-pool", "1MiB", "--contexts", "64"], "--capacity-context"),
           (["--batch", "1", "--repeats", "2"], "--batch"), (["--fill", "synthetic"], "--batch"),
           (["--batch", "1", "--point-seconds", "-1"], "--point-seconds"),
           (["--batch", "1", "--json", "/nonexistent-dir/x.json"], "--json")]
    for args, name in bad:
        expect_user_error(binary, ["bench", "engine", *m, *args], name)
    return None

def main():
    binary, check = sys.argv[1], sys.argv[2]
    rc = {"bench_json": check_bench_json, "explain": check_explain, "bad_args": check_bad_args,
          "parsing": check_parsing, "output_paths": check_output_paths,
          "memory_wording": check_memory_wording, "docs": check_docs, "bench_batch": check_bench_batch,
          "docs_cuda": check_docs_cuda, "eval_device": check_eval_device}[check](os.path.abspath(binary))
    if rc == 77 and not failed:
        return 77
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
