#!/usr/bin/env python3
"""Writes the SmolLM2-135M KV-format comparison (markdown) from flashkv's JSON results next to the llama.cpp anchor.

  report_smollm2.py --anchor ../results/llamacpp-smollm2-anchor-2026-12-01.json \
      --quality gpl3=Q1.json rustbook=Q2.json [--passkey P.json] [--speed S.json --llama-bench LB.json] > report.md

Quality JSON: `flashkv eval --text ... --ctx ... --json`; passkey: `flashkv eval passkey --json`; speed: `flashkv bench
engine --json`; LB.json: a JSON list of llama-bench `-o json` records (see run_smollm2.sh)."""
import argparse
import json

ap = argparse.ArgumentParser()
ap.add_argument("--anchor", required=True)
ap.add_argument("--quality", nargs="*", default=[])
ap.add_argument("--passkey")
ap.add_argument("--speed")
ap.add_argument("--llama-bench")
a = ap.parse_args()
anchor = json.load(open(a.anchor))
bits = anchor["bits_per_element"]


def f(x, fmt):
    return "—" if x is None else fmt % x


def kld(x):
    return "—" if x is None else ("%.2e" % x if x < 1e-3 else "%.5f" % x)


print("# SmolLM2-135M-Instruct: flashkv KV formats next to llama.cpp's KV cache types\n")
runs = {}
for q in a.quality:
    name, path = q.split("=", 1)
    runs[name] = json.load(open(path))
if runs:
    first = next(iter(runs.values()))
    print("Measured by flashkv (`%s`, %s; %s; %s at start).\n" % (
        first["command"], first["date"], first["machine"]["cpu_model"], first["machine"]["load_average_at_start"]))
    print("llama.cpp rows: %s.\n" % anchor["source"])
    print("Protocol (both engines): llama-perplexity's — the text in chunks of n_ctx, each from an empty cache, fed "
          "through the cache in 512-token ubatches, the last n_ctx/2 − 1 tokens of each chunk scored. Reference: "
          "flashkv = its fp32 cache (exact); llama.cpp = its f16 cache with flash attention (its KLD also contains the "
          "8-bit quantization of Q that llama.cpp applies when K is quantized). Bits per element count everything "
          "(flashkv: codes + metadata + bf16 windows + page slack at n_ctx tokens; llama.cpp: block scales).\n")
summary = []
for name, r in runs.items():
    for res in r["results"]:
        n_ctx = res["n_ctx"]
        anc = [x for x in anchor["quality"] if x["text"] == name and x["n_ctx"] == n_ctx and x["fa"] == "on"]
        base = next((x for x in anc if x["base"]), None)
        print("## %s, n_ctx %d\n" % (name, n_ctx))
        print("flashkv: %d chunk(s), %d scored tokens; llama.cpp: %s scored tokens.\n" % (
            res["chunks"], res["scored_tokens"], base["scored"] if base else "—"))
        if base:
            d = (res["reference"]["ppl"] - base["ppl"]) / base["ppl"]
            print("f16/fp32 perplexity: flashkv fp32 cache %.4f, llama.cpp f16 cache %.4f: %+.2f%% (target: within 1%%)\n"
                  % (res["reference"]["ppl"], base["ppl"], 100 * d))
            summary.append(("PPL within 1%% of llama.cpp f16 (%s, %d)" % (name, n_ctx), abs(d) <= 0.01,
                            "%+.2f%%" % (100 * d)))
        print("| engine | KV cache | bits/elt | PPL | ΔPPL | mean KLD | 99% KLD | max KLD | RMS Δp | same top-1 |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        print("| flashkv | fp32 (reference) | 32 | %.4f ± %.4f | — | — | — | — | — | — |" % (
            res["reference"]["ppl"], res["reference"]["ppl_err"]))
        if base:
            print("| llama.cpp | f16 (reference) | 16 | %.4f ± %.4f | — | — | — | — | — | — |" % (base["ppl"], base["ppl_err"]))
        rows = [("flashkv", x["label"], x["effective_bits"], x["stats"]) for x in res["formats"]]
        rows += [("llama.cpp", x["kv"], bits.get(x["kv"]), x) for x in anc if not x["base"]]
        rows.sort(key=lambda t: (-(t[2] or 0), t[0]))
        for eng, label, b, s in rows:
            print("| %s | %s | %s | %.4f | %+.4f | %s ± %s | %s | %s | %.2f %% | %.2f %% |" % (
                eng, label, f(b, "%.2f"), s["ppl"], s["delta_ppl"], kld(s["kld_mean"]), kld(s.get("kld_err")),
                kld(s["kld_p99"]), kld(s["kld_max"]), 100 * s["rms_dp"], 100 * s["same_top1"]))
        print()
        q8 = next((x for x in anc if x["kv"] == "q8_0"), None)
        q4 = next((x for x in anc if x["kv"] == "q4_0"), None)
        for x in res["formats"]:
            lab, b, k = x["label"], x["effective_bits"], x["stats"]["kld_mean"]
            if q8 and (lab.startswith("int8") or lab.startswith("fp8")) and b <= bits["q8_0"] + 1e-9:
                summary.append(("%s KLD < q8_0's at <= 8.5 bits (%s, %d)" % (lab, name, n_ctx), k < q8["kld_mean"],
                                "%s vs %s at %.2f bits" % (kld(k), kld(q8["kld_mean"]), b)))
            if q4 and ("hadamard" in lab or "kivi" in lab) and lab.startswith("int4"):
                ok = k < q4["kld_mean"] and b <= bits["q4_0"] + 1e-9
                summary.append(("%s KLD < q4_0's at <= 4.5 bits (%s, %d)" % (lab, name, n_ctx), ok,
                                "%s vs %s at %.2f bits" % (kld(k), kld(q4["kld_mean"]), b)))

