// Internal helpers shared by every capi_*.cpp: exception → status translation and C → C++ tensor conversion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <new>
#include <string>

#include "flashkv/error.hpp"
#include "flashkv/flashkv.h"
#include "flashkv/types.hpp"

namespace flashkv::capi {

/// Stores `msg` as this thread's flashkv_last_error().
void set_last_error(const std::string& msg);
const char* last_error_c_str();

/// Runs fn(); converts every exception into a status + last-error message. Never lets an exception cross the ABI.
template <class F>
flashkv_status guard(F&& fn) noexcept {
  try {
    set_last_error("");
    fn();
    return FLASHKV_OK;
  } catch (const Error& e) {
    set_last_error(e.what());
    return static_cast<flashkv_status>(e.status());
  } catch (const std::bad_alloc&) {
    set_last_error("flashkv: out of host memory");
    return FLASHKV_ERROR_CAPACITY;
  } catch (const std::exception& e) {
    set_last_error(std::string("flashkv: internal error: ") + e.what());
    return FLASHKV_ERROR_INTERNAL;
  } catch (...) {
    set_last_error("flashkv: internal error: unknown exception");
    return FLASHKV_ERROR_INTERNAL;
  }
}

/// Throws Error naming '<name>.struct_size' unless min_size <= size <= max_size (a struct_size smaller than the fields
/// the library needs, or larger than it knows: options a newer caller set must never be silently ignored).
inline void check_struct_size(uint32_t size, std::size_t min_size, std::size_t max_size, const char* name) {
  if (size < min_size || size > max_size) {
    throw Error(std::string(name) + ".struct_size",
                std::to_string(min_size) + ".." + std::to_string(max_size) + " bytes (set it to sizeof(...))",
                std::to_string(size));
  }
}

/// Whether the caller's struct_size covers `field` of struct T (fields appended later are read only when covered).
#define FLASHKV_COVERS(T, ptr, field) \
  (static_cast<std::size_t>((ptr)->struct_size) >= offsetof(T, field) + sizeof(T::field))

/// Converts a C tensor; throws Error naming `name` for NULL, bad ndim, unknown dtype/device.
TensorView to_view(const flashkv_tensor* t, const char* name);

}  // namespace flashkv::capi
