#!/usr/bin/env python3
"""flashkv inside PyTorch / transformers on one GPU (issue 16), anchors measured in the same run:

1. training step: one Llama decoder layer (hidden 2048, 16 heads x hd128, 8 KV heads, MLP 8192; Llama-3-like
   shapes) forward + backward at 8k tokens (batch 1) in bf16, attn_implementation "flashkv" vs "sdpa" in the same
   torch model; and the attention call alone (flash_attn_func vs F.scaled_dot_product_attention), causal.
   FLOPs of attention: fwd 4*B*H*S*S*d / 2 (causal), bwd 2.5x fwd.
2. generate: a randomly initialised Llama with SmolLM2-135M's shapes (30 layers, hidden 576, 9 heads x hd64, 3 KV
   heads), prompt 512, 128 new tokens, greedy, batch 1 and 32: tokens/s of
   sdpa + DynamicCache, sdpa + StaticCache, flashkv + DynamicCache, flashkv + PagedCache("bf16").
Median of --reps timed runs after warmup (CUDA events). Writes $OUT/torch_bench.json and $OUT/torch_bench.md.

  PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so LD_LIBRARY_PATH=$PWD/build/cuda/devlibs \\
    python3 bench/gpu/torch_bench.py --out $OUT [--quick]
"""
import argparse
import json
import os
import platform
import statistics
import time

import torch

import flashkv
import flashkv.torch as ft
from _bench_util import sample_seconds  # bench/gpu: the script's folder


DEV = "cuda"


def timed(fn, reps, warmup=2):
    return statistics.median(sample_seconds(fn, reps, warmup, device=DEV))  # --smoke on the CPU: wall clock


def training_step(args):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    s = 128 if args.smoke else 2048 if args.quick else 8192
    hid, inter = (256, 512) if args.smoke else (2048, 8192)
    cfg = LlamaConfig(hidden_size=hid, intermediate_size=inter, num_attention_heads=hid // 128, num_key_value_heads=hid // 256,
                      head_dim=128, max_position_embeddings=s, attn_implementation="sdpa")
    torch.manual_seed(0)
    layer = LlamaDecoderLayer(cfg, layer_idx=0).to(DEV, torch.bfloat16).train()
    rope = LlamaRotaryEmbedding(cfg).to(DEV)
    x = torch.randn(1, s, hid, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    pos = torch.arange(s, device=DEV)[None]
    pe = rope(x, pos)
    rows = []
    for impl in ("sdpa", "flashkv"):
        cfg._attn_implementation = impl

        def step():
            y = layer(x, position_embeddings=pe, attention_mask=None, position_ids=pos)
            y = y[0] if isinstance(y, tuple) else y
            y.float().square().mean().backward()

        rows.append({"what": f"Llama layer fwd+bwd, {impl}", "tokens": s, "seconds": timed(step, args.reps)})
    b, h, d = 1, cfg.num_attention_heads, 128
    hkv = cfg.num_key_value_heads
    q = torch.randn(b, s, h, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, s, hkv, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, s, hkv, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(b, s, h, d, device=DEV, dtype=torch.bfloat16)
    flops = 4 * b * h * s * s * d / 2 * 3.5  # causal fwd + bwd (2.5x)

    def fa():
        ft.flash_attn_func(q, k, v, causal=True).backward(g)

    def sd():
        o = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                             v.transpose(1, 2), is_causal=True, enable_gqa=True)
        o.transpose(1, 2).backward(g)

    for name, fn in (("flash_attn_func fwd+bwd", fa), ("sdpa fwd+bwd", sd)):
        t = timed(fn, args.reps)
        rows.append({"what": f"attention {name}", "tokens": s, "seconds": t, "tflops": flops / t / 1e12})
    return rows


def generation(args):
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, StaticCache

    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=2 if args.smoke else 30,
                      num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=2048,
                      tie_word_embeddings=True, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(DEV, torch.bfloat16).eval()
    prompt, new = (16, 4) if args.smoke else (128, 32) if args.quick else (512, 128)
    rows = []
    for batch in (1, 32):
        ids = torch.randint(0, cfg.vocab_size, (batch, prompt), device=DEV)
        variants = [
            ("sdpa", "DynamicCache", lambda: DynamicCache(config=model.config)),
            ("sdpa", "StaticCache", lambda: StaticCache(config=model.config, max_cache_len=prompt + new)),
            ("flashkv", "DynamicCache", lambda: DynamicCache(config=model.config)),
            ("flashkv", "PagedCache bf16", lambda: ft.PagedCache(model.config, "bf16", max_cache_len=prompt + new)),
        ]
        for impl, cache_name, make in variants:
            model.set_attn_implementation(impl)

            def run():
                with torch.no_grad():
                    model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                   past_key_values=make())

            try:
                t = timed(run, max(1, args.reps // 2), warmup=1)
                rows.append({"what": f"generate {impl} + {cache_name}", "batch": batch, "prompt": prompt,
                             "new_tokens": new, "seconds": t, "tokens_per_s": batch * new / t})
            except Exception as e:  # noqa: BLE001 - recorded, not hidden
                rows.append({"what": f"generate {impl} + {cache_name}", "batch": batch, "error": repr(e)[:300]})
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/flashkv-torch-bench"))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (checks the script, times nothing)")
    args = p.parse_args()
    global DEV
    DEV = "cpu" if args.smoke else "cuda"
    os.makedirs(args.out, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name() if DEV == "cuda" else "cpu (smoke)", "torch": torch.__version__, "flashkv": flashkv.__version__,
            "library": flashkv.library_path(), "python": platform.python_version(), "time": time.ctime(),
            "quick": args.quick}
    try:
        import transformers

        meta["transformers"] = transformers.__version__
    except ImportError:
        meta["transformers"] = None
    rows = training_step(args) + generation(args)
    with open(os.path.join(args.out, "torch_bench.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    lines = [f"# flashkv in torch / transformers — {meta['gpu']}, torch {meta['torch']}, transformers "
             f"{meta['transformers']}", "", "| what | batch | tokens | ms | TFLOP/s | tokens/s |", "|---|---|---|---|---|---|"]
    for r in rows:
        ms = f"{r['seconds'] * 1e3:.2f}" if "seconds" in r else r.get("error", "")
        lines.append(f"| {r['what']} | {r.get('batch', 1)} | {r.get('tokens', r.get('prompt', ''))} | {ms} | "
                     f"{r.get('tflops', 0):.0f} | {r.get('tokens_per_s', 0):.0f} |")
    by = {r["what"]: r for r in rows}
    sd, fk = by.get("Llama layer fwd+bwd, sdpa"), by.get("Llama layer fwd+bwd, flashkv")
    if sd and fk:
        lines += ["", f"Llama layer fwd+bwd speedup flashkv / sdpa: {sd['seconds'] / fk['seconds']:.2f}x"]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "torch_bench.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
