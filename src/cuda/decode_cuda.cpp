// The CUDA decode backend (decode_cuda.hpp): core::DecodeProblem -> plan (checks, device tables, splits, workspace)
// -> run (append + split-KV kernel + combine), and the device-memory hooks of device-resident KV caches.
#include "cuda/decode_cuda.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/decode_problem.hpp"
#include "core/scaling.hpp"
#include "cuda/check.hpp"
#include "cuda/decode_append.hpp"
#include "cuda/decode_kernel_choice.hpp"
#include "cuda/decode_quant.hpp"
#include "cuda/decode_splits.hpp"
#include "cuda/kernels.hpp"
#include "cuda/util.hpp"
#include "flashkv/error.hpp"

namespace flashkv::cuda {
namespace {

constexpr int kDecodeBlockN = 64;  // tokens per key block (sm80::DecodeConfig::kBlockN)

/// Decode CTAs of one instantiation resident per SM on `device` (its shared memory and registers; asked of the
/// launcher once per (instantiation, device, kernel), then cached). The launcher of packed pages picks its kernel by
/// keys_m_kernel (decode_kernel_choice.hpp), so the query carries what that reads of the plan `p`.
int ctas_per_sm(DecodeLaunch launch, int32_t device, const core::DecodeProblem& p) {
  struct Known {
    DecodeLaunch launch;
    int32_t device;
    bool keys_m;
    int ctas;
  };
  DecodeParams q;
  int32_t n = 0;
  q.keys_m = decode_keys_m();
  q.rows_per_kv_head = static_cast<int32_t>(p.max_seqlen_q * p.group_size());
  q.head_dim = static_cast<int32_t>(p.head_dim);
  q.k_format = p.kv.format[0], q.v_format = p.kv.format[1];
  const bool keys_m = keys_m_kernel(q);
  static std::mutex mu;
  static std::vector<Known> known;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const Known& k : known)
      if (k.launch == launch && k.device == device && k.keys_m == keys_m) return k.ctas;
  }
  q.query_ctas_per_sm = &n;
  launch(q, nullptr);
  if (n < 1) throw UnsupportedError("flashkv: the CUDA decode kernel does not fit on device " + std::to_string(device) +
                                    " (0 resident CTAs per SM at its shared memory)");
  std::lock_guard<std::mutex> lock(mu);
  known.push_back({launch, device, keys_m, n});
  return n;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

void check_aligned(const void* data, std::initializer_list<int64_t> elem_strides, const char* name) {
  bool ok = aligned16(data);
  for (int64_t s : elem_strides) ok = ok && s % 8 == 0;
  if (!ok) throw Error(name, "a 16-byte aligned data pointer and strides that are multiples of 8 elements", "unaligned");
}

int log2_exact(int64_t x) {
  int l = 0;
  while ((int64_t{1} << l) < x) ++l;
  return l;
}

std::string str(int64_t v) { return std::to_string(v); }

/// 16-bit pages of the query dtype (the Kv16 instantiations), else packed pages (decode_quant).
bool raw16_pages(const core::DecodeProblem& p) {
  const kv::KVCode want = p.dtype == DType::bfloat16 ? kv::KVCode::bf16 : kv::KVCode::f16;
  for (int half = 0; half < 2; ++half) {
    const kv::KVHalfFormat& f = p.kv.format[half];
    if (f.code != want || f.scaling != kv::KVScaling::none) return false;
  }
  return true;
}

/// Per-kv-head static fp8 scales of one half on the device (head_static) when the problem has no device copy
/// (kv.device_head_scales), else nullptr.
std::unique_ptr<DeviceBuffer> upload_head_scales(const core::DecodeProblem& p, int half, cudaStream_t stream) {
  if (p.kv.format[half].scaling != kv::KVScaling::head_static || p.kv.device_head_scales[half] != nullptr) return nullptr;
  if (p.kv.head_scales[half] == nullptr) {
    throw Error(half == 0 ? "k_scales" : "v_scales", "static fp8 scales per kv head (the cache's config)", "none");
  }
  auto buf = std::make_unique<DeviceBuffer>(static_cast<size_t>(p.num_heads_kv) * 4, stream);
  check_cuda(cudaMemcpyAsync(buf->get(), p.kv.head_scales[half], static_cast<size_t>(p.num_heads_kv) * 4,
                             cudaMemcpyHostToDevice, stream),
             "decode plan: upload static scales");
  return buf;
}

/// The checks of packed (non-16-bit) K / V halves that follow from their format descriptions and metadata layout alone:
/// UnsupportedError naming the half (k_cache / v_cache), its kv_cache_dtype name, the expected and the actual value.
/// CudaDecodeWork runs them before any check of where the pages come from, so a format the kernels cannot read is
/// reported as such.
void check_packed_formats(const core::DecodeProblem& p) {
  for (int half = 0; half < 2; ++half) {
    const kv::HalfPages& h = p.kv.pages[half];
    const kv::KVHalfFormat& f = p.kv.format[half];
    const char* name = half == 0 ? "k_cache" : "v_cache";
    // one MMA k-slice per group (checked before the metadata size, which follows from the group)
    // the smallest group whose metadata the decode stages (32 channels at head_dim >= 32: quant_meta_max)
    const int64_t min_group = p.head_dim / (quant_meta_max(kv::KVScaling::token_affine, p.head_dim) / 4);
    if (f.scaling == kv::KVScaling::token_affine && (f.group <= 0 || f.group % 16 != 0 || f.group < min_group)) {
      throw UnsupportedError(std::string("flashkv: CUDA decode: ") + name + " (" + p.kv.format_name[half] +
                             "): channel groups of a positive multiple of 16 channels expected (one MMA k-slice "
                             "per group), of at least " + str(min_group) +
                             " channels (the staged metadata), got groups of " + str(f.group) +
                             " channels; PagedKVCache::to(Device::cpu) decodes it on the CPU");
    }
    if (f.meta_bytes_per_unit > 0 &&
        ((reinterpret_cast<uintptr_t>(h.meta) & 3u) != 0 || h.meta_page_stride % 4 != 0 || h.meta_head_stride % 4 != 0 ||
         f.meta_bytes_per_unit % 4 != 0 || f.tokens_per_unit != 1 ||
         f.meta_bytes_per_unit > quant_meta_max(f.scaling, p.head_dim))) {
      throw UnsupportedError(std::string("flashkv: the CUDA decode cannot read the metadata of ") + name + " (" +
                             p.kv.format_name[half] + ": " + str(f.meta_bytes_per_unit) + " bytes per unit, " +
                             str(f.tokens_per_unit) + " tokens per unit)");
    }
  }
}

/// The split count of a plan for `p` whose kernel is `launch` and whose longest sequence has max_k keys (the current
/// device is p's).
int32_t choose_splits(const core::DecodeProblem& p, DecodeLaunch launch, int64_t max_k, int32_t device) {
  if (p.num_splits > 0) return p.num_splits;
  const int64_t row_tiles = (p.max_seqlen_q * p.group_size() + 15) / 16;
  const int64_t key_blocks = (std::max<int64_t>(max_k, 1) + kDecodeBlockN - 1) / kDecodeBlockN;
  return decode_num_splits(p.batch * p.num_heads_kv * row_tiles, key_blocks, num_sms(),
                           ctas_per_sm(launch, device, p),
                           raw16_pages(p));
}

/// The 16-bit append of `p`'s k_new / v_new rows into its pages through `table` / `seqlens` (device).
AppendParams append16_params(const core::DecodeProblem& p, const int32_t* table, const int32_t* seqlens) {
  const core::DecodeKV& kv = p.kv;
  const int64_t kes = 2;  // element strides of 16-bit pages
  AppendParams a;
  a.k_new = static_cast<const uint16_t*>(p.k_new), a.v_new = static_cast<const uint16_t*>(p.v_new);
  a.kn_batch = p.k_new_strides.batch, a.kn_row = p.k_new_strides.row, a.kn_head = p.k_new_strides.head;
  a.vn_batch = p.v_new_strides.batch, a.vn_row = p.v_new_strides.row, a.vn_head = p.v_new_strides.head;
  a.k_cache = const_cast<uint16_t*>(reinterpret_cast<const uint16_t*>(kv.pages[0].codes));
  a.v_cache = const_cast<uint16_t*>(reinterpret_cast<const uint16_t*>(kv.pages[1].codes));
  a.k_page = kv.pages[0].page_stride / kes, a.k_row = kv.pages[0].slot_stride / kes, a.k_head = kv.pages[0].head_stride / kes;
  a.v_page = kv.pages[1].page_stride / kes, a.v_row = kv.pages[1].slot_stride / kes, a.v_head = kv.pages[1].head_stride / kes;
  a.page_table = table;
  a.page_table_batch = kv.page_table_stride;
  a.page_size_log2 = table != nullptr ? log2_exact(kv.page_size) : 0;
  a.seqlens = seqlens;
  a.batch = static_cast<int32_t>(p.batch), a.seqlen_new = static_cast<int32_t>(p.seqlen_q);
  a.num_heads_kv = static_cast<int32_t>(p.num_heads_kv), a.head_dim = static_cast<int32_t>(p.head_dim);
  a.capacity = kv.capacity;
  a.promised_max = static_cast<int32_t>(std::min<int64_t>(kv.promised_max_seqlen, INT32_MAX));
  a.exp_mask = p.dtype == DType::float16 ? 0x7c00 : 0x7f80;
  return a;
}

/// The plan of one decode batch shape on one CUDA device.
class CudaDecodeWork final : public core::DecodeWork {
 public:
  explicit CudaDecodeWork(const core::DecodeProblem& p);
  void run(const core::DecodeProblem& p) override;
  std::string path() const override { return path_; }
  int32_t num_splits() const override { return num_splits_; }

