// CUDA plumbing shared by the GPU rungs: error checks, device buffers that are poisoned
// before a run, host <-> device element conversions, and event timing. gpu_run.cuh builds the
// one host path of a CUDA step on these.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "error.hpp"
#include "inputs.hpp"
#include "step.hpp"

namespace ladder {

// A CUDA call or launch failed: a bug, reported and ended with exit status 1.
struct CudaFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void cuda_check(cudaError_t e, const char* what, const char* file, int line) {
#ifdef LADDER_EXERCISE
  const char* note = " (exercise build: a LADDER_TODO region in device code traps when reached)";
#else
  const char* note = "";
#endif
  if (e != cudaSuccess)
    throw CudaFailure(std::string(file) + ":" + std::to_string(line) + ": " + what + ": " +
                      cudaGetErrorString(e) + note);
}
#define CUDA_CHECK(expr) ::ladder::cuda_check((expr), #expr, __FILE__, __LINE__)
// After every launch: whether the launch was accepted (a bad configuration, too much shared
// memory). It does not wait for the kernel: errors during execution surface at the next
// synchronising call, which time_gpu_ms makes after the warm-up and after the timed runs.
#define CUDA_CHECK_LAUNCH() \
  ::ladder::cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

// An owning device array of T.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n) CUDA_CHECK(cudaMalloc(&p_, n * sizeof(T)));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_), std::swap(n_, o.n_);
    return *this;
  }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }
  void upload(const std::vector<T>& h) {
    CUDA_CHECK(
        cudaMemcpy(p_, h.data(), std::min(h.size(), n_) * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  // All bytes 0xFF: NaN for float, half and bfloat16, so unwritten outputs fail the check.
  void poison() { CUDA_CHECK(cudaMemset(p_, 0xFF, n_ * sizeof(T))); }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Host conversions of a (double) tensor to the device element types, and back (float:
// to_float, common/tensor.hpp). The loops
// live in common/tensor.cpp (plain C++, on OpenMP threads); __half and __nv_bfloat16 are
// 16-bit standard-layout structs, so their storage is written and read as uint16_t bits
// (reinterpret_cast, as CUTLASS does), with the same rounding as __float2half_rn and
// __float2bfloat16_rn.
static_assert(sizeof(__half) == sizeof(uint16_t) && sizeof(__nv_bfloat16) == sizeof(uint16_t),
              "16-bit device types");
inline std::vector<__half> host_f16(const Tensor& t) {
  std::vector<__half> h(t.data.size());
  to_f16_bits(t, reinterpret_cast<uint16_t*>(h.data()));
  return h;
}
inline std::vector<__nv_bfloat16> host_bf16(const Tensor& t) {
  std::vector<__nv_bfloat16> h(t.data.size());
  to_bf16_bits(t, reinterpret_cast<uint16_t*>(h.data()));
  return h;
}
// A tensor's values in the device element type T (float, __half or __nv_bfloat16).
template <class T>
std::vector<T> to_device(const Tensor& t) {
  if constexpr (std::is_same_v<T, float>)
    return to_float(t);
  else if constexpr (std::is_same_v<T, __half>)
    return host_f16(t);
  else
    return host_bf16(t);
}
template <class T>
void to_tensor(const std::vector<T>& h, Tensor& t) {
  if constexpr (std::is_same_v<T, float>)
    from_f32(h.data(), h.size(), t);
  else if constexpr (std::is_same_v<T, __half>)
    from_f16_bits(reinterpret_cast<const uint16_t*>(h.data()), h.size(), t);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    from_bf16_bits(reinterpret_cast<const uint16_t*>(h.data()), h.size(), t);
  else
    for (size_t i = 0; i < h.size() && i < t.data.size(); ++i) t.data[i] = double(float(h[i]));
}

// Writes 2x the L2 size so that the next timed run finds its inputs in HBM, not L2.
class L2Flusher {
 public:
  L2Flusher() {
    int dev = 0, l2 = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    buf_ = DeviceBuffer<char>(size_t(l2) * 2);
  }
  void flush() { CUDA_CHECK(cudaMemsetAsync(buf_.get(), 0, buf_.size())); }

 private:
  DeviceBuffer<char> buf_;
};

// Times fn() (which launches kernels on the default stream) with CUDA events: `warmup`
// untimed runs, then `repeats` timed runs, each after an L2 flush; returns the median ms.
// Checks for launch and execution errors after the warm-up and after the timed runs.
template <class Fn>
double time_gpu_ms(Fn&& fn, int repeats, int warmup) {
  L2Flusher l2;
  for (int i = 0; i < warmup; ++i) fn();
  CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int i = 0; i < std::max(1, repeats); ++i) {
    l2.flush();
    CUDA_CHECK(cudaEventRecord(a));
    fn();
    CUDA_CHECK(cudaEventRecord(b));
    CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  CUDA_CHECK(cudaDeviceSynchronize());
  return median(ms);
}

}  // namespace ladder
