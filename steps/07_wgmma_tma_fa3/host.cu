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
  for (fa3::Variant v : fa3::kAllVariants)
    if (name == fa3::variant_name(v)) return v;
  return fa3::Variant::intra_overlap;  // the runner resolved the name against the descriptor
}

// The descriptor's tiles(): Br = Bc = 128 for every variant and head dim, fixed at compile time.
Tiles fixed_tiles(const Problem&, const RunOptions& opt, const DeviceInfo&) {
  if ((opt.tile_q != 0 && opt.tile_q != 128) || (opt.tile_k != 0 && opt.tile_k != 128))
    throw BadInput("step 07 fixes its tiles at compile time: Br = Bc = 128 (--tile-q, --tile-k)");
  return Tiles{128, 128};
}

// Device memory beyond inputs and outputs: a block mask's index lists.
double workspace_bytes(const Problem& p, const RunOptions&) {
  if (!p.sparsity.active()) return 0.0;
  return 4.0 * double(p.batch * p.heads * p.q_blocks()) * double(p.k_blocks() + 1);
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
    const BlockLists lists = kv_block_lists(in.mask);
    kv_count = DeviceBuffer<int32_t>(lists.count.size());
    kv_index = DeviceBuffer<int32_t>(lists.index.size());
    kv_count.upload(lists.count);
    kv_index.upload(lists.index);
    f.kv_count = kv_count.get(), f.kv_index = kv_index.get();
    f.block_m = int(in.mask.block_q), f.block_n = int(in.mask.block_k);
    f.mask_batch = int(in.mask.batch), f.mask_heads = int(in.mask.heads);
  }
  const fa3::FwdPlan plan = fa3::make_plan(f, variant_named(opt.variant));
  g.forward([&] { fa3::launch(plan); });
  g.result.workspace_bytes = workspace_bytes(p, opt);
  g.result.config = fa3::describe(plan);
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
        "setmaxnreg, ping-pong and intra-warpgroup overlap of softmax and GEMMs";
    s.adds = {"TMA tile loads completing on mbarriers",
              "wgmma with B from swizzled shared memory and P from registers",
              "a producer warpgroup and setmaxnreg",
              "ping-pong scheduling of two consumer warpgroups",
              "softmax overlapped with the next tile's GEMMs inside a warpgroup",
              "dropout and block-sparse masks in the full kernel"};
    s.device = Device::cuda;
    s.caps.dtypes = {DType::bf16, DType::f16};
    s.caps.head_dims = {64, 128};
    s.caps.causal = true, s.caps.gqa = true, s.caps.backward = false;
    s.caps.dropout = true, s.caps.block_sparse = true;
    s.caps.max_batch = s.caps.max_heads = 65535;  // grid.z and grid.y
    s.caps.max_seq = int64_t(1) << 30;            // 32-bit row indices
    s.caps.min_cc = s.caps.max_cc = 90;           // sm_90a code runs on sm_90 alone
    s.caps.limits =
        "forward only; Br = Bc = 128 (fixed); mask blocks multiples of 128 x 128; dropout and "
        "block-sparse masks in the default variant 'intra-overlap' only";
    const char* summaries[] = {
        "TMA tile loads and wgmma, no roles: every thread waits on the barriers (the baseline)",
        "+ a producer warpgroup issuing TMA, full/empty mbarriers, setmaxnreg 24/240",
        "+ ping-pong: named barriers put one warpgroup's softmax under the other's GEMMs",
        "+ intra-warpgroup overlap: the next tile's S GEMM issued before this tile's softmax"};
    // The default (first) variant is the full kernel; then the ladder of ideas, baseline first.
    s.variants.push_back({fa3::variant_name(fa3::Variant::intra_overlap), summaries[3]});
    for (fa3::Variant v :
         {fa3::Variant::tma_wgmma, fa3::Variant::warp_specialized, fa3::Variant::pingpong}) {
      Variant x{fa3::variant_name(v), summaries[int(v)]};
      x.dropout = x.block_sparse = false;
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
