#include "program.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <limits>
#include <stdexcept>

#include "device.hpp"
#include "error.hpp"
#include "memory.hpp"
#include "npy.hpp"
#include "report.hpp"

namespace ladder {

namespace fs = std::filesystem;

namespace {

std::string gib(double bytes) {
  return fmt(bytes / double(1ull << 30), 2) + " GiB";
}

std::string input_path(const std::string& dir, const char* name) {
  return (fs::path(dir) / name).string();
}

// The headers of --load's files: their shapes become the problem's.
void shapes_from_files(const std::string& dir, Problem& p) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw BadInput("--load " + dir + ": not a directory");
  const NpyHeader q = read_npy_header(input_path(dir, "q.npy"));
  const NpyHeader k = read_npy_header(input_path(dir, "k.npy"));
  const NpyHeader v = read_npy_header(input_path(dir, "v.npy"));
  auto shape_str = [](const NpyHeader& h) { return ladder::shape_str(h.shape); };
  auto need4 = [&](const NpyHeader& h, const std::string& name, const char* layout) {
    if (h.shape.size() != 4)
      throw BadInput(name + " has shape " + shape_str(h) + "; expected 4 dimensions " + layout);
  };
  need4(q, "q.npy", "[batch, heads, seq_q, dim]");
  need4(k, "k.npy", "[batch, heads_kv, seq_k, dim]");
  need4(v, "v.npy", "[batch, heads_kv, seq_k, dim]");
  if (k.shape != v.shape)
    throw BadInput("k.npy " + shape_str(k) + " and v.npy " + shape_str(v) +
                   " must have the same shape");
  if (q.shape[0] != k.shape[0])
    throw BadInput("q.npy and k.npy disagree on batch: " + shape_str(q) + " vs " + shape_str(k));
  if (q.shape[3] != k.shape[3])
    throw BadInput("q.npy and k.npy disagree on dim: " + shape_str(q) + " vs " + shape_str(k) +
                   " (this ladder needs one head dim for Q, K and V)");
  p.batch = q.shape[0], p.heads = q.shape[1], p.seq_q = q.shape[2], p.dim = q.shape[3];
  p.heads_kv = k.shape[1], p.seq_k = k.shape[2];
  if (p.backward) {
    const NpyHeader d = read_npy_header(input_path(dir, "do.npy"));
    if (d.shape != q.shape)
      throw BadInput("do.npy has shape " + shape_str(d) + "; expected q's shape " + shape_str(q));
  }
}

// The --block-mask header against the problem, before its data is read: a mask of the wrong
// shape is refused whatever its size (a 3 GB file is not read to learn that).
void check_mask_header(const Problem& p) {
  const std::string& path = p.sparsity.file;
  require_regular_file(path, "--block-mask");
  const NpyHeader h = read_npy_header(path, NpyKind::mask);
  const int64_t nI = p.q_blocks(), nJ = p.k_blocks();
  const std::vector<int64_t>& s = h.shape;
  if (s.size() == 4 && (s[0] == 1 || s[0] == p.batch) && (s[1] == 1 || s[1] == p.heads) &&
      s[2] == nI && s[3] == nJ)
    return;
  std::string got = "[";
  for (size_t i = 0; i < s.size(); ++i) got += (i ? ", " : "") + std::to_string(s[i]);
  throw BadInput("--block-mask " + path + ": shape " + got + "]; expected [" +
                 std::to_string(p.batch) + " or 1, " + std::to_string(p.heads) + " or 1, " +
                 std::to_string(nI) + ", " + std::to_string(nJ) + "] (ceil(seq_q / " +
                 std::to_string(p.sparsity.block_q) + "), ceil(seq_k / " +
                 std::to_string(p.sparsity.block_k) + "))");
}

// How many query rows per head a sampled check computes (check.cpp picks them).
int64_t sampled_rows(const Problem& p) {
  return std::min<int64_t>(p.seq_q, kSampled);
}

}  // namespace

