// `flashkv explain online-softmax`: the online-softmax recurrence of FlashAttention, step by step, on a tiny random
// example — the classic exercise "derive the online softmax update by hand", answered by the tool.
//
// For each query row the state (m, l, O) is printed after every K/V tile of --block-n keys, with the rescale factor
// alpha = exp(m_old − m_new) that corrects l and the unnormalized O when the running max grows. The step itself is the
// library's own kernel code (cpu::online_softmax_update, src/cpu/online_softmax.hpp; Milakov & Gimelshein 2018;
// FlashAttention Alg. 1 lines 9–12; FlashAttention-2 §3.1.1). At the end O/l is compared with the exact softmax computed
// in float64 over all keys at once; the command exits 1 if they differ by more than 1e-5.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/command.hpp"
#include "cli/util_attention_cli.hpp"
#include "cli/util_parse.hpp"
#include "cpu/online_softmax.hpp"
#include "flashkv/error.hpp"

namespace flashkv::cli {
namespace {

struct OnlineSoftmaxArgs {
  int seqlen_k = 10;
  int block_n = 4;
  int head_dim = 4;
  int rows = 1;
  uint64_t seed = 7;
};

std::string vec(const float* x, int n, int max_shown = 8) {
  std::vector<std::string> parts;
  for (int i = 0; i < n && i < max_shown; ++i) parts.push_back(fmt::format("{:+.4f}", x[i]));
  if (n > max_shown) parts.push_back(fmt::format("... ({} values)", n));
  return fmt::format("[{}]", fmt::join(parts, ", "));
}

void check_args(const OnlineSoftmaxArgs& a) {
  if (a.seqlen_k < 1 || a.seqlen_k > 4096) throw Error("--seqlen-k", "1..4096", std::to_string(a.seqlen_k));
  if (a.block_n < 1 || a.block_n > a.seqlen_k) {
    throw Error("--block-n", "1..--seqlen-k (" + std::to_string(a.seqlen_k) + ")", std::to_string(a.block_n));
  }
  if (a.head_dim < 1 || a.head_dim > 256) throw Error("--head-dim", "1..256", std::to_string(a.head_dim));
  if (a.rows < 1 || a.rows > 8) throw Error("--rows", "1..8", std::to_string(a.rows));
}

int run(const OnlineSoftmaxArgs& a) {
  check_args(a);
  const int n = a.seqlen_k, d = a.head_dim, dv = a.head_dim, rows = a.rows;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::mt19937_64 gen(a.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(static_cast<std::size_t>(rows) * d), k(static_cast<std::size_t>(n) * d),
      v(static_cast<std::size_t>(n) * dv);
  for (float& x : q) x = 2.5f * normal(gen);  // larger logits make the running max move visibly
  for (float& x : k) x = normal(gen);
  for (float& x : v) x = normal(gen);

  fmt::print("online softmax (FlashAttention Alg. 1 lines 9-12, FA2 §3.1.1): {} query row(s), seqlen_k = {}, "
             "block_n = {}, head_dim = {}, seed = {}\n",
             rows, n, a.block_n, d, a.seed);
  fmt::print("score s_j = softmax_scale * q.k_j with softmax_scale = 1/sqrt(head_dim) = {:.6f}\n", scale);
  fmt::print("per K/V tile:  m_new = max(m, max_j s_j);  alpha = exp(m - m_new);  p_j = exp(s_j - m_new);\n"
             "               l = alpha*l + sum_j p_j;   O = alpha*O + sum_j p_j*V_j   (O stays unnormalized)\n"
             "at the end:    out = O / l,  lse = m + log(l)\n");

  double worst = 0.0;
  for (int r = 0; r < rows; ++r) {
    const float* qr = q.data() + static_cast<std::ptrdiff_t>(r) * d;
    fmt::print("\nquery row {}: q = {}\n", r, vec(qr, d));
    fmt::print("  start: m = -inf, l = 0, O = 0\n");
    cpu::OnlineSoftmaxRow st;
    std::vector<float> o(static_cast<std::size_t>(dv), 0.0f), s(static_cast<std::size_t>(a.block_n));
    std::vector<double> all_scores(static_cast<std::size_t>(n));
    for (int j0 = 0, tile = 0; j0 < n; j0 += a.block_n, ++tile) {
      const int cnt = std::min(a.block_n, n - j0);
      for (int j = 0; j < cnt; ++j) {
        float dot = 0.0f;
        for (int x = 0; x < d; ++x) dot += qr[x] * k[static_cast<std::size_t>(j0 + j) * d + x];
        s[static_cast<std::size_t>(j)] = dot * scale;
        all_scores[static_cast<std::size_t>(j0 + j)] = static_cast<double>(dot) * scale;
      }
      const float m_old = st.m;
      fmt::print("  tile {} (keys {}..{}): s = {}\n", tile, j0, j0 + cnt - 1, vec(s.data(), cnt));
      const float alpha = cpu::online_softmax_update(st, s.data(), cnt, v.data() + static_cast<std::size_t>(j0) * dv,
                                                     dv, o.data());
      fmt::print("    m: {:+.4f} -> {:+.4f}   alpha = exp(m_old - m_new) = {:.6f}{}\n", m_old, st.m, alpha,
                 m_old == cpu::kNegInf ? "  (first tile: nothing to rescale)"
                 : alpha < 1.0f        ? "  (max grew: l and O rescaled)"
                                       : "  (max unchanged)");
      fmt::print("    p = exp(s - m_new) = {}\n", vec(s.data(), cnt));
      fmt::print("    l = {:.6f}   O = {}\n", st.l, vec(o.data(), dv));
    }
    std::vector<float> out(static_cast<std::size_t>(dv));
    const float lse = cpu::online_softmax_finalize(st, o.data(), dv, out.data(), /*has_keys=*/n > 0);
    fmt::print("  final: out = O / l = {}   lse = m + log(l) = {:.6f}\n", vec(out.data(), dv), lse);

    // Exact softmax in float64 over all keys at once (no tiling, no running max).
    double mx = -INFINITY;
    for (double x : all_scores) mx = std::max(mx, x);
    double sum = 0.0;
    for (double x : all_scores) sum += std::exp(x - mx);
    std::vector<float> exact(static_cast<std::size_t>(dv));
    double diff = std::fabs(static_cast<double>(lse) - (mx + std::log(sum)));
    for (int c = 0; c < dv; ++c) {
      double acc = 0.0;
      for (int j = 0; j < n; ++j) {
        acc += std::exp(all_scores[static_cast<std::size_t>(j)] - mx) / sum * v[static_cast<std::size_t>(j) * dv + c];
      }
      exact[static_cast<std::size_t>(c)] = static_cast<float>(acc);
      diff = std::max(diff, std::fabs(acc - out[static_cast<std::size_t>(c)]));
    }
    fmt::print("  exact: softmax(s) @ V (float64, all keys at once) = {}   lse = {:.6f}\n", vec(exact.data(), dv),
               mx + std::log(sum));
    worst = std::max(worst, diff);
  }
  const bool ok = worst <= 1e-5;
  fmt::print("\nresult: final O/l {} the exact softmax result: max abs diff = {:.3e} (out and lse; tolerance 1e-5)\n",
             ok ? "equals" : "DIFFERS FROM", worst);
  return ok ? 0 : 1;
}

void register_explain_online_softmax(CLI::App& root) {
  CLI::App* explain = explain_group(root);
  auto args = std::make_shared<OnlineSoftmaxArgs>();
  CLI::App* cmd = explain->add_subcommand(
      "online-softmax", "Print m, l and O after each K/V tile (with the exp(m_old - m_new) rescale) for a random row");
  add_count_option(cmd, "--seqlen-k", args->seqlen_k, "number of keys (1..4096)", 1, 4096);
  add_count_option(cmd, "--block-n", args->block_n, "keys per K/V tile (1..--seqlen-k)", 1, 4096);
  add_count_option(cmd, "--head-dim", args->head_dim, "head dimension", 1, 256);
  add_count_option(cmd, "--rows", args->rows, "query rows (a small query block, 1..8)", 1, 8);
  cmd->add_option("--seed", args->seed, "random seed")->capture_default_str();
  cmd->callback([args] {
    // A mismatch would be a kernel bug: main() reports it as an internal error (exit 1).
    if (run(*args) != 0) throw std::runtime_error("online softmax result differs from the exact softmax");
  });
}

}  // namespace
}  // namespace flashkv::cli

FLASHKV_CLI_COMMAND("explain online-softmax", flashkv::cli::register_explain_online_softmax);
