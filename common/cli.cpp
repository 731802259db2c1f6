#include "cli.hpp"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <sstream>

#include "error.hpp"

namespace ladder {

namespace {
std::string fmt_plain(double x) {
  std::ostringstream o;
  o << x;
  return o.str();
}

// The one check behind every numeric flag: the whole text is one number, with nothing else
// around it (an empty value, a space, a trailing letter are refused, never read as 0 or as
// the default), a sign only where the flag's range allows one, and within [lo, hi].
std::string number_text_error(const std::string& s, bool integer, bool negative_ok) {
  if (s.empty()) return "an empty value is not a number";
  for (unsigned char c : s)
    if (std::isspace(c)) return "'" + s + "' has a space in it; give just the number";
  const bool digits_only =
      s.find_first_not_of(integer ? "+-0123456789" : "+-0123456789.eE") == std::string::npos;
  if (!digits_only) return "'" + s + "' is not " + (integer ? "a whole number" : "a number");
  if (s[0] == '-' && !negative_ok) return "'" + s + "' is negative";
  return "";
}
}  // namespace

std::string integer_error(const std::string& s, int64_t lo, int64_t hi, int64_t* value) {
  if (std::string e = number_text_error(s, true, lo < 0); !e.empty()) return e;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0') return "'" + s + "' is not a whole number";
  if (errno == ERANGE) return s + " does not fit in 64 bits";
  if (v < lo || v > hi)
    return s + " is out of range: give a whole number from " + std::to_string(lo) + " to " +
           std::to_string(hi);
  if (value) *value = v;
  return "";
}

CLI::Validator integer_in(int64_t lo, int64_t hi) {
  return CLI::Validator([lo, hi](std::string& s) { return integer_error(s, lo, hi, nullptr); },
                        "INT");
}

const CLI::Validator& strict_integer() {
  static const CLI::Validator v =
      integer_in(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  return v;
}

const CLI::Validator& unsigned_integer() {
  static const CLI::Validator v(
      [](std::string& s) -> std::string {
        if (std::string e = number_text_error(s, true, false); !e.empty()) return e;
        errno = 0;
        char* end = nullptr;
        (void)std::strtoull(s.c_str(), &end, 10);
        if (end == s.c_str() || *end != '\0') return "'" + s + "' is not a whole number >= 0";
        if (errno == ERANGE) return s + " does not fit in 64 bits";
        return "";
      },
      "N");
  return v;
}

CLI::Validator real_in(double lo, double hi, bool hi_open) {
  return CLI::Validator(
      [lo, hi, hi_open](std::string& s) -> std::string {
        if (std::string e = number_text_error(s, false, lo < 0); !e.empty()) return e;
        char* end = nullptr;
        const double x = std::strtod(s.c_str(), &end);
        if (end == s.c_str() || *end != '\0' || !std::isfinite(x))
          return "'" + s + "' is not a finite number";
        if (x < lo || x > hi || (hi_open && x == hi))
          return s + " is out of range: give a number in [" + fmt_plain(lo) + ", " + fmt_plain(hi) +
                 (hi_open ? ")" : "]");
        return "";
      },
      "X");
}

const CLI::Validator& nonempty() {
  static const CLI::Validator v(
      [](std::string& s) -> std::string {
        if (s.empty()) return "an empty value is not accepted (leave the flag out for its default)";
        for (unsigned char c : s)
          if (std::isspace(c) && c != ' ') return "the value has a tab or newline in it";
        if (std::isspace(static_cast<unsigned char>(s.front())) ||
            std::isspace(static_cast<unsigned char>(s.back())))
          return "'" + s + "' starts or ends with a space";
        return "";
      },
      "TEXT");
  return v;
}

namespace {
const CLI::Validator& nonzero_finite() {
  static const CLI::Validator v(
      [](std::string& s) -> std::string {
        if (std::string e = number_text_error(s, false, true); !e.empty()) return e;
        char* end = nullptr;
        const double x = std::strtod(s.c_str(), &end);
        if (end == s.c_str() || *end != '\0' || !std::isfinite(x))
          return "'" + s + "' is not a finite number";
        if (x == 0.0) return "must be non-zero (leave --scale out for 1/sqrt(dim))";
        return "";
      },
      "X");
  return v;
}
}  // namespace

void parse_sparsity(const std::string& spec, const std::string& file, const std::string& block,
                    BlockSparsity& out) {
  out = BlockSparsity{};
  if (!file.empty() && !spec.empty())
    throw BadInput("give either --block-mask FILE or --block-sparsity SPEC, not both");
  if (!block.empty()) {
    const size_t x = block.find('x');
    auto num = [&](const std::string& t) {
      int64_t v = 0;
      if (!integer_error(t, 1, kMaxExtent, &v).empty())
        throw BadInput(
            "--mask-block must be N or NxM with whole numbers from 1 to 2^31 - 1 "
            "(got '" +
            block + "')");
      return v;
    };
    out.block_q = num(block.substr(0, x));
    out.block_k = x == std::string::npos ? out.block_q : num(block.substr(x + 1));
  }
  if (!file.empty()) {
    out.kind = BlockSparsity::Kind::file;
    out.file = file;
    return;
  }
  if (spec.empty()) {
    if (!block.empty())
      throw BadInput("--mask-block needs --block-mask FILE or --block-sparsity SPEC");
    return;
  }
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon),
                    arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (kind == "random") {
    static const CLI::Validator rho_in = real_in(0.0, 1.0, false);
    std::string text = arg;
    if (!rho_in(text).empty())
      throw BadInput("--block-sparsity random:RHO needs RHO in [0, 1] (got '" + spec + "')");
    out.kind = BlockSparsity::Kind::random;
    out.density = std::strtod(arg.c_str(), nullptr);
  } else if (kind == "local") {
    int64_t w = 0;
    if (!integer_error(arg, 1, kMaxExtent, &w).empty())
      throw BadInput("--block-sparsity local:W needs a whole number W from 1 to 2^31 - 1 (got '" +
                     spec + "')");
    out.kind = BlockSparsity::Kind::local;
    out.width = w;
  } else {
    throw BadInput("--block-sparsity must be random:RHO or local:W (got '" + spec + "')");
  }
}

void add_common_options(CLI::App& app, CommonOptions& o) {
  // An option in --help group `group`, its value checked by `v`; text: any non-empty value.
  auto option = [&](const char* flag, auto& value, const char* help, const CLI::Validator& v,
                    const char* group) {
    return app.add_option(flag, value, help)->check(v)->group(group);
  };
  auto text = [&](const char* flag, std::string& value, const char* help, const char* group) {
    return option(flag, value, help, nonempty(), group);
  };
  auto* g = "Problem (with --load the shapes come from the files)";
  auto shape = [&](const char* flag, int64_t& v, const char* help) {
    return option(flag, v, help, strict_integer(), g);
  };
  o.shape_opts[0] = shape("--batch", o.p.batch, "batch size B")->capture_default_str();
  o.shape_opts[1] = shape("--heads", o.p.heads, "query heads H")->capture_default_str();
  o.shape_opts[2] = o.heads_kv_opt =
      shape("--heads-kv", o.p.heads_kv, "K/V heads (GQA/MQA; H % heads-kv == 0; default: H)");
  o.shape_opts[3] = shape("--seq-q", o.p.seq_q, "query length M")->capture_default_str();
  o.shape_opts[4] = shape("--seq-k", o.p.seq_k, "key length N")->capture_default_str();
  o.shape_opts[5] = shape("--dim", o.p.dim, "head dimension d")->capture_default_str();
  app.add_flag("--causal", o.p.causal,
               "bottom-right causal mask: key j visible to query i iff j <= i + N - M")
      ->group(g);
  option("--scale", o.p.scale, "softmax scale, finite and non-zero (default 1/sqrt(dim))",
         nonzero_finite(), g);
  text("--dtype", o.dtype, "fp64 | fp32 | fp16 | bf16 (default: the step's first)", g);
  option("--seed", o.p.seed, "seed of the generated inputs (and of a random block mask)",
         unsigned_integer(), g)
      ->capture_default_str();
  text("--inputs", o.inputs,
       "generated input kind: normal | large (logits in the hundreds) | late (the row max grows "
       "along the keys)",
       g)
      ->capture_default_str();
  app.add_flag("--backward", o.p.backward, "also run the backward pass (dQ, dK, dV; needs dO)")
      ->group(g);
  option("--dropout", o.p.dropout,
         "dropout rate P in [0, 1) on the attention weights (kept ones scaled by 1/(1-P))",
         real_in(0.0, 1.0, true), g);
  option("--dropout-seed", o.p.dropout_seed, "seed of the dropout mask (Philox4x32-10)",
         unsigned_integer(), g)
      ->capture_default_str();
  text("--block-sparsity", o.block_sparsity,
       "a generated block mask: random:RHO (each block kept with probability RHO, seeded by "
       "--seed) or local:W (a band of W key blocks ending at the diagonal)",
       g)
      ->type_name("SPEC");
  text("--block-mask", o.block_mask,
       "a block mask .npy of 0/1, shaped [B or 1, H or 1, ceil(M/Bm), ceil(N/Bn)]", g)
      ->type_name("FILE");
  text("--mask-block", o.mask_block, "the mask's block Bm x Bn: N or NxM (default 128)", g)
      ->type_name("BLOCK");

  auto* io = "Files";
  text("--load", o.load, "read q.npy, k.npy, v.npy (and do.npy with --backward) from DIR", io)
      ->type_name("DIR");
  text("--save", o.save,
       "write o.npy, lse.npy (and dq/dk/dv.npy) as float32 to DIR, all or none; other output "
       "files of an earlier run in DIR are removed",
       io)
      ->type_name("DIR");
  app.add_flag("--save-f64", o.save_f64, "write float64 instead (to check the oracle itself)")
      ->group(io);

  auto* rg = "Running";
  option("--repeats", o.repeats, "timed repetitions, median reported (default: CPU 3, GPU 20)",
         integer_in(1, 1000000), rg);
  option("--warmup", o.warmup, "untimed runs first (default: CPU 1, GPU 3)", integer_in(0, 1000000),
         rg);
  text("--variant", o.run.variant, "a variant of the step's algorithm (see the step's list)", rg);
  option("--tile-q", o.run.tile_q,
         "Br, query rows per tile, for tiled steps (0: the step's choice)", integer_in(0, 1 << 30),
         rg);
  option("--tile-k", o.run.tile_k, "Bc, keys per tile, for tiled steps (0: the step's choice)",
         integer_in(0, 1 << 30), rg);
  text("--check", o.check,
       "auto | full | sampled | sampled:DRAW | none: check against the float64 oracle (auto: "
       "full below 4 GFLOP of oracle work, else sampled rows and keys drawn afresh; "
       "sampled:DRAW repeats a draw a report printed)",
       rg)
      ->capture_default_str();
  app.add_flag("-v,--verbose", o.run.verbose, "print what the step chose")->group(rg);
}

int parse_or_exit(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Every refusal reads the same way, whoever found it: "error: ...", exit 2.
    std::cerr << "error: " << e.what() << "\nRun with --help to see what is accepted.\n";
    return kExitBadInput;
  }
  return -1;
}

}  // namespace ladder
