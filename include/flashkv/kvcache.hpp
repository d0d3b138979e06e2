// flashkv/kvcache.hpp — quantized paged KV cache (host or device memory; attention in flashkv/decode.hpp).
//
// WHAT IT IS
//   A paged KV cache (vLLM-style pages of `page_size` tokens, one page table per sequence, a free-list page pool) whose
//   K and V halves are stored in a chosen format — fp32, bf16, fp16, fp8 (e4m3/e5m2), int8/int4 asymmetric, or the
//   KIVI int4/int2 arrangement — quantized on write (`append`) and read directly from the packed pages by `attention`
//   (tile by tile: a page tile is decoded into a small float buffer and consumed by an online softmax; split-KV over the
//   context with an lse merge as in flash-decoding, Dao et al. 2023). The whole cache is never dequantized into a
//   temporary. The cache can live in host memory (KVCacheConfig::device = cpu, the default) or in CUDA device memory
//   (device = cuda): the same page layout and bytes either way (src/kvcache/page_layout.hpp), and to() copies a cache
//   between them, so a cache filled on one device decodes on the other. The CPU code is the reference the CUDA
//   kernels must match code for code.
//
// FORMAT STRINGS (kv_cache_dtype; parse_kv_cache_dtype). Grammar, case-sensitive, no spaces:
//   kv_cache_dtype := format                      same format for K and V        e.g. "int8", "int4_kivi"
//                   | "k:" format ",v:" format    K and V chosen independently  e.g. "k:int8,v:int4"
//   format         := name [ "_g" N ]             N = group size (see below)     e.g. "int4_g32", "int2_kivi_g64"
//   name (aliases in parentheses):
//     fp32 (float32)           exact, 32 bits/element, no metadata
//     bf16 (bfloat16, auto)    16 bits, round-to-nearest-even
//     fp16 (float16, half)     16 bits, round-to-nearest-even (values beyond ±65504 become ±inf: use bf16 for them)
//     fp8_e4m3 (fp8)           OCP E4M3FN (max 448), STATIC scale: stored = sat(x / scale) where scale comes from
//                              KVCacheConfig::k_scales / v_scales (1 value = per tensor, num_heads_kv values = per
//                              kv-head; default 1.0 as vLLM without calibration). 8 bits/element, no per-token metadata.
//     fp8_e5m2                 OCP E5M2 (max 57344), static scale as fp8_e4m3.
//     fp8_e4m3_dynamic (fp8_per_token_head), fp8_e5m2_dynamic
//                              dynamic scale per (token, kv-head): scale = amax / fp8_max, stored as float32
//                              (8 + 32/head_dim bits/element; vLLM fp8_per_token_head).
//     int8 (int8_per_token_head), int4 (int4_per_token_head)
//                              asymmetric uniform: per (token, kv-head, group of N channels along head_dim; default
//                              N = head_dim) an fp16 scale and an fp16 minimum; code = round((x − min)/scale) in
//                              [0, 2^b − 1]; x̂ = min + scale·code. Metadata 32 bits per group (int4, d=128: 4.25 bits).
//                              N ∈ {32, 64, 128, 256} and must divide head_dim.
//     int4_kivi, int2_kivi     KIVI (Liu et al., arXiv 2402.02750, §3): K quantized PER CHANNEL over groups of G
//                              consecutive tokens (one fp16 scale + min per channel per group), V quantized PER TOKEN
//                              over groups of G channels. G = N, default 32. G must divide page_size (a key group never
//                              straddles a page) and, for V, head_dim. int2_kivi at G = 32: 2 + 1 = 3 bits/element.
//   Unknown names, a malformed suffix, or a group size that is not allowed throw flashkv::Error naming
//   'kv_cache_dtype' with the accepted grammar.
//
// TOKENS AND WINDOWS (per sequence and layer; positions 0-based, n = seq_len)
//   sinks      positions [0, min(n, sink_tokens)) are kept 16-bit (bf16) forever (attention sinks; KVQuant §3.6,
//              IntactKV).
//   quantized  positions [S, S + n_q) live in the packed pages, where S = sink_tokens and
//              n_q = round_down(max(0, n − S − residual_tokens), Gq), Gq = G if either half uses a KIVI format, else 1.
//              The quantized stream starts at position S; its slot i sits in page i / page_size of the sequence.
//   residual   positions [S + n_q, n) stay 16-bit (bf16) in a per-sequence ring (KIVI's full-precision window: the R
//              most recent tokens, and for KIVI keys the incomplete group; a key group is quantized only once its G
//              tokens are complete). Ring capacity = residual_tokens + Gq − 1 tokens.
//   If the config has any 16-bit window (sink_tokens > 0, residual_tokens > 0 or Gq > 1) every appended value is
//   rounded to bf16 before it is stored or quantized, so that appending N tokens at once gives bit-identical contents
//   to appending them one by one (which is guaranteed for every configuration).
//
// ROTATION (QuaRot, Ashkboos et al., arXiv 2404.00456, §4; llama.cpp PR #21038): with rotation = hadamard, every
//   quantized half (fp8/int formats) is stored as x' = H·D·x / sqrt(head_dim), H the Walsh–Hadamard matrix, D a random
//   ±1 diagonal drawn from rotation_seed (head_dim must be a power of two). attention() rotates q the same way (q·k is
//   preserved exactly up to rounding) and rotates the output back when V is rotated. dequantize() returns values in
//   the original (unrotated) basis.
//
// MEMORY: one page holds page_size token slots for ALL layers, K and V, codes and metadata:
//   page_bytes = num_layers · num_heads_kv · (page_size·(code_k + code_v) + meta_k + meta_v)
//   where code_x = bytes of one token-head vector (int4: head_dim/2, int2: head_dim/4) and meta_x = metadata bytes of
//   one (page, head) (see kv_format_bits()). Sinks and the residual ring are per-sequence bf16 buffers of
//   2 · num_layers · num_heads_kv · head_dim · 2 · (sink_tokens + ring capacity) bytes, allocated by add_sequence.
//   memory_report() splits the bytes into codes / metadata / residual (incl. sinks) / page slack exactly;
//   `flashkv kv-mem` evaluates the same formula (kv_memory_estimate()).
//
// DEVICE CACHES (device = cuda): append() takes k / v on the host (quantized on the host, every format) or, for a
//   cache without sinks, residual window, KIVI keys or rotation, CUDA tensors (float32 / float16 / bfloat16; a bf16 /
//   fp16 cache takes its own dtype), written by a CUDA kernel on the default stream: copied for bf16 / fp16, quantized
//   on the device otherwise with the CPU codec's codes and metadata bit for bit (the format trait's encode_unit); values
//   are checked first (Error naming k / v and the element; nothing written). attention() runs the CUDA split-KV decode
//   (flashkv/decode.hpp) for bf16 / fp16 caches and, from the packed pages, for the compiled quantized formats (CMake
//   FLASHKV_CUDA_KV_FORMATS; default fp8_e4m3, fp8_e4m3_dynamic, int8, int4 with any group, head_dim 64 / 128); windows,
//   rotation, KIVI and uncompiled combinations raise UnsupportedError naming them (to(Device::cpu) decodes them). dequantize() of a device cache reads
//   it back to the host. A device cache needs a library built with the CUDA backend (UnsupportedError otherwise).
//
// NON-FINITE VALUES: append() rejects non-finite k / v (Error naming the element). In attention(), a NaN in q, or a
//   NaN / ±inf score against a visible key, makes that query row's out NaN and its lse NaN; only a row with no
//   visible key gets out = 0 and lse = −inf. Page slots past a sequence's length are never read, whatever they hold
//   (flashkv/attention.hpp states the same contract for dense attention).
//
// THREADING: a PagedKVCache is not thread-safe for concurrent mutation; attention() may run concurrently with other
//   attention() calls. attention() uses OpenMP over (sequence, kv-head, split).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "flashkv/decode.hpp"
#include "flashkv/error.hpp"
#include "flashkv/types.hpp"

