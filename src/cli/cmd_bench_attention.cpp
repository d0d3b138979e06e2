// `flashkv bench attention`: times the exact-attention forward variants (naive = standard attention with S and P
// materialized, v1 = FlashAttention 2022 loop order, v2 = FA2 order / "tiled") on random inputs and reports, per shape:
// best and median wall time, GFLOP/s (FLOPs = 4·batch·heads·seqlen_q·seqlen_k·head_dim, halved for causal; FA3 paper
// convention), % of the machine's measured peak float32 FMA rate (util_peak_flops.hpp), the measured peak extra
// resident memory of one call (util_memory.hpp) and the bytes moved between slow and fast memory according to the
// loop-structure model of include/flashkv/traffic.hpp. Table on stdout, progress on stderr, --json for machines.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "cli/command.hpp"
#include "cli/util_output.hpp"
#include "cli/util_attention_cli.hpp"
#include "cli/util_memory.hpp"
#include "cli/util_parse.hpp"
#include "cli/util_peak_flops.hpp"
#include "core/float16.hpp"
#include "flashkv/attention.hpp"
#include "flashkv/diagnostics.hpp"
#include "flashkv/error.hpp"
#include "flashkv/traffic.hpp"
#include "flashkv/types.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace flashkv::cli {
namespace {

struct BenchArgs {
  std::vector<int64_t> seqlens{1024, 2048, 4096};
  std::vector<int64_t> head_dims{64, 128};
  int64_t batch = 1;
  int64_t heads = 8;
  bool causal = false;
  std::string dtype = "float32";
  std::string variant = "all";
  int repeats = 3;
  double max_naive_gib = 8.0;
  int64_t threads = 0;
  std::string json_path;
  bool quiet = false;
  std::vector<std::string> argv;  // the exact command, recorded in the JSON
};

struct Row {
  std::string variant;
  int64_t seqlen = 0, head_dim = 0;
  bool skipped = false;
  std::string skip_reason;
  double best_ms = 0, median_ms = 0, gflops = 0, pct_peak = 0;
  double cpu_share = 0;  ///< process CPU time / (wall time × threads) of the best call: < 1 means contention
  int64_t extra_bytes_measured = -1;
  TrafficEstimate model;
  std::string kernel_path;  ///< flashkv::last_kernel_path() after the timed calls: the kernel that really ran
};

std::string human_bytes(double b) {
  if (b < 0) return "n/a";
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) b /= 1024.0, ++u;
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, unit[u]);
}

void check_args(const BenchArgs& a) {  // counts are range-checked while parsing (util_parse.hpp)
  resolve_threads(a.threads);
  // q, k, v, out of the largest shape must fit in memory (else: one clear line now, not std::bad_alloc later)
  const long double elt = a.dtype == "float32" ? 4 : 2;
  const long double need = 4.0L * elt * a.batch * a.heads *
                           static_cast<long double>(*std::max_element(a.seqlens.begin(), a.seqlens.end())) *
                           static_cast<long double>(*std::max_element(a.head_dims.begin(), a.head_dims.end()));
  const long double ram = static_cast<long double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  if (ram > 0 && need > ram) {
    throw Error("--batch/--heads/--seqlen/--head-dim", fmt::format("inputs that fit in memory ({} here)", human_bytes(static_cast<double>(ram))),
                fmt::format("{} for q, k, v and out", human_bytes(static_cast<double>(need))));
  }
  if (!(a.max_naive_gib > 0)) throw Error("--max-naive-memory", "> 0 GiB", fmt::format("{}", a.max_naive_gib));
  parse_dtype(a.dtype);
  parse_variants(a.variant);
  check_output_file(a.json_path, "--json");  // fail before minutes of benchmarking, not after
}


/// Random values in [-1, 1) stored in `dtype` (bit patterns for the 16-bit types).
std::vector<uint16_t> random_tensor16(std::size_t n, DType dtype, std::mt19937& gen) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> x(n);
  for (auto& e : x) e = dtype == DType::float16 ? float_to_fp16(u(gen)) : float_to_bf16(u(gen));
  return x;
}

struct Buffers {
  std::vector<float> f32;      // q, k, v, out back to back (float32 runs)
  std::vector<uint16_t> f16;   // same for 16-bit runs
  std::vector<float> lse;
  TensorView q, k, v, out, lse_view;
};

