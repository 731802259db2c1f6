// lse_drift: the LSE error of a GPU rung against the sequence length, as CSV on stdout, for the
// build it is linked with (the rung as it is, or its rescale-fault build: common/fault.hpp).
//   lse_drift --step NN --build NAME
// One row per dtype, head dim and length: 1 x 1 x seq x seq, not causal, normal inputs, the
// step's default variant, checked with the sampled rule (a fixed draw, so both builds compare the
// same rows). An online-softmax rescale that is 2^eps instead of 1 when the row max holds makes
// the error grow with the number of key tiles; a right one keeps it flat. Exit 77 without a
// CUDA device. tests/CMakeLists.txt builds it for rungs 06 and 07 (label gpu, not run by ctest:
// tools/lse_drift.sh runs both builds and prints the table).
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "check.hpp"
#include "device.hpp"
#include "program.hpp"
#include "report.hpp"
#include "rungs.hpp"

int main(int argc, char** argv) {
  using namespace ladder;
  int number = -1;
  std::string build;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--step") == 0) number = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--build") == 0) build = argv[i + 1];
  }
  const Step* s = find_step(number);
  if (!s || build.empty()) {
    std::cerr << "usage: lse_drift --step NN --build NAME (step " << number
              << " is not built here)\n";
    return 2;
  }
  std::string why;
  if (cuda_device_count(&why) == 0) {
    std::cout << "NOT RUN: lse_drift needs a CUDA device: " << why << "\n";
    return 77;
  }
  CheckMode mode;
  parse_check_mode("sampled:20261207", mode);  // the same rows in every build
  std::cout << "step,build,dtype,dim,seq,lse_err,lse_tol,o_err,o_tol,pass\n";
  for (DType t : s->caps.dtypes)
    for (int64_t dim : {64, 128})
      for (int64_t seq : {1024, 4096, 16384, 32768}) {
        Problem p;
        p.batch = p.heads = p.heads_kv = 1, p.seq_q = p.seq_k = seq, p.dim = dim;
        p.dtype = t, p.seed = 11;
        RunOptions ro;
        ro.repeats = 1, ro.warmup = 0;
        const Inputs in = make_inputs(p);
        const CheckedRun r = run_checked(*s, p, in, ro, mode);
        std::cout << s->name.substr(0, 2) << "," << build << "," << dtype_name(t) << "," << dim
                  << "," << seq;
        for (const char* name : {"LSE", "O"})
          for (const TensorCheck& c : r.check.tensors)
            if (c.name == name)
              std::cout << "," << fmt_sci(c.step.max_abs) << "," << fmt_sci(c.tol);
        std::cout << "," << (r.check.pass ? "pass" : "FAIL") << "\n";
      }
  return 0;
}
