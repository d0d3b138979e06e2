// flashkv/error.hpp — the one exception family flashkv throws.
//
// Every invalid input is reported as flashkv::Error (derived from std::invalid_argument) whose message names the
// argument and gives expected vs actual, e.g.
//   flashkv: argument 'k': expected head_dim 64 (= q.shape[3]), got 32
// The C ABI turns these into a status code (Error::status()) plus flashkv_last_error(); Python raises ValueError
// (TypeError for wrong dtypes/types); the CLI prints the message on one line and exits with code 2.
#pragma once

#include <stdexcept>
#include <string>

namespace flashkv {

/// Status codes; values are part of the C ABI (flashkv_status in flashkv.h).
enum class Status : int32_t {
  ok = 0,
  invalid_argument = 1,  ///< bad shape, value, range, null pointer, ...
  type_error = 2,        ///< wrong dtype or device
  unsupported = 3,       ///< valid request but not compiled / not available (e.g. no CUDA device, head_dim not built)
  capacity = 4,          ///< a cache or buffer is full; nothing was modified
  io = 5,                ///< file missing, truncated or corrupt
  internal = 6,          ///< a bug or a CUDA runtime failure
};

class Error : public std::invalid_argument {
 public:
  /// Full-message form.
  explicit Error(const std::string& message, Status status = Status::invalid_argument);
  /// Structured form: "flashkv: argument '<argument>': expected <expected>, got <actual>".
  Error(const std::string& argument, const std::string& expected, const std::string& actual,
        Status status = Status::invalid_argument);
  Status status() const noexcept { return status_; }
  const std::string& argument() const noexcept { return argument_; }

 private:
  Status status_;
  std::string argument_;
};

/// Wrong dtype / device (Python maps it to TypeError).
class TypeError : public Error {
 public:
  TypeError(const std::string& argument, const std::string& expected, const std::string& actual)
      : Error(argument, expected, actual, Status::type_error) {}
};

/// A valid combination that this build or machine cannot run. Never silently replaced by a slower path.
class UnsupportedError : public Error {
 public:
  explicit UnsupportedError(const std::string& message) : Error(message, Status::unsupported) {}
};

/// A cache/pool is full. The object is left exactly as it was before the call.
class CapacityError : public Error {
 public:
  explicit CapacityError(const std::string& message) : Error(message, Status::capacity) {}
};

/// File missing, truncated, corrupt or of an unknown version.
class IoError : public Error {
 public:
  explicit IoError(const std::string& message) : Error(message, Status::io) {}
};

}  // namespace flashkv