namespace flashkv {

namespace kv {
struct CacheAccess;
}

/// Storage format of one cache half. Values are stable (kv::KVFormatId of src/kvcache/format/traits.hpp mirrors them):
/// never renumber.
enum class KVFormat : int32_t {
  fp32 = 0,
  bf16 = 1,
  fp16 = 2,
  fp8_e4m3 = 3,
  fp8_e5m2 = 4,
  int8 = 5,       ///< asymmetric, per (token, kv-head[, channel group])
  int4 = 6,       ///< asymmetric, per (token, kv-head[, channel group]); two codes per byte (planar: byte i = elements i, i+d/2)
  int4_kivi = 7,  ///< KIVI: K per channel over G tokens, V per token over G channels; two codes per byte
  int2_kivi = 8,  ///< KIVI 2-bit; four codes per byte (planar: bits 2k..2k+1 of byte i = element i + k·d/4)
};

/// One half's format with its parameters.
struct KVFormatSpec {
  KVFormat format = KVFormat::bf16;
  /// int8/int4: channels per scale group along head_dim (0 = head_dim). KIVI: G (tokens per key group and channels
  /// per value group; 0 = 32). Ignored by float formats.
  int32_t group_size = 0;
  /// fp8 only: true = dynamic float32 scale per (token, kv-head); false = static scale from the config.
  bool dynamic_scale = false;

