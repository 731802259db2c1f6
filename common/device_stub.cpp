// Built when no CUDA toolkit was found: the GPU rungs are not built at all.
#include "device.hpp"
#include "error.hpp"

namespace ladder {

namespace {
// Why there is no device, in plain words: whether the machine has an NVIDIA driver decides
// what the learner should do about it.
std::string no_cuda() {
  const std::string build = "this build has no CUDA (no CUDA toolkit was found at configure time)";
  if (!nvidia_driver_loaded()) return std::string(kNoNvidiaGpu) + ", and " + build;
  return build +
         ", though this machine has an NVIDIA driver: install the CUDA toolkit and "
         "reconfigure to build the GPU rungs";
}
}  // namespace

int cuda_device_count(std::string* why) {
  if (why) *why = no_cuda();
  return 0;
}

DeviceInfo require_device() {
  throw NoDevice(no_cuda());
}

std::string cuda_device_description() {
  return no_cuda();
}

std::string gpu_name() {
  return "";
}

std::string cuda_runtime_version() {
  return "";
}

}  // namespace ladder
