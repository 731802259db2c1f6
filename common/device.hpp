// Whether a CUDA device is usable here, what it offers, and what to call it in a results file.
// Built from device.cu with CUDA, else from device_stub.cpp.
#pragma once
#include <unistd.h>

#include <cstddef>
#include <string>

namespace ladder {

// What the machine offers a CUDA step (all zero for a CPU step, or where there is no device).
struct DeviceInfo {
  int cc = 0;                 // compute capability x 10 + minor, e.g. 90 for an H100
  size_t smem_per_block = 0;  // shared memory one block may opt in to, bytes
  size_t l2_bytes = 0;
  size_t free_bytes = 0;  // free device memory now
  std::string name;
};

// The reason in plain words when this machine has no NVIDIA GPU or driver (no CUDA build, or
// cudaGetDeviceCount reports no driver or no device); tests look for it.
inline constexpr const char* kNoNvidiaGpu = "no NVIDIA GPU or driver on this machine";

// Whether an NVIDIA kernel driver is loaded here (Linux: /proc/driver/nvidia/version).
inline bool nvidia_driver_loaded() {
  return access("/proc/driver/nvidia/version", F_OK) == 0;
}

// Number of CUDA devices; 0 with `why` set when there is none (or no CUDA build): kNoNvidiaGpu
// where there is no driver or no device, the CUDA error where a driver exists and fails.
int cuda_device_count(std::string* why = nullptr);
// Device 0's properties and free memory; throws NoDevice (exit 3) when there is none.
DeviceInfo require_device();
// "NVIDIA H100 80GB HBM3, CUDA 13.0" or why there is none (as cuda_device_count's `why`).
std::string cuda_device_description();
// The name of the current CUDA device ("NVIDIA H100 80GB HBM3"), or "" when there is none.
std::string gpu_name();
// The CUDA runtime version this build links ("13.0"), or "" in a build without CUDA.
std::string cuda_runtime_version();

}  // namespace ladder
