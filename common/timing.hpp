// Host wall-clock timing for the CPU rungs (GPU rungs use CUDA events, cuda_util.cuh).
#pragma once
#include <chrono>
#include <vector>

#include "step.hpp"

namespace ladder {

class CpuTimer {
 public:
  void start() { t0_ = std::chrono::steady_clock::now(); }
  double stop_ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_)
        .count();
  }

 private:
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

// Runs fn() warmup times untimed, then repeats times timed; returns the median in ms.
template <class Fn>
double time_cpu_ms(Fn&& fn, int repeats, int warmup = 0) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < (repeats < 1 ? 1 : repeats); ++i) {
    CpuTimer t;
    t.start();
    fn();
    ms.push_back(t.stop_ms());
  }
  return median(ms);
}

}  // namespace ladder
