// Where an evaluation runs and what it is compared against (EvalTarget), and the up-front device checks.
#include "eval/evaluation.hpp"
#include "flashkv/error.hpp"

namespace flashkv::eval {

namespace {
bool on_cpu(const EngineOptions& o) { return o.device == Device::cpu; }
std::string name_of(const EngineOptions& o) {
  return on_cpu(o) ? std::string("cpu") : "cuda:" + std::to_string(o.device_index);
}
bool same_spec(const KVCacheSpec& a, const KVCacheSpec& b) {
  return a.kv_cache_dtype == b.kv_cache_dtype && a.residual == b.residual && a.sinks == b.sinks &&
         a.rotate == b.rotate && (!a.rotate || a.rotation_seed == b.rotation_seed) && a.page_size == b.page_size;
}
}  // namespace

EngineOptions EvalTarget::reference_options() const {
  if (on_cpu(engine)) return engine;  // the CPU's own options (bf16_activations: the reference rounds alike)
  if (cpu_reference) {
    EngineOptions o;  // the CPU's fp32 truth
    o.kv_capacity_pages = engine.kv_capacity_pages;
    return o;
  }
  return engine;
}

KVCacheSpec EvalTarget::reference_spec() const {
  KVCacheSpec s;
  s.kv_cache_dtype = on_cpu(reference_options()) ? "fp32" : "bf16";
  return s;
}

std::string EvalTarget::device_name() const { return name_of(engine); }
std::string EvalTarget::reference_device() const { return name_of(reference_options()); }

std::string EvalTarget::reference_name() const {
  return reference_spec().kv_cache_dtype + " cache on " + reference_device();
}

bool EvalTarget::is_reference(const KVCacheSpec& spec) const {
  const EngineOptions r = reference_options();
  return r.device == engine.device && r.device_index == engine.device_index && same_spec(spec, reference_spec());
}

std::string EvalTarget::describe() const { return "device " + device_name() + "; reference = " + reference_name(); }

std::string unsupported_reason(const Model& model, const KVCacheSpec& spec, const EngineOptions& options) {
  EngineOptions probe = options;
  probe.kv_capacity_pages = 1;  // one page: the check costs no cache memory
  try {
    Engine e(model, spec, 1, 0, probe);
  } catch (const UnsupportedError& err) {
    return err.what();
  }
  return "";
}

namespace {
/// The device runs at all (its own widest cache: no backend / no device is an error, never a list of skips), and so
/// does the reference.
void check_device_and_reference(const Model& model, const EvalTarget& target) {
  EvalTarget own = target;
  own.cpu_reference = false;
  if (const std::string why = unsupported_reason(model, own.reference_spec(), target.engine); !why.empty())
    throw UnsupportedError(why);
  if (target.cpu_reference)
    if (const std::string why = unsupported_reason(model, target.reference_spec(), target.reference_options());
        !why.empty())
      throw UnsupportedError(why);
}
}  // namespace

void check_target(const Model& model, const std::vector<KVCacheSpec>& specs, const EvalTarget& target) {
  check_device_and_reference(model, target);
  for (const KVCacheSpec& s : specs) {
    if (target.is_reference(s)) continue;
    if (const std::string why = unsupported_reason(model, s, target.engine); !why.empty()) throw UnsupportedError(why);
  }
}

std::vector<KVCacheSpec> runnable_specs(const Model& model, const std::vector<KVCacheSpec>& specs,
                                        const EvalTarget& target, std::vector<SkippedFormat>& skipped) {
  check_device_and_reference(model, target);
  std::vector<KVCacheSpec> out;
  for (const KVCacheSpec& s : specs) {
    const std::string why = target.is_reference(s) ? std::string() : unsupported_reason(model, s, target.engine);
    if (why.empty())
      out.push_back(s);
    else
      skipped.push_back({s, s.label(), why});
  }
  return out;
}

}  // namespace flashkv::eval
