/* flashkv_engine.h — C ABI of the generation engine (C++: include/flashkv/engine.hpp, which documents the model, the
 * prefill / decode semantics, the devices and the KV cache in full; formats: include/flashkv/kvcache.hpp).
 *
 * One flashkv_engine holds a loaded model (llama2.c .bin + tokenizer file, a GGUF with its embedded vocabulary, or a
 * named model such as "aidreams260k" / "smollm2-135m"), its tokenizer and one flashkv::Engine: prefill with exact tiled
 * causal attention, decode from a (quantized) paged KV cache, on the CPU or a CUDA device. It runs the same code as
 * `flashkv generate` (src/cli/cmd_generate.cpp): the same prompt encoding, KV spec fitting, sampler and stop rule, so
 * for the same prompt, options and seed it produces the same tokens as the CLI and as flashkv::generate().
 *
 * Conventions as flashkv.h: every function returns flashkv_status and sets flashkv_last_error() on failure (a message
 * naming the argument with expected vs actual); structs start with struct_size (set it to sizeof(struct)); NULL option
 * pointers mean the defaults. No function aborts or throws across the ABI. A rejected call leaves the engine exactly as
 * it was (no sequence added, no page taken, the seed stream not advanced).
 *   FLASHKV_ERROR_INVALID_ARGUMENT  a NULL pointer, a count or value out of range, an unknown device / kv_cache_dtype,
 *                                   a token id >= vocab_size, a prompt longer than the context, an output too small
 *   FLASHKV_ERROR_UNSUPPORTED       device "cuda" without the CUDA backend, no CUDA device, no cuBLAS, or a KV format
 *                                   the CUDA engine does not decode (never a silent CPU fallback)
 *   FLASHKV_ERROR_CAPACITY          all max_sequences in use, or the KV page pool lacks the pages a call needs
 *                                   (checked before anything is computed or written); out of host memory
 *   FLASHKV_ERROR_IO                model / tokenizer file missing, unreadable, truncated or inconsistent (the message
 *                                   names the file)
 *
 * THREADS: calls on one handle may come from several threads: they are serialized (a mutex per engine), never run at
 * once; flashkv_engine_destroy must not overlap another call on the same handle. Distinct engines are independent.
 * Each call is internally parallel (OpenMP/OpenBLAS threads on the CPU, the CUDA device's default stream).
 *
 * UNITS: token counts in tokens, times in seconds (steady clock), sizes in bytes.
 *
 * Typical use:
 *   flashkv_engine_options o; flashkv_engine_options_default(&o); o.tokenizer_path = "aidreams260K.tok512.bin";
 *   flashkv_engine* e; flashkv_engine_create("aidreams260K.bin", &o, &e);        or a GGUF / "smollm2-135m", NULL
 *   flashkv_generate_options g; flashkv_generate_options_default(&g); g.temperature = 0; g.max_new_tokens = 64;
 *   int32_t out[64]; int64_t n; flashkv_generation_stats st = {sizeof st};
 *   flashkv_engine_generate_text(e, "Once upon", 9, &g, out, 64, &n, &st);           out[0..n): generated ids
 *   size_t len; flashkv_engine_detokenize(e, out, n, NULL, 0, &len);               size query, then a buffer
 *   flashkv_engine_destroy(e);
 */
#ifndef FLASHKV_ENGINE_H_
#define FLASHKV_ENGINE_H_

#include "flashkv/flashkv.h"
#include "flashkv/flashkv_kvcache.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flashkv_engine flashkv_engine; /* opaque */

/* Why a generation (or one request of the batch API) stopped; values as flashkv::StopReason. */
typedef enum {
  FLASHKV_STOP_NONE = -1,   /* still generating (batch events only) */
  FLASHKV_STOP_STEPS = 0,   /* max_new_tokens generated */
  FLASHKV_STOP_BOS = 1,     /* sampled the BOS token (llama2.c's end of text) */
  FLASHKV_STOP_EOS = 2,     /* sampled another end-of-generation token (EOS, <|im_end|>, ...) */
  FLASHKV_STOP_CONTEXT = 3  /* the sequence filled max_context */
} flashkv_stop_reason;

