// The one Catch2 harness: runs every shared case a step supports, in every dtype and
// checked variant it has, against the float64 oracle with the contract's rule
// (docs/CONTRACT.md, "The harness"), and names each case it does not run and why.
//   harness --step NN [--at-scale-only] [catch2 options]
// Exit 77 (ctest: skipped) when the step needs a CUDA device and none is present.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>

#include "cases.hpp"
#include "device.hpp"
#include "error.hpp"
#include "exercise.hpp"
#include "program.hpp"
#include "rungs.hpp"
#include "report.hpp"

namespace {
const ladder::Step* g_step = nullptr;
bool g_at_scale_only = false;  // --at-scale-only: the cases at scale alone (fault.rescale.NN)
constexpr int kSkipped = 77;

// One run of a shared case: the case in one dtype and one checked variant, resolved against the
// step's descriptor once (its device half runs in the run's section).
struct Job {
  std::string label;
  ladder::Problem p;
  const ladder::Case* c;
  ladder::Prepared host;
};

// The step's runs of the shared cases, and the cases and variants it does not run, with why:
// worked out once, as Catch2 enters the test case once per section.
struct Plan {
  std::vector<Job> jobs;
  std::vector<std::string> not_run;
};

// A case at scale is checked in auto mode (sampled where the full oracle would take minutes);
// every other case in full.
ladder::CheckMode check_mode(const ladder::Case& c) {
  return c.at_scale ? ladder::CheckMode::automatic : ladder::CheckMode::full;
}

// The inputs and the oracle's reference of one case in one dtype, computed once for all the
// variants that run it (jobs come case by case, dtype by dtype).
struct CaseReference {
  std::string key;
  ladder::Inputs in;
  ladder::Reference ref;
};
const CaseReference& reference_of(const Job& j) {
  using namespace ladder;
  static CaseReference cached;
  const std::string key = j.c->name + " " + dtype_name(j.p.dtype) + (j.p.backward ? " bwd" : "");
  if (cached.key != key) {
    cached = CaseReference{};  // free the last case's tensors first
    cached.in = case_inputs(*j.c, j.p);
    check_input_range(j.p, cached.in);
    cached.ref = reference_for(j.p, cached.in, check_mode(*j.c));
    cached.key = key;
  }
  return cached;
}

// Runs the harness ran in this process: a filter that matches nothing must not pass.
int g_runs = 0;

const Plan& plan_of(const ladder::Step& s) {
  using namespace ladder;
  static const Plan plan = [&s] {
    Plan pl;
    for (const Case& c : shared_cases())
      for (DType t : s.caps.dtypes) {
        if (g_at_scale_only && !c.at_scale) continue;
        if (c.at_scale && s.device != Device::cuda) {
          if (t == s.caps.dtypes.front())
            pl.not_run.push_back(c.name +
                                 ": a case at scale, for the GPU rungs (on the CPU it "
                                 "would take minutes)");
          continue;
        }
        Problem p = c.p;
        p.dtype = t;
        p.backward = s.backward_supports(p.dim) && !c.forward_only;  // else forward only
        const std::string name = c.name + " " + dtype_name(t);
        const std::string label = name + (p.backward ? " fwd+bwd" : " fwd");
        std::vector<std::string> why;  // per checked variant: why not, or empty
        for (const Variant& v : s.variants) {
          if (!v.checked) continue;
          RunOptions ro;
          ro.variant = v.name, ro.repeats = 1, ro.warmup = 0;
          try {
            pl.jobs.push_back(
                {label + " [" + v.name + "]", p, &c, prepare_host(s, p, ro, check_mode(c), false)});
            why.push_back("");
          } catch (const BadInput& e) {
            why.push_back(e.what());
          }
        }
        // A case no variant runs for the same reason is said once, else per variant.
        const bool none = std::all_of(why.begin(), why.end(), [&](const std::string& w) {
          return !w.empty() && w == why.front();
        });
        if (none && !why.empty()) {
          pl.not_run.push_back(name + ": " + why.front());
          continue;
        }
        size_t i = 0;
        for (const Variant& v : s.variants)
          if (v.checked && !why[i++].empty())
            pl.not_run.push_back(name + " [" + v.name + "]: " + why[i - 1]);
      }
    for (const Variant& v : s.variants)
      if (!v.checked)
        pl.not_run.push_back("variant '" + v.name +
                             "' (all cases): a demonstration of a failure, not a checked form");
    return pl;
  }();
  return plan;
}
}  // namespace

