// The shared command line (LADDER.md, "The command line"): every step program and
// `ladder run` take exactly these flags.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "check.hpp"
#include "inputs.hpp"
#include "problem.hpp"
#include "step.hpp"

namespace ladder {

struct CommonOptions {
  Problem p;
  std::string dtype;  // empty: the step's default
  std::string load, save;
  bool save_f64 = false;
  std::string inputs = "normal";
  std::string check = "auto";
  RunOptions run;
  int repeats = 0, warmup = -1;  // 0 / -1: the step's default (CPU 3 / 1, GPU 20 / 3)
  CLI::Option* shape_opts[6] = {};
};

// Registers the flags on `app` (a step program or the `ladder run` subcommand).
void add_common_options(CLI::App& app, CommonOptions& o);

// Parses argv; returns -1 to go on, else the exit status (0 after --help, 2 on a parse
// error, with the message printed).
int parse_or_exit(CLI::App& app, int argc, char** argv);

}  // namespace ladder
