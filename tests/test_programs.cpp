// The step programs as a user (or a grader's script) runs them: exit statuses of
// the command-line contract (docs/CONTRACT.md), messages that say what is supported, no output
// files after bad input, --help listing every flag, and .npy save/load round trips.
// Each program runs as a subprocess with its output captured in a temporary directory.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "device.hpp"
#include "inputs.hpp"
#include "npy.hpp"
#include "test_util.hpp"
#include "oracle.hpp"
#include "rungs.hpp"

namespace fs = std::filesystem;
using namespace ladder;
using Catch::Matchers::Contains;
using ladder::testing::TempDir;

namespace {

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

struct Run {
  int status = -1;  // the exit status, or -1 if the program did not exit normally (a crash)
  std::string out, err;
};

// Runs a program with `args`, stdout and stderr captured under `tmp`.
Run run_binary(const std::string& bin, const std::string& args, const TempDir& tmp) {
  REQUIRE(fs::exists(bin));
  const std::string out = tmp / "stdout.txt", err = tmp / "stderr.txt";
  const std::string cmd = quote(bin) + " " + args + " >" + quote(out) + " 2>" + quote(err);
  const int w = std::system(cmd.c_str());
  Run r;
  if (w != -1 && WIFEXITED(w)) r.status = WEXITSTATUS(w);
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

// Runs a step program (build/steps/NN_name).
Run run_step(const std::string& step, const std::string& args, const TempDir& tmp) {
  return run_binary(std::string(LADDER_STEP_BIN_DIR) + "/" + step, args, tmp);
}

// Every entry under `dir` (hidden ones, and in subfolders, too); empty if it is absent.
std::vector<std::string> files_under(const std::string& dir) {
  std::vector<std::string> names;
  if (!fs::exists(dir)) return names;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    names.push_back(fs::relative(e.path(), dir).string());
  std::sort(names.begin(), names.end());
  return names;
}

const char* kSmall = "--batch 1 --heads 2 --seq-q 17 --seq-k 23 --dim 16";
const char* kQuick = " --repeats 1 --warmup 0";

// max |got - ref| / max |ref| over finite ref; -inf must match exactly; NaN is infinite.
double rel_error(const Tensor& got, const Tensor& ref) {
  REQUIRE(got.shape == ref.shape);
  double max_abs = 0, max_ref = 0;
  for (size_t i = 0; i < ref.data.size(); ++i) {
    const double g = got.data[i], r = ref.data[i];
    if (std::isinf(r)) {
      if (g != r) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (!std::isfinite(g)) return std::numeric_limits<double>::infinity();
    max_abs = std::max(max_abs, std::fabs(g - r));
    max_ref = std::max(max_ref, std::fabs(r));
  }
  return max_ref > 0 ? max_abs / max_ref : max_abs;
}

bool has_non_finite(const Tensor& t) {
  return std::any_of(t.data.begin(), t.data.end(), [](double x) { return !std::isfinite(x); });
}

std::vector<const Step*> cpu_steps() {
  std::vector<const Step*> s;
  for (const Rung& r : rungs())
    if (r.step && r.step->device == Device::cpu) s.push_back(r.step);
  return s;
}

// A dtype the step does not support.
const char* foreign_dtype(const Step& s) {
  for (DType t : {DType::bf16, DType::f16, DType::f64, DType::f32})
    if (std::find(s.caps.dtypes.begin(), s.caps.dtypes.end(), t) == s.caps.dtypes.end())
      return dtype_name(t);
  return nullptr;
}

// The forward outputs a step program saved to dir: o.npy and lse.npy alone, of p's shapes, and
// (within fp32 rounding) the oracle's on the same inputs. Returns O and LSE as read.
std::pair<Tensor, Tensor> check_saved_forward(const std::string& dir, const Problem& p,
                                              const Inputs& in) {
  CHECK(files_under(dir) == std::vector<std::string>{"lse.npy", "o.npy"});
  Tensor o = read_npy(dir + "/o.npy"), lse = read_npy(dir + "/lse.npy");
  CHECK(o.shape == std::vector<int64_t>{p.batch, p.heads, p.seq_q, p.dim});
  CHECK(lse.shape == std::vector<int64_t>{p.batch, p.heads, p.seq_q});
  Outputs ref = Outputs::poisoned(p);
  reference::attention(p, in, ref);
  CHECK(rel_error(o, ref.o) < 1e-5);
  CHECK(rel_error(lse, ref.lse) < 1e-5);  // -inf in masked rows, exactly
  return {o, lse};
}

}  // namespace

TEST_CASE("programs: a good run exits 0 and saves O and LSE", "[programs]") {
  TempDir tmp;
  for (const Step* s : cpu_steps()) {
    INFO(s->name);
    const std::string save = tmp / (s->name + "_save");
    const Run r =
        run_step(s->name, std::string(kSmall) + " --causal --save " + quote(save) + kQuick, tmp);
    INFO(r.out << r.err);
    CHECK(r.status == 0);
    CHECK(files_under(save) == std::vector<std::string>{"lse.npy", "o.npy"});
    CHECK(read_npy(save + "/o.npy").shape == std::vector<int64_t>{1, 2, 17, 16});
    CHECK(read_npy(save + "/lse.npy").shape == std::vector<int64_t>{1, 2, 17});
    CHECK_THAT(r.out, Contains(dtype_name(s->default_dtype())));  // runs in its first dtype
  }
}

TEST_CASE("programs: bad input exits 2, says why, and writes no files", "[programs]") {
  struct Bad {
    std::string args, says;
  };
  const std::vector<Bad> common = {
      {"--heads 6 --heads-kv 4 --seq-q 8 --seq-k 8 --dim 8", "multiple of --heads-kv"},
      {"--heads 2 --heads-kv 0 --seq-q 8 --seq-k 8 --dim 8", "--heads-kv"},
      {"--heads 2 --seq-q 0 --seq-k 8 --dim 8", "--seq-q"},
      {"--heads 2 --seq-q 8 --seq-k -3 --dim 8", "--seq-k"},
      {"--heads 2 --seq-q 8 --seq-k=-3 --dim 8", "--seq-k"},
      {"--heads 2 --seq-q 8 --seq-k 8 --dim 0", "--dim"},
      {"--batch 0 --heads 2 --seq-q 8 --seq-k 8 --dim 8", "--batch"},
      {"--heads 2 --seq-q 8 --seq-k 8 --dim 8 --dtype int8", "fp32"},  // lists the dtypes
      {"--heads 2 --seq-q 8 --seq-k 8 --dim 8 --variant no-such-variant", "no-such-variant"},
      {"--heads 2 --seq-q 8 --seq-k 8 --dim 8 --inputs sideways", "normal"},
      {"--heads 2 --seq-q 8 --seq-k 8 --dim 8 --check sometimes", "auto"},
      {"--heads 2 --seq-q 8 --seq-k 8 --dim 8 --no-such-flag", "no-such-flag"},
      {"--load /nonexistent/ladder/dir", "not a directory"},
  };
  TempDir tmp;
  int n = 0;
  for (const Step* s : cpu_steps()) {
    std::vector<Bad> cases = common;
    if (const char* t = foreign_dtype(*s))  // the message names what it does support
      cases.push_back({std::string("--heads 2 --seq-q 8 --seq-k 8 --dim 8 --dtype ") + t,
                       std::string("supports ") + dtype_name(s->default_dtype())});
    cases.push_back({"--heads 2 --seq-q 8 --seq-k 8 --dim 8 --variant nope",
                     "variants are: " + s->variants.front().name});
    if (!s->caps.backward)
      cases.push_back({"--heads 2 --seq-q 8 --seq-k 8 --dim 8 --backward", "backward"});
    for (const Bad& c : cases) {
      const std::string save = tmp / ("save" + std::to_string(n++));
      const Run r = run_step(s->name, c.args + " --save " + quote(save) + kQuick, tmp);
      INFO(s->name << " " << c.args << "\nstdout: " << r.out << "\nstderr: " << r.err);
      CHECK(r.status == 2);
      CHECK_THAT(r.err, Contains(c.says));
      CHECK(files_under(save).empty());
    }
  }
  CHECK(n > 0);
}

TEST_CASE("programs: step 02 names its one dtype when asked for bf16", "[programs]") {
  TempDir tmp;
  const std::string save = tmp / "save";
  const Run r = run_step("02_online_softmax",
                         std::string(kSmall) + " --dtype bf16 --save " + quote(save) + kQuick, tmp);
  INFO(r.out << r.err);
  CHECK(r.status == 2);
  CHECK_THAT(r.err, Contains("bf16") && Contains("supports fp32"));
  CHECK(files_under(save).empty());
}

TEST_CASE("programs: --save onto a file exits 2 and leaves the file alone", "[programs]") {
  TempDir tmp;
  const std::string target = tmp / "a_file";
  std::ofstream(target) << "keep me";
  const Run r =
      run_step("02_online_softmax", std::string(kSmall) + " --save " + quote(target) + kQuick, tmp);
  INFO(r.out << r.err);
  CHECK(r.status == 2);
  CHECK_THAT(r.err, Contains("not a directory"));
  CHECK(read_file(target) == "keep me");
}

TEST_CASE("programs: --help exits 0 and lists the whole flag contract", "[programs]") {
  TempDir tmp;
  for (const Rung& rung : rungs()) {
    if (!rung.step) continue;  // not built here
    INFO(rung.name);
    const Run r = run_step(rung.name, "--help", tmp);
    CHECK(r.status == 0);
    for (const char* flag :
         {"--batch", "--heads", "--heads-kv", "--seq-q", "--seq-k", "--dim", "--causal", "--scale",
          "--dtype", "--seed", "--backward", "--load", "--save", "--repeats"})
      CHECK_THAT(r.out, Contains(flag));
    for (const Variant& v : rung.step->variants) CHECK_THAT(r.out, Contains(v.name));
  }
}

TEST_CASE("programs: --load rejects bad files with exit 2 and writes nothing", "[programs]") {
  TempDir tmp;
  // The good set the cases below each break one way: GQA 2 -> 1, float32 files.
  Problem p = testing::problem(1, 2, 1, 9, 13, 8, false, 5);
  p.backward = true;
  const Inputs in = make_inputs(p);
  const std::string good = tmp / "good";
  write_npy_files(good,
                  {{"q.npy", &in.q}, {"k.npy", &in.k}, {"v.npy", &in.v}, {"do.npy", &in.dout}});

  struct Bad {
    const char* what;
    std::string file;   // replaced (or removed, if bytes is empty)
    std::string bytes;  // the new content
    const char* step;
    const char* extra;  // more flags
    const char* says;
  };
  auto npy = [](const std::vector<int64_t>& shape) { return npy_bytes(Tensor(shape, 0.5)); };
  std::string mistyped = npy_bytes(in.v);
  mistyped.replace(mistyped.find("<f4"), 3, "<i4");
  std::string nan_q = npy_bytes(in.q);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(&nan_q[nan_q.size() - 4], &nan, 4);
  const std::string q_bytes = npy_bytes(in.q), k_bytes = npy_bytes(in.k);

  const std::vector<Bad> cases = {
      {"malformed q.npy", "q.npy", "this is not an array", "02_online_softmax", "", "q.npy"},
      {"truncated k.npy", "k.npy", k_bytes.substr(0, k_bytes.size() - 4), "02_online_softmax", "",
       "truncated"},
      {"mistyped v.npy (<i4)", "v.npy", mistyped, "02_online_softmax", "", "'<i4'"},
      {"missing v.npy", "v.npy", "", "02_online_softmax", "", "v.npy"},
      {"q and k disagree on dim", "q.npy", npy({1, 2, 9, 6}), "02_online_softmax", "", "dim"},
      {"q and k disagree on batch", "q.npy", npy({2, 2, 9, 8}), "02_online_softmax", "", "batch"},
      {"k and v disagree on shape", "v.npy", npy({1, 1, 12, 8}), "02_online_softmax", "",
       "same shape"},
      {"q is 3-d", "q.npy", npy({2, 9, 8}), "02_online_softmax", "", "4 dimensions"},
      {"NaN in q", "q.npy", nan_q, "02_online_softmax", "", "NaN"},
      {"empty sequence", "q.npy", npy({1, 2, 0, 8}), "02_online_softmax", "", "--seq-q"},
      {"do.npy missing with --backward", "do.npy", "", "00_cpu_reference", "--backward", "do.npy"},
      {"do.npy of the wrong shape", "do.npy", npy({1, 2, 8, 8}), "00_cpu_reference", "--backward",
       "do.npy"},
      {"shape flags with --load", "q.npy", q_bytes, "02_online_softmax", "--seq-q 9",
       "cannot be combined with --load"},
  };
  int n = 0;
  for (const Bad& c : cases) {
    const std::string dir = tmp / ("load" + std::to_string(n)),
                      save = tmp / ("save" + std::to_string(n));
    ++n;
    fs::copy(good, dir);
    if (c.bytes.empty())
      fs::remove(dir + "/" + c.file);
    else
      std::ofstream(dir + "/" + c.file, std::ios::binary | std::ios::trunc) << c.bytes;
    const Run r = run_step(
        c.step, "--load " + quote(dir) + " " + c.extra + " --save " + quote(save) + kQuick, tmp);
    INFO(c.what << " (" << c.step << ")\nstdout: " << r.out << "\nstderr: " << r.err);
    CHECK(r.status == 2);
    CHECK_THAT(r.err, Contains(c.says));
    CHECK(files_under(save).empty());
  }
  // A directory where a file should be: still bad input, not a failed run.
  {
    const std::string dir = tmp / "dir_q", save = tmp / "dir_q_save";
    fs::copy(good, dir);
    fs::remove(dir + "/q.npy");
    fs::create_directory(dir + "/q.npy");
    const Run r = run_step("02_online_softmax",
                           "--load " + quote(dir) + " --save " + quote(save) + kQuick, tmp);
    INFO("q.npy is a directory\n" << r.out << r.err);
    CHECK(r.status == 2);
    CHECK_THAT(r.err, Contains("q.npy"));
    CHECK(files_under(save).empty());
  }
  // A GQA mismatch with k and v agreeing: the problem itself is rejected.
  const std::string dir = tmp / "gqa", save = tmp / "gqa_save";
  fs::copy(good, dir);
  std::ofstream(dir + "/q.npy", std::ios::binary | std::ios::trunc) << npy({1, 3, 9, 8});
  std::ofstream(dir + "/k.npy", std::ios::binary | std::ios::trunc) << npy({1, 2, 13, 8});
  std::ofstream(dir + "/v.npy", std::ios::binary | std::ios::trunc) << npy({1, 2, 13, 8});
  const Run r = run_step("02_online_softmax",
                         "--load " + quote(dir) + " --save " + quote(save) + kQuick, tmp);
  INFO(r.out << r.err);
  CHECK(r.status == 2);
  CHECK_THAT(r.err, Contains("multiple of --heads-kv"));
  CHECK(files_under(save).empty());
}

TEST_CASE("programs: save and load round trips", "[programs]") {
  TempDir tmp;
  SECTION("generated inputs, saved") {
    const std::string a = tmp / "A";
    const Run r = run_step("02_online_softmax",
                           "--batch 1 --heads 4 --heads-kv 2 --seq-q 9 --seq-k 13 --dim 8 --causal "
                           "--save " +
                               quote(a) + kQuick,
                           tmp);
    INFO(r.out << r.err);
    REQUIRE(r.status == 0);
    // What the file holds is what was computed: the same inputs through the oracle here.
    Problem p = testing::problem(1, 4, 2, 9, 13, 8, true, 0);
    p.dtype = DType::f32;
    const auto [o, lse] = check_saved_forward(a, p, make_inputs(p));
    CHECK_FALSE(has_non_finite(o));
    CHECK_FALSE(has_non_finite(lse));
  }
  SECTION("float32 files in, step 02 (fp32) out, with fully masked rows") {
    Problem p = testing::problem(2, 4, 2, 11, 7, 8, true, 21);  // rows 0..3 see no key
    p.dtype = DType::f32;
    const Inputs in = make_inputs(p);
    const std::string l = tmp / "L32", s = tmp / "S32";
    write_npy_files(l, {{"q.npy", &in.q}, {"k.npy", &in.k}, {"v.npy", &in.v}});
    const Run r = run_step("02_online_softmax",
                           "--causal --load " + quote(l) + " --save " + quote(s) + kQuick, tmp);
    INFO(r.out << r.err);
    REQUIRE(r.status == 0);
    check_saved_forward(s, p, in);
  }
  SECTION("float64 files in, step 00 --backward --save-f64 out") {
    Problem p = testing::problem(1, 4, 1, 6, 10, 5, true, 22);
    p.backward = true;
    const Inputs in = make_inputs(p);
    const std::string l = tmp / "L64", s = tmp / "S64";
    write_npy_files(l, {{"q.npy", &in.q}, {"k.npy", &in.k}, {"v.npy", &in.v}, {"do.npy", &in.dout}},
                    true);
    const Run r = run_step(
        "00_cpu_reference",
        "--causal --backward --load " + quote(l) + " --save " + quote(s) + " --save-f64" + kQuick,
        tmp);
    INFO(r.out << r.err);
    REQUIRE(r.status == 0);
    CHECK(files_under(s) ==
          std::vector<std::string>{"dk.npy", "dq.npy", "dv.npy", "lse.npy", "o.npy"});
    Outputs ref = Outputs::poisoned(p);
    reference::attention(p, in, ref);
    // The same oracle on the same float64 values, saved in float64: equal to roundoff.
    CHECK(rel_error(read_npy(s + "/o.npy"), ref.o) < 1e-14);
    CHECK(rel_error(read_npy(s + "/lse.npy"), ref.lse) < 1e-14);
    CHECK(rel_error(read_npy(s + "/dq.npy"), ref.dq) < 1e-14);
    CHECK(rel_error(read_npy(s + "/dk.npy"), ref.dk) < 1e-14);
    CHECK(rel_error(read_npy(s + "/dv.npy"), ref.dv) < 1e-14);
  }
}

TEST_CASE("programs: why safe matters (step 01 unsafe on large logits)", "[programs]") {
  TempDir tmp;
  const std::string args = "--batch 1 --heads 2 --seq-q 17 --seq-k 33 --dim 64 --inputs large";
  const std::string unsafe = tmp / "unsafe", safe = tmp / "safe";
  const Run bad = run_step("01_three_pass_softmax",
                           args + " --variant unsafe --save " + quote(unsafe) + kQuick, tmp);
  INFO("unsafe: " << bad.out << bad.err);
  CHECK(bad.status == 1);  // the check against the oracle fails on the overflow...
  CHECK_THAT(bad.out, Contains("non-finite"));
  CHECK_FALSE(std::filesystem::exists(unsafe));  // ...and a failed run writes nothing

  const Run good = run_step("01_three_pass_softmax", args + " --save " + quote(safe) + kQuick, tmp);
  INFO("safe: " << good.out << good.err);
  CHECK(good.status == 0);
  CHECK_FALSE(has_non_finite(read_npy(safe + "/o.npy")));
}

TEST_CASE("programs: a GPU step with no CUDA device exits 3", "[programs]") {
  std::string why;
  if (cuda_device_count(&why) > 0) {
    SUCCEED("a CUDA device is present; the no-device path is not exercised here");
    return;
  }
  TempDir tmp;
  int n = 0;
  for (const Rung& rung : rungs()) {
    if (!rung.step || rung.step->device != Device::cuda) continue;
    ++n;
    // A problem the step supports in every other way, so only the missing device is wrong.
    const Capabilities& c = rung.step->caps;
    const int64_t dim = !c.head_dims.empty()
                            ? c.head_dims.front()
                            : (c.max_dim > 0 ? std::min<int64_t>(64, c.max_dim) : 64);
    const std::string save = tmp / (rung.name + "_save");
    const Run r = run_step(rung.name,
                           "--batch 1 --heads 2 --seq-q 17 --seq-k 23 --dim " +
                               std::to_string(dim) + " --save " + quote(save) + kQuick,
                           tmp);
    INFO(rung.name << ": " << r.out << r.err);
    CHECK(r.status == 3);
    CHECK(files_under(save).empty());
  }
  if (n == 0) SUCCEED("no GPU step was built");
}

TEST_CASE("the ladder driver: list, compare, diff and bench keep their contract",
          "[programs][driver]") {
  TempDir tmp("ladder_driver");
  const std::string ladder = LADDER_DRIVER;

  Run r = run_binary(ladder, "list", tmp);
  CHECK(r.status == 0);
  for (const Rung& g : rungs()) CHECK_THAT(r.out, Contains(g.name));

  r = run_binary(ladder, "compare --steps 0,1,2 --seq-q 33 --seq-k 47 --causal", tmp);
  INFO(r.out << r.err);
  CHECK(r.status == 0);
  CHECK_THAT(r.out, Contains("02_online_softmax") && Contains("ok"));
  CHECK(run_binary(ladder, "compare --steps 2 --heads 6 --heads-kv 4", tmp).status == 2);

  // diff: a measurement (exit 0) unless --tol is exceeded (1); shapes must agree (2).
  Tensor a({2, 3}), b({2, 3}), c({3, 2});
  for (int i = 0; i < 6; ++i) a.data[size_t(i)] = i, b.data[size_t(i)] = i + (i == 4 ? 0.5 : 0.0);
  write_npy_files(tmp.path.string(), {{"a.npy", &a}, {"b.npy", &b}, {"c.npy", &c}});
  r = run_binary(ladder, "diff " + quote(tmp / "a.npy") + " " + quote(tmp / "b.npy"), tmp);
  CHECK(r.status == 0);
  CHECK_THAT(r.out, Contains("[1, 1]"));  // where the largest difference is
  CHECK(run_binary(ladder,
                   "diff " + quote(tmp / "a.npy") + " " + quote(tmp / "b.npy") + " --tol 0.1", tmp)
            .status == 1);
  CHECK(
      run_binary(ladder, "diff " + quote(tmp / "a.npy") + " " + quote(tmp / "c.npy"), tmp).status ==
      2);
  CHECK(run_binary(ladder, "diff " + quote(tmp / "a.npy") + " " + quote(tmp / "missing.npy"), tmp)
            .status == 2);

  // bench: rows in the results schema, the header written once, rows appended.
  const std::string csv = tmp / "bench.csv";
  const std::string args =
      "bench --steps 1,2 --seqlens 64 --dims 16 --directions fwd --csv " + quote(csv);
  REQUIRE(run_binary(ladder, args, tmp).status == 0);
  REQUIRE(run_binary(ladder, args, tmp).status == 0);
  REQUIRE(run_binary(ladder, args + " --run-id given:1", tmp).status == 0);
  std::istringstream lines(read_file(csv));
  std::string line;
  int headers = 0, rows = 0;
  std::vector<std::string> runs;  // the run column, row by row
  while (std::getline(lines, line)) {
    if (line.rfind("step,", 0) == 0) {
      ++headers;
      CHECK(line ==
            "step,dtype,batch,heads,heads_kv,seq_q,seq_k,dim,causal,direction,ms,tflops,gbps,"
            "workspace_bytes,gpu,cuda,commit,dropout,density,run");
    } else if (!line.empty()) {
      ++rows;
      CHECK((line.rfind("01,fp32,", 0) == 0 || line.rfind("02,fp32,", 0) == 0));
      runs.push_back(line.substr(line.rfind(',') + 1));
    }
  }
  CHECK(headers == 1);
  REQUIRE(rows == 12);  // 2 steps x causal 0/1 x 3 invocations
  // One run id per invocation: shared by its 4 rows, different from the other invocation's.
  CHECK(runs[0] == runs[3]);
  CHECK(runs[4] == runs[7]);
  CHECK(runs[0] != runs[4]);
  CHECK(runs[0].size() >= 16);
  CHECK(runs[8] == "given:1");
  CHECK(runs[11] == "given:1");

  // A run id that would need quoting is bad input; so is appending to a file of the schema
  // before the run column (it is migrated once, explicitly), which is left as it was.
  const std::string before = read_file(csv);
  CHECK(run_binary(ladder, args + " --run-id 'a,b'", tmp).status == 2);
  const std::string old_csv = tmp / "old.csv";
  const std::string old_text =
      "step,dtype,batch,heads,heads_kv,seq_q,seq_k,dim,causal,direction,ms,tflops,gbps,"
      "workspace_bytes,gpu,cuda,commit,dropout,density\n"
      "02,fp32,1,2,2,64,64,64,0,fwd,1,1,1,0,cpu,-,abc,0,1\n";
  {
    std::ofstream f(old_csv, std::ios::binary);
    f << old_text;
  }
  const Run old_run = run_binary(
      ladder, "bench --steps 2 --seqlens 64 --dims 16 --directions fwd --csv " + quote(old_csv),
      tmp);
  CHECK(old_run.status == 2);
  CHECK_THAT(old_run.err, Contains("tools/migrate_results.py"));
  CHECK(read_file(old_csv) == old_text);
  CHECK(read_file(csv) == before);
}

// The main job on a machine without a GPU (most learners' laptops, and CI): the GPU rungs are
// not run, with the reason in plain words and each one's committed figure beside it (measured
// elsewhere, named by GPU and commit), and step 02's CPU slowdown explained.
TEST_CASE("the ladder driver without a GPU: committed figures, plain reason, step 02's note",
          "[programs][driver]") {
  std::string why;
  if (cuda_device_count(&why) > 0) {
    SUCCEED("a CUDA device is present: the no-device rows and reason are not exercised here");
    return;
  }
  TempDir tmp("ladder_no_gpu");
  const std::string ladder = LADDER_DRIVER;
  const bool committed =
      fs::exists(fs::path(LADDER_SOURCE_DIR) / "notes" / "results" / "h100.csv") ||
      fs::exists(fs::path(LADDER_SOURCE_DIR) / "notes" / "results" / "h200.csv");
  // "381 TFLOP/s, H100, 3bce7a1 (...)": a figure, a GPU's name, a commit.
  const std::regex figure(R"(\d[\d.e+]* TFLOP/s, [A-Z][A-Za-z0-9-]*, [0-9a-f]{7,}(-dirty)? \()");

  const Run list = run_binary(ladder, "list", tmp);
  const Run cmp = run_binary(ladder, "compare", tmp);
  INFO("list:\n" << list.out << list.err << "\ncompare:\n" << cmp.out << cmp.err);
  CHECK(list.status == 0);
  CHECK(cmp.status == 0);  // the CPU rungs ran and passed; the GPU rungs are "not run"
  // The reason, as the device layer gives it, on both; in plain words where no driver is loaded.
  CHECK_THAT(list.out, Contains("CUDA here: " + why));
  CHECK_THAT(cmp.out, Contains("CUDA here: " + why));
  if (!nvidia_driver_loaded())
    CHECK_THAT(why, Contains(kNoNvidiaGpu));
  else
    WARN(
        "an NVIDIA driver is loaded but no device is usable: the plain-words reason for a "
        "machine without one is not checked here ("
        << why << ")");

  auto line_of = [](const std::string& out, const std::string& name) {
    std::istringstream in(out);
    std::string line;
    while (std::getline(in, line))
      if (line.rfind(name + " ", 0) == 0) return line;
    return std::string();
  };
  int gpu_rungs = 0;
  for (const Rung& g : rungs()) {
    if (g.step && g.step->device != Device::cuda) continue;
    ++gpu_rungs;
    const std::string in_list = line_of(list.out, g.name), in_cmp = line_of(cmp.out, g.name);
    INFO(g.name << "\n  list:    " << in_list << "\n  compare: " << in_cmp);
    CHECK_THAT(in_cmp, Contains("not run"));
    if (committed) {
      CHECK(std::regex_search(in_list, figure));
      CHECK(std::regex_search(in_cmp, figure));
    }
  }
  if (gpu_rungs > 0 && committed) {
    CHECK_THAT(cmp.out, Contains("committed elsewhere (not measured here)"));
    CHECK_THAT(list.out, Contains("committed elsewhere (not measured here)"));
  }
  // The CPU rungs' rows carry no committed figure: measured here only.
  for (const char* cpu : {"00_cpu_reference", "01_three_pass_softmax", "02_online_softmax"})
    CHECK_FALSE(std::regex_search(line_of(cmp.out, cpu), figure));

  // Step 02's note appears exactly when its speed-up over 01 (the "0.64x" cell) is below 1.
  std::smatch m;
  const std::string row02 = line_of(cmp.out, "02_online_softmax");
  REQUIRE(std::regex_search(row02, m, std::regex(R"(\s(\d+\.\d+)x\s)")));
  const bool slower = std::stod(m[1].str()) < 1;
  INFO("02's speed-up over 01: " << m[1].str());
  CHECK((cmp.out.find("its gain is on the GPU") != std::string::npos) == slower);
  if (slower) CHECK_THAT(cmp.out, Contains("02 is slower than 01 here (" + m[1].str() + "x)"));

  // Only GPU rungs asked for: none can run, exit 3 (docs/CONTRACT.md), still with the figures.
  if (gpu_rungs > 0) {
    const Run only_gpu = run_binary(ladder, "compare --steps 6,7", tmp);
    INFO(only_gpu.out << only_gpu.err);
    CHECK(only_gpu.status == 3);
    CHECK_THAT(only_gpu.out, Contains("CUDA here: " + why));
    if (committed) CHECK(std::regex_search(only_gpu.out, figure));
  }
}
