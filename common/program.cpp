#include "program.hpp"

#include <cmath>
#include <filesystem>
#include <iostream>

#include "device.hpp"
#include "error.hpp"
#include "npy.hpp"
#include "report.hpp"

namespace ladder {

Problem resolve_problem(const CommonOptions& o, DType default_dtype) {
  Problem p = o.p;
  p.dtype = default_dtype;
  if (!o.dtype.empty() && !parse_dtype(o.dtype, p.dtype))
    throw BadInput("--dtype '" + o.dtype + "' is not one of fp64, fp32, fp16, bf16");
  if (!o.load.empty()) {
    for (CLI::Option* opt : o.shape_opts)
      if (opt && opt->count())
        throw BadInput(opt->get_name() +
                       " cannot be combined with --load: the shapes come from the files");
  } else if (!(o.shape_opts[2] && o.shape_opts[2]->count())) {  // --heads-kv defaults to --heads
    p.heads_kv = p.heads;
  }
  return p;
}

Inputs load_inputs(const std::string& dir, Problem& p) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) throw BadInput("--load " + dir + ": not a directory");
  auto path = [&](const char* f) { return (fs::path(dir) / f).string(); };
  Inputs in;
  in.q = read_npy(path("q.npy"));
  in.k = read_npy(path("k.npy"));
  in.v = read_npy(path("v.npy"));
  auto need4 = [](const Tensor& t, const std::string& name, const char* layout) {
    if (t.shape.size() != 4)
      throw BadInput(name + " has shape " + t.shape_str() + "; expected 4 dimensions " + layout);
  };
  need4(in.q, "q.npy", "[batch, heads, seq_q, dim]");
  need4(in.k, "k.npy", "[batch, heads_kv, seq_k, dim]");
  need4(in.v, "v.npy", "[batch, heads_kv, seq_k, dim]");
  if (in.k.shape != in.v.shape)
    throw BadInput("k.npy " + in.k.shape_str() + " and v.npy " + in.v.shape_str() +
                   " must have the same shape");
  if (in.q.shape[0] != in.k.shape[0])
    throw BadInput("q.npy and k.npy disagree on batch: " + in.q.shape_str() + " vs " +
                   in.k.shape_str());
  if (in.q.shape[3] != in.k.shape[3])
    throw BadInput("q.npy and k.npy disagree on dim: " + in.q.shape_str() + " vs " +
                   in.k.shape_str() + " (this ladder needs one head dim for Q, K and V)");
  p.batch = in.q.shape[0];
  p.heads = in.q.shape[1];
  p.seq_q = in.q.shape[2];
  p.dim = in.q.shape[3];
  p.heads_kv = in.k.shape[1];
  p.seq_k = in.k.shape[2];
  if (p.backward) {
    in.dout = read_npy(path("do.npy"));
    if (in.dout.shape != in.q.shape)
      throw BadInput("do.npy has shape " + in.dout.shape_str() + "; expected q's shape " +
                     in.q.shape_str());
  }
  for (const Tensor* t : {&in.q, &in.k, &in.v, &in.dout})
    for (double x : t->data)
      if (!std::isfinite(x))
        throw BadInput("--load: the inputs contain NaN or Inf; the ladder needs finite inputs");
  return in;
}

Inputs obtain_inputs(const CommonOptions& o, Problem& p) {
  if (!o.load.empty()) {
    Inputs in = load_inputs(o.load, p);
    const std::string bad = p.validate();
    if (!bad.empty()) throw BadInput("--load " + o.load + ": " + bad);
    round_inputs(in, p.dtype);  // what a step of this dtype sees; the oracle sees the same values
    return in;
  }
  InputKind kind;
  if (!parse_input_kind(o.inputs, kind))
    throw BadInput("--inputs must be normal or large, got '" + o.inputs + "'");
  return make_inputs(p, kind);
}

CheckMode check_options(const CommonOptions& o, const Problem& p) {
  CheckMode mode;
  if (!parse_check_mode(o.check, mode))
    throw BadInput("--check must be auto, full, sampled or none");
  if (o.load.empty()) {
    const std::string bad = p.validate();
    if (!bad.empty()) throw BadInput(bad);
  }
  if (o.run.tile_q < 0 || o.run.tile_k < 0)
    throw BadInput("--tile-q and --tile-k must be >= 0 (0: the step's choice)");
  if (!o.save.empty() && std::filesystem::exists(o.save) && !std::filesystem::is_directory(o.save))
    throw BadInput("--save " + o.save + ": exists and is not a directory");
  return mode;
}