  /// Canonical string ("int4_g32", "fp8_e4m3_dynamic", ...); parse_kv_format(s.name()) == s.
  std::string name() const;
  bool is_quantized() const { return format != KVFormat::fp32 && format != KVFormat::bf16 && format != KVFormat::fp16; }
  bool is_kivi() const { return format == KVFormat::int4_kivi || format == KVFormat::int2_kivi; }
  /// Bits per stored code: 32, 16, 8, 4 or 2.
  int32_t code_bits() const;
  bool operator==(const KVFormatSpec&) const = default;
};

/// Parses one `format` of the grammar in the file comment. Throws Error('kv_cache_dtype', grammar, s).
KVFormatSpec parse_kv_format(const std::string& s);
/// Parses a full kv_cache_dtype string into (K spec, V spec). Throws Error('kv_cache_dtype', grammar, s).
std::pair<KVFormatSpec, KVFormatSpec> parse_kv_cache_dtype(const std::string& s);
/// The accepted grammar and names, one line (used in error messages and --help).
const char* kv_cache_dtype_grammar();

enum class KVRotation : int32_t { none = 0, hadamard = 1 };

/// Configuration of a PagedKVCache. All counts are tokens unless stated; sizes in bytes.
struct KVCacheConfig {
  int32_t num_layers = 1;    ///< >= 1
  int32_t num_heads_kv = 1;  ///< >= 1
  int32_t head_dim = 128;    ///< 1..256; a multiple of 4 for int2, of 2 for int4; a power of two with rotation
  KVFormatSpec k_format{};   ///< see parse_kv_cache_dtype()
  KVFormatSpec v_format{};
  int32_t page_size = 16;        ///< tokens per page: a power of two in [16, 256], a multiple of every group G
  int32_t residual_tokens = 0;   ///< R: most recent tokens kept bf16 (KIVI uses 128); >= 0
  int32_t sink_tokens = 0;       ///< S: first tokens kept bf16; >= 0
  KVRotation rotation = KVRotation::none;
  uint64_t rotation_seed = 0;    ///< seeds the random ±1 diagonal of the Hadamard rotation
  /// Static fp8 scales (stored code = x / scale): empty = 1.0, 1 value = per tensor, num_heads_kv values = per
  /// kv-head. Must be finite and > 0. Ignored by other formats.
  std::vector<float> k_scales{};
  std::vector<float> v_scales{};
  /// Pool size: at most one of the two > 0 (capacity_bytes is rounded down to whole pages). Both 0 (the default): the
  /// pool starts at 16 pages and doubles whenever an append needs more (CapacityError only when memory runs out).
  int64_t capacity_pages = 0;
  int64_t capacity_bytes = 0;
  /// Where the pages live: Device::cpu (host memory) or Device::cuda (device device_index, needs the CUDA backend).
  Device device = Device::cpu;
  int32_t device_index = 0;

