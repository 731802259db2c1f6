// ladder — the driver of the attention ladder.
//
//   ladder list                 the rungs of this build, what each supports, whether it runs here
//   ladder run N [flags]        one step, exactly as its own program steps/NN_name runs it
//   ladder compare [flags]      every runnable step on the same inputs, side by side
//   ladder verify [flags]       judge outputs computed elsewhere by the harness's rule
//   ladder diff A.npy B.npy     how far two arrays are apart, and where
//   ladder bench [sweep flags]  the benchmark sweep, as rows of the results schema (CSV, JSON)
//
// Plumbing only: the algorithms live in steps/, the check in runner/check.*, what a step
// program does in runner/program.*, the table of rungs in tools/rungs.cpp. Exit status as
// docs/CONTRACT.md says: 0 ok, 1 a check failed, 2 bad or unsupported input, 3 a GPU step
// with no (suitable) CUDA device.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "csv_append.hpp"
#include "device.hpp"
#include "memory.hpp"
#include "error.hpp"
#include "npy.hpp"
#include "program.hpp"
#include "rungs.hpp"
#include "report.hpp"
#include "verify.hpp"

#ifndef LADDER_SOURCE_DIR
#define LADDER_SOURCE_DIR ""
#endif
#ifndef LADDER_CONFIGURE_COMMIT
#define LADDER_CONFIGURE_COMMIT "unknown"
#endif

namespace ladder {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// ------------------------------------------------------------------------------ small helpers

std::string two_digits(int n) {
  char b[16];
  std::snprintf(b, sizeof b, "%02d", n);
  return b;
}

template <class T>
std::string join(const std::vector<T>& v, const char* sep = " ") {
  std::ostringstream s;
  for (size_t i = 0; i < v.size(); ++i) s << (i ? sep : "") << v[i];
  return s.str();
}

// A rung by number ("5", "05") or by folder name ("05_shared_memory_fa2"); null if unknown.
const Rung* find_rung(const std::string& s) {
  const bool digits =
      !s.empty() && s.size() <= 3 &&
      std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
  for (const Rung& r : rungs())
    if ((digits && r.number == std::stoi(s)) || r.name == s) return &r;
  return nullptr;
}

std::string known_rungs() {
  std::vector<std::string> names;
  for (const Rung& r : rungs()) names.push_back(r.name);
  return join(names, ", ");
}

// The rungs named by --steps (all of them when none is named), in ladder order.
std::vector<const Rung*> select_rungs(const std::vector<std::string>& names) {
  std::vector<const Rung*> out;
  if (names.empty()) {
    for (const Rung& r : rungs()) out.push_back(&r);
    return out;
  }
  for (const std::string& n : names) {
    const Rung* r = find_rung(n);
    if (!r) throw BadInput("--steps: no rung '" + n + "'; this build knows " + known_rungs());
    if (std::find(out.begin(), out.end(), r) == out.end()) out.push_back(r);
  }
  std::sort(out.begin(), out.end(),
            [](const Rung* a, const Rung* b) { return a->number < b->number; });
  return out;
}

// Empty if step s can run on this machine, else why not (the device asked once).
std::string cannot_run_here(const Step& s) {
  if (s.device != Device::cuda) return "";
  static const std::pair<DeviceInfo, std::string> dev = []() -> std::pair<DeviceInfo, std::string> {
    try {
      return {require_device(), ""};
    } catch (const NoDevice& e) {
      return {DeviceInfo{}, e.what()};
    }
  }();
  return dev.second.empty() ? s.wrong_device(dev.first) : dev.second;
}

std::string duration_str(double s) {
  if (s < 60) return fmt(s, 1) + " s";
  const long t = long(s + 0.5);
  char b[32];
  if (t < 3600)
    std::snprintf(b, sizeof b, "%ldm %02lds", t / 60, t % 60);
  else
    std::snprintf(b, sizeof b, "%ldh %02ldm", t / 3600, (t / 60) % 60);
  return b;
}

// "[done/total] elapsed  what" on stderr, rewritten in place; only on a terminal, so that CI
// logs stay clean. clear() before printing anything else.
class Progress {
 public:
  explicit Progress(size_t total) : total_(total), on_(isatty(STDERR_FILENO) != 0) {}
  double elapsed_s() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }
  void show(size_t done, const std::string& what) {
    if (!on_) return;
    clear();
    const std::string line = "[" + std::to_string(done) + "/" + std::to_string(total_) + "] " +
                             duration_str(elapsed_s()) + "  " + what;
    std::cerr << line << std::flush;
    width_ = line.size();
  }
  void clear() {
    if (!on_ || width_ == 0) return;
    std::cerr << "\r" << std::string(width_, ' ') << "\r" << std::flush;
    width_ = 0;
  }

 private:
  size_t total_;
  bool on_;
  size_t width_ = 0;
  Clock::time_point t0_ = Clock::now();
};

// The shapes of a problem, without the dtype (which differs between the steps compared).
std::string shape_str(const Problem& p) {
  std::ostringstream s;
  s << "batch " << p.batch << ", heads " << p.heads << "/" << p.heads_kv << " (q/kv), seq "
    << p.seq_q << "x" << p.seq_k << ", dim " << p.dim << (p.causal ? ", causal" : "") << ", scale "
    << p.softmax_scale();
  return s.str();
}

// ---------------------------------------------- results (docs/CONTRACT.md, "Results files")

constexpr const char* kResultsHeader =
    "step,dtype,batch,heads,heads_kv,seq_q,seq_k,dim,causal,direction,ms,tflops,gbps,"
    "workspace_bytes,gpu,cuda,commit,dropout,density,run";
// The schema before the run column: such a file is migrated once, explicitly
// (tools/migrate_results.py), never appended to, so that no row goes without a run id.
constexpr const char* kResultsHeaderBeforeRun =
    "step,dtype,batch,heads,heads_kv,seq_q,seq_k,dim,causal,direction,ms,tflops,gbps,"
    "workspace_bytes,gpu,cuda,commit,dropout,density";

// Where a number was measured: named once per run of the driver. `run` tells this invocation's
// rows from another's at the same commit (docs/CONTRACT.md, "Results files").
struct Provenance {
  std::string gpu, cuda, commit, run;
};

// A fresh run id: the UTC time and 24 random bits, e.g. 20261126T201830Z-3f9a2c; two
// invocations within one second share one with odds of 1 in 2^24.
std::string fresh_run_id() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char when[32];
  std::strftime(when, sizeof when, "%Y%m%dT%H%M%SZ", &utc);
  std::random_device rd;
  char bits[16];
  std::snprintf(bits, sizeof bits, "%06x", unsigned(rd() & 0xffffffu));
  return std::string(when) + "-" + bits;
}

// A run id given with --run-id: 1 to 64 of [A-Za-z0-9._:+-], so that it needs no quoting in
// CSV, JSON or a shell. Empty if fine, else why not.
std::string run_id_problem(const std::string& id) {
  if (id.empty() || id.size() > 64)
    return "must be 1 to 64 characters, got " + std::to_string(id.size());
  for (unsigned char c : id)
    if (!std::isalnum(c) && !std::strchr("._:+-", c))
      return "may hold only letters, digits and . _ : + -, got '" + id + "'";
  return "";
}

// Whether `cmd` exited 0; its standard output in `out`.
bool capture(const std::string& cmd, std::string& out) {
  out.clear();
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return false;
  char buf[512];
  while (std::fgets(buf, sizeof buf, f)) out += buf;
  const int status = pclose(f);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return status == 0;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The commit the numbers belong to: $LADDER_COMMIT if set, else `git rev-parse --short HEAD` of
// the source tree now (with "-dirty" for uncommitted changes to tracked files, as
// `git describe --dirty`), else the value recorded at configure time. The status takes no
// optional locks: one killed while refreshing the index would leave index.lock behind.
std::string source_commit() {
  if (const char* env = std::getenv("LADDER_COMMIT"); env && *env) return env;
  const std::string dir = LADDER_SOURCE_DIR;
  std::string head, changes;
  if (!dir.empty() &&
      capture("git -C " + shell_quote(dir) + " rev-parse --short HEAD 2>/dev/null", head) &&
      !head.empty()) {
    const bool known =
        capture("git -C " + shell_quote(dir) +
                    " --no-optional-locks status --porcelain --untracked-files=no 2>/dev/null",
                changes);
    return head + (known && !changes.empty() ? "-dirty" : "");
  }
  return LADDER_CONFIGURE_COMMIT;
}

Provenance provenance(const std::string& run_id) {
  Provenance v;
  v.gpu = gpu_name();
  v.cuda = cuda_runtime_version();
  v.commit = source_commit();
  v.run = run_id.empty() ? fresh_run_id() : run_id;
  return v;
}

struct ResultRow {
  std::string step, dtype;
  Problem p;
  std::string direction;
  double ms = 0, tflops = 0, gbps = 0, workspace = 0;
  std::string gpu, cuda, commit, run;
  double density = 1;  // the block mask's kept fraction (1: dense)
};

// The step column: the rung's number, and for a variant other than the default its name
// after a slash ("06/baseline": docs/CONTRACT.md, "Results files").
ResultRow make_row(const Step& s, const Problem& p, bool bwd, const RunResult& r,
                   const Provenance& v, double density, const std::string& variant = "") {
  ResultRow x;
  x.density = density;
  x.step = two_digits(s.number);
  if (!variant.empty() && variant != s.variants.front().name) x.step += "/" + variant;
  x.dtype = dtype_name(p.dtype);
  x.p = p;
  x.direction = bwd ? "bwd" : "fwd";
  x.ms = bwd ? r.bwd_ms : r.fwd_ms;
  x.tflops = tflops(p, x.ms, bwd, density);
  x.gbps = gbps(p, x.ms, bwd);
  x.workspace = r.workspace_bytes;
  const bool gpu = s.device == Device::cuda;
  x.gpu = gpu ? (v.gpu.empty() ? "unknown" : v.gpu) : "cpu";
  x.cuda = gpu && !v.cuda.empty() ? v.cuda : "-";
  x.commit = v.commit;
  x.run = v.run;
  return x;
}

std::string num(double v) {
  if (!std::isfinite(v)) return "nan";
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string json_string(const std::string& s) {
  std::string q = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      q += '\\';
      q += char(c);
    } else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      q += b;
    } else {
      q += char(c);
    }
  }
  return q + "\"";
}

