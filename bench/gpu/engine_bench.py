#!/usr/bin/env python3
"""The generation chain's benchmark on one GPU (issue 14 "Benchmark"), anchors measured in the same run:

  models   llama3-8b: a Llama-3-8B-shaped model (32 layers, 32 / 8 heads of 128, hidden 4096, intermediate 14336,
           vocab 128256) with seeded random bf16 weights; smollm2-135m: SmolLM2-135M (its GGUF when --smollm2-gguf
           exists — scripts/setup fetches it; else a random model of its shape, said so in the table). The random
           models are built in transformers (LlamaForCausalLM, attn_implementation "sdpa") and written as GGUF by
           bench/gpu/hf_llama_gguf.py, so flashkv and the transformers anchor run the same weights
           (tests/engine/test_hf_gguf.py proves the mapping on the CPU).
  flashkv  `flashkv bench engine --device cuda --batch ... --fill synthetic` (eval/batch_decode.hpp): decode tok/s per
           kv_cache_dtype x context x batch (1, 8, 64, 256, max that fits), the most sequences of each context the
           page pool holds and, at 8k, that number MEASURED by filling sequences until the engine refuses one
           (CapacityError); the pool = the GPU's free memory (nvidia-smi, before the engine starts) minus the engine's
           weights and a reserve for activations. int2_kivi: the CUDA engine does not decode KIVI: reported as
           unsupported with the engine's reason.
  context  FILLED WITHOUT PREFILL on both sides: flashkv appends seeded synthetic K/V straight into its cache
           (Engine::append_synthetic, quantized on write like model K/V); transformers' caches get torch.randn K/V
           (DynamicCache.update / StaticCache.update). Then timed decode steps of the model itself: step = forward of
           B tokens over the cache + greedy argmax, ending synchronized. Decode cost does not depend on the values.
  limit    per step: (weight bytes + KV bytes read) / HBM bandwidth measured in this run (device-to-device copy,
           read+write, and a read-only reduction; the larger is used: the stricter limit). KV bytes = codes +
           metadata of the tokens each sequence attends (kv_memory_estimate). Also the compute floor
           2 x matrix parameters x B / the measured bf16 GEMM rate, shown where it exceeds the memory limit.
  anchor   transformers on the same 8B-shaped weights (and SmolLM2-shaped ones), bf16, sdpa, DynamicCache and
           StaticCache (eager; --hf-compile adds torch.compile "reduce-overhead" of the StaticCache forward at 8k x 64),
           decode tok/s at the same batch / context where the bf16 cache fits next to the weights.
Writes $OUT/engine_bench.json and $OUT/engine_bench.md (+ the flashkv CLI's JSON and logs).

  python3 bench/gpu/engine_bench.py --out $OUT [--flashkv build/cuda/bin/flashkv] [--models llama3-8b,smollm2-135m]
  python3 bench/gpu/engine_bench.py --smoke --out /tmp/eb --flashkv build/ci/bin/flashkv     (CPU, tiny shapes)
"""
import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

from _bench_util import sample_seconds  # noqa: E402
from engine_bench_report import GiB, matrix_params, report  # noqa: E402

FORMATS = "bf16,int4,int8,fp8_e4m3,int2_kivi"  # run order: the targets' formats first (time budgets)
# where scripts/setup puts it (flashkv::fetched_models_dir(): $FLASHKV_MODEL_HOME, else <source>/models)
SMOLLM2_GGUF = (Path(os.environ.get("FLASHKV_MODEL_HOME") or REPO / "models") / "smollm2-135m"
                / "SmolLM2-135M-Instruct.Q4_1.gguf")


def log(*a):
    print(*a, flush=True)


def parse_tokens(s):
    s = s.strip().lower()
    return int(s[:-1]) * 1024 if s.endswith("k") else int(s)


