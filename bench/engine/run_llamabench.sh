#!/usr/bin/env bash
# llama.cpp's llama-bench on the same machine and session as `flashkv bench engine` (run_smollm2.sh speed), at the
# same positions: tg = 128 decode steps after D = C - 640 cached tokens (-p 0 -n 128 -d D), pp = 512 prompt tokens
# after D + 128 (-p 512 -n 0 -d D+128), C = 2048 and 8192; 2 threads, flash attention on, K = V type.
# llama.cpp: the source vendored in the PyPI sdist llama-cpp-python==0.3.36 (commit 0c1e57098), built outside this
# repository as ../shared/anchors/2026-12-01-llamacpp-smollm2.md describes. Usage:
#   LLAMA_BENCH=/work/llamacpp/.../build/bin/llama-bench bench/engine/run_llamabench.sh > bench/results/smollm2/llama-bench.json
# TYPES_2K / TYPES_8K (default "f16 q8_0 q4_0" / "f16"; empty = none: llama.cpp's quantized-KV flash attention fills 7.5k tokens at
# ~20-40 tok/s on 2 cores, 4+ minutes per invocation) and REPS (default 1) trade coverage for time.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${LLAMA_BENCH:?set LLAMA_BENCH to the llama-bench binary}"
M=${MODEL:-${FLASHKV_MODEL_HOME:-models}/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf}  # where scripts/setup puts it
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
echo "["
first=1
for ctx in 2048 8192; do
  d=$((ctx - 640))
  if ((ctx == 2048)); then types=${TYPES_2K-f16 q8_0 q4_0}; else types=${TYPES_8K-f16}; fi
  for t in $types; do
    for test in tg pp; do
      if [[ $test == tg ]]; then args=(-p 0 -n 128 -d $d); else args=(-p 512 -n 0 -d $((d + 128))); fi
      load=$(cut -d' ' -f1-3 /proc/loadavg)
      out=$("$LLAMA_BENCH" -m "$M" "${args[@]}" -fa 1 -ctk $t -ctv $t -t 2 -r ${REPS:-1} -o json 2>/dev/null)
      ((first)) || echo ","
      first=0
      python3 -c "
import json, sys
r = json.loads(sys.argv[1])[0]
r.update(kv='$t', context=$ctx, test='$test', load_avg_at_start='$load', command=sys.argv[2])
r['pp' if '$test' == 'pp' else 'tg'] = '%.1f ± %.1f' % (r['avg_ts'], r['stddev_ts'])
print(json.dumps(r))" "$out" "llama-bench -m $M ${args[*]} -fa 1 -ctk $t -ctv $t -t 2 -r ${REPS:-1} -o json"
    done
  done
done
echo "]"
