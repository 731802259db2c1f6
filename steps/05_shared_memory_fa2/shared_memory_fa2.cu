// Step 05 — shared-memory FlashAttention-2 (CUDA, fp32).
// Adds: a block per Q tile, K/V tiles staged in shared memory (FA2 loop order); register
// micro-tiles of S and O per thread; row max and sum by warp shuffles, one division by l at the
// end; causal: tiles past the diagonal skipped, the mask only on straddling tiles; Br from the
// FlashAttention block-size rule; FA1 loop order as a variant; FA2 backward: D pre-pass, a block
// per K/V tile, dQ by fp32 atomics.
//
// Where it sits: step 04 gave each query row its own thread and streamed every K and V row
// from HBM (through L1/L2) for every query row. Here a block of threads shares the work of
// Br query rows, so each K/V row fetched from HBM serves Br rows: FlashAttention-2's tiling
// (Dao, 2023), in plain fp32 FMAs. In the papers' names, with Tr = ceil(M / Br) Q tiles and
// Tc = ceil(N / Bc) K/V tiles:
//   forward (fa2_forward.cuh), one block per (Q tile i, head, batch):
//     Q_i -> shared memory; m_i = -inf, l_i = 0, O_i = 0 in registers
//     for j < Tc (only the tiles some row of Q_i can see):
//       K_j, V_j -> shared memory
//       S_ij = scale Q_i K_j^T                     (8 x 4 scores per thread, from shared memory)
//       m_new = max(m_i, rowmax S_ij)              (16 threads per row: warp shuffles)
//       P_ij = exp(S_ij - m_new)                   (-> shared memory, over K_j's buffer)
//       l_i = exp(m_i - m_new) l_i + rowsum P_ij,  O_i = exp(m_i - m_new) O_i + P_ij V_j
//     O_i /= l_i,  LSE_i = m_i + log l_i           (deferred normalisation: one division)
//   fa1 variant: one block per (head, batch), j outer and i inner; O_i, m_i, l_i go to HBM and
//     back for every K/V tile (FlashAttention-1, Algorithm 1), to measure what FA2's order buys.
//   backward (fa2_backward.cuh): D_i = rowsum(dO_i o O_i); one block per (K/V tile j, K/V
//     head, batch) keeps dK_j, dV_j in registers and walks the Q tiles of every query head of
//     its group: P_ij recomputed from LSE_i, dV_j += P_ij^T dO_i, dP_ij = dO_i V_j^T,
//     dS_ij = P_ij o (dP_ij - D_i), dK_j += scale dS_ij^T Q_i, dQ_i += scale dS_ij K_j (atomics).
// Block sizes (choose_tiles below): the FlashAttention rule for an on-chip memory of M_sram
// floats, Bc = ceil(M_sram / 4d), Br = min(Bc, d), capped by what the kernel's thread layout
// compiles (Bc = 64) and by measurement (Br). notes/05_shared_memory_fa2.md works the rule
// through for the H100, and has the cost model, the pitfalls and the exercises.
// What the next step (06) fixes: fp32 FMAs reach at most ~51 TFLOP/s; tensor cores (mma.sync
// in fp16/bf16) are ~12x faster, and with them come ldmatrix, swizzled shared memory,
// cp.async pipelining and P kept in registers.
#include <algorithm>
#include <iostream>
#include <string>
#include <type_traits>

#include "cuda_util.cuh"
#include "exercise.hpp"
#include "fa2_backward.cuh"
#include "fa2_forward.cuh"
#include "step.hpp"

