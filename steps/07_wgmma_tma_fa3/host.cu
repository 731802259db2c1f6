// Step 07's host side: the descriptor (what it supports; the head dims and dtypes are in
// capabilities.hpp) and the runs, through the step's host API (wgmma_tma_fa3.hpp), which the
// PyTorch extension uses too.
#include <cmath>
#include <string>
#include <vector>

#include "block_mask.hpp"
#include "capabilities.hpp"
#include "error.hpp"
#include "gpu_run.cuh"
#include "steps.hpp"
#include "wgmma_tma_fa3.hpp"

namespace ladder {
namespace {

fa3::Variant variant_named(const std::string& name) {
  for (const fa3::VariantInfo& v : fa3::kVariants)
    if (name == v.name) return v.id;
  return fa3::Variant::three_consumers;  // the runner resolved the name against the descriptor
}

// The descriptor's tiles(), fixed at compile time (fa3::query_tile; a block mask keeps Br = 128).
Tiles fixed_tiles(const Problem& p, const RunOptions& opt, const DeviceInfo&) {
  const int br =
      fa3::query_tile(variant_named(opt.variant), int(p.dim), p.sparsity.active(), int(p.seq_q));
  if ((opt.tile_q != 0 && opt.tile_q != br) || (opt.tile_k != 0 && opt.tile_k != 128))
    throw BadInput("step 07 fixes its tiles at compile time: Br = " + std::to_string(br) +
                   ", Bc = 128 here (--tile-q, --tile-k)");
  return Tiles{br, 128};
}

// Whether a run needs the persistent kernels' 4-byte work counter: a persistent forward, or a
// backward (persistent whenever it has more K/V tiles than fit at once). One serves both: the
// launches of one stream never overlap, and each leaves it at zero.
bool needs_counter(const Problem& p, const RunOptions& opt) {
  return fa3::is_persistent(variant_named(opt.variant)) || p.backward;
}

// Device memory beyond inputs and outputs: a block mask's index lists (both directions with
// the backward), the work counter, and the backward's fp32 dQ accumulator with LSE log2(e) and
// D per (padded) query row.
double workspace_bytes(const Problem& p, const RunOptions& opt) {
  double bytes = (needs_counter(p, opt) ? 4.0 : 0.0) + block_list_bytes(p);
  if (p.backward) {
    const double rows_padded = double((p.seq_q + fa3::kBwdRowPad - 1) / fa3::kBwdRowPad) *
                               fa3::kBwdRowPad * double(p.batch * p.heads);
    bytes += 4.0 * double(p.q_numel()) + 8.0 * rows_padded;
  }
  return bytes;
}

template <class T>
RunResult run_typed(const Problem& p, const Inputs& in, Outputs& out, const RunOptions& opt) {
  // The running max is of the raw scores: a negative scale runs as (-Q) K^T |scale| (exact).
  GpuRun<T> g(p, in, opt, p.softmax_scale() < 0);
  fa3::FwdParams f;
  g.forward_tensors(f);
  f.batch = int(p.batch), f.heads = int(p.heads), f.heads_kv = int(p.heads_kv);
  f.seq_q = int(p.seq_q), f.seq_k = int(p.seq_k), f.dim = int(p.dim);
  f.bf16 = p.dtype == DType::bf16;
  f.scale = float(std::fabs(p.softmax_scale()));
  f.causal = p.causal;
  f.dropout_p = float(p.dropout);
  f.dropout_seed = p.dropout_seed;
  // A block mask's lists of kept key blocks.
  DeviceBlockLists kv_lists, q_lists;
  if (!in.mask.empty()) {
    kv_lists = DeviceBlockLists(kv_block_lists(in.mask));
    f.kv_count = kv_lists.count.get(), f.kv_index = kv_lists.index.get();
    f.block_m = int(in.mask.block_q), f.block_n = int(in.mask.block_k);
    f.mask_batch = int(in.mask.batch), f.mask_heads = int(in.mask.heads);
  }
  // The work counter (needs_counter; make_plan zeroes it, the backward's pre-pass too, and each
  // launch leaves it zero).
  const fa3::Variant v = variant_named(opt.variant);
  DeviceBuffer<uint32_t> counter(needs_counter(p, opt) ? 1 : 0);
  if (fa3::is_persistent(v)) f.tile_counter = counter.get();
  const fa3::FwdPlan plan = fa3::make_plan(f, v);
  g.forward([&] { fa3::launch(plan); });
  g.result.workspace_bytes = workspace_bytes(p, opt);
  g.result.config = fa3::describe(plan);

  if (p.backward) {  // on the O and LSE the forward above has produced
    fa3::BwdParams b;
    static_cast<fa3::Attention&>(b) = f;  // the shapes, softmax, dropout and mask geometry
    g.backward_tensors(b);
    b.negate_dq = p.softmax_scale() < 0;  // Q went up as -Q: dQ for the real Q is the negation
    if (!in.mask.empty()) {
      q_lists = DeviceBlockLists(q_block_lists(in.mask));
      b.q_count = q_lists.count.get(), b.q_index = q_lists.index.get();
    }
    const fa3::BwdWorkspace ws = fa3::bwd_workspace(b);
    DeviceBuffer<float> dq_acc(ws.dq_acc_bytes / 4), lse2(ws.lse2_bytes / 4),
        dsum(ws.dsum_bytes / 4);
    b.dq_acc = dq_acc.get(), b.lse2 = lse2.get(), b.dsum = dsum.get();
    b.tile_counter = counter.get();  // the forward's: the backward runs after it on the stream
    const fa3::BwdPlan bplan = fa3::make_bwd_plan(b);
    g.backward([&] { fa3::launch_bwd(bplan); });
    g.result.config += "; " + fa3::describe(bplan);
  }
  return g.finish(out);
}

RunResult run(const Problem& p, const Inputs& in, Outputs& out, const RunOptions& opt) {
  return with_16bit_type(p.dtype, [&](auto t) { return run_typed<decltype(t)>(p, in, out, opt); });
}

// The variants as fa3::kVariants describes them, the default (three-consumers, the fastest
// kernel) first, then the ladder of ideas. Only the persistent kernels have dropout and block
// masks.
std::vector<Variant> variants() {
  std::vector<Variant> vs;
  for (const fa3::VariantInfo& v : fa3::kVariants) {
    Variant x{v.name, v.idea};
    x.dropout = x.block_sparse = fa3::is_persistent(v.id);
    vs.insert(v.id == fa3::Variant::three_consumers ? vs.begin() : vs.end(), x);
  }
  return vs;
}

}  // namespace

const Step& step_07() {
  static const Step s =
      StepBuilder(7, "07_wgmma_tma_fa3", Device::cuda,
                  "FlashAttention on Hopper: TMA copies on mbarriers, wgmma, a producer warpgroup "
                  "with setmaxnreg, ping-pong and intra-warpgroup overlap of softmax and GEMMs, a "
                  "persistent kernel with a tile scheduler")
          .adds({"TMA tile loads completing on mbarriers",
                 "wgmma with B from swizzled shared memory and P from registers",
                 "a producer warpgroup and setmaxnreg",
                 "ping-pong scheduling of the consumer warpgroups",
                 "softmax overlapped with the next tile's GEMMs inside a warpgroup",
                 "a persistent kernel fed by a tile scheduler, heaviest work first",
                 "three consumer warpgroups at d = 64",
                 "dropout and block-sparse masks in the persistent kernels",
                 "the backward on wgmma: a producer streams Q and dO tiles to two consumer "
                 "warpgroups that keep dK and dV in registers, dQ added by the copy engine"})
          .dtypes(step07::kDTypes)
          .head_dims(step07::HeadDims())
          .backward()
          .dropout()
          .block_sparse()
          .max_sizes(kGridLimits)
          .compute_capability(90, 90)  // sm_90a code runs on sm_90 alone
          .limits(
              "backward: Bc = 128 keys x Br = 64 queries (128 at d = 64), dQ through TMA "
              "reduce-add, not bitwise reproducible in dQ; forward tiles fixed at compile time: "
              "Bc = 128, Br = 128 (192 for the default variant at d = 64 without dropout or a "
              "block mask, unless seq_q pads to 192 with over 1/32 more rows than to 128); mask "
              "blocks multiples of 128 x 128; dropout and block-sparse masks in the persistent "
              "variants ('three-consumers', the default, and 'persistent') only")
          .variants(variants())
          .tiles(fixed_tiles)
          .workspace(workspace_bytes)
          .run(run);
  return s;
}

}  // namespace ladder
