/* The check macro of the C11 C ABI tests: counts passes and failures; a failure prints file:line, the run's seed
 * (g_seed, 0 when the test draws no random numbers), the message and flashkv_last_error(). A test ends with
 * capi_check_summary(): the line "N passed, M failed" and the exit code (1 on any failure). */
#ifndef FLASHKV_TESTS_CAPI_CHECK_H_
#define FLASHKV_TESTS_CAPI_CHECK_H_

#include <inttypes.h>
#include <stdio.h>

#include "flashkv/flashkv.h"

static int g_passed = 0, g_failed = 0;
static uint64_t g_seed = 0;

#define CHECK(cond, ...)                                                                       \
  do {                                                                                         \
    if (cond) {                                                                                \
      ++g_passed;                                                                              \
    } else {                                                                                   \
      ++g_failed;                                                                              \
      fprintf(stderr, "FAIL %s:%d (seed %" PRIu64 "): ", __FILE__, __LINE__, g_seed);          \
      fprintf(stderr, __VA_ARGS__);                                                            \
      fprintf(stderr, " [flashkv_last_error: %s]\n", flashkv_last_error());                    \
    }                                                                                          \
  } while (0)

static int capi_check_summary(void) {
  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}

#endif /* FLASHKV_TESTS_CAPI_CHECK_H_ */
