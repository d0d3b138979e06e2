// engine_detail::dlopen_first (src/engine/dlopen_first.hpp), the loader of OpenBLAS and cuBLAS: $env first, then the
// candidates in order; the first library that opens and that accept() takes is returned; everything refused before it
// is listed as "PATH: reason" in order.
#include <gtest/gtest.h>

#include <cstdlib>
#include <dlfcn.h>

#include "engine/dlopen_first.hpp"

using flashkv::engine_detail::dlopen_first;

TEST(DlopenFirst, ListsWhatWasTriedAndTakesTheFirstAccepted) {
  ::setenv("FLASHKV_TEST_DLOPEN", "/nonexistent/libfirst.so", 1);
  int asked = 0;
  const auto r = dlopen_first("FLASHKV_TEST_DLOPEN", {"libc.so.6", "libm.so.6"}, [&](void* h) -> std::string {
    ++asked;
    return ::dlsym(h, "cos") != nullptr ? "" : "no cos";  // libm has it; libc (which libm needs) has not
  });
  ASSERT_NE(r.handle, nullptr);
  EXPECT_EQ(r.path, "libm.so.6");
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(r.tried.rfind("/nonexistent/libfirst.so: ", 0), 0u) << r.tried;
  EXPECT_NE(r.tried.find("; libc.so.6: no cos"), std::string::npos) << r.tried;
  EXPECT_EQ(r.tried.find("libm.so.6"), std::string::npos) << "the taken library is not in tried";
  ::unsetenv("FLASHKV_TEST_DLOPEN");
}

TEST(DlopenFirst, NoneTakenReturnsNullAndEveryReason) {
  ::setenv("FLASHKV_TEST_DLOPEN", "", 1);  // set but empty: not a candidate
  const auto r = dlopen_first("FLASHKV_TEST_DLOPEN", {"/nonexistent/a.so", "libm.so.6"},
                              [](void*) -> std::string { return "refused"; });
  EXPECT_EQ(r.handle, nullptr);
  EXPECT_EQ(r.path, "");
  EXPECT_EQ(r.tried.rfind("/nonexistent/a.so: ", 0), 0u) << r.tried;
  EXPECT_NE(r.tried.find("; libm.so.6: refused"), std::string::npos) << r.tried;
  EXPECT_EQ(r.tried.find("; ;"), std::string::npos);
  ::unsetenv("FLASHKV_TEST_DLOPEN");
  EXPECT_EQ(dlopen_first(nullptr, {}, [](void*) { return std::string(); }).tried, "");
}
