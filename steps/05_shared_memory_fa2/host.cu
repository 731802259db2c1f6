// Step 05's host side: the descriptor (what it supports; the head dims and dtypes are in
// capabilities.hpp), the variants, the tile choice (the FlashAttention block-size rule) and the
// launches. The algorithm is row_per_thread.cuh (the first kernel to read), shared_memory_fa2.cuh
// (the overview and the tile machinery), shared_memory_fa2_forward.cuh (forward) and
// shared_memory_fa2_backward.cuh (backward).
#include <algorithm>
#include <iostream>
#include <string>
#include <type_traits>
#include <vector>

#include "capabilities.hpp"
#include "error.hpp"
#include "fault.hpp"
#include "gpu_run.cuh"
#include "shared_memory_fa2_backward.cuh"
#include "shared_memory_fa2_forward.cuh"
#include "steps.hpp"

namespace ladder {
namespace {

using namespace step05;

// The variants. The default is the full FA2 kernel. Then the learner's path up to it, each
// row the previous one plus one idea ("+" reads "the previous row plus"): the row-per-thread
// kernel (row_per_thread.cuh), then the micro-tiled kernel of shared_memory_fa2_forward.cuh reading
// shared memory 4 bytes at a time, into unpadded rows, with one load in flight per thread;
// then with 16-byte reads, then with the pads; adding the loads in flight gives 'fa2' itself.
// Last, the FA1 loop order. Only 'fa2' has dropout and block masks; every variant's backward
// is the one FA2 backward (the forward only leaves O and LSE).
enum class Fwd { fa2, row, micro_tiles, wide_reads, padding, fa1 };
struct FwdVariant {
  const char* name;
  Fwd kind;
  const char* summary;
};
const FwdVariant kVariants[] = {
    {"fa2", Fwd::fa2,
     "FlashAttention-2 order: a block per Q tile, K/V tiles inner; O_i, m_i, l_i on chip; "
     "'+padding' plus 4 loads in flight per thread"},
    {"row", Fwd::row,
     "the first kernel (row_per_thread.cuh): one thread per query row, Br = 64, K_j and V_j "
     "tiles of Bc = 32 keys staged in shared memory by the whole block, q and o in registers"},
    {"+micro-tiles", Fwd::micro_tiles,
     "+ 8 x 4 micro-tiles of S per thread (16 threads per row, half-warp shuffles for the row "
     "max and sum), P through shared memory, Bc = 64; shared memory read 4 bytes at a time, "
     "unpadded rows, one load in flight per thread"},
    {"+16-byte-reads", Fwd::wide_reads,
     "+ Q_i, K_j and P_ij read from shared memory 16 bytes (a float4) at a time: a quarter of "
     "the instructions to read them, for the same FMAs"},
    {"+padding", Fwd::padding,
     "+ rows of Q_i, K_j (4 floats) and P_ij (16) padded: no bank conflicts"},
    {"fa1", Fwd::fa1,
     "FlashAttention-1 order: a block per head, K/V tiles outer, Q tiles inner; O_i, m_i, l_i "
     "read and written in HBM for every K/V tile"},
};
const FwdVariant& variant_named(const RunOptions& opt) {
  for (const FwdVariant& v : kVariants)
    if (opt.variant == v.name) return v;
  return kVariants[0];  // the runner resolved the name against the descriptor
}
Fwd kind_of(const RunOptions& opt) {
  return variant_named(opt).kind;
}

std::string kb(size_t bytes) {
  return std::to_string(bytes / 1024) + "." + std::to_string(bytes % 1024 * 10 / 1024) + " KB";
}

// Calls f(std::integral_constant<int, D>) for the run's head dim, one of HeadDims (the runner
// checked it against the descriptor).
template <class F>
void with_dim(int64_t d, F&& f) {
  HeadDims::dispatch(d, f);
}

size_t bwd_smem_bytes_for(int64_t d) {
  size_t bytes = 0;
  with_dim(d, [&](auto dim) { bytes = bwd_smem_bytes<decltype(dim)::value>(); });
  return bytes;
}

// The FlashAttention block-size rule (Algorithm 1, line 1), for M_sram = the shared memory one
// block may use, in floats: Bc = ceil(M_sram / 4d) so that Q_i, K_j, V_j and O_i (4 tiles of
// d columns) fit; Br = min(Bc, d).
struct Rule {
  int64_t sram_floats, bc, br;
};
Rule flash_rule(const DeviceInfo& dev, int64_t d) {
  Rule r;
  r.sram_floats = int64_t(dev.smem_per_block / sizeof(float));
  r.bc = (r.sram_floats + 4 * d - 1) / (4 * d);
  r.br = std::min(r.bc, d);
  return r;
}

// The descriptor's tiles(): this kernel's Bc is compiled (16 threads x 4 keys); Br is the
// rule's, rounded down to the thread layout's step of 16 and capped at kBrCap, unless --tile-q
// asks for another. Runs before anything is allocated.
Tiles choose_tiles(const Problem& p, const RunOptions& opt, const DeviceInfo& dev) {
  const Fwd kind = kind_of(opt);
  const bool fa1 = kind == Fwd::fa1, pad = kind != Fwd::micro_tiles && kind != Fwd::wide_reads;
  if (kind == Fwd::row) {  // compiled tiles
    if ((opt.tile_q != 0 && opt.tile_q != kRowBr) || (opt.tile_k != 0 && opt.tile_k != kRowBc))
      throw BadInput(
          "variant 'row' of step 05_shared_memory_fa2 runs Br x Bc = " + std::to_string(kRowBr) +
          " x " + std::to_string(kRowBc) + " (compiled): --tile-q " + std::to_string(kRowBr) +
          " and --tile-k " + std::to_string(kRowBc) + " only");
    return Tiles{kRowBr, kRowBc};
  }
  if (opt.tile_k != 0 && opt.tile_k != kBc)
    throw BadInput("step 05_shared_memory_fa2: --tile-k must be " + std::to_string(kBc) +
                   " (Bc is compiled into the thread layout: 16 threads x 4 keys), got " +
                   std::to_string(opt.tile_k));
  if (opt.tile_q != 0 && (opt.tile_q < kBrStep || opt.tile_q > kBrMax || opt.tile_q % kBrStep))
    throw BadInput("step 05_shared_memory_fa2: --tile-q must be a multiple of " +
                   std::to_string(kBrStep) + " in [" + std::to_string(kBrStep) + ", " +
                   std::to_string(kBrMax) + "] (2 x Br threads, " + std::to_string(kTM) +
                   " rows each), got " + std::to_string(opt.tile_q));
  if (dev.smem_per_block == 0) return Tiles{opt.tile_q, kBc};  // no device yet: flags only
  const Rule rule = flash_rule(dev, p.dim);
  int br = opt.tile_q;
  if (br == 0) {
    br = std::max(kBrStep, int(std::min<int64_t>(rule.br, kBrCap)) / kBrStep * kBrStep);
    while (br > kBrStep && fwd_smem_bytes(int(p.dim), br, fa1, pad) > dev.smem_per_block)
      br -= kBrStep;
  }
  const size_t smem = fwd_smem_bytes(int(p.dim), br, fa1, pad);
  if (smem > dev.smem_per_block)
    throw BadInput("step 05_shared_memory_fa2: Br = " + std::to_string(br) +
                   " at d = " + std::to_string(p.dim) + " needs " + kb(smem) +
                   " of shared memory per block; this device allows " + kb(dev.smem_per_block) +
                   " (use a smaller --tile-q)");
  return Tiles{br, kBc};
}

// The descriptor's tiles(): the rule above, and the backward's and the features' limits
// (exit 2). Every variant runs the one backward, whose shared memory is fixed by d. Dropout
// and block masks are built into the default variant only (the runner refuses the others,
// from their Variant flags), and the backward's Br = Bc = 64 must divide the mask block too,
// which the runner checks only against the forward's tiles.
Tiles tiles_and_features(const Problem& p, const RunOptions& opt, const DeviceInfo& dev) {
  if (p.backward && dev.smem_per_block != 0 && bwd_smem_bytes_for(p.dim) > dev.smem_per_block)
    throw BadInput("step 05_shared_memory_fa2: the backward at d = " + std::to_string(p.dim) +
                   " needs " + kb(bwd_smem_bytes_for(p.dim)) +
                   " of shared memory per block; this device allows " + kb(dev.smem_per_block));
  if (p.backward && p.sparsity.active() &&
      (p.sparsity.block_q % kBrBwd != 0 || p.sparsity.block_k % kBc != 0))
    throw BadInput("step 05_shared_memory_fa2's backward runs Br x Bc = " + std::to_string(kBrBwd) +
                   "x" + std::to_string(kBc) +
                   " tiles, which must divide the mask block (--mask-block " +
                   std::to_string(p.sparsity.block_q) + "x" + std::to_string(p.sparsity.block_k) +
                   "): use a mask block that is a multiple of them");
  return choose_tiles(p, opt, dev);
}

// Device memory beyond inputs and outputs: LSE's rounding residual (1 float per row, see
// store_lse); fa1 keeps m, l in HBM (2 floats per row); the backward adds D (1 float per row)
// and the fp32 dQ accumulator (B*H*M*d floats).
double buffer_bytes(const Problem& p, const RunOptions& opt) {
  const double rows = double(p.rows());
  return (kind_of(opt) == Fwd::fa1 ? 12.0 : 4.0) * rows +
         (p.backward ? 4.0 * rows + 4.0 * double(p.q_numel()) : 0.0);
}
// ... and a block-sparse run's block lists (what the runner checks against free memory).
double workspace_bytes(const Problem& p, const RunOptions& opt) {
  return buffer_bytes(p, opt) + block_list_bytes(p);
}

unsigned blocks_for(int64_t n, int threads) {
  return unsigned((n + threads - 1) / threads);
}

RunResult run(const Problem& p, const Inputs& in, Outputs& out, const RunOptions& opt) {
  const Fwd kind = kind_of(opt);
  const bool fa1 = kind == Fwd::fa1, pad = kind != Fwd::micro_tiles && kind != Fwd::wide_reads;
  const int br = opt.tile_q;  // the descriptor's choice (choose_tiles)
  const int64_t rows = p.rows(), d = p.dim;
  const float scale = float(p.softmax_scale());
  GpuRun<float> g(p, in, opt);
  DeviceBuffer<float> lse_lo{size_t(rows)};
  DeviceBuffer<float> m_hbm{fa1 ? size_t(rows) : 0}, l_hbm{fa1 ? size_t(rows) : 0};

  FwdParams fp{};
  g.forward_tensors(fp);
  fp.lse_lo = lse_lo.get();
  set_problem(fp, p);
  fp.Br = br, fp.scale = scale * (kFault ? 1.005f : 1.0f);  // the fault build: 0.5 % off
  // Block-sparse: the lists of kept key blocks (and, for the backward, of kept query blocks).
  const BlockMask& m = in.mask;
  DeviceBlockLists kv_lists, q_lists;
  if (!m.empty()) {
    kv_lists = DeviceBlockLists(kv_block_lists(m));
    set_block_mask(fp, kv_lists, m);
  }
  const int fwd_threads = kind == Fwd::row ? kRowBr : kTX * br / kTM;
  const size_t fwd_smem =
      kind == Fwd::row ? row_smem_bytes(int(d)) : fwd_smem_bytes(int(d), br, fa1, pad);
  const dim3 fa1_grid(unsigned(p.heads), unsigned(p.batch));

  with_dim(d, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    if (fa1)  // (launch_forward opts in to the shared memory it needs itself)
      CUDA_CHECK(cudaFuncSetAttribute(fa1_forward_kernel<D>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, int(fwd_smem)));
    g.forward([&] {
      if (fa1) {
        fa1_init_kernel<<<blocks_for(rows * d, 256), 256>>>(g.o.get(), m_hbm.get(), l_hbm.get(),
                                                            rows, int(d));
        CUDA_CHECK_LAUNCH();
        fa1_forward_kernel<D><<<fa1_grid, fwd_threads, fwd_smem>>>(fp, m_hbm.get(), l_hbm.get());
        CUDA_CHECK_LAUNCH();
        fa1_lse_kernel<<<blocks_for(rows, 256), 256>>>(m_hbm.get(), l_hbm.get(), g.lse.get(),
                                                       lse_lo.get(), rows);
        CUDA_CHECK_LAUNCH();
      } else {
        switch (kind) {
          case Fwd::row:
            launch_row_forward<D>(fp, 0);
            break;
          case Fwd::micro_tiles:
            launch_forward_as<D, false, false, false, 1, false>(fp, 0);
            break;
          case Fwd::wide_reads:
            launch_forward_as<D, false, false, false, 1>(fp, 0);
            break;
          case Fwd::padding:
            launch_forward_as<D, false, false, true, 1>(fp, 0);
            break;
          default:
            launch_forward<D>(fp, 0);  // fa2, with dropout and block masks
        }
        CUDA_CHECK_LAUNCH();
      }
    });
  });
  g.result.workspace_bytes = buffer_bytes(p, opt) + kv_lists.bytes();
  g.result.config = std::string(variant_named(opt).name) + ": Br=" + std::to_string(br) +
                    " Bc=" + std::to_string(kind == Fwd::row ? kRowBc : kBc) +
                    " threads=" + std::to_string(fwd_threads) + " smem=" + kb(fwd_smem);
  if (opt.verbose) {
    const Rule r = flash_rule(opt.device, d);
    std::cout << "  tiles: FlashAttention rule with M_sram = " << r.sram_floats
              << " floats (the shared memory one block may opt in to): Bc = ceil(M_sram / 4d) = "
              << r.bc << ", Br = min(Bc, d) = " << r.br << "; this kernel: Bc = " << kBc
              << " (compiled), Br = " << br << "\n";
  }

