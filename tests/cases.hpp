// The one named list of test cases every step is checked on (docs/CONTRACT.md, "The harness").
// A case fixes shapes, mask, scale and input kind; the harness runs it in each dtype the
// step supports, with the backward pass when the step has one, and skips (naming the
// reason) what the step does not support.
#pragma once
#include <string>
#include <vector>

#include "inputs.hpp"
#include "problem.hpp"

namespace ladder {

struct Case {
  std::string name;
  Problem p;  // dtype and backward are set per step by the harness
  InputKind kind = InputKind::normal;
};

const std::vector<Case>& shared_cases();

}  // namespace ladder
