// Errors that end a step program with the exit status docs/CONTRACT.md promises:
// 2 for bad or unsupported input, 3 for a GPU step with no CUDA device.
#pragma once
#include <exception>
#include <iostream>
#include <new>
#include <stdexcept>
#include <string>

#include "memory.hpp"

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

// Runs fn() (which returns an exit status) and turns an exception into the status it stands
// for, with its message on stderr: BadInput 2, NoDevice 3, an allocation that failed (more
// memory than the machine or `ulimit` gives, which the estimate did not foresee) 2 naming the
// memory, anything else (a CUDA failure or another bug: no result to trust) 1. Every step
// program and every `ladder` verb ends here.
template <class Fn>
int guarded(Fn&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    std::cerr << "error: " << out_of_memory_message() << "\n";
    return kExitBadInput;
  } catch (const BadInput& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const NoDevice& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitNoDevice;
  } catch (const std::exception& e) {
    std::cerr << "error: the run failed: " << e.what() << "\n";
    return kExitCheckFailed;
  }
}

}  // namespace ladder
