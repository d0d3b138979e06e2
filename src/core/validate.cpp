#include "core/validate.hpp"

#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <string>

#include "flashkv/error.hpp"

namespace flashkv::core {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

std::string shape_str(std::initializer_list<int64_t> shape) {
  std::string s = "[";
  bool first = true;
  for (int64_t d : shape) {
    s += (first ? "" : ", ") + str(d);
    first = false;
  }
  return s + "]";
}

std::string float_str(float f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(f));
  return buf;
}

bool is_attention_dtype(DType t) {
  return t == DType::float32 || t == DType::float16 || t == DType::bfloat16 || t == DType::float8_e4m3fn;
}

/// Full-shape check: rank, layout and every dimension.
void check_shape(const TensorView& t, const char* name, std::initializer_list<int64_t> expected, const char* layout) {
  check_rank_and_layout(t, name, static_cast<int>(expected.size()), layout);
  int d = 0;
  for (int64_t e : expected) {
    if (t.shape[d] != e) {
      throw Error(name, "shape " + shape_str(expected) + " " + layout, t.describe());
    }
    ++d;
  }
}

/// A tensor that must have q's dtype and device (k, v, out, dout, dq, dk, dv).
void check_like_q(const TensorView& t, const char* name, const TensorView& q) {
  if (t.dtype != q.dtype) {
    throw TypeError(name, std::string(dtype_name(q.dtype)) + " (= q.dtype; one dtype for all tensors)",
                    dtype_name(t.dtype));
  }
  check_same_device(t, name, q, "q");
}

Strides3 strides3(const TensorView& t, bool varlen) {
  Strides3 s;
  if (varlen) {
    s.batch = 0;
    s.row = t.strides[0];
    s.head = t.strides[1];
  } else {
    s.batch = t.strides[0];
    s.row = t.strides[1];
    s.head = t.strides[2];
  }
  return s;
}

/// Points the problem at a validated tensor: its data pointer and its (batch, row, head) element strides.
template <class Ptr>
void bind(const TensorView& t, bool varlen, Ptr& data, Strides3& strides) {
  data = t.data;
  strides = strides3(t, varlen);
}

void check_head_dim(int64_t d, const char* name, const char* what) {
  if (d < 1 || d > kMaxHeadDim) {
    throw Error(name, std::string(what) + " in [1, " + str(kMaxHeadDim) + "]", str(d));
  }
}