std::string json_number(double v) {
  return std::isfinite(v) ? num(v) : "null";
}

std::string csv_line(const ResultRow& r) {
  const Problem& p = r.p;
  std::ostringstream s;
  s << r.step << "," << r.dtype << "," << p.batch << "," << p.heads << "," << p.heads_kv << ","
    << p.seq_q << "," << p.seq_k << "," << p.dim << "," << (p.causal ? 1 : 0) << "," << r.direction
    << "," << num(r.ms) << "," << num(r.tflops) << "," << num(r.gbps) << "," << fmt(r.workspace, 0)
    << "," << csv_field(r.gpu) << "," << csv_field(r.cuda) << "," << csv_field(r.commit) << ","
    << num(p.dropout) << "," << num(r.density) << "," << csv_field(r.run);
  return s.str();
}

std::string json_object(const ResultRow& r) {
  const Problem& p = r.p;
  std::ostringstream s;
  s << "{\"step\": " << json_string(r.step) << ", \"dtype\": " << json_string(r.dtype)
    << ", \"batch\": " << p.batch << ", \"heads\": " << p.heads << ", \"heads_kv\": " << p.heads_kv
    << ", \"seq_q\": " << p.seq_q << ", \"seq_k\": " << p.seq_k << ", \"dim\": " << p.dim
    << ", \"causal\": " << (p.causal ? 1 : 0) << ", \"direction\": " << json_string(r.direction)
    << ", \"ms\": " << json_number(r.ms) << ", \"tflops\": " << json_number(r.tflops)
    << ", \"gbps\": " << json_number(r.gbps) << ", \"workspace_bytes\": " << fmt(r.workspace, 0)
    << ", \"gpu\": " << json_string(r.gpu) << ", \"cuda\": " << json_string(r.cuda)
    << ", \"commit\": " << json_string(r.commit) << ", \"dropout\": " << json_number(p.dropout)
    << ", \"density\": " << json_number(r.density) << ", \"run\": " << json_string(r.run) << "}";
  return s.str();
}

// Rows of the results schema for a CSV file, appended when the run ends (CsvAppender: one
// locked read-merge-write, so two runs appending at once keep each other's rows; a failed
// write exits 2 and leaves the file as it was). A new or empty file gets the header; an
// existing file must start with the same header, so that two schemas never mix in one file
// (checked before anything is measured, and again under the lock).
class ResultsCsv {
 public:
  explicit ResultsCsv(const std::string& path)
      : file_(path, kResultsHeader, [path](const std::string& first) {
          if (first == kResultsHeaderBeforeRun)
            throw BadInput("--csv " + path +
                           ": the file has the results schema from before the run column; "
                           "migrate it once with tools/migrate_results.py " +
                           path + " (its rows get run = commit:<their commit>), then append");
          if (first != kResultsHeader)
            throw BadInput("--csv " + path + ": the file's header is\n  " + first +
                           "\nnot the results schema\n  " + kResultsHeader +
                           "\n(give a new file, or one written by ladder bench/compare)");
        }) {}
  void add(const ResultRow& r) { file_.add(csv_line(r)); }
  // Appends the rows; "added 12 rows to x.csv (40 in all)" (nothing without --csv).
  std::string commit() { return file_.append(); }

 private:
  CsvAppender file_;
};

// Writes the rows as one JSON array, replacing the file atomically (a reader never sees half
// an array; a failure leaves no temporary behind).
void write_json(const std::string& path, const std::vector<ResultRow>& rows) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < rows.size(); ++i) out << (i ? ",\n " : "\n ") << json_object(rows[i]);
  out << "\n]\n";
  write_file_atomically(path, out.str(), "--json " + path);
}

// Fails early, before hours of sweeping, if an output file could not be written at the end:
// the target must be a regular file or a new path, and no two outputs may name one file.
void check_outputs(const std::vector<std::pair<std::string, std::string>>& flag_paths) {
  for (size_t i = 0; i < flag_paths.size(); ++i) {
    const auto& [flag, path] = flag_paths[i];
    if (path.empty()) continue;
    require_replaceable(path, flag);
    for (size_t j = 0; j < i; ++j)
      if (!flag_paths[j].second.empty() && same_file(flag_paths[j].second, path))
        throw BadInput(flag_paths[j].first + " " + flag_paths[j].second + " and " + flag + " " +
                       path + " name the same file; give each output its own");
  }
}

// ------------------------------------------ committed figures (notes/results/h100, h200.csv)

// A forward row of a GPU rung's default variant, dense, as committed under notes/results/.
struct CommittedRow {
  int step = -1;
  std::string dtype, gpu, commit;
  int64_t batch = 0, heads = 0, heads_kv = 0, seq_q = 0, seq_k = 0, dim = 0;
  bool causal = false;
  double tflops = 0;
  size_t file = 0, line = 0;  // which file (0: h100.csv), which line: later is newer
};

struct CommittedResults {
  std::vector<CommittedRow> rows;
  std::vector<std::string> files;    // the files read, relative to the source tree
  std::vector<std::string> missing;  // those not found
  std::string dir;                   // the source tree, as the build recorded it
};

// One line of a results CSV, split into fields (a field may be quoted, as csv_field writes it).
std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
      out.back() += '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      out.emplace_back();
    } else if (c != '\r') {
      out.back() += c;
    }
  }
  return out;
}

// The committed rows a rung that cannot run here is shown with, read once from the source tree
// (LADDER_SOURCE_DIR, recorded at configure time). A file that is absent or not of the results
// schema gives no rows; a malformed row is skipped. Only forward rows of a rung's default
// variant (step "NN"), dense and without dropout, with a finite positive TFLOP/s.
const CommittedResults& committed_results() {
  static const CommittedResults all = [] {
    CommittedResults c;
    c.dir = LADDER_SOURCE_DIR;
    c.files = {"notes/results/h100.csv", "notes/results/h200.csv"};
    for (size_t f = 0; f < c.files.size(); ++f) {
      std::ifstream in(c.dir.empty() ? std::string() : (fs::path(c.dir) / c.files[f]).string());
      std::string line;
      if (!in || !std::getline(in, line)) {
        c.missing.push_back(c.files[f]);
        continue;
      }
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line != kResultsHeader) {
        c.missing.push_back(c.files[f] + " (not of the results schema)");
        continue;
      }
      for (size_t n = 2; std::getline(in, line); ++n) {
        const std::vector<std::string> v = split_csv_line(line);
        if (v.size() != 20 || v[9] != "fwd" || v[0].size() != 2 ||
            !std::isdigit((unsigned char)v[0][0]) || !std::isdigit((unsigned char)v[0][1]))
          continue;
        try {
          CommittedRow r;
          r.step = std::stoi(v[0]);
          r.dtype = v[1];
          r.batch = std::stoll(v[2]);
          r.heads = std::stoll(v[3]);
          r.heads_kv = std::stoll(v[4]);
          r.seq_q = std::stoll(v[5]);
          r.seq_k = std::stoll(v[6]);
          r.dim = std::stoll(v[7]);
          r.causal = v[8] == "1";
          r.tflops = std::stod(v[11]);
          r.gpu = v[14];
          r.commit = v[16];
          r.file = f;
          r.line = n;
          const bool dense = std::stod(v[17]) == 0 && std::stod(v[18]) == 1;
          if (dense && std::isfinite(r.tflops) && r.tflops > 0 && r.batch > 0 && r.heads > 0 &&
              r.heads_kv > 0 && r.seq_q > 0 && r.seq_k > 0 && r.dim > 0)
            c.rows.push_back(r);
        } catch (const std::exception&) {  // a malformed row: not a figure to show
        }
      }
    }
    return c;
  }();
  return all;
}

// "NVIDIA H100 80GB HBM3" -> "H100".
std::string short_gpu_name(const std::string& gpu) {
  std::istringstream words(gpu);
  std::string w;
  while (words >> w)
    if (w != "NVIDIA") return w;
  return gpu.empty() ? "unknown GPU" : gpu;
}

