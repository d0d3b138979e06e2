#include "eval/report.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "flashkv/error.hpp"

namespace flashkv::eval {

namespace {
std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}
std::string kl_str(double kl) { return kl == 0.0 ? "0" : fmt("%.3e", kl); }
}  // namespace

std::string format_table(const std::vector<FormatRow>& rows, bool greedy) {
  std::vector<std::string> head = {"kv cache", "bytes/token", "eff. bits", "vs bf16", "decode tok/s", "mean KL",
                                   "top-1", "ppl ratio", "first div (TF)"};
  if (greedy) head.push_back("greedy div");
  std::vector<std::vector<std::string>> cells;
  for (const auto& r : rows) {
    const auto& m = r.metrics;
    std::vector<std::string> c = {
        r.label, fmt("%.0f", r.bytes_per_token), fmt("%.2f", r.effective_bits), fmt("%.2fx", r.ratio_vs_bf16),
        fmt("%.0f", r.decode_tok_s), kl_str(m.mean_kl), fmt("%.2f%%", 100.0 * m.top1), fmt("%.4f", m.ppl_ratio),
        m.diverged == 0 ? std::string("none") : fmt("%.1f", m.mean_first_divergence) + " (" +
                                                    std::to_string(m.diverged) + "/" + std::to_string(m.sequences) + ")"};
    if (greedy) c.push_back(r.greedy_divergence < 0 ? std::string("none") : "step " + std::to_string(r.greedy_divergence));
    cells.push_back(std::move(c));
  }
  return markdown_table(head, cells);
}

nlohmann::json rows_to_json(const std::vector<FormatRow>& rows) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& r : rows) {
    const auto& m = r.metrics;
    nlohmann::json j = {
        {"label", r.label}, {"kv_cache_dtype", r.spec.kv_cache_dtype}, {"residual", r.spec.residual},
        {"sinks", r.spec.sinks}, {"rotate", r.spec.rotate}, {"page_size", r.spec.page_size},
        {"bytes_per_token", r.bytes_per_token}, {"effective_bits", r.effective_bits},
        {"ratio_vs_bf16", r.ratio_vs_bf16}, {"decode_tok_s", r.decode_tok_s}, {"mean_kl", m.mean_kl},
        {"max_kl", m.max_kl}, {"top1", m.top1}, {"delta_ll", m.delta_ll}, {"ppl_ratio", m.ppl_ratio},
        {"mean_first_divergence", m.mean_first_divergence}, {"diverged", m.diverged}, {"sequences", m.sequences},
        {"positions", m.positions}};
    if (!r.greedy_tokens.empty() || !r.greedy_text.empty()) {
      j["greedy_divergence"] = r.greedy_divergence;
      j["greedy_tokens"] = r.greedy_tokens;
      j["greedy_text"] = r.greedy_text;
    }
    a.push_back(std::move(j));
  }
  return a;
}

