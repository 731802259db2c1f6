// Step 00 — CPU reference (float64, Eigen), as a ladder step.
// Adds: matrix-form forward; LSE; backward dQ dK dV; bottom-right causal mask; GQA.
//
// The oracle run on its own, so its outputs can be saved, compared and timed like any
// rung's. The algorithm is in reference.cpp; plain.cpp holds the same-precision
// computation whose error sets the harness's tolerance.
#include "reference.hpp"
#include "step.hpp"
#include "timing.hpp"

namespace ladder {

const Step& step_00() {
  static const Step s = [] {
    Step s;
    s.number = 0;
    s.name = "00_cpu_reference";
    s.summary = "the oracle: S = scale*QK^T, safe softmax, O = PV, LSE; backward dQ dK dV (Eigen)";
    s.adds = {"matrix-form forward", "LSE", "backward dQ dK dV", "bottom-right causal mask", "GQA"};
    s.device = Device::cpu;
    s.caps.dtypes = {DType::f64};
    s.caps.backward = true;
    s.caps.limits = "float64 on the CPU; memory 256 x seq_k scratch per block of rows";
    s.variants = {{"eigen", "S, P as Eigen matrices, 256 query rows at a time", true}};
    s.run = [](const Problem& p, const Inputs& in, Outputs& out, const RunOptions& opt) {
      RunResult r;
      // Forward and backward are one computation here; time the whole and report it as
      // forward (and backward = the extra time of the gradient pass).
      Problem fwd = p;
      fwd.backward = false;
      r.fwd_ms = time_cpu_ms([&] { reference::attention(fwd, in, out); }, opt.repeats, opt.warmup);
      if (p.backward) {
        const double all_ms =
            time_cpu_ms([&] { reference::attention(p, in, out); }, opt.repeats, 0);
        r.bwd_ms = std::max(all_ms - r.fwd_ms, 0.0);
      }
      r.workspace_bytes = 2.0 * 256 * double(p.seq_k) * 8;  // S and P for one block of rows
      return r;
    };
    return s;
  }();
  return s;
}

}  // namespace ladder