TEST_CASE("shared cases against the float64 oracle", "[harness]") {
  using namespace ladder;
  const Step& s = *g_step;
  const std::vector<Job>& jobs = plan_of(s).jobs;
  const std::vector<std::string>& not_run = plan_of(s).not_run;

  static bool printed = false;
  if (!printed) {
    printed = true;
    std::cout << "step " << s.name << ": " << jobs.size()
              << " runs of shared cases; not run: " << not_run.size() << "\n";
    if (s.number == 0)
      std::cout << "  step 00 is the reference: its run is the oracle the check compares with, so "
                   "these runs test the program's path (cases, masks, outputs written), not the "
                   "arithmetic; the oracle's own checks are tests/test_reference.cpp (a "
                   "long-double loop and finite differences)\n";
    for (const std::string& n : not_run) std::cout << "  NOT RUN " << n << "\n";
  }

  // Each run prints one verdict line, `pass`, `FAIL` (a wrong result: the tensor, its error and
  // tolerance, and what the case exercises) or `TODO` (an exercise region still blank:
  // LADDER_TODO threw on the host or trapped on the device), which tools/exercise.py reads.
  // Catch2 runs this test case once per section, so the tally is static.
  static int passed = 0, wrong = 0, blank = 0;
  for (const Job& j : jobs) {
    DYNAMIC_SECTION(j.label) {
      ++g_runs;
      const std::string& run = j.label;
      std::string todo, error;
      CheckedRun r;
      try {
        const CaseReference& c = reference_of(j);
        r = run_judged(s, j.p, c.in, prepare_device(s, j.p, j.host), c.ref);
        if (j.c->at_scale) std::cout << "    check: " << r.check.mode << "\n";
      } catch (const NotImplemented& e) {
        todo = e.what();
      } catch (const std::exception& e) {
        // LADDER_TODO in device code traps, which the exercise build reports as an unspecified
        // launch failure naming LADDER_TODO; any other device error is the code's own.
        const std::string what = e.what();
        const bool trap = what.find("LADDER_TODO") != std::string::npos &&
                          what.find("unspecified launch failure") != std::string::npos;
        (trap ? todo : error) = what;
      }
      if (!todo.empty()) {
        ++blank;
        std::cout << "  TODO " << run << "\n    not implemented: " << todo << "\n";
      } else {
        const bool ok = error.empty() && r.check.pass;
        std::ostringstream line;
        line << (ok ? "  pass " : "  FAIL ") << run;
        for (const TensorCheck& t : r.check.tensors)
          line << "  " << t.name << " " << fmt_sci(t.step.max_abs) << "/" << fmt_sci(t.tol);
        std::cout << line.str() << "\n";
        if (ok) {
          ++passed;
        } else {
          ++wrong;
          std::cout << "    wrong result: "
                    << (error.empty() ? r.check.first_failure() : "the run threw: " + error)
                    << "\n    this case exercises: " << j.c->exercises << "\n";
        }
      }
      if (&j == &jobs.back())
        std::cout << "step " << s.name << ": " << passed << " pass, " << wrong
                  << " FAIL (wrong result), " << blank << " TODO (not implemented)\n";
      INFO(run << ": " << j.p.describe() << "\n"
               << (!todo.empty()    ? todo
                   : !error.empty() ? error
                                    : r.check.summary()));
      CHECK((todo.empty() && error.empty() && r.check.pass));
    }
  }
}

