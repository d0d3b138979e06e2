// C ABI of the v3 harness library (loaded by harness.py with ctypes). Tensors: q [batch, seqlen_q, num_heads, d],
// k/v [batch, seqlen_k, num_heads_kv, d], out like q (strides in elements), lse [batch, num_heads, seqlen_q] float32.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "v3.hpp"

namespace {
std::string g_error;
}

extern "C" {

int v3_num_variants() { return static_cast<int>(v3::registry().size()); }
const char* v3_variant_name(int i) { return v3::registry().at(i).name.c_str(); }
const char* v3_variant_config(int i) { return v3::registry().at(i).config.c_str(); }
int v3_variant_head_dim(int i) { return v3::registry().at(i).head_dim; }
int v3_variant_dtype(int i) { return v3::registry().at(i).dtype; }
const char* v3_last_error() { return g_error.c_str(); }

/// Returns 0 on success, a cudaError_t value on a CUDA error, -1 on a rejected argument (v3_last_error()).
int v3_run(int variant, const void* q, const void* k, const void* v, void* out, float* lse, int batch, int seqlen_q,
           int seqlen_k, int num_heads, int num_heads_kv, int head_dim, const int64_t* q_strides,
           const int64_t* k_strides, const int64_t* v_strides, const int64_t* out_strides, const int64_t* lse_strides,
           int window_left, int window_right, float softmax_scale, void* stream) {
  try {
    const v3::Variant& var = v3::registry().at(variant);
    flashkv::cuda::FwdParams p;
    p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse;
    p.q_s = {q_strides[0], q_strides[1], q_strides[2]};
    p.k_s = {k_strides[0], k_strides[1], k_strides[2]};
    p.v_s = {v_strides[0], v_strides[1], v_strides[2]};
    p.out_s = {out_strides[0], out_strides[1], out_strides[2]};
    if (lse != nullptr) p.lse_batch = lse_strides[0], p.lse_head = lse_strides[1], p.lse_row = lse_strides[2];
    p.batch = batch, p.num_heads = num_heads, p.num_heads_kv = num_heads_kv, p.head_dim = head_dim;
    p.seqlen_q = seqlen_q, p.seqlen_k = seqlen_k;
    p.total_q = int64_t(batch) * seqlen_q, p.total_k = int64_t(batch) * seqlen_k;
    p.window_left = window_left, p.window_right = window_right;
    p.softmax_scale = softmax_scale;
    p.score_scale = 1.f;
    p.softmax_scale_log2 = softmax_scale * 1.4426950408889634f;
    p.softcap = false;
    if (head_dim != var.head_dim) {
      g_error = "head_dim " + std::to_string(head_dim) + " != variant's " + std::to_string(var.head_dim);
      return -1;
    }
    return static_cast<int>(var.fn(p, static_cast<cudaStream_t>(stream)));
  } catch (const std::exception& e) {
    g_error = e.what();
    return -1;
  }
}
}