  if (p.backward) {
    DeviceBuffer<float> dsum{size_t(rows)}, dq_acc{size_t(p.q_numel())};
    BwdParams bp{};
    g.backward_tensors(bp);
    bp.lse_lo = lse_lo.get(), bp.dsum = dsum.get(), bp.dq_acc = dq_acc.get();
    set_problem(bp, p);
    bp.scale = scale;
    if (!m.empty()) {
      q_lists = DeviceBlockLists(q_block_lists(m));
      set_block_mask(bp, q_lists, m);
    }
    const size_t bwd_smem = bwd_smem_bytes_for(d);
    with_dim(d, [&](auto dim) {
      constexpr int D = decltype(dim)::value;
      g.backward([&] {
        launch_backward<D>(bp, 0);  // pre-pass, main kernel, dQ = scale dQ_acc
        CUDA_CHECK_LAUNCH();
      });
    });
    g.result.workspace_bytes += q_lists.bytes();
    g.result.config += "; bwd: Br=" + std::to_string(kBrBwd) + " Bc=" + std::to_string(kBc) +
                       " threads=" + std::to_string(kBwdThreads) + " smem=" + kb(bwd_smem);
  }
  return g.finish(out);
}

// The variants as the descriptor lists them: kVariants' rows, dropout and block masks in 'fa2'.
std::vector<Variant> variants() {
  std::vector<Variant> vs;
  for (const FwdVariant& v : kVariants) {
    Variant x{v.name, v.summary};
    x.dropout = x.block_sparse = v.kind == Fwd::fa2;
    vs.push_back(x);
  }
  return vs;
}

}  // namespace

