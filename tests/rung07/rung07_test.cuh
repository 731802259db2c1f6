// What rung 07's two self-tests (forward.cu, backward.cu) share: the tally of checks, a
// synchronisation that turns a deadlock into a message, N(0, 1) inputs generated the same way on
// the host and the device, guarded device buffers, and the relative errors the checks judge.
// The reference is the shared float64 oracle (reference/oracle.hpp), the block masks and their
// lists come from common/block_mask.hpp, Z from common/dropout.hpp. Test code: nothing in
// steps/ includes it. Nothing here times anything (`ladder bench` does).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "cuda_util.cuh"
#include "wgmma_tma_fa3.hpp"
#include "inputs.hpp"
#include "oracle.hpp"

namespace rung07test {

using bf16 = __nv_bfloat16;
using fp16 = __half;
using ladder::Tensor;

inline int g_failures = 0;  // checks that failed so far

// Prints one check's line and counts it.
inline bool verdict(bool ok, const std::string& line) {
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", line.c_str());
  std::fflush(stdout);
  if (!ok) ++g_failures;
  return ok;
}

// Waits for everything queued so far; a kernel that runs past the limit (a barrier that never
// completes) ends the program with exit status 3 and the name of what it was doing.
inline void sync_or_die(const std::string& what, double limit_s = 20.0) {
  cudaEvent_t ev;
  CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(ev));
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) CUDA_CHECK(e);  // throws, with what failed
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit_s) {
      std::printf("TIMEOUT: %s did not finish in %.0f s (a barrier that never completes?)\n",
                  what.c_str(), limit_s);
      std::fflush(stdout);
      std::_Exit(3);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  CUDA_CHECK(cudaEventDestroy(ev));
}

// The exit status of a self-test: 77 (ctest: skipped) without an sm_90 GPU, else -1 (go on).
inline int need_sm90() {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess ||
      prop.major != 9 || prop.minor != 0) {
    std::printf("needs an sm_90 GPU (H100/H200)\n");
    return 77;
  }
  std::printf("device: %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  return -1;
}

// ---- inputs ---------------------------------------------------------------------------------

// N(0, 1) from a counter (SplitMix64's finaliser + Box-Muller), the same on host and device,
// so that a large problem generated on the device can be re-read by the host for the oracle.
__host__ __device__ inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__host__ __device__ inline float gauss(uint64_t seed, uint64_t i) {
  const uint64_t a = mix64(seed + (2 * i + 1) * 0x9e3779b97f4a7c15ull);
  const uint64_t b = mix64(seed + (2 * i + 2) * 0x9e3779b97f4a7c15ull);
  const float u1 = (float((a >> 40) & 0xffffff) + 1.f) / 16777217.f;  // (0, 1)
  const float u2 = float((b >> 40) & 0xffffff) / 16777216.f;
  return sqrtf(-2.f * logf(u1)) * cosf(6.2831853071795865f * u2);
}

template <class T>
__global__ void init_normal(T* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<T, bf16>)
      p[i] = __float2bfloat16_rn(gauss(seed, i));
    else
      p[i] = __float2half_rn(gauss(seed, i));
  }
}

template <class T>
constexpr ladder::DType dtype_of() {
  return std::is_same_v<T, bf16> ? ladder::DType::bf16 : ladder::DType::f16;
}

// A tensor of `shape` with N(0, mul^2) values from `seed`, rounded to T (as the kernel sees it).
template <class T>
Tensor normal_tensor(std::vector<int64_t> shape, uint64_t seed, double mul) {
  Tensor t(std::move(shape));
  for (size_t i = 0; i < t.data.size(); ++i)
    t.data[i] = ladder::round_to(dtype_of<T>(), mul * double(gauss(seed, i)));
  return t;
}

// Host copy of n elements of a device array, as a tensor of `shape` (float64 values).
template <class T>
Tensor download(const T* p, std::vector<int64_t> shape) {
  Tensor t(std::move(shape));
  std::vector<T> h(t.data.size());
  CUDA_CHECK(cudaMemcpy(h.data(), p, h.size() * sizeof(T), cudaMemcpyDeviceToHost));
  ladder::to_tensor(h, t);
  return t;
}

// ---- strided layouts ------------------------------------------------------------------------