 private:
  const KernelEntry* ke_ = nullptr;
  const QuantDecodeEntry* qe_ = nullptr;  ///< packed pages: the quantized instantiation
  DecodeLaunch launch_ = nullptr;         ///< the kernel's launcher (ke_ or qe_)
  cudaStream_t stream_ = nullptr;
  int32_t device_ = 0;
  int32_t num_splits_ = 1;
  int64_t rows_ = 0;  ///< batch · num_heads · max_seqlen_q
  std::unique_ptr<DeviceBuffer> seqlens_, page_table_, cu_q_, o_accum_, lse_accum_, split_counters_, head_scales_[2];
  std::string path_;
};

CudaDecodeWork::CudaDecodeWork(const core::DecodeProblem& p) : device_(p.device_index) {
  if (p.dtype != DType::bfloat16 && p.dtype != DType::float16) {
    throw TypeError("q", "bfloat16 or float16 (the CUDA decode computes in 16-bit; float32 runs on the CPU)",
                    dtype_name(p.dtype));
  }
  const bool raw16 = raw16_pages(p);
  // What the cache's layout and the halves' formats rule out comes first, whatever the problem's source (a PagedKVCache,
  // an engine step, or cache tensors): layouts the device does not read yet (KIVI's per-channel keys come with a window,
  // so this is before their metadata check), then the halves' formats (naming the half, its format, expected vs actual).
  if (p.kv.regions.has_window() || p.kv.rot_k || p.kv.rot_v) {
    throw UnsupportedError(std::string("flashkv: the CUDA decode does not read sink / residual windows (KIVI keys' "
                           "bf16 tail) or Hadamard-rotated pages yet (issue #12); this cache: k=") +
                           p.kv.format_name[0] + " v=" + p.kv.format_name[1] +
                           (p.kv.rot_k || p.kv.rot_v ? ", rotated" : "") +
                           "; PagedKVCache::to(Device::cpu) decodes it on the CPU");
  }
  if (!raw16) check_packed_formats(p);
  if (!raw16 && !p.kv.paged_cache) {  // flash-attn style cache tensors are 16-bit by definition
    throw UnsupportedError(std::string("flashkv: the CUDA decode over cache tensors reads ") + dtype_name(p.dtype) +
                           " pages for " + dtype_name(p.dtype) + " queries");
  }
  if (p.head_dim > 256 || p.head_dim % 8 != 0) {
    throw Error("q", "head_dim in 8..256, a multiple of 8 (CUDA decode)", str(p.head_dim));
  }
  if (raw16) {
    ke_ = &find_kernel(KernelKind::decode, p.head_dim, p.dtype);
  } else {  // packed pages: an exact (head_dim, dtype, K format, V format) instantiation or UnsupportedError
    qe_ = &find_quant_decode(p.head_dim, p.dtype, p.kv.format[0], p.kv.format[1], p.kv.format_name[0],
                             p.kv.format_name[1]);
  }
  launch_ = ke_ != nullptr ? reinterpret_cast<DecodeLaunch>(ke_->launch) : qe_->launch;
  if (p.batch > 65535) throw UnsupportedError("flashkv: CUDA decode supports batch <= 65535, got " + str(p.batch));
  check_aligned(p.q, {p.q_strides.batch, p.q_strides.row, p.q_strides.head}, "q");
  check_aligned(p.out, {p.out_strides.batch, p.out_strides.row, p.out_strides.head}, "out");
  for (int half = 0; half < 2; ++half) {
    const kv::HalfPages& h = p.kv.pages[half];
    const char* name = half == 0 ? "k_cache" : "v_cache";
    if (!aligned16(h.codes) || h.page_stride % 16 != 0 || h.slot_stride % 16 != 0 || h.head_stride % 16 != 0) {
      throw Error(name, "a 16-byte aligned data pointer and strides that are multiples of 8 elements", "unaligned");
    }
  }
  const int64_t group = p.group_size();
  const int64_t row_tiles = (p.max_seqlen_q * group + 15) / 16;
  if (p.num_heads_kv * row_tiles > 65535) throw UnsupportedError("flashkv: CUDA decode: too many kv heads x row tiles");

  DeviceGuard guard(device_);
  stream_ = static_cast<cudaStream_t>(p.stream);
  const core::DecodeKV& kv = p.kv;
  if (!raw16) {
    for (int half = 0; half < 2; ++half) head_scales_[half] = upload_head_scales(p, half, stream_);
  }
  int64_t max_k = p.max_seqlen_k;
  if (kv.host_seqlens_k != nullptr) {  // a PagedKVCache: lengths known on the host, checked by the cache
    std::vector<int32_t> lens(static_cast<size_t>(p.batch));
    max_k = 0;
    for (int64_t b = 0; b < p.batch; ++b) {
      lens[static_cast<size_t>(b)] = static_cast<int32_t>(kv.host_seqlens_k[b]);
      max_k = std::max(max_k, kv.host_seqlens_k[b]);
    }
    if (kv.seqlens == nullptr) {
      seqlens_ = std::make_unique<DeviceBuffer>(lens.size() * 4, stream_);
      check_cuda(cudaMemcpyAsync(seqlens_->get(), lens.data(), lens.size() * 4, cudaMemcpyHostToDevice, stream_),
                 "decode plan: upload seqlens");
    }
  } else if (!kv.paged_cache && kv.promised_max_seqlen == 0 && p.batch > 0) {
    // Tensor API without a promised bound: read the lengths back and check them before anything is written or run.
    std::vector<int32_t> lens(static_cast<size_t>(p.batch));
    check_cuda(cudaMemcpyAsync(lens.data(), kv.seqlens, lens.size() * 4, cudaMemcpyDeviceToHost, stream_),
               "decode plan: read cache_seqlens");
    check_cuda(cudaStreamSynchronize(stream_), "decode plan: read cache_seqlens");
    max_k = 0;
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t n = lens[static_cast<size_t>(b)];
      if (n < 0) throw Error("cache_seqlens", "values >= 0", "cache_seqlens[" + str(b) + "] = " + str(n));
      if (n + kv.seqlen_add > kv.capacity) {
        throw CapacityError("flashkv: paged decode past the cache capacity: sequence " + str(b) + " has " + str(n) +
                            " cached tokens" + (kv.seqlen_add ? " + " + str(kv.seqlen_add) + " appended" : std::string()) +
                            " > capacity " + str(kv.capacity) + " tokens (" +
                            (kv.page_table ? str(kv.max_pages) + " pages of " + str(kv.page_size) : std::string("contiguous cache")) +
                            "); nothing written");
      }
      max_k = std::max(max_k, n + kv.seqlen_add);
    }
  }
  if (kv.page_table == nullptr && kv.host_page_table != nullptr) {
    const size_t bytes = static_cast<size_t>(p.batch * kv.page_table_stride) * 4;
    page_table_ = std::make_unique<DeviceBuffer>(bytes, stream_);
    check_cuda(cudaMemcpyAsync(page_table_->get(), kv.host_page_table, bytes, cudaMemcpyHostToDevice, stream_),
               "decode plan: upload page_table");
  }
  if (p.is_varlen && p.cu_seqlens_q == nullptr) {
    cu_q_ = std::make_unique<DeviceBuffer>(static_cast<size_t>(p.batch + 1) * 4, stream_);
    check_cuda(cudaMemcpyAsync(cu_q_->get(), p.host_cu_seqlens_q, static_cast<size_t>(p.batch + 1) * 4,
                               cudaMemcpyHostToDevice, stream_),
               "decode plan: upload cu_seqlens_q");
  }
  (void)decode_combine_mode();  // FLASHKV_DECODE_COMBINE checked at the first plan, whether or not it splits
  (void)decode_keys_m();        // FLASHKV_DECODE_KEYS_M likewise
  num_splits_ = choose_splits(p, launch_, max_k, device_);
  rows_ = p.batch * p.num_heads * p.max_seqlen_q;
  if (num_splits_ > 1) {
    const int64_t dk = ke_ != nullptr ? ke_->head_dim : p.head_dim;
    o_accum_ = std::make_unique<DeviceBuffer>(static_cast<size_t>(num_splits_ * rows_ * dk) * 4, stream_);
    lse_accum_ = std::make_unique<DeviceBuffer>(static_cast<size_t>(num_splits_ * rows_) * 4, stream_);
    if (decode_combine_mode() == DecodeCombine::fused) {  // one arrival count per split tile, zero between runs
      const size_t n = static_cast<size_t>(p.batch * p.num_heads_kv * row_tiles);
      split_counters_ = std::make_unique<DeviceBuffer>(n * 4, stream_);
      check_cuda(cudaMemsetAsync(split_counters_->get(), 0, n * 4, stream_), "decode plan: zero split counters");
    }
  }
  const std::string fmt = raw16 ? std::string() : std::string("k=") + kv.format_name[0] + " v=" + kv.format_name[1] + " ";
  path_ = std::string("kv_decode cuda split-kv sm80 ") + fmt + dtype_name(p.dtype) + " hdim" + str(p.head_dim) + " splits" +
          str(num_splits_) + (kv.page_table != nullptr || kv.host_page_table != nullptr
                                  ? " paged page" + str(kv.page_size)
                                  : std::string(" contiguous"));
  if (p.is_varlen && p.max_seqlen_q > 1) path_ += " varlen";
  if (p.k_new != nullptr) path_ += " append";
  if (num_splits_ > 1) {
    const int64_t dk = ke_ != nullptr ? ke_->head_dim : p.head_dim;
    const DecodeCombine mode = decode_combine_mode();
    path_ += mode == DecodeCombine::fused && fused_combine_fits(num_splits_, dk) ? " combine-fused" : " combine-kernel";
  }
}