RunOptions resolve_run_options(const Step& s, const CommonOptions& o) {
  RunOptions r = o.run;
  const bool gpu = s.device == Device::cuda;
  r.repeats = o.repeats > 0 ? o.repeats : (gpu ? 20 : 3);
  r.warmup = o.warmup >= 0 ? o.warmup : (gpu ? 3 : 1);
  return r;
}

void require_runnable(const Step& s, const Problem& p, const std::string& variant) {
  const std::string bad_variant = s.unknown_variant(variant);
  if (!bad_variant.empty()) throw BadInput(bad_variant);
  const std::string why = s.unsupported(p, variant);
  if (!why.empty()) throw BadInput(why);
}

CheckedRun run_checked(const Step& s, const Problem& p, const Inputs& in, const RunOptions& ro,
                       CheckMode mode, Outputs& out) {
  require_runnable(s, p, ro.variant);
  CheckedRun c;
  out.poison(p);
  c.result = s.run(p, in, out, ro);
  c.check = verify(p, in, out, mode);
  return c;
}

CheckedRun run_checked(const Step& s, const Problem& p, const Inputs& in, const RunOptions& ro,
                       CheckMode mode) {
  Outputs out;
  CheckedRun c = run_checked(s, p, in, ro, mode, out);
  c.out = std::move(out);
  return c;
}

size_t save_outputs(const std::string& dir, const Outputs& out, bool backward, bool as_f64) {
  std::vector<std::pair<std::string, const Tensor*>> files = {{"o.npy", &out.o},
                                                              {"lse.npy", &out.lse}};
  if (backward) {
    files.push_back({"dq.npy", &out.dq});
    files.push_back({"dk.npy", &out.dk});
    files.push_back({"dv.npy", &out.dv});
  }
  write_npy_files(dir, files, as_f64);
  return files.size();
}

double tflops(const Problem& p, double ms, bool backward) {
  return ms > 0 ? (backward ? p.bwd_flops() : p.fwd_flops()) / (ms * 1e9) : 0;
}

double gbps(const Problem& p, double ms, bool backward) {
  const int e = dtype_bytes(p.dtype);
  return ms > 0 ? (backward ? p.bwd_bytes(e) : p.fwd_bytes(e)) / (ms * 1e6) : 0;
}

int run_step_cli(const Step& s, const CommonOptions& o) {
  return guarded([&]() -> int {
    Problem p = resolve_problem(o, s.default_dtype());
    // Fail on bad input before any work: shapes, capabilities, variant, the output directory.
    const CheckMode mode = check_options(o, p);
    Inputs in = obtain_inputs(o, p);
    const RunOptions ro = resolve_run_options(s, o);
    require_runnable(s, p, ro.variant);

    const std::string variant = ro.variant.empty() ? s.variants.front().name : ro.variant;
    std::cout << s.name << " [" << variant << "]: " << p.describe() << "\n";
    CheckedRun c = run_checked(s, p, in, ro, mode);
    if (!c.result.config.empty()) std::cout << "  config: " << c.result.config << "\n";
    std::cout << "  check vs float64 oracle (" << c.check.mode << ")\n" << c.check.summary();

    if (!o.save.empty()) {
      const size_t n = save_outputs(o.save, c.out, p.backward, o.save_f64);
      std::cout << "  saved " << n << " files to " << o.save
                << (o.save_f64 ? " (float64)" : " (float32)") << "\n";
    }
    if (!c.check.pass) {
      std::cout << "FAIL: " << c.check.first_failure()
                << " (no timing is reported for a failed check)\n";
      return kExitCheckFailed;
    }
    auto line = [&](const char* dir, double ms, bool bwd) {
      std::cout << "  " << dir << "  " << fmt(ms, 3) << " ms  " << fmt(tflops(p, ms, bwd), 4)
                << " TFLOP/s  " << fmt(gbps(p, ms, bwd), 2) << " GB/s  (median of " << ro.repeats
                << ")\n";
    };
    line("forward ", c.result.fwd_ms, false);
    if (p.backward) line("backward", c.result.bwd_ms, true);
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
             (s.caps.limits.empty() ? "" : "; " + s.caps.limits) + "\n" + variants +
             "\nExit status: 0 ok, 1 check against the oracle failed, 2 bad or unsupported input, "
             "3 no CUDA device.");
  CommonOptions o;
  add_common_options(app, o);
  const int rc = parse_or_exit(app, argc, argv);
  if (rc >= 0) return rc;
  return run_step_cli(s, o);
}

}  // namespace ladder