// The committed forward figure of rung `number` at problem p in `dtype` (empty: the rung's
// dtype is not known in this build), or the nearest point committed, as a cell:
// "275 TFLOP/s, H100, 0ee43bd (this shape, bf16)" or "... (nearest: seq 512, dim 64, bf16,
// batch 32, heads 32)"; empty when nothing is committed for the rung.
std::string committed_figure(int number, const Problem& p, const std::string& dtype) {
  const CommittedResults& c = committed_results();
  auto dist = [](double a, double b) { return std::fabs(std::log2(a / b)); };
  // Nearest first by: dtype (where this build does not know the rung's, the dtype it has the
  // most rows of: its default), causal, dim, sequence lengths, batch x heads, GQA ratio; then
  // the H100 file before the H200 one, and the newest row.
  std::map<std::string, long> rows_of;
  for (const CommittedRow& r : c.rows)
    if (r.step == number) ++rows_of[r.dtype];
  using Key = std::tuple<long, int, double, double, double, double, size_t, long>;
  const CommittedRow* best = nullptr;
  Key best_key{};
  for (const CommittedRow& r : c.rows) {
    if (r.step != number) continue;
    const Key k{dtype.empty() ? -rows_of[r.dtype] : long(r.dtype != dtype),
                r.causal != p.causal,
                dist(double(r.dim), double(p.dim)),
                dist(double(r.seq_q), double(p.seq_q)) + dist(double(r.seq_k), double(p.seq_k)),
                dist(double(r.batch * r.heads), double(p.batch * p.heads)),
                dist(double(r.heads) / double(r.heads_kv), double(p.heads) / double(p.heads_kv)),
                r.file,
                -long(r.line)};
    if (!best || k < best_key) best = &r, best_key = k;
  }
  if (!best) return "";
  const CommittedRow& r = *best;
  char rate[32];
  std::snprintf(rate, sizeof rate, "%.3g", r.tflops);
  std::string s = std::string(rate) + " TFLOP/s, " + short_gpu_name(r.gpu) + ", " + r.commit;
  const bool exact = r.batch == p.batch && r.heads == p.heads && r.heads_kv == p.heads_kv &&
                     r.seq_q == p.seq_q && r.seq_k == p.seq_k && r.dim == p.dim &&
                     r.causal == p.causal && (dtype.empty() || r.dtype == dtype);
  if (exact) return s + " (this shape, " + r.dtype + ")";
  s += " (nearest: seq " +
       (r.seq_q == r.seq_k ? std::to_string(r.seq_q)
                           : std::to_string(r.seq_q) + "x" + std::to_string(r.seq_k)) +
       ", dim " + std::to_string(r.dim) + ", " + r.dtype + (r.causal ? ", causal" : "") +
       ", batch " + std::to_string(r.batch) + ", heads " + std::to_string(r.heads);
  if (r.heads_kv != r.heads) s += "/" + std::to_string(r.heads_kv);
  return s + ")";
}

// Under a table with committed figures: where they come from, or why there are none.
std::string committed_legend(bool shown) {
  const CommittedResults& c = committed_results();
  std::string s;
  if (shown)
    s = "committed: the forward TFLOP/s of a rung that cannot run here, as measured on that GPU "
        "at that commit (not here), from " +
        join(c.files, " and ") +
        ": at this shape where a committed row matches, else the nearest point committed.\n";
  if (!c.missing.empty()) {
    const bool many = c.missing.size() > 1;
    s += "committed figures: " + join(c.missing, ", ") + (many ? " are" : " is") +
         " missing under " +
         (c.dir.empty() ? std::string("the source tree (its path is unknown to this build)")
                        : c.dir) +
         ": nothing is shown from " + (many ? "them" : "it") + ".\n";
  }
  return s;
}

// ------------------------------------------------------------------------------------ list

int cmd_list() {
  std::cout << "The attention ladder: " << rungs().size() << " rungs in this build.\n"
            << "CUDA here: " << cuda_device_description() << "\n\n";
  // A rung that cannot run here gets its committed figure at compare's default problem.
  // (Problem's defaults are the flags' defaults; --heads-kv defaults to --heads.)
  Problem shape;
  shape.dtype = DType::f32;
  shape.heads_kv = shape.heads;
  std::vector<std::vector<std::string>> cells;
  bool any_committed = false;
  for (const Rung& r : rungs()) {
    if (!r.step) {
      const std::string fig = committed_figure(r.number, shape, "");
      any_committed |= !fig.empty();
      cells.push_back({r.name, "-", "-", "-", r.not_built, fig.empty() ? "-" : fig});
      continue;
    }
    const Step& s = *r.step;
    std::vector<std::string> v;
    for (const Variant& x : s.variants) v.push_back(x.name + (x.checked ? "" : " (unchecked)"));
    const std::string why = cannot_run_here(s);
    const std::string fig =
        why.empty() ? "" : committed_figure(r.number, shape, dtype_name(s.default_dtype()));
    any_committed |= !fig.empty();
    // The full reason is on the "CUDA here" line above; the column keeps its gist.
    cells.push_back({s.name, s.device_name(), s.capabilities_str(), join(v, ", "),
                     why.empty() ? "yes" : why.substr(0, why.find(':')), fig.empty() ? "-" : fig});
  }
  std::vector<std::string> head = {"step", "device", "supports", "variants", "runs here"};
  if (any_committed) head.push_back("committed elsewhere (not measured here)");
  Table t(head);
  for (std::vector<std::string>& row : cells) {
    if (!any_committed) row.pop_back();
    t.add(row);
  }
  t.print(std::cout);
  if (any_committed)
    std::cout << "\nAt `ladder compare`'s default shape (" << shape_str(shape) << ").\n";
  std::cout << (any_committed ? "" : "\n") << committed_legend(any_committed);

  std::cout << "\nWhat each rung adds (the first variant is the default; an unchecked variant "
               "exists to show a failure):\n";
  for (const Rung& r : rungs()) {
    if (!r.step) continue;
    const Step& s = *r.step;
    std::cout << "  " << s.name << ": " << s.summary << "\n";
    if (!s.caps.limits.empty()) std::cout << "      limits: " << s.caps.limits << "\n";
    for (const Variant& x : s.variants)
      std::cout << "      " << x.name << (x.checked ? "" : " (unchecked)") << ": " << x.summary
                << "\n";
  }
  std::cout << "\nRun one with `ladder run N` (the same flags as its program steps/NN_name).\n";
  return kExitOk;
}

// ------------------------------------------------------------------------------------- run

int cmd_run(const std::string& which, const CommonOptions& o) {
  const Rung* r = find_rung(which);
  if (!r) {
    std::cerr << "error: no rung '" << which << "'; this build knows " << known_rungs() << "\n";
    return kExitBadInput;
  }
  if (!r->step) {  // only GPU rungs go unbuilt: treat it as "no CUDA device here"
    std::cerr << "error: " << r->name << ": " << r->not_built << "\n";
    return kExitNoDevice;
  }
  return run_step_cli(*r->step, o);
}

// --------------------------------------------------------------------------------- compare

struct CompareArgs {
  CommonOptions o;
  std::vector<std::string> steps;
  std::string csv, run_id;
};

struct CompareRow {
  const Rung* rung = nullptr;
  std::string variant = "-", dtype = "-";
  Problem p;
  RunResult r;
  CheckReport check;
  bool ran = false, failed = false, no_device = false;
  std::string note;
};

// The inputs are shared, so the largest need of any step decides whether they can be made.
void require_compare_memory(const std::vector<const Rung*>& selected, const Problem& p,
                            bool dtype_forced, CheckMode mode) {
  double need = 0;
  for (const Rung* rung : selected)
    if (rung->step) {
      Problem ps = p;
      ps.dtype = dtype_forced ? p.dtype : rung->step->default_dtype();
      need = std::max(need, host_bytes_needed(*rung->step, ps, RunOptions{}, mode, false));
    }
  if (need > 0.9 * available_host_bytes())
    throw BadInput("this comparison needs about " + fmt(need / double(1ull << 30), 2) +
                   " GiB of host memory (inputs, outputs and the oracle's check); " +
                   fmt(available_host_bytes() / double(1ull << 30), 2) + " GiB are available");
}

// The checked run of one step that can run here, into its row: the timing and the check, or
// why it did not run. `asked` is the shared problem (its backward flag says what was asked).
CheckedRun run_compare_row(CompareRow& row, const Step& s, const Problem& asked, const Inputs& in,
                           const Prepared& host, CheckMode mode) {
  const Problem& ps = row.p;
  CheckedRun c;
  try {
    if (ps.dtype != asked.dtype) check_input_range(ps, in);  // obtain_inputs checked p's dtype
    c = run_checked(s, ps, in, prepare_device(s, ps, host), mode);
    row.ran = true;
    row.r = c.result;
    row.check = c.check;
    row.failed = !c.check.pass;
    if (row.failed)
      row.note = c.check.first_failure();
    else if (asked.backward && !s.caps.backward)
      row.note = "forward only: no backward pass";
  } catch (const NoDevice& e) {
    row.note = e.what();
    row.no_device = true;
  } catch (const BadInput& e) {
    row.note = std::string("cannot run: ") + e.what();
  } catch (const std::bad_alloc&) {
    row.note = "cannot run: " + out_of_memory_message();
  } catch (const std::exception& e) {  // a CUDA failure or another bug: nothing to trust
    row.ran = true;
    row.failed = true;
    row.note = std::string("the run failed: ") + e.what();
  }
  return c;
}

