// The program of step 04: build/steps/04_thread_per_row --help lists its flags and what it
// supports. It does what every step program does (runner/program.cpp): check the problem against
// this step's descriptor, make the inputs, run the step, check it against the float64 oracle,
// report. `ladder run 4` runs the same.
#include "program.hpp"
#include "steps.hpp"

int main(int argc, char** argv) {
  return ladder::step_main(ladder::step_04(), argc, argv);
}
