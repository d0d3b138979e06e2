#!/usr/bin/env python3
"""Greedy exactness of `flashkv generate` on SmolLM2-135M-Instruct against the float64 numpy reference
(reference_gguf.py), with the prompt tokenized independently by Hugging Face `tokenizers` from the GGUF's vocabulary.

For each prompt: flashkv generates `steps` tokens greedily with an fp32 KV cache (--ignore-eos, --logits-out); the
reference runs one causal forward over flashkv's sequence (teacher forcing: identical to its own greedy run as long
as every step agrees) and gives float64 logits at every generated position. Per step we record the reference's margin
(top-1 minus top-2 logit), the largest |flashkv - reference| logit difference, and whether flashkv's token is the
reference's argmax. A step where they differ counts as a near tie (not an error) only when the reference logits of the
two tokens are closer than twice that step's largest logit difference; any other difference fails.

  python3 tests/engine/exactness_smollm2.py                    # short, chat and ~1.5k-token prompts, 64 steps
  python3 tests/engine/exactness_smollm2.py --cases short,chat --json OUT.json --markdown OUT.md
ctest runs the short and chat cases (tests/engine/test_smollm2.py); bench/results/smollm2-exactness.{json,md} hold the
full run.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_gguf as ref  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
# flashkv::fetched_models_dir(): $FLASHKV_MODEL_HOME when set and not empty, else <source>/models (scripts/setup)
MODEL = os.path.join(os.environ.get("FLASHKV_MODEL_HOME") or os.path.join(ROOT, "models"), "smollm2-135m",
                     "SmolLM2-135M-Instruct.Q4_1.gguf")
LONG_TEXT = "/usr/share/common-licenses/GPL-3"


def long_prompt(n_bytes=6900):
    text = open(LONG_TEXT, encoding="utf-8").read()[:n_bytes]
    return text[: text.rfind("\n") + 1] + "To summarize the license above in one sentence:"


CASES = {
    "short": dict(prompt="The capital of France is", chat=False),
    "chat": dict(prompt="What is the capital of France? Answer in one sentence.", chat=True),
    "long": dict(prompt=None, chat=False),  # long_prompt(): ~1.5k tokens of GPL-3 text
}


def run_flashkv(cli, prompt, chat, steps, kv_cache="fp32"):
    with tempfile.TemporaryDirectory() as tmp:
        logits_path = os.path.join(tmp, "logits.f32")
        prompt_path = os.path.join(tmp, "prompt.txt")
        with open(prompt_path, "w", encoding="utf-8") as f:
            f.write(prompt)
        args = [cli, "generate", "--model", MODEL, "--prompt-file", prompt_path, "--temperature", "0", "--steps",
                str(steps), "--ignore-eos", "--kv-cache", kv_cache, "--json", "--logits-out", logits_path]
        if chat:
            args.append("--chat")
        p = subprocess.run(args, capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            raise RuntimeError(p.stderr)
        out = json.loads(p.stdout)
        logits = np.fromfile(logits_path, dtype="<f4").reshape(len(out["tokens"]), -1)
    return out, logits


def compare(model, hf, cli, name, prompt, chat, steps):
    res = {"case": name, "chat": chat, "steps": steps}
    t0 = time.time()
    out, fl = run_flashkv(cli, prompt, chat, steps)
    res["flashkv_seconds"] = time.time() - t0
    res["prefill_tokens_per_s"], res["decode_tokens_per_s"] = out["prefill_tokens_per_s"], out["decode_tokens_per_s"]
    prompt_tokens, gen = out["prompt_tokens"], out["tokens"]
    res["prompt_tokens"] = len(prompt_tokens)
    res["hf_tokenizer_agrees"] = hf.encode(out["prompt"]).ids == prompt_tokens
    t0 = time.time()
    seq = prompt_tokens + gen
    P = len(prompt_tokens)
    rl = model.logits(seq[:-1], list(range(P - 1, len(seq) - 1)))  # float64 [steps, vocab]
    res["reference_seconds"] = time.time() - t0
    top2 = np.sort(rl, axis=1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    diff = np.max(np.abs(fl.astype(np.float64) - rl), axis=1)
    ref_top = rl.argmax(axis=1)
    steps_info, near_ties, errors = [], [], []
    for i, tok in enumerate(gen):
        assert int(np.argmax(fl[i])) == tok, "flashkv's greedy token is the argmax of its own logits"
        agree = int(ref_top[i]) == tok
        gap = float(rl[i, ref_top[i]] - rl[i, tok])
        if not agree:
            (near_ties if gap <= 2 * diff[i] else errors).append(i)
        steps_info.append({"step": i, "token": tok, "ref_top": int(ref_top[i]), "ref_margin": float(margin[i]),
                           "max_abs_logit_diff": float(diff[i]), "gap": gap})
    res.update({
        "tokens": gen, "text": out["text"], "agree_steps": int(sum(1 for s in steps_info if s["token"] == s["ref_top"])),
        "near_ties": near_ties, "errors": errors, "min_ref_margin": float(margin.min()),
        "min_margin_step": int(margin.argmin()), "max_abs_logit_diff": float(diff.max()),
        "median_abs_logit_diff": float(np.median(diff)),
        "margin_over_diff_min": float(np.min(margin / np.maximum(diff, 1e-30))),
        "logit_scale": float(np.abs(rl).max()), "per_step": steps_info,
    })
    return res


def markdown(results, meta):
    lines = ["# SmolLM2-135M-Instruct: greedy exactness vs a float64 numpy reference", "",
             f"{meta['date']} · `{meta['command']}` · {meta['machine']} · load average at the end "
             f"{' / '.join(f'{x:.1f}' for x in meta['load_average_at_end'])} (a shared machine: the tok/s columns are "
             "not benchmarks)", "",
             "flashkv `generate --temperature 0 --kv-cache fp32 --ignore-eos` (float32 weights dequantized from the "
             "Q4_1/Q8_0 GGUF, OpenBLAS) vs `tests/engine/reference_gguf.py` (float64, explicit causal mask, own GGUF "
             "reader), teacher-forced on flashkv's tokens. margin = reference top-1 minus top-2 logit; diff = max over "
             "the vocabulary of |flashkv − reference| logits. A step counts as exact when flashkv's token is the "
             "reference argmax; a differing step is a near tie when the two tokens' reference logits are closer than "
             "2·diff.", "",
             "| prompt | prompt tokens | HF tokenizer agrees | steps | exact steps | near ties | errors | min margin (step) "
             "| max diff | median diff | min margin/diff | flashkv prefill / decode tok/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['case']}{' (ChatML)' if r['chat'] else ''} | {r['prompt_tokens']} | "
                     f"{'yes' if r['hf_tokenizer_agrees'] else 'NO'} | {r['steps']} | {r['agree_steps']} | "
                     f"{len(r['near_ties'])} | {len(r['errors'])} | {r['min_ref_margin']:.4f} ({r['min_margin_step']}) | "
                     f"{r['max_abs_logit_diff']:.2e} | {r['median_abs_logit_diff']:.2e} | "
                     f"{r['margin_over_diff_min']:.1f} | {r['prefill_tokens_per_s']:.0f} / {r['decode_tokens_per_s']:.1f} |")
    lines.append("")
    for r in results:
        lines.append(f"- **{r['case']}** generated: {json.dumps(r['text'][:300], ensure_ascii=False)}")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", default=os.environ.get("FLASHKV_CLI", os.path.join(ROOT, "build", "ci", "bin", "flashkv")))
    ap.add_argument("--cases", default="short,chat,long")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--json", default="")
    ap.add_argument("--markdown", default="")
    a = ap.parse_args()
    if not os.path.exists(MODEL):
        sys.exit(f"SmolLM2 is not installed ({MODEL}): run scripts/setup")
    model = ref.Model(MODEL)
    hf = ref.hf_tokenizer(model.g)
    results = []
    for name in a.cases.split(","):
        c = CASES[name]
        prompt = c["prompt"] if c["prompt"] is not None else long_prompt()
        r = compare(model, hf, a.cli, name, prompt, c["chat"], a.steps)
        print(f"{name}: {r['prompt_tokens']} prompt tokens, {r['agree_steps']}/{r['steps']} exact, near ties "
              f"{r['near_ties']}, errors {r['errors']}, min margin {r['min_ref_margin']:.4f}, max diff "
              f"{r['max_abs_logit_diff']:.2e}", flush=True)
        results.append(r)
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": "python3 tests/engine/exactness_smollm2.py " + " ".join(sys.argv[1:]),
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
            "load_average_at_end": os.getloadavg()}
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(markdown(results, meta))
    sys.exit(1 if any(r["errors"] or not r["hf_tokenizer_agrees"] for r in results) else 0)


if __name__ == "__main__":
    main()