void CudaDecodeWork::run(const core::DecodeProblem& p) {
  DeviceGuard guard(device_);
  const core::DecodeKV& kv = p.kv;
  const int64_t kes = qe_ != nullptr ? 1 : 2;  // byte strides for packed pages, element strides for 16-bit ones
  const int32_t* seqlens = seqlens_ ? seqlens_->as<int32_t>() : kv.seqlens;
  const int32_t* table = page_table_ ? page_table_->as<int32_t>() : kv.page_table;
  const bool paged = table != nullptr;
  const int32_t page_log2 = paged ? log2_exact(kv.page_size) : 0;
  if (p.k_new != nullptr) {
    if (qe_ != nullptr) throw UnsupportedError("flashkv: k_new / v_new append into packed pages (use PagedKVCache::append)");
    append_kv(append16_params(p, table, seqlens), stream_);
  }
  if (p.batch == 0 || p.max_seqlen_q == 0 || p.num_heads == 0) return;
  DecodeParams d;
  d.q = p.q, d.out = p.out, d.lse = p.lse;
  d.q_batch = p.q_strides.batch, d.q_row = p.q_strides.row, d.q_head = p.q_strides.head;
  d.out_batch = p.out_strides.batch, d.out_row = p.out_strides.row, d.out_head = p.out_strides.head;
  d.lse_batch = p.lse_strides.batch, d.lse_head = p.lse_strides.head, d.lse_row = p.lse_strides.row;
  d.cu_seqlens_q = p.is_varlen ? (cu_q_ ? cu_q_->as<int32_t>() : p.cu_seqlens_q) : nullptr;
  d.k_cache = kv.pages[0].codes, d.v_cache = kv.pages[1].codes;
  d.k_page = kv.pages[0].page_stride / kes, d.k_row = kv.pages[0].slot_stride / kes, d.k_head = kv.pages[0].head_stride / kes;
  d.v_page = kv.pages[1].page_stride / kes, d.v_row = kv.pages[1].slot_stride / kes, d.v_head = kv.pages[1].head_stride / kes;
  d.page_table = table;
  d.page_table_batch = kv.page_table_stride;
  d.page_size_log2 = page_log2;
  d.seqlens = seqlens;
  d.seqlen_add = static_cast<int32_t>(kv.seqlen_add);
  d.promised_max = static_cast<int32_t>(std::min<int64_t>(kv.promised_max_seqlen, INT32_MAX));
  d.capacity = kv.capacity;
  d.batch = static_cast<int32_t>(p.batch), d.seqlen_q = static_cast<int32_t>(p.max_seqlen_q);
  d.num_heads = static_cast<int32_t>(p.num_heads), d.num_heads_kv = static_cast<int32_t>(p.num_heads_kv);
  d.head_dim = static_cast<int32_t>(p.head_dim);
  d.num_splits = num_splits_;
  // packed pages: more bytes in flight than the shared-memory ring holds (decode_params.hpp)
  d.l2_prefetch_blocks = qe_ != nullptr ? decode_l2_prefetch_blocks() : 0;
  d.keys_m = decode_keys_m();
  d.rows_per_kv_head = static_cast<int32_t>(p.max_seqlen_q * p.group_size());
  d.causal = p.causal;
  d.window_left = p.window_size_left;
  const core::ScoreScaling sc = core::resolve_scaling(p.softmax_scale, p.softcap);  // one place for every kernel
  d.softcap = sc.softcap;
  d.score_scale = sc.score_scale;
  d.softmax_scale_log2 = sc.softmax_scale_log2;
  d.o_accum = o_accum_ ? o_accum_->as<float>() : nullptr;
  d.lse_accum = lse_accum_ ? lse_accum_->as<float>() : nullptr;
  d.split_counters = split_counters_ ? split_counters_->as<int32_t>() : nullptr;
  if (qe_ != nullptr) {
    d.k_meta = kv.pages[0].meta, d.v_meta = kv.pages[1].meta;
    d.k_meta_page = kv.pages[0].meta_page_stride, d.k_meta_head = kv.pages[0].meta_head_stride;
    d.v_meta_page = kv.pages[1].meta_page_stride, d.v_meta_head = kv.pages[1].meta_head_stride;
    d.k_format = kv.format[0], d.v_format = kv.format[1];
    d.k_head_scales = head_scales_[0] ? head_scales_[0]->as<float>() : kv.device_head_scales[0];
    d.v_head_scales = head_scales_[1] ? head_scales_[1]->as<float>() : kv.device_head_scales[1];
    qe_->launch(d, stream_);
    return;
  }
  reinterpret_cast<DecodeLaunch>(ke_->launch)(d, stream_);
}