Problem resolve_problem(const CommonOptions& o, DType default_dtype) {
  Problem p = o.p;
  p.dtype = default_dtype;
  if (!o.dtype.empty() && !parse_dtype(o.dtype, p.dtype))
    throw BadInput("--dtype '" + o.dtype + "' is not one of fp64, fp32, fp16, bf16");
  parse_sparsity(o.block_sparsity, o.block_mask, o.mask_block, p.sparsity);
  if (!o.load.empty()) {
    for (CLI::Option* opt : o.shape_opts)
      if (opt && opt->count())
        throw BadInput(opt->get_name() +
                       " cannot be combined with --load: the shapes come from the files");
    shapes_from_files(o.load, p);
  } else if (!(o.heads_kv_opt && o.heads_kv_opt->count())) {  // --heads-kv defaults to --heads
    p.heads_kv = p.heads;
  }
  return p;
}

CheckMode check_options(const CommonOptions& o, const Problem& p) {
  CheckMode mode;
  if (!parse_check_mode(o.check, mode))
    throw BadInput("--check must be auto, full, sampled or none");
  InputKind kind;
  if (!parse_input_kind(o.inputs, kind))
    throw BadInput("--inputs must be normal, large or late, got '" + o.inputs + "'");
  const std::string bad = p.validate();
  if (!bad.empty()) throw BadInput(o.load.empty() ? bad : "--load " + o.load + ": " + bad);
  if (o.save_f64 && o.save.empty())
    throw BadInput("--save-f64 says how --save writes its files; give --save DIR with it");
  if (!o.save.empty()) check_save_target(o.save, "--save");
  if (p.sparsity.kind == BlockSparsity::Kind::file) check_mask_header(p);
  return mode;
}

Inputs obtain_inputs(const CommonOptions& o, const Problem& p) {
  Inputs in;
  if (!o.load.empty()) {
    in.q = read_npy(input_path(o.load, "q.npy"));
    in.k = read_npy(input_path(o.load, "k.npy"));
    in.v = read_npy(input_path(o.load, "v.npy"));
    if (p.backward) in.dout = read_npy(input_path(o.load, "do.npy"));
    round_inputs(in, p.dtype);  // what a step of this dtype sees; the oracle sees the same values
  } else {
    InputKind kind;
    parse_input_kind(o.inputs, kind);
    in = make_inputs(p, kind);
  }
  // Checked after rounding: 1e300 is a finite float64 and +inf in fp32.
  if (const std::string bad = non_finite_input(in); !bad.empty())
    throw BadInput(
        "the ladder needs finite inputs (NaN or Inf found): " + bad +
        (p.dtype == DType::f64 ? "" : " once rounded to " + std::string(dtype_name(p.dtype))));
  check_input_range(p, in);
  if (p.sparsity.kind == BlockSparsity::Kind::file) {
    const Tensor t = read_npy(p.sparsity.file, NpyKind::mask);
    in.mask = block_mask_from(t, p, p.sparsity.file);
  }
  return in;
}

void check_save_target(const std::string& dir, const std::string& flag) {
  check_publish_target(dir, flag);
  check_save_folder(dir, flag);
}

void check_save_folder(const std::string& dir, const std::string& flag) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (fs::exists(st) && !fs::is_directory(st))
    throw BadInput(flag + " " + dir + ": exists and is not a directory");
  if (!fs::exists(st) && fs::is_symlink(fs::symlink_status(dir, ec)))
    throw BadInput(flag + " " + dir + ": a symbolic link to nothing");
  if (!fs::is_directory(st)) return;  // a new folder: nothing in it to replace
  for (const std::string& name : output_names())
    require_replaceable((fs::path(dir) / name).string(), flag);
}

