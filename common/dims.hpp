// What a CUDA step's kernels are compiled for, as compile-time data. Its kernels are templates
// on the head dim; the step's capability table (steps/NN_name/capabilities.hpp) names those
// dims once, as a Dims<...> type, and its descriptor (a list), its launches (a template argument
// per dim) and the PyTorch adaptor (python/csrc) all read that one list. Plain C++: nvcc, and
// g++ without CUDA, include it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace ladder {

template <int... Ds>
struct Dims {
  static constexpr int values[sizeof...(Ds)] = {Ds...};
  static constexpr size_t size = sizeof...(Ds);
  static std::vector<int64_t> list() { return {Ds...}; }
  static std::string str() {  // "64, 128"
    std::string s;
    for (int d : values) s += (s.empty() ? "" : ", ") + std::to_string(d);
    return s;
  }
  static constexpr bool has(int64_t d) { return ((d == Ds) || ...); }
  // Calls f(std::integral_constant<int, D>()) for every listed D, in order.
  template <class F>
  static void for_each(F&& f) {
    (f(std::integral_constant<int, Ds>()), ...);
  }
  // Calls f(std::integral_constant<int, D>()) for the listed D equal to d: the instantiation
  // for d. False (and no call) when d is not listed.
  template <class F>
  static bool dispatch(int64_t d, F&& f) {
    return ((d == Ds && (f(std::integral_constant<int, Ds>()), true)) || ...);
  }
};

// The limits of the grid kernels of steps 05 to 07: batch on grid.z and heads on grid.y (at
// most 65535 blocks each), and 32-bit row indices (sequences up to 2^30).
struct GridLimits {
  int64_t batch, heads, seq;
};
inline constexpr GridLimits kGridLimits{65535, 65535, int64_t(1) << 30};

}  // namespace ladder
