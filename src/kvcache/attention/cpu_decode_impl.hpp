// The CPU decode plan object shared by plan.cpp (construction: tasks, fused-path choice, workspace) and run.cpp
// (execution). Private to src/kvcache/attention/.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/decode_problem.hpp"
#include "core/mask.hpp"
#include "kvcache/attention/decode_tile.hpp"
#include "kvcache/format/codec.hpp"

namespace flashkv::kv {

inline constexpr int64_t kCpuDecodeTile = 64;  ///< max tokens per tile (= kv::kDecodeTile)

struct CpuDecodeTask {
  int32_t b;        ///< sequence (index into the batch)
  int32_t hk;       ///< kv head
  int64_t k0, k1;   ///< key positions [k0, k1)
  int64_t part;     ///< offset (in rows) of this task's partial state
};

/// How one half is read: fused (the packed codes in place; multipliers for fp8) or codec-decoded.
struct CpuHalfPlan {
  bool fused = false;
  KVHalfFormat fmt;
  float mul = 1.0f;           ///< token_f32 multiplier (e4m3 route: 2^8)
  std::vector<float> scales;  ///< head_static: per kv-head multiplier (static fp8 scale, e4m3 route: × 2^8)
};

class CpuDecodeWork final : public core::DecodeWork {
 public:
  explicit CpuDecodeWork(const core::DecodeProblem& p);
  void run(const core::DecodeProblem& p) override;
  std::string path() const override { return path_; }
  int32_t num_splits() const override { return max_splits_; }

 private:
  void append_new_rows(const core::DecodeProblem& p);
  void prepare_queries(const core::DecodeProblem& p);
  HalfTile half_tile(const core::DecodeProblem& p, int64_t b, int32_t hk, int half, int64_t n, int64_t t0, int64_t t1,
                     FactoredTile& ft) const;
  void run_tasks(const core::DecodeProblem& p);
  void merge_and_store(const core::DecodeProblem& p);

  int64_t batch_ = 0, num_heads_kv_ = 0, g_ = 0, d_ = 0;
  int threads_ = 1;
  /// The query preparation and the merge are a few microseconds (decode: batch · heads rows): run them on the calling
  /// thread instead of paying a parallel region each (under contention a region's barrier can cost a scheduler tick).
  bool small_work_ = false;
  std::vector<core::MaskRule> rules_;      ///< per sequence (seqlen_q = its queries, seqlen_k = its keys)
  std::vector<int64_t> q_begin_;           ///< per sequence, first query row
  std::vector<int64_t> bh_row0_;           ///< per (b, hk): first row of its prepared queries / outputs
  std::vector<CpuDecodeTask> tasks_;
  std::vector<int64_t> task_begin_;        ///< tasks of (b, hk): [task_begin_[bh], task_begin_[bh + 1])
  int64_t part_rows_ = 0;
  int32_t max_splits_ = 1;
  CpuHalfPlan half_[2];
  bool fused_window_ = false;
  std::unique_ptr<KVCodec> codec_[2];      ///< generic path
  std::string path_;
  // workspace (reused by every run)
  std::vector<float> part_acc_, part_m_, part_l_, qprep_, qsum_;
};

}  // namespace flashkv::kv