/// q, k, v and out: ranks, shapes, dtypes, devices, pointers. Fills sizes, pointers and strides of `p`.
/// For varlen, p.batch must already be set (from cu_seqlens_q).
void check_qkv_out(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out, bool varlen,
                   AttentionProblem& p) {
  const int off = varlen ? 0 : 1;
  const char* q_layout = varlen ? "(total_q, num_heads, head_dim)" : "(batch, seqlen_q, num_heads, head_dim)";
  const char* k_layout = varlen ? "(total_k, num_heads_kv, head_dim)" : "(batch, seqlen_k, num_heads_kv, head_dim)";
  const char* v_layout =
      varlen ? "(total_k, num_heads_kv, head_dim_v)" : "(batch, seqlen_k, num_heads_kv, head_dim_v)";
  check_rank_and_layout(q, "q", 3 + off, q_layout);
  if (!is_attention_dtype(q.dtype)) {
    throw TypeError("q", "float32, float16, bfloat16 or float8_e4m3fn (forward only)", dtype_name(q.dtype));
  }
  check_rank_and_layout(k, "k", 3 + off, k_layout);
  check_like_q(k, "k", q);
  check_rank_and_layout(v, "v", 3 + off, v_layout);
  check_like_q(v, "v", q);

  if (!varlen) p.batch = q.shape[0];
  const int64_t rows_q = q.shape[off];
  p.num_heads = q.shape[off + 1];
  p.head_dim = q.shape[off + 2];
  if (p.num_heads < 1) throw Error("q", "num_heads >= 1 (q.shape[" + str(off + 1) + "])", str(p.num_heads));
  check_head_dim(p.head_dim, "q", "head_dim (q.shape[-1])");

  if (!varlen) check_dim(k, "k", 0, p.batch, "batch", "(= q.shape[0])");
  const int64_t rows_k = k.shape[off];
  p.num_heads_kv = k.shape[off + 1];
  if (p.num_heads_kv < 1) throw Error("k", "num_heads_kv >= 1 (k.shape[" + str(off + 1) + "])", str(p.num_heads_kv));
  if (p.num_heads % p.num_heads_kv != 0) {
    throw Error("k", "num_heads_kv dividing num_heads = " + str(p.num_heads) + " (GQA/MQA)",
                "num_heads_kv " + str(p.num_heads_kv));
  }
  check_dim(k, "k", off + 2, p.head_dim, "head_dim", "(= q.shape[" + str(off + 2) + "])");

  if (!varlen) check_dim(v, "v", 0, p.batch, "batch", "(= q.shape[0])");
  check_dim(v, "v", off, rows_k, varlen ? "total_k" : "seqlen_k", "(= k.shape[" + str(off) + "])");
  check_dim(v, "v", off + 1, p.num_heads_kv, "num_heads_kv", "(= k.shape[" + str(off + 1) + "])");
  p.head_dim_v = v.shape[off + 2];
  check_head_dim(p.head_dim_v, "v", "head_dim_v (v.shape[-1])");

  if (varlen) {
    check_shape(out, "out", {rows_q, p.num_heads, p.head_dim_v}, "(total_q, num_heads, head_dim_v)");
  } else {
    check_shape(out, "out", {p.batch, rows_q, p.num_heads, p.head_dim_v}, "(batch, seqlen_q, num_heads, head_dim_v)");
  }
  if (q.dtype == DType::float8_e4m3fn) {  // the FP8 forward writes bfloat16 (FA3's output type)
    if (out.dtype != DType::bfloat16) {
      throw TypeError("out", "bfloat16 (the output of float8_e4m3fn attention)", dtype_name(out.dtype));
    }
    check_same_device(out, "out", q, "q");
  } else {
    check_like_q(out, "out", q);
  }

  check_data(q, "q");
  check_data(k, "k");
  check_data(v, "v");
  check_data(out, "out");

  if (varlen) {
    p.total_q = rows_q;
    p.total_k = rows_k;
  } else {
    p.seqlen_q = p.max_seqlen_q = rows_q;
    p.seqlen_k = p.max_seqlen_k = rows_k;
    p.total_q = p.batch * rows_q;
    p.total_k = p.batch * rows_k;
  }
  p.dtype = q.dtype;
  p.out_dtype = out.dtype;
  p.device = q.device;
  p.device_index = q.device_index;
  bind(q, varlen, p.q, p.q_strides);
  bind(k, varlen, p.k, p.k_strides);
  bind(v, varlen, p.v, p.v_strides);
  bind(out, varlen, p.out, p.out_strides);
}

void check_lse(const TensorView& lse, const TensorView& q, bool varlen, AttentionProblem& p) {
  if (lse.dtype != DType::float32) throw TypeError("lse", "float32", dtype_name(lse.dtype));
  if (varlen) {
    check_shape(lse, "lse", {p.num_heads, p.total_q}, "(num_heads, total_q)");
    p.lse_strides = LseStrides{0, lse.strides[0], lse.strides[1]};
  } else {
    check_shape(lse, "lse", {p.batch, p.num_heads, p.seqlen_q}, "(batch, num_heads, seqlen_q)");
    p.lse_strides = LseStrides{lse.strides[0], lse.strides[1], lse.strides[2]};
  }
  check_same_device(lse, "lse", q, "q");
  check_data(lse, "lse");
  p.lse = static_cast<float*>(lse.data);
}

void check_backward_tensors(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                            const TensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                            bool varlen, AttentionProblem& p) {
  auto same_shape = [&](const TensorView& t, const char* name, const TensorView& ref, const char* ref_name) {
    check_rank_and_layout(t, name, ref.ndim, "");
    for (int d = 0; d < ref.ndim; ++d) {
      if (t.shape[d] != ref.shape[d]) {
        std::string expected = "shape of " + std::string(ref_name) + " ";
        std::string r = "[";
        for (int e = 0; e < ref.ndim; ++e) r += (e ? ", " : "") + str(ref.shape[e]);
        throw Error(name, expected + r + "]", t.describe());
      }
    }
    check_like_q(t, name, q);
    check_data(t, name);
  };
  if (q.dtype == DType::float8_e4m3fn) {
    throw UnsupportedError("flashkv: attention_backward has no float8_e4m3fn kernels (FP8 attention is forward-only, "
                           "as in FlashAttention-3); run the backward on bfloat16 or float16 tensors");
  }
  same_shape(dout, "dout", out, "out");
  same_shape(dq, "dq", q, "q");
  same_shape(dk, "dk", k, "k");
  same_shape(dv, "dv", v, "v");
  bind(dout, varlen, p.dout, p.dout_strides);
  bind(dq, varlen, p.dq, p.dq_strides);
  bind(dk, varlen, p.dk, p.dk_strides);
  bind(dv, varlen, p.dv, p.dv_strides);
  p.is_backward = true;
}

