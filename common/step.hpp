// The step descriptor: what a rung is and what it supports, in one place. Every step folder
// defines one `const Step& step_NN()` (declared in steps/steps.hpp), written with StepBuilder
// (below) as a list of the step's facts. The step program, the `ladder` driver, `--help`,
// `ladder list` and the Catch2 harness all read it; the runner (runner/program.*) resolves a
// problem against it once, before anything is allocated (Step::resolve: the variant, the tiles,
// the limits), so a step's run() receives a problem it supports and the options it resolved,
// and checks neither again.
#pragma once
#include <cstddef>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "device.hpp"
#include "dims.hpp"
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
  bool dropout = false;                     // --dropout P
  bool block_sparse = false;                // --block-mask / --block-sparsity
  // Limits of the step's index arithmetic and launch grid (0: only the contract's limits).
  int64_t max_batch = 0, max_heads = 0, max_seq = 0;
  // CUDA: the compute capabilities it runs on, e.g. 90 and 90 for sm_90a code (which runs on
  // sm_90 alone); 0: any.
  int min_cc = 0, max_cc = 0;
  std::string limits;  // anything else a user should know, in words (tiles, workspace)
};

// A selectable form of the step's algorithm (e.g. step 02's tiled form, step 05's FA1 loop
// order). The first variant is the default. `checked` variants run in the harness; an
// unchecked one exists to show a failure (step 01's unshifted exp).
struct Variant {
  std::string name, summary;
  bool checked = true;
  // Where a variant is built for fewer dtypes or head dims than the step (e.g. step 06's
  // teaching variants: bf16, d 64 and 128 only). Empty: everything the step supports.
  std::vector<DType> dtypes = {};
  std::vector<int64_t> head_dims = {};
  // False where a variant lacks a feature the step has (its backward pass, dropout, block
  // masks): only some forms of the algorithm are built with it.
  bool backward = true, dropout = true, block_sparse = true;
};

struct RunOptions {
  std::string variant;         // empty: the default; the runner resolves it before run()
  int repeats = 1;             // timed repetitions (median reported)
  int warmup = 0;              // untimed runs first
  int tile_q = 0, tile_k = 0;  // Br, Bc: 0 asks for the step's choice; run() sees the choice
  bool verbose = false;
  DeviceInfo device;  // the device the runner checked the run against (empty for a CPU step)
};

// The tiles (Br query rows, Bc keys) a run uses; 0 for an untiled step.
struct Tiles {
  int q = 0, k = 0;
};

struct RunResult {
  double fwd_ms = 0, bwd_ms = 0;  // medians over the timed repetitions (bwd: backward only)
  double workspace_bytes = 0;     // device/host memory beyond inputs and outputs
  std::string config;             // e.g. the tile sizes the step chose
};

// Runs the step on a problem the descriptor supports: fills `out` (allocated and NaN-poisoned
// by the caller) with O and LSE, and dQ, dK, dV when p.backward. Throws NoDevice (exit 3) only
// for a device that disappeared; anything else it throws is a failure of the run.
using RunFn = std::function<RunResult(const Problem&, const Inputs&, Outputs&, const RunOptions&)>;

struct Step {
  int number = 0;
  std::string name;               // the folder, e.g. "02_online_softmax"
  std::string summary;            // one line: what it adds over the previous step
  std::vector<std::string> adds;  // the ideas it adds over the previous step (kept true by tests)
  Device device = Device::cpu;
  Capabilities caps;
  std::vector<Variant> variants;  // at least one
  // The tiles a run uses, given the options (--tile-q/--tile-k: 0 = the step's choice) and the
  // device. Throws BadInput naming what the step accepts. Unset: an untiled step, whose
  // tile flags must be 0.
  std::function<Tiles(const Problem&, const RunOptions&, const DeviceInfo&)> tiles;
  // Bytes of memory beyond the inputs and outputs a run needs (host memory for a CPU step,
  // device memory for a CUDA step), checked against what is free before anything is
  // allocated. Unset: none.
  std::function<double(const Problem&, const RunOptions&)> workspace;
  RunFn run;

  DType default_dtype() const { return caps.dtypes.front(); }
  const Variant* find_variant(const std::string& v) const;  // empty: the default
  // The options a run of p uses on `dev`: the variant named, the tiles chosen by tiles() and
  // checked against the mask block, the device recorded. With DeviceInfo{} (no device yet), as
  // far as the step can tell without one (a rule that reads the device's shared memory leaves
  // its tile at 0). Throws BadInput naming what is supported.
  RunOptions resolve(const Problem& p, const RunOptions& o, const DeviceInfo& dev) const;
  // Empty if the step (and its variant and tile options) can run p on some machine; else why
  // not: resolve()'s message without a device.
  std::string unsupported(const Problem& p, const RunOptions& o = {}) const;
  // Empty if the step's code runs on this device (its compute capability), else why not.
  std::string wrong_device(const DeviceInfo& dev) const;
  std::string capabilities_str() const;
  // Whether the backward pass covers head dim d.
  bool backward_supports(int64_t d) const;
  const char* device_name() const { return device == Device::cpu ? "CPU" : "CUDA"; }
};

// Builds a descriptor as the list of the step's facts, each named once:
//
//   static const Step s = StepBuilder(2, "02_online_softmax", Device::cpu, "one-line summary")
//                             .adds({...}).dtypes({DType::f32}).dropout().block_sparse()
//                             .variants({...}).run(run);
//
// What a fact leaves unnamed keeps Capabilities' default (causal and GQA on; no backward,
// dropout or block masks; no limits beyond the contract's).
class StepBuilder {
 public:
  // The step's number, folder name, device and one-line summary.
  StepBuilder(int number, std::string name, Device device, std::string summary);
  StepBuilder& adds(std::vector<std::string> ideas);
  StepBuilder& dtypes(std::vector<DType> ts);  // the first is the default
  template <size_t N>
  StepBuilder& dtypes(const DType (&ts)[N]) {
    return dtypes(std::vector<DType>(std::begin(ts), std::end(ts)));
  }
  StepBuilder& head_dims(std::vector<int64_t> dims);
  template <int... Ds>
  StepBuilder& head_dims(Dims<Ds...>) {
    return head_dims(Dims<Ds...>::list());
  }
  StepBuilder& max_dim(int64_t d);
  // A backward pass, for every head dim of the forward or for `dims` only.
  StepBuilder& backward(std::vector<int64_t> dims = {});
  template <int... Ds>
  StepBuilder& backward(Dims<Ds...>) {
    return backward(Dims<Ds...>::list());
  }
  StepBuilder& dropout();
  StepBuilder& block_sparse();
  StepBuilder& max_sizes(int64_t batch, int64_t heads, int64_t seq);
  StepBuilder& max_sizes(const GridLimits& l) { return max_sizes(l.batch, l.heads, l.seq); }
  StepBuilder& compute_capability(int min_cc, int max_cc);
  StepBuilder& limits(std::string words);
  StepBuilder& variants(std::vector<Variant> vs);
  StepBuilder& tiles(std::function<Tiles(const Problem&, const RunOptions&, const DeviceInfo&)> f);
  StepBuilder& workspace(std::function<double(const Problem&, const RunOptions&)> f);
  StepBuilder& run(RunFn f);
  operator Step() const { return step_; }

 private:
  Step step_;
};

// Median of timings (copies; fine for the few repeats we take).
double median(std::vector<double> v);

}  // namespace ladder
