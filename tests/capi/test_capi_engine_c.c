/* The engine's C ABI (include/flashkv/flashkv_engine.h) from C11: the header compiles as C with -Wpedantic, and a
 * plain C caller creates an engine, generates greedy text, reads the stats, runs two batched requests and gets typed
 * errors. The thorough checks (equality with the C++ engine and the CLI, every bad argument) are test_capi_engine.cpp
 * and tests/python/test_engine.py. Model: $FLASHKV_MODELS_DIR, else the first of $FLASHKV_MODEL_HOME/aidreams260k
 * (FLASHKV_SOURCE_MODELS_DIR/aidreams260k = models/aidreams260k when it is unset: where scripts/setup copies it) and
 * FLASHKV_SHARED_MODELS_DIR (../shared/models) that holds it, as flashkv::shipped_models_dir() (exit 77 = skipped when
 * it is missing). Ends with "N passed, M failed"; exit code 1
 * on any failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi_check.h"
#include "flashkv/flashkv_engine.h"

/* dir/aidreams260K.bin into `model`; 1 when that file opens. */
static int model_in(const char* dir, char* model, size_t size) {
  snprintf(model, size, "%s/aidreams260K.bin", dir);
  FILE* f = fopen(model, "rb");
  if (f != NULL) fclose(f);
  return f != NULL;
}

int main(void) {
  const char* dir = getenv("FLASHKV_MODELS_DIR");
  const char* home = getenv("FLASHKV_MODEL_HOME"); /* flashkv::fetched_models_dir() */
  char model[4096], tok[4096], setup_dir[3072]; /* shorter: its file names fit in model / tok */
  snprintf(setup_dir, sizeof setup_dir, "%s/aidreams260k",
           home != NULL && home[0] != '\0' ? home : FLASHKV_SOURCE_MODELS_DIR);
  if (dir == NULL || dir[0] == '\0')
    dir = model_in(setup_dir, model, sizeof model)                   ? setup_dir
          : model_in(FLASHKV_SHARED_MODELS_DIR, model, sizeof model) ? FLASHKV_SHARED_MODELS_DIR
                                                                     : setup_dir;
  snprintf(tok, sizeof tok, "%s/aidreams260K.tok512.bin", dir);
  if (!model_in(dir, model, sizeof model)) {
    printf("skipped: %s not found (run scripts/setup, or set FLASHKV_MODELS_DIR)\n", model);
    return 77;
  }

  flashkv_engine_options o;
  CHECK(flashkv_engine_options_default(&o) == FLASHKV_OK, "options_default");
  o.tokenizer_path = tok;
  o.max_sequences = 2;
  flashkv_engine* e = NULL;
  CHECK(flashkv_engine_create(model, &o, &e) == FLASHKV_OK && e != NULL, "create");
  if (e == NULL) return 1;

  flashkv_generate_options g;
  CHECK(flashkv_generate_options_default(&g) == FLASHKV_OK, "generate_options_default");
  g.temperature = 0.0f;
  g.max_new_tokens = 24;
  g.stop_at_eos = 0;
  int32_t out[24];
  int64_t n = 0;
  flashkv_generation_stats st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  const char* prompt = "The machine";
  CHECK(flashkv_engine_generate_text(e, prompt, strlen(prompt), &g, out, 24, &n, &st) == FLASHKV_OK, "generate_text");
  CHECK(n == 24 && st.generated_tokens == 24 && st.decode_steps == 23 && st.stop_reason == FLASHKV_STOP_STEPS,
        "n %lld, stats %lld / %lld", (long long)n, (long long)st.generated_tokens, (long long)st.decode_steps);
  CHECK(st.prefill_tokens_per_s > 0 && st.decode_tokens_per_s > 0, "tokens per second");
  size_t len = 0;
  CHECK(flashkv_engine_detokenize(e, out, n, NULL, 0, &len) == FLASHKV_OK && len > 0, "detokenize size");
  char* text = malloc(len + 1);
  CHECK(text != NULL && flashkv_engine_detokenize(e, out, n, text, len + 1, &len) == FLASHKV_OK, "detokenize");
  printf("greedy: \"%s%s\" (prefill %.0f tok/s, decode %.0f tok/s)\n", prompt, text, st.prefill_tokens_per_s,
         st.decode_tokens_per_s);
  free(text);

  /* two requests in one batch: the first equals the generate call above */
  int32_t prompt_ids[16];
  int64_t np = 0;
  CHECK(flashkv_engine_tokenize(e, prompt, strlen(prompt), -1, prompt_ids, 16, &np) == FLASHKV_OK, "tokenize");
  flashkv_engine_event a, b;
  CHECK(flashkv_engine_add(e, prompt_ids, np, &g, &a) == FLASHKV_OK && a.token == out[0], "add a");
  CHECK(flashkv_engine_add(e, prompt_ids + 1, np - 1, &g, &b) == FLASHKV_OK && b.seq != a.seq, "add b");
  int64_t got = 1;
  int same = 1;
  for (;;) {
    flashkv_engine_event ev[2];
    int32_t ne = 0;
    if (flashkv_engine_step(e, ev, 2, &ne) != FLASHKV_OK || ne == 0) break;
    for (int i = 0; i < ne; ++i)
      if (ev[i].seq == a.seq) same &= got < 24 && ev[i].token == out[got++];
  }
  CHECK(same && got == 24, "batched request a equals generate (%lld tokens)", (long long)got);
  CHECK(flashkv_engine_retire(e, a.seq) == FLASHKV_OK && flashkv_engine_retire(e, b.seq) == FLASHKV_OK, "retire");

  /* typed errors */
  CHECK(flashkv_engine_generate_text(NULL, prompt, 3, &g, out, 24, &n, NULL) == FLASHKV_ERROR_INVALID_ARGUMENT &&
            strstr(flashkv_last_error(), "'engine'") != NULL, "NULL engine");
  g.top_p = 0.0f;
  CHECK(flashkv_engine_generate_text(e, prompt, 3, &g, out, 24, &n, NULL) == FLASHKV_ERROR_INVALID_ARGUMENT &&
            strstr(flashkv_last_error(), "'top_p'") != NULL, "top_p");
  flashkv_engine* none = NULL;
  CHECK(flashkv_engine_create("/nonexistent/x.bin", &o, &none) == FLASHKV_ERROR_IO && none == NULL, "missing file");
  CHECK(flashkv_engine_destroy(e) == FLASHKV_OK && flashkv_engine_destroy(NULL) == FLASHKV_OK, "destroy");
  return capi_check_summary();
}