/// One FP8 dequantization scale: float32 on the inputs' device, shape [] / [1] (per tensor) or [batch, num_heads_kv].
AttentionProblem::Descale check_descale(const TensorView* t, const char* name, const AttentionProblem& p) {
  AttentionProblem::Descale d;
  if (t == nullptr) return d;
  if (p.dtype != DType::float8_e4m3fn) {
    throw Error(name, "nullptr (dequantization scales are for float8_e4m3fn q/k/v only)",
                std::string("a tensor with q.dtype ") + dtype_name(p.dtype));
  }
  if (t->dtype != DType::float32) throw TypeError(name, "float32", dtype_name(t->dtype));
  if (t->device != p.device || t->device_index != p.device_index) {
    throw TypeError(name, std::string("device ") + device_name(p.device) + ":" + str(p.device_index) + " (= q)",
                    std::string(device_name(t->device)) + ":" + str(t->device_index));
  }
  const std::string per_head = "shape [] or [1] (per tensor) or [" + str(p.batch) + ", " + str(p.num_heads_kv) +
                               "] (batch, num_heads_kv)";
  if (t->ndim == 0 || (t->ndim == 1 && t->shape[0] == 1)) {
    // per tensor: strides 0
  } else if (t->ndim == 2 && t->shape[0] == p.batch && t->shape[1] == p.num_heads_kv) {
    if (t->strides[0] < 0 || t->strides[1] < 0) throw Error(name, "non-negative strides", t->describe());
    d.batch = t->strides[0];
    d.head = t->strides[1];
  } else {
    throw Error(name, per_head, t->describe());
  }
  if (t->data == nullptr && (p.batch > 0 || t->ndim < 2)) throw Error(name, "a non-null data pointer", "nullptr");
  d.ptr = static_cast<const float*>(t->data);
  return d;
}

void check_descales(const AttentionOptions& o, AttentionProblem& p) {
  p.q_descale = check_descale(o.q_descale, "q_descale", p);
  p.k_descale = check_descale(o.k_descale, "k_descale", p);
  p.v_descale = check_descale(o.v_descale, "v_descale", p);
  if (p.dtype == DType::float8_e4m3fn && p.device == Device::cpu) {
    throw UnsupportedError("flashkv: float8_e4m3fn attention runs on CUDA only (kernel family 'sm90ws', a Hopper "
                           "GPU); the tensors are on the CPU (dequantize to bfloat16 or float32 for the CPU)");
  }
}

void check_options(const AttentionOptions& o, AttentionProblem& p) {
  if (o.window_size_left < -1) {
    throw Error("window_size_left", ">= -1 (-1 = unbounded)", str(o.window_size_left));
  }
  if (o.window_size_right < -1) {
    throw Error("window_size_right", ">= -1 (-1 = unbounded)", str(o.window_size_right));
  }
  if (o.causal && o.window_size_right > 0) {
    throw Error("window_size_right", "-1 or 0 when causal = true (causal means window_size_right = 0)",
                str(o.window_size_right));
  }
  if (!std::isfinite(o.softcap) || o.softcap < 0.0f) {
    throw Error("softcap", "a finite value >= 0 (0 = off)", float_str(o.softcap));
  }
  if (o.softmax_scale.has_value() && (!std::isfinite(*o.softmax_scale) || *o.softmax_scale <= 0.0f)) {
    throw Error("softmax_scale", "a finite value > 0", float_str(*o.softmax_scale));
  }
  const int alg = static_cast<int>(o.algorithm);
  if (alg < 0 || alg > 2) throw Error("algorithm", "tiled (0), v1_order (1) or naive (2)", str(alg));
  if (o.num_threads < 0) throw Error("num_threads", ">= 0 (0 = OpenMP default)", str(o.num_threads));
  const int fam = static_cast<int>(o.kernel_family);
  if (fam < 0 || fam > 3) throw Error("kernel_family", "auto (0), sm80 (1), sm90 (2) or sm90ws (3)", str(fam));
  if (p.device == Device::cpu && o.kernel_family != KernelFamily::automatic) {
    throw UnsupportedError(std::string("flashkv: kernel_family '") + kernel_family_name(o.kernel_family) +
                           "' selects a CUDA kernel family, but the tensors are on the CPU (use 'auto')");
  }

  check_descales(o, p);

  p.softmax_scale = o.softmax_scale.value_or(1.0f / std::sqrt(static_cast<float>(p.head_dim)));
  p.window_size_left = o.window_size_left;
  p.window_size_right = o.causal ? 0 : o.window_size_right;
  p.causal = o.causal;
  p.softcap = o.softcap;
  p.algorithm = o.algorithm;
  p.kernel_family = o.kernel_family;
  p.deterministic = o.deterministic;
  p.num_threads = o.num_threads;
  p.stream = o.stream;
}