// ---- hooks ----------------------------------------------------------------------------------------------------------
std::unique_ptr<core::DecodeWork> plan_hook(const core::DecodeProblem& p) { return std::make_unique<CudaDecodeWork>(p); }

/// The quantize-on-write append of `p` (decode_append_quant.hpp); static fp8 scales from kv.device_head_scales, else
/// uploaded into `scales` (which must outlive the launch).
QuantAppendParams quant_params(const core::DecodeProblem& p, std::unique_ptr<DeviceBuffer> (&scales)[2],
                               cudaStream_t stream) {
  const core::DecodeKV& kv = p.kv;
  if (p.head_dim > 256) throw UnsupportedError("flashkv: the CUDA KV append supports head_dim <= 256, got " + str(p.head_dim));
  QuantAppendParams a;
  a.k_new = p.k_new, a.v_new = p.v_new;
  a.dtype = p.dtype == DType::float32 ? 0 : (p.dtype == DType::bfloat16 ? 1 : 2);
  a.kn_batch = p.k_new_strides.batch, a.kn_row = p.k_new_strides.row, a.kn_head = p.k_new_strides.head;
  a.vn_batch = p.v_new_strides.batch, a.vn_row = p.v_new_strides.row, a.vn_head = p.v_new_strides.head;
  for (int half = 0; half < 2; ++half) {
    const kv::HalfPages& h = kv.pages[half];
    const kv::KVHalfFormat& f = kv.format[half];
    if (f.tokens_per_unit != 1 || f.code_bytes == 0 || !h.rows_contiguous(f.code_bytes)) {
      throw UnsupportedError(std::string("flashkv: the CUDA KV append encodes token-granular formats into the cache's "
                                         "pages; ") + (half == 0 ? "k=" : "v=") + kv.format_name[half] +
                             " is not (KIVI keys quantize G tokens at once from the residual window)");
    }
    a.codes[half] = const_cast<uint8_t*>(h.codes), a.meta[half] = const_cast<uint8_t*>(h.meta);
    a.page_stride[half] = h.page_stride, a.head_stride[half] = h.head_stride;
    a.meta_page_stride[half] = h.meta_page_stride, a.meta_head_stride[half] = h.meta_head_stride;
    a.format[half] = f;
    scales[half] = upload_head_scales(p, half, stream);
    a.head_scales[half] = scales[half] ? scales[half]->as<float>() : kv.device_head_scales[half];
  }
  a.page_table = kv.page_table, a.page_table_batch = kv.page_table_stride, a.page_size = kv.page_size;
  a.seqlens = kv.seqlens;
  a.batch = static_cast<int32_t>(p.batch), a.seqlen_new = static_cast<int32_t>(p.seqlen_q);
  a.num_heads_kv = static_cast<int32_t>(p.num_heads_kv), a.head_dim = static_cast<int32_t>(p.head_dim);
  a.capacity = kv.capacity;
  return a;
}

