// Tests of the tests: the harness's rule (runner/check.cpp, docs/CONTRACT.md "The harness")
// must reject plausible wrong kernels in every dtype and pass a correct one.
//
// Each mutant is the float64 oracle with one defect a learner's kernel could have, its outputs
// rounded once to the dtype (LSE to fp32, where every rung stores it), judged on the shared
// cases exactly as a rung's outputs are. A mutant must be rejected by at least one shared case
// in fp32, fp16 and bf16; the oracle rounded once must pass every case. The table of catches is
// printed. A few of the judgements go through `ladder verify` (the .npy contract end to end).
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <tuple>
#include <sstream>

#include "cases.hpp"
#include "check.hpp"
#include "dropout.hpp"
#include "npy.hpp"
#include "oracle.hpp"
#include "test_util.hpp"

using namespace ladder;

namespace {

Outputs oracle(const Problem& p, const Inputs& in) {
  Outputs o = Outputs::poisoned(p);
  reference::attention(p, in, o);
  return o;
}

// The outputs as a kernel of dtype t stores them: O and the gradients in t, LSE in fp32.
void store_as(DType t, Outputs& o) {
  for (Tensor* x : {&o.o, &o.dq, &o.dk, &o.dv})
    for (double& v : x->data) v = round_to(t, v);
  for (double& v : o.lse.data) v = round_to(accumulation_type(t), v);
}

// The problem with causal and block masks replaced by one element mask (1 x 1 blocks) that
// keeps key j for query i of head (b, h) iff keep(b, h, i, j): how the mutants move the mask.
std::pair<Problem, Inputs> element_mask(
    const Problem& p, const Inputs& in,
    const std::function<bool(int64_t, int64_t, int64_t, int64_t)>& keep) {
  Problem q = p;
  q.causal = false;
  q.sparsity.kind = BlockSparsity::Kind::file;
  q.sparsity.block_q = q.sparsity.block_k = 1;
  Inputs m = in;
  BlockMask& k = m.mask;
  k = BlockMask{};
  k.batch = p.batch, k.heads = p.heads, k.block_q = k.block_k = 1;
  k.q_blocks = p.seq_q, k.k_blocks = p.seq_k;
  k.keep.resize(size_t(p.batch * p.heads * p.seq_q * p.seq_k));
  size_t e = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i)
        for (int64_t j = 0; j < p.seq_k; ++j) k.keep[e++] = keep(b, h, i, j);
  return {q, m};
}

// Whether key j is visible to query i of head (b, h) in the original problem.
bool visible(const Problem& p, const Inputs& in, int64_t b, int64_t h, int64_t i, int64_t j) {
  return j < p.visible_keys(i) && in.mask.visible(b, h, i, j);
}

// A defect: the outputs of the wrong kernel on this case, or nothing where the defect cannot
// show (a GQA bug needs GQA; a dropout bug needs dropout).
using Mutate = std::function<std::optional<Outputs>(const Problem&, const Inputs&)>;

struct Mutant {
  std::string name;
  Mutate make;
};

Outputs scaled(Outputs o, Tensor Outputs::*t, double f, double add = 0) {
  for (double& v : (o.*t).data)
    if (std::isfinite(v)) v = v * f + add;
  return o;
}

