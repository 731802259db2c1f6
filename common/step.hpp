// The step descriptor: what a rung is, what it supports, and how to run it.
// Every step folder defines one `const Step& step_NN()`; the step program, the
// `ladder` driver and the Catch2 harness all work from these descriptors.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "inputs.hpp"
#include "problem.hpp"

namespace ladder {

enum class Device { cpu, cuda };

struct Capabilities {
  std::vector<DType> dtypes;       // the first is the step's default
  std::vector<int64_t> head_dims;  // empty: any dim in [1, max_dim]
  int64_t max_dim = 0;             // 0: no limit (only with empty head_dims)
  bool causal = true, gqa = true, backward = false;
  std::vector<int64_t> backward_head_dims;  // with backward: the dims it covers (empty: all)
  std::string limits;                       // anything else a user should know, in words
};

// A selectable form of the step's algorithm (e.g. step 02's tiled form, step 05's FA1
// loop order). The first variant is the default. `checked` variants run in the harness;
// an unchecked one exists to show a failure (step 01's unshifted exp).
struct Variant {
  std::string name, summary;
  bool checked = true;
  // Where a variant is built for fewer dtypes or head dims than the step (e.g. step 06's
  // teaching variants: bf16, d 64 and 128 only). Empty: everything the step supports.
  std::vector<DType> dtypes = {};
  std::vector<int64_t> head_dims = {};
};

struct RunOptions {
  std::string variant;         // empty: the default
  int repeats = 1;             // timed repetitions (median reported)
  int warmup = 0;              // untimed runs first
  int tile_q = 0, tile_k = 0;  // Br, Bc overrides for tiled steps (0: the step's choice)
  bool verbose = false;
};

struct RunResult {
  double fwd_ms = 0, bwd_ms = 0;  // medians over the timed repetitions (bwd: backward only)
  double workspace_bytes = 0;     // device/host memory beyond inputs and outputs
  std::string config;             // e.g. the tile sizes the step chose
};

// Runs the step: fills `out` (allocated and NaN-poisoned by the caller) with O and LSE, and
// dQ, dK, dV when p.backward. Throws BadInput (exit 2) for unsupported input, NoDevice (3).
using RunFn = std::function<RunResult(const Problem&, const Inputs&, Outputs&, const RunOptions&)>;

struct Step {
  int number = 0;
  std::string name;               // the folder, e.g. "02_online_softmax"
  std::string summary;            // one line: what it adds over the previous step
  std::vector<std::string> adds;  // the ideas it adds over the previous step (kept true by tests)
  Device device = Device::cpu;
  Capabilities caps;
  std::vector<Variant> variants;  // at least one
  RunFn run;

  DType default_dtype() const { return caps.dtypes.front(); }
  // Empty if the step (and, if named, its variant) can run p, ignoring the device; else why
  // not and what is supported.
  std::string unsupported(const Problem& p, const std::string& variant = "") const;
  // Empty if `v` names a variant (or is empty), else the list of variants.
  std::string unknown_variant(const std::string& v) const;
  std::string capabilities_str() const;
  // Whether the backward pass covers head dim d.
  bool backward_supports(int64_t d) const;
  const char* device_name() const { return device == Device::cpu ? "CPU" : "CUDA"; }
};

// Median of timings (copies; fine for the few repeats we take).
double median(std::vector<double> v);

}  // namespace ladder