// [B, H, S, d] (the contract's layout) <-> [B, S, H, d], the layout of a fused projection's
// view nn.Linear(...).view(B, S, H, d) that the rung reads and writes in place through
// Strides; bthd_strides are those of the [B, S, H, d] buffer seen as [B, H, S, d].
template <class T>
std::vector<T> bhsd_to_bshd(const std::vector<T>& x, int64_t B, int64_t H, int64_t S, int64_t d,
                            bool inverse = false) {
  std::vector<T> y(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < S; ++s) {
        const int64_t bhsd = ((b * H + h) * S + s) * d, bshd = ((b * S + s) * H + h) * d;
        std::copy_n(&x[size_t(inverse ? bshd : bhsd)], d, &y[size_t(inverse ? bhsd : bshd)]);
      }
  return y;
}
inline ladder::fa3::Strides bshd_strides(int64_t H, int64_t S, int64_t d) {
  return {S * H * d, d, H * d};
}
// A [B, S, H, d] copy of a [B, H, S, d] device tensor, on the device.
template <class T>
ladder::DeviceBuffer<T> bshd_copy(const T* bhsd, int64_t B, int64_t H, int64_t S, int64_t d) {
  ladder::DeviceBuffer<T> y(size_t(B * H * S * d));
  std::vector<T> h(y.size());
  CUDA_CHECK(cudaMemcpy(h.data(), bhsd, y.bytes(), cudaMemcpyDeviceToHost));
  y.upload(bhsd_to_bshd(h, B, H, S, d));
  return y;
}

// ---- device buffers with canaries ---------------------------------------------------------

