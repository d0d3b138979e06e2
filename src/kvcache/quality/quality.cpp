// Per-format error metrics and the attention-level needle test over the real PagedKVCache (see quality.hpp), and the
// needle heatmap as SVG (written directly, no plotting dependency).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "kvcache/quality/quality.hpp"

namespace flashkv::kvq {

namespace {

KVCacheConfig make_config(const std::string& dtype, const CacheSettings& s, int64_t head_dim, int64_t n) {
  KVCacheConfig c;
  c.num_layers = 1;
  c.num_heads_kv = 1;
  c.head_dim = static_cast<int32_t>(head_dim);
  c.page_size = s.page_size;
  c.residual_tokens = s.residual_tokens;
  c.sink_tokens = s.sink_tokens;
  c.rotation = s.hadamard ? KVRotation::hadamard : KVRotation::none;
  c.rotation_seed = s.rotation_seed;
  c.with_kv_cache_dtype(dtype);
  c.capacity_pages = n / s.page_size + 2;
  return c;
}

void fill(PagedKVCache& c, const std::vector<float>& k, const std::vector<float>& v, int64_t n, int64_t d) {
  c.add_sequence(0);
  const int64_t chunk = 8192;
  for (int64_t t = 0; t < n; t += chunk) {
    const int64_t m = std::min(chunk, n - t);
    c.append(0, 0,
             TensorView::contiguous(const_cast<float*>(k.data() + t * d), DType::float32, {m, 1, d}),
             TensorView::contiguous(const_cast<float*>(v.data() + t * d), DType::float32, {m, 1, d}));
  }
}

/// Decode attention of num_q query heads (GQA over the single KV head) against sequence 0.
std::vector<float> attend(const PagedKVCache& c, const std::vector<float>& q, int64_t num_q, int64_t d) {
  std::vector<float> out(static_cast<size_t>(num_q * d));
  const int64_t ids[] = {0};
  const int32_t cu[] = {0, 1};
  c.attention(ids, cu, 0, TensorView::contiguous(const_cast<float*>(q.data()), DType::float32, {1, num_q, d}),
              TensorView::contiguous(out.data(), DType::float32, {1, num_q, d}), nullptr);
  return out;
}

double nmse(const std::vector<float>& x, const std::vector<float>& y) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (static_cast<double>(y[i]) - x[i]) * (static_cast<double>(y[i]) - x[i]);
    den += static_cast<double>(x[i]) * x[i];
  }
  return den > 0 ? num / den : 0.0;
}

}  // namespace

FormatQuality evaluate_format(const std::string& kv_cache_dtype, const CacheSettings& settings, const Synthetic& data) {
  const int64_t n = data.n, d = data.head_dim, nq = data.num_q;
  PagedKVCache cache(make_config(kv_cache_dtype, settings, d, n));
  PagedKVCache exact(make_config("fp32", settings, d, n));
  fill(cache, data.k, data.v, n, d);
  fill(exact, data.k, data.v, n, d);
  FormatQuality r;
  r.kv_cache_dtype = kv_cache_dtype;
  r.bits_per_element = cache.memory_report().bits_per_element;
  std::vector<float> kd(static_cast<size_t>(n * d)), vd(kd.size());
  cache.dequantize(0, 0, TensorView::contiguous(kd.data(), DType::float32, {n, 1, d}),
                   TensorView::contiguous(vd.data(), DType::float32, {n, 1, d}));
  r.nmse_k = nmse(data.k, kd);
  r.nmse_v = nmse(data.v, vd);
  const std::vector<float> o = attend(cache, data.q, nq, d), oe = attend(exact, data.q, nq, d);
  double num = 0, den = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    num += (static_cast<double>(o[i]) - oe[i]) * (static_cast<double>(o[i]) - oe[i]);
    den += static_cast<double>(oe[i]) * oe[i];
  }
  r.attn_rel_err = den > 0 ? std::sqrt(num / den) : 0.0;
  // bias / spread of the estimated scaled score q·k̂ − q·k over every (query, key) pair
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  double s1 = 0, s2 = 0;
  for (int64_t i = 0; i < nq; ++i) {
    const float* q = data.q.data() + i * d;
    for (int64_t t = 0; t < n; ++t) {
      double e = 0;
      for (int64_t c = 0; c < d; ++c) e += static_cast<double>(q[c]) * (kd[static_cast<size_t>(t * d + c)] - data.k[static_cast<size_t>(t * d + c)]);
      e *= scale;
      s1 += e;
      s2 += e * e;
    }
  }
  const double cnt = static_cast<double>(nq * n);
  r.qk_bias = s1 / cnt;
  r.qk_std = std::sqrt(std::max(0.0, s2 / cnt - r.qk_bias * r.qk_bias));
  return r;
}