void check_input_range(const Problem& p, const Inputs& in) {
  // The accumulators: float64 for an fp64 run, float32 for every other dtype; 1/16 of the
  // largest finite value leaves room for rounding and summation order.
  const double acc = p.dtype == DType::f64 ? std::numeric_limits<double>::max()
                                           : double(std::numeric_limits<float>::max());
  const double limit = acc / 16;
  const double out_max = p.dtype == DType::f64    ? std::numeric_limits<double>::max()
                         : p.dtype == DType::f16  ? 65504.0
                         : p.dtype == DType::bf16 ? 3.3895313892515355e38
                                                  : double(std::numeric_limits<float>::max());
  const double mq = max_abs(in.q), mk = max_abs(in.k), mv = max_abs(in.v);
  const double s = std::fabs(p.softmax_scale()), d = double(p.dim), keep = 1 / (1 - p.dropout);
  struct Bound {
    const char* what;
    double value, limit;
  };
  std::vector<Bound> bounds = {
      {"the scores, scale * dim * max|Q| * max|K|", s * d * mq * mk, limit},
      {"the unnormalised output sum, seq_k * max|V| / (1 - dropout)", double(p.seq_k) * keep * mv,
       limit},
      {"O, max|V| / (1 - dropout), in the output dtype", keep * mv, out_max}};
  if (p.backward) {
    const double mdo = max_abs(in.dout), ds = 2 * d * mdo * mv * keep;  // |dS| <= |dP| + |D|
    bounds.push_back({"dP = dO V^T, dim * max|dO| * max|V|", d * mdo * mv * keep, limit});
    bounds.push_back(
        {"dQ, scale * seq_k * max|dS| * max|K|", s * double(p.seq_k) * ds * mk, limit});
    bounds.push_back({"dK, scale * group * seq_q * max|dS| * max|Q|",
                      s * double(p.group()) * double(p.seq_q) * ds * mq, limit});
    bounds.push_back({"dV, group * seq_q * max|dO| / (1 - dropout)",
                      double(p.group()) * double(p.seq_q) * mdo * keep, limit});
  }
  for (const Bound& b : bounds)
    if (!(b.value <= b.limit))
      throw BadInput("the inputs are too large for a " + std::string(dtype_name(p.dtype)) +
                     " run: a bound on " + b.what + " is " + fmt_sci(b.value, 2) +
                     ", past the largest the run can hold (" + fmt_sci(b.limit, 2) +
                     "); no rung makes Inf from inputs it accepts, so these are refused "
                     "(scale them down)");
}

RunOptions resolve_run_options(const Step& s, const CommonOptions& o) {
  RunOptions r = o.run;
  const bool gpu = s.device == Device::cuda;
  r.repeats = o.repeats > 0 ? o.repeats : (gpu ? 20 : 3);
  r.warmup = o.warmup >= 0 ? o.warmup : (gpu ? 3 : 1);
  return r;
}

