// Step 07's host side: the descriptor (what it supports) and the launches. The algorithm is
// wgmma_tma_fa3.cu (the kernels, and the tensor maps they read) with hopper.cuh (the Hopper
// instructions); wgmma_tma_fa3.hpp is its host API, which the PyTorch extension uses too.
#include <cmath>
#include <string>
#include <vector>

#include "block_mask.hpp"
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

// Whether the run compiles dropout or a block mask in (those kernels have Br = 128).
bool has_extras(const Problem& p) {
  return p.sparsity.active() || p.dropout > 0;
}

// The descriptor's tiles(), fixed at compile time: Bc = 128; Br = 192 for three-consumers at
// d = 64 without dropout or a block mask (unless seq_q pads badly to 192), else 128.
Tiles fixed_tiles(const Problem& p, const RunOptions& opt, const DeviceInfo&) {
  const int br =
      fa3::query_tile(variant_named(opt.variant), int(p.dim), has_extras(p), int(p.seq_q));
  if ((opt.tile_q != 0 && opt.tile_q != br) || (opt.tile_k != 0 && opt.tile_k != 128))
    throw BadInput("step 07 fixes its tiles at compile time: Br = " + std::to_string(br) +
                   ", Bc = 128 here (--tile-q, --tile-k)");
  return Tiles{br, 128};
}

// Device memory beyond inputs and outputs: a block mask's index lists (both directions with
// the backward), the persistent kernels' 4-byte work counter, and the backward's fp32 dQ
// accumulator with LSE log2(e) and D per (padded) query row.
double workspace_bytes(const Problem& p, const RunOptions& opt) {
  double bytes = fa3::is_persistent(variant_named(opt.variant)) ? 4.0 : 0.0;
  const double masks = double(p.batch * p.heads) * double(p.q_blocks()) * double(p.k_blocks());
  if (p.sparsity.active()) bytes += 4.0 * (masks + double(p.batch * p.heads * p.q_blocks()));
  if (p.backward) {
    const double rows_padded = double((p.seq_q + fa3::kBwdRowPad - 1) / fa3::kBwdRowPad) *
                               fa3::kBwdRowPad * double(p.batch * p.heads);
    bytes += 4.0 * double(p.q_numel()) + 8.0 * rows_padded;
    if (p.sparsity.active()) bytes += 4.0 * (masks + double(p.batch * p.heads * p.k_blocks()));
  }
  return bytes;
}

// Uploads a block mask's lists (kept key blocks per query block, or the transpose).
void upload_lists(const BlockLists& l, DeviceBuffer<int32_t>& count, DeviceBuffer<int32_t>& index) {
  count = DeviceBuffer<int32_t>(l.count.size());
  index = DeviceBuffer<int32_t>(l.index.size());
  count.upload(l.count);
  index.upload(l.index);
}

template <class T>
RunResult run_typed(const Problem& p, const Inputs& in, Outputs& out, const RunOptions& opt) {
  // The running max is of the raw scores: a negative scale runs as (-Q) K^T |scale| (exact).
  GpuRun<T> g(p, in, opt, p.softmax_scale() < 0);
  fa3::FwdParams f;
  f.q = g.q.get(), f.k = g.k.get(), f.v = g.v.get(), f.o = g.o.get(), f.lse = g.lse.get();
  f.batch = int(p.batch), f.heads = int(p.heads), f.heads_kv = int(p.heads_kv);
  f.seq_q = int(p.seq_q), f.seq_k = int(p.seq_k), f.dim = int(p.dim);
  f.bf16 = p.dtype == DType::bf16;
  f.scale = float(std::fabs(p.softmax_scale()));
  f.causal = p.causal;
  f.dropout_p = float(p.dropout);
  f.dropout_seed = p.dropout_seed;
  // A block mask's lists of kept key blocks, made once on the host and not timed (as
  // FlexAttention's BlockMask is built once and reused).
  DeviceBuffer<int32_t> kv_count, kv_index;
  if (!in.mask.empty()) {
    upload_lists(kv_block_lists(in.mask), kv_count, kv_index);
    f.kv_count = kv_count.get(), f.kv_index = kv_index.get();
    f.block_m = int(in.mask.block_q), f.block_n = int(in.mask.block_k);
    f.mask_batch = int(in.mask.batch), f.mask_heads = int(in.mask.heads);
  }
  // The persistent kernels' work counter (make_plan zeroes it; each launch leaves it zero).
  const fa3::Variant v = variant_named(opt.variant);
  DeviceBuffer<uint32_t> counter(fa3::is_persistent(v) ? 1 : 0);
  f.tile_counter = counter.get();
  const fa3::FwdPlan plan = fa3::make_plan(f, v);
  g.forward([&] { fa3::launch(plan); });
  g.result.workspace_bytes = workspace_bytes(p, opt);
  g.result.config = fa3::describe(plan);

  if (p.backward) {  // on the O and LSE the forward above has produced
    fa3::BwdParams b;
    b.q = g.q.get(), b.k = g.k.get(), b.v = g.v.get(), b.o = g.o.get(), b.dout = g.dout.get();
    b.lse = g.lse.get(), b.dq = g.dq.get(), b.dk = g.dk.get(), b.dv = g.dv.get();
    b.batch = f.batch, b.heads = f.heads, b.heads_kv = f.heads_kv;
    b.seq_q = f.seq_q, b.seq_k = f.seq_k, b.dim = f.dim, b.bf16 = f.bf16;
    b.scale = f.scale, b.causal = f.causal;
    b.negate_dq = p.softmax_scale() < 0;  // Q went up as -Q: dQ for the real Q is the negation
    b.dropout_p = f.dropout_p, b.dropout_seed = f.dropout_seed;
    DeviceBuffer<int32_t> q_count, q_index;
    if (!in.mask.empty()) {
      upload_lists(q_block_lists(in.mask), q_count, q_index);
      b.q_count = q_count.get(), b.q_index = q_index.get();
      b.block_m = f.block_m, b.block_n = f.block_n;
      b.mask_batch = f.mask_batch, b.mask_heads = f.mask_heads;
    }
    const fa3::BwdWorkspace ws = fa3::bwd_workspace(b);
    DeviceBuffer<float> dq_acc(ws.dq_acc_bytes / 4), lse2(ws.lse2_bytes / 4),
        dsum(ws.dsum_bytes / 4);
    b.dq_acc = dq_acc.get(), b.lse2 = lse2.get(), b.dsum = dsum.get();
    const fa3::BwdPlan bplan = fa3::make_bwd_plan(b);
    g.backward([&] { fa3::launch_bwd(bplan); });
    g.result.config += "; " + fa3::describe(bplan);
  }
  return g.finish(out);
}