double NeedleResult::success_rate(int64_t context) const {
  int64_t ok = 0, all = 0;
  for (const NeedleCell& c : cells) {
    if (c.context != context) continue;
    ++all;
    ok += c.success ? 1 : 0;
  }
  return all > 0 ? static_cast<double>(ok) / static_cast<double>(all) : 0.0;
}

NeedleResult needle_test(const std::string& kv_cache_dtype, const CacheSettings& settings,
                         const std::vector<int64_t>& contexts, const std::vector<double>& depths, double margin,
                         int32_t head_dim, uint64_t seed) {
  if (!std::isfinite(margin)) throw Error("margin", "a finite number", std::to_string(margin));
  for (double dp : depths) {
    if (!(dp >= 0.0 && dp <= 1.0)) throw Error("depths", "values in [0, 1]", std::to_string(dp));
  }
  NeedleResult res;
  res.kv_cache_dtype = kv_cache_dtype;
  const int64_t d = head_dim;
  for (int64_t n : contexts) {
    if (n < 2) throw Error("contexts", "values >= 2", std::to_string(n));
    // distractors and query: shared by every depth of this context (and by every format, through the seed)
    Synthetic base = generate(Distribution::gaussian, n, 1, d, seed ^ static_cast<uint64_t>(n));
    std::mt19937_64 g(seed * 31 + static_cast<uint64_t>(n));
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<float> needle_v(static_cast<size_t>(d)), mean_v(static_cast<size_t>(d));
    for (float& x : needle_v) x = n01(g);
    for (float& x : mean_v) x = n01(g);
    // distractor values share a common mean direction (as LLM value vectors do), so the output is the needle only when
    // the needle really holds most of the softmax mass: cos >= 0.9 needs roughly p_needle >= 0.67
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t c = 0; c < d; ++c) base.v[static_cast<size_t>(t * d + c)] += mean_v[static_cast<size_t>(c)];
    }
    const double sq = std::sqrt(static_cast<double>(d));
    double qn = 0;
    for (float x : base.q) qn += static_cast<double>(x) * x;
    qn = std::sqrt(qn);
    std::vector<double> scores(static_cast<size_t>(n));
    double mx = -1e300;
    for (int64_t t = 0; t < n; ++t) {
      double s = 0;
      for (int64_t c = 0; c < d; ++c) s += static_cast<double>(base.q[static_cast<size_t>(c)]) * base.k[static_cast<size_t>(t * d + c)];
      scores[static_cast<size_t>(t)] = s / sq;
      mx = std::max(mx, scores[static_cast<size_t>(t)]);
    }
    double sum = 0;
    for (double s : scores) sum += std::exp(s - mx);
    for (double depth : depths) {
      const int64_t pos = static_cast<int64_t>(std::llround(depth * static_cast<double>(n - 1)));
      // log-sum-exp of the distractors other than the replaced one
      const double lse = mx + std::log(std::max(sum - std::exp(scores[static_cast<size_t>(pos)] - mx), 1e-300));
      // needle key = the distractor at pos + beta·q/|q|, with score q·k*/sqrt(d) = lse + margin
      const double beta = ((lse + margin) * sq - scores[static_cast<size_t>(pos)] * sq) / qn;
      std::vector<float> k = base.k, v = base.v;
      for (int64_t c = 0; c < d; ++c) {
        k[static_cast<size_t>(pos * d + c)] += static_cast<float>(beta * base.q[static_cast<size_t>(c)] / qn);
        v[static_cast<size_t>(pos * d + c)] = needle_v[static_cast<size_t>(c)];
      }
      PagedKVCache cache(make_config(kv_cache_dtype, settings, d, n));
      fill(cache, k, v, n, d);
      const std::vector<float> o = attend(cache, base.q, 1, d);
      double dot = 0, no = 0, nv = 0;
      for (int64_t c = 0; c < d; ++c) {
        dot += static_cast<double>(o[static_cast<size_t>(c)]) * needle_v[static_cast<size_t>(c)];
        no += static_cast<double>(o[static_cast<size_t>(c)]) * o[static_cast<size_t>(c)];
        nv += static_cast<double>(needle_v[static_cast<size_t>(c)]) * needle_v[static_cast<size_t>(c)];
      }
      NeedleCell cell;
      cell.context = n;
      cell.depth = depth;
      cell.cosine = (no > 0 && nv > 0) ? dot / std::sqrt(no * nv) : 0.0;
      cell.success = cell.cosine >= 0.9;
      res.cells.push_back(cell);
    }
  }
  return res;
}

