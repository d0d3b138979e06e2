// Measured peak float32 FMA throughput of this machine (for "% of peak" in `flashkv bench attention`).
#pragma once

namespace flashkv::cli {

struct PeakFlops {
  double gflops = 0.0;  ///< float32 GFLOP/s (1 FMA = 2 FLOPs) summed over all threads
  int threads = 0;      ///< OpenMP threads used
  const char* isa = ""; ///< "avx512f", "avx2+fma" or "scalar"
  int lanes = 0;        ///< float32 lanes per FMA instruction
  double cpu_share = 0; ///< process CPU time / (wall × threads) during the best run: < 1 on a shared machine
  /// gflops / cpu_share: the rate the threads reach while they hold a core (contention-corrected estimate).
  double gflops_per_cpu() const { return cpu_share > 0 ? gflops / cpu_share : gflops; }
};

/// Runs a register-resident loop of independent vector FMAs (12 accumulators, enough to cover FMA latency × ports)
/// on every OpenMP thread for about `seconds` and returns the achieved rate. This is a measured ceiling for the
/// kernels' float32 arithmetic, not the datasheet number (turbo, shared hosts and AVX-512 down-clocking included).
PeakFlops measure_peak_flops(double seconds = 0.3);

}  // namespace flashkv::cli
