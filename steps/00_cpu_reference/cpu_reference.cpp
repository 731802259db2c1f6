// Step 00 — CPU reference (float64, Eigen), as a ladder step.
// Adds: matrix-form forward; LSE; backward dQ dK dV; bottom-right causal mask; GQA; block-sparse
// masks; dropout.
//
// The oracle run on its own, so that its outputs can be saved, compared and timed like any
// rung's. Its algorithm is reference/oracle.cpp: the same code the checker (runner/check.cpp)
// holds every other step to, kept outside steps/ so that the checker never depends on a
// step. In matrix form, for each (batch, head), Q_h, K_h, V_h:
//   S = scale Q K^T;  P = softmax(S) over the visible keys of each row (max-shifted);
//   Pd = P o Z / (1 - p) (dropout);  O = Pd V;  LSE = m + log l.
//   dV = Pd^T dO;  dP = (dO V^T) o Z / (1 - p);  D = rowsum(dO o O);  dS = P o (dP - D);
//   dQ = scale dS K;  dK = scale dS^T Q (summed over a GQA group's query heads).
// reference/plain.cpp holds the same-precision loop whose error sets the harness's tolerance.
// What the next step (01) does: the same forward in float32, one row at a time, with softmax
// written out as the three passes a first implementation uses.
#include <algorithm>

#include "oracle.hpp"
#include "step.hpp"
#include "steps.hpp"
#include "timing.hpp"

namespace ladder {

const Step& step_00() {
  static const Step s =
      StepBuilder(
          0, "00_cpu_reference", Device::cpu,
          "the oracle: S = scale*QK^T, safe softmax, O = PV, LSE; backward dQ dK dV (Eigen)")
          .adds({"matrix-form forward", "LSE", "backward dQ dK dV", "bottom-right causal mask",
                 "GQA", "block-sparse masks", "dropout"})
          .dtypes({DType::f64})
          .backward()
          .dropout()
          .block_sparse()
          .limits("float64 on the CPU; scratch S and P for 256 query rows at a time")
          .variants({{"eigen", "S, P as Eigen matrices, 256 query rows at a time", true}})
          .workspace([](const Problem& p, const RunOptions&) {
            // S, P and the dropout mask for one block of up to 256 rows (fewer when seq_q is short)
            return 3.0 * std::min<double>(256, double(p.seq_q)) * double(p.seq_k) * 8;
          })
          .run([](const Problem& p, const Inputs& in, Outputs& out, const RunOptions& opt) {
            RunResult r;
            // Forward and backward are one computation here; time the whole and report it as
            // forward (and backward = the extra time of the gradient pass).
            Problem fwd = p;
            fwd.backward = false;
            r.fwd_ms =
                time_cpu_ms([&] { reference::attention(fwd, in, out); }, opt.repeats, opt.warmup);
            if (p.backward) {
              const double all_ms =
                  time_cpu_ms([&] { reference::attention(p, in, out); }, opt.repeats, 0);
              r.bwd_ms = std::max(all_ms - r.fwd_ms, 0.0);
            }
            r.workspace_bytes = 3.0 * std::min<double>(256, double(p.seq_q)) * double(p.seq_k) * 8;
            return r;
          });
  return s;
}

}  // namespace ladder
