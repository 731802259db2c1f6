// What step 07's two self-tests (selftest.cu, selftest_backward.cu) share: CUDA errors and
// deadlocks that end the program with a message, and N(0, 1) inputs generated the same way on the
// host and the device. Test code, included by those two programs only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace selftest07 {

using bf16 = __nv_bfloat16;
using fp16 = __half;

inline int g_failures = 0;  // checks that failed so far

inline void cuda_or_die(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("CUDA ERROR %s: %s\n", what, cudaGetErrorString(e));
    std::fflush(stdout);
    std::exit(1);
  }
}
#define CK(expr) cuda_or_die((expr), #expr)

// Waits for everything queued so far; a kernel that runs past the limit (a deadlock) ends the
// program with the name of what it was doing.
inline void sync_or_die(const std::string& what, double limit_s = 20.0) {
  cudaEvent_t ev;
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  CK(cudaEventRecord(ev));
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) {
      std::printf("CUDA ERROR during %s: %s\n", what.c_str(), cudaGetErrorString(e));
      std::fflush(stdout);
      std::exit(1);
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit_s) {
      std::printf("TIMEOUT: %s did not finish in %.0f s (a barrier that never completes?)\n",
                  what.c_str(), limit_s);
      std::fflush(stdout);
      std::_Exit(3);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  CK(cudaEventDestroy(ev));
}

// ---- values ---------------------------------------------------------------------------------

// N(0, 1) from a counter (splitmix64 + Box-Muller), the same on the host and the device.
__host__ __device__ inline uint64_t mix64(uint64_t z) {
  z ^= z >> 30;
  z *= 0xbf58476d1ce4e5b9ull;
  z ^= z >> 27;
  z *= 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z;
}
__host__ __device__ inline float gauss(uint64_t seed, uint64_t i) {
  const uint64_t a = mix64(seed + (2 * i + 1) * 0x9e3779b97f4a7c15ull);
  const uint64_t b = mix64(seed + (2 * i + 2) * 0x9e3779b97f4a7c15ull);
  const float u1 = (float((a >> 40) & 0xffffff) + 1.f) / 16777217.f;  // (0, 1)
  const float u2 = float((b >> 40) & 0xffffff) / 16777216.f;
  return sqrtf(-2.f * logf(u1)) * cosf(6.2831853071795865f * u2);
}

template <class T>
__host__ __device__ inline T to_t(float x);
template <>
__host__ __device__ inline bf16 to_t<bf16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__host__ __device__ inline fp16 to_t<fp16>(float x) {
  return __float2half_rn(x);
}
__host__ __device__ inline float to_f(bf16 x) {
  return __bfloat162float(x);
}
__host__ __device__ inline float to_f(fp16 x) {
  return __half2float(x);
}

template <class T>
__global__ void init_normal(T* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    p[i] = to_t<T>(gauss(seed, i));
}

}  // namespace selftest07
