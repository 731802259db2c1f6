// Built when no CUDA toolkit was found: the GPU rungs are not built at all.
#include "device.hpp"

namespace ladder {

int cuda_device_count(std::string* why) {
  if (why) *why = "this build has no CUDA (no CUDA toolkit was found at configure time)";
  return 0;
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
