// Step 05's host side: the descriptor (what it supports), the tile choice (the FlashAttention
// block-size rule) and the launches. The algorithm is shared_memory_fa2.cuh (forward) and
// shared_memory_fa2_backward.cuh (backward).
#include <algorithm>
#include <iostream>
#include <string>
#include <type_traits>

#include "error.hpp"
#include "gpu_run.cuh"
#include "shared_memory_fa2_backward.cuh"
#include "steps.hpp"

namespace ladder {
namespace {

using namespace step05;

// Br cap for the forward's default (the rule gives 32, 64, 96, 112 for d = 32, 64, 96, 128 on
// an H100). The H100 sweep (notes/05) measured Br = 64 and 128 equal at d = 64 and 128, and
// 48, 96 slower: 64 keeps the rule's value at d = 64 with half the block of 128.
constexpr int kBrCap = 64;

std::string kb(size_t bytes) {
  return std::to_string(bytes / 1024) + "." + std::to_string(bytes % 1024 * 10 / 1024) + " KB";
}

// Calls f(std::integral_constant<int, D>) for the run's head dim (one of the descriptor's):
// the kernels are templates on D, so the micro-tile loops unroll and O_i lives in registers.
template <class F>
void with_dim(int64_t d, F&& f) {
  switch (d) {
    case 32:
      return f(std::integral_constant<int, 32>());
    case 64:
      return f(std::integral_constant<int, 64>());
    case 96:
      return f(std::integral_constant<int, 96>());
    default:
      return f(std::integral_constant<int, 128>());
  }
}

size_t fwd_smem_bytes(int64_t d, int br, bool fa1) {
  const int64_t ld = d + 4, ldp = kBc + 16;
  const int64_t floats = fa1 ? std::max(br * ld, br * ldp) + kBc * ld + kBc * d   // [Q|P][K][V]
                             : br * ld + std::max(kBc * ld, br * ldp) + kBc * d;  // [Q][K|P][V]
  return size_t(floats) * sizeof(float);
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
  const bool fa1 = opt.variant == "fa1";
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
    while (br > kBrStep && fwd_smem_bytes(p.dim, br, fa1) > dev.smem_per_block) br -= kBrStep;
  }
  const size_t smem = fwd_smem_bytes(p.dim, br, fa1);
  if (smem > dev.smem_per_block)
    throw BadInput("step 05_shared_memory_fa2: Br = " + std::to_string(br) +
                   " at d = " + std::to_string(p.dim) + " needs " + kb(smem) +
                   " of shared memory per block; this device allows " + kb(dev.smem_per_block) +
                   " (use a smaller --tile-q)");
  if (p.backward && bwd_smem_bytes_for(p.dim) > dev.smem_per_block)
    throw BadInput("step 05_shared_memory_fa2: the backward at d = " + std::to_string(p.dim) +
                   " needs " + kb(bwd_smem_bytes_for(p.dim)) +
                   " of shared memory per block; this device allows " + kb(dev.smem_per_block));
  return Tiles{br, kBc};
}

// Device memory beyond inputs and outputs: LSE's rounding residual (1 float per row, see
// store_lse); fa1 keeps m, l in HBM (2 floats per row); the backward adds D (1 float per row)
// and the fp32 dQ accumulator (B*H*M*d floats).
double workspace_bytes(const Problem& p, const RunOptions& opt) {
  const double rows = double(p.rows());
  return (opt.variant == "fa1" ? 12.0 : 4.0) * rows +
         (p.backward ? 4.0 * rows + 4.0 * double(p.q_numel()) : 0.0);
}

unsigned blocks_for(int64_t n, int threads) {
  return unsigned((n + threads - 1) / threads);
}

RunResult run(const Problem& p, const Inputs& in, Outputs& out, const RunOptions& opt) {
  const bool fa1 = opt.variant == "fa1";
  const int br = opt.tile_q;  // the descriptor's choice (choose_tiles)
  const int64_t rows = p.rows(), d = p.dim;
  const float scale = float(p.softmax_scale());
  GpuRun<float> g(p, in, opt);
  DeviceBuffer<float> lse_lo{size_t(rows)};
  DeviceBuffer<float> m_hbm{fa1 ? size_t(rows) : 0}, l_hbm{fa1 ? size_t(rows) : 0};

  FwdParams fp{};
  fp.q = g.q.get(), fp.k = g.k.get(), fp.v = g.v.get(), fp.o = g.o.get();
  fp.lse = g.lse.get(), fp.lse_lo = lse_lo.get();
  fp.batch = int(p.batch), fp.heads = int(p.heads), fp.heads_kv = int(p.heads_kv);
  fp.group = int(p.group()), fp.seq_q = int(p.seq_q), fp.seq_k = int(p.seq_k);
  fp.Br = br, fp.scale = scale, fp.causal = p.causal;
  const int fwd_threads = kTX * br / kTM;
  const size_t fwd_smem = fwd_smem_bytes(d, br, fa1);
  const dim3 fa2_grid(unsigned((p.seq_q + br - 1) / br), unsigned(p.heads), unsigned(p.batch));
  const dim3 fa1_grid(unsigned(p.heads), unsigned(p.batch));

  with_dim(d, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    const void* kernel = fa1 ? reinterpret_cast<const void*>(fa1_forward_kernel<D>)
                             : reinterpret_cast<const void*>(forward_kernel<D>);
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(fwd_smem)));
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
        forward_kernel<D><<<fa2_grid, fwd_threads, fwd_smem>>>(fp);
        CUDA_CHECK_LAUNCH();
      }
    });
  });
  g.result.workspace_bytes = workspace_bytes(p, opt);
  g.result.config = std::string(fa1 ? "fa1" : "fa2") + ": Br=" + std::to_string(br) +
                    " Bc=" + std::to_string(kBc) + " threads=" + std::to_string(fwd_threads) +
                    " smem=" + kb(fwd_smem);
  if (opt.verbose) {
    DeviceInfo dev = require_device();
    const Rule r = flash_rule(dev, d);
    std::cout << "  tiles: FlashAttention rule with M_sram = " << r.sram_floats
              << " floats (the shared memory one block may opt in to): Bc = ceil(M_sram / 4d) = "
              << r.bc << ", Br = min(Bc, d) = " << r.br << "; this kernel: Bc = " << kBc
              << " (compiled), Br = " << br << "\n";
  }

  if (p.backward) {
    DeviceBuffer<float> dsum{size_t(rows)}, dq_acc{size_t(p.q_numel())};
    BwdParams bp{};
    bp.q = g.q.get(), bp.k = g.k.get(), bp.v = g.v.get(), bp.o = g.o.get(), bp.dout = g.dout.get();
    bp.lse = g.lse.get(), bp.lse_lo = lse_lo.get(), bp.dsum = dsum.get(), bp.dq_acc = dq_acc.get();
    bp.dk = g.dk.get(), bp.dv = g.dv.get();
    bp.batch = int(p.batch), bp.heads = int(p.heads), bp.heads_kv = int(p.heads_kv);
    bp.group = int(p.group()), bp.seq_q = int(p.seq_q), bp.seq_k = int(p.seq_k);
    bp.scale = scale, bp.causal = p.causal;
    const dim3 grid(unsigned((p.seq_k + kBc - 1) / kBc), unsigned(p.heads_kv), unsigned(p.batch));
    const size_t bwd_smem = bwd_smem_bytes_for(d);
    with_dim(d, [&](auto dim) {
      constexpr int D = decltype(dim)::value;
      CUDA_CHECK(cudaFuncSetAttribute(backward_kernel<D>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, int(bwd_smem)));
      g.backward([&] {
        backward_prepass_kernel<<<blocks_for(rows, 256), 256>>>(g.dout.get(), g.o.get(), dsum.get(),
                                                                dq_acc.get(), rows, int(d));
        CUDA_CHECK_LAUNCH();
        backward_kernel<D><<<grid, kBwdThreads, bwd_smem>>>(bp);
        CUDA_CHECK_LAUNCH();
        backward_dq_kernel<<<blocks_for(p.q_numel(), 256), 256>>>(dq_acc.get(), g.dq.get(),
                                                                  p.q_numel(), scale);
        CUDA_CHECK_LAUNCH();
      });
    });
    g.result.config += "; bwd: Br=" + std::to_string(kBrBwd) + " Bc=" + std::to_string(kBc) +
                       " threads=" + std::to_string(kBwdThreads) + " smem=" + kb(bwd_smem);
  }
  return g.finish(out);
}

}  // namespace

