#!/usr/bin/env bash
# SmolLM2-135M-Instruct KV-format benchmarks on this machine (2 cores), written to bench/results/smollm2/:
#   quality   llama-perplexity protocol on GPL-3 (n_ctx 512, 2048: the whole text) and the Rust Book prose
#             (n_ctx 8192, the first 8192 tokens: the llama.cpp anchor's exact text when scripts/setup --texts found
#             it, and Debian rust-doc's edition)
#   passkey   8k: fp32 and int2_kivi+r128, 5 depths x 1 key; 2k: fp32 and every >= 4-bit format, 5 depths x 1 key
#             (PASSKEY_FULL=1: 1k-8k x 5 depths x 2 keys for all of them; ~2 h on 2 cores)
#   speed     bench engine at 2k and 8k (llama-bench: bench/engine/run_llamabench.sh, same session)
#   report    bench/results/smollm2/README.md from the JSON files, next to the llama.cpp anchor
# OMP_WAIT_POLICY=passive: on a machine shared with other jobs, spinning OpenMP workers wait on descheduled peers
# (decode went from ~13 to ~1 tok/s at load 10); passive waiting keeps the numbers about the work.
# Usage: bench/engine/run_smollm2.sh [quality|passkey|speed]...   (default: all)
set -euo pipefail
cd "$(dirname "$0")/../.."
F=build/cpu/bin/flashkv
[[ -x $F ]] || F=build/ci/bin/flashkv
OUT=bench/results/smollm2
mkdir -p "$OUT"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
FORMATS=(bf16 fp8_e4m3 fp8_e4m3_dynamic int8 int8+hadamard int4 int4+hadamard int4_g32+hadamard int4_kivi
         int4_kivi_g64+p64 int2_kivi+r128)
what=("$@")
((${#what[@]})) || what=(quality passkey speed report)
for w in "${what[@]}"; do
  case $w in
    quality)
      $F eval --model smollm2-135m --text /usr/share/common-licenses/GPL-3 --ctx 512,2048 --kv-cache "${FORMATS[@]}" \
        --json $OUT/quality-gpl3.json --no-progress | tee $OUT/quality-gpl3.txt
      if [[ -s models/texts/rustbook-anchor.txt ]]; then
        $F eval --model smollm2-135m --text models/texts/rustbook-anchor.txt --ctx 8192 --chunks 1 --kv-cache "${FORMATS[@]}" \
          --json $OUT/quality-rustbook.json --no-progress | tee $OUT/quality-rustbook.txt
      fi
      $F eval --model smollm2-135m --text models/texts/rustbook-debian.txt --ctx 8192 --chunks 1 --kv-cache "${FORMATS[@]}" \
        --json $OUT/quality-rustbook-debian.json --no-progress | tee $OUT/quality-rustbook-debian.txt
      ;;
    passkey)
      if [[ ${PASSKEY_FULL:-0} == 1 ]]; then
        $F eval passkey --model smollm2-135m --kv-cache bf16 fp8_e4m3 int8 int4+hadamard int4_kivi int2_kivi+r128 \
          --contexts 1k,2k,4k,8k --depths 0,25,50,75,100 --keys 2 --heatmap-dir $OUT/passkey \
          --json $OUT/passkey.json --no-progress | tee $OUT/passkey.txt
      else
        $F eval passkey --model smollm2-135m --kv-cache int2_kivi+r128 --contexts 8k --depths 0,25,50,75,100 --keys 1 \
          --heatmap-dir $OUT/passkey-8k --json $OUT/passkey-8k.json --no-progress | tee $OUT/passkey-8k.txt
        $F eval passkey --model smollm2-135m --kv-cache bf16 fp8_e4m3 int8 int4+hadamard int4_kivi --contexts 2k \
          --depths 0,25,50,75,100 --keys 1 --heatmap-dir $OUT/passkey-2k --json $OUT/passkey-2k.json --no-progress \
          | tee $OUT/passkey-2k.txt
      fi
      ;;
    speed)
      for c in ${SPEED_CONTEXTS:-2k 8k}; do
        $F bench engine --model smollm2-135m --kv-cache ${SPEED_FORMATS:-fp32 int8 int4_kivi int2_kivi+r128} \
          --contexts $c --repeats ${SPEED_REPEATS:-1} --json $OUT/speed-$c.json | tee $OUT/speed-$c.txt
      done
      ;;
    report)
      pk=()
      for x in passkey-8k passkey-2k passkey-1k passkey; do [[ -s $OUT/$x.json ]] && pk+=($OUT/$x.json); done
      sp=()
      for x in speed speed-2k speed-8k; do [[ -s $OUT/$x.json ]] && sp+=($OUT/$x.json); done
      lb=()
      [[ -s $OUT/llama-bench.json ]] && lb=(--llama-bench $OUT/llama-bench.json)
      python3 bench/engine/report_smollm2.py --anchor bench/results/llamacpp-smollm2-anchor-2026-12-01.json \
        --quality GPL-3=$OUT/quality-gpl3.json rustbook=$OUT/quality-rustbook.json --passkey "${pk[@]}" \
        --speed "${sp[@]}" "${lb[@]}" --notes $OUT/notes.md > $OUT/README.md
      ;;
    *) echo "unknown part '$w' (quality | passkey | speed | report)" >&2; exit 2 ;;
  esac
done
