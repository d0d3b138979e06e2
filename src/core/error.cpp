#include "flashkv/error.hpp"

namespace flashkv {

Error::Error(const std::string& message, Status status) : std::invalid_argument(message), status_(status) {}

Error::Error(const std::string& argument, const std::string& expected, const std::string& actual, Status status)
    : std::invalid_argument("flashkv: argument '" + argument + "': expected " + expected + ", got " + actual),
      status_(status),
      argument_(argument) {}

}  // namespace flashkv
