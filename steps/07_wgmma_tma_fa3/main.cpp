// The program of step 07: build/steps/07_wgmma_tma_fa3 --help lists its flags and what it
// supports. It does what every step program does (runner/program.cpp): check the problem
// against this step's descriptor, make the inputs, run the step, check it against the float64
// oracle, report. `ladder run 7` runs the same.
#include "program.hpp"
#include "steps.hpp"

int main(int argc, char** argv) {
  return ladder::step_main(ladder::step_07(), argc, argv);
}
