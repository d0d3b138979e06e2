// Passkey retrieval through the engine (see passkey.hpp).
#include "eval/passkey.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "eval/prompt.hpp"
#include "flashkv/error.hpp"

namespace flashkv::eval {

namespace {
constexpr const char* kHeader =
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about "
    "the important information there.\n\n";
constexpr const char* kFiller = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";
constexpr const char* kQuestion = "\n\nWhat is the pass key?";

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
bool same_depth(double a, double b) { return std::fabs(a - b) < 1e-9; }
}  // namespace

std::string passkey_user_message(int32_t reps, int32_t at, const std::string& key) {
  std::string s = kHeader;
  for (int32_t i = 0; i <= reps; ++i) {
    if (i == at) s += "The pass key is " + key + ". Remember it. " + key + " is the pass key. ";
    if (i < reps) s += kFiller;
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s + kQuestion;
}

std::string passkey_key(uint64_t seed, int32_t context, int32_t depth_index, int32_t key_index) {
  uint64_t h = splitmix(seed);
  h = splitmix(h ^ static_cast<uint64_t>(context));
  h = splitmix(h ^ (static_cast<uint64_t>(depth_index) << 20));
  h = splitmix(h ^ (static_cast<uint64_t>(key_index) << 40));
  return std::to_string(10000 + h % 90000);
}

std::vector<int32_t> passkey_prompt(const LoadedModel& lm, int32_t context, double depth, const std::string& key,
                                    int32_t answer_tokens) {
  const int32_t seq_len = lm.model.config.seq_len;
  if (context < 1 || context > seq_len)
    throw Error("contexts", "1.." + std::to_string(seq_len) + " tokens (the model's context)", std::to_string(context));
  const int32_t budget = context - answer_tokens;
  auto build = [&](int32_t reps) {
    const int32_t at = static_cast<int32_t>(std::lround(depth * reps));
    return chat_prompt_tokens(lm, passkey_user_message(reps, at, key), kPasskeyAnswerPrefix);
  };
  const int32_t t0 = static_cast<int32_t>(build(0).size());
  if (t0 + 1 > budget)
    throw Error("contexts", "room for the prompt: at least " + std::to_string(t0 + answer_tokens + 32) + " tokens",
                std::to_string(context));
  const int32_t per = std::max<int32_t>(1, (static_cast<int32_t>(build(4).size()) - t0) / 4);
  int32_t reps = std::max(0, (budget - t0) / per);
  std::vector<int32_t> p = build(reps);
  while (reps > 0 && static_cast<int32_t>(p.size()) > budget) p = build(--reps);
  for (;;) {  // grow while the next repetition still fits
    std::vector<int32_t> q = build(reps + 1);
    if (static_cast<int32_t>(q.size()) > budget) break;
    p = std::move(q);
    ++reps;
  }
  if (reps == 0)
    throw Error("contexts", "room for at least one filler repetition", std::to_string(context) + " tokens");
  return p;
}

double PasskeyFormat::success_rate() const {
  if (trials.empty()) return 0.0;
  return static_cast<double>(std::count_if(trials.begin(), trials.end(), [](const PasskeyTrial& t) { return t.success; })) /
         static_cast<double>(trials.size());
}
double PasskeyFormat::success_rate(int32_t context) const {
  int n = 0, ok = 0;
  for (const auto& t : trials)
    if (t.context == context) ++n, ok += t.success ? 1 : 0;
  return n ? static_cast<double>(ok) / n : 0.0;
}
double PasskeyFormat::cell_rate(int32_t context, double depth) const {
  int n = 0, ok = 0;
  for (const auto& t : trials)
    if (t.context == context && same_depth(t.depth, depth)) ++n, ok += t.success ? 1 : 0;
  return n ? static_cast<double>(ok) / n : 0.0;
}
int32_t PasskeyFormat::identical_answers() const {
  return static_cast<int32_t>(std::count_if(trials.begin(), trials.end(), [](const PasskeyTrial& t) { return t.divergence < 0; }));
}

PasskeyResult run_passkey(const LoadedModel& lm, const std::vector<KVCacheSpec>& specs, const PasskeyOptions& o,
                          const Progress& progress, const EvalTarget& target) {
  const Model& model = lm.model;
  const ModelConfig& c = model.config;
  if (o.contexts.empty()) throw Error("contexts", "at least one context length", "none");
  if (o.depths.empty()) throw Error("depths", "at least one depth", "none");
  for (double d : o.depths)
    if (!(d >= 0.0 && d <= 1.0)) throw Error("depths", "values in [0, 1] (0-100%)", std::to_string(d));
  if (o.keys < 1) throw Error("keys", ">= 1 per cell", std::to_string(o.keys));
  if (o.answer_tokens < 1) throw Error("answer_tokens", ">= 1", std::to_string(o.answer_tokens));
  if (o.ubatch < 1) throw Error("ubatch", ">= 1 tokens", std::to_string(o.ubatch));
  std::vector<KVCacheSpec> all{target.reference_spec()};
  for (const auto& s : specs)
    if (!target.is_reference(s)) all.push_back(s);
  check_target(model, specs, target);  // a format the device cannot run: UnsupportedError before any work
  // Prompts once (identical for every format).
  struct Prompt {
    int32_t context;
    double depth;
    std::string key;
    std::vector<int32_t> tokens;
  };
  std::vector<Prompt> prompts;
  int32_t max_ctx = 0;
  int64_t per_format = 0;
  for (int32_t ctx : o.contexts) {
    for (std::size_t di = 0; di < o.depths.size(); ++di) {
      for (int32_t k = 0; k < o.keys; ++k) {
        Prompt p{ctx, o.depths[di], passkey_key(o.seed, ctx, static_cast<int32_t>(di), k), {}};
        p.tokens = passkey_prompt(lm, ctx, p.depth, p.key, o.answer_tokens);
        per_format += static_cast<int64_t>(p.tokens.size());
        max_ctx = std::max(max_ctx, ctx);
        prompts.push_back(std::move(p));
      }
    }
  }
  const std::vector<int32_t> stops = stop_tokens(lm);
  const std::size_t V = static_cast<std::size_t>(c.vocab_size);
  const int64_t total = per_format * static_cast<int64_t>(all.size());
  int64_t done = 0;
  using clock = std::chrono::steady_clock;
  PasskeyResult res;
  res.options = o;
  res.device = target.device_name();
  res.reference_device = target.reference_device();
  std::vector<float> logits(V);
  for (const KVCacheSpec& spec : all) {
    Engine engine(model, spec, 1, max_ctx, &spec == &all.front() ? target.reference_options() : target.engine);
    PasskeyFormat f;
    f.spec = spec;
    f.label = spec.label();
    for (const Prompt& p : prompts) {
      const int32_t seq = engine.add_sequence();
      auto t0 = clock::now();
      for (std::size_t u = 0; u < p.tokens.size(); u += static_cast<std::size_t>(o.ubatch)) {
        const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(o.ubatch), p.tokens.size() - u);
        const bool last = u + n == p.tokens.size();
        engine.extend(seq, std::span<const int32_t>(p.tokens.data() + u, n),
                      last ? std::span<float>(logits) : std::span<float>(), false);
        done += static_cast<int64_t>(n);
        if (progress) progress(done, total);
      }
      f.prefill_seconds += std::chrono::duration<double>(clock::now() - t0).count();
      f.prefill_tokens += static_cast<int64_t>(p.tokens.size());
      PasskeyTrial t;
      t.context = p.context;
      t.depth = p.depth;
      t.key = p.key;
      t.prompt_tokens = static_cast<int32_t>(p.tokens.size());
      t0 = clock::now();
      for (int32_t step = 0; step < o.answer_tokens; ++step) {
        const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        if (std::find(stops.begin(), stops.end(), next) != stops.end()) break;
        t.answer.push_back(next);
        if (step + 1 == o.answer_tokens || engine.length(seq) >= engine.max_context()) break;
        const int32_t sq[1] = {seq}, tk[1] = {next};
        engine.decode(sq, tk, logits);
        ++f.decode_tokens;
      }
      f.decode_seconds += std::chrono::duration<double>(clock::now() - t0).count();
      engine.remove_sequence(seq);
      t.answer_text = lm.tokenizer->decode(t.answer);
      t.success = t.answer_text.find(t.key) != std::string::npos;
      f.trials.push_back(std::move(t));
    }
    if (!res.formats.empty()) {  // divergence vs the reference's answers
      const PasskeyFormat& ref = res.formats.front();
      for (std::size_t i = 0; i < f.trials.size(); ++i) {
        const auto& a = ref.trials[i].answer;
        const auto& b = f.trials[i].answer;
        const std::size_t n = std::min(a.size(), b.size());
        int32_t d = -1;
        for (std::size_t s = 0; s < n && d < 0; ++s)
          if (a[s] != b[s]) d = static_cast<int32_t>(s);
        if (d < 0 && a.size() != b.size()) d = static_cast<int32_t>(n);
        f.trials[i].divergence = d;
      }
    }
    res.formats.push_back(std::move(f));
  }
  return res;
}

std::string passkey_heatmap_svg(const PasskeyFormat& f, const PasskeyOptions& o, const std::string& model_name) {
  const int cw = 74, ch = 26, left = 70, top = 66;
  const int W = std::max(left + cw * static_cast<int>(o.contexts.size()) + 30, 460);
  const int H = top + ch * static_cast<int>(o.depths.size()) + 56;
  std::string s;
  char buf[768];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
                "font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
                "<text x=\"10\" y=\"20\" font-size=\"14\">passkey retrieval: %s, KV cache %s</text>\n"
                "<text x=\"10\" y=\"38\">cell = keys retrieved / trials (greedy answer contains the key); overall "
                "%.1f%%</text>\n",
                W, H, model_name.c_str(), f.label.c_str(), 100.0 * f.success_rate());
  s += buf;
  for (std::size_t ci = 0; ci < o.contexts.size(); ++ci) {
    const int32_t n = o.contexts[ci];
    const std::string label = n >= 1024 && n % 1024 == 0 ? std::to_string(n / 1024) + "k" : std::to_string(n);
    std::snprintf(buf, sizeof buf, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
                  left + static_cast<int>(ci) * cw + cw / 2, top - 6, label.c_str());
    s += buf;
  }
  for (std::size_t di = 0; di < o.depths.size(); ++di) {
    std::snprintf(buf, sizeof buf, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%.0f%%</text>\n", left - 6,
                  top + static_cast<int>(di) * ch + ch / 2 + 4, o.depths[di] * 100.0);
    s += buf;
  }
  for (std::size_t ci = 0; ci < o.contexts.size(); ++ci) {
    for (std::size_t di = 0; di < o.depths.size(); ++di) {
      int n = 0, ok = 0;
      for (const auto& t : f.trials)
        if (t.context == o.contexts[ci] && same_depth(t.depth, o.depths[di])) ++n, ok += t.success ? 1 : 0;
      const double r = n ? static_cast<double>(ok) / n : 0.0;
      const int red = static_cast<int>(210 * (1 - r) + 30), green = static_cast<int>(160 * r + 50);
      const int x = left + static_cast<int>(ci) * cw, y = top + static_cast<int>(di) * ch;
      std::snprintf(buf, sizeof buf,
                    "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"rgb(%d,%d,60)\" stroke=\"white\"/>"
                    "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"white\">%d/%d</text>\n",
                    x, y, cw, ch, red, green, x + cw / 2, y + ch / 2 + 4, ok, n);
      s += buf;
    }
  }
  std::snprintf(buf, sizeof buf,
                "<text x=\"%d\" y=\"%d\">columns: context (prompt + answer tokens); rows: needle depth in the "
                "filler</text>\n",
                10, H - 14);
  s += buf;
  s += "</svg>\n";
  return s;
}

}  // namespace flashkv::eval