if a.passkey:
    p = json.load(open(a.passkey))
    pk = p["passkey"]
    print("## Passkey retrieval\n")
    print("`%s` (%s, %s at start). %d contexts × %d depths × %d keys per format; success = the greedy answer "
          "contains the key.\n" % (p["command"], p["date"], p["machine"]["load_average_at_start"], len(pk["contexts"]),
                                   len(pk["depths"]), pk["keys"]))
    ctxs = pk["contexts"]
    print("| KV cache | " + " | ".join(str(c) for c in ctxs) + " | all | answers identical to fp32's |")
    print("|---|" + "---|" * (len(ctxs) + 2))
    ref = pk["formats"][0]
    for x in pk["formats"]:
        n = len(x["trials"])
        same = sum(1 for t in x["trials"] if t["divergence"] < 0)
        print("| %s | %s | %.1f%% | %d/%d |" % (x["label"], " | ".join(
            "%.0f%%" % (100 * x["success_rate_by_context"][str(c)]) for c in ctxs), 100 * x["success_rate"], same, n))
        if x is ref:
            continue
        top = str(max(ctxs))
        if x["label"].startswith("int2_kivi") and "r128" in x["label"]:
            summary.append(("%s passkey >= 95%% at %s" % (x["label"], top), x["success_rate_by_context"][top] >= 0.95,
                            "%.1f%%" % (100 * x["success_rate_by_context"][top])))
        elif not x["label"].startswith("int2"):
            summary.append(("%s passkey = fp32's" % x["label"], x["success_rate"] == ref["success_rate"],
                            "%.1f%% vs %.1f%%" % (100 * x["success_rate"], 100 * ref["success_rate"])))
    print()

if a.speed:
    s = json.load(open(a.speed))
    lb = json.load(open(a.llama_bench)) if a.llama_bench else []
    print("## CPU speed, 2 threads\n")
    print("flashkv: `%s` (%s, load %s → %s). llama.cpp: llama-bench in the same session (commands in run_smollm2.sh)."
          "\n" % (s["command"], s["date"], s["machine"]["load_average_at_start"], s["machine"].get("load_average_at_end")))
    print("| engine | KV cache | context | pp512 tok/s | tg128 tok/s |")
    print("|---|---|---|---|---|")
    for r in s["results"]:
        print("| flashkv | %s | %d | %.1f ± %.1f | %.1f ± %.1f |" % (r["label"], r["context"], r["pp_mean"], r["pp_sd"],
                                                                  r["tg_mean"], r["tg_sd"]))
    for r in lb:
        print("| llama.cpp %s | %s | %s | %s | %s |" % (r.get("build_commit", ""), r["kv"], r["context"],
                                                         r.get("pp", "—"), r.get("tg", "—")))
    print()

if summary:
    print("## Targets\n")
    print("| target | met | value |")
    print("|---|---|---|")
    for t, ok, v in summary:
        print("| %s | %s | %s |" % (t, "yes" if ok else "**no**", v))
