// Append kernels for the decode path (decode_append.hpp).
#include "cuda/check.hpp"
#include "cuda/decode_append.hpp"

namespace flashkv::cuda {
namespace {

__global__ void append_kv_kernel(const AppendParams p, int64_t total) {
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(idx % p.head_dim);
    const int hk = static_cast<int>((idx / p.head_dim) % p.num_heads_kv);
    const int i = static_cast<int>((idx / (static_cast<int64_t>(p.head_dim) * p.num_heads_kv)) % p.seqlen_new);
    const int b = static_cast<int>(idx / (static_cast<int64_t>(p.head_dim) * p.num_heads_kv * p.seqlen_new));
    const int64_t pos = static_cast<int64_t>(p.cache_seqlens[b]) + i;
    if (pos < 0 || pos >= p.capacity) continue;
    int64_t kdst, vdst;
    if (p.page_table != nullptr) {
      const int64_t page = p.page_table[b * p.page_table_batch + (pos >> p.page_size_log2)];
      const int64_t row = pos & ((1 << p.page_size_log2) - 1);
      kdst = page * p.k_page + row * p.k_row;
      vdst = page * p.v_page + row * p.v_row;
    } else {
      kdst = b * p.k_page + pos * p.k_row;
      vdst = b * p.v_page + pos * p.v_row;
    }
    p.k_cache[kdst + hk * p.k_head + c] = p.k_new[b * p.kn_batch + i * p.kn_row + hk * p.kn_head + c];
    p.v_cache[vdst + hk * p.v_head + c] = p.v_new[b * p.vn_batch + i * p.vn_row + hk * p.vn_head + c];
  }
}

__global__ void effective_seqlens_kernel(const int32_t* cache_seqlens, int32_t add, int64_t capacity,
                                         int32_t* seqlens_k, int batch) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= batch) return;
  const int64_t n = static_cast<int64_t>(cache_seqlens[b]) + add;
  seqlens_k[b] = static_cast<int32_t>(n < capacity ? (n < 0 ? 0 : n) : capacity);
}

}  // namespace

void append_kv(const AppendParams& p, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(p.batch) * p.seqlen_new * p.num_heads_kv * p.head_dim;
  if (total == 0) return;
  const int64_t blocks = (total + 255) / 256;
  append_kv_kernel<<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(p, total);
  check_cuda(cudaGetLastError(), "append_kv launch");
}

void effective_seqlens(const int32_t* cache_seqlens, int32_t add, int64_t capacity, int32_t* seqlens_k, int batch,
                       cudaStream_t stream) {
  if (batch == 0) return;
  effective_seqlens_kernel<<<(batch + 127) / 128, 128, 0, stream>>>(cache_seqlens, add, capacity, seqlens_k, batch);
  check_cuda(cudaGetLastError(), "effective_seqlens launch");
}

}  // namespace flashkv::cuda