// One rung of the comparison on the shared inputs `base` (of problem p), rounded to the step's
// dtype; its outputs staged into `saved` for --save.
CompareRow compare_step(const Rung& rung, const Problem& p, const Inputs& base,
                        const CommonOptions& o, CheckMode mode, bool dtype_forced,
                        FolderPublisher& saved) {
  CompareRow row;
  row.rung = &rung;
  if (!rung.step) {
    row.note = rung.not_built;
    row.no_device = true;  // only GPU rungs go unbuilt (no CUDA toolkit)
    return row;
  }
  const Step& s = *rung.step;
  row.variant = s.variants.front().name;
  Problem ps = p;
  ps.dtype = dtype_forced ? p.dtype : s.default_dtype();
  ps.backward = p.backward && s.caps.backward;  // a forward-only step still shows its forward
  row.dtype = dtype_name(ps.dtype);
  row.p = ps;
  // What the problem asks of the step first (exit 2 if no step can run it), the device
  // after (exit 3 only when the problem was fine).
  Prepared host;
  try {
    host = prepare_host(s, ps, resolve_run_options(s, o), mode, true);
  } catch (const BadInput& e) {
    row.note = std::string("cannot run: ") + e.what();
    return row;
  }
  if (const std::string dev_why = cannot_run_here(s); !dev_why.empty()) {
    row.note = dev_why;
    row.no_device = true;
    return row;
  }
  Inputs rounded;
  const Inputs* in = &base;
  if (ps.dtype != p.dtype && ps.dtype != DType::f64) {  // to float64 changes nothing
    rounded = base;
    round_inputs(rounded, ps.dtype);
    in = &rounded;
    if (const std::string bad = non_finite_input(rounded); !bad.empty()) {
      row.note = "cannot run: the inputs are not finite once rounded to " + row.dtype + ": " + bad;
      return row;
    }
  }
  const CheckedRun c = run_compare_row(row, s, p, *in, host, mode);
  if (!o.save.empty() && row.ran && !c.out.o.empty())  // a failed check's outputs too
    stage_outputs(saved, s.name, c.out, ps.backward, o.save_f64);
  return row;
}

// The speed-up column: the previous timed step's median time over this one's.
std::string speedup(const CompareRow* before, const CompareRow& row, bool bwd) {
  const double ms = bwd ? row.r.bwd_ms : row.r.fwd_ms;
  if (!before || !(ms > 0)) return "-";
  return fmt((bwd ? before->r.bwd_ms : before->r.fwd_ms) / ms, 2) + "x";
}

std::vector<std::string> compare_head(bool backward, bool committed) {
  std::vector<std::string> head = {"step", "variant", "dtype", "fwd ms", "TFLOP/s", "GB/s"};
  if (backward) head.insert(head.end(), {"bwd ms", "TFLOP/s", "GB/s"});
  head.insert(head.end(), {"workspace", "O err (tol)", "check", "speed-up"});
  if (backward) head.push_back("bwd speed-up");
  if (committed) head.push_back("committed elsewhere (not measured here)");
  head.push_back("note");
  return head;
}

// A step's cells: timings only for a step that passed its check; `prev` and `prev_bwd` are the
// previous steps with a forward and a backward timing; `committed` (null: no such column) the
// committed figure of a step that cannot run here.
std::vector<std::string> compare_cells(const CompareRow& row, bool backward, const CompareRow* prev,
                                       const CompareRow* prev_bwd, const std::string* committed) {
  const bool timed = row.ran && !row.failed;
  const bool has_bwd = timed && row.p.backward;
  std::vector<std::string> cells = {row.rung->name, row.variant, row.dtype};
  auto rates = [&](double ms, bool bwd, bool have) {
    cells.push_back(have ? fmt(ms, 3) : "-");
    cells.push_back(have ? fmt(tflops(row.p, ms, bwd), 4) : "-");
    cells.push_back(have ? fmt(gbps(row.p, ms, bwd), 2) : "-");
  };
  rates(row.r.fwd_ms, false, timed);
  if (backward) rates(row.r.bwd_ms, true, has_bwd);
  cells.push_back(timed ? fmt_bytes(row.r.workspace_bytes) : "-");
  std::string err = "-", verdict = "not run";
  if (row.ran) {
    verdict = row.failed ? "FAIL" : row.check.tensors.empty() ? "not checked" : "ok";
    for (const TensorCheck& tc : row.check.tensors)
      if (tc.name == "O") err = fmt_sci(tc.step.max_abs) + " (" + fmt_sci(tc.tol) + ")";
  }
  cells.push_back(err);
  cells.push_back(verdict);
  cells.push_back(timed ? speedup(prev, row, false) : "-");
  if (backward) cells.push_back(has_bwd ? speedup(prev_bwd, row, true) : "-");
  if (committed) cells.push_back(committed->empty() ? "-" : *committed);
  cells.push_back(row.note);
  return cells;
}

struct CompareTally {
  int failed = 0, ran = 0, no_device = 0;
  bool committed = false;     // a committed figure was shown
  double online_speedup = 0;  // 02's forward speed-up over 01 when both ran on the CPU, else 0
  std::string check_mode;     // the first checked step's ("full", "sampled: ...")
};

// The table of the comparison, and a --csv row per timed step and direction.
Table tabulate_compare(const std::vector<CompareRow>& rows, const Problem& shape, double density,
                       const Provenance& prov, ResultsCsv& csv, CompareTally& tally) {
  const bool backward = shape.backward;
  // A step that cannot run here for want of a device: its committed figure, at this problem
  // (its forward, in the step's dtype where this build knows it).
  std::vector<std::string> committed;
  for (const CompareRow& row : rows) {
    committed.push_back(row.no_device
                            ? committed_figure(row.rung->number, row.rung->step ? row.p : shape,
                                               row.dtype == "-" ? "" : row.dtype)
                            : "");
    tally.committed |= !committed.back().empty();
  }
  Table t(compare_head(backward, tally.committed));
  const CompareRow* prev = nullptr;      // the previous step with a timing
  const CompareRow* prev_bwd = nullptr;  // ... and with a backward timing
  for (size_t i = 0; i < rows.size(); ++i) {
    const CompareRow& row = rows[i];
    t.add(compare_cells(row, backward, prev, prev_bwd, tally.committed ? &committed[i] : nullptr));
    tally.ran += row.ran;
    tally.failed += row.failed;
    tally.no_device += row.no_device;
    if (row.ran && tally.check_mode.empty()) tally.check_mode = row.check.mode;
    const bool timed = row.ran && !row.failed;
    if (timed && prev && row.rung->number == 2 && prev->rung->number == 1 &&
        row.rung->step->device == Device::cpu && prev->rung->step->device == Device::cpu &&
        row.r.fwd_ms > 0)
      tally.online_speedup = prev->r.fwd_ms / row.r.fwd_ms;
    if (timed) {
      prev = &row;
      csv.add(make_row(*row.rung->step, row.p, false, row.r, prov, density));
    }
    if (timed && row.p.backward) {
      prev_bwd = &row;
      csv.add(make_row(*row.rung->step, row.p, true, row.r, prov, density));
    }
  }
  return t;
}

// After the table: what the columns mean, then the files (only when every step passed) and the
// exit status.
int finish_compare(const CompareArgs& a, const CompareTally& tally, FolderPublisher& saved,
                   ResultsCsv& csv) {
  const CommonOptions& o = a.o;
  if (tally.ran)
    std::cout << "\nO err: max |O - O_ref| vs the float64 oracle (" << tally.check_mode
              << "); tol: the harness rule (2x a plain same-precision computation, 3x for "
                 "gradients, plus a floor); check covers O, LSE (and dQ, dK, dV).\nspeed-up: "
                 "the previous timed step's median time over this one's; a step that fails its "
                 "check gets no timing.\n";
  if (tally.online_speedup > 0 && tally.online_speedup < 1)  // notes/02_online_softmax.md
    std::cout << "02 is slower than 01 here (" << fmt(tally.online_speedup, 2)
              << "x): on a CPU, 01's row of S sits in L1 anyway, so one pass over the keys "
                 "instead of three saves no memory traffic, only adds rescaling; its gain is on "
                 "the GPU, where S would otherwise live in HBM (03 against 04; "
                 "notes/02_online_softmax.md).\n";
  if (tally.no_device)  // why the GPU rungs did not run, in plain words, and what was measured
    std::cout << "CUDA here: " << cuda_device_description() << "\n"
              << committed_legend(tally.committed);
  if (tally.failed) {  // a failed comparison writes nothing: no --save folder, no --csv row
    if (!o.save.empty() || !a.csv.empty())
      std::cout << "nothing was written (" << tally.failed << " step(s) failed their check)\n";
    return kExitCheckFailed;
  }
  if (tally.ran == 0) {  // bad input (or no device): nothing to write
    std::cerr << "error: no step could run this problem (see the notes)\n";
    return tally.no_device > 0 ? kExitNoDevice : kExitBadInput;
  }
  if (!o.save.empty()) {
    // Afterwards the folder holds this run's step outputs only: the output files of a step
    // folder from an earlier comparison that this one did not write are removed (the folder
    // itself, and any other file in it, is left).
    for (const Rung& r : rungs()) saved.clear(r.name);
    const std::string note = saved.publish();  // all steps' folders, or none
    std::cout << "saved each step's outputs under " << o.save << "/NN_name/\n";
    if (!note.empty()) std::cout << "note: " << note << "\n";
  }
  if (const std::string w = csv.commit(); !w.empty()) std::cout << w << "\n";
  return kExitOk;
}

