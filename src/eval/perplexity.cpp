// llama-perplexity protocol over the engine's chunked prefill (see perplexity.hpp).
#include "eval/perplexity.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "eval/prompt.hpp"
#include "flashkv/error.hpp"

namespace flashkv::eval {

RowCompare compare_rows(const float* a, const float* b, int32_t vocab, int32_t next) {
  const std::size_t V = static_cast<std::size_t>(vocab);
  double ma = -INFINITY, mb = -INFINITY;
  std::size_t ia = 0, ib = 0;
  for (std::size_t v = 0; v < V; ++v) {
    if (a[v] > ma) { ma = a[v]; ia = v; }
    if (b[v] > mb) { mb = b[v]; ib = v; }
  }
  double sa = 0.0, sb = 0.0;
  for (std::size_t v = 0; v < V; ++v) {
    sa += std::exp(static_cast<double>(a[v]) - ma);
    sb += std::exp(static_cast<double>(b[v]) - mb);
  }
  const double lsa = ma + std::log(sa), lsb = mb + std::log(sb);
  double kl = 0.0;
  for (std::size_t v = 0; v < V; ++v) {
    const double lp = static_cast<double>(a[v]) - lsa, lq = static_cast<double>(b[v]) - lsb;
    kl += std::exp(lp) * (lp - lq);
  }
  RowCompare r;
  r.kld = std::max(kl, 0.0);  // rounding can give −1e−17 for distributions equal up to a shift of the logits
  r.logp_next = static_cast<double>(a[next]) - lsa;
  r.logq_next = static_cast<double>(b[next]) - lsb;
  r.same_top1 = ia == ib;
  return r;
}

namespace {
/// llama.cpp's mean_and_uncertainty: mean and sqrt(var / (n − 1)) (0 for n <= 10).
std::pair<double, double> mean_unc(double sum, double sum2, std::size_t n) {
  if (n < 1) return {0.0, 0.0};
  const double f = sum / static_cast<double>(n);
  double df = sum2 / static_cast<double>(n) - f * f;
  df = df > 0 && n > 10 ? std::sqrt(df / static_cast<double>(n - 1)) : 0.0;
  return {f, df};
}
double percentile(const std::vector<double>& sorted, double fraction) {
  if (sorted.empty()) return 0.0;
  if (fraction <= 0) return sorted.front();
  if (fraction >= 1) return sorted.back();
  double p = fraction * static_cast<double>(sorted.size() - 1);
  const std::size_t ip = static_cast<std::size_t>(p);
  p -= static_cast<double>(ip);
  return (1 - p) * sorted[ip] + p * sorted[std::min(ip + 1, sorted.size() - 1)];
}
}  // namespace

TextStats text_stats(const std::vector<double>& nll_ref, const std::vector<double>& nll_fmt,
                     const std::vector<double>& kld, const std::vector<double>& dp, const std::vector<uint8_t>& same) {
  const std::size_t n = nll_fmt.size();
  if (nll_ref.size() != n || kld.size() != n || dp.size() != n || same.size() != n)
    throw Error("text_stats", "equal-length inputs", std::to_string(n));
  TextStats s;
  s.scored = static_cast<int64_t>(n);
  if (n == 0) return s;
  double a = 0, a2 = 0, b = 0, b2 = 0, ab = 0, k = 0, k2 = 0, d2 = 0, d4 = 0;
  std::size_t top = 0;
  for (std::size_t i = 0; i < n; ++i) {
    a += nll_fmt[i], a2 += nll_fmt[i] * nll_fmt[i];
    b += nll_ref[i], b2 += nll_ref[i] * nll_ref[i];
    ab += nll_fmt[i] * nll_ref[i];
    k += kld[i], k2 += kld[i] * kld[i];
    d2 += dp[i] * dp[i], d4 += dp[i] * dp[i] * dp[i] * dp[i];
    top += same[i] ? 1 : 0;
  }
  const auto lq = mean_unc(a, a2, n), lp = mean_unc(b, b2, n);
  s.ppl = std::exp(lq.first);
  s.ppl_err = s.ppl * lq.second;
  const double ppl_ref = std::exp(lp.first), ppl_ref_err = ppl_ref * lp.second;
  const double cov = n < 10 ? 0.0
                            : (ab / static_cast<double>(n) - (a / static_cast<double>(n)) * (b / static_cast<double>(n))) /
                                  static_cast<double>(n - 1);
  s.delta_ppl = s.ppl - ppl_ref;
  s.delta_ppl_err = std::sqrt(std::max(0.0, s.ppl_err * s.ppl_err + ppl_ref_err * ppl_ref_err -
                                                2.0 * s.ppl * ppl_ref * cov));
  const auto kl = mean_unc(k, k2, n);
  s.kld_mean = kl.first;
  s.kld_err = kl.second;
  std::vector<double> sorted = kld;
  std::sort(sorted.begin(), sorted.end());
  s.kld_max = sorted.back();
  s.kld_p99 = percentile(sorted, 0.99);
  s.kld_median = n % 2 == 0 ? 0.5 * (sorted[n / 2] + sorted[n / 2 - 1]) : sorted[n / 2];
  const auto mse = mean_unc(d2, d4, n);
  s.rms_dp = std::sqrt(mse.first);
  s.rms_dp_err = s.rms_dp > 0 ? 0.5 / s.rms_dp * mse.second : 0.0;
  s.same_top1 = static_cast<double>(top) / static_cast<double>(n);
  s.same_top1_err = n > 1 ? std::sqrt(s.same_top1 * (1.0 - s.same_top1) / static_cast<double>(n - 1)) : 0.0;
  return s;
}

std::vector<int32_t> text_tokens(const Tokenizer& tok, const std::string& text) {
  std::vector<int32_t> t = tok.encode(text, tokenizer_adds_bos(tok), false);
  if (t.empty()) throw Error("text", "a non-empty text", "an empty text");
  return t;
}

TextResult evaluate_text(const Model& model, const std::vector<KVCacheSpec>& specs, const std::vector<int32_t>& tokens,
                         const PerplexityOptions& o, const Progress& progress, const EvalTarget& target) {
  const ModelConfig& c = model.config;
  if (o.n_ctx < 4 || o.n_ctx > c.seq_len)
    throw Error("n_ctx", "4.." + std::to_string(c.seq_len) + " tokens (the model's context)", std::to_string(o.n_ctx));
  if (o.ubatch < 1) throw Error("ubatch", ">= 1 tokens", std::to_string(o.ubatch));
  if (o.max_chunks < 0) throw Error("chunks", ">= 0 (0 = all)", std::to_string(o.max_chunks));
  int32_t chunks = static_cast<int32_t>(tokens.size() / static_cast<std::size_t>(o.n_ctx));
  if (chunks < 1)
    throw Error("text", "at least n_ctx = " + std::to_string(o.n_ctx) + " tokens",
                std::to_string(tokens.size()) + " tokens");
  if (o.max_chunks > 0) chunks = std::min(chunks, o.max_chunks);

  const std::size_t V = static_cast<std::size_t>(c.vocab_size);
  const int32_t first = o.n_ctx / 2;
  const std::size_t nf = specs.size();
  // All caches live at once (lockstep): the reference's logits of a ubatch are compared with every format's before
  // the next ubatch, so only two ubatches of logits are ever held.
  // Every engine is built before any work: a format the device cannot run is an UnsupportedError here.
  auto ref = std::make_unique<Engine>(model, target.reference_spec(), 1, o.n_ctx, target.reference_options());
  std::vector<std::unique_ptr<Engine>> eng;
  for (const auto& s : specs) eng.push_back(std::make_unique<Engine>(model, s, 1, o.n_ctx, target.engine));

  std::vector<double> nll_ref;
  std::vector<std::vector<double>> nll(nf), kld(nf), dp(nf);
  std::vector<std::vector<uint8_t>> same(nf);
  std::vector<double> secs(nf + 1, 0.0);
  std::vector<KVMemory> mem(nf);
  KVMemory mem_ref;
  const int64_t total = static_cast<int64_t>(chunks) * o.n_ctx * static_cast<int64_t>(nf + 1);
  int64_t done = 0;
  std::vector<float> lref, lfmt;
  std::vector<int32_t> chunk(static_cast<std::size_t>(o.n_ctx));
  using clock = std::chrono::steady_clock;
  for (int32_t ci = 0; ci < chunks; ++ci) {
    const std::size_t start = static_cast<std::size_t>(ci) * static_cast<std::size_t>(o.n_ctx);
    std::copy_n(tokens.begin() + static_cast<std::ptrdiff_t>(start), o.n_ctx, chunk.begin());
    if (o.bos_id >= 0) chunk[0] = o.bos_id;
    const int32_t sr = ref->add_sequence();
    std::vector<int32_t> sid(nf);
    for (std::size_t f = 0; f < nf; ++f) sid[f] = eng[f]->add_sequence();
    for (int32_t u0 = 0; u0 < o.n_ctx; u0 += o.ubatch) {
      const int32_t n = std::min(o.ubatch, o.n_ctx - u0);
      const std::span<const int32_t> ub(chunk.data() + u0, static_cast<std::size_t>(n));
      // scored rows of this ubatch: positions j in [max(first, u0), min(n_ctx − 1, u0 + n))
      const int32_t j0 = std::max(first, u0), j1 = std::min(o.n_ctx - 1, u0 + n);
      const bool want = j1 > j0;
      lref.resize(want ? static_cast<std::size_t>(n) * V : 0);
      auto t0 = clock::now();
      ref->extend(sr, ub, lref, want);
      secs[0] += std::chrono::duration<double>(clock::now() - t0).count();
      done += n;
      if (progress) progress(done, total);
      if (want) {
        for (int32_t j = j0; j < j1; ++j) {
          const float* a = lref.data() + static_cast<std::size_t>(j - u0) * V;
          const int32_t next = chunk[static_cast<std::size_t>(j + 1)];
          double mx = -INFINITY, sum = 0.0;
          for (std::size_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(a[v]));
          for (std::size_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(a[v]) - mx);
          // the same expression as compare_rows' logp_next, so that an identical row scores bit-identically
          nll_ref.push_back(-(static_cast<double>(a[next]) - (mx + std::log(sum))));
        }
      }
      for (std::size_t f = 0; f < nf; ++f) {
        lfmt.resize(lref.size());
        t0 = clock::now();
        eng[f]->extend(sid[f], ub, lfmt, want);
        secs[f + 1] += std::chrono::duration<double>(clock::now() - t0).count();
        done += n;
        if (progress) progress(done, total);
        if (!want) continue;
        const std::size_t base = nll[f].size();
        const int32_t rows = j1 - j0;
        nll[f].resize(base + static_cast<std::size_t>(rows));
        kld[f].resize(nll[f].size());
        dp[f].resize(nll[f].size());
        same[f].resize(nll[f].size());
#pragma omp parallel for schedule(static)
        for (int32_t r = 0; r < rows; ++r) {
          const int32_t j = j0 + r;
          const std::size_t off = static_cast<std::size_t>(j - u0) * V;
          const RowCompare rc = compare_rows(lref.data() + off, lfmt.data() + off, c.vocab_size,
                                             chunk[static_cast<std::size_t>(j + 1)]);
          const std::size_t i = base + static_cast<std::size_t>(r);
          nll[f][i] = -rc.logq_next;
          kld[f][i] = rc.kld;
          dp[f][i] = std::exp(rc.logq_next) - std::exp(rc.logp_next);
          same[f][i] = rc.same_top1 ? 1 : 0;
        }
      }
    }
    if (ci == 0) {
      mem_ref = ref->memory();
      for (std::size_t f = 0; f < nf; ++f) mem[f] = eng[f]->memory();
    }
    ref->remove_sequence(sr);
    for (std::size_t f = 0; f < nf; ++f) eng[f]->remove_sequence(sid[f]);
  }

  TextResult res;
  res.n_ctx = o.n_ctx;
  res.ubatch = o.ubatch;
  res.chunks = chunks;
  res.text_tokens = static_cast<int64_t>(tokens.size());
  res.reference_spec = target.reference_spec();
  res.reference_device = target.reference_device();
  res.device = target.device_name();
  res.reference_bits = mem_ref.effective_bits;
  {
    const std::vector<double> zero(nll_ref.size(), 0.0);
    const std::vector<uint8_t> one(nll_ref.size(), 1);
    res.reference = text_stats(nll_ref, nll_ref, zero, zero, one);
  }
  const double fed = static_cast<double>(chunks) * o.n_ctx;
  for (std::size_t f = 0; f < nf; ++f) {
    TextRow row;
    row.spec = specs[f];
    row.label = specs[f].label();
    row.bytes_per_token = mem[f].bytes_per_token;
    row.effective_bits = mem[f].effective_bits;
    row.ratio_vs_bf16 = mem[f].bytes_per_token > 0 ? mem[f].bf16_bytes_per_token / mem[f].bytes_per_token : 0.0;
    row.prefill_tok_s = secs[f + 1] > 0 ? fed / secs[f + 1] : 0.0;
    row.stats = text_stats(nll_ref, nll[f], kld[f], dp[f], same[f]);
    res.rows.push_back(std::move(row));
  }
  return res;
}

}  // namespace flashkv::eval
