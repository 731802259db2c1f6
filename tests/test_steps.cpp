// Every built step's descriptor against its source and the ladder's rules:
//  - the file named after the step (its algorithm) opens with the header convention, and its
//    "// Adds:" paragraph lists exactly Step::adds (so the prose a learner reads stays true);
//  - every step folder has its main.cpp;
//  - the descriptor is sane, and every rung has its notes/NN_name.md;
//  - output poisoning works: every CPU step writes every output element, and a step that
//    leaves one row unwritten fails ladder::verify.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "check.hpp"
#include "program.hpp"
#include "oracle.hpp"
#include "rungs.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using namespace ladder;
using Catch::Matchers::Contains;

namespace {

std::string two_digits(int n) {
  return (n < 10 ? "0" : "") + std::to_string(n);
}

std::string read_file(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// The files under steps/<name>/ named after the step (02_online_softmax: online_softmax.*):
// where a learner finds the step's algorithm and its header.
std::vector<fs::path> algorithm_files(const std::string& name) {
  std::vector<fs::path> found;
  const fs::path dir = fs::path(LADDER_SOURCE_DIR) / "steps" / name;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string ext = e.path().extension().string();  // code, not its host-API header
    if (e.is_regular_file() && e.path().stem().string() == name.substr(3) &&
        (ext == ".cpp" || ext == ".cu" || ext == ".cuh"))
      found.push_back(e.path());
  }
  return found;
}

// The file's leading block of `//` lines.
std::vector<std::string> leading_comment(const fs::path& path) {
  std::istringstream in(read_file(path));
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line) && line.rfind("//", 0) == 0) lines.push_back(line);
  return lines;
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// The "// Adds:" paragraph split into its items, or why it could not be read.
std::vector<std::string> adds_items(const std::vector<std::string>& block, std::string& why) {
  const std::string tag = "// Adds: ";
  if (block.size() < 2 || block[1].rfind(tag, 0) != 0) {
    why = "the second line does not start with \"" + tag + "\"";
    return {};
  }
  std::string text = trim(block[1].substr(tag.size()));
  for (size_t k = 2; k < block.size(); ++k) {  // wrapped lines, up to an empty `//`
    const std::string more = trim(block[k].substr(2));
    if (more.empty()) break;
    text += " " + more;
  }
  if (text.empty() || text.back() != '.') {
    why = "the Adds paragraph does not end with '.': " + text;
    return {};
  }
  text.pop_back();
  std::vector<std::string> items;
  size_t start = 0;
  for (size_t at; (at = text.find("; ", start)) != std::string::npos; start = at + 2)
    items.push_back(text.substr(start, at - start));
  items.push_back(text.substr(start));
  return items;
}

std::vector<const Step*> built_steps() {
  std::vector<const Step*> s;
  for (const Rung& r : rungs())
    if (r.step) s.push_back(r.step);
  return s;
}

// How many elements of t are NaN (never written, given a poisoned start).
int64_t count_nan(const Tensor& t) {
  return std::count_if(t.data.begin(), t.data.end(), [](double x) { return std::isnan(x); });
}

}  // namespace

TEST_CASE("steps: each header's Adds list is the descriptor's", "[steps]") {
  const std::vector<const Step*> steps = built_steps();
  REQUIRE_FALSE(steps.empty());
  for (const Step* s : steps) {
    INFO(s->name);
    const std::vector<fs::path> files = algorithm_files(s->name);
    REQUIRE(files.size() == 1);  // exactly one file is named after the step
    INFO(files.front().string());
    const std::vector<std::string> block = leading_comment(files.front());
    REQUIRE_FALSE(block.empty());
    const std::string title = "// Step " + two_digits(s->number) + " — ";
    CHECK(block.front().rfind(title, 0) == 0);
    CHECK(block.front().size() > title.size());
    std::string why;
    const std::vector<std::string> items = adds_items(block, why);
    INFO(why);
    CHECK(items == s->adds);
  }
}

TEST_CASE("steps: every step folder shows its main()", "[steps]") {
  for (const Rung& r : rungs()) {
    const fs::path main = fs::path(LADDER_SOURCE_DIR) / "steps" / r.name / "main.cpp";
    INFO(main.string());
    REQUIRE(fs::is_regular_file(main));
    CHECK_THAT(read_file(main), Contains("int main(") && Contains("step_main"));
  }
}

TEST_CASE("steps: the Adds reader itself", "[steps]") {
  // Wrapping joins with a space; the paragraph ends at an empty `//`; "; " separates.
  std::string why;
  CHECK(adds_items({"// Step 07 — x (CPU, fp32).", "// Adds: a; b c; d.", "//", "// Adds: no."},
                   why) == std::vector<std::string>{"a", "b c", "d"});
  CHECK(adds_items({"// Step 07 — x.", "// Adds: one; two", "// words; P.V.", "//"}, why) ==
        std::vector<std::string>{"one", "two words", "P.V"});
  CHECK(adds_items({"// Step 07 — x.", "// Adds: no final stop"}, why).empty());
  CHECK_THAT(why, Contains("'.'"));
  CHECK(adds_items({"// Step 07 — x.", "//", "// Adds: late."}, why).empty());
}

