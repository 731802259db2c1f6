#include "cli.hpp"

#include "error.hpp"

namespace ladder {

void add_common_options(CLI::App& app, CommonOptions& o) {
  auto* g = "Problem (ignored shapes come from the files with --load)";
  o.shape_opts[0] =
      app.add_option("--batch", o.p.batch, "batch size B")->capture_default_str()->group(g);
  o.shape_opts[1] =
      app.add_option("--heads", o.p.heads, "query heads H")->capture_default_str()->group(g);
  o.shape_opts[2] = app.add_option("--heads-kv", o.p.heads_kv,
                                   "K/V heads (GQA/MQA; H % heads-kv == 0; default: H)")
                        ->group(g);
  o.shape_opts[3] =
      app.add_option("--seq-q", o.p.seq_q, "query length M")->capture_default_str()->group(g);
  o.shape_opts[4] =
      app.add_option("--seq-k", o.p.seq_k, "key length N")->capture_default_str()->group(g);
  o.shape_opts[5] =
      app.add_option("--dim", o.p.dim, "head dimension d")->capture_default_str()->group(g);
  app.add_flag("--causal", o.p.causal,
               "bottom-right causal mask: key j visible to query i iff j <= i + N - M")
      ->group(g);
  app.add_option("--scale", o.p.scale, "softmax scale (default 1/sqrt(dim))")->group(g);
  app.add_option("--dtype", o.dtype, "fp64 | fp32 | fp16 | bf16 (default: the step's first)")
      ->group(g);
  app.add_option("--seed", o.p.seed, "seed of the generated inputs")
      ->capture_default_str()
      ->group(g);
  app.add_option("--inputs", o.inputs,
                 "generated input kind: normal | large (logits in the hundreds)")
      ->capture_default_str()
      ->group(g);
  app.add_flag("--backward", o.p.backward, "also run the backward pass (dQ, dK, dV; needs dO)")
      ->group(g);

  auto* io = "Files";
  app.add_option("--load", o.load, "read q.npy, k.npy, v.npy (and do.npy with --backward) from DIR")
      ->type_name("DIR")
      ->group(io);
  app.add_option("--save", o.save, "write o.npy, lse.npy (and dq/dk/dv.npy) as float32 to DIR")
      ->type_name("DIR")
      ->group(io);
  app.add_flag("--save-f64", o.save_f64, "write float64 instead (to check the oracle itself)")
      ->group(io);

  auto* rg = "Running";
  app.add_option("--repeats", o.repeats,
                 "timed repetitions, median reported (default: CPU 3, GPU 20)")
      ->group(rg);
  app.add_option("--warmup", o.warmup, "untimed runs first (default: CPU 1, GPU 3)")->group(rg);
  app.add_option("--variant", o.run.variant,
                 "a variant of the step's algorithm (see the step's list)")
      ->group(rg);
  app.add_option("--tile-q", o.run.tile_q,
                 "Br, query rows per tile, for tiled steps (0: the step's choice)")
      ->group(rg);
  app.add_option("--tile-k", o.run.tile_k,
                 "Bc, keys per tile, for tiled steps (0: the step's choice)")
      ->group(rg);
  app.add_option("--check", o.check,
                 "auto | full | sampled | none: check against the float64 oracle")
      ->capture_default_str()
      ->group(rg);
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
    app.exit(e);
    return kExitBadInput;
  }
  return -1;
}

}  // namespace ladder