/* Options of flashkv_engine_create (defaults from flashkv_engine_options_default). */
typedef struct {
  uint32_t struct_size;        /* sizeof(flashkv_engine_options) */
  const char* tokenizer_path;  /* llama2.c tokenizer file; NULL or "" = the named model's, or the GGUF's vocabulary */
  const char* device;          /* "cpu" (default), "cuda" or "cuda:N"; NULL = "cpu" */
  const char* kv_cache_dtype;  /* kvcache.hpp grammar ("fp32", "bf16", "int8", "int4", "int2_kivi", "k:int8,v:int4",
                                  "int4_g32", ...); NULL or "" = "fp32" on the CPU, "bf16" on CUDA (as the CLI).
                                  A KIVI format without a group gets the largest group that fits head_dim (the CLI's
                                  rule: eval::fit_kv_spec) */
  int32_t page_size;           /* tokens per KV page, power of two 16..256 (default 32) */
  int32_t residual_tokens;     /* most recent tokens kept bf16 (KIVI residual window; default 0) */
  int32_t sink_tokens;         /* first tokens kept bf16 (default 0) */
  int32_t rotation;            /* flashkv_kv_rotation: NONE (default) or HADAMARD before quantization */
  uint64_t rotation_seed;      /* default 0 */
  int64_t kv_capacity_pages;   /* KV page pool; 0 (default) = max_sequences · (ceil(max_context / page_size) + 1) */
  int32_t max_sequences;       /* sequences live at once (generate calls + batch requests); default 1 */
  int32_t max_context;         /* tokens per sequence; 0 (default) = the model's context length */
  uint64_t seed;               /* the engine's seed stream (default 42): see flashkv_generate_options.has_seed */
} flashkv_engine_options;

/* Options of one generation / one batch request (defaults from flashkv_generate_options_default: the CLI's). */
typedef struct {
  uint32_t struct_size;   /* sizeof(flashkv_generate_options) */
  int32_t max_new_tokens; /* >= 1 (default 256): at most this many tokens are generated */
  float temperature;      /* finite, >= 0; 0 = greedy (argmax, lowest id on ties); default 1.0 */
  int32_t top_k;          /* >= 0; keep the k most probable tokens, 0 = off (default) */
  float top_p;            /* (0, 1]; nucleus threshold, applied after top_k (default 0.9) */
  int32_t has_seed;       /* 1: use `seed`. 0 (default): the engine's seed stream — the n-th call without a seed of
                             this engine (n = 0, 1, ...) uses engine seed + n, so the first equals `flashkv generate
                             --seed <engine seed>` and successive calls differ, reproducibly */
  uint64_t seed;          /* the sampler's xorshift64* seed when has_seed = 1 */
  int32_t stop_at_eos;    /* 1 (default): stop at an end-of-generation token (not returned); 0: never (--ignore-eos) */
} flashkv_generate_options;

/* What one generate call did (the numbers `flashkv generate` prints). */
typedef struct {
  uint32_t struct_size;           /* sizeof(flashkv_generation_stats): set by the caller */
  int32_t stop_reason;            /* flashkv_stop_reason */
  int32_t stop_token;             /* the end-of-generation token sampled (BOS / EOS), else -1 */
  int64_t prompt_tokens;          /* tokens fed before sampling (BOS included when the tokenizer adds one) */
  int64_t generated_tokens;       /* tokens returned */
  int64_t decode_steps;           /* decode calls: generated_tokens - 1 when max_new_tokens or the context stopped it,
                                     generated_tokens when a stop token was sampled (the first token comes from prefill) */
  uint64_t seed;                  /* the sampler seed used */
  double prefill_seconds;         /* prefill of the prompt */
  double decode_seconds;          /* decode steps only (sampling of the first token excluded) */
  double prefill_tokens_per_s;    /* prompt_tokens / prefill_seconds (0 when not measurable) */
  double decode_tokens_per_s;     /* decode_steps / decode_seconds (0 when no decode step ran) */
  int64_t kv_bytes;               /* KV cache bytes in use at the end (codes + metadata + residual + page slack) */
  int64_t kv_tokens;              /* tokens cached at the end, all live sequences */
  double kv_bytes_per_token;      /* kv_bytes / kv_tokens, all layers, K and V */
  double kv_effective_bits;       /* bits per cached element, everything counted */
  double kv_bf16_bytes_per_token; /* the same tokens in bf16 without pages: 2 · layers · num_heads_kv · head_dim · 2 */
} flashkv_generation_stats;