TEST_CASE("steps: every rung has its notes/NN_name.md", "[steps]") {
  for (const Rung& r : rungs()) {
    const fs::path note = fs::path(LADDER_SOURCE_DIR) / "notes" / (r.name + ".md");
    INFO(note.string());
    CHECK(fs::is_regular_file(note));
    if (fs::is_regular_file(note)) CHECK(fs::file_size(note) > 0);
  }
}

TEST_CASE("steps: descriptors are sane", "[steps]") {
  const std::vector<Rung>& all = rungs();
  REQUIRE_FALSE(all.empty());
  for (size_t k = 0; k < all.size(); ++k) {
    const Rung& r = all[k];
    INFO(r.name);
    if (k > 0) CHECK(all[k - 1].number < r.number);  // in ladder order, no duplicates
    CHECK(r.name.substr(0, 2) == two_digits(r.number));
    CHECK(fs::is_directory(fs::path(LADDER_SOURCE_DIR) / "steps" / r.name));
    if (!r.step) {
      CHECK_FALSE(r.not_built.empty());  // says why
      continue;
    }
    const Step& s = *r.step;
    CHECK(find_step(r.number) == r.step);
    CHECK(s.number == r.number);
    CHECK(s.name == r.name);
    CHECK_FALSE(s.summary.empty());
    CHECK(static_cast<bool>(s.run));
    // The contract's table: 00-02 on the CPU, the rest CUDA.
    CHECK(s.device == (s.number <= 2 ? Device::cpu : Device::cuda));

    CHECK_FALSE(s.adds.empty());
    for (const std::string& a : s.adds) {
      CHECK_FALSE(a.empty());
      CHECK(a.find("; ") == std::string::npos);
      CHECK(a == trim(a));
    }

    REQUIRE_FALSE(s.variants.empty());
    CHECK(s.variants.front().checked);  // the default form is one the harness checks
    std::set<std::string> names;
    for (const Variant& v : s.variants) {
      CHECK_FALSE(v.name.empty());
      CHECK_FALSE(v.summary.empty());
      CHECK(names.insert(v.name).second);
      CHECK(s.find_variant(v.name) == &v);
    }
    CHECK(s.find_variant("") == &s.variants.front());
    CHECK(s.find_variant("no-such-variant") == nullptr);
    RunOptions unknown;
    unknown.variant = "no-such-variant";
    CHECK_THAT(s.unsupported(Problem{}, unknown), Contains("no variant 'no-such-variant'"));

    REQUIRE_FALSE(s.caps.dtypes.empty());
    CHECK(s.default_dtype() == s.caps.dtypes.front());
    CHECK(std::set<DType>(s.caps.dtypes.begin(), s.caps.dtypes.end()).size() ==
          s.caps.dtypes.size());
    CHECK((s.caps.head_dims.empty() || s.caps.max_dim == 0));
    // The step accepts a problem in its own default dtype and a head dim it lists.
    Problem p = testing::problem(1, 2, 2, 8, 8, s.caps.head_dims.empty() ? 8 : s.caps.head_dims[0],
                                 false, 0);
    p.dtype = s.default_dtype();
    CHECK(s.unsupported(p) == "");
  }
}

TEST_CASE("steps: every CPU step writes every output element", "[steps]") {
  int runs = 0;
  for (const Step* s : built_steps()) {
    if (s->device != Device::cpu) continue;
    for (Problem p : {testing::problem(2, 4, 2, 19, 11, 8, true, 31),  // rows 0..7 see no key
                      testing::problem(1, 2, 2, 5, 37, 4, false, 32),
                      testing::problem(1, 3, 1, 1, 1, 3, true, 33)}) {
      p.dtype = s->default_dtype();
      p.backward = s->caps.backward;
      if (!s->unsupported(p).empty()) continue;
      const Inputs in = make_inputs(p);
      for (const Variant& v : s->variants) {
        if (!v.checked) continue;
        for (int tile : {0, 3}) {  // the step's tiles, and odd ones that leave partial tiles
          RunOptions ro;
          ro.variant = v.name;
          ro.repeats = 1;
          ro.warmup = 0;
          ro.tile_q = tile ? tile + 1 : 0;
          ro.tile_k = tile;
          if (!s->unsupported(p, ro).empty()) continue;  // tiles only for tiled forms
          INFO(s->name << " [" << v.name << "] tiles " << ro.tile_q << "x" << ro.tile_k << ": "
                       << p.describe());
          Outputs out = Outputs::poisoned(p);
          s->run(p, in, out, prepare(*s, p, ro, CheckMode::full, true).options);
          ++runs;
          for (const Tensor* t : {&out.o, &out.dq, &out.dk, &out.dv}) {
            CHECK(count_nan(*t) == 0);
            CHECK(std::all_of(t->data.begin(), t->data.end(),
                              [](double x) { return std::isfinite(x); }));
          }
          for (int64_t r = 0; r < p.rows(); ++r) {
            const double lse = out.lse.data[size_t(r)];
            if (p.visible_keys(r % p.seq_q) == 0)
              CHECK(lse == -std::numeric_limits<double>::infinity());
            else
              CHECK(std::isfinite(lse));
          }
          const CheckReport rep = verify(p, in, out, CheckMode::full);
          INFO(rep.summary());
          CHECK(rep.pass);
        }
      }
    }
  }
  CHECK(runs > 0);
}

