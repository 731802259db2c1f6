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
  // A sampled check's tensors are compact: axis 2 holds these rows (or keys), in this order.
  std::vector<int64_t> sampled;
  std::string at(int64_t flat) const;  // "[b, h, i, c]" in the full tensor's coordinates
};

struct CheckReport {
  std::vector<TensorCheck> tensors;
  bool pass = true;
  std::string mode;             // "full" or "sampled: N rows per head"
  std::string summary() const;  // one line per tensor
  std::string first_failure() const;
};

enum class CheckMode { automatic, full, sampled, none };
// auto, full, sampled, none; or sampled:SEED, which fixes the draw of the sampled rows for the
// rest of the process (a report prints its draw, so a failure can be repeated).
bool parse_check_mode(const std::string& s, CheckMode& out);

// Query rows per head (and key rows per K/V head) that a sampled check compares.
inline constexpr int64_t kSampled = 16;

// Checks `got` (a run of problem p in p.dtype) against the oracle. automatic: full when the
// oracle's cost is small (< 4 GFLOP), else sampled: kSampled query rows per head (O, LSE, dQ)
// and, with the backward, kSampled key rows per K/V head (dK, dV, from one forward pass of the
// oracle over every row), drawn afresh; every element scanned for NaN and Inf; and the
// gradient sums that need no oracle (sum_j dK_j = 0; sum_j dV_j = sum_i dO_i over the rows
// that see a key, without dropout).
CheckReport verify(const Problem& p, const Inputs& in, const Outputs& got,
                   CheckMode mode = CheckMode::automatic);

// verify() in two halves, for judging several outputs of one problem (the mutant corpus):
// the oracle's and the yardstick's outputs are computed once, then each candidate is judged.
struct Reference {
  bool checked = false, sampled = false;
  std::string mode;
  uint64_t draw = 0;          // the seed of the sampled rows (--check sampled:DRAW repeats them)
  std::vector<int64_t> rows;  // sampled query rows
  std::vector<int64_t> keys;  // sampled key rows (with the backward)
  Outputs ref, plain;  // the oracle's and the yardstick's outputs (sampled: those rows and keys)
  double cancel = 0;   // the cancellation term of dQ and dK's floor
  Outputs sampled_outputs(const Problem& p) const;  // NaN, laid out as ref
};
Reference reference_for(const Problem& p, const Inputs& in, CheckMode mode);
CheckReport judge(const Problem& p, const Inputs& in, const Outputs& got, const Reference& r);

// The largest |x| of a tensor (chunks in parallel; the max does not depend on the order).
double max_abs(const Tensor& t);

// Flat index -> "[b, h, i, c]" for error messages.
std::string index_str(const std::vector<int64_t>& shape, int64_t flat);

}  // namespace ladder
