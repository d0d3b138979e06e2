// Batched decode speed and capacity per KV format (batch_decode.hpp).
#include "eval/batch_decode.hpp"

#include <algorithm>
#include <chrono>
#include <memory>
#include <set>

#include "eval/serve.hpp"
#include "flashkv/error.hpp"
#include "flashkv/kvcache.hpp"

namespace flashkv::eval {

namespace {

using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

/// Bytes a decode step reads from the cache for one sequence attending `tokens` tokens.
double kv_read_bytes(const KVCacheConfig& kc, int64_t tokens) {
  const KVMemoryReport r = kv_memory_estimate(kc, 1, tokens);
  return static_cast<double>(r.code_bytes + r.metadata_bytes + r.residual_bytes);
}

void check(const BatchDecodeOptions& o) {
  if (o.contexts.empty()) throw Error("contexts", "at least one context", "none");
  if (o.batches.empty()) throw Error("batches", "at least one batch", "none");
  if (o.warmup < 0) throw Error("warmup", ">= 0 steps", std::to_string(o.warmup));
  if (o.n_gen < 1) throw Error("n_gen", ">= 1 timed steps", std::to_string(o.n_gen));
  for (int32_t b : o.batches)
    if (b < 0) throw Error("batches", "batch sizes >= 1 or 0 (= max)", std::to_string(b));
  const int64_t points = static_cast<int64_t>(std::set<int32_t>(o.batches.begin(), o.batches.end()).size());
  for (int32_t c : o.contexts)
    if (c < points * (o.warmup + o.n_gen) + 1)
      throw Error("contexts", ">= points · (warmup + n_gen) + 1 = " + std::to_string(points * (o.warmup + o.n_gen) + 1) +
                                  " tokens (each of the " + std::to_string(points) +
                                  " batch points decodes its steps on top of a fill of at least one token)",
                  std::to_string(c));
  if (o.batch_cap < 1) throw Error("batch_cap", ">= 1", std::to_string(o.batch_cap));
  if (o.probe_cap < 1) throw Error("probe_cap", ">= 1", std::to_string(o.probe_cap));
  if (o.pool_bytes < 0) throw Error("pool_bytes", ">= 0 (0 = enough for the largest batch)", std::to_string(o.pool_bytes));
  const bool wants_max = std::find(o.batches.begin(), o.batches.end(), 0) != o.batches.end();
  if ((wants_max || o.capacity_context > 0) && o.pool_bytes == 0)
    throw Error("pool_bytes", "a pool size (> 0) when the batches include 'max' or capacity_context is set", "0");
  if (o.capacity_context > 0 &&
      std::find(o.contexts.begin(), o.contexts.end(), o.capacity_context) == o.contexts.end())
    throw Error("capacity_context", "one of the contexts", std::to_string(o.capacity_context));
  if (!o.synthetic && o.ubatch < 1) throw Error("ubatch", ">= 1 tokens", std::to_string(o.ubatch));
}

/// One format: the engine, its sequences and the points.
class FormatRun {
 public:
  FormatRun(const Model& m, const KVCacheSpec& spec, const BatchDecodeOptions& o, BatchDecodeResult& out,
            const std::function<void(const BatchDecodeRow&)>& on_row, clock_type::time_point start)
      : m_(m), spec_(spec), o_(o), out_(out), on_row_(on_row), start_(start), kc_(kv_cache_config(m.config, spec)) {}

