#!/usr/bin/env bash
# Builds the v3 harness library (nvcc only; one TU per variant group, compiled in parallel) as $1/libv3.so.
#   bench/gpu/v3/build.sh OUTDIR [extra nvcc flags...]     (-Xptxas -v for the register/spill report)
#   V3_TUS="v3_api.cu v3_fp8_*.cu" bench/gpu/v3/build.sh OUTDIR   builds only those variant TUs (default: all v3_*.cu)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../../.."
out="$1"; shift || true
mkdir -p "$out"
flags=(-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC
       -I"$root/src" -I"$root/include" -I"$here" "$@")
pids=()
st=0
# The variants use the library's launchers, which need its device helpers and error type: compiled in from src/.
tus=()
for g in ${V3_TUS:-v3_*.cu}; do tus+=("$here"/$g); done
srcs=("${tus[@]}" "$root/src/cuda/util_kernels.cu" "$root/src/core/error.cpp")
for f in "${srcs[@]}"; do
  lang=(); [[ "$f" == *.cpp ]] && lang=(-x cu)
  nvcc "${flags[@]}" "${lang[@]}" -c "$f" -o "$out/$(basename "${f%.*}").o" > "$out/$(basename "${f%.*}").log" 2>&1 &
  pids+=($!)
  if (( ${#pids[@]} >= ${V3_JOBS:-16} )); then wait "${pids[0]}" || st=1; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || st=1; done
for f in "${srcs[@]}"; do
  l="$out/$(basename "${f%.*}").log"; if [[ -s "$l" ]]; then echo "== $l"; grep -iE "error|warning| [1-9][0-9]* bytes spill" "$l" | head -40 || true; fi
done
(( st == 0 )) || { echo "compile failed"; exit 1; }
objs=(); for f in "${tus[@]}"; do objs+=("$out/$(basename "${f%.*}").o"); done
nvcc "${flags[@]}" -shared "${objs[@]}" "$out/util_kernels.o" "$out/error.o" -o "$out/libv3.so"
echo "built $out/libv3.so"
