// flashkv eval passkey: real retrieval through the model — a passkey sentence hidden at a depth of a filler text, the
// model asked for it, greedy answer scored by whether it contains the key.
//
// PROTOCOL (passkey retrieval of Mohtashami & Jaggi, "Landmark Attention", 2023, §4.2 / epfml/landmark-attention;
// the setting KIVI and KVQuant report):
//   user message = "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will
//                   quiz you about the important information there.\n\n"
//                  + filler × i + "The pass key is KEY. Remember it. KEY is the pass key. " + filler × (n − i)
//                  + "\n\nWhat is the pass key?"
//   filler       = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
//   rendered as a one-turn chat (the model's ChatML template; plain text for models without one), with the assistant
//   reply started as "The pass key is" (so a small model answers with the key rather than chat);
//   n = the most repetitions for which prompt + answer_tokens <= context; i = round(depth · n);
//   KEY = 5 random digits drawn from (seed, context, depth, key index): the same keys for every format.
// The prompt is prefilled through the cache under test in ubatches (Engine::extend: quantized history is what later
// tokens see), then `answer_tokens` greedy tokens are decoded from the cache (stopping at an end-of-turn token).
// success = the decoded answer contains KEY. first divergence = the first answer step whose token differs from the
// reference's answer to the same prompt (−1 = identical answers); the reference is the fp32 cache on the CPU, on CUDA
// the device's bf16 cache or the CPU's fp32 one (EvalTarget).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "eval/evaluation.hpp"

namespace flashkv::eval {

struct PasskeyOptions {
  std::vector<int32_t> contexts = {1024, 2048, 4096, 8192};  ///< prompt + answer budget, tokens
  std::vector<double> depths = {0.0, 0.25, 0.5, 0.75, 1.0};   ///< needle position in the filler, 0..1
  int32_t keys = 3;           ///< trials (different keys) per (context, depth) cell
  int32_t answer_tokens = 12; ///< greedy tokens generated
  int32_t ubatch = 512;       ///< prefill chunk (Engine::extend)
  uint64_t seed = 1;
};

struct PasskeyTrial {
  int32_t context = 0;        ///< the cell's context budget
  double depth = 0.0;
  std::string key;
  int32_t prompt_tokens = 0;  ///< actual prompt length
  std::vector<int32_t> answer;
  std::string answer_text;
  bool success = false;
  int32_t divergence = -1;    ///< first answer step differing from the reference's answer; −1 = none
};

struct PasskeyFormat {
  KVCacheSpec spec;
  std::string label;
  std::vector<PasskeyTrial> trials;  ///< context-major, then depth, then key
  double prefill_seconds = 0.0, decode_seconds = 0.0;
  int64_t prefill_tokens = 0, decode_tokens = 0;
  double success_rate() const;                      ///< over all trials
  double success_rate(int32_t context) const;       ///< over one context's trials
  double cell_rate(int32_t context, double depth) const;
  int32_t identical_answers() const;                ///< trials with divergence == −1
};

struct PasskeyResult {
  PasskeyOptions options;
  std::vector<PasskeyFormat> formats;  ///< the reference first (fp32 on the CPU, bf16 on CUDA), then the given specs
  std::string device = "cpu";           ///< where the formats ran (EvalTarget::device_name)
  std::string reference_device = "cpu"; ///< where the reference ran
};

/// The user message and answer prefix of one trial (exposed for the tests): `reps` filler repetitions with the needle
/// after `at` of them.
std::string passkey_user_message(int32_t reps, int32_t at, const std::string& key);
inline constexpr const char* kPasskeyAnswerPrefix = "The pass key is";
/// The 5-digit key of trial (context, depth index, key index) for `seed`.
std::string passkey_key(uint64_t seed, int32_t context, int32_t depth_index, int32_t key_index);
/// The prompt tokens of a trial: the most filler repetitions that fit `context` − answer_tokens, needle at depth.
/// Throws Error naming 'contexts' when not even one repetition fits, or the context exceeds the model's.
std::vector<int32_t> passkey_prompt(const LoadedModel& lm, int32_t context, double depth, const std::string& key,
                                    int32_t answer_tokens);

/// Runs every trial for the reference (target.reference_spec() on target.reference_options()) and each spec on
/// target.engine (a spec equal to the reference is not run twice). Progress counts prompt tokens prefilled (all
/// formats). Throws Error naming 'contexts', 'depths', 'keys', 'answer_tokens'; UnsupportedError before any work for a
/// format the device cannot run (check_target).
PasskeyResult run_passkey(const LoadedModel& lm, const std::vector<KVCacheSpec>& specs, const PasskeyOptions& options,
                          const Progress& progress = {}, const EvalTarget& target = {});

/// SVG heatmap of one format: columns = contexts, rows = depths, cell = successes / trials (green = all, red = none).
std::string passkey_heatmap_svg(const PasskeyFormat& f, const PasskeyOptions& o, const std::string& model_name);

}  // namespace flashkv::eval