void write_kl_plot_svg(const std::vector<FormatRow>& rows, const std::string& title, const std::string& path,
                       const std::string& reference) {
  const double W = 720, H = 440, L = 80, R = 30, T = 50, B = 60;
  // Formats with KL = 0 (the fp32 reference) cannot sit on a log axis: they are listed under the title instead and
  // do not stretch the bits axis.
  double bmin = 64, bmax = 0, kmin = 1e30, kmax = 0;
  std::string exact;
  for (const auto& r : rows) {
    if (r.metrics.mean_kl > 0) {
      bmin = std::min(bmin, r.effective_bits);
      bmax = std::max(bmax, r.effective_bits);
      kmin = std::min(kmin, r.metrics.mean_kl);
      kmax = std::max(kmax, r.metrics.mean_kl);
    } else {
      exact += (exact.empty() ? "" : ", ") + r.label;
    }
  }
  if (kmax == 0) { kmin = 1e-6; kmax = 1e-5; bmin = 0; bmax = 32; }
  double lk0 = std::floor(std::log10(kmin)), lk1 = std::ceil(std::log10(kmax));
  if (lk1 <= lk0) lk1 = lk0 + 1;
  const double b0 = std::max(0.0, std::floor(bmin) - 1), b1 = std::ceil(bmax) + 1;
  auto X = [&](double b) { return L + (b - b0) / (b1 - b0) * (W - L - R); };
  auto Y = [&](double kl) {
    if (kl <= 0) return H - B;
    return T + (lk1 - std::log10(kl)) / (lk1 - lk0) * (H - T - B);
  };
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s << "<text x=\"" << W / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">" << title << "</text>\n";
  s << "<line x1=\"" << L << "\" y1=\"" << H - B << "\" x2=\"" << W - R << "\" y2=\"" << H - B << "\" stroke=\"black\"/>\n";
  s << "<line x1=\"" << L << "\" y1=\"" << T << "\" x2=\"" << L << "\" y2=\"" << H - B << "\" stroke=\"black\"/>\n";
  for (double b = b0; b <= b1 + 1e-9; b += std::max(1.0, std::round((b1 - b0) / 10))) {
    s << "<line x1=\"" << X(b) << "\" y1=\"" << H - B << "\" x2=\"" << X(b) << "\" y2=\"" << H - B + 5
      << "\" stroke=\"black\"/><text x=\"" << X(b) << "\" y=\"" << H - B + 18 << "\" text-anchor=\"middle\">" << b
      << "</text>\n";
  }
  for (double e = lk0; e <= lk1 + 1e-9; e += 1) {
    const double y = Y(std::pow(10.0, e));
    s << "<line x1=\"" << L - 5 << "\" y1=\"" << y << "\" x2=\"" << W - R << "\" y2=\"" << y
      << "\" stroke=\"#ddd\"/><text x=\"" << L - 8 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">1e" << e
      << "</text>\n";
  }
  s << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 15
    << "\" text-anchor=\"middle\">effective bits per cached element (codes + metadata + residual + slack)</text>\n";
  s << "<text x=\"20\" y=\"" << (T + H - B) / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 20 "
    << (T + H - B) / 2 << ")\">mean KL(" << reference << " || format), nats/token</text>\n";
  if (!exact.empty())
    s << "<text x=\"" << W / 2 << "\" y=\"40\" text-anchor=\"middle\" fill=\"#555\">KL = 0 exactly (not drawn): " << exact
      << "</text>\n";
  for (const auto& r : rows) {
    if (r.metrics.mean_kl <= 0) continue;
    const double x = X(r.effective_bits), y = Y(r.metrics.mean_kl);
    s << "<circle cx=\"" << x << "\" cy=\"" << y << "\" r=\"5\" fill=\"#1f77b4\"/><text x=\"" << x + 7 << "\" y=\""
      << y - 7 << "\">" << r.label << "</text>\n";
  }
  s << "</svg>\n";
  std::ofstream f(path, std::ios::trunc);
  if (!f) throw IoError("flashkv: cannot write plot '" + path + "'");
  f << s.str();
  if (!f) throw IoError("flashkv: failed writing plot '" + path + "'");
}

void ProgressBar::update(int64_t done, int64_t total) {
  if (!enabled_ || total <= 0) return;
  const auto now = clock::now();
  if (done < total && drawn_ && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  drawn_ = true;
  const double frac = static_cast<double>(done) / static_cast<double>(total);
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double eta = frac > 0 ? elapsed * (1.0 - frac) / frac : 0.0;
  const int width = 30, fill = static_cast<int>(frac * width);
  std::fprintf(stderr, "\r[%s%s] %3.0f%% %lld/%lld %s  elapsed %.1fs  ETA %.1fs ", std::string(static_cast<std::size_t>(fill), '#').c_str(),
               std::string(static_cast<std::size_t>(width - fill), '.').c_str(), 100.0 * frac,
               static_cast<long long>(done), static_cast<long long>(total), unit_.c_str(), elapsed, eta);
  std::fflush(stderr);
}

void ProgressBar::finish() {
  if (enabled_ && drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

}  // namespace flashkv::eval