CheckBytes check_host_bytes(const Problem& p, CheckMode mode, bool inputs_exist) {
  const double q = double(p.q_numel()), kv = double(p.kv_numel()), rows = double(p.rows());
  const double in = q + 2 * kv + (p.backward ? q : 0),
               out = q + rows + (p.backward ? q + 2 * kv : 0);
  double bytes = 8 * out + (inputs_exist ? 0 : 8 * in);  // float64 host tensors
  double check_scratch = 0;
  if (mode != CheckMode::none) {
    const bool full = mode == CheckMode::full || (mode == CheckMode::automatic &&
                                                  (p.backward ? 3.5 : 1.0) * p.fwd_flops() <= 4e9);
    const double r = full ? 1.0 : double(sampled_rows(p)) / double(p.seq_q);
    // The oracle's and the yardstick's outputs (and the gathered rows of a sampled check), the
    // yardstick's float dK, dV accumulators.
    bytes += (full ? 2 : 3) * 8 * (r * (q + rows) + (p.backward ? r * q + (full ? 2 * kv : 0) : 0));
    if (p.backward && full) bytes += 8 * kv;
    // A sampled backward's column pass: the oracle's O and LSE of every row (its scratch is the
    // full forward's, one thread, below).
    if (p.backward && !full) bytes += 8 * (q + rows);
    // Scratch per thread (reference/oracle.cpp, plain.cpp). The oracle, on one thread for a
    // full check and one per (batch, K/V head) group for a sampled one: a block of up to 256
    // query rows of S, its scaled copy, P and P with dropout applied (Z too with dropout; dP,
    // dS and a temporary with backward), and its copies of the group's K and V (and dK, dV
    // accumulators). The yardstick, one per group always: a row of S and P, its dK, dV.
    const double n = double(p.seq_k), d = double(p.dim);
    const double block = std::min<double>(256, full ? double(p.seq_q) : double(sampled_rows(p)));
    const double groups = double(p.batch) * double(p.heads_kv);
    const double threads = std::min<double>(groups, parallel_chunk_count(int64_t(groups), 1));
    const double oracle = 8 * (block * n * (4 + (p.dropout > 0 ? 1 : 0) + (p.backward ? 3 : 0)) +
                               2 * n * d + (p.backward && full ? 2 * n * d : 0)) +
                          2 * n;
    const double plain = 8 * 2 * n + 2 * n + (p.backward ? 2 * 8 * n * d : 0);
    check_scratch = (full ? 1 : threads) * oracle + threads * plain;
    if (p.backward && !full)  // the column pass's forward: blocks of 256 rows on one thread
      check_scratch = std::max(check_scratch, 8 * (256 * n * 4 + 2 * n * d) + threads * plain);
  }
  return {bytes, check_scratch};
}

double host_bytes_needed(const Step& s, const Problem& p, const RunOptions& ro, CheckMode mode,
                         bool inputs_exist) {
  const CheckBytes c = check_host_bytes(p, mode, inputs_exist);
  const double q = double(p.q_numel()), kv = double(p.kv_numel());
  // A CPU step's workspace lives while it runs, the check's scratch after: the larger counts.
  if (s.device == Device::cpu)
    return c.tensors + std::max(c.scratch, s.workspace ? s.workspace(p, ro) : 0.0);
  // The element-type copies made on the way to and from the device, one tensor at a time.
  return c.tensors + c.scratch + 8 * std::max(q, kv) +
         double(dtype_bytes(p.dtype)) * 2 * std::max(q, kv);
}

void require_host_memory(double bytes, const std::string& what) {
  const HostMemory avail = host_memory();
  note_host_estimate(bytes);
  if (bytes > 0.9 * avail.bytes)
    throw BadInput(what + " needs about " + gib(bytes) +
                   " of host memory (inputs, outputs and the oracle's check); " + gib(avail.bytes) +
                   " are available (" + avail.source +
                   "). Use a smaller problem (or --check sampled / none).");
}

double device_bytes_needed(const Step& s, const Problem& p, const RunOptions& ro,
                           const DeviceInfo& dev) {
  const double q = double(p.q_numel()), kv = double(p.kv_numel()), rows = double(p.rows());
  const double elems = 2 * q + 2 * kv + (p.backward ? 2 * q + 2 * kv : 0);
  return double(dtype_bytes(p.dtype)) * elems + 4 * rows + (s.workspace ? s.workspace(p, ro) : 0) +
         2.0 * double(dev.l2_bytes);  // time_gpu_ms's L2 flush buffer
}

Prepared prepare_host(const Step& s, const Problem& p, const RunOptions& ro, CheckMode mode,
                      bool inputs_exist) {
  Prepared r;
  r.options = s.resolve(p, ro, DeviceInfo{});
  // A CUDA step's tiles may depend on the device (its shared memory): prepare_device chooses
  // them from what was asked.
  if (s.device == Device::cuda) r.options.tile_q = ro.tile_q, r.options.tile_k = ro.tile_k;
  require_host_memory(host_bytes_needed(s, p, r.options, mode, inputs_exist),
                      "this run of " + s.name);
  return r;
}