int cmd_compare(const CompareArgs& a) {
  const CommonOptions& o = a.o;
  // The inputs every step shares: generated (or loaded) once, rounded to fp32 (or to --dtype),
  // then to each step's own dtype, so that 00 (fp64) sees exactly the values 01..05 see.
  Problem p = resolve_problem(o, DType::f32);
  const bool dtype_forced = !o.dtype.empty();
  const CheckMode mode = check_options(o, p);
  const std::vector<const Rung*> selected = select_rungs(a.steps);
  check_outputs({{"--csv", a.csv}});
  if (!o.save.empty()) {  // the folder, and every rung's: this run writes some, clears the others
    check_publish_target(o.save, "--save");
    for (const Rung& rung : rungs())
      check_save_folder((fs::path(o.save) / rung.name).string(), "--save");
  }
  ResultsCsv csv(a.csv);
  require_compare_memory(selected, p, dtype_forced, mode);
  const Inputs base = obtain_inputs(o, p);
  FolderPublisher saved(o.save, output_names(), "--save " + o.save);  // published at the end

  std::cout << "compare: " << shape_str(p) << "\n  inputs: "
            << (o.load.empty() ? std::string(o.inputs) + ", seed " + std::to_string(p.seed)
                               : "loaded from " + o.load)
            << ", rounded to " << dtype_name(p.dtype)
            << (dtype_forced ? "" : " and then to each step's dtype") << "\n";

  std::vector<CompareRow> rows;
  Progress progress(selected.size());
  for (const Rung* rung : selected) {
    progress.show(rows.size(), rung->name);
    rows.push_back(compare_step(*rung, p, base, o, mode, dtype_forced, saved));
  }
  progress.clear();

  const Provenance prov = a.csv.empty() ? Provenance{} : provenance(a.run_id);
  CompareTally tally;
  const Table t = tabulate_compare(rows, p, base.mask.density(), prov, csv, tally);
  std::cout << "\n";
  t.print(std::cout);
  return finish_compare(a, tally, saved, csv);
}

// ------------------------------------------------------------------------------------ diff

int cmd_diff(const std::string& path_a, const std::string& path_b, bool have_tol, double tol) {
  // The headers first: different shapes, or more than memory holds, are refused before a
  // byte of data is read.
  const NpyHeader ha = read_npy_header(path_a), hb = read_npy_header(path_b);
  if (ha.shape != hb.shape) {
    auto str = [](const std::vector<int64_t>& s) { return "[" + join(s, ", ") + "]"; };
    throw BadInput("the shapes differ: " + path_a + " is " + str(ha.shape) + ", " + path_b +
                   " is " + str(hb.shape));
  }
  const double need = 2.0 * 8.0 * double(ha.numel());  // both arrays as float64
  if (need > 0.9 * available_host_bytes())
    throw BadInput("diff needs about " + fmt(need / double(1ull << 30), 2) +
                   " GiB of host memory to hold both arrays; " +
                   fmt(available_host_bytes() / double(1ull << 30), 2) + " GiB are available");
  const Tensor a = read_npy(path_a, ha), b = read_npy(path_b, hb);
  // B is the reference: relative errors are measured against it (the harness's comparison).
  const ErrorStats e = compare(a.data, b.data);
  const double max_abs = e.max_abs, b_max = e.ref_max;
  const int64_t where_abs = e.where, mismatches = e.bad, first_mismatch = e.first_bad;
  int64_t nonfinite_a = 0, nonfinite_b = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    nonfinite_a += !std::isfinite(a.data[size_t(i)]);
    nonfinite_b += !std::isfinite(b.data[size_t(i)]);
  }
  // The elementwise relative error blows up where b is (nearly) zero; count only elements
  // that are not tiny next to the tensor's scale.
  const double tiny = 1e-6 * b_max;
  double max_rel = 0;
  int64_t where_rel = -1, rel_count = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data[size_t(i)], y = b.data[size_t(i)];
    if (!std::isfinite(x) || !std::isfinite(y) || !(std::fabs(y) > tiny)) continue;
    ++rel_count;
    const double r = std::fabs(x - y) / std::fabs(y);
    if (r > max_rel || where_rel < 0) max_rel = r, where_rel = i;
  }

  const std::vector<int64_t>& shape = a.shape;
  auto at = [&](int64_t i) {
    return index_str(shape, i) + " (a = " + fmt_sci(a.data[size_t(i)], 6) +
           ", b = " + fmt_sci(b.data[size_t(i)], 6) + ")";
  };
  std::cout << "a: " << path_a << "\nb: " << path_b << " (the reference)\nshape " << a.shape_str()
            << ", " << a.numel() << " elements\n";
  if (where_abs >= 0 && max_abs == 0) {
    std::cout << "max abs error        0 (identical wherever both are finite)\n";
  } else if (where_abs >= 0) {
    std::cout << "max abs error        " << fmt_sci(max_abs, 3) << " at " << at(where_abs) << "\n"
              << "max rel error        " << fmt_sci(e.max_rel, 3)
              << "  (max |a - b| / max |b|, max |b| = " << fmt_sci(b_max, 3) << ")\n";
    if (where_rel >= 0)
      std::cout << "max elementwise rel  " << fmt_sci(max_rel, 3) << " at " << at(where_rel)
                << "\n                     (|a - b| / |b| over the " << rel_count
                << " elements with |b| > 1e-6 max |b|)\n";
  } else {
    std::cout << (a.numel() ? "no element is finite in both files\n" : "no elements\n");
  }
  std::cout << "non-finite mismatches " << mismatches;
  if (mismatches) std::cout << ", first at " << at(first_mismatch);
  std::cout << "; non-finite elements: a " << nonfinite_a << ", b " << nonfinite_b << "\n";
  if (!have_tol) return kExitOk;
  const bool pass = max_abs <= tol && mismatches == 0;
  std::cout << (pass ? "within" : "NOT within") << " --tol " << fmt_sci(tol, 3) << "\n";
  return pass ? kExitOk : kExitCheckFailed;
}

// ----------------------------------------------------------------------------------- bench

struct BenchArgs {
  std::string preset = "quick";
  std::vector<std::string> variants;  // empty or "default": each step's default; "all"; names
  std::vector<std::string> steps, dtypes, directions;
  std::vector<double> dropouts;         // empty: 0 only
  std::vector<std::string> sparsities;  // "dense", "random:RHO", "local:W"; empty: dense only
  std::string mask_block;
  uint64_t dropout_seed = 0;
  std::vector<int64_t> seqlens, dims;
  std::vector<int> causal;
  int64_t tokens = 0, hidden = 0;
  int repeats = 0, warmup = -1;
  std::string check = "auto";
  uint64_t seed = 0;
  std::string csv, json, run_id;
};

struct Preset {
  std::vector<int64_t> seqlens, dims;
  std::vector<int> causal;
  std::vector<std::string> directions;
  int64_t tokens, hidden;
};

// quick: seconds on a laptop CPU. flash: flash-attention's benchmark shapes (B*N = 16384 tokens,
// H*d = 2048, so every point does the same work per token).
Preset preset_values(const std::string& name) {
  if (name == "flash")
    return {{512, 1024, 2048, 4096, 8192, 16384}, {64, 128}, {0, 1}, {"fwd", "bwd"}, 16384, 2048};
  return {{128, 256, 512}, {64}, {0, 1}, {"fwd", "bwd"}, 512, 256};
}

// One measured point: a step on one problem in one direction.
struct BenchPoint {
  const Step* step;
  Problem p;            // p.backward: the bwd direction
  size_t group;         // index of its (seq, dim) inputs
  std::string variant;  // empty: the step's default
  Prepared host;        // resolved against the step when the sweep was planned
};

// The variants a sweep runs of step s: its default, all its checked ones, or the named ones it
// has (a name a step lacks is not an error: other steps of the sweep may have it).
std::vector<std::string> variants_of(const Step& s, const std::vector<std::string>& asked) {
  if (asked.empty() || (asked.size() == 1 && asked[0] == "default")) return {""};
  std::vector<std::string> out;
  for (const Variant& v : s.variants)
    if (v.checked &&
        (asked[0] == "all" || std::find(asked.begin(), asked.end(), v.name) != asked.end()))
      out.push_back(&v == &s.variants.front() ? "" : v.name);
  return out;
}

std::string point_str(const BenchPoint& pt) {
  const Problem& p = pt.p;
  std::ostringstream s;
  s << two_digits(pt.step->number) << (pt.variant.empty() ? "" : " [" + pt.variant + "]") << " "
    << dtype_name(p.dtype) << " batch " << p.batch << " heads " << p.heads << " seq " << p.seq_q
    << " dim " << p.dim << (p.causal ? " causal" : "")
    << (p.dropout > 0 ? " dropout " + fmt(p.dropout, 2) : "")
    << (p.sparsity.active() ? " " + p.sparsity.describe() : "") << (p.backward ? " bwd" : " fwd");
  return s.str();
}

// The sweep: the preset, with whatever the flags name instead.
void apply_preset(BenchArgs& a) {
  const Preset pre = preset_values(a.preset);
  if (a.seqlens.empty()) a.seqlens = pre.seqlens;
  if (a.dims.empty()) a.dims = pre.dims;
  if (a.causal.empty()) a.causal = pre.causal;
  if (a.directions.empty()) a.directions = pre.directions;
  if (a.tokens == 0) a.tokens = pre.tokens;
  if (a.hidden == 0) a.hidden = pre.hidden;
  // (The flags' validators checked the ranges: seq, dim, tokens, hidden >= 1, dropout in [0, 1).)
  if (a.dropouts.empty()) a.dropouts = {0.0};
  if (a.sparsities.empty()) a.sparsities = {"dense"};
}

// What the flags of a sweep say beyond its lists of values, parsed (BadInput if malformed).
struct Sweep {
  std::vector<BlockSparsity> sparsities;
  std::vector<DType> dtypes;  // empty: each step's own
  bool want_fwd = false, want_bwd = false;
  CheckMode mode = CheckMode::automatic;
  bool cap_cpu = false;    // the flash preset without --steps: CPU steps skip seq > 1024
  CommonOptions run_opts;  // repeats and warm-up; unset ones take the step's device default
};

