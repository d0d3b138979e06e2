// Registers FP8 (e4m3 q/k/v, bfloat16 out) TMA warp-specialized forward variants: V3_FP8_VARIANT(tag, D, N, S,
// options...) instantiates the library's FwdMainloopTmaWsFp8<D, N, S, /*softcap*/ false, {Fp8WsOptions{options}}>
// (sm90/mainloop_fwd_tma_ws_fp8.cuh) with its launcher (sm90/fwd_tma_ws_launch.cuh, the kernel the library's sm90ws
// family runs for float8_e4m3fn) and registers it as "fp8/hd<D>/<tag>" (dtype 2; descales null = 1).
#pragma once

#include <string>

#include "cuda/sm90/fwd_tma_ws_launch.cuh"
#include "v3.hpp"

namespace v3 {

template <class ML>
cudaError_t launch_fp8(const flashkv::cuda::FwdParams& p, cudaStream_t s) {
  flashkv::cuda::sm90::launch_fwd_tma_ws<ML>(p, s, flashkv::cuda::sm90::WsSchedule::kAuto);
  return cudaSuccess;
}

template <class ML>
struct RegisterFp8 {
  explicit RegisterFp8(const char* tag) {
    static const std::string name = "fp8/hd" + std::to_string(ML::kHeadDim) + "/" + tag;
    static const std::string cfg = "M" + std::to_string(ML::kBlockM) + " N" + std::to_string(ML::kBlockN) + " S" +
                                   std::to_string(ML::kStages) + " smem " + std::to_string(ML::kSmemBytes / 1024) +
                                   "K e4m3" + (ML::kPingpong ? " pingpong" : "") + " overlap transpose-ilp" +
                                   std::to_string(ML::kOpt.transpose_ilp) + " emu" +
                                   std::to_string(ML::kOpt.exp2_emu_eighths) + "/8" +
                                   (ML::kOpt.row_max_tree ? " max-tree" : " max-serial") +
                                   (ML::kOpt.hoist_mask_test ? " mask-hoisted" : " mask-per-tile") + " sched-auto";
    Register(name.c_str(), ML::kHeadDim, 2, launch_fp8<ML>, cfg.c_str());
  }
};

}  // namespace v3

#define V3_CAT2(a, b) a##b
#define V3_CAT(a, b) V3_CAT2(a, b)
#define V3_FP8_VARIANT(tag, D, N, S, ...)                                                                         \
  struct V3_CAT(fp8opts_, __LINE__) {                                                                            \
    static constexpr flashkv::cuda::sm90::Fp8WsOptions value{__VA_ARGS__};                                      \
  };                                                                                                               \
  static v3::RegisterFp8<flashkv::cuda::sm90::FwdMainloopTmaWsFp8<D, N, S, false, V3_CAT(fp8opts_, __LINE__)>> \
      V3_CAT(reg_, __LINE__)(tag)
