// Teacher-forced replay of token sequences through the engine and the KL / top-1 / Δll / divergence metrics.
#include "eval/evaluation.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

#include "flashkv/error.hpp"

namespace flashkv::eval {

Replay replay(const Model& model, const KVCacheSpec& spec, const std::vector<std::vector<int32_t>>& sequences,
              int32_t batch, const Progress& progress, const EngineOptions& engine_options) {
  const ModelConfig& c = model.config;
  const auto n = static_cast<int32_t>(sequences.size());
  if (n == 0) throw Error("sequences", "at least one sequence", "0");
  int64_t total = 0;
  for (std::size_t i = 0; i < sequences.size(); ++i) {
    const auto len = sequences[i].size();
    if (len == 0 || len > static_cast<std::size_t>(c.seq_len))
      throw Error("sequences[" + std::to_string(i) + "]", "1.." + std::to_string(c.seq_len) + " tokens",
                  std::to_string(len));
    total += static_cast<int64_t>(len);
  }
  if (batch <= 0 || batch > n) batch = n;
  Engine engine(model, spec, batch, 0, engine_options);
  Replay r;
  r.logits.resize(sequences.size());
  int64_t done = 0;
  const std::size_t V = static_cast<std::size_t>(c.vocab_size);
  std::vector<float> logits;
  for (int32_t first = 0; first < n; first += batch) {
    const int32_t last = std::min(n, first + batch);
    std::vector<int32_t> slot(static_cast<std::size_t>(last - first));
    std::size_t max_len = 0;
    for (int32_t s = first; s < last; ++s) {
      slot[static_cast<std::size_t>(s - first)] = engine.add_sequence();
      r.logits[static_cast<std::size_t>(s)].resize(sequences[static_cast<std::size_t>(s)].size() * V);
      max_len = std::max(max_len, sequences[static_cast<std::size_t>(s)].size());
    }
    for (std::size_t t = 0; t < max_len; ++t) {
      std::vector<int32_t> ids, toks, owners;
      for (int32_t s = first; s < last; ++s) {
        const auto& seq = sequences[static_cast<std::size_t>(s)];
        if (t < seq.size()) {
          ids.push_back(slot[static_cast<std::size_t>(s - first)]);
          toks.push_back(seq[t]);
          owners.push_back(s);
        }
      }
      logits.resize(ids.size() * V);
      const auto t0 = std::chrono::steady_clock::now();
      engine.decode(ids, toks, logits);
      r.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (std::size_t b = 0; b < ids.size(); ++b)
        std::copy_n(logits.begin() + static_cast<std::ptrdiff_t>(b * V), V,
                    r.logits[static_cast<std::size_t>(owners[b])].begin() + static_cast<std::ptrdiff_t>(t * V));
      done += static_cast<int64_t>(ids.size());
      r.tokens += static_cast<int64_t>(ids.size());
      if (progress) progress(done, total);
    }
    if (first + batch >= n) r.kv = engine.memory();
    for (int32_t s : slot) engine.remove_sequence(s);
  }
  return r;
}

namespace {
/// log-softmax in float64.
void log_softmax(const float* x, std::size_t n, std::vector<double>& out) {
  out.resize(n);
  double mx = -INFINITY;
  for (std::size_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(x[i]));
  double sum = 0.0;
  for (std::size_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - mx);
  const double lse = mx + std::log(sum);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<double>(x[i]) - lse;
}
std::size_t argmax(const float* x, std::size_t n) {
  std::size_t b = 0;
  for (std::size_t i = 1; i < n; ++i)
    if (x[i] > x[b]) b = i;
  return b;
}
}  // namespace

Metrics compare(const Replay& ref, const Replay& test, const std::vector<std::vector<int32_t>>& sequences,
                int32_t vocab_size) {
  if (ref.logits.size() != sequences.size() || test.logits.size() != sequences.size())
    throw Error("test", std::to_string(sequences.size()) + " replayed sequences", std::to_string(test.logits.size()));
  const std::size_t V = static_cast<std::size_t>(vocab_size);
  Metrics m;
  m.sequences = static_cast<int32_t>(sequences.size());
  double kl_sum = 0.0, dll_sum = 0.0, div_sum = 0.0;
  int64_t agree = 0, dll_n = 0;
  std::vector<double> lp, lq;
  for (std::size_t s = 0; s < sequences.size(); ++s) {
    const auto& seq = sequences[s];
    int64_t first_div = -1;
    for (std::size_t t = 0; t < seq.size(); ++t) {
      const float* a = ref.logits[s].data() + t * V;
      const float* b = test.logits[s].data() + t * V;
      log_softmax(a, V, lp);
      log_softmax(b, V, lq);
      double kl = 0.0;
      for (std::size_t v = 0; v < V; ++v) kl += std::exp(lp[v]) * (lp[v] - lq[v]);
      kl = std::max(kl, 0.0);  // rounding can give −1e−17 for identical distributions of different logits
      kl_sum += kl;
      m.max_kl = std::max(m.max_kl, kl);
      const bool same = argmax(a, V) == argmax(b, V);
      agree += same ? 1 : 0;
      if (!same && first_div < 0) first_div = static_cast<int64_t>(t);
      if (t + 1 < seq.size()) {
        const auto next = static_cast<std::size_t>(seq[t + 1]);
        dll_sum += lq[next] - lp[next];
        ++dll_n;
      }
      ++m.positions;
    }
    if (first_div >= 0) ++m.diverged;
    div_sum += static_cast<double>(first_div >= 0 ? first_div : static_cast<int64_t>(seq.size()));
  }
  m.mean_kl = m.positions ? kl_sum / static_cast<double>(m.positions) : 0.0;
  m.top1 = m.positions ? static_cast<double>(agree) / static_cast<double>(m.positions) : 0.0;
  m.delta_ll = dll_n ? dll_sum / static_cast<double>(dll_n) : 0.0;
  m.ppl_ratio = std::exp(-m.delta_ll);
  m.mean_first_divergence = m.sequences ? div_sum / m.sequences : 0.0;
  return m;
}

std::vector<Metrics> compare_per_sequence(const Replay& ref, const Replay& test,
                                          const std::vector<std::vector<int32_t>>& sequences, int32_t vocab_size) {
  if (ref.logits.size() != sequences.size() || test.logits.size() != sequences.size())
    throw Error("test", std::to_string(sequences.size()) + " replayed sequences", std::to_string(test.logits.size()));
  std::vector<Metrics> out;
  for (std::size_t s = 0; s < sequences.size(); ++s) {
    Replay a, b;
    a.logits = {ref.logits[s]};
    b.logits = {test.logits[s]};
    out.push_back(compare(a, b, {sequences[s]}, vocab_size));
  }
  return out;
}

std::vector<std::vector<int32_t>> sample_sequences(const Model& model, int32_t n, int32_t length, uint64_t seed,
                                                   float temperature, const EvalTarget& target) {
  const ModelConfig& c = model.config;
  if (n < 1) throw Error("samples", ">= 1", std::to_string(n));
  if (length < 2 || length > c.seq_len)
    throw Error("length", "2.." + std::to_string(c.seq_len) + " tokens (the model's context)", std::to_string(length));
  Engine engine(model, target.reference_spec(), n, 0, target.reference_options());
  std::vector<Sampler> samplers;
  std::vector<int32_t> ids;
  std::vector<std::vector<int32_t>> seqs(static_cast<std::size_t>(n), std::vector<int32_t>{1});
  for (int32_t i = 0; i < n; ++i) {
    samplers.emplace_back(SamplerConfig{temperature, 1.0f, 0, seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i) + 1});
    ids.push_back(engine.add_sequence());
  }
  const std::size_t V = static_cast<std::size_t>(c.vocab_size);
  std::vector<float> logits(static_cast<std::size_t>(n) * V);
  for (int32_t t = 1; t < length; ++t) {
    std::vector<int32_t> toks;
    for (const auto& s : seqs) toks.push_back(s.back());
    engine.decode(ids, toks, logits);
    for (int32_t i = 0; i < n; ++i)
      seqs[static_cast<std::size_t>(i)].push_back(samplers[static_cast<std::size_t>(i)].sample(
          std::span<const float>(logits.data() + static_cast<std::size_t>(i) * V, V)));
  }
  return seqs;
}

