// The table of rungs: one line per step folder, in ladder order. A new rung adds its line here
// and its descriptor's declaration to steps/steps.hpp. LADDER_HAS_STEP_NN comes with the step's
// library (steps/CMakeLists.txt), so a step this build left out is listed with the reason.
#include "rungs.hpp"

#include "steps.hpp"

namespace ladder {

namespace {
[[maybe_unused]] const char* why_not_built(bool cuda, bool sm90a) {
#ifndef LADDER_HAVE_CUDA
  if (cuda) return "not built: no CUDA toolkit was found at configure time";
#endif
#ifndef LADDER_HAVE_SM90A
  if (sm90a) return "not built: its sm_90a target needs nvcc 12.0 or newer";
#endif
  (void)cuda, (void)sm90a;
  return "not built: left out of this build (LADDER_ONLY_STEPS)";
}
}  // namespace

const std::vector<Rung>& rungs() {
  static const std::vector<Rung> table = {
#ifdef LADDER_HAS_STEP_00
      {0, "00_cpu_reference", &step_00(), ""},
#else
      {0, "00_cpu_reference", nullptr, why_not_built(false, false)},
#endif
#ifdef LADDER_HAS_STEP_01
      {1, "01_three_pass_softmax", &step_01(), ""},
#else
      {1, "01_three_pass_softmax", nullptr, why_not_built(false, false)},
#endif
#ifdef LADDER_HAS_STEP_02
      {2, "02_online_softmax", &step_02(), ""},
#else
      {2, "02_online_softmax", nullptr, why_not_built(false, false)},
#endif
#ifdef LADDER_HAS_STEP_03
      {3, "03_naive_cuda", &step_03(), ""},
#else
      {3, "03_naive_cuda", nullptr, why_not_built(true, false)},
#endif
#ifdef LADDER_HAS_STEP_04
      {4, "04_thread_per_row", &step_04(), ""},
#else
      {4, "04_thread_per_row", nullptr, why_not_built(true, false)},
#endif
#ifdef LADDER_HAS_STEP_05
      {5, "05_shared_memory_fa2", &step_05(), ""},
#else
      {5, "05_shared_memory_fa2", nullptr, why_not_built(true, false)},
#endif
#ifdef LADDER_HAS_STEP_06
      {6, "06_tensor_core_fa2", &step_06(), ""},
#else
      {6, "06_tensor_core_fa2", nullptr, why_not_built(true, false)},
#endif
#ifdef LADDER_HAS_STEP_07
      {7, "07_wgmma_tma_fa3", &step_07(), ""},
#else
      {7, "07_wgmma_tma_fa3", nullptr, why_not_built(true, true)},
#endif
  };
  return table;
}

const Step* find_step(int number) {
  for (const Rung& r : rungs())
    if (r.number == number) return r.step;
  return nullptr;
}

}  // namespace ladder
