// Tables and JSON of the real-model evaluations (text perplexity/KL, passkey retrieval, engine speed) and the
// run information recorded with every result.
#include <omp.h>
#include <sys/utsname.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>

#include "eval/report.hpp"
#include "flashkv/attention.hpp"

namespace flashkv::eval {

namespace {
/// Display width of UTF-8 text (code points; the tables use no wide characters).
std::size_t width(const std::string& s) {
  std::size_t n = 0;
  for (unsigned char ch : s) n += (ch & 0xC0) != 0x80 ? 1 : 0;
  return n;
}
}  // namespace

std::string markdown_table(const std::vector<std::string>& head, const std::vector<std::vector<std::string>>& cells) {
  std::vector<std::size_t> w(head.size());
  for (std::size_t i = 0; i < head.size(); ++i) {
    w[i] = width(head[i]);
    for (const auto& c : cells) w[i] = std::max(w[i], width(c[i]));
  }
  std::ostringstream os;
  auto line = [&](const std::vector<std::string>& c) {
    os << "|";
    for (std::size_t i = 0; i < c.size(); ++i) os << ' ' << c[i] << std::string(w[i] - width(c[i]), ' ') << " |";
    os << '\n';
  };
  line(head);
  os << "|";
  for (std::size_t i = 0; i < head.size(); ++i) os << std::string(w[i] + 2, '-') << "|";
  os << '\n';
  for (const auto& c : cells) line(c);
  return os.str();
}

namespace {
std::string f(const char* fmt, double v) {
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}
std::string pm(const char* fmt, double v, double e) {
  std::string s = f(fmt, v);
  s.append(" ± ").append(f(fmt, e));
  return s;
}
/// KLD as llama-perplexity prints it (%.5f), or in scientific notation below 1e-3 where %.5f would hide it.
std::string kld_pm(double v, double e) { return v < 1e-3 ? pm("%.2e", v, e) : pm("%.5f", v, e); }
std::string signed_pm(double v, double e) {
  std::string s(v >= 0 ? "+" : "");
  s.append(pm("%.4f", v, e));
  return s;
}

nlohmann::json spec_json(const KVCacheSpec& s) {
  return {{"kv_cache_dtype", s.kv_cache_dtype}, {"residual", s.residual}, {"sinks", s.sinks},
          {"rotate", s.rotate}, {"page_size", s.page_size}};
}
/// "fp32 (reference)" on the CPU, "bf16 (reference, cuda:0)" elsewhere.
std::string reference_label(const KVCacheSpec& spec, const std::string& device) {
  return spec.label() + (device == "cpu" ? " (reference)" : " (reference, " + device + ")");
}
nlohmann::json stats_json(const TextStats& s) {
  return {{"scored", s.scored},       {"ppl", s.ppl},           {"ppl_err", s.ppl_err},
          {"delta_ppl", s.delta_ppl}, {"delta_ppl_err", s.delta_ppl_err}, {"kld_mean", s.kld_mean},
          {"kld_err", s.kld_err},     {"kld_p99", s.kld_p99},   {"kld_max", s.kld_max},
          {"kld_median", s.kld_median}, {"rms_dp", s.rms_dp},   {"rms_dp_err", s.rms_dp_err},
          {"same_top1", s.same_top1}, {"same_top1_err", s.same_top1_err}};
}
}  // namespace

std::string text_table(const TextResult& r) {
  const std::vector<std::string> head = {"kv cache", "eff. bits", "bytes/token", "PPL",
                                         "ΔPPL vs " + r.reference_spec.label(), "mean KLD", "99% KLD", "max KLD",
                                         "RMS Δp", "same top-1"};
  std::vector<std::vector<std::string>> cells;
  cells.push_back({reference_label(r.reference_spec, r.reference_device), f("%.2f", r.reference_bits), "—",
                   pm("%.4f", r.reference.ppl, r.reference.ppl_err), "—", "—", "—", "—", "—", "—"});
  for (const TextRow& row : r.rows) {
    const TextStats& s = row.stats;
    cells.push_back({row.label, f("%.2f", row.effective_bits), f("%.0f", row.bytes_per_token), pm("%.4f", s.ppl, s.ppl_err),
                     signed_pm(s.delta_ppl, s.delta_ppl_err),
                     kld_pm(s.kld_mean, s.kld_err), f(s.kld_p99 < 1e-3 ? "%.2e" : "%.4f", s.kld_p99),
                     f(s.kld_max < 1e-3 ? "%.2e" : "%.3f", s.kld_max),
                     f("%.2f", 100 * s.rms_dp) + " %", pm("%.2f", 100 * s.same_top1, 100 * s.same_top1_err) + " %"});
  }
  return markdown_table(head, cells);
}

nlohmann::json text_to_json(const TextResult& r) {
  nlohmann::json j = {{"n_ctx", r.n_ctx}, {"ubatch", r.ubatch}, {"chunks", r.chunks}, {"text_tokens", r.text_tokens},
                      {"scored_tokens", r.reference.scored}, {"reference", stats_json(r.reference)},
                      {"device", r.device}};
  j["reference"]["device"] = r.reference_device;
  j["reference"]["kv_cache_dtype"] = r.reference_spec.kv_cache_dtype;
  j["reference"]["effective_bits"] = r.reference_bits;
  j["formats"] = nlohmann::json::array();
  for (const TextRow& row : r.rows) {
    nlohmann::json e = spec_json(row.spec);
    e["label"] = row.label;
    e["effective_bits"] = row.effective_bits;
    e["bytes_per_token"] = row.bytes_per_token;
    e["ratio_vs_bf16"] = row.ratio_vs_bf16;
    e["prefill_tok_s_lockstep"] = row.prefill_tok_s;
    e["stats"] = stats_json(row.stats);
    j["formats"].push_back(std::move(e));
  }
  return j;
}

std::string passkey_table(const PasskeyResult& r) {
  std::vector<std::string> head = {"kv cache"};
  for (int32_t c : r.options.contexts) head.push_back(c % 1024 == 0 ? std::to_string(c / 1024) + "k" : std::to_string(c));
  const std::string ref = r.formats.empty() ? std::string("fp32") : r.formats.front().label;
  for (const std::string& h : {std::string("all"), "answers = " + ref + "'s", std::string("first divergence (differing answers)")})
    head.push_back(h);
  std::vector<std::vector<std::string>> cells;
  for (const PasskeyFormat& p : r.formats) {
    std::vector<std::string> c = {&p == &r.formats.front() && r.reference_device != r.device
                                      ? p.label + " (reference, " + r.reference_device + ")"
                                      : p.label};
    for (int32_t ctx : r.options.contexts) c.push_back(f("%.0f%%", 100 * p.success_rate(ctx)));
    c.push_back(f("%.1f%%", 100 * p.success_rate()));
    c.push_back(std::to_string(p.identical_answers()) + "/" + std::to_string(p.trials.size()));
    double sum = 0;
    int n = 0;
    for (const auto& t : p.trials)
      if (t.divergence >= 0) sum += t.divergence, ++n;
    c.push_back(n ? "step " + f("%.1f", sum / n) + " (" + std::to_string(n) + ")" : "—");
    cells.push_back(std::move(c));
  }
  return markdown_table(head, cells);
}

nlohmann::json passkey_to_json(const PasskeyResult& r) {
  const PasskeyOptions& o = r.options;
  nlohmann::json j = {{"contexts", o.contexts}, {"depths", o.depths}, {"keys", o.keys},
                      {"answer_tokens", o.answer_tokens}, {"ubatch", o.ubatch}, {"seed", o.seed},
                      {"device", r.device}, {"reference_device", r.reference_device}};
  j["formats"] = nlohmann::json::array();
  for (const PasskeyFormat& p : r.formats) {
    nlohmann::json e = spec_json(p.spec);
    e["label"] = p.label;
    e["success_rate"] = p.success_rate();
    for (int32_t c : o.contexts) e["success_rate_by_context"][std::to_string(c)] = p.success_rate(c);
    e["identical_answers"] = p.identical_answers();
    e["prefill_tok_s"] = p.prefill_seconds > 0 ? static_cast<double>(p.prefill_tokens) / p.prefill_seconds : 0.0;
    e["decode_tok_s"] = p.decode_seconds > 0 ? static_cast<double>(p.decode_tokens) / p.decode_seconds : 0.0;
    e["trials"] = nlohmann::json::array();
    for (const auto& t : p.trials)
      e["trials"].push_back({{"context", t.context}, {"depth", t.depth}, {"key", t.key},
                             {"prompt_tokens", t.prompt_tokens}, {"answer", t.answer_text},
                             {"success", t.success}, {"divergence", t.divergence}});
    j["formats"].push_back(std::move(e));
  }
  return j;
}

nlohmann::json target_to_json(const EvalTarget& t) {
  return {{"device", t.device_name()},
          {"reference",
           {{"device", t.reference_device()}, {"kv_cache_dtype", t.reference_spec().kv_cache_dtype},
            {"name", t.reference_name()}}}};
}

nlohmann::json skipped_to_json(const std::vector<SkippedFormat>& skipped) {
  nlohmann::json a = nlohmann::json::array();
  for (const SkippedFormat& s : skipped)
    a.push_back({{"label", s.label}, {"kv_cache_dtype", s.spec.kv_cache_dtype}, {"reason", s.reason}});
  return a;
}

std::string speed_table(const std::vector<SpeedRow>& rows) {
  const std::vector<std::string> head = {"kv cache", "eff. bits", "context", "depth", "prefill tok/s (pp)",
                                         "decode tok/s (tg)"};
  std::vector<std::vector<std::string>> cells;
  for (const SpeedRow& r : rows)
    cells.push_back({r.label, f("%.2f", r.effective_bits), std::to_string(r.context), std::to_string(r.depth),
                     pm("%.1f", r.pp_mean, r.pp_sd) + " (n=" + std::to_string(r.pp.size()) + ")",
                     pm("%.1f", r.tg_mean, r.tg_sd) + " (n=" + std::to_string(r.tg.size()) + ")"});
  return markdown_table(head, cells);
}

nlohmann::json speed_to_json(const std::vector<SpeedRow>& rows) {
  nlohmann::json a = nlohmann::json::array();
  for (const SpeedRow& r : rows) {
    nlohmann::json e = spec_json(r.spec);
    e["label"] = r.label;
    e["context"] = r.context;
    e["depth"] = r.depth;
    e["pp_tok_s"] = r.pp;
    e["tg_tok_s"] = r.tg;
    e["pp_mean"] = r.pp_mean;
    e["pp_sd"] = r.pp_sd;
    e["tg_mean"] = r.tg_mean;
    e["tg_sd"] = r.tg_sd;
    e["effective_bits"] = r.effective_bits;
    e["bytes_per_token"] = r.bytes_per_token;
    a.push_back(std::move(e));
  }
  return a;
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  if (!(f >> a >> b >> c)) return "load average unknown";
  return "load average " + a + " " + b + " " + c;
}

nlohmann::json run_info() {
  nlohmann::json j;
  std::string cmd;
  {
    std::ifstream f("/proc/self/cmdline", std::ios::binary);
    std::string arg;
    while (std::getline(f, arg, '\0')) {
      const bool quote = arg.find_first_of(" \t\"'") != std::string::npos || arg.empty();
      if (!cmd.empty()) cmd.push_back(' ');
      if (quote) cmd.push_back('\'');
      cmd.append(arg);
      if (quote) cmd.push_back('\'');
    }
  }
  j["command"] = cmd;
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S%z", std::localtime(&now));
  j["date"] = date;
  std::string cpu = "unknown";
  {
    std::ifstream f("/proc/cpuinfo");
    std::string line;
    while (std::getline(f, line))
      if (line.rfind("model name", 0) == 0) {
        cpu = line.substr(line.find(':') + 2);
        break;
      }
  }
  struct utsname u {};
  uname(&u);
  j["machine"] = {{"cpu_model", cpu},
                  {"hardware_threads", std::thread::hardware_concurrency()},
                  {"omp_max_threads", omp_get_max_threads()},
                  {"kernel", std::string(u.sysname) + " " + u.release},
                  {"load_average_at_start", load_average()}};
  j["flashkv_version"] = version();
  return j;
}

}  // namespace flashkv::eval