const std::vector<Mutant>& mutants() {
  using Opt = std::optional<Outputs>;
  static const std::vector<Mutant> all = {
      {"softmax scale x 1.005",
       [](const Problem& p, const Inputs& in) -> Opt {
         Problem q = p;
         q.scale = 1.005 * p.softmax_scale();
         return oracle(q, in);
       }},
      {"dS x 1.02 (dQ, dK 2 % off)",
       [](const Problem& p, const Inputs& in) -> Opt {
         if (!p.backward) return std::nullopt;
         return scaled(scaled(oracle(p, in), &Outputs::dq, 1.02), &Outputs::dk, 1.02);
       }},
      {"O x 1.01",
       [](const Problem& p, const Inputs& in) -> Opt {
         return scaled(oracle(p, in), &Outputs::o, 1.01);
       }},
      {"LSE + 0.01",
       [](const Problem& p, const Inputs& in) -> Opt {
         return scaled(oracle(p, in), &Outputs::lse, 1.0, 0.01);
       }},
      {"each row's last visible key dropped",
       [](const Problem& p, const Inputs& in) -> Opt {
         auto [q, m] = element_mask(p, in, [&](int64_t b, int64_t h, int64_t i, int64_t j) {
           if (!visible(p, in, b, h, i, j)) return false;
           for (int64_t k = j + 1; k < p.seq_k; ++k)
             if (visible(p, in, b, h, i, k)) return true;
           return false;  // j is the row's last visible key
         });
         return oracle(q, m);
       }},
      {"causal diagonal off by one",
       [](const Problem& p, const Inputs& in) -> Opt {
         if (!p.causal) return std::nullopt;
         auto [q, m] = element_mask(p, in, [&](int64_t b, int64_t h, int64_t i, int64_t j) {
           return j <= i + p.seq_k - p.seq_q + 1 && in.mask.visible(b, h, i, j);
         });
         return oracle(q, m);
       }},
      {"GQA: query head h reads K/V head h % heads_kv",
       [](const Problem& p, const Inputs& in) -> Opt {
         if (p.group() == 1 || p.heads_kv == 1) return std::nullopt;
         // Give every query head its own (wrong) copy of K and V, then sum dK, dV back onto the
         // head each copy came from.
         Problem q = p;
         q.heads_kv = p.heads;
         Inputs m = in;
         const int64_t n = p.seq_k * p.dim;
         m.k = Tensor::poisoned({p.batch, p.heads, p.seq_k, p.dim});
         m.v = m.k;
         for (int64_t b = 0; b < p.batch; ++b)
           for (int64_t h = 0; h < p.heads; ++h)
             for (int64_t e = 0; e < n; ++e) {
               const size_t to = size_t((b * p.heads + h) * n + e),
                            from = size_t((b * p.heads_kv + h % p.heads_kv) * n + e);
               m.k.data[to] = in.k.data[from];
               m.v.data[to] = in.v.data[from];
             }
         Outputs wide = oracle(q, m), o = Outputs::poisoned(p);
         o.o = wide.o, o.lse = wide.lse, o.dq = wide.dq;
         if (p.backward) {
           std::fill(o.dk.data.begin(), o.dk.data.end(), 0.0);
           std::fill(o.dv.data.begin(), o.dv.data.end(), 0.0);
           for (int64_t b = 0; b < p.batch; ++b)
             for (int64_t h = 0; h < p.heads; ++h)
               for (int64_t e = 0; e < n; ++e) {
                 const size_t to = size_t((b * p.heads_kv + h % p.heads_kv) * n + e),
                              from = size_t((b * p.heads + h) * n + e);
                 o.dk.data[to] += wide.dk.data[from];
                 o.dv.data[to] += wide.dv.data[from];
               }
         }
         return o;
       }},
      {"dropout mask of another seed",
       [](const Problem& p, const Inputs& in) -> Opt {
         if (p.dropout == 0) return std::nullopt;
         Problem q = p;
         q.dropout_seed = p.dropout_seed + 1;
         return oracle(q, in);
       }},
      {"one masked block not skipped",
       [](const Problem& p, const Inputs& in) -> Opt {
         if (in.mask.empty()) return std::nullopt;
         // The first masked block (of batch 0, head 0) that the causal rule leaves visible.
         const BlockMask& mk = in.mask;
         for (int64_t I = 0; I < mk.q_blocks; ++I)
           for (int64_t J = 0; J < mk.k_blocks; ++J) {
             if (mk.at(0, 0, I, J)) continue;
             const int64_t last_row = std::min(p.seq_q, (I + 1) * mk.block_q) - 1;
             if (J * mk.block_k >= p.visible_keys(last_row)) continue;
             auto [q, m] = element_mask(p, in, [&](int64_t b, int64_t h, int64_t i, int64_t j) {
               const bool hole = b == 0 && h == 0 && i / mk.block_q == I && j / mk.block_k == J;
               return j < p.visible_keys(i) && (hole || mk.visible(b, h, i, j));
             });
             return oracle(q, m);
           }
         return std::nullopt;
       }},
      {"dK/dV of K/V heads 0 and 1 swapped",
       [](const Problem& p, const Inputs& in) -> Opt {
         if (!p.backward || p.heads_kv < 2) return std::nullopt;
         Outputs o = oracle(p, in);
         const int64_t n = p.seq_k * p.dim;
         for (int64_t b = 0; b < p.batch; ++b)
           for (int64_t e = 0; e < n; ++e)
             for (Tensor* t : {&o.dk, &o.dv})
               std::swap(t->data[size_t((b * p.heads_kv) * n + e)],
                         t->data[size_t((b * p.heads_kv + 1) * n + e)]);
         return o;
       }},
  };
  return all;
}

// The shared cases' problem in dtype t, forward and backward, as the harness runs them.
Problem case_problem(const Case& c, DType t) {
  Problem p = c.p;
  p.dtype = t;
  p.backward = true;
  return p;
}

const DType kDtypes[] = {DType::f32, DType::f16, DType::bf16};

}  // namespace