# ---------------------------------------------------------------------------------------------------- shapes / bytes
def shape_dims(shape, smoke):
    import hf_llama_gguf as hg

    d = dict(hg.SHAPES["tiny" if smoke else shape])
    if smoke and shape == "smollm2-135m":  # a second tiny shape for the smoke run (tied, 4 KV heads)
        d.update(num_key_value_heads=4, tie_word_embeddings=True)
    return d


def engine_device_bytes(d, max_ctx):
    """What the CUDA engine holds besides the KV pool (src/engine/cuda/cuda_engine.cpp): bf16 matrices and classifier,
    float32 embedding and norms, RoPE tables, the synthetic-fill staging buffer."""
    h, kv = d["hidden_size"], d["num_key_value_heads"] * d["head_dim"]
    return (2 * matrix_params(d) + 4 * d["vocab_size"] * h + 4 * (2 * d["num_hidden_layers"] + 1) * h
            + 2 * 4 * max_ctx * d["head_dim"] // 2 + 2 * 2 * min(max_ctx, 32768) * kv)


def activation_bytes(d, rows):
    """The engine's per-row buffers (x, xb, qkv, q/k/v/att, gate-up, hidden, logits) + sampling and split-KV scratch
    (generous: 3x the logits row and 64 splits of the attention output)."""
    h, q, kv, f, v = (d["hidden_size"], d["num_attention_heads"] * d["head_dim"], d["num_key_value_heads"] * d["head_dim"],
                      d["intermediate_size"], d["vocab_size"])
    per_row = 4 * h + 2 * max(h, q) + 4 * (q + 2 * kv) + 2 * (2 * q + 2 * kv) + 8 * f + 2 * f + 4 * v
    return rows * (per_row + 12 * v + 64 * 4 * q)


def kv_bytes_per_token_bf16(d):
    return 2 * d["num_hidden_layers"] * d["num_key_value_heads"] * d["head_dim"] * 2


# ---------------------------------------------------------------------------------------------------- torch worker
def ceilings(torch, dev):
    """HBM ceilings as bench_attention.py measures them: copy 2^30 B (read + write), read 2^30 B (a bf16 sum), an
    8192^3 bf16 GEMM; median of 20 after warm-up (CUDA events)."""
    def t(fn, rep=20):
        ts = sample_seconds(fn, rep, warmup=3, device=dev)
        return sorted(ts)[len(ts) // 2]

    n = 2 ** 30 if dev == "cuda" else 2 ** 26
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    copy = 2 * n / t(lambda: b.copy_(a))
    x = torch.randn(n // 2, dtype=torch.bfloat16, device=dev)
    read = n / t(lambda: x.sum())
    m = 8192 if dev == "cuda" else 512
    A = torch.randn(m, m, dtype=torch.bfloat16, device=dev)
    B = torch.randn_like(A)
    gemm = 2 * m ** 3 / t(lambda: A @ B, rep=5)
    del a, b, x, A, B
    return {"copy_Bps": copy, "read_Bps": read, "hbm_Bps": max(copy, read), "bf16_gemm_flops": gemm}


def hf_point(torch, model, cfg, kind, batch, ctx, depth, warmup, n_gen, seconds, dev, compiled=None):
    """transformers' decode at `batch` x `ctx`: the cache filled with randn K/V to `depth` tokens, then up to `warmup`
    and n_gen timed steps of model(...) + argmax (the step's tokens feed the next), each synchronized; wall clock per
    step; each loop stops after `seconds` (at least one step)."""
    from transformers import DynamicCache, StaticCache

    L, hk, hd = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
    g = torch.Generator(device=dev).manual_seed(1234)
    cache = DynamicCache(config=cfg) if kind == "DynamicCache" else StaticCache(config=cfg, max_cache_len=ctx)
    t_fill = time.perf_counter()
    with torch.no_grad():
        pos = torch.arange(depth, device=dev)
        for l in range(L):
            k = torch.randn(batch, hk, depth, hd, device=dev, dtype=torch.bfloat16, generator=g)
            v = torch.randn(batch, hk, depth, hd, device=dev, dtype=torch.bfloat16, generator=g)
            cache.update(k, v, l, None if kind == "DynamicCache" else {"cache_position": pos})
            del k, v
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    sync()
    fill = time.perf_counter() - t_fill
    fwd = compiled or model
    state = {"tok": torch.randint(0, cfg.vocab_size, (batch, 1), device=dev, generator=g), "pos": depth}

    def step():
        cp = torch.tensor([state["pos"]], device=dev)
        out = fwd(input_ids=state["tok"], past_key_values=cache, use_cache=True, cache_position=cp,
                  position_ids=cp.view(1, 1).expand(batch, 1))
        state["tok"] = out.logits[:, -1].argmax(-1, keepdim=True)
        sync()
        state["pos"] += 1

    def loop(n):
        times, t0 = [], time.perf_counter()
        for _ in range(n):
            s = time.perf_counter()
            step()
            times.append(time.perf_counter() - s)
            if seconds and time.perf_counter() - t0 >= seconds:
                break
        return times

    with torch.no_grad():
        warm = len(loop(warmup)) if warmup else 0
        times = loop(n_gen)
    del cache
    return {"kind": kind + (" compiled" if compiled else ""), "batch": batch, "context": ctx, "depth": depth,
            "warmup": warm, "steps": len(times), "fill_seconds": fill,
            "step_ms_median": 1e3 * sorted(times)[len(times) // 2], "step_ms_mean": 1e3 * sum(times) / len(times),
            "tokens_per_s": batch * len(times) / sum(times), "context_mean": depth + warm + (len(times) + 1) / 2}


def hf_anchor(torch, model, cfg, spec, dev):
    """The anchor grid: every (context, batch) of spec["hf_points"] whose bf16 cache and the largest transient of a
    step fit next to the weights; both caches; OOM recorded, never fatal; stops at spec["hf_budget"] seconds."""
    rows, t0 = [], time.perf_counter()
    kv_tok = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    free = torch.cuda.mem_get_info()[0] if dev == "cuda" else 64 * GiB
    for ctx, batch in spec["hf_points"]:
        cache = batch * ctx * kv_tok
        # StaticCache + sdpa with a mask expands K and V of one layer to all query heads (repeat_kv)
        transient = 2 * batch * cfg.num_attention_heads * ctx * cfg.head_dim * 2 + batch * cfg.vocab_size * 4
        for kind in ("DynamicCache", "StaticCache"):
            base = {"kind": kind, "batch": batch, "context": ctx}
            if cache + transient > 0.92 * free:
                rows.append(dict(base, status="does not fit",
                                 message=f"bf16 cache {cache / GiB:.1f} GiB + step transient {transient / GiB:.1f} GiB > "
                                         f"92% of the {free / GiB:.1f} GiB free next to the weights"))
                continue
            if time.perf_counter() - t0 > spec["hf_budget"]:
                rows.append(dict(base, status="skipped", message=f"anchor time budget {spec['hf_budget']} s spent"))
                continue
            try:
                r = hf_point(torch, model, cfg, kind, batch, ctx, ctx - spec["points"] * (spec["warmup"] + spec["n_gen"]),
                             spec["warmup"], spec["n_gen"], spec["point_seconds"], dev)
                r["status"] = "ok"
                rows.append(r)
                log(f"[hf] {kind:12s} ctx {ctx:6d} batch {batch:4d}: {r['step_ms_median']:9.3f} ms/step, "
                    f"{r['tokens_per_s']:9.1f} tok/s ({r['steps']} steps, fill {r['fill_seconds']:.1f} s)")
            except Exception as e:  # noqa: BLE001 - recorded (OOM or anything else), not hidden
                rows.append(dict(base, status="error", message=f"{type(e).__name__}: {str(e)[:200]}"))
                log(f"[hf] {kind} ctx {ctx} batch {batch}: {type(e).__name__}")
            if dev == "cuda":
                torch.cuda.empty_cache()
    if spec.get("hf_compile") and dev == "cuda":
        rows.append(hf_compiled(torch, model, cfg, spec, dev))
    return rows


def hf_compiled(torch, model, cfg, spec, dev):
    ctx, batch = spec["hf_compile_point"]
    base = {"kind": "StaticCache compiled", "batch": batch, "context": ctx}
    try:
        t = time.perf_counter()
        compiled = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        r = hf_point(torch, model, cfg, "StaticCache", batch, ctx, ctx - spec["points"] * (spec["warmup"] + spec["n_gen"]),
                     max(3, spec["warmup"]), spec["n_gen"], spec["point_seconds"] * 60, dev, compiled=compiled)
        r.update(status="ok", compile_and_run_seconds=time.perf_counter() - t)
        log(f"[hf] StaticCache compiled ctx {ctx} batch {batch}: {r['tokens_per_s']:.1f} tok/s")
        return r
    except Exception as e:  # noqa: BLE001 - recorded, not hidden
        return dict(base, status="error", message=repr(e)[:300])


def worker(spec_path):
    """One model's torch work in its own process (its GPU memory is all returned when it exits): ceilings (first
    model), the seeded transformers model, its GGUF, the transformers anchor. Writes spec["result"]."""
    import torch

    import hf_llama_gguf as hg

    spec = json.loads(Path(spec_path).read_text())
    dev = spec["device"]
    res = {"torch": torch.__version__}
    try:
        import transformers

        res["transformers"] = transformers.__version__
    except ImportError:
        res["transformers"] = None
    if dev == "cuda":
        res["gpu"] = torch.cuda.get_device_name()
    if spec["ceilings"]:
        res["ceilings"] = ceilings(torch, dev)
        log("[ceilings]", {k: f"{v:.4g}" for k, v in res["ceilings"].items()})
    t = time.perf_counter()
    overrides = {k: v for k, v in spec["dims"].items() if k in ("hidden_size", "num_attention_heads",
                                                                 "num_key_value_heads", "head_dim",
                                                                 "tie_word_embeddings")}
    cfg = hg.config("tiny" if spec["smoke"] else spec["shape"], max_position_embeddings=spec["context_length"],
                    **(overrides if spec["smoke"] else {}))
    model = hg.build_model(cfg, spec["seed"], device=dev, dtype=torch.bfloat16)
    res["build_seconds"] = time.perf_counter() - t
    if spec["gguf_out"]:
        t = time.perf_counter()
        res["gguf_bytes"] = hg.write_gguf(model, spec["gguf_out"], context_length=spec["context_length"],
                                          name=f"flashkv engine_bench {spec['shape']} seed {spec['seed']}")
        res["gguf_seconds"] = time.perf_counter() - t
        log(f"[gguf] {spec['gguf_out']}: {res['gguf_bytes'] / 1e9:.2f} GB in {res['gguf_seconds']:.1f} s "
            f"(model built in {res['build_seconds']:.1f} s)")
    res["hf"] = hf_anchor(torch, model, cfg, spec, dev) if spec["hf"] else []
    Path(spec["result"]).write_text(json.dumps(res))


# ---------------------------------------------------------------------------------------------------- main process
def nvidia_smi():
    """name, total and free bytes of GPU 0 (None off a GPU): read before the engine's process starts."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.free",
                              "--format=csv,noheader,nounits", "-i", "0"], capture_output=True, text=True, timeout=30)
        name, driver, total, free = [x.strip() for x in out.stdout.strip().split(",")]
        return {"name": name, "driver": driver, "total_bytes": int(total) * 2 ** 20, "free_bytes": int(free) * 2 ** 20}
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def run_streamed(cmd, log_path, timeout, env=None):
    """Runs cmd, printing and logging its stderr (progress) as it comes; returns (rc, stdout)."""
    log("$ " + " ".join(str(c) for c in cmd))
    with open(log_path, "w") as lf:
        p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        t0 = time.time()
        out_lines = []
        def pump_out():
            for line in p.stdout:
                out_lines.append(line)

        th = threading.Thread(target=pump_out, daemon=True)
        th.start()
        watchdog = threading.Timer(timeout, p.kill)  # a hung run is killed, its partial output kept
        watchdog.start()
        for line in p.stderr:
            lf.write(line)
            print("   " + line.rstrip(), flush=True)
        p.wait()
        watchdog.cancel()
        th.join()
        killed = time.time() - t0 >= timeout
        return (124 if killed else p.returncode), "".join(out_lines)


def run_model(a, shape, first, out, work):
    dims = shape_dims(shape, a.smoke)
    contexts = [parse_tokens(c) for c in a.contexts.split(",")]
    ctx_len = max(contexts) if a.smoke else max(131072 if shape == "llama3-8b" else 32768, max(contexts))
    rec = {"shape": shape, "dims": dims}
    real = shape == "smollm2-135m" and not a.smoke and Path(a.smollm2_gguf).is_file()
    gguf = Path(work) / f"{shape}-seed{a.seed}.gguf"
    rec["weights"] = ("SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to bf16 on load)" if real else
                      f"random bf16, seed {a.seed} (bench/gpu/hf_llama_gguf.py), the same in flashkv and transformers")
    if shape == "smollm2-135m" and not real and not a.smoke:
        rec["note"] = (f"SmolLM2-135M's GGUF not found at {a.smollm2_gguf} (scripts/setup fetches it; 93 MB, more than "
                       f"the device tool carries): its shape runs with random weights, context extended to {ctx_len}")
        log("[note]", rec["note"])
    # 1. torch worker: ceilings, weights, GGUF, anchor
    hf_points = [(parse_tokens(c), b) for c, b in
                 ((c, b) for c in a.contexts.split(",") for b in [int(x) for x in a.batches.split(",") if x != "max"])]
    spec = {"shape": shape, "dims": dims, "smoke": a.smoke, "seed": a.seed, "device": "cpu" if a.smoke else "cuda",
            "context_length": ctx_len, "ceilings": first, "gguf_out": None if real else str(gguf),
            "hf": not a.no_hf, "hf_points": hf_points, "points": len(set(a.batches.split(","))),
            "hf_budget": a.hf_budget, "warmup": a.warmup,
            "n_gen": a.n_gen, "point_seconds": a.point_seconds, "hf_compile": a.hf_compile and shape == "llama3-8b",
            "hf_compile_point": (8192, 64), "result": str(Path(work) / f"{shape}-worker.json")}
    spec_path = Path(work) / f"{shape}-spec.json"
    spec_path.write_text(json.dumps(spec))
    t = time.time()
    try:
        rc = subprocess.run([sys.executable, __file__, "--worker", str(spec_path)], timeout=a.worker_timeout).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    rec["worker_seconds"] = time.time() - t
    if rc != 0 or not Path(spec["result"]).is_file():  # recorded; the other models still run
        rec["flashkv_error"] = f"the torch worker (weights, GGUF, anchor) failed: exit {rc}; see the log above"
        log("[error]", shape, rec["flashkv_error"])
        return rec
    w = json.loads(Path(spec["result"]).read_text())
    rec.update({k: w.get(k) for k in ("build_seconds", "gguf_bytes", "gguf_seconds", "torch", "transformers", "gpu")})
    rec["hf"] = w["hf"]
    if "ceilings" in w:
        rec["ceilings"] = w["ceilings"]
    # 2. the flashkv engine: pool = free memory - weights - reserve
    model_path = a.smollm2_gguf if real else gguf
    dev_bytes = engine_device_bytes(dims, ctx_len if not real else 8192)
    cap = a.batch_cap
    if a.smoke:
        pool = a.smoke_pool
        rec["pool"] = {"pool_bytes": pool, "rule": "--smoke: a fixed pool"}
    else:
        g = nvidia_smi()
        reserve = int(a.reserve_gib * GiB) + 2 * activation_bytes(dims, cap)
        pool = g["free_bytes"] - dev_bytes - reserve
        rec["pool"] = {"free_bytes": g["free_bytes"], "total_bytes": g["total_bytes"], "engine_bytes": dev_bytes,
                       "reserve_bytes": reserve, "pool_bytes": pool,
                       "rule": "GPU free memory before the engine starts - the engine's weights, tables and staging - "
                               f"({a.reserve_gib} GiB + 2 x the activations of {cap} rows)"}
    log(f"[pool] {shape}: {json.dumps(rec['pool'])}")
    fk_json = out / f"engine_bench_flashkv_{shape}.json"
    cmd = [a.flashkv, "bench", "engine", "--model", model_path, "--device", "cpu" if a.smoke else "cuda",
           "--kv-cache", *a.formats.split(","), "--contexts", a.contexts, "--batch", a.batches, "--fill", "synthetic",
           "--warmup", str(a.warmup), "--n-gen", str(a.n_gen), "--point-seconds", str(a.point_seconds),
           "--kv-pool", str(pool), "--batch-cap", str(cap), "--seed", str(a.seed), "--json", fk_json]
    cap_ctx = parse_tokens(a.capacity_context)
    if cap_ctx in contexts and (shape == "llama3-8b" or a.smoke or a.capacity_all):
        cmd += ["--capacity-context", str(cap_ctx), "--probe-cap", str(a.probe_cap)]
    budget = a.budget_8b if shape == "llama3-8b" else a.budget_small
    cmd += ["--time-budget", str(budget)]
    t = time.time()
    rc, stdout = run_streamed(cmd, out / f"engine_bench_flashkv_{shape}.log", timeout=budget + a.load_allowance)
    rec["flashkv_seconds"] = time.time() - t
    (out / f"engine_bench_flashkv_{shape}.txt").write_text(stdout)
    rec["flashkv_command"] = " ".join(str(c) for c in cmd)
    if rc != 0 or not fk_json.is_file():
        rec["flashkv_error"] = f"exit {rc} (log: engine_bench_flashkv_{shape}.log)"
        log("[error]", rec["flashkv_error"])
    else:
        rec["flashkv"] = json.loads(fk_json.read_text())
    # 3. the kv-mem formula at the capacity context, for the GPU's memory next to the engine's weights, for the formats
    # as the engine fitted them to head_dim (e.g. int2_kivi_g16)
    total = a.smoke_pool + dev_bytes if a.smoke else rec["pool"]["total_bytes"]
    names = [f["kv_cache"].split(" ")[0] for f in rec["flashkv"]["formats"]] if "flashkv" in rec else a.formats.split(",")
    km = subprocess.run([a.flashkv, "kv-mem", "--layers", str(dims["num_hidden_layers"]), "--kv-heads",
                         str(dims["num_key_value_heads"]), "--head-dim", str(dims["head_dim"]), "--tokens",
                         str(cap_ctx), "--kv-cache", ",".join(names), "--memory", str(total), "--weights",
                         str(dev_bytes), "--json", "-"], capture_output=True, text=True, timeout=60)
    if km.returncode == 0:
        rec["kv_mem"] = json.loads(km.stdout[km.stdout.index("{"):])
        rec["kv_mem"]["command"] = " ".join(km.args)
    else:
        rec["kv_mem_error"] = km.stderr.strip()
    return rec


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/flashkv-engine-bench"))
    p.add_argument("--flashkv", default=os.environ.get("FLASHKV_CLI", str(REPO / "build" / "cuda" / "bin" / "flashkv")))
    p.add_argument("--models", default="llama3-8b,smollm2-135m")
    p.add_argument("--smollm2-gguf", default=str(SMOLLM2_GGUF))
    p.add_argument("--formats", default=FORMATS)
    p.add_argument("--contexts", default="8k,1k,32k", help="in run order (8k first: the targets')")
    p.add_argument("--batches", default="1,8,64,256,max")
    p.add_argument("--batch-cap", type=int, default=512, help="'max' is at most this many sequences")
    p.add_argument("--capacity-context", default="8k")
    p.add_argument("--capacity-all", action="store_true", help="measure capacity for every model (default: the 8B)")
    p.add_argument("--probe-cap", type=int, default=4096)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--n-gen", type=int, default=8)
    p.add_argument("--point-seconds", type=float, default=1.0)
    p.add_argument("--reserve-gib", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--budget-8b", type=float, default=150.0, help="flashkv points not started after this: skipped")
    p.add_argument("--budget-small", type=float, default=35.0)
    p.add_argument("--load-allowance", type=float, default=120.0, help="model load + engine builds on top of a budget")
    p.add_argument("--hf-budget", type=float, default=45.0)
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--hf-compile", action="store_true", help="also torch.compile the StaticCache forward at 8k x 64")
    p.add_argument("--worker-timeout", type=float, default=420.0)
    p.add_argument("--work-dir", default=None, help="where the GGUFs go (default /dev/shm if it has room, else /tmp)")
    p.add_argument("--keep-gguf", action="store_true")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shapes: checks the pipeline, measures nothing")
    p.add_argument("--smoke-pool", type=int, default=4 * 2 ** 20)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a.worker)
    if a.smoke:
        a.contexts = a.contexts if a.contexts != "8k,1k,32k" else "128,64"
        a.capacity_context = "128" if a.capacity_context == "8k" else a.capacity_context
        a.batches = a.batches if a.batches != "1,8,64,256,max" else "1,2,max"
        a.batch_cap = min(a.batch_cap, 16)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    gpu = None if a.smoke else nvidia_smi()
    if not a.smoke and gpu is None:
        raise SystemExit("no GPU (nvidia-smi failed): run with --smoke on a CPU")
    if not Path(a.flashkv).is_file():
        raise SystemExit(f"flashkv CLI not found: {a.flashkv} (--flashkv or FLASHKV_CLI)")
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    meta = {"gpu": gpu["name"] if gpu else None, "driver": gpu["driver"] if gpu else None,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python3"] + sys.argv),
            "flashkv": a.flashkv, "commit": commit.stdout.strip() or "unknown", "smoke": a.smoke,
            "batches": a.batches, "contexts": a.contexts, "warmup": a.warmup, "n_gen": a.n_gen,
            "point_seconds": a.point_seconds, "formats": a.formats}
    log("[engine_bench]", json.dumps(meta))
    work = a.work_dir
    if work is None:
        need = 17e9 if "llama3-8b" in a.models and not a.smoke else 1e9
        work = "/dev/shm" if os.path.isdir("/dev/shm") and shutil.disk_usage("/dev/shm").free > 1.2 * need else "/tmp"
    work = tempfile.mkdtemp(prefix="flashkv-engine-bench-", dir=work)
    res = {"meta": meta, "models": []}
    try:
        for i, shape in enumerate(a.models.split(",")):
            rec = run_model(a, shape, i == 0, out, work)
            if "ceilings" in rec:
                res["ceilings"] = rec.pop("ceilings")
            res["models"].append(rec)
            for f in Path(work).glob("*.gguf"):
                if not a.keep_gguf:
                    f.unlink()
            res["wall_seconds"] = time.time() - t0  # written after each model: a run killed later keeps these
            report(res, out)
            (out / "engine_bench.json").write_text(json.dumps(res, indent=1))
    finally:
        if not a.keep_gguf:
            shutil.rmtree(work, ignore_errors=True)
    res["wall_seconds"] = time.time() - t0
    text = report(res, out)
    (out / "engine_bench.json").write_text(json.dumps(res, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