/// The first bad value an inline-checked append found (decode_append.hpp: `bad` = the smallest flat (b, i, h, c) index
/// per half, UINT64_MAX when none), as a typed Error naming k / v, the value and its index. Synchronizes `stream`. The
/// rows of an append that throws may have been written into their slots, past the sequences' lengths (which the
/// caller does not advance): unreadable by any decode, overwritten by the next append.
void throw_if_bad(const core::DecodeProblem& p, const unsigned long long* bad, cudaStream_t stream) {
  const core::DecodeKV& kv = p.kv;
  unsigned long long first[2];
  check_cuda(cudaMemcpyAsync(first, bad, sizeof(first), cudaMemcpyDeviceToHost, stream), "KV append check");
  check_cuda(cudaStreamSynchronize(stream), "KV cache append");
  for (int half = 0; half < 2; ++half) {
    if (first[half] == ~0ull) continue;
    const int64_t flat = static_cast<int64_t>(first[half]), d = p.head_dim, hk = p.num_heads_kv;
    const int64_t c = flat % d, h = (flat / d) % hk, i = (flat / (d * hk)) % p.seqlen_q, b = flat / (d * hk * p.seqlen_q);
    const core::Strides3& st = half == 0 ? p.k_new_strides : p.v_new_strides;
    const int64_t off = b * st.batch + i * st.row + h * st.head + c;
    const size_t es = p.dtype == DType::float32 ? 4 : 2;
    uint32_t bits = 0;
    check_cuda(cudaMemcpy(&bits, static_cast<const char*>(half == 0 ? p.k_new : p.v_new) + off * es, es,
                          cudaMemcpyDeviceToHost),
               "KV append check");
    const float x = es == 4 ? kv::u32_as_float(bits)
                            : (p.dtype == DType::bfloat16 ? kv::bf16_bits_to_float(static_cast<uint16_t>(bits))
                                                          : kv::fp16_bits_to_float(static_cast<uint16_t>(bits)));
    const kv::KVHalfFormat& f = kv.format[half];
    const bool fp16 = f.code == kv::KVCode::f16 || f.scaling == kv::KVScaling::token_affine ||
                      f.scaling == kv::KVScaling::channel_affine;
    throw Error(half == 0 ? "k" : "v",
                "finite values" + std::string(fp16 ? " with |x| <= 65504 (fp16 range of this format)" : ""),
                std::to_string(x) + " at [" + (p.batch > 1 ? str(b) + ", " : std::string()) + str(i) + ", " + str(h) +
                    ", " + str(c) + "]");
  }
}