// An all-ones block mask must give the dense result bit for bit when the rung runs the same
// tiles for both: a kernel that takes another path for a mask is caught here, not only within
// tolerance. Per variant that has masks; a variant whose tiles differ with a mask (step 07 at
// d = 64: three consumer warpgroups for dense, the 128-row persistent kernel for masks) sums in
// another order, and is said and skipped. dQ is compared only where two dense runs agree bit
// for bit: fp32 atomics (or the copy engine's reduce-add) may add in any order. (Dropout 0 is
// the problem without dropout by construction: every rung takes its dropout path only for
// p > 0.)
TEST_CASE("an all-ones block mask equals the dense run bit for bit", "[harness]") {
  using namespace ladder;
  const Step& s = *g_step;
  if (!s.caps.block_sparse) {
    std::cout << "NOT RUN (bitwise equivalence): step " << s.name << " has no block masks\n";
    return;
  }
  auto same_bits = [](const Tensor& x, const Tensor& y) {
    if (x.data.size() != y.data.size()) return size_t(-1);
    size_t differ = 0;
    for (size_t e = 0; e < x.data.size(); ++e)
      differ += std::memcmp(&x.data[e], &y.data[e], sizeof(double)) != 0;
    return differ;
  };
  for (DType t : s.caps.dtypes)
    for (const Variant& v : s.variants) {
      if (!v.checked || !v.block_sparse) continue;
      Problem p;
      p.batch = 1, p.heads = 2, p.heads_kv = 1, p.seq_q = 300, p.seq_k = 260, p.causal = true;
      p.dim = s.caps.head_dims.empty() ? 64 : s.caps.head_dims.front();
      p.dtype = t, p.seed = 5, p.backward = s.backward_supports(p.dim) && v.backward;
      Problem ones = p;
      ones.sparsity.kind = BlockSparsity::Kind::random;  // density 1: every block kept
      ones.sparsity.density = 1.0;
      RunOptions ro;
      ro.variant = v.name, ro.repeats = 1, ro.warmup = 0;
      Prepared dense, mask;
      try {
        dense = prepare(s, p, ro, CheckMode::none), mask = prepare(s, ones, ro, CheckMode::none);
      } catch (const BadInput&) {
        continue;  // a problem this variant does not run
      }
      const std::string label = s.name + " [" + v.name + "] " + dtype_name(t);
      CheckedRun a, a2, b;
      try {
        const RunOptions &dt = dense.options, &mt = mask.options;  // the tiles each one runs
        if (dt.tile_q != mt.tile_q || dt.tile_k != mt.tile_k) {
          std::cout << "  NOT RUN bitwise " << label << ": tiles " << dt.tile_q << "x" << dt.tile_k
                    << " dense, " << mt.tile_q << "x" << mt.tile_k
                    << " with a mask (another summation order)\n";
          continue;
        }
        const Inputs in = make_inputs(p), in_ones = make_inputs(ones);
        REQUIRE(in_ones.mask.density() == 1.0);
        a = run_checked(s, p, in, dense, CheckMode::none);
        a2 = run_checked(s, p, in, dense, CheckMode::none);
        b = run_checked(s, ones, in_ones, mask, CheckMode::none);
      } catch (const NotImplemented& e) {  // an exercise copy: the shared cases say which region
        std::cout << "  TODO bitwise: " << label << "\n    not implemented: " << e.what() << "\n";
        CHECK(false);
        continue;
      }
      INFO(label << ": " << ones.describe());
      const bool dq_deterministic = same_bits(a.out.dq, a2.out.dq) == 0;
      const std::pair<const char*, std::pair<const Tensor*, const Tensor*>> tensors[] = {
          {"O", {&a.out.o, &b.out.o}},
          {"LSE", {&a.out.lse, &b.out.lse}},
          {"dQ", {&a.out.dq, &b.out.dq}},
          {"dK", {&a.out.dk, &b.out.dk}},
          {"dV", {&a.out.dv, &b.out.dv}}};
      std::string differ;  // the tensors whose bits differ
      for (const auto& [name, xy] : tensors) {
        if (std::string(name) == "dQ" && !dq_deterministic) continue;
        INFO(name);
        const size_t n = same_bits(*xy.first, *xy.second);
        CHECK(n == 0);
        if (n != 0) differ += std::string(differ.empty() ? "" : ", ") + name;
      }
      ++g_runs;
      std::cout << (differ.empty() ? "  pass bitwise: " : "  FAIL bitwise: ") << label << " "
                << ones.describe() << (differ.empty() ? " == dense" : " != dense in " + differ)
                << (p.backward && !dq_deterministic ? " (dQ not compared: two dense runs differ)"
                                                    : "")
                << "\n";
    }
}

int main(int argc, char** argv) {
  std::vector<char*> rest = {argv[0]};
  int number = -1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--step") == 0 && i + 1 < argc) {
      number = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--at-scale-only") == 0) {
      g_at_scale_only = true;
    } else {
      rest.push_back(argv[i]);
    }
  }
  g_step = ladder::find_step(number);
  if (!g_step) {
    std::cerr << "usage: harness --step NN [--at-scale-only] [catch2 options]; step " << number
              << " is not built here\n";
    return 2;
  }
  if (g_step->device == ladder::Device::cuda) {
    std::string why;
    if (ladder::cuda_device_count(&why) == 0) {
      std::cout << "NOT RUN: step " << g_step->name << " needs a CUDA device: " << why << "\n";
      return kSkipped;
    }
  }
  const int rc = Catch::Session().run(int(rest.size()), rest.data());
  // Catch2 passes a run in which no section ran (a filter that matched no case, a step that
  // supports none): nothing was checked, which is a failure, not a pass.
  const bool listing = std::any_of(rest.begin() + 1, rest.end(), [](const char* a) {
    return std::strncmp(a, "--list", 6) == 0 || std::strcmp(a, "-l") == 0 ||
           std::strcmp(a, "-h") == 0 || std::strcmp(a, "--help") == 0;
  });
  if (rc == 0 && g_runs == 0 && !listing) {
    std::cout << "FAILED: 0 runs of shared cases matched: nothing was checked\n";
    return 1;
  }
  return rc;
}