std::string needle_heatmap_svg(const NeedleResult& r, const std::vector<int64_t>& contexts,
                               const std::vector<double>& depths) {
  const int cw = 70, ch = 26, left = 70, top = 50;
  const int W = left + cw * static_cast<int>(contexts.size()) + 20;
  const int Hh = top + ch * static_cast<int>(depths.size()) + 50;
  std::string s;
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
                "font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
                "<text x=\"%d\" y=\"20\" font-size=\"14\">needle test: %s (colour = cos(out, needle value); "
                "success &gt;= 0.9)</text>\n",
                W, Hh, 10, r.kv_cache_dtype.c_str());
  s += buf;
  for (size_t ci = 0; ci < contexts.size(); ++ci) {
    const int64_t n = contexts[ci];
    std::string label = n >= 1024 && n % 1024 == 0 ? std::to_string(n / 1024) + "k" : std::to_string(n);
    std::snprintf(buf, sizeof(buf), "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
                  left + static_cast<int>(ci) * cw + cw / 2, top - 6, label.c_str());
    s += buf;
  }
  for (size_t di = 0; di < depths.size(); ++di) {
    std::snprintf(buf, sizeof(buf), "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%.0f%%</text>\n", left - 6,
                  top + static_cast<int>(di) * ch + ch / 2 + 4, depths[di] * 100.0);
    s += buf;
  }
  for (const NeedleCell& c : r.cells) {
    const auto ci = std::find(contexts.begin(), contexts.end(), c.context) - contexts.begin();
    const auto di = std::find(depths.begin(), depths.end(), c.depth) - depths.begin();
    const double t = std::clamp((c.cosine - 0.5) / 0.5, 0.0, 1.0);  // 0.5 -> red, 1.0 -> green
    const int red = static_cast<int>(220 * (1 - t) + 30), green = static_cast<int>(180 * t + 40);
    const int x = left + static_cast<int>(ci) * cw, y = top + static_cast<int>(di) * ch;
    std::snprintf(buf, sizeof(buf),
                  "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"rgb(%d,%d,60)\" stroke=\"white\"/>"
                  "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"white\">%.3f</text>\n",
                  x, y, cw, ch, red, green, x + cw / 2, y + ch / 2 + 4, c.cosine);
    s += buf;
  }
  std::snprintf(buf, sizeof(buf), "<text x=\"%d\" y=\"%d\">context length (tokens) →   rows: needle depth</text>\n",
                left, Hh - 15);
  s += buf;
  s += "</svg>\n";
  return s;
}

}  // namespace flashkv::kvq