  void run() {
    const ModelConfig& c = m_.config;
    BatchFormat f;
    f.kv_cache = spec_.label();
    int32_t max_ctx = 0, max_batch = 1;
    for (int32_t ctx : o_.contexts)
      if (ctx <= c.seq_len) max_ctx = std::max(max_ctx, ctx);
    for (int32_t b : o_.batches) max_batch = std::max(max_batch, b == 0 ? o_.batch_cap : b);
    if (o_.capacity_context > 0) max_batch = std::max(max_batch, o_.probe_cap);
    f.page_bytes = kv_memory_estimate(kc_, 1, 1).page_bytes;
    f.pool_pages = o_.pool_bytes > 0 ? o_.pool_bytes / f.page_bytes : 0;
    if (max_ctx > 0 && f.pool_pages == 0) {
      int32_t largest_numeric = 1;
      for (int32_t b : o_.batches) largest_numeric = std::max(largest_numeric, b);
      f.pool_pages = largest_numeric * kv_memory_estimate(kc_, 1, max_ctx).pages_used;
    }
    f.pool_bytes = f.pool_pages * f.page_bytes;
    if (max_ctx == 0) {  // every context is beyond the model's
      f.status = "ok";
      out_.formats.push_back(f);
      for (int32_t ctx : o_.contexts) context_rows(ctx, "context > model", context_message(ctx));
      return;
    }
    EngineOptions eo = o_.engine;
    eo.kv_capacity_pages = std::max<int64_t>(1, f.pool_pages);
    const auto t0 = clock_type::now();
    try {
      for (int attempt = 0;; ++attempt) {
        try {
          engine_ = std::make_unique<Engine>(m_, spec_, max_batch + 1, max_ctx, eo);
          break;
        } catch (const CapacityError& e) {  // the pool (or the weights next to it) does not fit: 10% less, twice
          if (o_.pool_bytes == 0 || attempt == 2) throw;
          f.message += std::string(f.message.empty() ? "" : "; ") + "pool of " +
                       std::to_string(eo.kv_capacity_pages) + " pages refused (" + e.what() + "), retried 10% smaller";
          eo.kv_capacity_pages = eo.kv_capacity_pages * 9 / 10;
        }
      }
    } catch (const UnsupportedError& e) {
      f.status = "unsupported";
      f.message = e.what();
      out_.formats.push_back(f);
      return;
    } catch (const Error& e) {  // e.g. CapacityError: the pool does not fit the device
      f.status = "error";
      f.message = e.what();
      out_.formats.push_back(f);
      return;
    }
    f.engine_seconds = since(t0);
    f.status = "ok";
    f.pool_pages = eo.kv_capacity_pages;
    f.pool_bytes = f.pool_pages * f.page_bytes;
    out_.formats.push_back(f);
    pool_pages_ = eo.kv_capacity_pages;
    for (int32_t ctx : o_.contexts) {
      if (ctx > c.seq_len) {
        context_rows(ctx, "context > model", context_message(ctx));
        continue;
      }
      run_context(ctx);
    }
    clear();
  }

 private:
  std::string context_message(int32_t ctx) const {
    return "context " + std::to_string(ctx) + " exceeds the model's " + std::to_string(m_.config.seq_len);
  }

  void emit(BatchDecodeRow r) {
    if (on_row_) on_row_(r);
    out_.rows.push_back(std::move(r));
  }

  void context_rows(int32_t ctx, const std::string& status, const std::string& message) {
    for (int32_t b : o_.batches) {
      BatchDecodeRow r = base_row(ctx, b);
      r.status = status;
      r.message = message;
      emit(std::move(r));
    }
  }

  BatchDecodeRow base_row(int32_t ctx, int32_t b, int32_t depth = 0) const {
    BatchDecodeRow r;
    r.kv_cache = spec_.label();
    r.context = ctx;
    r.batch = b;
    r.is_max = b == 0;
    r.depth = depth;
    return r;
  }

  void clear() {
    for (int32_t s : seqs_) engine_->remove_sequence(s);
    seqs_.clear();
  }

  /// Fills a new sequence to `n` tokens; returns its id (CapacityError / Error propagate, the sequence removed).
  int32_t filled(int32_t n, uint64_t salt) {
    const int32_t s = engine_->add_sequence();
    try {
      if (o_.synthetic) {
        engine_->append_synthetic(s, n, o_.seed);
      } else {
        std::vector<int32_t> toks(static_cast<std::size_t>(n));
        const int32_t V = m_.config.vocab_size;
        for (int32_t i = 0; i < n; ++i)
          toks[static_cast<std::size_t>(i)] = static_cast<int32_t>((static_cast<uint64_t>(i) * 7919u + salt * 104729u + 13u) % V);
        for (int32_t u = 0; u < n; u += o_.ubatch) {
          const int32_t k = std::min(o_.ubatch, n - u);
          engine_->extend(s, std::span<const int32_t>(toks.data() + u, static_cast<std::size_t>(k)), {}, false);
        }
      }
    } catch (...) {
      engine_->remove_sequence(s);
      throw;
    }
    return s;
  }