Sweep parse_sweep(const BenchArgs& a) {
  Sweep sweep;
  for (const std::string& spec : a.sparsities) {
    BlockSparsity b;
    if (spec == "dense") {
      if (!a.mask_block.empty()) parse_sparsity("local:1", "", a.mask_block, b);  // checks it
      b = BlockSparsity{};
    } else {
      parse_sparsity(spec, "", a.mask_block, b);
    }
    sweep.sparsities.push_back(b);
  }
  for (const std::string& s : a.dtypes) {
    DType t;
    if (!parse_dtype(s, t))
      throw BadInput("--dtype '" + s + "' is not one of fp64, fp32, fp16, bf16");
    if (std::find(sweep.dtypes.begin(), sweep.dtypes.end(), t) == sweep.dtypes.end())
      sweep.dtypes.push_back(t);
  }
  sweep.want_fwd = std::find(a.directions.begin(), a.directions.end(), "fwd") != a.directions.end();
  sweep.want_bwd = std::find(a.directions.begin(), a.directions.end(), "bwd") != a.directions.end();
  parse_check_mode(a.check, sweep.mode);  // the option accepts auto, full, sampled only
  sweep.cap_cpu = a.preset == "flash" && a.steps.empty();
  sweep.run_opts.repeats = a.repeats;
  sweep.run_opts.warmup = a.warmup;
  return sweep;
}

// The points a sweep measures, and what it says once about those it does not.
struct BenchPlan {
  std::vector<BenchPoint> points;
  std::vector<std::string> notes;
  int no_device = 0;  // rungs and good points with no device here to run on
};

// Which steps take part, and why the others do not (said once, not once per point): the steps
// that can run here, then those built but with no device here to run on (`absent`), whose
// points are still checked: bad input is exit 2, not 3.
std::vector<const Step*> bench_steps(const std::vector<const Rung*>& selected, const Sweep& sweep,
                                     std::vector<const Step*>& absent, BenchPlan& plan) {
  std::vector<const Step*> steps;
  std::vector<std::string> cpu_capped, fwd_only;
  for (const Rung* r : selected) {
    if (!r->step) {
      plan.notes.push_back("not run: " + r->name + ": " + r->not_built);
      ++plan.no_device;
      continue;
    }
    if (const std::string why = cannot_run_here(*r->step); !why.empty()) {
      plan.notes.push_back("not run: " + r->name + ": " + why);
      absent.push_back(r->step);
      continue;
    }
    steps.push_back(r->step);
    if (r->step->device == Device::cpu && sweep.cap_cpu)
      cpu_capped.push_back(two_digits(r->number));
    if (sweep.want_bwd && !r->step->caps.backward) fwd_only.push_back(two_digits(r->number));
  }
  if (!cpu_capped.empty())
    plan.notes.push_back("CPU steps " + join(cpu_capped) +
                         " skip seq > 1024 in the flash preset and run once, without warm-up "
                         "(name them in --steps to include every seq)");
  if (!fwd_only.empty() && sweep.want_fwd)
    plan.notes.push_back("steps " + join(fwd_only) + " have no backward pass: forward only");
  steps.insert(steps.end(), absent.begin(), absent.end());
  return steps;
}

// The dtypes of a group of points: the ones asked for, else each step's own.
std::vector<DType> group_dtypes(const Sweep& sweep, const std::vector<const Step*>& steps) {
  std::vector<DType> out = sweep.dtypes;
  if (out.empty())
    for (const Step* s : steps)
      if (std::find(out.begin(), out.end(), s->default_dtype()) == out.end())
        out.push_back(s->default_dtype());
  return out;
}

// One point's problem: batch = tokens / seq, heads = hidden / dim (at least 1 each).
Problem bench_problem(const BenchArgs& a, int64_t seq, int64_t dim, const BlockSparsity& sparsity,
                      DType t, int causal, double dropout, bool bwd) {
  Problem p;
  p.batch = std::max<int64_t>(1, a.tokens / seq);
  p.heads = p.heads_kv = std::max<int64_t>(1, a.hidden / dim);
  p.seq_q = p.seq_k = seq;
  p.dim = dim;
  p.causal = causal != 0;
  p.dtype = t;
  p.seed = a.seed;
  p.backward = bwd;
  p.dropout = dropout;
  p.dropout_seed = a.dropout_seed;
  p.sparsity = sparsity;
  return p;
}

// The points of step s on problem p, one per variant the sweep runs, each resolved against the
// step now. One it does not support, or too big for the limits or this machine's memory, is
// counted under its reason in `unsupported`; one of an absent step (no device) as no_device.
void add_step_points(const BenchArgs& a, const Sweep& sweep, const Step& s, const Problem& p,
                     size_t group, bool absent, BenchPlan& plan,
                     std::map<std::string, int>& unsupported) {
  for (const std::string& variant : variants_of(s, a.variants)) {
    RunOptions ro = resolve_run_options(s, sweep.run_opts);
    ro.variant = variant;
    if (s.device == Device::cpu && sweep.cap_cpu) {
      if (a.repeats <= 0) ro.repeats = 1;
      if (a.warmup < 0) ro.warmup = 0;
    }
    std::string why = p.validate();
    Prepared host;
    if (why.empty()) try {
        host = prepare_host(s, p, ro, sweep.mode, false);
      } catch (const BadInput& e) {
        why = e.what();
      }
    if (!why.empty()) {
      ++unsupported[why];
      continue;
    }
    if (absent) {
      ++plan.no_device;  // a good point, on a step with no device here
      continue;
    }
    plan.points.push_back({&s, p, group, variant, host});
  }
}

// The points, in the order that lets one set of inputs serve a (seq, dim, mask) group: every
// dtype is rounded from the same float64 draw, and causal and dropout reuse the same inputs.
// A point the step does not support, or whose problem is too big for the limits or this
// machine's memory, is skipped here, before any inputs are made.
BenchPlan plan_sweep(const BenchArgs& a, const Sweep& sweep,
                     const std::vector<const Rung*>& selected) {
  BenchPlan plan;
  std::vector<const Step*> absent;
  const std::vector<const Step*> steps = bench_steps(selected, sweep, absent, plan);
  std::map<std::string, int> unsupported;  // reason -> points, said once
  size_t group = 0;
  for (int64_t seq : a.seqlens)
    for (int64_t dim : a.dims)
      for (const BlockSparsity& sparsity : sweep.sparsities) {
        for (DType t : group_dtypes(sweep, steps))
          for (int causal : a.causal)
            for (double dropout : a.dropouts)
              for (const Step* s : steps) {
                if (sweep.dtypes.empty() && s->default_dtype() != t) continue;
                if (s->device == Device::cpu && sweep.cap_cpu && seq > 1024) continue;
                const bool is_absent = std::find(absent.begin(), absent.end(), s) != absent.end();
                for (int bwd = 0; bwd < 2; ++bwd) {
                  if (!(bwd ? sweep.want_bwd : sweep.want_fwd) || (bwd && !s->caps.backward))
                    continue;
                  const Problem p =
                      bench_problem(a, seq, dim, sparsity, t, causal, dropout, bwd != 0);
                  add_step_points(a, sweep, *s, p, group, is_absent, plan, unsupported);
                }
              }
        ++group;
      }
  for (const auto& [why, n] : unsupported)
    plan.notes.push_back("skipped: " + why + " (" + std::to_string(n) +
                         (n == 1 ? " point)" : " points)"));
  return plan;
}

void print_bench_header(const BenchArgs& a, const Sweep& sweep, const BenchPlan& plan,
                        const Provenance& prov) {
  std::cout << "bench: preset " << a.preset << ", " << a.tokens
            << " tokens (batch = tokens / seq), "
            << "hidden " << a.hidden << " (heads = hidden / dim)\n  seq " << join(a.seqlens)
            << "; dim " << join(a.dims) << "; causal " << join(a.causal) << "; "
            << join(a.directions) << "; dtype "
            << (sweep.dtypes.empty() ? std::string("each step's own") : join(a.dtypes)) << "\n  "
            << plan.points.size() << " points; check " << a.check << "; gpu "
            << (prov.gpu.empty() ? "none" : prov.gpu) << ", CUDA "
            << (prov.cuda.empty() ? "-" : prov.cuda) << ", commit " << prov.commit << ", run "
            << prov.run << "\n";
  for (const std::string& n : plan.notes) std::cout << "  " << n << "\n";
}

// The inputs of the sweep's points, made once per group and rounded once per dtype.
class SweepInputs {
 public:
  // The inputs of points[k]; a point of a new group draws the group's inputs.
  const Inputs& of(const std::vector<BenchPoint>& points, size_t k) {
    const BenchPoint& pt = points[k];
    if (pt.group != group_) {
      // One float64 draw per (seq, dim), with dO when any point of the group goes backward.
      Problem g = pt.p;
      g.dtype = DType::f64;
      g.backward = false;
      for (size_t j = k; j < points.size() && points[j].group == pt.group; ++j)
        g.backward = g.backward || points[j].p.backward;
      base_ = Inputs();  // (rounded keeps its storage: the next copy into it reuses it)
      base_ = make_inputs(g);
      group_ = pt.group;
      rounded_to_ = DType::f64;
    }
    if (pt.p.dtype != DType::f64 && pt.p.dtype != rounded_to_) {
      rounded_ = base_;
      round_inputs(rounded_, pt.p.dtype);
      rounded_to_ = pt.p.dtype;
    }
    return pt.p.dtype == DType::f64 ? base_ : rounded_;
  }