namespace ladder {
namespace {

using namespace fa2;

// Br cap for the forward's default (the rule gives 32, 64, 96, 112 for d = 32, 64, 96, 128 on
// an H100). Set by the lead from the H100 run (--tile-q 16..128); 64 until measured.
constexpr int kBrCap = 64;
constexpr int kHeadDims[] = {32, 64, 96, 128};

std::string kb(size_t bytes) {
  return std::to_string(bytes / 1024) + "." + std::to_string(bytes % 1024 * 10 / 1024) + " KB";
}

// Calls f(std::integral_constant<int, D>) for the run's head dim: the kernels are templates on
// D, so the micro-tile loops unroll and the O_i accumulators are registers.
template <class F>
void with_dim(int64_t d, F&& f) {
  switch (d) {
    case 32:
      return f(std::integral_constant<int, 32>());
    case 64:
      return f(std::integral_constant<int, 64>());
    case 96:
      return f(std::integral_constant<int, 96>());
    case 128:
      return f(std::integral_constant<int, 128>());
    default:
      throw BadInput("step 05_shared_memory_fa2 supports --dim 32, 64, 96, 128");
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

struct Tiles {
  int br = 0;  // forward rows per Q tile (Bc is kBc)
  int64_t rule_bc = 0, rule_br = 0, sram_floats = 0;
  size_t fwd_smem = 0, bwd_smem = 0;
};

// The FlashAttention block-size rule (Algorithm 1, line 1), for M_sram = the shared memory one
// block may use, in floats: Bc = ceil(M_sram / 4d) so that Q_i, K_j, V_j and O_i (4 tiles of
// d columns) fit; Br = min(Bc, d). This kernel's Bc is compiled (16 threads x 4 keys); Br is
// the rule's, rounded down to the thread layout's step of 16 and capped at kBrCap, unless
// --tile-q asks for another. Throws BadInput, before anything is allocated, for tiles the
// kernels cannot run.
Tiles choose_tiles(const cudaDeviceProp& prop, const Problem& p, bool fa1, const RunOptions& opt) {
  Tiles t;
  const size_t sram = prop.sharedMemPerBlockOptin;
  t.sram_floats = int64_t(sram / sizeof(float));
  t.rule_bc = (t.sram_floats + 4 * p.dim - 1) / (4 * p.dim);
  t.rule_br = std::min(t.rule_bc, p.dim);
  if (opt.tile_k != 0 && opt.tile_k != kBc)
    throw BadInput("step 05_shared_memory_fa2: --tile-k must be " + std::to_string(kBc) +
                   " (Bc is compiled into the thread layout: 16 threads x 4 keys), got " +
                   std::to_string(opt.tile_k));
  if (opt.tile_q != 0) {
    if (opt.tile_q < kBrStep || opt.tile_q > kBrMax || opt.tile_q % kBrStep != 0)
      throw BadInput("step 05_shared_memory_fa2: --tile-q must be a multiple of " +
                     std::to_string(kBrStep) + " in [" + std::to_string(kBrStep) + ", " +
                     std::to_string(kBrMax) + "] (2 x Br threads, " + std::to_string(kTM) +
                     " rows each), got " + std::to_string(opt.tile_q));
    t.br = opt.tile_q;
  } else {
    t.br = int(std::min<int64_t>(t.rule_br, kBrCap)) / kBrStep * kBrStep;
    t.br = std::max(kBrStep, t.br);
    while (t.br > kBrStep && fwd_smem_bytes(p.dim, t.br, fa1) > sram) t.br -= kBrStep;
  }
  t.fwd_smem = fwd_smem_bytes(p.dim, t.br, fa1);
  if (t.fwd_smem > sram)
    throw BadInput("step 05_shared_memory_fa2: Br = " + std::to_string(t.br) +
                   " at d = " + std::to_string(p.dim) + " needs " + kb(t.fwd_smem) +
                   " of shared memory per block; this device allows " + kb(sram) +
                   " (use a smaller --tile-q)");
  if (p.backward) {
    t.bwd_smem = bwd_smem_bytes_for(p.dim);
    if (t.bwd_smem > sram)
      throw BadInput("step 05_shared_memory_fa2: the backward at d = " + std::to_string(p.dim) +
                     " needs " + kb(t.bwd_smem) +
                     " of shared memory per block; this device "
                     "allows " +
                     kb(sram));
  }
  return t;
}

void check_shape(const Problem& p) {
  if (p.dtype != DType::f32)
    throw BadInput(std::string("step 05_shared_memory_fa2 supports --dtype fp32 only, got ") +
                   dtype_name(p.dtype));
  if (std::find(std::begin(kHeadDims), std::end(kHeadDims), p.dim) == std::end(kHeadDims))
    throw BadInput("step 05_shared_memory_fa2 supports --dim 32, 64, 96, 128, got " +
                   std::to_string(p.dim));
  constexpr int64_t kMaxGrid = 65535, kMaxSeq = int64_t(1) << 30;
  if (p.batch > kMaxGrid || p.heads > kMaxGrid)
    throw BadInput(
        "step 05_shared_memory_fa2 supports --batch and --heads up to 65535 (grid "
        "dimensions)");
  if (p.seq_q > kMaxSeq || p.seq_k > kMaxSeq)
    throw BadInput("step 05_shared_memory_fa2 supports --seq-q and --seq-k up to 2^30");
}

unsigned blocks_for(int64_t n, int threads) {
  return unsigned((n + threads - 1) / threads);
}

RunResult run(const Problem& p, const Inputs& in, Outputs& out, const RunOptions& opt) {
  const cudaDeviceProp prop = require_device();
  check_shape(p);
  const bool fa1 = opt.variant == "fa1";
  const Tiles t = choose_tiles(prop, p, fa1, opt);
  const int64_t rows = p.rows(), d = p.dim;
  const float scale = float(p.softmax_scale());

  // Workspace: LSE's rounding residual for the backward (1 float per row; store_lse); fa1
  // keeps m, l in HBM (2 floats per row); the backward adds D (1 float per row) and the fp32
  // dQ accumulator (B*H*M*d floats).
  const double fwd_ws = (fa1 ? 12.0 : 4.0) * double(rows);
  const double bwd_ws = p.backward ? 4.0 * double(rows) + 4.0 * double(p.q_numel()) : 0.0;
  const double io = 4.0 * ((p.backward ? 4.0 : 2.0) * double(p.q_numel()) +
                           (p.backward ? 4.0 : 2.0) * double(p.kv_numel()) + double(rows));
  require_free_memory(fwd_ws + bwd_ws + io + 2.0 * double(prop.l2CacheSize),
                      "step 05_shared_memory_fa2 (inputs, outputs, workspace and the L2 flush "
                      "buffer)");

  DeviceBuffer<float> Q{size_t(p.q_numel())}, K{size_t(p.kv_numel())}, V{size_t(p.kv_numel())};
  Q.upload(to_float(in.q)), K.upload(to_float(in.k)), V.upload(to_float(in.v));
  DeviceBuffer<float> O{size_t(p.q_numel())}, LSE{size_t(rows)}, LSE_lo{size_t(rows)};
  DeviceBuffer<float> m_hbm{fa1 ? size_t(rows) : 0}, l_hbm{fa1 ? size_t(rows) : 0};
  O.poison(), LSE.poison();

  FwdArgs fa{};
  fa.q = Q.get(), fa.k = K.get(), fa.v = V.get(), fa.o = O.get();
  fa.lse = LSE.get(), fa.lse_lo = LSE_lo.get();
  fa.M = int(p.seq_q), fa.N = int(p.seq_k), fa.H = int(p.heads), fa.group = int(p.group());
  fa.Br = t.br, fa.scale = scale, fa.causal = p.causal;
  const int fwd_threads = kTX * t.br / kTM;
  const dim3 fa2_grid(unsigned((p.seq_q + t.br - 1) / t.br), unsigned(p.heads), unsigned(p.batch));
  const dim3 fa1_grid(unsigned(p.heads), unsigned(p.batch));

  RunResult r;
  with_dim(d, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    if (fa1) {
      CUDA_CHECK(cudaFuncSetAttribute(fa1_forward<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      int(t.fwd_smem)));
    } else {
      CUDA_CHECK(cudaFuncSetAttribute(fa2_forward<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      int(t.fwd_smem)));
    }
    r.fwd_ms = time_gpu_ms(
        [&] {
          if (fa1) {
            fa1_init<<<blocks_for(rows * d, 256), 256>>>(O.get(), m_hbm.get(), l_hbm.get(), rows,
                                                         int(d));
            CUDA_CHECK_LAUNCH();
            fa1_forward<D><<<fa1_grid, fwd_threads, t.fwd_smem>>>(fa, m_hbm.get(), l_hbm.get());
            CUDA_CHECK_LAUNCH();
            fa1_lse<<<blocks_for(rows, 256), 256>>>(m_hbm.get(), l_hbm.get(), LSE.get(),
                                                    LSE_lo.get(), rows);
            CUDA_CHECK_LAUNCH();
          } else {
            fa2_forward<D><<<fa2_grid, fwd_threads, t.fwd_smem>>>(fa);
            CUDA_CHECK_LAUNCH();
          }
        },
        opt.repeats, opt.warmup);
  });
  to_tensor(O.download(), out.o);
  to_tensor(LSE.download(), out.lse);

  r.workspace_bytes = fwd_ws + bwd_ws;
  r.config = std::string(fa1 ? "fa1" : "fa2") + ": Br=" + std::to_string(t.br) +
             " Bc=" + std::to_string(kBc) + " threads=" + std::to_string(fwd_threads) +
             " smem=" + kb(t.fwd_smem) + " (rule: Br=" + std::to_string(t.rule_br) +
             " Bc=" + std::to_string(t.rule_bc) + ")";
  if (opt.verbose)
    std::cout << "  tiles: FlashAttention rule with M_sram = " << t.sram_floats
              << " floats (the shared memory one block may opt in to): Bc = ceil(M_sram / 4d) = "
              << t.rule_bc << ", Br = min(Bc, d) = " << t.rule_br << "; this kernel: Bc = " << kBc
              << " (compiled), Br = " << t.br
              << (opt.tile_q ? " (--tile-q)"
                             : " (rule, multiple of 16, capped at " + std::to_string(kBrCap) + ")")
              << "\n";

  if (p.backward) {
    DeviceBuffer<float> dO{size_t(p.q_numel())}, Dsum{size_t(rows)}, dQacc{size_t(p.q_numel())};
    dO.upload(to_float(in.dout));
    DeviceBuffer<float> dQ{size_t(p.q_numel())}, dK{size_t(p.kv_numel())}, dV{size_t(p.kv_numel())};
    dQ.poison(), dK.poison(), dV.poison();
    BwdArgs ba{};
    ba.q = Q.get(), ba.k = K.get(), ba.v = V.get(), ba.o = O.get(), ba.dout = dO.get();
    ba.lse = LSE.get(), ba.lse_lo = LSE_lo.get(), ba.dsum = Dsum.get(), ba.dq_acc = dQacc.get();
    ba.dk = dK.get(), ba.dv = dV.get();
    ba.M = int(p.seq_q), ba.N = int(p.seq_k), ba.H = int(p.heads), ba.group = int(p.group());
    ba.scale = scale, ba.causal = p.causal;
    const dim3 grid(unsigned((p.seq_k + kBc - 1) / kBc), unsigned(p.heads_kv), unsigned(p.batch));
    with_dim(d, [&](auto dim) {
      constexpr int D = decltype(dim)::value;
      CUDA_CHECK(cudaFuncSetAttribute(fa2_backward<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      int(t.bwd_smem)));
      r.bwd_ms = time_gpu_ms(
          [&] {
            bwd_prepass<<<blocks_for(rows, 256), 256>>>(dO.get(), O.get(), Dsum.get(), dQacc.get(),
                                                        rows, int(d));
            CUDA_CHECK_LAUNCH();
            fa2_backward<D><<<grid, kBwdThreads, t.bwd_smem>>>(ba);
            CUDA_CHECK_LAUNCH();
            bwd_dq<<<blocks_for(p.q_numel(), 256), 256>>>(dQacc.get(), dQ.get(), p.q_numel(),
                                                          scale);
            CUDA_CHECK_LAUNCH();
          },
          opt.repeats, opt.warmup);
    });
    to_tensor(dQ.download(), out.dq);
    to_tensor(dK.download(), out.dk);
    to_tensor(dV.download(), out.dv);
    r.config += "; bwd: Br=" + std::to_string(kBrBwd) + " Bc=" + std::to_string(kBc) +
                " threads=" + std::to_string(kBwdThreads) + " smem=" + kb(t.bwd_smem);
  }
  return r;
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
    s.caps.limits = "forward Bc = 64 (compiled), Br from the FlashAttention rule capped at " +
                    std::to_string(kBrCap) +
                    "; --tile-q a multiple of 16 in [16, 128], --tile-k 64 only; "
                    "backward Br = Bc = 64; --batch, --heads <= 65535";
    s.variants = {{"fa2",
                   "FlashAttention-2 order: a block per Q tile, K/V tiles inner; O_i, m_i, l_i on "
                   "chip"},
                  {"fa1",
                   "FlashAttention-1 order: a block per head, K/V tiles outer, Q tiles inner; O_i, "
                   "m_i, l_i read and written in HBM for every K/V tile"}};
    s.run = run;
    return s;
  }();
  return s;
}

}  // namespace ladder
