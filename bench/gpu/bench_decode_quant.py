#!/usr/bin/env python3
"""Quantized paged KV cache on the GPU (issue #12): one decode step of a device PagedKVCache per kv_cache_dtype, our
bf16 decode in the same run, and the quantize-on-write append. One command, JSON + markdown into --out:

    python3 bench/gpu/bench_decode_quant.py --binary build/cuda/bin/flashkv_bench_decode_quant --out bench/results \\
        [--formats bf16,fp8_e4m3,fp8_e4m3_dynamic,int8,int4] [--batches 1,16,64] [--contexts 4096,32768] [--quick]
        [--no-cudnn]

Grid (issue #12 subset): 32 query / 8 KV heads, head_dim 128, page_size 64, one layer, batch x context. Per cell:
  time per decode step  median of --calls run_decode calls (plan_decode once per batch shape, as an engine does per
                        step; CUDA events; a 256 MB memset flushes L2 before every call, so every call reads HBM);
  effective bandwidth   bytes actually read (codes + metadata of every cached token and kv head, + q and out) / time,
                        and that as a fraction of the HBM read bandwidth measured in the same run (a streaming read
                        kernel over 4 GiB);
  vs bf16               time of our bf16 decode / time of the format (same batch x context).
cuDNN bf16 (when torch is importable; --no-cudnn skips it): torch SDPA with the cuDNN backend on the same shapes
(contiguous [batch, 8, context, 128] bf16 K / V, enable_gqa), timed by triton.testing.do_bench (L2 flushed), as the
anchor row "cudnn_bf16" (bytes: 2·batch·8·context·128·2); "vs cuDNN" = its time / the format's time.
Append: the device append (quantize on write) of `context` tokens into each of max(batch) sequences, wall time of the
synchronous PagedKVCache::append calls; throughput = code + metadata bytes written / time, and the bf16 input read /
time, vs the HBM write bandwidth of the same run (memset of 4 GiB).
The timing helper is the C++ executable flashkv_bench_decode_quant (bench/gpu/decode_quant_bench.cpp, built with the
cuda preset); it prints one JSON object per line, which this script collects.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys


def run(args):
    cmd = [args.binary, "--formats", args.formats, "--batches", args.batches, "--contexts", args.contexts,
           "--heads", "32", "--heads-kv", "8", "--head-dim", "128", "--page-size", str(args.page_size),
           "--calls", str(args.calls)]
    print("running:", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rows = []
    for line in p.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
            print(line, flush=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        sys.exit(f"{args.binary} exited with {p.returncode}")
    return cmd, rows


def cudnn_rows(batches, contexts):
    """torch SDPA (cuDNN backend) bf16 decode on the grid, in this process (after the helper has exited)."""
    try:
        import torch
        import torch.nn.functional as F
        import triton.testing as tt
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:  # noqa: BLE001 - optional anchor
        return [{"kind": "error", "format": "cudnn_bf16", "context": 0, "error": f"torch/triton unavailable: {e}"}]
    rows = []
    hq, hk, d = 32, 8, 128
    for ctx in contexts:
        for b in batches:
            try:
                q = torch.randn(b, hq, 1, d, dtype=torch.bfloat16, device="cuda")
                k = torch.randn(b, hk, ctx, d, dtype=torch.bfloat16, device="cuda")
                v = torch.randn_like(k)

                def fn():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                ms = tt.do_bench(fn, warmup=25, rep=100, return_mode="median")
                rows.append({"kind": "decode", "format": "cudnn_bf16", "batch": b, "context": ctx, "ms_median": ms,
                             "ms_min": ms, "kv_bytes": 2.0 * b * hk * ctx * d * 2, "qo_bytes": 2.0 * b * hq * d * 2,
                             "num_splits": 0, "path": "torch SDPA cuDNN"})
            except Exception as e:  # noqa: BLE001
                rows.append({"kind": "error", "format": "cudnn_bf16", "context": ctx, "error": str(e)[:160]})
            print(json.dumps(rows[-1]), flush=True)
            q = k = v = None
            torch.cuda.empty_cache()
    return rows


def tables(rows):
    anchor = next(r for r in rows if r["kind"] == "anchor")
    read_bw, write_bw = anchor["read_TBps"], anchor["write_TBps"]
    copy_bw = anchor.get("copy_TBps")
    dec = [r for r in rows if r["kind"] == "decode"]
    bf16 = {(r["batch"], r["context"]): r["ms_median"] for r in dec if r["format"] == "bf16"}
    cudnn = {(r["batch"], r["context"]): r["ms_median"] for r in dec if r["format"] == "cudnn_bf16"}
    out = []
    out.append(f"HBM anchors (same run): read {read_bw:.2f} TB/s, write {write_bw:.2f} TB/s"
               + (f", device-to-device copy {copy_bw:.2f} TB/s (read + written)" if copy_bw else "") + "\n")
    out.append("| format | batch | context | µs / step | KV MB read | TB/s effective | % of HBM read | vs bf16 | vs cuDNN bf16 "
               "| splits |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in sorted(dec, key=lambda r: (r["context"], r["batch"], r["format"] != "bf16", r["format"])):
        ms = r["ms_median"]
        bw = (r["kv_bytes"] + r["qo_bytes"]) / (ms * 1e-3) / 1e12
        r["effective_TBps"] = bw
        r["fraction_of_read_bw"] = bw / read_bw
        base = bf16.get((r["batch"], r["context"]))
        r["speedup_vs_bf16"] = base / ms if base else None
        sp = f"{r['speedup_vs_bf16']:.2f}x" if base else "–"
        cd = cudnn.get((r["batch"], r["context"]))
        r["speedup_vs_cudnn"] = cd / ms if cd else None
        sc = f"{cd / ms:.2f}x" if cd else "–"
        out.append(f"| {r['format']} | {r['batch']} | {r['context']} | {ms * 1e3:.1f} | {r['kv_bytes'] / 1e6:.1f} | "
                   f"{bw:.2f} | {100 * bw / read_bw:.0f}% | {sp} | {sc} | {r['num_splits']} |")
    out.append("")
    out.append("Append: `per_sequence` = one call per sequence of `context` tokens (each checked and synchronized), "
               "`batched` = all sequences in one call (best of 3). % of HBM write = bytes written / the memset anchor; "
               "% of copy = (bf16 input read + bytes written) / the copy anchor (an append must read its input).")
    out.append("")
    out.append("| format | mode | context | sequences | append ms | GB written (codes + meta) | GB/s written | "
               "GB/s bf16 input read | % of HBM write | % of copy (read + written) |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in [r for r in rows if r["kind"] == "append"]:
        w = r["bytes_written"] / r["seconds"] / 1e9
        i = r["bytes_input"] / r["seconds"] / 1e9
        r["written_GBps"], r["input_GBps"] = w, i
        cpy = f"{100 * (w + i) / (copy_bw * 1e3):.0f}%" if copy_bw else "–"
        out.append(f"| {r['format']} | {r.get('mode', 'per_sequence')} | {r['context']} | {r['sequences']} | "
                   f"{r['seconds'] * 1e3:.2f} | {r['bytes_written'] / 1e9:.2f} | {w:.0f} | {i:.0f} | "
                   f"{100 * w / (write_bw * 1e3):.0f}% | {cpy} |")
    errs = [r for r in rows if r["kind"] == "error"]
    if errs:
        out.append("")
        out.append("Not run:")
        for r in errs:
            out.append(f"- {r['format']} context {r['context']}: {r['error']}")
    paths = sorted({r["path"] for r in dec})
    out.append("")
    out.append("Kernel paths: " + "; ".join(f"`{p}`" for p in paths))
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/cuda/bin/flashkv_bench_decode_quant")
    ap.add_argument("--out", required=True, help="directory for the JSON and markdown results")
    ap.add_argument("--formats", default="bf16,fp8_e4m3,fp8_e4m3_dynamic,int8,int4")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--contexts", default="4096,32768")
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="batch 1,16 x context 4096 only, 10 calls")
    ap.add_argument("--no-cudnn", action="store_true", help="skip the torch SDPA cuDNN bf16 anchor")
    a = ap.parse_args()
    if a.quick:
        a.batches, a.contexts, a.calls = "1,16", "4096", 10
    if not os.path.exists(a.binary):
        sys.exit(f"{a.binary} not found: build it with cmake --build build/cuda --target flashkv_bench_decode_quant")
    cmd, rows = run(a)
    if not a.no_cudnn:
        rows += cudnn_rows([int(x) for x in a.batches.split(",")], [int(x) for x in a.contexts.split(",")])
    md = tables(rows)
    os.makedirs(a.out, exist_ok=True)
    stamp = datetime.date.today().isoformat()
    base = os.path.join(a.out, f"gpu-decode-quant-{stamp}")
    with open(base + ".json", "w") as f:
        json.dump({"command": cmd, "rows": rows}, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(f"# Quantized paged KV decode on the GPU ({stamp})\n\n`{' '.join(cmd)}`\n\n" + md)
    print(md)
    print("wrote", base + ".json", base + ".md")


if __name__ == "__main__":
    main()