/* The loaded model and engine (flashkv_engine_get_info). Strings are owned by the engine, valid until destroy. */
typedef struct {
  uint32_t struct_size;       /* sizeof(flashkv_engine_info): set by the caller */
  int32_t vocab_size;
  int32_t max_context;        /* tokens one sequence may hold */
  int32_t max_sequences;
  int32_t dim, hidden_dim, num_layers, num_heads, num_heads_kv, head_dim;
  int32_t bos_id, eos_id;     /* the tokenizer's; -1 when it has none */
  int32_t add_bos;            /* 1 when prompts start with BOS (llama2.c), 0 otherwise (SmolLM2) */
  int32_t device;             /* flashkv_device */
  int32_t device_index;
  const char* kv_cache_dtype; /* the spec as it runs, e.g. "int4_kivi_g16 r32" (flashkv::KVCacheSpec::label()) */
  const char* model_format;   /* "llama2c-legacy" | "llama2c-v1" | "gguf" */
  const char* model_path;     /* the file the weights came from */
} flashkv_engine_info;

/* One token of the batch API (flashkv_engine_add / flashkv_engine_step). A fixed layout, never extended. */
typedef struct {
  int32_t seq;   /* the request's sequence id (from flashkv_engine_add) */
  int32_t token; /* the sampled token; when stop is FLASHKV_STOP_BOS / EOS it is that stop token (not text) */
  int32_t stop;  /* flashkv_stop_reason: FLASHKV_STOP_NONE while the request goes on, else why it finished */
} flashkv_engine_event;

/** Fills *opts with the defaults (struct_size set): cpu, kv_cache_dtype NULL (fp32 / bf16 by device), page 32, no
 *  windows or rotation, max_sequences 1, the model's context, seed 42. */
FLASHKV_API flashkv_status flashkv_engine_options_default(flashkv_engine_options* opts);
/** Fills *opts with the CLI's generation defaults: 256 tokens, temperature 1.0, top_k 0, top_p 0.9, the engine's seed
 *  stream, stop at end-of-generation tokens. */
FLASHKV_API flashkv_status flashkv_generate_options_default(flashkv_generate_options* opts);

/** Loads `model` (a named model, a llama2.c checkpoint or a GGUF file; flashkv::load_named_model) with its tokenizer
 *  and creates the engine (weights uploaded once for CUDA). *out is set to NULL on failure; free it with
 *  flashkv_engine_destroy. opts NULL = defaults. Errors: INVALID_ARGUMENT naming 'model' (NULL, or an unknown name),
 *  'opts.struct_size', 'device', 'kv_cache_dtype', 'page_size', 'max_sequences', 'max_context',
 *  'options.kv_capacity_pages', 'residual_tokens', 'sink_tokens', 'opts.rotation'; IO for a missing / corrupt model or
 *  tokenizer file (or a tokenizer whose vocabulary size differs from the model's); UNSUPPORTED (see the top). */
FLASHKV_API flashkv_status flashkv_engine_create(const char* model, const flashkv_engine_options* opts,
                                                 flashkv_engine** out);
/** Frees the engine, its model and KV cache. NULL is allowed (no-op). */
FLASHKV_API flashkv_status flashkv_engine_destroy(flashkv_engine* engine);

/** Fills *info (info->struct_size must be set). */
FLASHKV_API flashkv_status flashkv_engine_get_info(const flashkv_engine* engine, flashkv_engine_info* info);

/** Encodes `text_len` bytes of `text` (UTF-8 or any bytes; NUL bytes included; text may be NULL when text_len is 0)
 *  as the engine encodes prompts: special tokens such as <|im_start|> parsed; BOS prepended per `add_bos`: -1 = the
 *  tokenizer's rule (flashkv_engine_info.add_bos), 0 = no, 1 = yes (INVALID_ARGUMENT 'add_bos' when the vocabulary
 *  has no BOS). Writes the ids to tokens[0..capacity) and their count to *n_tokens (always, also on CAPACITY).
 *  Size query: tokens = NULL, capacity = 0 returns OK with the count. capacity < the count (with a non-NULL tokens):
 *  CAPACITY, nothing written. */
FLASHKV_API flashkv_status flashkv_engine_tokenize(const flashkv_engine* engine, const char* text, size_t text_len,
                                                   int32_t add_bos, int32_t* tokens, int64_t capacity,
                                                   int64_t* n_tokens);
/** The bytes of tokens[0..n_tokens) (flashkv::Tokenizer::decode: the first token's predecessor is BOS, so a
 *  SentencePiece leading space is dropped, as `flashkv generate --json` "text"). The bytes need not be valid UTF-8 (a
 *  token may end inside a character) and may contain NUL. *text_len gets the byte count (always, also on CAPACITY);
 *  text[0..len) the bytes followed by a NUL when capacity >= len + 1. Size query: text = NULL, capacity = 0 returns
 *  OK. capacity < len + 1 (with a non-NULL text): CAPACITY, nothing written. INVALID_ARGUMENT 'token' for an id
 *  outside [0, vocab_size). */
