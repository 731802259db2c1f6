#include "tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <sstream>

#include "dtype.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ladder {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << "]";
  return s.str();
}

std::string Tensor::shape_str() const {
  return ladder::shape_str(shape);
}

std::vector<float> to_float(const Tensor& t) {
  std::vector<float> f(t.data.size());
  to_f32(t, f.data());
  return f;
}

int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

void limit_threads(int n) {
#ifdef _OPENMP
  if (n >= 1 && n < omp_get_max_threads()) omp_set_num_threads(n);
#else
  (void)n;
#endif
}

int parallel_chunk_count(int64_t n, int64_t grain) {
#ifdef _OPENMP
  const int64_t by_size = n / std::max<int64_t>(1, grain);
  return int(std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads(), by_size)));
#else
  (void)n, (void)grain;
  return 1;
#endif
}

void parallel_chunks(int64_t n, int chunks,
                     const std::function<void(int chunk, int64_t begin, int64_t end)>& body) {
  if (n <= 0) return;
  if (chunks < 1) chunks = 1;
  auto bound = [&](int c) { return n / chunks * c + std::min<int64_t>(c, n % chunks); };
  if (chunks == 1) {
    body(0, 0, n);
    return;
  }
  // An exception must not leave an OpenMP region: keep the first (lowest chunk's) and
  // rethrow it once every chunk is done.
  std::vector<std::exception_ptr> err(static_cast<size_t>(chunks));
#ifdef _OPENMP
#pragma omp parallel for schedule(static, 1) num_threads(chunks)
#endif
  for (int c = 0; c < chunks; ++c) {
    try {
      body(c, bound(c), bound(c + 1));
    } catch (...) {
      err[size_t(c)] = std::current_exception();
    }
  }
  for (const std::exception_ptr& e : err)
    if (e) std::rethrow_exception(e);
}

void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& body,
                  int64_t grain) {
  parallel_chunks(n, parallel_chunk_count(n, grain),
                  [&](int, int64_t begin, int64_t end) { body(begin, end); });
}

void fill_nan(Tensor& t) {
  double* d = t.data.data();
  parallel_for(t.numel(), [&](int64_t b, int64_t e) {
    std::fill(d + b, d + e, std::numeric_limits<double>::quiet_NaN());
  });
}

void to_f32(const Tensor& t, float* dst) {
  const double* s = t.data.data();
  parallel_for(t.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dst[i] = float(s[i]);
  });
}

// __float2half_rn and __float2bfloat16_rn give the canonical NaN 0x7fff; the bit helpers of
// dtype.hpp keep the sign and payload. Every other float rounds identically (checked over all
// 2^32 floats against the host paths of CUDA 13's cuda_fp16.h and cuda_bf16.h).
void to_f16_bits(const Tensor& t, uint16_t* dst) {
  const double* s = t.data.data();
  parallel_for(t.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      dst[i] = std::isnan(s[i]) ? uint16_t(0x7fff) : float_to_half_bits(float(s[i]));
  });
}

void to_bf16_bits(const Tensor& t, uint16_t* dst) {
  const double* s = t.data.data();
  parallel_for(t.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      dst[i] = std::isnan(s[i]) ? uint16_t(0x7fff) : float_to_bf16_bits(float(s[i]));
  });
}

void from_f32(const float* src, size_t n, Tensor& t) {
  double* d = t.data.data();
  parallel_for(int64_t(std::min(n, t.data.size())), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) d[i] = double(src[i]);
  });
}

void from_f16_bits(const uint16_t* src, size_t n, Tensor& t) {
  // A NaN becomes the float 0x7fffffff, as __half2float gives on the host.
  const uint32_t nan_bits = 0x7fffffffu;
  float nan;
  std::memcpy(&nan, &nan_bits, 4);
  double* d = t.data.data();
  parallel_for(int64_t(std::min(n, t.data.size())), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      d[i] = double((src[i] & 0x7fffu) > 0x7c00u ? nan : half_bits_to_float(src[i]));
  });
}

void from_bf16_bits(const uint16_t* src, size_t n, Tensor& t) {
  double* d = t.data.data();
  parallel_for(int64_t(std::min(n, t.data.size())), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) d[i] = double(bf16_bits_to_float(src[i]));
  });
}

}  // namespace ladder
