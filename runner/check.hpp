// Checking a step's outputs against the float64 oracle with the harness's rule
// (docs/CONTRACT.md, "The harness"): a tensor passes when its error vs float64 is at most 2x (3x
// for gradients) the error of the yardstick — a correct kernel of the step's precision class
// (reference/plain.cpp) — vs float64, plus one unit roundoff of the output's scale (fp32's for
// LSE, which every rung below fp64 stores in fp32). NaN/Inf where the oracle is finite fail;
// a sampled check still scans every output element for them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "inputs.hpp"
#include "problem.hpp"

namespace ladder {

struct ErrorStats {
  double max_abs = 0;      // max |got - ref| over finite reference elements
  double max_rel = 0;      // max_abs / max |ref|
  double ref_max = 0;      // max |ref| over finite elements
  int64_t where = -1;      // flat index of max_abs
  int64_t bad = 0;         // non-finite where the reference is finite, or a wrong infinity/NaN
  int64_t first_bad = -1;  // flat index of the first such element
};

// Compares got with ref elementwise.
ErrorStats compare(const std::vector<double>& got, const std::vector<double>& ref);

struct TensorCheck {
  std::string name;  // O, LSE, dQ, dK, dV
  std::vector<int64_t> shape;
  ErrorStats step;   // the step vs float64
  ErrorStats plain;  // the plain same-precision computation vs float64
  double factor = 2, floor = 0, tol = 0;
  bool pass = false;
};

struct CheckReport {
  std::vector<TensorCheck> tensors;
  bool pass = true;
  std::string mode;             // "full" or "sampled: N rows per head"
  std::string summary() const;  // one line per tensor
  std::string first_failure() const;
};

enum class CheckMode { automatic, full, sampled, none };
bool parse_check_mode(const std::string& s, CheckMode& out);

// Checks `got` (a run of problem p in p.dtype) against the oracle. automatic: full when the
// oracle's cost is small (< 4 GFLOP), else sampled query rows (O, LSE, dQ only).
CheckReport verify(const Problem& p, const Inputs& in, const Outputs& got,
                   CheckMode mode = CheckMode::automatic);

// verify() in two halves, for judging several outputs of one problem (the mutant corpus):
// the oracle's and the yardstick's outputs are computed once, then each candidate is judged.
struct Reference {
  bool checked = false, sampled = false;
  std::string mode;
  std::vector<int64_t> rows;  // sampled query rows
  Outputs ref, plain;         // the oracle's and the yardstick's outputs (sampled rows only)
  double cancel = 0;          // the cancellation term of dQ and dK's floor
  Outputs sampled_outputs(const Problem& p, int64_t seq_q) const;  // NaN, laid out as ref
};
Reference reference_for(const Problem& p, const Inputs& in, CheckMode mode);
CheckReport judge(const Problem& p, const Inputs& in, const Outputs& got, const Reference& r);

// The largest |x| of a tensor (chunks in parallel; the max does not depend on the order).
double max_abs(const Tensor& t);

// Flat index -> "[b, h, i, c]" for error messages.
std::string index_str(const std::vector<int64_t>& shape, int64_t flat);

}  // namespace ladder
