#!/usr/bin/env bash
# Builds bench_kv_decode without CMake (only g++, OpenMP and Google Benchmark needed), e.g. on a machine that lacks
# the CLI/JSON/BLAS dependencies of the full build. Usage: src/kvcache/bench/build_standalone.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-build/bench-standalone}
mkdir -p "$out/obj"
srcs=(src/kvcache/format.cpp src/kvcache/codec.cpp src/kvcache/codec_int.cpp src/kvcache/paged_cache.cpp
      src/kvcache/cache_attention.cpp src/kvcache/decode_tile.cpp src/kvcache/decode_avx512.cpp
      src/kvcache/decode_avx512_fp16.cpp src/kvcache/memory.cpp src/core/types.cpp src/core/error.cpp
      src/core/version.cpp src/core/validate.cpp src/core/backend.cpp src/kvcache/bench/bench_kv_decode.cpp)
flags=(-std=c++20 -O3 -DNDEBUG -fopenmp -fno-trapping-math -Iinclude -Isrc -DFLASHKV_VERSION_STRING=\"0.1.0\")
pids=()
for s in "${srcs[@]}"; do
  g++ "${flags[@]}" -c "$s" -o "$out/obj/$(echo "$s" | tr / _).o" & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
g++ -fopenmp "$out"/obj/*.o -o "$out/bench_kv_decode" -lbenchmark -lpthread
echo "$out/bench_kv_decode"
