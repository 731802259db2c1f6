// Errors that end a step program with the exit status LADDER.md promises:
// 2 for bad or unsupported input, 3 for a GPU step with no CUDA device.
#pragma once
#include <stdexcept>
#include <string>

namespace ladder {

enum ExitCode { kExitOk = 0, kExitCheckFailed = 1, kExitBadInput = 2, kExitNoDevice = 3 };

// Bad or unsupported input: the message says what is accepted.
struct BadInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A GPU step was asked to run where no CUDA device is visible.
struct NoDevice : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace ladder
