// Whether a CUDA device is usable here, and what to call it in a results file.
// Built from device.cu with CUDA, else from device_stub.cpp.
#pragma once
#include <string>

namespace ladder {

// Number of CUDA devices; 0 with `why` set when there is none (or no CUDA build).
int cuda_device_count(std::string* why = nullptr);
// "NVIDIA H100 80GB HBM3, CUDA 13.0" or why there is none.
std::string cuda_device_description();
// The name of the current CUDA device ("NVIDIA H100 80GB HBM3"), or "" when there is none.
std::string gpu_name();
// The CUDA runtime version this build links ("13.0"), or "" in a build without CUDA.
std::string cuda_runtime_version();

}  // namespace ladder