 private:
  size_t group_ = size_t(-1);
  Inputs base_, rounded_;
  DType rounded_to_ = DType::f64;
};

// The rows the sweep measured, and the points that got none.
struct BenchResults {
  std::vector<ResultRow> rows;
  std::vector<std::string> errs;  // max abs error of O, per row
  int failed = 0, skipped = 0;
};

// Checks one point and keeps its timing as a row; a point that cannot run here is skipped and
// one that fails (its run or its check) is a failure, each saying why, and neither gets a row.
// Returns whether it got one.
bool measure_point(const BenchPoint& pt, const std::string& label, const Inputs& in, CheckMode mode,
                   Outputs& out, const Provenance& prov, Progress& progress, BenchResults& res) {
  auto skip = [&](const std::exception& e) {
    progress.clear();
    std::cout << "skipped: " << label << ": " << e.what() << "\n";
    ++res.skipped;
    return false;
  };
  CheckedRun c;
  try {
    check_input_range(pt.p, in);
    c = run_checked(*pt.step, pt.p, in, prepare_device(*pt.step, pt.p, pt.host), mode, out);
  } catch (const BadInput& e) {  // e.g. more device memory than there is
    return skip(e);
  } catch (const NoDevice& e) {
    return skip(e);
  } catch (const std::bad_alloc&) {
    return skip(BadInput(out_of_memory_message()));
  } catch (const std::exception& e) {
    progress.clear();
    std::cout << "FAIL " << label << ": the run failed: " << e.what() << "\n";
    ++res.failed;
    return false;
  }
  if (!c.check.pass) {
    progress.clear();
    std::cout << "FAIL " << label << ": " << c.check.first_failure()
              << " (no timing is reported for a failed check)\n";
    ++res.failed;
    return false;
  }
  res.rows.push_back(
      make_row(*pt.step, pt.p, pt.p.backward, c.result, prov, in.mask.density(), pt.variant));
  res.errs.push_back("-");
  for (const TensorCheck& tc : c.check.tensors)
    if (tc.name == "O") res.errs.back() = fmt_sci(tc.step.max_abs);
  return true;
}

BenchResults measure_sweep(const std::vector<BenchPoint>& points, CheckMode mode,
                           const Provenance& prov, ResultsCsv& csv, Progress& progress) {
  BenchResults res;
  SweepInputs inputs;
  // Output tensors kept from point to point (forward, backward) and re-poisoned in place while
  // their sizes stay (in the flash preset, tokens x hidden fixed: every point but the first).
  Outputs outs[2];
  for (size_t k = 0; k < points.size(); ++k) {
    const BenchPoint& pt = points[k];
    const std::string label = point_str(pt);
    progress.show(k, label);
    const Inputs& in = inputs.of(points, k);
    if (measure_point(pt, label, in, mode, outs[pt.p.backward ? 1 : 0], prov, progress, res))
      csv.add(res.rows.back());
  }
  progress.clear();
  return res;
}

// The summary groups the steps of one shape and direction together, to read across them
// (the sweep ran in the order that reuses inputs). Returns the rows in the table's order.
std::vector<ResultRow> print_bench_table(const BenchResults& res) {
  std::vector<size_t> order(res.rows.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto key = [&](size_t i) {
    const ResultRow& r = res.rows[i];
    return std::make_tuple(r.p.seq_q, r.p.dim, r.p.causal, r.direction != "fwd", r.step, r.dtype);
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return key(x) < key(y); });
  Table t({"step", "dtype", "batch", "heads", "seq", "dim", "causal", "dir", "ms", "TFLOP/s",
           "GB/s", "workspace", "O err"});
  std::vector<ResultRow> sorted;
  for (size_t i : order) {
    const ResultRow& r = res.rows[i];
    t.add({r.step, r.dtype, std::to_string(r.p.batch), std::to_string(r.p.heads),
           std::to_string(r.p.seq_q), std::to_string(r.p.dim), r.p.causal ? "1" : "0", r.direction,
           fmt(r.ms, 3), fmt(r.tflops, 4), fmt(r.gbps, 2), fmt_bytes(r.workspace), res.errs[i]});
    sorted.push_back(r);
  }
  std::cout << "\n";
  t.print(std::cout);
  return sorted;
}

int cmd_bench(BenchArgs a) {
  apply_preset(a);
  const Sweep sweep = parse_sweep(a);
  const std::vector<const Rung*> selected = select_rungs(a.steps);
  check_outputs({{"--csv", a.csv}, {"--json", a.json}});
  ResultsCsv csv(a.csv);
  const Provenance prov = provenance(a.run_id);
  const BenchPlan plan = plan_sweep(a, sweep, selected);
  print_bench_header(a, sweep, plan, prov);
  if (plan.points.empty()) {
    std::cerr << "error: nothing to measure (see above)\n";
    return plan.no_device > 0 ? kExitNoDevice : kExitBadInput;
  }

  Progress progress(plan.points.size());
  const BenchResults res = measure_sweep(plan.points, sweep.mode, prov, csv, progress);
  const std::vector<ResultRow> sorted = print_bench_table(res);
  std::cout << "\n"
            << res.rows.size() << " points measured, " << res.skipped << " skipped, " << res.failed
            << " failed, in " << duration_str(progress.elapsed_s()) << "\n";
  if (const std::string w = csv.commit(); !w.empty()) std::cout << w << "\n";
  if (!a.json.empty()) {
    write_json(a.json, sorted);
    std::cout << "wrote " << res.rows.size() << " rows to " << a.json << "\n";
  }
  return res.failed ? kExitCheckFailed : kExitOk;
}

// ------------------------------------------------------------------------------------ main

std::string rung_footer() {
  std::string s = "Rungs of this build:";
  for (const Rung& r : rungs())
    s += "\n  " + r.name +
         (r.step ? std::string(" (") + r.step->device_name() + ")" : " (not built)");
  return s;
}

constexpr const char* kExitFooter =
    "Exit status: 0 ok, 1 a check against the float64 oracle failed, 2 bad or unsupported "
    "input, 3 no CUDA device.";

constexpr const char* run_id_help =
    "the run column of the --csv rows (1 to 64 of A-Z a-z 0-9 . _ : + -; default: a fresh id, "
    "UTC time and random bits); tools/gpu_check.sh gives one id to the sweep and the peers";
const CLI::Validator run_id_validator(run_id_problem, "");

// An output file flag (--csv, --json) and --run-id, of compare and bench.
CLI::Option* file_option(CLI::App* app, const char* flag, std::string& path, const char* help,
                         const char* group) {
  return app->add_option(flag, path, help)->check(nonempty())->type_name("FILE")->group(group);
}
CLI::Option* run_id_option(CLI::App* app, std::string& id, const char* group) {
  return app->add_option("--run-id", id, run_id_help)
      ->check(run_id_validator)
      ->type_name("ID")
      ->group(group);
}

// Each verb: its subcommand, the values its flags are parsed into (CLI11 holds references to
// them, so a verb stays where main_ made it), and the options read after parsing.

struct RunVerb {
  CLI::App* cmd = nullptr;
  std::string which;
  CommonOptions o;
};

void add_run(CLI::App& app, RunVerb& v) {
  v.cmd = app.add_subcommand(
      "run",
      "run one step exactly as its program steps/NN_name does (the same flags, the same "
      "exit status)");
  v.cmd->add_option("N", v.which, "the rung: its number (5, 05) or its folder name")->required();
  add_common_options(*v.cmd, v.o);
  v.cmd->footer(rung_footer() + "\n`ladder list` says what each supports; " + kExitFooter);
}

struct CompareVerb {
  CLI::App* cmd = nullptr;
  CompareArgs a;
  CLI::Option* variant = nullptr;  // hidden: compare runs each step's default variant
};

void add_compare(CLI::App& app, CompareVerb& v) {
  v.cmd = app.add_subcommand(
      "compare",
      "every runnable step on the same inputs: time, TFLOP/s, GB/s, workspace, error vs the "
      "float64 oracle, speed-up over the previous step");
  add_common_options(*v.cmd, v.a.o);
  // Each step runs its default variant; `ladder run N --variant V` runs another.
  // Hidden rather than removed, so that using it says what to do instead.
  v.variant = v.cmd->get_option("--variant")->group("");
  v.cmd->add_option("--steps", v.a.steps, "the rungs to compare (default: all), e.g. 0,1,2")
      ->check(nonempty())
      ->delimiter(',')
      ->group("Compare");
  file_option(v.cmd, "--csv", v.a.csv,
              "append one row per step and direction (results schema) to FILE", "Compare");
  run_id_option(v.cmd, v.a.run_id, "Compare");
  v.cmd->footer(
      "The inputs are made (or --load-ed) once, rounded to fp32 (or to --dtype) and then to "
      "each step's dtype. With --dtype, steps without that dtype are listed as not run. With "
      "--backward, a step with no backward pass shows its forward only. --save DIR writes each "
      "step's outputs to DIR/NN_name/.\nExit status: 0 every step that ran passed its check, 1 "
      "a step failed, 2 bad input (or no step can run it), 3 no step ran for want of a CUDA "
      "device.");
}

int run_compare_verb(const CompareVerb& v) {
  if (v.variant->count()) {
    std::cerr << "error: compare runs each step's default variant; run another with `ladder "
                 "run N --variant V`\n";
    return kExitBadInput;
  }
  return guarded([&] { return cmd_compare(v.a); });
}

