// CPU attention kernels (internal). All take a validated problem (src/core/validate.hpp) with device == cpu.
// See docs/attention-cpu.md for the algorithms, tile sizes, threading and memory traffic.
#pragma once

#include "core/problem.hpp"

namespace flashkv::cpu {

/// Runs the forward variant selected by p.algorithm.
void forward(const core::AttentionProblem& p);

/// FA2 order (FlashAttention-2 §3.1, Alg. 1): parallel over (batch, head, query block); per work item the Q tile, the
/// running m, l and the unnormalized O tile stay in per-thread scratch ("fast memory") while K/V tiles stream past.
void forward_tiled(const core::AttentionProblem& p);

/// FA1 order (FlashAttention §3.1, Alg. 1): parallel over (batch, head); K/V blocks outer, Q blocks inner; O, m, l
/// live in a per-(batch, head) "slow memory" buffer that is re-read and re-written for every (K/V block, Q block).
void forward_v1_order(const core::AttentionProblem& p);

/// Standard attention: S = Q·Kᵀ·scale and P = softmax(S) materialized as [seqlen_q × seqlen_k] per (batch, head).
void forward_naive(const core::AttentionProblem& p);

/// FA2 backward (FlashAttention-2 §3.1.2, Alg. 2) by recomputation from lse; deterministic. See backward.cpp.
void backward(const core::AttentionProblem& p);

/// Number of OpenMP threads a problem runs with (p.num_threads, or the OpenMP default when 0).
int thread_count(const core::AttentionProblem& p);

}  // namespace flashkv::cpu