Buffers make_buffers(const BenchArgs& a, DType dtype, int64_t seqlen, int64_t d, std::mt19937& gen) {
  Buffers b;
  const int64_t n = a.batch * seqlen * a.heads * d;
  void* base = nullptr;
  if (dtype == DType::float32) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    b.f32.resize(static_cast<std::size_t>(4 * n));
    for (auto& e : b.f32) e = u(gen);
    base = b.f32.data();
  } else {
    b.f16 = random_tensor16(static_cast<std::size_t>(4 * n), dtype, gen);
    base = b.f16.data();
  }
  const std::size_t es = dtype_size(dtype);
  auto at = [&](int i) { return static_cast<char*>(base) + static_cast<std::size_t>(i) * n * es; };
  b.q = TensorView::contiguous(at(0), dtype, {a.batch, seqlen, a.heads, d});
  b.k = TensorView::contiguous(at(1), dtype, {a.batch, seqlen, a.heads, d});
  b.v = TensorView::contiguous(at(2), dtype, {a.batch, seqlen, a.heads, d});
  b.out = TensorView::contiguous(at(3), dtype, {a.batch, seqlen, a.heads, d});
  b.lse.resize(static_cast<std::size_t>(a.batch * a.heads * seqlen));
  b.lse_view = TensorView::contiguous(b.lse.data(), DType::float32, {a.batch, a.heads, seqlen});
  return b;
}

/// The model's shape with the number of workers that really run concurrently: naive and v1 are parallel over
/// (batch, head), tiled over (batch, head, query block) — see src/cpu/attention_cpu.hpp.
TrafficShape with_workers(TrafficShape s, Algorithm alg, int threads) {
  int64_t items = s.batch * s.num_heads;
  if (alg == Algorithm::tiled) items *= (s.seqlen_q + s.block_m - 1) / s.block_m;
  s.num_workers = static_cast<int32_t>(std::max<int64_t>(1, std::min<int64_t>(threads, items)));
  return s;
}

/// CPU time of this process (all threads) in milliseconds.
double process_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

std::string iso_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto p = line.find(':');
      return p == std::string::npos ? line : line.substr(p + 2);
    }
  }
  return "unknown";
}

