// What a step program does, shared by every steps/NN_* binary and `ladder run N`:
// resolve the problem, make or load the inputs, run the step on poisoned outputs,
// check against the float64 oracle, save all-or-nothing, report.
#pragma once
#include <cstddef>
#include <string>

#include "check.hpp"
#include "cli.hpp"
#include "step.hpp"

namespace ladder {

// The problem the options describe, in the step's dtype unless --dtype says otherwise.
// With --load the shapes come from the files. Throws BadInput.
Problem resolve_problem(const CommonOptions& o, DType default_dtype);

// Reads q.npy, k.npy, v.npy (and do.npy when p.backward) from dir, checks that they agree,
// and sets p's shapes from them. Throws BadInput naming the file and what was expected.
Inputs load_inputs(const std::string& dir, Problem& p);

// The inputs for p: loaded (then rounded to p.dtype) or generated.
Inputs obtain_inputs(const CommonOptions& o, Problem& p);

// Checks the options that need no inputs (the --check mode, the shapes unless loaded, tile
// overrides, the --save target); returns the check mode. Throws BadInput.
CheckMode check_options(const CommonOptions& o, const Problem& p);

// Repeats and warm-up defaults per device.
RunOptions resolve_run_options(const Step& s, const CommonOptions& o);

struct CheckedRun {
  Outputs out;
  RunResult result;
  CheckReport check;
};

// Throws BadInput unless the step has `variant` (empty: the default) and it can run p.
void require_runnable(const Step& s, const Problem& p, const std::string& variant);

// Writes o.npy, lse.npy (and dq, dk, dv.npy with backward) to dir, all or none; returns how many.
size_t save_outputs(const std::string& dir, const Outputs& out, bool backward, bool as_f64);

// Checks the step supports p (BadInput if not), runs it on poisoned outputs and verifies.
CheckedRun run_checked(const Step& s, const Problem& p, const Inputs& in, const RunOptions& ro,
                       CheckMode mode);

// The same on caller-owned outputs, for a sweep (ladder bench): `out` is re-poisoned in place
// (Outputs::poison), so points of one size do not allocate (and page in) fresh output tensors
// each time. The outputs are left in `out`; the result's out stays empty.
CheckedRun run_checked(const Step& s, const Problem& p, const Inputs& in, const RunOptions& ro,
                       CheckMode mode, Outputs& out);

// Achieved rates of a run (by the field's FLOP convention and compulsory bytes).
double tflops(const Problem& p, double ms, bool backward);
double gbps(const Problem& p, double ms, bool backward);

// The whole step program given parsed options; returns the exit status.
int run_step_cli(const Step& s, const CommonOptions& o);

// main() of a step program.
int step_main(const Step& s, int argc, char** argv);

}  // namespace ladder
