#!/usr/bin/env bash
# SmolLM2-135M-Instruct KV-format benchmarks on this machine (2 cores), written to bench/results/smollm2/:
#   quality   llama-perplexity protocol on GPL-3 (n_ctx 512, 2048: the whole text) and the Rust Book prose
#             (n_ctx 8192, the first 8192 tokens: the llama.cpp anchor's exact text when scripts/setup --texts found
#             it, and Debian rust-doc's edition)
#   passkey   1k-8k x 5 depths x 2 keys
#   speed     bench engine at 2k and 8k (llama-bench: bench/engine/run_llamabench.sh, same session)
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
((${#what[@]})) || what=(quality passkey speed)
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
      $F eval passkey --model smollm2-135m --kv-cache bf16 fp8_e4m3 int8 int4+hadamard int4_kivi int2_kivi+r128 \
        --contexts 1k,2k,4k,8k --depths 0,25,50,75,100 --keys 2 --heatmap-dir $OUT/passkey \
        --json $OUT/passkey.json --no-progress | tee $OUT/passkey.txt
      ;;
    speed)
      $F bench engine --model smollm2-135m --kv-cache fp32 bf16 fp8_e4m3 int8 int4 int4+hadamard int4_kivi int2_kivi+r128 \
        --contexts 2k,8k --repeats 2 --json $OUT/speed.json | tee $OUT/speed.txt
      ;;
    *) echo "unknown part '$w' (quality | passkey | speed)" >&2; exit 2 ;;
  esac
done