FLASHKV_API flashkv_status flashkv_engine_detokenize(const flashkv_engine* engine, const int32_t* tokens,
                                                     int64_t n_tokens, char* text, size_t capacity, size_t* text_len);

/** Generates after the prompt ids prompt[0..n_prompt) (1 <= n_prompt <= max_context; llama2.c prompts start with
 *  BOS): prefill, then sample → decode ... in a new sequence that is released at the end (flashkv::generate).
 *  Writes the generated ids (without the stop token) to tokens_out[0..*n_out); capacity must be at least the most it
 *  can return, min(max_new_tokens, max_context - n_prompt + 1) (checked before anything runs, INVALID_ARGUMENT
 *  'capacity'; max_new_tokens or max_context slots always suffice). stats may be NULL (else stats->struct_size must be set). Errors:
 *  'prompt' (NULL, n_prompt < 1, longer than the context), 'tokens[i]' (id out of range), 'max_new_tokens', 'temperature',
 *  'top_p', 'top_k', 'opts.struct_size'; CAPACITY when max_sequences are live or the pool lacks the pages. */
FLASHKV_API flashkv_status flashkv_engine_generate(flashkv_engine* engine, const int32_t* prompt, int64_t n_prompt,
                                                   const flashkv_generate_options* opts, int32_t* tokens_out,
                                                   int64_t capacity, int64_t* n_out, flashkv_generation_stats* stats);
/** The same from prompt text (text_len bytes), encoded as `flashkv generate --prompt` does (the tokenizer's BOS rule,
 *  special tokens parsed). INVALID_ARGUMENT 'prompt' when it encodes to no token (a tokenizer without BOS and ""). */
FLASHKV_API flashkv_status flashkv_engine_generate_text(flashkv_engine* engine, const char* prompt, size_t prompt_len,
                                                        const flashkv_generate_options* opts, int32_t* tokens_out,
                                                        int64_t capacity, int64_t* n_out,
                                                        flashkv_generation_stats* stats);

/* CONTINUOUS BATCHING: requests join and leave between decode steps; one step decodes every running request together
 * (flashkv::Engine::decode over a batch of sequences of different lengths, pages taken on demand).
 *   add     admit a request: a new sequence, prefill of its prompt, its first token sampled (reported in *first)
 *   step    one batched decode step over every running request: one event per request, in increasing seq order
 *   retire  release a request's sequence and pages (finished or not: retiring a running request cancels it)
 * Each request has its own sampler (opts: temperature, top_k, top_p, seed; the seed rule of flashkv_engine_generate)
 * and limits (max_new_tokens, stop_at_eos, the context), and the stop rule of flashkv_engine_generate, so its tokens
 * are those flashkv_engine_generate gives for the same prompt and options — up to float32 summation order: a batch of
 * rows goes through one matrix product (sgemm / cuBLAS) that sums in another order than a single row, so two greedy
 * paths can part only at a near-tie of the top-2 logits. A finished request keeps its pages until retired. */

/** Admits a request. *first = {seq, first token, stop}. Errors as flashkv_engine_generate; CAPACITY when max_sequences
 *  are live or the pool lacks the prompt's pages (nothing added: retire a request and try again). */
FLASHKV_API flashkv_status flashkv_engine_add(flashkv_engine* engine, const int32_t* prompt, int64_t n_prompt,
                                              const flashkv_generate_options* opts, flashkv_engine_event* first);
/** Decodes one token for every running request; writes one event per running request to events[0..*n_events)
 *  (capacity >= the running count; max_sequences always suffices; INVALID_ARGUMENT 'capacity' otherwise, checked first).
 *  No running request: *n_events = 0, OK. CAPACITY when the requests that start a new page need more pages than are
 *  free: nothing was computed or written (retire or preempt a request, then step again). */
FLASHKV_API flashkv_status flashkv_engine_step(flashkv_engine* engine, flashkv_engine_event* events, int32_t capacity,
                                               int32_t* n_events);
/** Releases the request's sequence and pages. INVALID_ARGUMENT 'seq' for an id that is not an admitted request. */
FLASHKV_API flashkv_status flashkv_engine_retire(flashkv_engine* engine, int32_t seq);

#ifdef __cplusplus
}
#endif
#endif /* FLASHKV_ENGINE_H_ */