  /// At least `count` live sequences: new ones filled to `depth` tokens, earlier ones kept as a previous point left
  /// them (at most points · (warmup + n_gen) tokens longer).
  void ensure(int32_t count, int32_t depth) {
    while (static_cast<int32_t>(seqs_.size()) < count) seqs_.push_back(filled(depth, seqs_.size()));
  }

  void run_context(int32_t ctx) {
    clear();
    BatchCapacity cap;
    cap.kv_cache = spec_.label();
    cap.context = ctx;
    cap.page_bytes = kv_memory_estimate(kc_, 1, 1).page_bytes;
    cap.pool_pages = pool_pages_;
    cap.pages_per_sequence = std::max<int64_t>(1, kv_memory_estimate(kc_, 1, ctx).pages_used);
    cap.kv_bytes_per_sequence = cap.pages_per_sequence * cap.page_bytes;
    cap.fit = pool_pages_ / cap.pages_per_sequence;
    cap.max_batch = std::min<int64_t>(cap.fit, o_.batch_cap);
    if (ctx == o_.capacity_context) probe(ctx, cap);
    out_.capacity.push_back(cap);

    std::vector<int32_t> order;  // numeric batches ascending, "max" in its place (merged with an equal numeric one)
    const bool wants_max = std::find(o_.batches.begin(), o_.batches.end(), 0) != o_.batches.end();
    for (int32_t b : o_.batches)
      if (b > 0 && std::find(order.begin(), order.end(), b) == order.end()) order.push_back(b);
    if (wants_max && cap.max_batch > 0 && std::find(order.begin(), order.end(), cap.max_batch) == order.end())
      order.push_back(static_cast<int32_t>(cap.max_batch));
    std::sort(order.begin(), order.end());
    // Every point's sequences continue from where the previous point left them (no refill): the fill depth leaves
    // room for all the points' steps, so no sequence passes C.
    const int32_t points = std::max<int32_t>(
        1, static_cast<int32_t>(std::count_if(order.begin(), order.end(), [&](int32_t b) { return b <= cap.fit; })));
    const int32_t depth = ctx - points * (o_.warmup + o_.n_gen);
    if (wants_max && cap.max_batch == 0) {
      BatchDecodeRow r = base_row(ctx, 0, depth);
      r.status = "does not fit";
      r.message = "not one sequence of " + std::to_string(ctx) + " tokens fits the pool of " +
                  std::to_string(pool_pages_) + " pages";
      emit(std::move(r));
    }
    for (int32_t b : order) {
      BatchDecodeRow r = base_row(ctx, b, depth);
      r.is_max = wants_max && b == cap.max_batch;
      if (b > cap.fit) {
        r.status = "does not fit";
        r.message = std::to_string(cap.fit) + " sequences of " + std::to_string(ctx) + " tokens fit the pool of " +
                    std::to_string(pool_pages_) + " pages";
        emit(std::move(r));
        continue;
      }
      if (o_.time_budget > 0 && since(start_) > o_.time_budget) {
        r.status = "skipped";
        r.message = "time budget of " + std::to_string(static_cast<int>(o_.time_budget)) + " s spent";
        emit(std::move(r));
        continue;
      }
      try {
        measure(r);
        r.status = "ok";
      } catch (const Error& e) {
        r.status = "error";
        r.message = e.what();
        clear();  // a failed step may have left sequences at other lengths
      }
      emit(std::move(r));
    }
    clear();
  }

  /// Sequences of `ctx` tokens until the engine refuses one (or probe_cap are held); then all removed.
  void probe(int32_t ctx, BatchCapacity& cap) {
    std::vector<int32_t> held;
    cap.measured_stop = "probe_cap";
    try {
      while (static_cast<int32_t>(held.size()) < o_.probe_cap) held.push_back(filled(ctx, held.size()));
    } catch (const CapacityError& e) {
      cap.measured_stop = e.what();
    }
    cap.measured = static_cast<int64_t>(held.size());
    for (int32_t s : held) engine_->remove_sequence(s);
  }

