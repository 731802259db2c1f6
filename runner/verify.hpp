// `ladder verify`: judge outputs computed anywhere (a Triton kernel, a student's CUDA file,
// another library) by the harness's rule (docs/CONTRACT.md, "The harness"). It reads the
// inputs (--load DIR: q.npy, k.npy, v.npy, do.npy), the outputs (--outputs DIR: o.npy,
// lse.npy, and dq.npy, dk.npy, dv.npy for a backward pass) and the problem's flags, checks the
// outputs against the float64 oracle with the yardstick of the precision they were computed
// in (--dtype), and prints the same error/tolerance table and exit status as a rung's run.
#pragma once
#include <string>

#include "cli.hpp"

namespace ladder {

// Loads, checks and reports; returns the exit status (0 pass, 1 fail, 2 bad input). Throws
// BadInput for bad input (the caller maps it to 2).
int verify_outputs_cli(const CommonOptions& o, const std::string& outputs_dir);

// The flags of the shared command line that `ladder verify` has no use for (they time, save,
// generate or pick a variant); it refuses them when given.
const std::vector<std::string>& verify_unused_flags();

}  // namespace ladder