// n elements of T followed by a guard of canary bytes: poison() fills the elements with 0xFF
// (NaN in every float type) and the guard with the canary; intact() says whether a kernel wrote
// past the end.
template <class T>
class Guarded {
 public:
  static constexpr size_t kGuard = 4096;
  static constexpr unsigned char kCanary = 0xA5;
  Guarded() = default;
  explicit Guarded(size_t n) : n_(n), raw_(n * sizeof(T) + kGuard) {}
  T* get() const { return reinterpret_cast<T*>(raw_.get()); }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }
  void poison() {
    CUDA_CHECK(cudaMemset(raw_.get(), 0xFF, bytes()));
    CUDA_CHECK(cudaMemset(raw_.get() + bytes(), kCanary, kGuard));
  }
  bool intact() const {
    std::vector<unsigned char> g(kGuard);
    CUDA_CHECK(cudaMemcpy(g.data(), raw_.get() + bytes(), kGuard, cudaMemcpyDeviceToHost));
    return std::all_of(g.begin(), g.end(), [](unsigned char x) { return x == kCanary; });
  }
  void upload(const Tensor& t) {
    const std::vector<T> h = ladder::to_device<T>(t);
    CUDA_CHECK(
        cudaMemcpy(get(), h.data(), std::min(h.size(), n_) * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<unsigned char> bits() const {
    std::vector<unsigned char> b(bytes());
    CUDA_CHECK(cudaMemcpy(b.data(), raw_.get(), b.size(), cudaMemcpyDeviceToHost));
    return b;
  }

 private:
  size_t n_ = 0;
  ladder::DeviceBuffer<unsigned char> raw_;
};

// The lists of a block mask on the device (kv_block_lists or q_block_lists of common/).
struct DeviceLists {
  ladder::DeviceBuffer<int32_t> count, index;
  explicit DeviceLists(const ladder::BlockLists& l) : count(l.count.size()), index(l.index.size()) {
    count.upload(l.count);
    index.upload(l.index);
  }
};

// ---- errors ---------------------------------------------------------------------------------

// The unit roundoff of T: the relative tolerances are multiples of it.
template <class T>
constexpr double unit_roundoff() {
  return std::is_same_v<T, bf16> ? 1.0 / 256 : 1.0 / 2048;
}

// max over rows of max_c |got - ref| / max_c |ref| (rows of `width` elements): every row is
// judged against its own magnitude, so a defect in rows whose values are small (long rows
// average many values) is not hidden under the tolerance of large ones. A row whose reference is
// all zero (no visible key) must be exactly zero; NaN or inf where the reference is finite fails.
inline double row_relative_error(const Tensor& got, const Tensor& ref, int64_t width) {
  double worst = 0;
  for (size_t r0 = 0; r0 < ref.data.size(); r0 += size_t(width)) {
    double mx = 0, err = 0;
    for (size_t i = r0; i < r0 + size_t(width); ++i) {
      mx = std::max(mx, std::fabs(ref.data[i]));
      err = std::isfinite(got.data[i]) ? std::max(err, std::fabs(got.data[i] - ref.data[i]))
                                       : INFINITY;
    }
    worst = std::max(worst, mx > 0 ? err / mx : (err > 0 ? INFINITY : 0.0));
  }
  return worst;
}

// max |got - ref| / max |ref| over a whole tensor (or a set of sampled rows): for gradients,
// whose rows can cancel to zero (dQ of a causal row that sees one key: dS = P (dP - D) = 0), so
// that a row-wise ratio would divide rounding by zero.
inline double tensor_relative_error(const Tensor& got, const Tensor& ref) {
  double mx = 0, err = 0;
  for (size_t i = 0; i < ref.data.size(); ++i) {
    mx = std::max(mx, std::fabs(ref.data[i]));
    err =
        std::isfinite(got.data[i]) ? std::max(err, std::fabs(got.data[i] - ref.data[i])) : INFINITY;
  }
  return mx > 0 ? err / mx : (err > 0 ? INFINITY : 0.0);
}

// max |got - ref| / max(1, |ref|) for the LSE; -inf (no visible key) must match exactly.
inline double lse_error(const Tensor& got, const Tensor& ref) {
  double worst = 0;
  for (size_t i = 0; i < ref.data.size(); ++i) {
    const double g = got.data[i], r = ref.data[i];
    const double e = std::isinf(r) || !std::isfinite(g)
                         ? (g == r ? 0.0 : INFINITY)
                         : std::fabs(g - r) / std::max(1.0, std::fabs(r));
    worst = std::max(worst, e);
  }
  return worst;
}

inline std::string fmt(const char* f, double a) {
  char b[64];
  std::snprintf(b, sizeof(b), f, a);
  return b;
}

}  // namespace rung07test

namespace rung07test {

// ---- dropout and block-sparse cases (both self-tests) --------------------------------------

constexpr uint64_t kDropoutSeed = 0x0123456789abcdefull;

struct Extra {
  const char* name;
  int64_t B, H, Hkv, M, N;
  bool causal;
  double p;  // dropout rate
  int mask;  // 0 none; 1 random 0.5 with an empty query block and an empty key block; 2 all ones
  int64_t bm, bn;
  bool bcast_b, bcast_h;  // mask shaped [1, H, ...] / [B, 1, ...]
};
inline const Extra kExtras[] = {
    {"dropout 0.1, 333 x 333, gqa 2:1", 2, 2, 1, 333, 333, false, 0.1, 0, 128, 128, false, false},
    {"dropout 0.5, 200 x 450 causal", 1, 2, 2, 200, 450, true, 0.5, 0, 128, 128, false, false},
    {"mask 0.5 [B,H], empty query and key block", 2, 2, 2, 700, 700, false, 0, 1, 128, 128, false,
     false},
    {"mask 0.5 [B,H], empty blocks, causal", 2, 2, 2, 700, 700, true, 0, 1, 128, 128, false, false},
    {"mask 0.5 [1,H] 256x256, 600 x 900, gqa 2:1", 2, 2, 1, 600, 900, false, 0, 1, 256, 256, true,
     false},
    {"mask 0.5 [B,1] 128x256, 500 x 1100 causal", 2, 2, 2, 500, 1100, true, 0, 1, 128, 256, false,
     true},
    {"mask 0.5 + dropout 0.1, causal", 2, 2, 2, 700, 700, true, 0.1, 1, 128, 128, false, false},
    {"all-ones mask = dense, 520 x 777", 1, 2, 2, 520, 777, false, 0, 2, 128, 128, false, false},
    {"all-ones mask = dense, causal, gqa 2:1", 1, 2, 1, 520, 777, true, 0, 2, 128, 128, false,
     false},
};

// The mask of an Extra from the shared generator (random:RHO, [B, H, ...]), cut down to the
// broadcast shape it asks for; kind 1 then empties query block 1 of mask row (0, min(1, mh - 1))
// (those rows see nothing: O = 0, dQ = 0) and key block 2 of mask row (0, 0) (no query sees
// it: dK = dV = 0).
inline ladder::BlockMask extra_mask(const Extra& x, const ladder::Problem& p, uint64_t seed) {
  ladder::Problem g = p;
  g.sparsity.kind = ladder::BlockSparsity::Kind::random;
  g.sparsity.density = x.mask == 2 ? 1.0 : 0.5;
  g.sparsity.block_q = x.bm, g.sparsity.block_k = x.bn;
  g.seed = seed;
  const ladder::BlockMask full = ladder::make_block_mask(g);
  ladder::BlockMask m = full;
  m.batch = x.bcast_b ? 1 : x.B, m.heads = x.bcast_h ? 1 : x.H;
  const size_t plane = size_t(m.q_blocks * m.k_blocks);
  m.keep.assign(size_t(m.batch * m.heads) * plane, 0);
  for (int64_t b = 0; b < m.batch; ++b)
    for (int64_t h = 0; h < m.heads; ++h)
      std::copy_n(full.keep.begin() + long(size_t(b * x.H + h) * plane), plane,
                  m.keep.begin() + long(size_t(b * m.heads + h) * plane));
  if (x.mask == 1) {
    const int64_t h1 = std::min<int64_t>(1, m.heads - 1);
    if (m.q_blocks > 1)
      for (int64_t J = 0; J < m.k_blocks; ++J)
        m.keep[size_t(h1) * plane + size_t(m.k_blocks + J)] = 0;
    if (m.k_blocks > 2)
      for (int64_t I = 0; I < m.q_blocks; ++I) m.keep[size_t(I * m.k_blocks + 2)] = 0;
  }
  return m;
}

}  // namespace rung07test