int run(const BenchArgs& a) {
  check_args(a);
  const DType dtype = parse_dtype(a.dtype);
  const std::vector<Algorithm> variants = parse_variants(a.variant);
  release_freed_memory_eagerly();
  const int threads = resolve_threads(a.threads);
#if defined(_OPENMP)
  omp_set_num_threads(threads);
#endif
  if (!a.quiet) fmt::print(stderr, "[bench] measuring peak float32 FMA rate on {} thread(s)...\n", threads);
  const PeakFlops peak = measure_peak_flops();

  const std::size_t total = a.seqlens.size() * a.head_dims.size() * variants.size();
  std::size_t done = 0;
  std::vector<Row> rows;
  std::mt19937 gen(12345);
  for (int64_t d : a.head_dims) {
    for (int64_t seqlen : a.seqlens) {
      Buffers buf = make_buffers(a, dtype, seqlen, d, gen);
      TrafficShape shape;
      shape.batch = a.batch;
      shape.num_heads = a.heads;
      shape.seqlen_q = shape.seqlen_k = seqlen;
      shape.head_dim = shape.head_dim_v = d;
      shape.dtype = dtype;
      shape.causal = a.causal;
      const double flops = attention_forward_flops(shape);  // 4·B·H·N²·d, halved for causal
      for (Algorithm alg : variants) {
        Row r;
        r.variant = variant_label(alg);
        r.seqlen = seqlen;
        r.head_dim = d;
        r.model = estimate_traffic(alg, with_workers(shape, alg, threads));
        ++done;
        if (alg == Algorithm::naive &&
            r.model.extra_memory_bytes > a.max_naive_gib * 1024.0 * 1024.0 * 1024.0) {
          r.skipped = true;
          r.skip_reason = fmt::format("needs {} of scratch > --max-naive-memory {} GiB",
                                      human_bytes(r.model.extra_memory_bytes), a.max_naive_gib);
          if (!a.quiet) fmt::print(stderr, "[{}/{}] {} seqlen={} head_dim={}: skipped ({})\n", done, total, r.variant,
                                   seqlen, d, r.skip_reason);
          rows.push_back(r);
          continue;
        }
        AttentionOptions opt;
        opt.causal = a.causal;
        opt.algorithm = alg;
        opt.num_threads = threads;
        if (!a.quiet) {
          fmt::print(stderr, "[{}/{}] {} seqlen={} head_dim={}: running {} call(s) of {:.1f} GFLOP each...\n", done,
                     total, r.variant, seqlen, d, a.repeats, flops * 1e-9);
        }
        std::vector<double> ms;
        for (int rep = 0; rep < a.repeats; ++rep) {
          std::unique_ptr<PeakRssProbe> probe;
          if (rep == 0) probe = std::make_unique<PeakRssProbe>();
          const double cpu0 = process_cpu_ms();
          const auto t0 = std::chrono::steady_clock::now();
          attention_forward(buf.q, buf.k, buf.v, buf.out, &buf.lse_view, opt);
          r.kernel_path = last_kernel_path();
          ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
          const double share = (process_cpu_ms() - cpu0) / (ms.back() * threads);
          if (probe) r.extra_bytes_measured = probe->peak_extra_bytes();
          if (ms.back() <= *std::min_element(ms.begin(), ms.end())) r.cpu_share = share;
        }
        std::vector<double> sorted = ms;
        std::sort(sorted.begin(), sorted.end());
        r.best_ms = sorted.front();
        r.median_ms = sorted[sorted.size() / 2];
        r.gflops = flops / (r.best_ms * 1e-3) * 1e-9;
        r.pct_peak = peak.gflops > 0 ? 100.0 * r.gflops / peak.gflops : 0.0;
        if (!a.quiet) {
          fmt::print(stderr, "[{}/{}] {} seqlen={} head_dim={}: best {:.2f} ms, {:.1f} GFLOP/s\n", done, total,
                     r.variant, seqlen, d, r.best_ms, r.gflops);
        }
        rows.push_back(r);
      }
    }
  }

  // ---- table -----------------------------------------------------------------------------------------------------
  fmt::print("flashkv bench attention: batch={} heads={} causal={} dtype={} repeats={} threads={}\n", a.batch,
             a.heads, a.causal ? "yes" : "no", a.dtype, a.repeats, threads);
  fmt::print("peak float32 FMA rate (measured, {} x {} lanes, {} threads): {:.1f} GFLOP/s at cpu% {:.0f}% "
             "({:.1f} GFLOP/s per held core-set)\n",
             peak.isa, peak.lanes, peak.threads, peak.gflops, 100.0 * peak.cpu_share, peak.gflops_per_cpu());
  fmt::print("{:<6} {:>7} {:>4} {:>11} {:>11} {:>5} {:>9} {:>7} {:>12} {:>12} {:>12}  {}\n", "variant", "seqlen", "d",
             "best ms", "median ms", "cpu%", "GFLOP/s", "% peak", "extra mem", "(model)", "bytes moved",
             "kernel path");
  for (const Row& r : rows) {
    if (r.skipped) {
      fmt::print("{:<6} {:>7} {:>4}  skipped: {}\n", r.variant, r.seqlen, r.head_dim, r.skip_reason);
      continue;
    }
    fmt::print("{:<6} {:>7} {:>4} {:>11.2f} {:>11.2f} {:>4.0f}% {:>9.1f} {:>6.1f}% {:>12} {:>12} {:>12}  {}\n",
               r.variant, r.seqlen, r.head_dim, r.best_ms, r.median_ms, 100.0 * r.cpu_share, r.gflops, r.pct_peak,
               human_bytes(static_cast<double>(r.extra_bytes_measured)),
               human_bytes(r.model.extra_memory_bytes), human_bytes(r.model.bytes_total), r.kernel_path);
  }
  fmt::print("cpu% = process CPU time / (wall time x threads) of the best call (below 100%: other processes took "
             "cores; timings are then pessimistic)\n");
  fmt::print("FLOPs = 4*batch*heads*seqlen^2*head_dim{}; extra mem = peak resident growth during the first call "
             "(VmHWM); (model) and bytes moved (slow<->fast memory) from include/flashkv/traffic.hpp\n",
             a.causal ? " / 2 (causal)" : "");
  fmt::print("kernel path = flashkv::last_kernel_path() after the row's calls (what FLASHKV_LOG=1 prints per call)\n");

  // ---- JSON --------------------------------------------------------------------------------------------------------
  if (!a.json_path.empty()) {
    nlohmann::json j;
    std::string cmd;
    for (const auto& s : a.argv) cmd += (cmd.empty() ? "" : " ") + s;
    j["command"] = cmd;
    j["date"] = iso_now();
    j["flashkv_version"] = version();
    j["machine"] = {{"cpu_model", cpu_model()},
                    {"hardware_threads", std::thread::hardware_concurrency()},
                    {"threads", threads},
                    {"peak_gflops_fp32", peak.gflops},
                    {"peak_cpu_share", peak.cpu_share},
                    {"peak_gflops_fp32_per_cpu", peak.gflops_per_cpu()},
                    {"peak_method", fmt::format("measured: {} loop of independent {}-lane FMAs on {} threads",
                                                peak.isa, peak.lanes, peak.threads)}};
    j["config"] = {{"batch", a.batch},   {"heads", a.heads},     {"causal", a.causal},
                   {"dtype", a.dtype},   {"repeats", a.repeats}, {"max_naive_memory_gib", a.max_naive_gib},
                   {"flops_formula", "4*batch*heads*seqlen_q*seqlen_k*head_dim, halved for causal"}};
    j["results"] = nlohmann::json::array();
    for (const Row& r : rows) {
      nlohmann::json e = {{"variant", r.variant}, {"seqlen", r.seqlen}, {"head_dim", r.head_dim},
                          {"skipped", r.skipped}};
      if (r.skipped) {
        e["skip_reason"] = r.skip_reason;
      } else {
        e["time_ms_best"] = r.best_ms;
        e["time_ms_median"] = r.median_ms;
        e["cpu_share_best"] = r.cpu_share;
        e["gflops_per_cpu"] = r.cpu_share > 0 ? r.gflops / r.cpu_share : r.gflops;
        e["pct_of_peak_per_cpu"] = 100.0 * e["gflops_per_cpu"].get<double>() / peak.gflops_per_cpu();
        e["gflops"] = r.gflops;
        e["pct_of_peak"] = r.pct_peak;
        e["extra_memory_bytes_measured"] = r.extra_bytes_measured;
        e["kernel_path"] = r.kernel_path;
      }
      e["extra_memory_bytes_model"] = r.model.extra_memory_bytes;
      e["bytes_moved"] = r.model.bytes_total;
      e["bytes_read"] = r.model.bytes_read;
      e["bytes_written"] = r.model.bytes_written;
      e["arithmetic_intensity_flops_per_byte"] = r.model.arithmetic_intensity;
      e["tiles_visited"] = r.model.tiles_visited;
      e["tiles_total"] = r.model.tiles_total;
      j["results"].push_back(e);
    }
    std::ofstream f(a.json_path);
    if (!f) throw Error("--json", "a writable file path", "'" + a.json_path + "'", Status::io);
    f << j.dump(2) << "\n";
    if (!a.quiet) fmt::print(stderr, "[bench] wrote {}\n", a.json_path);
  }
  return 0;
}

