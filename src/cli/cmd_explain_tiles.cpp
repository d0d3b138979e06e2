// `flashkv explain tiles`: the life of the S, P and O tiles in each forward variant — where each lives (slow memory =
// DRAM, fast memory = the per-thread tile working set in L1/L2), when it is created, rescaled and written — and the
// bytes each variant moves between the two, from the analytic model in include/flashkv/traffic.hpp (the same numbers
// `flashkv bench attention` reports). The classic exercise "draw the tile lifecycle of FlashAttention", answered for a
// concrete shape. Sources: FlashAttention (Dao et al. 2022) §2.2 Alg. 0 (standard attention) and §3.1 Alg. 1 (K/V outer
// loop); FlashAttention-2 (Dao 2023) §3.1 Alg. 1 (Q outer loop, unnormalized O, one division by l).
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "cli/command.hpp"
#include "cli/util_parse.hpp"
#include "cli/util_attention_cli.hpp"
#include "flashkv/error.hpp"
#include "flashkv/traffic.hpp"

namespace flashkv::cli {
namespace {

struct TilesArgs {
  int64_t seqlen = 4096;
  int64_t head_dim = 64;
  int64_t batch = 1;
  int64_t heads = 1;
  bool causal = false;
  std::string dtype = "float32";
  std::string variant = "all";
  int64_t threads = 2;
};

std::string kib(double b) {
  if (b >= 1024.0 * 1024.0 * 1024.0) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024.0 * 1024.0));
  if (b >= 1024.0 * 1024.0) return fmt::format("{:.2f} MiB", b / (1024.0 * 1024.0));
  if (b >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{:.0f} B", b);
}

void print_naive(const TrafficShape& s) {
  const int64_t n = s.seqlen_q, m = s.seqlen_k;
  const double sp = static_cast<double>(n) * static_cast<double>(m) * 4.0;
  fmt::print("== naive: standard attention, S and P materialized (FlashAttention §2.2 Alg. 0; what FA replaces) ==\n");
  fmt::print("  S = Q·Kᵀ·scale   [{} x {}] float32 = {} per (batch, head)\n", n, m, kib(sp));
  fmt::print("    lives in SLOW memory (DRAM) for the whole call; created by Q·Kᵀ over {}x{} tiles, every entry\n"
             "    written once (masked entries too: they are computed, then set to -inf)\n",
             s.block_m, s.block_n);
  fmt::print("  P = softmax(S)   the same [{} x {}] buffer: read S for the row max and the row sum, write P\n"
             "    normalized in place — S and P each cross the slow/fast boundary in full\n", n, m);
  fmt::print("  O = P·V          [{} x {}]: P read again in full, V re-read per Q block; O written once, in the\n"
             "    final dtype; nothing is ever rescaled (the max is known before exp)\n", n, s.head_dim_v);
  fmt::print("  extra memory: O(N²) = {} per worker\n", kib(sp));
}

void print_v1(const TrafficShape& s) {
  const int64_t tr = (s.seqlen_q + s.block_m - 1) / s.block_m, tc = (s.seqlen_k + s.block_n - 1) / s.block_n;
  const double stile = static_cast<double>(s.block_m * s.block_n) * 4.0;
  fmt::print("== v1: FlashAttention (2022) loop order — K/V blocks outer, Q blocks inner (FA §3.1 Alg. 1) ==\n");
  fmt::print("  for each of Tc = {} K/V blocks j: K_j, V_j ({} x {}) loaded into FAST memory once\n", tc, s.block_n,
             s.head_dim);
  fmt::print("    for each of Tr = {} Q blocks i:\n", tr);
  fmt::print("      Q_i re-loaded; O_i ({} x {} float32), m_i, l_i READ from SLOW memory\n", s.block_m, s.head_dim_v);
  fmt::print("      S_ij = Q_i·K_jᵀ  ({} x {} float32 = {}) created in FAST memory, scaled, masked; dies this step\n",
             s.block_m, s.block_n, kib(stile));
  fmt::print("      P_ij = exp(S_ij - m_new) in place; l_new = exp(m_old - m_new)·l_old + rowsum(P_ij)\n");
  fmt::print("      O_i RESCALED: O_i = (l_old·exp(m_old - m_new)·O_i + P_ij·V_j) / l_new   (a division every step)\n");
  fmt::print("      O_i, m_i, l_i WRITTEN back to SLOW memory — each O row makes Tc = {} round trips\n", tc);
  fmt::print("  the final O is read once more and written in the output dtype with lse\n");
  fmt::print("  extra memory: O, m, l accumulators for the (batch, head) in flight: N·(dv + 2)·4 B = {} per worker\n",
             kib(static_cast<double>(s.seqlen_q * (s.head_dim_v + 2)) * 4.0));
}

void print_v2(const TrafficShape& s) {
  const int64_t tr = (s.seqlen_q + s.block_m - 1) / s.block_m, tc = (s.seqlen_k + s.block_n - 1) / s.block_n;
  const double stile = static_cast<double>(s.block_m * s.block_n) * 4.0;
  const double otile = static_cast<double>(s.block_m * s.head_dim_v) * 4.0;
  fmt::print("== v2: FlashAttention-2 order, the default `tiled` — Q blocks outer and parallel, K/V inner "
             "(FA2 §3.1 Alg. 1) ==\n");
  fmt::print("  for each of Tr = {} Q blocks i (x batch x heads work items, spread over the threads):\n", tr);
  fmt::print("    Q_i ({} x {}) loaded once; O_i ({} x {} float32 = {}, UNNORMALIZED), m_i = -inf, l_i = 0\n"
             "    created in FAST memory (per-thread scratch) and stay there for the whole K/V loop\n",
             s.block_m, s.head_dim, s.block_m, s.head_dim_v, kib(otile));
  fmt::print("    for each of up to Tc = {} K/V blocks j (fully masked blocks skipped, boundary blocks masked "
             "element-wise):\n", tc);
  fmt::print("      K_j, V_j streamed from SLOW memory (through L2)\n");
  fmt::print("      S_ij = Q_i·K_jᵀ  ({} x {} float32 = {}, in L1/L2) created, scaled, softcapped, masked\n", s.block_m,
             s.block_n, kib(stile));
  fmt::print("      P_ij = exp(S_ij - m_new) overwrites S_ij; l_i = exp(m_old - m_new)·l_i + rowsum(P_ij)\n");
  fmt::print("      O_i RESCALED by exp(m_old - m_new) (no division) and O_i += P_ij·V_j; S_ij/P_ij die here\n");
  fmt::print("    after the last block: O_i / l_i ONCE, WRITTEN to out once; lse = m + log(l) written once\n");
  fmt::print("  extra memory: O(N·d) — only the per-thread tiles; S and P never exist beyond one {}x{} tile\n",
             s.block_m, s.block_n);
}

int run(const TilesArgs& a) {
  // counts are range-checked while parsing (util_parse.hpp); --threads 0 = all cores, as everywhere
  const int threads = resolve_threads(a.threads);
  const std::vector<Algorithm> variants = parse_variants(a.variant);
  TrafficShape s;
  s.batch = a.batch;
  s.num_heads = a.heads;
  s.seqlen_q = s.seqlen_k = a.seqlen;
  s.head_dim = s.head_dim_v = a.head_dim;
  s.dtype = parse_dtype(a.dtype);
  s.causal = a.causal;

  const long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  fmt::print("tile lifecycles for batch={} heads={} seqlen={} head_dim={} dtype={}{}; tiles {} x {} (block_m x "
             "block_n, as the CPU kernels): one float32 S tile is {}, K/V tiles {} each; this CPU has L1d {} and L2 "
             "{} per core\n\n",
             a.batch, a.heads, a.seqlen, a.head_dim, a.dtype, a.causal ? " causal" : "", s.block_m, s.block_n,
             kib(static_cast<double>(s.block_m * s.block_n) * 4.0),
             kib(static_cast<double>(s.block_n * a.head_dim) * 4.0), l1 > 0 ? kib(static_cast<double>(l1)) : "n/a",
             l2 > 0 ? kib(static_cast<double>(l2)) : "n/a");
  for (Algorithm alg : variants) {
    if (alg == Algorithm::naive) print_naive(s);
    if (alg == Algorithm::v1_order) print_v1(s);
    if (alg == Algorithm::tiled) print_v2(s);
    fmt::print("\n");
  }

  fmt::print("bytes moved between slow and fast memory per forward call (model: include/flashkv/traffic.hpp)\n");
  fmt::print("{:<6} {:>12} {:>12} {:>12} {:>14} {:>12} {:>10}\n", "variant", "read", "written", "total",
             "extra memory", "FLOP/byte", "tiles");
  double base = 0;
  // Workers that really run concurrently: naive and v1 are parallel over (batch, head), tiled over (batch, head,
  // query block) (src/cpu/attention_cpu.hpp).
  auto model = [&](Algorithm alg) {
    TrafficShape w = s;
    int64_t items = s.batch * s.num_heads;
    if (alg == Algorithm::tiled) items *= (s.seqlen_q + s.block_m - 1) / s.block_m;
    w.num_workers = static_cast<int32_t>(std::max<int64_t>(1, std::min<int64_t>(threads, items)));
    return estimate_traffic(alg, w);
  };
  for (Algorithm alg : variants) {
    const TrafficEstimate t = model(alg);
    if (alg == Algorithm::tiled) base = t.bytes_total;
    fmt::print("{:<6} {:>12} {:>12} {:>12} {:>14} {:>12.1f} {:>10}\n",
               variant_label(alg), kib(t.bytes_read), kib(t.bytes_written), kib(t.bytes_total),
               kib(t.extra_memory_bytes), t.arithmetic_intensity, fmt::format("{}/{}", t.tiles_visited, t.tiles_total));
  }
  if (base > 0 && variants.size() > 1) {
    for (Algorithm alg : variants) {
      if (alg == Algorithm::tiled) continue;
      fmt::print("  {} moves {:.1f}x the bytes of v2\n", variant_label(alg), model(alg).bytes_total / base);
    }
  }
  fmt::print("formulas (per batch x head; e = dtype bytes, N = seqlen_q, M = seqlen_k):\n");
  for (Algorithm alg : variants) fmt::print("  {}\n", traffic_formula(alg));
  return 0;
}

void register_explain_tiles(CLI::App& root) {
  CLI::App* explain = explain_group(root);
  auto args = std::make_shared<TilesArgs>();
  CLI::App* cmd = explain->add_subcommand(
      "tiles", "Life of the S, P and O tiles per variant (where, when created/rescaled/written) and bytes moved");
  add_count_option(cmd, "--seqlen", args->seqlen, "seqlen_q = seqlen_k (4k = 4096)", 1, int64_t{1} << 24);
  add_count_option(cmd, "--head-dim", args->head_dim, "head dimension", 1, 256);
  cmd->add_option("--variant", args->variant, "naive | v1 | v2 | all")->capture_default_str();
  add_count_option(cmd, "--batch", args->batch, "batch size", 1, int64_t{1} << 20);
  add_count_option(cmd, "--heads", args->heads, "number of heads", 1, 4096);
  cmd->add_flag("--causal", args->causal, "causal mask (skipped tiles are not counted)");
  cmd->add_option("--dtype", args->dtype, "float32 | float16 | bfloat16")->capture_default_str();
  cmd->add_option("--threads", args->threads,
                  "concurrent workers, for the extra-memory column (0 = all cores: OMP_NUM_THREADS if set, else every "
                  "hardware thread)")
      ->capture_default_str();
  cmd->callback([args] { run(*args); });
}

}  // namespace
}  // namespace flashkv::cli

FLASHKV_CLI_COMMAND("explain tiles", flashkv::cli::register_explain_tiles);
