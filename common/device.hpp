// Whether a CUDA device is usable here. Built from device.cu with CUDA, else a stub.
#pragma once
#include <string>

namespace ladder {

// Number of CUDA devices; 0 with `why` set when there is none (or no CUDA build).
int cuda_device_count(std::string* why = nullptr);
// "NVIDIA H100 80GB HBM3, CUDA 13.0" or why there is none.
std::string cuda_device_description();

}  // namespace ladder
