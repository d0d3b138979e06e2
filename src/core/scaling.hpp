// Score scaling of an attention call, resolved in one place for every backend and kernel (issue 11): the kernels
// compute s = q.k * score_scale, then (softcap only) s = tanh(s), and the softmax uses exp2(s * softmax_scale_log2 -
// m) with log2(e) folded in (FlashAttention-2 §3.1). Without softcap: score_scale = 1 and softmax_scale_log2 =
// softmax_scale * log2(e). With softcap c (Gemma 2: c * tanh(q.k * scale / c)): score_scale = softmax_scale / c and
// softmax_scale_log2 = c * log2(e). The natural-log lse is (m + log2 l) * ln 2.
#pragma once

namespace flashkv::core {

struct ScoreScaling {
  bool softcap = false;
  float score_scale = 1.f;
  float softmax_scale_log2 = 1.f;
};

/// softmax_scale > 0 (resolved, finite), softcap >= 0 (0 = off).
inline ScoreScaling resolve_scaling(float softmax_scale, float softcap) {
  constexpr float kLog2e = 1.4426950408889634f;
  ScoreScaling s;
  s.softcap = softcap > 0.f;
  s.score_scale = s.softcap ? softmax_scale / softcap : 1.f;
  s.softmax_scale_log2 = s.softcap ? softcap * kLog2e : softmax_scale * kLog2e;
  return s;
}

}  // namespace flashkv::core