std::vector<std::vector<int32_t>> sequences_from_text(const Tokenizer& tok, const std::string& text, int32_t seq_len) {
  std::vector<int32_t> all = tok.encode(text, false, false);
  if (all.empty()) throw Error("text", "a non-empty text", "an empty text");
  std::vector<std::vector<int32_t>> out;
  const std::size_t chunk = static_cast<std::size_t>(std::max(1, seq_len - 1));
  for (std::size_t i = 0; i < all.size(); i += chunk) {
    std::vector<int32_t> s{tok.bos_id()};
    s.insert(s.end(), all.begin() + static_cast<std::ptrdiff_t>(i),
             all.begin() + static_cast<std::ptrdiff_t>(std::min(all.size(), i + chunk)));
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<std::vector<int32_t>> sequences_from_token_file(const std::string& path, int32_t vocab_size,
                                                            int32_t seq_len) {
  std::ifstream f(path);
  if (!f) throw IoError("flashkv: cannot open token file '" + path + "'");
  std::vector<std::vector<int32_t>> out;
  std::string line;
  int lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    std::istringstream ss(line);
    std::string word;
    std::vector<int32_t> seq;
    while (ss >> word) {
      char* end = nullptr;
      const long v = std::strtol(word.c_str(), &end, 10);
      if (end == word.c_str() || *end != '\0')
        throw IoError("flashkv: " + path + ":" + std::to_string(lineno) + ": '" + word + "' is not an integer token id");
      if (v < 0 || v >= vocab_size)
        throw Error("tokens", "ids in [0, " + std::to_string(vocab_size) + ")",
                    std::to_string(v) + " at " + path + ":" + std::to_string(lineno));
      seq.push_back(static_cast<int32_t>(v));
    }
    if (seq.empty()) continue;
    if (seq.size() > static_cast<std::size_t>(seq_len))
      throw Error("tokens", "at most seq_len = " + std::to_string(seq_len) + " tokens per line",
                  std::to_string(seq.size()) + " at " + path + ":" + std::to_string(lineno));
    out.push_back(std::move(seq));
  }
  if (out.empty()) throw IoError("flashkv: token file '" + path + "' holds no tokens");
  return out;
}

std::vector<FormatRow> evaluate(const Model& model, const std::vector<KVCacheSpec>& specs,
                                const std::vector<std::vector<int32_t>>& sequences, int32_t batch,
                                const Progress& progress, const EvalTarget& target) {
  check_target(model, specs, target);  // a format the device cannot run: UnsupportedError before any work
  int64_t per_run = 0;
  for (const auto& s : sequences) per_run += static_cast<int64_t>(s.size());
  const int64_t total = per_run * static_cast<int64_t>(specs.size() + 1);
  int64_t base = 0;
  auto sub = [&](int64_t done, int64_t) { if (progress) progress(base + done, total); };
  const Replay ref = replay(model, target.reference_spec(), sequences, batch, sub, target.reference_options());
  base += per_run;
  std::vector<FormatRow> rows;
  for (const auto& spec : specs) {
    const Replay r = replay(model, spec, sequences, batch, sub, target.engine);
    base += per_run;
    FormatRow row;
    row.spec = spec;
    row.label = spec.label();
    row.bytes_per_token = r.kv.bytes_per_token;
    row.effective_bits = r.kv.effective_bits;
    row.ratio_vs_bf16 = r.kv.bytes_per_token > 0 ? r.kv.bf16_bytes_per_token / r.kv.bytes_per_token : 0.0;
    row.decode_tok_s = r.seconds > 0 ? static_cast<double>(r.tokens) / r.seconds : 0.0;
    row.metrics = compare(ref, r, sequences, model.config.vocab_size);
    row.per_sequence = compare_per_sequence(ref, r, sequences, model.config.vocab_size);
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace flashkv::eval