  /// Sets k_format / v_format from a kv_cache_dtype string.
  KVCacheConfig& with_kv_cache_dtype(const std::string& kv_cache_dtype);
  /// Throws Error naming the field (e.g. 'page_size') with expected vs actual for any invalid value, including
  /// "page_size not a multiple of the group" and "head_dim not divisible by the group".
  void validate() const;
};

/// Bytes of one quantized group of a cache half, for the memory formula. All exact integers.
///   fp32 4·d | bf16/fp16 2·d | fp8 d (+4 B float32 scale per token-head if dynamic) | int8 d, int4 d/2 (+4 B = fp16
///   scale + fp16 min per channel group per token-head) | KIVI K: d·bits/8 per token-head + 4·d B per G tokens
///   (fp16 scale + min per channel) | KIVI V: d·bits/8 + 4·(d/G) B per token-head.
struct KVFormatBytes {
  int64_t code_bytes_per_token_head = 0;  ///< packed codes of one token's head_dim values
  int64_t meta_bytes_per_group = 0;       ///< metadata of one group of tokens_per_group tokens of one kv-head
  int32_t tokens_per_group = 1;           ///< tokens sharing one metadata group: G for KIVI keys, else 1
  int64_t meta_bytes_per_page_head = 0;   ///< page_size / tokens_per_group · meta_bytes_per_group
};
/// Storage of one half for the given head_dim / page_size (validates the combination like KVCacheConfig::validate).
KVFormatBytes kv_format_bytes(const KVFormatSpec& spec, bool is_key, int32_t head_dim, int32_t page_size);

/// Memory split. Bytes are exact; "in use" = pages held by sequences plus their bf16 buffers.
struct KVMemoryReport {
  int64_t num_sequences = 0;
  int64_t token_layers = 0;      ///< Σ over sequences and layers of seq_len
  int64_t num_tokens = 0;        ///< token_layers / num_layers (rounded down; = Σ seq_len when layers agree)
  int64_t page_bytes = 0;        ///< bytes of one page (all layers, K and V, codes + metadata)
  int64_t pages_total = 0;       ///< pool capacity
  int64_t pages_used = 0;
  int64_t pages_free = 0;
  int64_t code_bytes = 0;        ///< packed codes of the quantized tokens held
  int64_t metadata_bytes = 0;    ///< scales / zero points of the quantized groups held
  int64_t residual_bytes = 0;    ///< bf16 sink + residual ring buffers (allocated, whole capacity)
  int64_t slack_bytes = 0;       ///< bytes of used pages that hold no token (last-page slots, per-layer differences)
  int64_t total_bytes = 0;       ///< code + metadata + residual + slack = pages_used·page_bytes + residual
  int64_t pool_bytes = 0;        ///< pages_total · page_bytes (reserved at construction)
  double bits_per_element = 0;   ///< total_bytes · 8 / (2 · token_layers · num_heads_kv · head_dim); 0 if empty
  double ratio_vs_bf16 = 0;      ///< 16 / bits_per_element; 0 if empty
  std::string to_string() const; ///< multi-line human-readable form
};

/// The memory formula used by `flashkv kv-mem`; equals memory_report() of a live cache holding `batch` sequences of
/// `tokens` tokens in every layer (tested). capacity fields of `config` are ignored.
KVMemoryReport kv_memory_estimate(const KVCacheConfig& config, int64_t batch, int64_t tokens);

/// Options of PagedKVCache::attention: flashkv::DecodeOptions (flashkv/decode.hpp; max_seqlen_k / stream unused).
using KVAttentionOptions = DecodeOptions;

/// A quantized paged KV cache. See the file comment for formats, windows, rotation, memory and threading.
class PagedKVCache {
 public:
  /// Validates `config` (Error naming the field) and reserves the page pool (CapacityError if it cannot be allocated).
  explicit PagedKVCache(const KVCacheConfig& config);
  ~PagedKVCache();
  PagedKVCache(const PagedKVCache&) = delete;
  PagedKVCache& operator=(const PagedKVCache&) = delete;
  PagedKVCache(PagedKVCache&&) noexcept;
  PagedKVCache& operator=(PagedKVCache&&) noexcept;

  const KVCacheConfig& config() const;
  /// Where the pages live (config().device).
  Device device() const;
  /// A copy of this cache (config, sequences, pages, windows: the same bytes) in the memory of `device`.
  PagedKVCache to(Device device, int32_t device_index = 0) const;

  /// Registers an empty sequence. seq_id >= 0 and not present (Error 'seq_id' otherwise). Allocates its bf16
  /// sink/residual buffers (no pages).
  void add_sequence(int64_t seq_id);
  /// Frees the sequence's pages (back to the free list) and buffers. Error 'seq_id' if unknown.
  void remove_sequence(int64_t seq_id);
  bool has_sequence(int64_t seq_id) const;
  std::vector<int64_t> sequence_ids() const;  ///< ascending

  /// Appends n_tokens tokens of one layer: k, v [n_tokens, num_heads_kv, head_dim] float32/float16/bfloat16 (same
  /// dtype; last dim contiguous; any other strides), n_tokens >= 0, in host memory (any cache) or CUDA memory (a CUDA
  /// cache without windows, KIVI keys or rotation; see DEVICE CACHES). Quantize-on-write;
  /// appending N tokens at once gives the same contents as N single appends.
  /// Errors (cache unchanged after any of them): Error 'seq_id' (unknown), 'layer' (out of range), 'k'/'v' (shape,
  /// non-finite values, or |x| > 65504 where the format stores fp16; the message names the element), TypeError (dtype,
  /// device); CapacityError when a fixed-size pool lacks the pages this append needs (naming the pages needed and free)
  /// or memory for a growing pool runs out. "Unchanged" is every cached row, length, page list and the free list; a
  /// device append checks the values inside its one write launch, so after a value Error the slots past the lengths
  /// (which nothing reads and the next append overwrites) may hold the rejected call's rows; pages it had taken go
  /// back to the free list refilled with 0xFF.
  void append(int64_t seq_id, int32_t layer, const TensorView& k, const TensorView& v);

