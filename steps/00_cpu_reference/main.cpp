// The program of step 00: build/steps/00_cpu_reference --help lists its flags and what it supports.
// It does what every step program does (runner/program.cpp): check the problem against this
// step's descriptor, make the inputs, run the step, check it against the float64 oracle,
// report. `ladder run 0` runs the same.
#include "program.hpp"
#include "steps.hpp"

int main(int argc, char** argv) {
  return ladder::step_main(ladder::step_00(), argc, argv);
}
