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
  // An explicit block mask shared by every batch and head: one string of '0'/'1' per query
  // block (p.sparsity.kind is then `file`, its block p.sparsity.block_q x block_k). Empty: the
  // problem's own (none, or a generated random/local mask).
  std::vector<std::string> mask_rows = {};
  // What the case exercises, in one line (a failing run names it: "seq_k = 1: ...").
  std::string exercises = {};
  // A case at the sizes people run (tens of thousands of keys): GPU rungs only, checked in
  // --check auto (sampled where the oracle's full pass would take minutes).
  bool at_scale = false;
  // Forward only even where the step has a backward: a sampled backward check costs one
  // forward pass of the float64 oracle over every row (minutes at 16k x 16k).
  bool forward_only = false;
};

// The inputs of a case: generated from its problem, with its explicit mask if it has one.
Inputs case_inputs(const Case& c, const Problem& p);

const std::vector<Case>& shared_cases();

}  // namespace ladder