const Step& step_05() {
  static const Step s =
      StepBuilder(
          5, "05_shared_memory_fa2", Device::cuda,
          "FlashAttention-2 tiling in fp32: a block per Q tile, K/V tiles in shared memory, "
          "register micro-tiles, deferred rescale, LSE; the path from one thread per row and "
          "the FA1 loop order as variants; FA2 backward")
          .adds({"a block per Q tile, K/V tiles staged in shared memory (FA2 loop order)",
                 "register micro-tiles of S and O per thread",
                 "row max and sum by warp shuffles, one division by l at the end",
                 "causal: tiles past the diagonal skipped, the mask only on straddling tiles",
                 "Br from the FlashAttention block-size rule", "FA1 loop order as a variant",
                 "FA2 backward: D pre-pass, a block per K/V tile, dQ by fp32 atomics",
                 "block-sparse masks: masked tiles skipped, K/V never loaded",
                 "dropout regenerated per element (Philox), never stored"})
          .dtypes(kDTypes)
          .head_dims(HeadDims())
          .backward()
          .dropout()  // dropout and block masks: the fa2 variant (the runner refuses the others)
          .block_sparse()
          .max_sizes(kGridLimits)
          .limits("forward Bc = " + std::to_string(kBc) +
                  " (compiled), Br from the FlashAttention rule capped at " +
                  std::to_string(kBrCap) + "; --tile-q a multiple of " + std::to_string(kBrStep) +
                  " in [" + std::to_string(kBrStep) + ", " + std::to_string(kBrMax) +
                  "], --tile-k " + std::to_string(kBc) + " only ('row': " + std::to_string(kRowBr) +
                  " x " + std::to_string(kRowBc) + " compiled); backward Br = " +
                  std::to_string(kBrBwd) + " and Bc = " + std::to_string(kBc) +
                  "; dropout and block-sparse masks in the 'fa2' variant only, mask blocks "
                  "multiples of the tiles")
          .variants(variants())
          .tiles(tiles_and_features)
          .workspace(workspace_bytes)
          .run(run);
  return s;
}

}  // namespace ladder