  void measure(BatchDecodeRow& r) {
    const int32_t B = r.batch;
    const auto tf = clock_type::now();
    ensure(B, r.depth);
    r.fill_seconds = since(tf);
    const std::vector<int32_t> ids(seqs_.begin(), seqs_.begin() + B);
    std::vector<int32_t> len(static_cast<std::size_t>(B));
    for (int32_t i = 0; i < B; ++i) len[static_cast<std::size_t>(i)] = engine_->length(ids[static_cast<std::size_t>(i)]);
    std::vector<int32_t> tokens(static_cast<std::size_t>(B));
    for (int32_t i = 0; i < B; ++i)
      tokens[static_cast<std::size_t>(i)] =
          static_cast<int32_t>((o_.seed * 2654435761u + static_cast<uint64_t>(i) * 40503u) % m_.config.vocab_size);
    std::vector<std::unique_ptr<Sampler>> samplers;
    std::vector<Sampler*> ptrs;
    for (int32_t i = 0; i < B; ++i) {
      samplers.push_back(std::make_unique<Sampler>(SamplerConfig{}));  // greedy
      ptrs.push_back(samplers.back().get());
    }
    auto step = [&] {
      engine_->decode(ids, tokens, {});
      tokens = engine_->sample(ptrs);
    };
    const auto tw = clock_type::now();
    for (int32_t w = 0; w < o_.warmup; ++w) {
      step();
      ++r.warmup;
      for (int32_t& n : len) ++n;
      if (o_.point_seconds > 0 && since(tw) >= o_.point_seconds) break;  // a slow step needs less warming
    }
    const auto t0 = clock_type::now();
    double kv = 0.0, ctx_sum = 0.0;
    for (int32_t i = 0; i < o_.n_gen; ++i) {
      const auto ts = clock_type::now();
      step();
      r.step_ms.push_back(since(ts) * 1e3);
      for (int32_t& n : len) {  // tokens attended: the history and the step's own token
        ++n;
        kv += kv_read_bytes(kc_, n);
        ctx_sum += n;
        r.context_max = std::max(r.context_max, n);
      }
      if (o_.point_seconds > 0 && since(t0) >= o_.point_seconds) break;
    }
    const double secs = since(t0);
    r.steps = static_cast<int32_t>(r.step_ms.size());
    r.tokens_per_s = static_cast<double>(B) * r.steps / secs;
    double sum = 0.0;
    for (double x : r.step_ms) sum += x;
    r.step_ms_mean = sum / r.steps;
    r.step_ms_median = percentile(r.step_ms, 50.0);
    r.step_ms_min = *std::min_element(r.step_ms.begin(), r.step_ms.end());
    r.context_mean = ctx_sum / (static_cast<double>(r.steps) * B);
    r.kv_read_bytes_per_step = kv / r.steps;
    r.weight_bytes_per_step = decode_weight_bytes(m_.config, o_.engine.device, B);
  }

  const Model& m_;
  const KVCacheSpec& spec_;
  const BatchDecodeOptions& o_;
  BatchDecodeResult& out_;
  const std::function<void(const BatchDecodeRow&)>& on_row_;
  clock_type::time_point start_;
  KVCacheConfig kc_;
  std::unique_ptr<Engine> engine_;
  int64_t pool_pages_ = 0;
  std::vector<int32_t> seqs_;
};

}  // namespace

double decode_weight_bytes(const ModelConfig& c, Device device, int32_t batch) {
  const double D = c.dim, H = c.hidden_dim, V = c.vocab_size, KVd = c.kv_dim(),
               Qd = static_cast<double>(c.num_heads) * c.head_dim;
  const double matrices = c.n_layers * (D * (Qd + 2 * KVd) + Qd * D + 3 * H * D) + V * D;  // classifier included
  const double norms = (2.0 * c.n_layers + 1) * D;
  const double embedding_rows = static_cast<double>(batch) * D;
  return matrices * (device == Device::cuda ? 2.0 : 4.0) + (norms + embedding_rows) * 4.0;
}

BatchDecodeResult run_batch_decode(const Model& model, const std::vector<KVCacheSpec>& specs,
                                   const BatchDecodeOptions& o,
                                   const std::function<void(const BatchDecodeRow&)>& on_row) {
  check(o);
  for (const KVCacheSpec& s : specs) (void)kv_memory_estimate(kv_cache_config(model.config, s), 1, 1);  // specs valid
  BatchDecodeResult out;
  const auto start = clock_type::now();
  for (const KVCacheSpec& spec : specs) FormatRun(model, spec, o, out, on_row, start).run();
  return out;
}

}  // namespace flashkv::eval