/// A device [2] buffer of UINT64_MAX: the smallest bad flat index per half of an inline-checked append.
std::unique_ptr<DeviceBuffer> bad_slots(cudaStream_t stream) {
  auto bad = std::make_unique<DeviceBuffer>(2 * sizeof(unsigned long long), stream);
  check_cuda(cudaMemsetAsync(bad->get(), 0xFF, 2 * sizeof(unsigned long long), stream), "KV append check init");
  return bad;
}

/// Quantize-on-write append (decode_append_quant.cu): one launch that encodes the rows by the format trait and checks
/// their values on the way (a row with a bad value is not encoded), then the check's verdict (throw_if_bad).
void quant_append_hook(const core::DecodeProblem& p) {
  DeviceGuard guard(p.device_index);
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  std::unique_ptr<DeviceBuffer> scales[2];
  QuantAppendParams a = quant_params(p, scales, stream);
  const std::unique_ptr<DeviceBuffer> bad = bad_slots(stream);
  a.bad = bad->as<unsigned long long>();
  quant_append(a, stream);
  throw_if_bad(p, a.bad, stream);
}

/// The engine step's append (core::DecodeBackend::append_step): one launch for the whole batch, values checked inside
/// the write, nothing allocated or synchronized (capturable).
void append_step_hook(const core::DecodeProblem& p, unsigned long long* bad) {
  DeviceGuard guard(p.device_index);
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  if (p.batch == 0 || p.seqlen_q == 0) return;
  if (raw16_pages(p)) {
    AppendParams a = append16_params(p, p.kv.page_table, p.kv.seqlens);
    a.bad = bad;
    append_kv(a, stream);
    return;
  }
  for (int half = 0; half < 2; ++half) {
    if (p.kv.format[half].scaling == kv::KVScaling::head_static && p.kv.device_head_scales[half] == nullptr) {
      throw Error("flashkv: KV step append: static fp8 scales must be on the device (kv.device_head_scales)",
                  Status::internal);
    }
  }
  std::unique_ptr<DeviceBuffer> none[2];
  QuantAppendParams a = quant_params(p, none, stream);
  a.bad = bad;
  quant_append(a, stream);
}

