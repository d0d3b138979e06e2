// Append kernel of the decode path (decode_append.hpp).
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
    int64_t kdst, vdst;
    if (!append16_slot(p, b, i, kdst, vdst)) continue;
    const uint16_t kx = p.k_new[b * p.kn_batch + i * p.kn_row + hk * p.kn_head + c];
    const uint16_t vx = p.v_new[b * p.vn_batch + i * p.vn_row + hk * p.vn_head + c];
    if (p.bad != nullptr) {  // idx is the flat (b, i, h, c) index
      if ((kx & p.exp_mask) == p.exp_mask) atomicMin(&p.bad[0], static_cast<unsigned long long>(idx));
      if ((vx & p.exp_mask) == p.exp_mask) atomicMin(&p.bad[1], static_cast<unsigned long long>(idx));
    }
    p.k_cache[kdst + hk * p.k_head + c] = kx;
    p.v_cache[vdst + hk * p.v_head + c] = vx;
  }
}

}  // namespace

void append_kv(const AppendParams& p, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(p.batch) * p.seqlen_new * p.num_heads_kv * p.head_dim;
  if (total == 0) return;
  if (append_kv_vec(p, stream)) return;
  const int64_t blocks = (total + 255) / 256;
  append_kv_kernel<<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(p, total);
  check_cuda(cudaGetLastError(), "append_kv launch");
}

}  // namespace flashkv::cuda
