// The one host tensor type: a shape and row-major float64 storage. Inputs hold
// values already rounded to the run's dtype; outputs are poisoned with NaN
// before a step runs, so an element a step forgets to write fails the check.
#pragma once
#include <cstdint>
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
  std::string shape_str() const;
};

// Copies to float32 (for fp32 steps) / back from a float32 buffer.
std::vector<float> to_float(const Tensor& t);

}  // namespace ladder