/// Shapes of cu_seqlens_q/k; sets p.batch. Values are checked later (check_cu_values) once total_q/k are known.
void check_cu_shapes(const TensorView& cu_q, const TensorView& cu_k, const TensorView& q, AttentionProblem& p) {
  check_rank_and_layout(cu_q, "cu_seqlens_q", 1, "(batch + 1)");
  check_rank_and_layout(cu_k, "cu_seqlens_k", 1, "(batch + 1)");
  if (cu_q.dtype != DType::int32) throw TypeError("cu_seqlens_q", "int32", dtype_name(cu_q.dtype));
  if (cu_k.dtype != DType::int32) throw TypeError("cu_seqlens_k", "int32", dtype_name(cu_k.dtype));
  if (cu_q.shape[0] < 1) throw Error("cu_seqlens_q", "length batch + 1 >= 1", str(cu_q.shape[0]));
  check_dim(cu_k, "cu_seqlens_k", 0, cu_q.shape[0], "length batch + 1 =", "(= cu_seqlens_q.shape[0])");
  check_same_device(cu_q, "cu_seqlens_q", q, "q");
  check_same_device(cu_k, "cu_seqlens_k", q, "q");
  check_data(cu_q, "cu_seqlens_q");
  check_data(cu_k, "cu_seqlens_k");
  p.batch = cu_q.shape[0] - 1;
  p.is_varlen = true;
  p.cu_seqlens_q = static_cast<const int32_t*>(cu_q.data);
  p.cu_seqlens_k = static_cast<const int32_t*>(cu_k.data);
}

void check_cu_values(const int32_t* cu, int64_t batch, int64_t total, int64_t max_seqlen, const char* name,
                     const char* total_what, const char* max_name) {
  const std::string n = name;
  if (cu[0] != 0) throw Error(name, n + "[0] = 0", n + "[0] = " + str(cu[0]));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = static_cast<int64_t>(cu[b + 1]) - cu[b];
    if (len < 0) {
      throw Error(name, "non-decreasing values",
                  n + "[" + str(b + 1) + "] = " + str(cu[b + 1]) + " < " + n + "[" + str(b) + "] = " + str(cu[b]));
    }
    if (len > max_seqlen) {
      throw Error(max_name, ">= every sequence length (sequence " + str(b) + " has " + str(len) + " tokens)",
                  str(max_seqlen));
    }
  }
  if (cu[batch] != total) {
    throw Error(name, n + "[batch] = " + str(total) + " (" + total_what + ")",
                n + "[" + str(batch) + "] = " + str(cu[batch]));
  }
}

void finish_varlen(int64_t max_seqlen_q, int64_t max_seqlen_k, AttentionProblem& p) {
  if (max_seqlen_q < 0) throw Error("max_seqlen_q", ">= 0", str(max_seqlen_q));
  if (max_seqlen_k < 0) throw Error("max_seqlen_k", ">= 0", str(max_seqlen_k));
  p.seqlen_q = p.max_seqlen_q = max_seqlen_q;
  p.seqlen_k = p.max_seqlen_k = max_seqlen_k;
  if (p.device == Device::cpu) {
    check_cu_values(p.cu_seqlens_q, p.batch, p.total_q, max_seqlen_q, "cu_seqlens_q", "= q.shape[0] = total_q",
                    "max_seqlen_q");
    check_cu_values(p.cu_seqlens_k, p.batch, p.total_k, max_seqlen_k, "cu_seqlens_k", "= k.shape[0] = total_k",
                    "max_seqlen_k");
  }
}

}  // namespace

