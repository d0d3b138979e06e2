// Registers TMA warp-specialized forward variants: V3_VARIANT(tag, D, N, S, T, options...) instantiates
// (V3_VARIANT_SCHED(tag, schedule, ...) with a fixed schedule) the library's mainloop
// FwdMainloopTmaWs<D, N, S, T, /*softcap*/ false, {TmaWsOptions{options}}> with its launcher (sm90/fwd_tma_ws_launch.cuh,
// the same kernel the library's sm90ws family runs with the default options) and registers it as "ws/hd<D>/<tag>".
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda/sm90/fwd_tma_ws_launch.cuh"
#include "v3.hpp"

namespace v3 {

using flashkv::cuda::sm90::WsSchedule;

template <class ML, WsSchedule kSched>
cudaError_t launch(const flashkv::cuda::FwdParams& p, cudaStream_t s) {
  flashkv::cuda::sm90::launch_fwd_tma_ws<ML>(p, s, kSched);  // throws on a launch error (v3_run reports it)
  return cudaSuccess;
}

template <class ML, WsSchedule kSched>
std::string describe() {
  constexpr auto o = ML::kOpt;
  std::string c = "M" + std::to_string(ML::kBlockM) + " N" + std::to_string(ML::kBlockN) + " S" +
                  std::to_string(ML::kStages) + " smem " + std::to_string(ML::kSmemBytes / 1024) + "K";
  c += o.tma ? " tma" : " cpasync";
  c += o.warp_specialized ? " ws" : " no-ws";
  c += ML::kPingpong ? " pingpong" : "";
  c += o.intra_overlap ? " overlap" : "";
  c += " emu" + std::to_string(o.exp2_emu_eighths) + "/8";
  c += o.cond_rescale ? " cond-rescale" : "";
  c += o.defer_rescale ? " deferred-rescale" : "";
  c += kSched == WsSchedule::kAuto ? " sched-auto" : kSched == WsSchedule::kSingleTile ? " single-tile" : " persistent";
  c += std::is_same_v<typename ML::T, __half> ? " fp16" : " bf16";
  return c;
}

template <class ML, WsSchedule kSched>
struct RegisterWs {
  explicit RegisterWs(const char* tag) {
    static const std::string name = "ws/hd" + std::to_string(ML::kHeadDim) + "/" + tag;
    static const std::string cfg = describe<ML, kSched>();
    Register(name.c_str(), ML::kHeadDim, std::is_same_v<typename ML::T, __half> ? 1 : 0, launch<ML, kSched>,
             cfg.c_str());
  }
};

}  // namespace v3

#define V3_CAT2(a, b) a##b
#define V3_CAT(a, b) V3_CAT2(a, b)
#define V3_VARIANT_SCHED(tag, sched, D, N, S, T, ...)                                                        \
  struct V3_CAT(opts_, __LINE__) {                                                                          \
    static constexpr flashkv::cuda::sm90::TmaWsOptions value{__VA_ARGS__};                                  \
  };                                                                                                          \
  static v3::RegisterWs<flashkv::cuda::sm90::FwdMainloopTmaWs<D, N, S, T, false, V3_CAT(opts_, __LINE__)>, \
                        sched>                                                                                \
      V3_CAT(reg_, __LINE__)(tag)
#define V3_VARIANT(tag, D, N, S, T, ...) V3_VARIANT_SCHED(tag, v3::WsSchedule::kAuto, D, N, S, T, __VA_ARGS__)
