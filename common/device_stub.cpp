// Built when no CUDA toolkit was found: the GPU rungs are not built at all.
#include "device.hpp"
#include "error.hpp"

namespace ladder {

namespace {
constexpr const char* kNoCuda =
    "this build has no CUDA (no CUDA toolkit was found at configure time)";
}

int cuda_device_count(std::string* why) {
  if (why) *why = kNoCuda;
  return 0;
}

DeviceInfo require_device() {
  throw NoDevice(kNoCuda);
}

std::string cuda_device_description() {
  return "no CUDA in this build";
}

std::string gpu_name() {
  return "";
}

std::string cuda_runtime_version() {
  return "";
}

}  // namespace ladder
