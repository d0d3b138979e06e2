// The first usable library of a candidate list (dlopen_first.hpp).
#include "engine/dlopen_first.hpp"

#include <dlfcn.h>

#include <cstdlib>

namespace flashkv::engine_detail {

DlopenResult dlopen_first(const char* env, const std::vector<std::string>& candidates,
                          const std::function<std::string(void*)>& accept) {
  std::vector<std::string> paths;
  if (const char* p = env != nullptr ? std::getenv(env) : nullptr; p != nullptr && p[0] != '\0') paths.emplace_back(p);
  paths.insert(paths.end(), candidates.begin(), candidates.end());
  DlopenResult r;
  for (const std::string& path : paths) {
    void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      r.tried += (r.tried.empty() ? "" : "; ") + path + ": " + ::dlerror();
      continue;
    }
    const std::string why = accept(h);
    if (why.empty()) {
      r.handle = h;
      r.path = path;
      return r;
    }
    r.tried += (r.tried.empty() ? "" : "; ") + path + ": " + why;
    ::dlclose(h);
  }
  return r;
}

}  // namespace flashkv::engine_detail