Prepared prepare_device(const Step& s, const Problem& p, const Prepared& host) {
  Prepared r = host;
  r.device_checked = true;
  if (s.device != Device::cuda) return r;   // the host half resolved everything
  const DeviceInfo dev = require_device();  // NoDevice: exit 3
  if (const std::string why = s.wrong_device(dev); !why.empty()) throw NoDevice(why);
  r.options = s.resolve(p, host.options, dev);
  const double need = device_bytes_needed(s, p, r.options, dev);
  if (need > 0.95 * double(dev.free_bytes))
    throw BadInput(s.name + " needs about " + gib(need) +
                   " of device memory (inputs, outputs, workspace and the L2 flush buffer); " +
                   gib(double(dev.free_bytes)) + " are free on " + dev.name);
  return r;
}

Prepared prepare(const Step& s, const Problem& p, const RunOptions& ro, CheckMode mode,
                 bool inputs_exist) {
  if (const std::string bad = p.validate(); !bad.empty()) throw BadInput(bad);
  return prepare_device(s, p, prepare_host(s, p, ro, mode, inputs_exist));
}

namespace {
// A prepared run on `out`, poisoned first (NaN: anything the step does not write fails).
RunResult run_poisoned(const Step& s, const Problem& p, const Inputs& in, const Prepared& run,
                       Outputs& out) {
  if (!run.device_checked)
    throw std::logic_error("a run of " + s.name + " was not prepared for the device");
  out.poison(p);
  return s.run(p, in, out, run.options);
}
}  // namespace

CheckedRun run_checked(const Step& s, const Problem& p, const Inputs& in, const Prepared& run,
                       CheckMode mode, Outputs& out) {
  CheckedRun c;
  c.result = run_poisoned(s, p, in, run, out);
  c.check = verify(p, in, out, mode);
  return c;
}

CheckedRun run_judged(const Step& s, const Problem& p, const Inputs& in, const Prepared& run,
                      const Reference& ref) {
  CheckedRun c;
  c.result = run_poisoned(s, p, in, run, c.out);
  c.check = judge(p, in, c.out, ref);
  return c;
}

CheckedRun run_checked(const Step& s, const Problem& p, const Inputs& in, const Prepared& run,
                       CheckMode mode) {
  Outputs out;
  CheckedRun c = run_checked(s, p, in, run, mode, out);
  c.out = std::move(out);
  return c;
}

CheckedRun run_checked(const Step& s, const Problem& p, const Inputs& in, const RunOptions& ro,
                       CheckMode mode) {
  check_input_range(p, in);
  return run_checked(s, p, in, prepare(s, p, ro, mode, true), mode);
}

const std::vector<std::string>& output_names() {
  static const std::vector<std::string> names = {"o.npy", "lse.npy", "dq.npy", "dk.npy", "dv.npy"};
  return names;
}

size_t stage_outputs(FolderPublisher& folder, const std::string& sub, const Outputs& out,
                     bool backward, bool as_f64) {
  std::vector<std::pair<const char*, const Tensor*>> files = {{"o.npy", &out.o},
                                                              {"lse.npy", &out.lse}};
  if (backward)
    files.insert(files.end(), {{"dq.npy", &out.dq}, {"dk.npy", &out.dk}, {"dv.npy", &out.dv}});
  for (const auto& [name, t] : files) folder.stage(sub, name, npy_bytes(*t, as_f64));
  return files.size();
}

void save_outputs(const std::string& dir, const Outputs& out, bool backward, bool as_f64) {
  FolderPublisher folder(dir, output_names(), "--save " + dir);
  const size_t n = stage_outputs(folder, "", out, backward, as_f64);
  const std::string note = folder.publish();
  std::cout << "  saved " << n << " files to " << dir << (as_f64 ? " (float64)" : " (float32)")
            << "\n";
  if (!note.empty()) std::cout << "  note: " << note << "\n";
}