TEST_CASE("steps: verify fails a step that leaves output unwritten", "[steps]") {
  // Fake steps: the oracle's result, then one thing undone or spoiled.
  auto fake = [](std::function<void(const Problem&, Outputs&)> spoil) {
    Step s;
    s.number = 99;
    s.name = "99_fake";
    s.summary = "the oracle with a defect";
    s.adds = {"a defect"};
    s.caps.dtypes = {DType::f32};
    s.caps.backward = true;
    s.variants = {{"default", "the only form", true}};
    s.run = [spoil](const Problem& p, const Inputs& in, Outputs& out, const RunOptions&) {
      reference::attention(p, in, out);
      spoil(p, out);
      return RunResult{};
    };
    return s;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto last_o_row = [nan](const Problem& p, Outputs& out) {
    std::fill(out.o.data.end() - p.dim, out.o.data.end(), nan);  // never written
  };
  auto last_lse = [nan](const Problem&, Outputs& out) { out.lse.data.back() = nan; };
  auto last_dk_row = [nan](const Problem& p, Outputs& out) {
    std::fill(out.dk.data.end() - p.dim, out.dk.data.end(), nan);
  };
  auto masked_lse_finite = [](const Problem&, Outputs& out) {
    out.lse.data.front() = 0.0;  // row 0 sees no key: its LSE must be -inf, not a number
  };
  auto nothing = [](const Problem&, Outputs&) {};

  Problem p = testing::problem(1, 2, 1, 13, 9, 8, true, 41);  // rows 0..3 see no key
  p.dtype = DType::f32;
  p.backward = true;
  const Inputs in = make_inputs(p);  // with dO, for the cases that check gradients
  RunOptions ro;
  ro.repeats = 1;

  struct C {
    const char* what;
    std::function<void(const Problem&, Outputs&)> spoil;
    bool backward;
    const char* fails;  // the tensor named in the failure; null: must pass
  };
  const std::vector<C> cases = {
      {"nothing spoiled (the control)", nothing, true, nullptr},
      {"last row of O unwritten", last_o_row, false, "O "},
      {"last LSE unwritten", last_lse, false, "LSE "},
      {"last row of dK unwritten", last_dk_row, true, "dK "},
      {"finite LSE on a row with no visible key", masked_lse_finite, false, "LSE "},
  };
  for (const C& c : cases) {
    Problem q = p;
    q.backward = c.backward;
    const Step s = fake(c.spoil);
    for (CheckMode mode : {CheckMode::full, CheckMode::sampled}) {
      if (mode == CheckMode::sampled && c.fails && std::string(c.fails) == "dK ")
        continue;  // sampled checks only rows of O, LSE and dQ (dK, dV need every row)
      INFO(c.what << (mode == CheckMode::full ? " (full check)" : " (sampled check)"));
      const CheckedRun r = run_checked(s, q, in, ro, mode);
      INFO(r.check.summary());
      if (!c.fails) {
        CHECK(r.check.pass);
        continue;
      }
      CHECK_FALSE(r.check.pass);
      CHECK_THAT(r.check.first_failure(), Contains(c.fails) && Contains("non-finite"));
    }
  }
}

TEST_CASE("variants and the backward can cover fewer dtypes and dims than the step", "[steps]") {
  Step s;
  s.number = 9;
  s.name = "09_fake";
  s.caps.dtypes = {DType::bf16, DType::f16};
  s.caps.head_dims = {64, 128, 256};
  s.caps.backward = true;
  s.caps.backward_head_dims = {64, 128};
  s.variants = {{"full", "everything", true},
                {"teaching", "bf16, d 64 only", true, {DType::bf16}, {64}}};
  Problem p = testing::problem(1, 2, 2, 8, 8, 64, false);
  p.dtype = DType::bf16;
  RunOptions teaching, full;
  teaching.variant = "teaching";
  full.variant = "full";
  CHECK(s.unsupported(p).empty());
  CHECK(s.unsupported(p, teaching).empty());
  p.dtype = DType::f16;
  CHECK(s.unsupported(p, full).empty());
  CHECK_THAT(s.unsupported(p, teaching), Contains("variant 'teaching'") && Contains("bf16"));
  p.dtype = DType::bf16;
  p.dim = 128;
  CHECK_THAT(s.unsupported(p, teaching), Contains("--dim 64 only"));
  p.dim = 256;
  CHECK(s.unsupported(p).empty());  // forward at d = 256
  p.backward = true;
  CHECK_THAT(s.unsupported(p), Contains("backward supports --dim 64 128"));
  CHECK_FALSE(s.backward_supports(256));
  CHECK(s.backward_supports(128));
}
