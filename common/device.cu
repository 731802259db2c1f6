#include <cuda_runtime.h>

#include "device.hpp"
#include "error.hpp"

namespace ladder {

int cuda_device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) {
      // No driver at all (cudaDriverGetVersion gives 0, or no kernel driver is loaded) and no
      // device are said in plain words; a driver that is there but fails keeps its CUDA error.
      int driver = 0;
      const bool no_driver =
          cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0 || !nvidia_driver_loaded();
      if ((e == cudaSuccess || e == cudaErrorNoDevice) && nvidia_driver_loaded()) {
        *why =
            "no NVIDIA GPU visible on this machine (an NVIDIA driver is loaded: does "
            "CUDA_VISIBLE_DEVICES hide them?)";
      } else if (e == cudaSuccess || e == cudaErrorNoDevice ||
                 (e == cudaErrorInsufficientDriver && no_driver)) {
        *why = kNoNvidiaGpu;
      } else if (e == cudaErrorInsufficientDriver) {
        int rt = 0;
        (void)cudaRuntimeGetVersion(&rt);
        *why = "the NVIDIA driver here supports CUDA " + std::to_string(driver / 1000) + "." +
               std::to_string((driver % 1000) / 10) + ", older than this build's CUDA " +
               std::to_string(rt / 1000) + "." + std::to_string((rt % 1000) / 10) +
               " (update the driver): " + cudaGetErrorString(e);
      } else {
        *why = std::string("no usable CUDA device: ") + cudaGetErrorString(e);
      }
    }
    (void)cudaGetLastError();  // clear the sticky error so later calls start clean
    return 0;
  }
  return n;
}

DeviceInfo require_device() {
  std::string why;
  if (cuda_device_count(&why) == 0) throw NoDevice("this step needs a CUDA device: " + why);
  int dev = 0;
  cudaDeviceProp prop{};
  size_t free_b = 0, total_b = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess ||
      cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    const cudaError_t e = cudaGetLastError();
    throw NoDevice(std::string("the CUDA device cannot be used: ") + cudaGetErrorString(e));
  }
  DeviceInfo d;
  d.cc = prop.major * 10 + prop.minor;
  d.smem_per_block = prop.sharedMemPerBlockOptin;
  d.l2_bytes = size_t(prop.l2CacheSize);
  d.free_bytes = free_b;
  d.name = prop.name;
  return d;
}

std::string gpu_name() {
  if (cuda_device_count() == 0) return "";
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  return prop.name;
}

std::string cuda_runtime_version() {
  int rt = 0;
  if (cudaRuntimeGetVersion(&rt) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  return std::to_string(rt / 1000) + "." + std::to_string((rt % 1000) / 10);
}

std::string cuda_device_description() {
  std::string why;
  if (cuda_device_count(&why) == 0) return why;
  return gpu_name() + ", CUDA " + cuda_runtime_version();
}

}  // namespace ladder