int32_t num_splits_hook(const core::DecodeProblem& p) {
  DeviceGuard guard(p.device_index);
  DecodeLaunch launch = nullptr;
  if (raw16_pages(p)) {
    launch = reinterpret_cast<DecodeLaunch>(find_kernel(KernelKind::decode, p.head_dim, p.dtype).launch);
  } else {
    launch = find_quant_decode(p.head_dim, p.dtype, p.kv.format[0], p.kv.format[1], p.kv.format_name[0],
                               p.kv.format_name[1]).launch;
  }
  return choose_splits(p, launch, p.max_seqlen_k, p.device_index);
}

void append_hook(const core::DecodeProblem& p) {
  if (!raw16_pages(p)) {
    quant_append_hook(p);
    return;
  }
  DeviceGuard guard(p.device_index);
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  if (p.batch == 0 || p.seqlen_q == 0) return;
  AppendParams a = append16_params(p, p.kv.page_table, p.kv.seqlens);  // one copy launch, values checked inside
  const std::unique_ptr<DeviceBuffer> bad = bad_slots(stream);
  a.bad = bad->as<unsigned long long>();
  append_kv(a, stream);
  throw_if_bad(p, a.bad, stream);  // non-finite rows: an Error, the lengths not advanced
}

void* alloc_hook(size_t bytes, int32_t device) {
  DeviceGuard guard(device);
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return p;
}
void free_hook(void* p, int32_t device) {
  DeviceGuard guard(device);
  cudaFree(p);
}
void copy_hook(void* dst, const void* src, size_t bytes, int kind, int32_t device) {
  DeviceGuard guard(device);
  const cudaMemcpyKind k = kind == 0 ? cudaMemcpyHostToDevice : (kind == 1 ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice);
  check_cuda(cudaMemcpy(dst, src, bytes, k), "KV cache copy");
  // Complete before returning: cudaMemcpy returns early for device-to-device copies and from pageable host memory,
  // and the default stream does not order a caller's cudaStreamNonBlocking stream (kv::step_append), so a kernel there
  // could otherwise run before a grown pool's copy (and read the old buffer after its cudaFree).
  check_cuda(cudaStreamSynchronize(nullptr), "KV cache copy");
}
void fill_hook(void* p, int value, size_t bytes, int32_t device) {
  DeviceGuard guard(device);
  check_cuda(cudaMemset(p, value, bytes), "KV cache fill");
  check_cuda(cudaStreamSynchronize(nullptr), "KV cache fill");  // cudaMemset is asynchronous: see copy_hook
}
bool available_hook() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