// ---- reusable checks -----------------------------------------------------------------------------------------------

void check_rank_and_layout(const TensorView& t, const char* name, int ndim, const char* layout) {
  const std::string lay = (layout && *layout) ? std::string(" ") + layout : std::string();
  if (t.ndim != ndim) {
    throw Error(name, str(ndim) + " dimensions" + lay, str(t.ndim) + " dimensions " + t.describe());
  }
  for (int d = 0; d < ndim; ++d) {
    if (t.shape[d] < 0) throw Error(name, "non-negative shape", t.describe());
    if (t.strides[d] < 0) {
      throw Error(name, "non-negative strides", "strides[" + str(d) + "] = " + str(t.strides[d]));
    }
  }
  if (ndim > 0 && t.shape[ndim - 1] > 1 && t.strides[ndim - 1] != 1) {
    throw Error(name, "a contiguous last dimension (stride 1)", "stride " + str(t.strides[ndim - 1]));
  }
}

void check_dim(const TensorView& t, const char* name, int dim, int64_t expected, const std::string& what,
               const std::string& source) {
  if (t.shape[dim] != expected) {
    throw Error(name, what + " " + str(expected) + (source.empty() ? "" : " " + source), str(t.shape[dim]));
  }
}

void check_dtype(const TensorView& t, const char* name, DType dtype) {
  if (t.dtype != dtype) throw TypeError(name, dtype_name(dtype), dtype_name(t.dtype));
}

void check_same_device(const TensorView& t, const char* name, const TensorView& ref, const char* ref_name) {
  if (t.device != ref.device || t.device_index != ref.device_index) {
    throw TypeError(name,
                    std::string("device ") + device_name(ref.device) + ":" + str(ref.device_index) + " (= " +
                        ref_name + ")",
                    std::string(device_name(t.device)) + ":" + str(t.device_index));
  }
}

void check_data(const TensorView& t, const char* name) {
  if (t.data == nullptr && t.numel() > 0) throw Error(name, "a non-null data pointer", "nullptr");
}

// ---- problems ------------------------------------------------------------------------------------------------------

AttentionProblem make_forward_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& out, const TensorView* lse, const AttentionOptions& options) {
  AttentionProblem p;
  check_qkv_out(q, k, v, out, /*varlen=*/false, p);
  if (lse != nullptr) check_lse(*lse, q, false, p);
  check_options(options, p);
  return p;
}

AttentionProblem make_backward_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                                       const TensorView& out, const TensorView& lse, const TensorView& dout,
                                       const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                       const AttentionOptions& options) {
  AttentionProblem p;
  check_qkv_out(q, k, v, out, false, p);
  check_lse(lse, q, false, p);
  check_backward_tensors(q, k, v, out, dout, dq, dk, dv, false, p);
  check_options(options, p);
  return p;
}

AttentionProblem make_varlen_forward_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                                             const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                                             int64_t max_seqlen_q, int64_t max_seqlen_k, const TensorView& out,
                                             const TensorView* lse, const AttentionOptions& options) {
  AttentionProblem p;
  check_cu_shapes(cu_seqlens_q, cu_seqlens_k, q, p);
  check_qkv_out(q, k, v, out, true, p);
  finish_varlen(max_seqlen_q, max_seqlen_k, p);
  if (lse != nullptr) check_lse(*lse, q, true, p);
  check_options(options, p);
  return p;
}

AttentionProblem make_varlen_backward_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                                              const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                                              int64_t max_seqlen_q, int64_t max_seqlen_k, const TensorView& out,
                                              const TensorView& lse, const TensorView& dout, const TensorView& dq,
                                              const TensorView& dk, const TensorView& dv,
                                              const AttentionOptions& options) {
  AttentionProblem p;
  check_cu_shapes(cu_seqlens_q, cu_seqlens_k, q, p);
  check_qkv_out(q, k, v, out, true, p);
  finish_varlen(max_seqlen_q, max_seqlen_k, p);
  check_lse(lse, q, true, p);
  check_backward_tensors(q, k, v, out, dout, dq, dk, dv, true, p);
  check_options(options, p);
  return p;
}

}  // namespace flashkv::core
