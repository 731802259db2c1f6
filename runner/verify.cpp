#include "verify.hpp"

#include <filesystem>
#include <iostream>

#include "error.hpp"
#include "memory.hpp"
#include "npy.hpp"
#include "program.hpp"

namespace ladder {

namespace fs = std::filesystem;

namespace {

// One output file: its header must give exactly the shape the problem implies (checked before
// its data is read).
Tensor read_output(const std::string& dir, const char* name, const std::vector<int64_t>& shape) {
  const std::string path = (fs::path(dir) / name).string();
  const NpyHeader h = read_npy_header(path);
  if (h.shape != shape)
    throw BadInput("--outputs " + path + " has shape " + shape_str(h.shape) + "; the inputs give " +
                   shape_str(shape));
  return read_npy(path, h);
}

// Whether the outputs hold a backward pass: dq.npy, dk.npy and dv.npy all present, or none.
// A name that is there at all counts, a broken link too (reading it then fails with exit 2):
// following links here would grade a forward pass where gradients were meant.
bool outputs_have_backward(const std::string& dir) {
  int found = 0;
  for (const char* n : {"dq.npy", "dk.npy", "dv.npy"}) {
    std::error_code ec;
    found += fs::exists(fs::symlink_status(fs::path(dir) / n, ec));
  }
  if (found != 0 && found != 3)
    throw BadInput("--outputs " + dir +
                   ": dq.npy, dk.npy and dv.npy come together (all three for a backward pass, "
                   "none for a forward pass)");
  return found == 3;
}

}  // namespace

const std::vector<std::string>& verify_unused_flags() {
  static const std::vector<std::string> flags = {"--save",   "--save-f64", "--repeats",
                                                 "--warmup", "--variant",  "--tile-q",
                                                 "--tile-k", "--inputs",   "--verbose"};
  return flags;
}

int verify_outputs_cli(const CommonOptions& o, const std::string& outputs_dir) {
  if (o.load.empty())
    throw BadInput(
        "verify needs --load DIR: the inputs q.npy, k.npy, v.npy (and do.npy) the "
        "outputs were computed from");
  if (o.dtype.empty())
    throw BadInput(
        "verify needs --dtype fp64|fp32|fp16|bf16: the precision the outputs were "
        "computed in (it picks the yardstick)");
  std::error_code ec;
  if (!fs::is_directory(outputs_dir, ec))
    throw BadInput("--outputs " + outputs_dir + ": not a directory");
  // The backward is known before the inputs' headers are read, so that do.npy's shape is
  // checked against q.npy's whether --backward said so or the gradients' files did.
  const bool backward = outputs_have_backward(outputs_dir);
  if (o.p.backward && !backward)
    throw BadInput("--backward: --outputs " + outputs_dir + " has no dq.npy, dk.npy, dv.npy");
  CommonOptions with = o;
  with.p.backward = backward;
  Problem p = resolve_problem(with, DType::f32);
  CheckMode mode = check_options(o, p);
  if (mode == CheckMode::none) throw BadInput("verify checks: --check none has no meaning here");
  // auto: a full check whenever it fits in memory (verify has no run to keep short); sampled
  // only where it does not, and the report says so. The same estimate as a run's check (the
  // outputs read from files stand for the step's).
  if (mode == CheckMode::automatic) {
    const CheckBytes f = check_host_bytes(p, CheckMode::full, false);
    mode = f.tensors + f.scratch <= 0.9 * available_host_bytes() ? CheckMode::full
                                                                 : CheckMode::sampled;
  }
  const CheckBytes c = check_host_bytes(p, mode, false);
  require_host_memory(c.tensors + c.scratch, "verify");

  const Inputs in = obtain_inputs(o, p);
  Outputs got;
  const std::vector<int64_t> qshape = {p.batch, p.heads, p.seq_q, p.dim},
                             kvshape = {p.batch, p.heads_kv, p.seq_k, p.dim};
  got.o = read_output(outputs_dir, "o.npy", qshape);
  got.lse = read_output(outputs_dir, "lse.npy", {p.batch, p.heads, p.seq_q});
  if (p.backward) {
    got.dq = read_output(outputs_dir, "dq.npy", qshape);
    got.dk = read_output(outputs_dir, "dk.npy", kvshape);
    got.dv = read_output(outputs_dir, "dv.npy", kvshape);
  }
  const CheckReport rep = verify(p, in, got, mode);
  std::cout << "verify " << outputs_dir << ": " << p.describe() << "\n"
            << "  check vs float64 oracle (" << rep.mode << "), yardstick " << dtype_name(p.dtype)
            << "\n"
            << rep.summary();
  if (!rep.pass) {
    std::cout << "FAIL: " << rep.first_failure() << "\n";
    return kExitCheckFailed;
  }
  std::cout << (mode == CheckMode::sampled ? "PASS (sampled: the rows and keys above, not every "
                                             "element; --check full compares them all)\n"
                                           : "PASS\n");
  return kExitOk;
}

}  // namespace ladder