double tflops(const Problem& p, double ms, bool backward, double density) {
  return ms > 0 ? (backward ? p.bwd_flops(density) : p.fwd_flops(density)) / (ms * 1e9) : 0;
}

double gbps(const Problem& p, double ms, bool backward) {
  const int e = dtype_bytes(p.dtype);
  return ms > 0 ? (backward ? p.bwd_bytes(e) : p.fwd_bytes(e)) / (ms * 1e6) : 0;
}

int run_step_cli(const Step& s, const CommonOptions& o) {
  return guarded([&]() -> int {
    prepare_host_memory();
    // Bad input fails first (exit 2), and before the device is asked for (exit 3): the
    // shapes, capabilities, variant, tiles, host memory and the --save target before the
    // inputs exist, then the inputs' values; then the device, its memory and its tiles.
    Problem p = resolve_problem(o, s.default_dtype());
    const CheckMode mode = check_options(o, p);
    const Prepared host = prepare_host(s, p, resolve_run_options(s, o), mode, false);
    const Inputs in = obtain_inputs(o, p);
    const Prepared run = prepare_device(s, p, host);
    const RunOptions& ro = run.options;

    std::cout << s.name << " [" << ro.variant << "]: " << p.describe() << "\n";
    CheckedRun c = run_checked(s, p, in, run, mode);
    if (!c.result.config.empty()) std::cout << "  config: " << c.result.config << "\n";
    std::cout << "  check vs float64 oracle (" << c.check.mode << ")\n" << c.check.summary();

    if (!c.check.pass) {  // a failed run writes nothing: --save's folder stays as it was
      std::cout << "FAIL: " << c.check.first_failure()
                << " (no timing is reported for a failed check"
                << (o.save.empty() ? "" : "; nothing was saved to " + o.save) << ")\n";
      return kExitCheckFailed;
    }
    if (!o.save.empty()) save_outputs(o.save, c.out, p.backward, o.save_f64);
    const double density = in.mask.density();
    auto line = [&](const char* dir, double ms, bool bwd) {
      std::cout << "  " << dir << "  " << fmt(ms, 3) << " ms  "
                << fmt(tflops(p, ms, bwd, density), 4) << " TFLOP/s  " << fmt(gbps(p, ms, bwd), 2)
                << " GB/s  (median of " << ro.repeats << ")\n";
    };
    line("forward ", c.result.fwd_ms, false);
    if (p.backward) line("backward", c.result.bwd_ms, true);
    if (p.sparsity.active())
      std::cout << "  block mask density " << fmt(density, 4)
                << " (TFLOP/s count the kept blocks' FLOPs)\n";
    std::cout << "  workspace " << fmt_bytes(c.result.workspace_bytes) << "\n";
    return kExitOk;
  });
}

int step_main(const Step& s, int argc, char** argv) {
  CLI::App app{s.name + " — " + s.summary};
  std::string variants = "Variants (--variant):";
  for (const Variant& v : s.variants)
    variants +=
        "\n  " + v.name + (&v == &s.variants.front() ? " (default)" : "") + ": " + v.summary;
  app.footer("Supports: " + s.capabilities_str() +
             (s.caps.limits.empty() ? "" : "\nLimits: " + s.caps.limits) + "\n" + variants +
             "\nSizes: every extent < 2^31, tensors <= 2^48 elements, and the host and device "
             "memory the run and its check need (refused with exit 2 before allocating)."
             "\nExit status: 0 ok, 1 check against the oracle failed, 2 bad or unsupported input, "
             "3 no (suitable) CUDA device.");
  CommonOptions o;
  add_common_options(app, o);
  const int rc = parse_or_exit(app, argc, argv);
  if (rc >= 0) return rc;
  return run_step_cli(s, o);
}

}  // namespace ladder
