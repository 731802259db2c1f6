// Every rung's descriptor, one function per step folder (steps/NN_name/). The step's own
// main.cpp and the `ladder` driver's table of rungs (tools/rungs.cpp) use these.
#pragma once
#include "step.hpp"

namespace ladder {

const Step& step_00();  // steps/00_cpu_reference
const Step& step_01();  // steps/01_three_pass_softmax
const Step& step_02();  // steps/02_online_softmax
const Step& step_03();  // steps/03_naive_cuda          (CUDA)
const Step& step_04();  // steps/04_thread_per_row      (CUDA)
const Step& step_05();  // steps/05_shared_memory_fa2   (CUDA)
const Step& step_06();  // steps/06_tensor_core_fa2     (CUDA)
const Step& step_07();  // steps/07_wgmma_tma_fa3       (CUDA, sm_90a)

}  // namespace ladder