struct VerifyVerb {
  CLI::App* cmd = nullptr;
  CommonOptions o;
  std::string outputs;
};

void add_verify(CLI::App& app, VerifyVerb& v) {
  v.cmd = app.add_subcommand(
      "verify",
      "judge outputs computed anywhere (your kernel, another library) by the harness's rule: "
      "the same error/tolerance table and exit status as a rung's run");
  add_common_options(*v.cmd, v.o);
  v.cmd
      ->add_option("--outputs", v.outputs,
                   "the outputs to judge: o.npy, lse.npy (float32 or float64, [B, H, M, d] and "
                   "[B, H, M]) and, for a backward pass, dq.npy, dk.npy, dv.npy")
      ->type_name("DIR")
      ->required();
  for (const std::string& f : verify_unused_flags()) v.cmd->get_option(f)->group("");
  v.cmd->footer(
      "Needs --load DIR (q.npy, k.npy, v.npy, and do.npy for a backward pass: the inputs the "
      "outputs came from) and --dtype (the precision they were computed in, which picks the "
      "yardstick: docs/CONTRACT.md, \"The harness\"). The problem flags (--causal, --scale, "
      "--dropout, --dropout-seed, --block-mask, --block-sparsity with --seed, --mask-block) "
      "must be the ones the outputs were computed with. --check full (default auto: sampled "
      "rows above 4 GFLOP, every element still scanned for NaN/Inf).\n" +
      std::string(kExitFooter));
}

int run_verify_verb(const VerifyVerb& v) {
  for (const std::string& f : verify_unused_flags())
    if (v.cmd->get_option(f)->count()) {
      std::cerr << "error: verify judges outputs that exist; " << f << " has no meaning here\n";
      return kExitBadInput;
    }
  return guarded([&] { return verify_outputs_cli(v.o, v.outputs); });
}

struct DiffVerb {
  CLI::App* cmd = nullptr;
  std::string a, b;
  double tol = 0;
  CLI::Option* tol_opt = nullptr;
};

void add_diff(CLI::App& app, DiffVerb& v) {
  v.cmd = app.add_subcommand(
      "diff", "how far two .npy arrays are apart: max abs and relative error, and where");
  v.cmd->add_option("A", v.a, "the array to measure (.npy, float32 or float64)")
      ->check(nonempty())
      ->required();
  v.cmd->add_option("B", v.b, "the reference (.npy); relative errors are relative to it")
      ->check(nonempty())
      ->required();
  v.tol_opt =
      v.cmd->add_option("--tol", v.tol, "exit 1 if max abs error > X or a non-finite value differs")
          ->check(real_in(0.0, std::numeric_limits<double>::max(), false))
          ->type_name("X");
  v.cmd->footer(
      "Exit status: 0 (a measurement, not a test) unless --tol is given; 1 outside --tol; 2 "
      "unreadable files or different shapes.");
}

// bench's Sweep group: the values the sweep runs through.
void add_sweep_flags(CLI::App* bench, BenchArgs& ba) {
  // A list of values the sweep runs through, comma-separated.
  auto sweep = [&](const char* flag, auto& values, const char* help, const CLI::Validator& v) {
    return bench->add_option(flag, values, help)->check(v)->delimiter(',')->group("Sweep");
  };
  bench
      ->add_option("--preset", ba.preset,
                   "quick: seq 128 256 512, dim 64, 512 tokens, hidden 256 (seconds on a "
                   "CPU); flash: flash-attention's shapes, 16384 tokens, hidden 2048, seq "
                   "512..16384, dim 64 128")
      ->check(CLI::IsMember({"quick", "flash"}))
      ->capture_default_str()
      ->group("Sweep");
  sweep("--steps", ba.steps,
        "the rungs (default: all that can run here; naming a CPU step lifts the flash preset's "
        "seq <= 1024 cap)",
        nonempty());
  sweep("--variants", ba.variants,
        "default (each step's own), all (every checked variant: the ladder of ideas within a "
        "rung), or names; a non-default variant's rows say NN/name",
        nonempty());
  sweep("--seqlens", ba.seqlens, "sequence lengths (seq_q = seq_k)", integer_in(1, kMaxExtent));
  sweep("--dims", ba.dims, "head dims", integer_in(1, kMaxExtent));
  sweep("--dropout", ba.dropouts,
        "dropout rates to sweep, e.g. 0,0.1 (default 0; rungs without dropout skip p > 0)",
        real_in(0.0, 1.0, true));
  bench->add_option("--dropout-seed", ba.dropout_seed, "seed of the dropout mask")
      ->check(unsigned_integer())
      ->capture_default_str()
      ->group("Sweep");
  sweep("--block-sparsity", ba.sparsities,
        "block masks to sweep: dense, random:RHO (seeded by --seed), local:W; e.g. "
        "dense,random:0.25 (default dense)",
        nonempty());
  bench
      ->add_option("--mask-block", ba.mask_block,
                   "the masks' block Bm x Bn: N or NxM (default 128)")
      ->check(nonempty())
      ->group("Sweep");
  sweep("--causal", ba.causal, "0, 1 or both", integer_in(0, 1));
  sweep("--dtype", ba.dtypes, "dtypes (default: each step's own)", nonempty());
  sweep("--directions", ba.directions, "fwd, bwd or both (bwd: steps with backward)",
        CLI::IsMember({"fwd", "bwd"}));
  bench->add_option("--tokens", ba.tokens, "batch * seq (default: the preset's)")
      ->check(integer_in(1, kMaxTensorElems))
      ->group("Sweep");
  bench->add_option("--hidden", ba.hidden, "heads * dim (default: the preset's)")
      ->check(integer_in(1, kMaxTensorElems))
      ->group("Sweep");
  bench->add_option("--seed", ba.seed, "seed of the generated inputs")
      ->check(unsigned_integer())
      ->capture_default_str()
      ->group("Sweep");
}

struct BenchVerb {
  CLI::App* cmd = nullptr;
  BenchArgs a;
};

void add_bench(CLI::App& app, BenchVerb& v) {
  CLI::App* bench = v.cmd = app.add_subcommand(
      "bench",
      "the benchmark sweep: every runnable step over a grid of shapes, checked, then "
      "timed; rows in the results schema");
  BenchArgs& ba = v.a;
  add_sweep_flags(bench, ba);
  bench
      ->add_option("--repeats", ba.repeats,
                   "timed runs, median reported (default: CPU 3, GPU 20; the flash preset runs "
                   "CPU steps once)")
      ->check(integer_in(1, 1000000))
      ->group("Running");
  bench->add_option("--warmup", ba.warmup, "untimed runs first (default: CPU 1, GPU 3)")
      ->check(integer_in(0, 1000000))
      ->group("Running");
  bench
      ->add_option("--check", ba.check,
                   "auto (sampled query rows at large sizes) | full | sampled; every point is "
                   "checked before its timing is kept")
      ->check(CLI::IsMember({"auto", "full", "sampled"}))
      ->capture_default_str()
      ->group("Running");
  file_option(bench, "--csv", ba.csv, "append the rows to FILE (header written for a new file)",
              "Output");
  file_option(bench, "--json", ba.json, "write the rows as a JSON array to FILE (replaced)",
              "Output");
  run_id_option(bench, ba.run_id, "Output");
  bench->footer(
      std::string("CSV columns: ") + kResultsHeader +
      "\ncommit: $LADDER_COMMIT, else `git rev-parse --short HEAD` of the source tree (+ -dirty), "
      "else the configure-time value. run: --run-id, else a fresh id per invocation; rows that "
      "share it were measured in one call. A point that fails its check gets no row and makes the "
      "exit status 1; unsupported points (a dim, too much memory) are skipped, saying why.");
}

int main_(int argc, char** argv) {
  CLI::App app{
      "ladder — the driver of the attention ladder: list the rungs, run one, compare "
      "them on the same inputs, verify outputs computed elsewhere, diff two .npy files, run "
      "the benchmark sweep.",
      "ladder"};
  app.require_subcommand(1);
  app.footer(std::string("Each verb has its own --help, e.g. `ladder compare --help`.\n") +
             kExitFooter);
  app.add_subcommand("list",
                     "every rung of this build: device, what it supports, its variants, "
                     "whether it can run here");
  RunVerb run;
  add_run(app, run);
  CompareVerb compare;
  add_compare(app, compare);
  VerifyVerb verify;
  add_verify(app, verify);
  DiffVerb diff;
  add_diff(app, diff);
  BenchVerb bench;
  add_bench(app, bench);

  if (argc < 2) {
    std::cerr << app.help();
    return kExitBadInput;
  }
  const int rc = parse_or_exit(app, argc, argv);
  if (rc >= 0) return rc;
  if (const int bad = guarded([] { return prepare_host_memory(), 0; }); bad) return bad;

  if (run.cmd->parsed()) return cmd_run(run.which, run.o);
  if (compare.cmd->parsed()) return run_compare_verb(compare);
  if (verify.cmd->parsed()) return run_verify_verb(verify);
  if (diff.cmd->parsed())
    return guarded([&] { return cmd_diff(diff.a, diff.b, diff.tol_opt->count() > 0, diff.tol); });
  if (bench.cmd->parsed()) return guarded([&] { return cmd_bench(bench.a); });
  return guarded(cmd_list);
}

}  // namespace
}  // namespace ladder

int main(int argc, char** argv) {
  return ladder::main_(argc, argv);
}
