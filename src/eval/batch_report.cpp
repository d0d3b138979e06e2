// Text and JSON of a batched decode run (batch_decode.hpp).
#include <cstdio>

#include "eval/batch_decode.hpp"

namespace flashkv::eval {

std::string batch_decode_table(const BatchDecodeResult& r) {
  std::string s;
  char line[512];
  for (const BatchFormat& f : r.formats)
    if (f.status != "ok") s += f.kv_cache + ": " + f.status + ": " + f.message + "\n";
  std::snprintf(line, sizeof line, "%-16s %7s %6s %10s %10s %10s %9s %11s %11s  %s\n", "kv_cache", "context", "batch",
                "step ms", "(median)", "tok/s", "ctx mean", "KV GB/step", "W GB/step", "status");
  s += line;
  for (const BatchDecodeRow& x : r.rows) {
    const std::string batch = std::to_string(x.batch) + (x.is_max ? "*" : "");
    if (x.status == "ok") {
      std::snprintf(line, sizeof line, "%-16s %7d %6s %10.3f %10.3f %10.1f %9.0f %11.3f %11.3f  ok (%d steps)\n",
                    x.kv_cache.c_str(), x.context, batch.c_str(), x.step_ms_mean, x.step_ms_median, x.tokens_per_s,
                    x.context_mean, x.kv_read_bytes_per_step / 1e9, x.weight_bytes_per_step / 1e9, x.steps);
    } else {
      std::snprintf(line, sizeof line, "%-16s %7d %6s %10s %10s %10s %9s %11s %11s  %s: %s\n", x.kv_cache.c_str(),
                    x.context, x.batch == 0 ? "max" : batch.c_str(), "-", "-", "-", "-", "-", "-", x.status.c_str(),
                    x.message.c_str());
    }
    s += line;
  }
  s += "(* = the most sequences of this context the pool holds, or --batch-cap)\n\ncapacity:\n";
  std::snprintf(line, sizeof line, "%-16s %7s %12s %10s %11s %8s %9s %9s  %s\n", "kv_cache", "context", "page bytes",
                "pool pages", "pages/seq", "fit", "max batch", "measured", "probe stopped by");
  s += line;
  for (const BatchCapacity& c : r.capacity) {
    std::snprintf(line, sizeof line, "%-16s %7d %12lld %10lld %11lld %8lld %9lld %9s  %s\n", c.kv_cache.c_str(),
                  c.context, static_cast<long long>(c.page_bytes), static_cast<long long>(c.pool_pages),
                  static_cast<long long>(c.pages_per_sequence), static_cast<long long>(c.fit),
                  static_cast<long long>(c.max_batch), c.measured < 0 ? "-" : std::to_string(c.measured).c_str(),
                  c.measured < 0 ? "" : c.measured_stop.c_str());
    s += line;
  }
  return s;
}

nlohmann::json batch_decode_to_json(const BatchDecodeResult& r) {
  nlohmann::json j;
  j["formats"] = nlohmann::json::array();
  for (const BatchFormat& f : r.formats)
    j["formats"].push_back({{"kv_cache", f.kv_cache}, {"status", f.status}, {"message", f.message},
                            {"engine_seconds", f.engine_seconds}, {"pool_bytes", f.pool_bytes},
                            {"page_bytes", f.page_bytes}, {"pool_pages", f.pool_pages}});
  j["capacity"] = nlohmann::json::array();
  for (const BatchCapacity& c : r.capacity)
    j["capacity"].push_back({{"kv_cache", c.kv_cache}, {"context", c.context}, {"page_bytes", c.page_bytes},
                             {"pool_pages", c.pool_pages}, {"pages_per_sequence", c.pages_per_sequence},
                             {"kv_bytes_per_sequence", c.kv_bytes_per_sequence}, {"fit", c.fit},
                             {"max_batch", c.max_batch}, {"measured", c.measured},
                             {"measured_stop", c.measured_stop}});
  j["rows"] = nlohmann::json::array();
  for (const BatchDecodeRow& x : r.rows)
    j["rows"].push_back({{"kv_cache", x.kv_cache}, {"context", x.context}, {"batch", x.batch}, {"is_max", x.is_max},
                         {"depth", x.depth}, {"status", x.status}, {"message", x.message}, {"warmup", x.warmup},
                         {"steps", x.steps}, {"fill_seconds", x.fill_seconds}, {"step_ms", x.step_ms},
                         {"step_ms_mean", x.step_ms_mean}, {"step_ms_median", x.step_ms_median},
                         {"step_ms_min", x.step_ms_min}, {"tokens_per_s", x.tokens_per_s},
                         {"context_mean", x.context_mean}, {"context_max", x.context_max}, {"kv_read_bytes_per_step", x.kv_read_bytes_per_step},
                         {"weight_bytes_per_step", x.weight_bytes_per_step}});
  return j;
}

}  // namespace flashkv::eval