TEST_CASE("the harness rejects every mutant in every dtype and check mode, and passes the oracle",
          "[mutants]") {
  const std::vector<Mutant>& ms = mutants();
  const CheckMode kModes[] = {CheckMode::full, CheckMode::sampled};
  const char* kModeNames[] = {"full", "sampled"};
  // caught[mutant][dtype][mode], applicable likewise; correct-result failures named.
  std::map<std::tuple<size_t, int, int>, int> caught, tried;
  std::vector<std::string> correct_failed;
  size_t cases = 0;
  for (const Case& c : shared_cases()) {
    if (c.at_scale) continue;  // the GPU harness's; the oracle's full pass would take minutes
    ++cases;
    for (int ti = 0; ti < 3; ++ti) {
      const Problem p = case_problem(c, kDtypes[ti]);
      const Inputs in = case_inputs(c, p);
      Outputs right = oracle(p, in);
      store_as(p.dtype, right);
      std::vector<std::optional<Outputs>> bad;
      for (const Mutant& m : ms) {
        bad.push_back(m.make(p, in));
        if (bad.back()) store_as(p.dtype, *bad.back());
      }
      for (int mi = 0; mi < 2; ++mi) {
        const Reference r = reference_for(p, in, kModes[mi]);
        const CheckReport ok = judge(p, in, right, r);
        if (!ok.pass)
          correct_failed.push_back(c.name + " " + dtype_name(p.dtype) + " " + kModeNames[mi] +
                                   " (" + r.mode + "): " + ok.first_failure());
        for (size_t k = 0; k < ms.size(); ++k) {
          if (!bad[k]) continue;
          ++tried[{k, ti, mi}];
          caught[{k, ti, mi}] += !judge(p, in, *bad[k], r).pass;
        }
      }
    }
  }

  std::ostringstream table;
  table << "mutant corpus: caught / cases where the defect can show (" << cases
        << " shared cases, forward and backward; full check | sampled check, rows drawn afresh)\n";
  table << std::left << std::setw(50) << "| defect"
        << "| fp32 full | fp16 full | bf16 full | fp32 smpl | fp16 smpl | bf16 smpl |\n";
  for (size_t k = 0; k < ms.size(); ++k) {
    table << "| " << std::left << std::setw(48) << ms[k].name;
    for (int mi = 0; mi < 2; ++mi)
      for (int ti = 0; ti < 3; ++ti) {
        std::ostringstream cell;
        cell << caught[{k, ti, mi}] << "/" << tried[{k, ti, mi}];
        table << "| " << std::setw(10) << cell.str();
      }
    table << "|\n";
  }
  std::cout << table.str();
  INFO(table.str());

  for (const std::string& f : correct_failed) FAIL_CHECK("the oracle rounded once failed: " << f);
  CHECK(correct_failed.empty());
  // Every cell of the table: each mutant shows in some case and is caught there, in every dtype
  // and in both check modes.
  for (size_t k = 0; k < ms.size(); ++k)
    for (int mi = 0; mi < 2; ++mi)
      for (int ti = 0; ti < 3; ++ti) {
        INFO(ms[k].name << " in " << dtype_name(kDtypes[ti]) << ", " << kModeNames[mi] << " check");
        CHECK(tried[{k, ti, mi}] > 0);
        CHECK(caught[{k, ti, mi}] > 0);
      }
}

namespace {
// Writes a case's inputs and outputs as .npy (float64, so nothing is rounded on the way) and
// runs `ladder verify` on them; returns its exit status.
int ladder_verify(const std::string& name, const Problem& p, const Inputs& in, const Outputs& out,
                  const testing::TempDir& tmp, const std::string& check = "full") {
  write_npy_files(tmp / "in",
                  {{"q.npy", &in.q}, {"k.npy", &in.k}, {"v.npy", &in.v}, {"do.npy", &in.dout}},
                  true);
  write_npy_files(tmp / "out",
                  {{"o.npy", &out.o},
                   {"lse.npy", &out.lse},
                   {"dq.npy", &out.dq},
                   {"dk.npy", &out.dk},
                   {"dv.npy", &out.dv}},
                  true);
  std::ostringstream cmd;
  cmd << "'" << LADDER_DRIVER << "' verify --load '" << (tmp / "in") << "' --outputs '"
      << (tmp / "out") << "' --dtype " << dtype_name(p.dtype) << " --check " << check
      << (p.causal ? " --causal" : "");
  if (p.scale != 0) cmd << " --scale " << std::setprecision(17) << p.scale;
  if (p.dropout > 0) cmd << " --dropout " << p.dropout << " --dropout-seed " << p.dropout_seed;
  INFO(name << ": " << cmd.str());
  const int w = std::system((cmd.str() + " >/dev/null 2>&1").c_str());
  REQUIRE((w != -1 && WIFEXITED(w)));
  return WEXITSTATUS(w);
}
}  // namespace

