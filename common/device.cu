#include <cuda_runtime.h>

#include "device.hpp"

namespace ladder {

int cuda_device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) *why = std::string("no CUDA device: ") + (e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::string cuda_device_description() {
  std::string why;
  if (cuda_device_count(&why) == 0) return why;
  cudaDeviceProp prop{};
  int dev = 0, rt = 0;
  cudaGetDevice(&dev);
  cudaGetDeviceProperties(&prop, dev);
  cudaRuntimeGetVersion(&rt);
  return std::string(prop.name) + ", CUDA " + std::to_string(rt / 1000) + "." +
         std::to_string((rt % 1000) / 10);
}

}  // namespace ladder
