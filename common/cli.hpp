// The shared command line (docs/CONTRACT.md, "The command line"): every step program and
// `ladder run` take exactly these flags.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

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
  std::string block_mask, block_sparsity, mask_block;  // as given; resolve_problem parses them
  RunOptions run;
  int repeats = 0, warmup = -1;  // 0 / -1: the step's default (CPU 3 / 1, GPU 20 / 3)
  CLI::Option* shape_opts[6] = {};
  CLI::Option* heads_kv_opt = nullptr;
};

// Registers the flags on `app` (a step program or the `ladder run` subcommand).
void add_common_options(CLI::App& app, CommonOptions& o);

// Parses argv; returns -1 to go on, else the exit status (0 after --help, 2 on a parse
// error, with the message printed).
int parse_or_exit(CLI::App& app, int argc, char** argv);

// The flag values' one parser (docs/CONTRACT.md, "The command line"): the whole text is the
// value, never empty, never with spaces around it, a sign only where the range allows one.
// Empty when `s` is a whole number in [lo, hi] (stored in *value when given), else why not.
std::string integer_error(const std::string& s, int64_t lo, int64_t hi, int64_t* value);
// CLI11 checks built on it: a whole number in [lo, hi]; any int64 (CLI11 alone would clamp
// 99999999999999999999 to the largest int64); a uint64 (seeds: "-1" and " 1" are refused);
// a finite real in [lo, hi] (or [lo, hi)); non-empty text without surrounding spaces.
CLI::Validator integer_in(int64_t lo, int64_t hi);
const CLI::Validator& strict_integer();
const CLI::Validator& unsigned_integer();
CLI::Validator real_in(double lo, double hi, bool hi_open);
const CLI::Validator& nonempty();

// "random:0.25", "local:4" (with --mask-block "128" or "128x64") into p.sparsity; a file given
// by --block-mask makes the kind `file`. Throws BadInput.
void parse_sparsity(const std::string& spec, const std::string& file, const std::string& block,
                    BlockSparsity& out);

}  // namespace ladder