void register_bench_attention(CLI::App& root) {
  CLI::App* bench = group(root, "bench", "Benchmarks (results: bench/results/)");
  bench->require_subcommand(1);  // `flashkv bench` alone: "a subcommand is required", exit 2 (was: nothing, exit 0)
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = bench->add_subcommand("attention", "Time naive vs v1 vs v2 (tiled) exact attention forward");
  add_count_list_option(cmd, "--seqlen", args->seqlens, "sequence lengths (seqlen_q = seqlen_k), comma separated; 4k = 4096",
                        1, int64_t{1} << 20);
  add_count_list_option(cmd, "--head-dim", args->head_dims, "head dimensions, comma separated", 1, 256);
  add_count_option(cmd, "--batch", args->batch, "batch size", 1, int64_t{1} << 20);
  add_count_option(cmd, "--heads", args->heads, "number of heads (num_heads = num_heads_kv)", 1, 4096);
  cmd->add_flag("--causal", args->causal, "causal mask (FLOPs halved)");
  cmd->add_option("--dtype", args->dtype, "float32 | float16 | bfloat16")->capture_default_str();
  cmd->add_option("--variant", args->variant, "naive | v1 | v2 | all")->capture_default_str();
  add_count_option(cmd, "--repeats", args->repeats, "timed runs per point (best and median reported)", 1, 1000);
  cmd->add_option("--max-naive-memory", args->max_naive_gib, "skip naive where its S/P scratch exceeds this (GiB)")
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, kThreadsHelp)->capture_default_str();
  cmd->add_option("--json", args->json_path, "also write the results as JSON to this file");
  cmd->add_flag("--quiet", args->quiet, "no progress on stderr");
  cmd->callback([args, cmd] {
    args->argv = {"flashkv", "bench", "attention"};
    for (const CLI::Option* o : cmd->get_options()) {
      if (o->count() == 0 || o->get_name() == "--help") continue;
      std::string v;
      for (const auto& s : o->results()) v += (v.empty() ? "" : ",") + s;
      args->argv.push_back(o->get_type_size() == 0 ? o->get_name() : o->get_name() + " " + v);
    }
    run(*args);
  });
}

}  // namespace
}  // namespace flashkv::cli

FLASHKV_CLI_COMMAND("bench attention", flashkv::cli::register_bench_attention);