RunResult run(const Problem& p, const Inputs& in, Outputs& out, const RunOptions& opt) {
  return p.dtype == DType::bf16 ? run_typed<__nv_bfloat16>(p, in, out, opt)
                                : run_typed<__half>(p, in, out, opt);
}

}  // namespace

const Step& step_07() {
  static const Step s = [] {
    Step s;
    s.number = 7;
    s.name = "07_wgmma_tma_fa3";
    s.summary =
        "FlashAttention on Hopper: TMA copies on mbarriers, wgmma, a producer warpgroup with "
        "setmaxnreg, ping-pong and intra-warpgroup overlap of softmax and GEMMs, a persistent "
        "kernel with a tile scheduler";
    s.adds = {"TMA tile loads completing on mbarriers",
              "wgmma with B from swizzled shared memory and P from registers",
              "a producer warpgroup and setmaxnreg",
              "ping-pong scheduling of the consumer warpgroups",
              "softmax overlapped with the next tile's GEMMs inside a warpgroup",
              "a persistent kernel fed by a tile scheduler, heaviest work first",
              "three consumer warpgroups at d = 64",
              "dropout and block-sparse masks in the persistent kernels",
              "the backward on wgmma: a producer streams Q and dO tiles to two consumer warpgroups "
              "that keep dK and dV in registers, dQ added by the copy engine"};
    s.device = Device::cuda;
    s.caps.dtypes = {DType::bf16, DType::f16};
    s.caps.head_dims = {64, 128};
    s.caps.causal = true, s.caps.gqa = true, s.caps.backward = true;
    s.caps.dropout = true, s.caps.block_sparse = true;
    s.caps.max_batch = s.caps.max_heads = 65535;  // grid.z and grid.y
    s.caps.max_seq = int64_t(1) << 30;            // 32-bit row indices
    s.caps.min_cc = s.caps.max_cc = 90;           // sm_90a code runs on sm_90 alone
    s.caps.limits =
        "backward: Bc = 128 keys x Br = 64 queries (128 at d = 64), dQ through TMA reduce-add, "
        "not bitwise reproducible in dQ; forward tiles fixed at compile time: Bc = 128, Br = 128 "
        "(192 for the default "
        "variant at d = 64 without dropout or a block mask, unless seq_q pads to 192 with over "
        "1/32 more rows than to 128); mask blocks multiples of 128 x 128; "
        "dropout and block-sparse masks in the persistent variants ('three-consumers', the "
        "default, and 'persistent') only";
    // The variants as fa3::kVariants describes them, the default (the fastest kernel) first,
    // then the ladder of ideas. Only the persistent kernels have dropout and block masks.
    for (const fa3::VariantInfo& v : fa3::kVariants)
      if (v.id == fa3::Variant::three_consumers) s.variants.push_back({v.name, v.idea});
    for (const fa3::VariantInfo& v : fa3::kVariants) {
      if (v.id == fa3::Variant::three_consumers) continue;
      Variant x{v.name, v.idea};
      x.dropout = x.block_sparse = fa3::is_persistent(v.id);
      s.variants.push_back(x);
    }
    s.tiles = fixed_tiles;
    s.workspace = workspace_bytes;
    s.run = run;
    return s;
  }();
  return s;
}

}  // namespace ladder
