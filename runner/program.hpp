// What a step program does, shared by every steps/NN_name/main.cpp and `ladder run N`:
// resolve the problem; check it against the step's descriptor (exit 2), the machine's memory
// (exit 2) and the device (exit 3) before anything big is allocated; make or load the inputs;
// run the step on poisoned outputs; check them against the float64 oracle; save all or
// nothing; report (a timing only for a run that passed its check).
#pragma once
#include <cstddef>
#include <string>

#include "check.hpp"
#include "cli.hpp"
#include "npy.hpp"
#include "publish.hpp"
#include "step.hpp"

namespace ladder {

// The problem the options describe, in the step's dtype unless --dtype says otherwise.
// With --load the shapes come from the files' headers (the data is not read yet).
// Throws BadInput.
Problem resolve_problem(const CommonOptions& o, DType default_dtype);

// Checks the options that need no inputs (the --check mode, the shapes, the --save target and
// --save-f64, the --block-mask header against the shape); returns the check mode. Throws
// BadInput.
CheckMode check_options(const CommonOptions& o, const Problem& p);

// Reads q.npy, k.npy, v.npy (and do.npy when p.backward) from dir and the --block-mask file,
// rounds them to p.dtype and checks that every value is finite after rounding and within
// check_input_range(); generates them when there is no --load. Throws BadInput naming the file and
// what was expected.
Inputs obtain_inputs(const CommonOptions& o, const Problem& p);

// Repeats and warm-up defaults per device.
RunOptions resolve_run_options(const Step& s, const CommonOptions& o);

// The --save folder: one that can be published as a whole (check_publish_target: new, or a
// folder that can be written, and its parent too), whose output names are regular files or
// absent (check_save_folder). Throws BadInput.
void check_save_target(const std::string& dir, const std::string& flag);
// A folder of output files (the --save folder, or a `ladder compare --save` step folder): new,
// or a directory whose output names (output_names()) are regular files or absent; a directory,
// FIFO, device or symbolic link there is refused, as --save replaces regular files only.
void check_save_folder(const std::string& dir, const std::string& flag);

// The contract's rule for finite inputs that are too large (docs/CONTRACT.md, "Files"): a
// bound on every intermediate sum of the run (scores, the unnormalised output, the backward's
// dP, dS, dQ, dK, dV) must stay within 1/16 of the accumulator's largest value (float64 for
// fp64, float32 otherwise), and max|V| / (1 - dropout) within the output dtype's. Throws
// BadInput naming the bound; every step program, compare and bench reach it through the runner.
void check_input_range(const Problem& p, const Inputs& in);

// One run as the runner resolved it against the step's descriptor and this machine, once,
// before anything big is allocated: the options run() receives (the variant named, the tiles
// chosen, the device found). run_checked() runs it as it is, checking nothing again.
struct Prepared {
  RunOptions options;
  bool device_checked = false;  // prepare_device() has run (the last half)
};

// The device-free half of prepare() (below): supported (capabilities, variant, the tiles that
// are known without a device, limits), and the host memory. `p` is valid (Problem::validate:
// check_options() or prepare() checked it). Throws BadInput.
Prepared prepare_host(const Step& s, const Problem& p, const RunOptions& ro, CheckMode mode,
                      bool inputs_exist);
// The device half: for a CUDA step, the device is there (NoDevice), suits the step and has the
// memory, and the tiles are chosen for it. Throws BadInput or NoDevice.
Prepared prepare_device(const Step& s, const Problem& p, const Prepared& host);

// Everything that can be known before the inputs exist, in one pass: the problem is valid and
// one the step supports (capabilities, variant, tiles, limits), the host has the memory the run
// and its check need, and, for a CUDA step, a device is there (NoDevice, exit 3), is one the
// step runs on, and has the device memory. Throws BadInput or NoDevice; allocates nothing.
// `inputs_exist`: the inputs are already in memory (do not count them again).
Prepared prepare(const Step& s, const Problem& p, const RunOptions& ro, CheckMode mode,
                 bool inputs_exist = false);

// Host bytes of a run's float64 tensors (inputs unless they exist, outputs, and the check's
// oracle and yardstick outputs) and of the check's scratch (reference/oracle.cpp, plain.cpp).
struct CheckBytes {
  double tensors = 0, scratch = 0;
};
CheckBytes check_host_bytes(const Problem& p, CheckMode mode, bool inputs_exist);
// Throws BadInput naming both figures when `bytes` exceeds 90 % of the available host memory.
void require_host_memory(double bytes, const std::string& what);

// Host bytes a run of s on p needs (inputs, outputs, the check's oracle and yardstick, the
// step's workspace or the device copies) and device bytes for a CUDA step.
double host_bytes_needed(const Step& s, const Problem& p, const RunOptions& ro, CheckMode mode,
                         bool inputs_exist);
double device_bytes_needed(const Step& s, const Problem& p, const RunOptions& ro,
                           const DeviceInfo& dev);

struct CheckedRun {
  Outputs out;
  RunResult result;
  CheckReport check;
};

// Writes o.npy, lse.npy (and dq, dk, dv.npy with backward) to dir, all or none (publish.hpp);
// afterwards the folder's output files are exactly these. Prints what was saved.
void save_outputs(const std::string& dir, const Outputs& out, bool backward, bool as_f64);
// The same, staged into `folder`'s subfolder `sub` ("": the folder itself), for several step
// folders published together.
size_t stage_outputs(FolderPublisher& folder, const std::string& sub, const Outputs& out,
                     bool backward, bool as_f64);
// The output names a save replaces (what a forward-only save removes when stale).
const std::vector<std::string>& output_names();

// Runs a prepared run on poisoned outputs and verifies them. The inputs' values are the
// caller's to check (obtain_inputs() or check_input_range()).
CheckedRun run_checked(const Step& s, const Problem& p, const Inputs& in, const Prepared& run,
                       CheckMode mode);

// The same judged against a reference computed once (reference_for), for several runs of one
// problem and inputs (the harness's variants of a case).
CheckedRun run_judged(const Step& s, const Problem& p, const Inputs& in, const Prepared& run,
                      const Reference& ref);

// The same on caller-owned outputs, for a sweep (ladder bench): `out` is re-poisoned in place
// (Outputs::poison), so points of one size do not allocate (and page in) fresh output tensors
// each time. The outputs are left in `out`; the result's out stays empty.
CheckedRun run_checked(const Step& s, const Problem& p, const Inputs& in, const Prepared& run,
                       CheckMode mode, Outputs& out);

// All in one, for a caller that holds inputs and options: check_input_range(), prepare(), and
// the run above.
CheckedRun run_checked(const Step& s, const Problem& p, const Inputs& in, const RunOptions& ro,
                       CheckMode mode);

// Achieved rates of a run (by the field's FLOP convention, times the block mask's density, and
// compulsory bytes).
double tflops(const Problem& p, double ms, bool backward, double density = 1.0);
double gbps(const Problem& p, double ms, bool backward);

// The whole step program given parsed options; returns the exit status.
int run_step_cli(const Step& s, const CommonOptions& o);

// main() of a step program: steps/NN_name/main.cpp calls it with the step's descriptor.
int step_main(const Step& s, int argc, char** argv);

}  // namespace ladder
