// Exercise mode (tools/exercise.py): a learner's copy of a step has each marked region
// replaced by its hint and LADDER_TODO("region"). Reaching one fails clearly: host code
// throws NotImplemented (the run reports it and exits 1); device code traps, which the
// run reports as a failed launch naming the exercise build.
#pragma once
#include <stdexcept>
#include <string>

namespace ladder {

struct NotImplemented : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace ladder

#if defined(__CUDA_ARCH__)
#define LADDER_TODO(region) __trap()
#else
#define LADDER_TODO(region)                                                                     \
  throw ::ladder::NotImplemented(std::string("not implemented: exercise region '") + (region) + \
                                 "' in " + __FILE__ + " (see the hint above it)")
#endif