core::DecodeBackend make_backend() {
  core::DecodeBackend be;
  be.plan = &plan_hook;
  be.append = &append_hook;
  be.append_step = &append_step_hook;
  be.num_splits = &num_splits_hook;
  be.alloc = &alloc_hook;
  be.free = &free_hook;
  be.copy = &copy_hook;
  be.fill = &fill_hook;
  be.available = &available_hook;
  be.name = "cuda";
  return be;
}
const core::DecodeBackend kDecodeBackend = make_backend();
const bool kRegistered = (core::register_decode_backend(Device::cuda, &kDecodeBackend), true);

}  // namespace

bool decode_backend_registered() { return kRegistered; }

const QuantDecodeEntry& find_quant_decode(int64_t head_dim, DType dtype, const kv::KVHalfFormat& k,
                                          const kv::KVHalfFormat& v, const std::string& k_name,
                                          const std::string& v_name) {
  std::string compiled;
  for (int i = 0; i < kQuantDecodeTableSize; ++i) {
    const QuantDecodeEntry& e = kQuantDecodeTable[i];
    if (e.head_dim == head_dim && e.dtype == dtype && e.k_code == k.code && e.k_scaling == k.scaling &&
        e.v_code == v.code && e.v_scaling == v.scaling) {
      return e;
    }
    compiled += (compiled.empty() ? "" : ", ") + std::string(e.name) + " hdim" + str(e.head_dim) + " " +
                dtype_name(e.dtype);
  }
  throw UnsupportedError("flashkv: the CUDA decode of k=" + k_name + " v=" + v_name + " pages, head_dim " +
                         str(head_dim) + ", " + dtype_name(dtype) + " queries is not compiled in this build (compiled: " +
                         (compiled.empty() ? std::string("none") : compiled) +
                         "; FLASHKV_CUDA_KV_FORMATS / FLASHKV_CUDA_HEADDIMS select them; KIVI, windows and rotation "
                         "have no CUDA decode yet)");
}

}  // namespace flashkv::cuda