const Step& step_05() {
  static const Step s = [] {
    Step s;
    s.number = 5;
    s.name = "05_shared_memory_fa2";
    s.summary =
        "FlashAttention-2 tiling in fp32: a block per Q tile, K/V tiles in shared memory, "
        "register micro-tiles, deferred rescale, LSE; FA1 loop order as a variant; FA2 backward";
    s.adds = {"a block per Q tile, K/V tiles staged in shared memory (FA2 loop order)",
              "register micro-tiles of S and O per thread",
              "row max and sum by warp shuffles, one division by l at the end",
              "causal: tiles past the diagonal skipped, the mask only on straddling tiles",
              "Br from the FlashAttention block-size rule",
              "FA1 loop order as a variant",
              "FA2 backward: D pre-pass, a block per K/V tile, dQ by fp32 atomics"};
    s.device = Device::cuda;
    s.caps.dtypes = {DType::f32};
    s.caps.head_dims = {32, 64, 96, 128};
    s.caps.causal = true, s.caps.gqa = true, s.caps.backward = true;
    s.caps.max_batch = s.caps.max_heads = 65535;  // grid.z and grid.y
    s.caps.max_seq = int64_t(1) << 30;            // 32-bit row indices
    s.caps.limits = "forward Bc = 64 (compiled), Br from the FlashAttention rule capped at " +
                    std::to_string(kBrCap) +
                    "; --tile-q a multiple of 16 in [16, 128], --tile-k 64 only; backward Br = Bc "
                    "= 64";
    s.variants = {{"fa2",
                   "FlashAttention-2 order: a block per Q tile, K/V tiles inner; O_i, m_i, l_i on "
                   "chip"},
                  {"fa1",
                   "FlashAttention-1 order: a block per head, K/V tiles outer, Q tiles inner; O_i, "
                   "m_i, l_i read and written in HBM for every K/V tile"}};
    s.tiles = choose_tiles;
    s.workspace = workspace_bytes;
    s.run = run;
    return s;
  }();
  return s;
}

}  // namespace ladder