TEST_CASE("ladder verify: the oracle passes, mutants fail, end to end through .npy", "[mutants]") {
  // Dense cases only: a mask would have to travel as a file too (--block-mask), which the
  // program tests cover. Between them these two show every other defect.
  const char* names[] = {"gqa4to2_q113_k203_causal", "dropout0.1_q113_k203"};
  for (const char* name : names) {
    const Case* c = nullptr;
    for (const Case& x : shared_cases())
      if (x.name == name) c = &x;
    REQUIRE(c != nullptr);
    for (DType t : kDtypes) {
      const Problem p = case_problem(*c, t);
      const Inputs in = case_inputs(*c, p);
      const Reference r = reference_for(p, in, CheckMode::full);
      testing::TempDir tmp("ladder_verify");
      Outputs right = oracle(p, in);
      store_as(t, right);
      CHECK(ladder_verify(c->name, p, in, right, tmp) == 0);
      for (const Mutant& m : mutants()) {
        std::optional<Outputs> bad = m.make(p, in);
        if (!bad) continue;
        store_as(t, *bad);
        if (judge(p, in, *bad, r).pass) continue;  // this case misses it
        INFO(m.name << " in " << dtype_name(t));
        CHECK(ladder_verify(c->name, p, in, *bad, tmp) == 1);
      }
    }
  }
}

TEST_CASE("ladder verify at an ordinary size rejects garbage gradients and outputs in every mode",
          "[mutants]") {
  // 1 x 8 x 1050^2 x 64 with the backward: 8 GFLOP of oracle work, past the 4 GFLOP where a run's
  // auto check samples. verify's auto check is full here (it fits in memory); --check sampled
  // compares fresh query and key rows and the gradient sums. Each defect below passed the
  // sampled check when it compared 12 fixed query rows and no dK, dV at all.
  Problem p;
  p.batch = 1, p.heads = p.heads_kv = 8, p.seq_q = p.seq_k = 1050, p.dim = 64;
  p.dtype = DType::bf16, p.backward = true, p.seed = 77;
  const Inputs in = make_inputs(p);
  Outputs right = oracle(p, in);
  store_as(p.dtype, right);
  const int64_t row = p.dim, rows_per_head = p.seq_q;
  auto all_rows_but_16 = [&](Tensor Outputs::*t, int64_t n) {  // wrong except on 16 rows a head
    Outputs o = right;
    Tensor& x = o.*t;
    for (int64_t e = 0; e < x.numel(); ++e)
      if ((e / row) % n % (n / 16) != 0)
        x.data[size_t(e)] = round_to(p.dtype, x.data[size_t(e)] * 1.05);
    return o;
  };
  Outputs zeroed = right, swapped = right;
  std::fill(zeroed.dk.data.begin(), zeroed.dk.data.end(), 0.0);
  std::fill(zeroed.dv.data.begin(), zeroed.dv.data.end(), 0.0);
  std::swap(swapped.dk, swapped.dv);
  const std::pair<const char*, Outputs> wrong[] = {
      {"dK and dV zeroed", zeroed},
      {"dK and dV swapped", swapped},
      {"O 5 % off on every row but 16 per head", all_rows_but_16(&Outputs::o, rows_per_head)},
      {"dK 5 % off on every key but 16 per head", all_rows_but_16(&Outputs::dk, p.seq_k)},
  };
  testing::TempDir tmp("ladder_verify_scale");
  for (const char* check : {"auto", "sampled"}) {
    INFO("--check " << check);
    CHECK(ladder_verify("1x8x1050^2x64 correct", p, in, right, tmp, check) == 0);
    for (const auto& [name, out] : wrong) {
      INFO(name);
      CHECK(ladder_verify(name, p, in, out, tmp, check) == 1);
    }
  }
  // Gradients given as broken links are refused (exit 2), not graded as a forward pass.
  Outputs fwd = right;
  fwd.dq = fwd.dk = fwd.dv = Tensor();
  std::filesystem::remove_all(tmp / "out");
  write_npy_files(tmp / "out", {{"o.npy", &fwd.o}, {"lse.npy", &fwd.lse}}, true);
  for (const char* n : {"dq.npy", "dk.npy", "dv.npy"})
    std::filesystem::create_symlink(std::filesystem::path(tmp / "nowhere") / n,
                                    std::filesystem::path(tmp / "out") / n);
  std::ostringstream cmd;
  cmd << "'" << LADDER_DRIVER << "' verify --load '" << (tmp / "in") << "' --outputs '"
      << (tmp / "out") << "' --dtype bf16 >/dev/null 2>&1";
  const int w = std::system(cmd.str().c_str());
  REQUIRE((w != -1 && WIFEXITED(w)));
  CHECK(WEXITSTATUS(w) == 2);
}
