// The one host tensor type: a shape and row-major float64 storage. Inputs hold
// values already rounded to the run's dtype; outputs are poisoned with NaN
// before a step runs, so an element a step forgets to write fails the check.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace ladder {

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<double> data;

  Tensor() = default;
  explicit Tensor(std::vector<int64_t> s, double fill = 0.0) : shape(std::move(s)) {
    data.assign(size_t(numel(shape)), fill);
  }
  static Tensor poisoned(std::vector<int64_t> s) {
    return Tensor(std::move(s), std::numeric_limits<double>::quiet_NaN());
  }
  static int64_t numel(const std::vector<int64_t>& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
  }
  int64_t numel() const { return int64_t(data.size()); }
  bool empty() const { return data.empty(); }
  std::string shape_str() const;  // "[2, 8, 113, 64]"
};

// A shape as "[2, 8, 113, 64]" (messages and reports).
std::string shape_str(const std::vector<int64_t>& shape);

// Copies to float32 (for fp32 steps) / back from a float32 buffer.
std::vector<float> to_float(const Tensor& t);

// Every element NaN again, in place (the shape and the storage stay).
void fill_nan(Tensor& t);

// The host <-> device element conversions of the GPU steps (common/cuda_util.cuh), here in
// plain C++ so that they run on OpenMP threads. to_*: dst holds t.numel() elements, each the
// value rounded to nearest even, as float(x) then __float2half_rn / __float2bfloat16_rn give
// (NaN: the canonical 0x7fff). from_*: writes the first min(n, t.numel()) elements of t, as
// double(float(x)) does for float, __half and __nv_bfloat16 x.
void to_f32(const Tensor& t, float* dst);
void to_f16_bits(const Tensor& t, uint16_t* dst);
void to_bf16_bits(const Tensor& t, uint16_t* dst);
void from_f32(const float* src, size_t n, Tensor& t);
void from_f16_bits(const uint16_t* src, size_t n, Tensor& t);
void from_bf16_bits(const uint16_t* src, size_t n, Tensor& t);

// ------------------------------------------------------------- host loops over big tensors
// With OpenMP (found at configure time, common/CMakeLists.txt) these run on OMP_NUM_THREADS
// threads; without, serially. Only common/tensor.cpp is compiled with OpenMP.

// The threads the loops below may use, and a lower cap on them (memory.cpp: one thread under
// an address-space limit).
int max_threads();
void limit_threads(int n);

// Items per chunk below which splitting does not pay (element-wise loops).
constexpr int64_t kParallelGrain = int64_t(1) << 16;

// How many chunks to split n items into: the thread count, fewer so that each chunk has at
// least `grain` items; 1 without OpenMP.
int parallel_chunk_count(int64_t n, int64_t grain = kParallelGrain);

// Runs body(chunk, begin, end) for each of `chunks` contiguous pieces of [0, n), in parallel.
// Chunk c covers indices below those of chunk c + 1, so partial results merged in chunk order
// give exactly what one serial pass gives. An exception thrown by a chunk is rethrown here.
void parallel_chunks(int64_t n, int chunks,
                     const std::function<void(int chunk, int64_t begin, int64_t end)>& body);

// body(begin, end) over pieces of [0, n), for loops whose iterations are independent.
void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& body,
                  int64_t grain = kParallelGrain);

}  // namespace ladder
