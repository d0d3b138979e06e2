#!/usr/bin/env python3
"""Context-parallel ring attention (flashkv.torch.distributed) on 2 GPUs vs flashkv on 1 GPU (issue 17).

For seqlen in 128k, 256k, 512k, 1M tokens (batch 1, 16 heads, head_dim 128, bf16), causal (zigzag sharding) and
not: forward and forward+backward time of ring_attention on the W ranks, of flashkv.torch.attention on the whole
sequence on one GPU (rank 0 alone, where it fits), the speedup (1-GPU time / W-GPU time; target >= 1.85x at >= 256k)
and the overlap efficiency = compute-only time / wall time, where compute-only runs the same per-step flashkv calls
with the transfers replaced by local copies (target: communication >= 90% hidden, efficiency >= 0.9).
NVLink multicast stays off (NCCL_NVLS_ENABLE=0). Writes $OUT/ring_bench.json and $OUT/ring_bench.md (rank 0).

  NCCL_NVLS_ENABLE=0 PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so \\
    LD_LIBRARY_PATH=$PWD/build/cuda/devlibs torchrun --nproc_per_node=2 bench/gpu/ring_bench.py --out $OUT
"""
import argparse
import json
import os
import statistics

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import flashkv.torch as ft  # noqa: E402
from flashkv.torch import distributed as fd  # noqa: E402
from _bench_util import sample_seconds  # noqa: E402  (bench/gpu: the script's folder)


DEV = "cuda"


def timed(fn, reps, group=None):
    dist.barrier(group)
    t = torch.tensor([_local_timed(fn, reps)], device=DEV)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/flashkv-ring-bench"))
    p.add_argument("--sizes", default="131072,262144,524288,1048576")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-single", action="store_true", help="skip the 1-GPU baseline")
    p.add_argument("--smoke", action="store_true", help="gloo + CPU tensors, tiny sizes: checks the script only")
    args = p.parse_args()
    global DEV
    if args.smoke:
        DEV, args.sizes = "cpu", "512,1024"
    dist.init_process_group("gloo" if args.smoke else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    if not args.smoke:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    gpu = torch.cuda.get_device_name() if DEV == "cuda" else "cpu (smoke)"
    h, d = 16, 128
    rows = []
    for s in (int(x) for x in args.sizes.split(",")):
        for causal in (True, False):
            sharding = "zigzag" if causal else "contiguous"
            n = s // world
            g = torch.Generator(device=DEV).manual_seed(rank)
            q, k, v = (torch.randn(1, n, h, d, device=DEV, dtype=torch.bfloat16, generator=g).requires_grad_(True)
                       for _ in range(3))
            dout = torch.randn(1, n, h, d, device=DEV, dtype=torch.bfloat16, generator=g)
            flops = 4 * h * s * s * d / (2 if causal else 1)
            row = {"seqlen": s, "causal": causal, "world": world, "sharding": sharding, "fwd_flops": flops}

            def fwd():
                with torch.no_grad():
                    fd.ring_attention(q, k, v, causal=causal, sharding=sharding)

            def fwd_bwd():
                fd.ring_attention(q, k, v, causal=causal, sharding=sharding).backward(dout)

            row["ring_fwd_s"], row["ring_fwd_bwd_s"] = timed(fwd, args.reps), timed(fwd_bwd, args.reps)
            exchange = fd._Ring.exchange  # compute-only: same calls, the transfers replaced by local copies
            fd._Ring.exchange = lambda self, send, shapes: ([t.clone() for t in send], [])
            try:
                row["compute_fwd_s"], row["compute_fwd_bwd_s"] = timed(fwd, args.reps), timed(fwd_bwd, args.reps)
            finally:
                fd._Ring.exchange = exchange
            row["overlap_eff_fwd"] = row["compute_fwd_s"] / row["ring_fwd_s"]
            row["overlap_eff_fwd_bwd"] = row["compute_fwd_bwd_s"] / row["ring_fwd_bwd_s"]
            del q, k, v, dout
            if DEV == "cuda":
                torch.cuda.empty_cache()
            if not args.no_single:
                one = torch.zeros(2, device=DEV)
                if rank == 0:
                    try:
                        Q, K, V = (torch.randn(1, s, h, d, device=DEV, dtype=torch.bfloat16).requires_grad_(True)
                                   for _ in range(3))
                        G = torch.randn(1, s, h, d, device=DEV, dtype=torch.bfloat16)

                        def f1():
                            with torch.no_grad():
                                ft.attention(Q, K, V, causal=causal)

                        def fb1():
                            ft.attention(Q, K, V, causal=causal).backward(G)

                        one[0], one[1] = _local_timed(f1, args.reps), _local_timed(fb1, args.reps)
                        del Q, K, V, G
                    except torch.cuda.OutOfMemoryError:
                        one[:] = float("nan")
                    if DEV == "cuda":
                        torch.cuda.empty_cache()
                dist.broadcast(one, 0)
                row["single_fwd_s"], row["single_fwd_bwd_s"] = float(one[0]), float(one[1])
                row["speedup_fwd"] = row["single_fwd_s"] / row["ring_fwd_s"]
                row["speedup_fwd_bwd"] = row["single_fwd_bwd_s"] / row["ring_fwd_bwd_s"]
            row["ring_fwd_tflops"] = flops / row["ring_fwd_s"] / 1e12
            rows.append(row)
            if rank == 0:
                print(json.dumps(row), flush=True)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "ring_bench.json"), "w") as f:
            json.dump({"gpu": gpu, "torch": torch.__version__, "rows": rows}, f, indent=1)
        lines = [f"# ring attention, {world}x {gpu} (hd128, 16 heads, bf16)", "",
                 "| seqlen | causal | fwd ring ms | fwd 1-GPU ms | speedup | overlap | fwd+bwd ring ms | fwd+bwd 1-GPU ms "
                 "| speedup | overlap |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['seqlen']} | {r['causal']} | {r['ring_fwd_s'] * 1e3:.1f} | "
                         f"{r.get('single_fwd_s', float('nan')) * 1e3:.1f} | {r.get('speedup_fwd', float('nan')):.2f}x | "
                         f"{r['overlap_eff_fwd']:.2f} | {r['ring_fwd_bwd_s'] * 1e3:.1f} | "
                         f"{r.get('single_fwd_bwd_s', float('nan')) * 1e3:.1f} | "
                         f"{r.get('speedup_fwd_bwd', float('nan')):.2f}x | {r['overlap_eff_fwd_bwd']:.2f} |")
        text = "\n".join(lines) + "\n"
        with open(os.path.join(args.out, "ring_bench.md"), "w") as f:
            f.write(text)
        print(text)
    dist.destroy_process_group()


def _local_timed(fn, reps):
    return statistics.median(sample_seconds(fn, reps, warmup=1, device=DEV))  # --smoke: wall clock on the CPU


if __name__ == "__main__":
    main()
