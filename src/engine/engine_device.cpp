// Device names of the engine ("cpu", "cuda", "cuda:N"): one parser for the CLI's --device, the C ABI and Python.
#include <string>

#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"

namespace flashkv {

EngineOptions parse_engine_device(const std::string& device, const std::string& argument) {
  EngineOptions o;
  if (device == "cpu") return o;
  if (device == "cuda") {
    o.device = Device::cuda;
    return o;
  }
  if (device.rfind("cuda:", 0) == 0 && device.size() > 5 && device.size() < 9 &&
      device.find_first_not_of("0123456789", 5) == std::string::npos) {
    o.device = Device::cuda;
    o.device_index = std::stoi(device.substr(5));
    return o;
  }
  throw Error(argument, "cpu, cuda or cuda:N", "'" + device + "'");
}

}  // namespace flashkv