  /// Batched append: k, v [batch, n_tokens, num_heads_kv, head_dim] (dtypes, devices and strides as append(); the last
  /// dim contiguous): block b is appended to sequence seq_ids[b] (batch = seq_ids.size(), distinct registered ids).
  /// The cache ends up byte for byte as after append(seq_ids[b], layer, k[b], v[b]) for b = 0, 1, ... in order (the
  /// same pages, codes and metadata). A device cache (no windows, KIVI keys or rotation) fed CUDA k / v writes all the
  /// blocks with one page-table upload and one kernel launch (the values checked inside it); otherwise the blocks are
  /// appended in turn. Errors as append(), plus Error 'seq_ids' (unknown or repeated id, or a count other than
  /// k.shape[0]); every check — ids, shapes, values, the pages all blocks need — comes before anything observable is
  /// modified (the cache is unchanged after any error, in append()'s sense).
  void append(std::span<const int64_t> seq_ids, int32_t layer, const TensorView& k, const TensorView& v);

  /// Tokens cached for `seq_id` in `layer`. Error for unknown sequence / layer.
  int64_t seq_len(int64_t seq_id, int32_t layer = 0) const;

  /// Attention of query tokens against the cache of `layer` for several sequences (decode: 1 token each; chunked
  /// prefill / speculative: several). = plan_decode + run_decode (flashkv/decode.hpp), which an engine uses to plan
  /// once per step and run every layer; q / out / lse live on the cache's device.
  ///   seq_ids       [batch] sequences (distinct not required)
  ///   cu_seqlens_q  [batch + 1] int32 prefix sums of query tokens per sequence (cu[0] = 0, non-decreasing)
  ///   q             [total_q, num_heads, head_dim] float32/float16/bfloat16, num_heads % num_heads_kv == 0 (GQA:
  ///                 head h reads kv head h / (num_heads / num_heads_kv)), last dim contiguous
  ///   out           [total_q, num_heads, head_dim] same dtype as q (overwritten)
  ///   lse           optional [num_heads, total_q] float32, natural log; −inf (and out = 0) for rows with no
  ///                 visible key, NaN for rows whose visible scores include a NaN / ±inf
  /// The query of sequence b, token i (0-based of n_q_b) sits at position seq_len − n_q_b + i; with causal it sees
  /// keys j <= that position (bottom-right aligned, flash-attn >= 2.1), with window_size_left = W only j >= pos − W.
  /// Computed from the packed pages tile by tile (split-KV + lse merge; Dao et al., "Flash-Decoding", 2023).
  /// Errors: Error naming 'seq_ids', 'cu_seqlens_q', 'q', 'out', 'lse', 'layer', 'options.*'; TypeError for dtypes.
  void attention(std::span<const int64_t> seq_ids, std::span<const int32_t> cu_seqlens_q, int32_t layer,
                 const TensorView& q, const TensorView& out, const TensorView* lse,
                 const KVAttentionOptions& options = {}) const;

  /// Exact byte accounting (see KVMemoryReport).
  KVMemoryReport memory_report() const;

  /// Dequantized contents of one (sequence, layer) in the original basis, for tests and quality tools:
  /// k_out, v_out [seq_len, num_heads_kv, head_dim] float32 (last dim contiguous). Error on shape/dtype mismatch.
  void dequantize(int64_t seq_id, int32_t layer, const TensorView& k_out, const TensorView& v_out) const;

  /// Free pages left in the pool.
  int64_t free_pages() const;
  /// Bytes of one page (all layers, K and V, codes + metadata).
  int64_t page_bytes() const;

  struct Impl;

 private:
  friend struct kv::CacheAccess;  // src/kvcache/cache/cache_impl.hpp: the library's internal step API
  friend DecodePlan plan_decode(const PagedKVCache&, std::span<const int64_t>, std::span<const int32_t>, int64_t,
                                int32_t, const DecodeOptions&);
  friend void run_decode(const PagedKVCache&, DecodePlan&, int32_t, const TensorView&, const TensorView&,
                         const TensorView*);
  explicit PagedKVCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashkv
