// Step 07 — FlashAttention's backward pass on Hopper: TMA, wgmma, a producer warpgroup, dQ
// accumulated by TMA reduce-add (or vector atomics). sm_90a, bf16/fp16, head dims 64 and 128.
//
// SPDX-License-Identifier: MIT (LICENSE). Follows the published structure of
// FlashAttention-2 (T. Dao, 2023, arXiv:2307.08691, Algorithm 2) on the machinery of
// FlashAttention-3 (Shah, Bikshandi, Zhang, Thakkar, Ramani, Dao, 2024, arXiv:2407.08608).
//
// The algorithm is step 06's backward in three kernels:
//
//   pre-pass  D_i = rowsum(dO_i o O_i) (fp32); L_i = LSE_i log2(e), +inf where LSE_i = -inf;
//             zero the fp32 dQ accumulator (and the main kernel's work counter)
//   main      per unit (K/V tile j of Bc = 128 keys, K/V head, batch): K_j, V_j arrive once;
//             then for every query head of the GQA group and every Q tile i that sees K_j
//             (an "item"): recompute P from the saved L, form dS, accumulate dK_j, dV_j in
//             registers and add dS K_j to the fp32 dQ_i of the other units' tiles. Persistent:
//             one CTA per SM takes units from a work counter (tile_scheduler.cuh)
//   post-pass dQ = scale dQ_acc, rounded to T
//
// What changes from step 06 is the machinery (the forward's): a producer warpgroup streams Q_i
// (+ L_i) and dO_i (+ D_i) into a 2-stage ring and adds each item's dQ tile to global memory
// with TMA reduce-add (the atomic variant: red.global.add.v4.f32 from registers, step 06's
// path); two consumer warpgroups (setmaxnreg 24 / 240), warpgroup w owning keys 64w .. 64w+63
// of the tile, keep their dK, dV (fp32) in registers for the whole unit; every product is a
// wgmma.
//
// Which products are transposed, and why. A warpgroup owns 64 KEY rows, so it computes the
// transposed products S^T = K_w Q_i^T and dP^T = V_w dO_i^T (M = 64 keys, N = Br queries, both
// operands K-major as stored). Their accumulators then hold P^T and dS^T with this warpgroup's
// keys as rows: exactly the A-fragment layout of dV_w += P^T dO_i and dK_w += dS^T Q_i, so those
// two products take A from registers (the forward's P trick) and B = dO_i, Q_i read N-major
// (the transpose bit, like V in the forward). Only dQ_i = dS K_j needs every key of the tile: each
// warpgroup writes its dS^T to shared memory ([key][query], 128-byte swizzle, conflict-free
// stmatrix) and, after one named barrier of both warpgroups, reads dS back as an MN-major A
// operand (the A transpose bit) against K_j read N-major.
//
//   d = 128: Br = 64 queries per item. Per thread: dK, dV 64 + 64 fp32, S^T and dP^T 32 + 32;
//            the dQ product is split by columns (warpgroup w: columns 64w .., all 64 rows).
//   d = 64:  Br = 128. dK, dV 32 + 32, S^T and dP^T 64 + 64; dQ split by rows (warpgroup w:
//            queries 64w .., all 64 columns). Either way every wgmma of dQ is 64 x 64 x 16.
//
// The consumers' schedule per item is at their loop (bwd_consumer.cuh). Dropout and
// block-sparse masks live in a separate instantiation (kExtras), as in the forward.
#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes through the runtime
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>

#include "bwd_consumer.cuh"
#include "bwd_producer.cuh"
#include "tensor_map.hpp"
#include "wgmma_tma_fa3.hpp"

namespace ladder::fa3 {
namespace {

// ---- the main kernel ---------------------------------------------------------------------------
template <class T, int D, bool kDqTma, bool kExtras>
__global__ void __launch_bounds__(kThreads, 1)
    fa3_bwd_kernel(const __grid_constant__ CUtensorMap tm_q,
                   const __grid_constant__ CUtensorMap tm_k,
                   const __grid_constant__ CUtensorMap tm_v,
                   const __grid_constant__ CUtensorMap tm_do,
                   const __grid_constant__ CUtensorMap tm_dq, const KParams p) {
  extern __shared__ unsigned char smem_raw[];
  const Ctx c = unit_ctx(p, int(blockIdx.x), align_1024(smem_raw));  // the CTA's first unit

  if (threadIdx.x == 0) {
    kv_ring().init(1, 2 * 4);  // the producer's arrive.expect_tx; one arrive per consumer warp
#pragma unroll
    for (int st = 0; st < kStages; ++st) {  // Q's and dO's rings
      mbar_init(&g_bars.full_q[st], 1);     // the producer's arrive.expect_tx, then the bytes
      mbar_init(&g_bars.full_do[st], 1);
      mbar_init(&g_bars.empty[st], 2 * 4);  // one arrive per consumer warp
    }
#pragma unroll
    for (int w = 0; w < 2; ++w) dq_ring(w).init(kWGThreads, 1);  // every thread that staged dQ
    mbarrier_init_fence();
    // Whether the CTA's first unit has an item (only a block mask can leave one without, and then
    // the CTA owns that one unit), known to every role at the barrier below: a role that learned
    // it from a barrier phase instead could look too late, after the phase had come round again.
    BwdWalk<KParams, kExtras, Cfg<D>::kBr> walk{g_walk};
    walk.start(p, int(blockIdx.x));
    g_has_items = walk.valid(p) ? 1 : 0;
  }
  __syncthreads();

  // Roles: warpgroup 0 produces (warp 0 loads, warp 1 writes dQ), 1 and 2 consume; each role
  // is one branch with its setmaxnreg first, executed by whole warpgroups.
  const int wg = threadIdx.x / kWGThreads;
  // EXERCISE BEGIN producer-split-bwd [easy]
  // Concept: the backward's split: the producer warpgroup has two single-thread jobs (the
  // loads, and the dQ writes when dQ goes out by TMA), and two consumer warpgroups.
  //
  // As producer-split in wgmma_tma_fa3.cu, with kConsumerRegs for the consumers: warp 0 of
  // warpgroup 0 runs producer(), warp 1 runs dq_writer() when kDqTma, each from one elected
  // lane; warpgroup wg > 0 runs consumer() as consumer wg - 1.
  if (wg == 0) {
    setmaxnreg_dec<kProducerRegs>();
    const int warp = threadIdx.x / 32;
    if (warp == 0) {
      if (elect_one()) producer<D, kExtras>(c.smem, &tm_q, &tm_k, &tm_v, &tm_do, p);
    } else if (kDqTma && warp == 1) {
      if (elect_one()) dq_writer<D>(c.smem, &tm_dq, p);
    }
  } else {
    setmaxnreg_inc<kConsumerRegs>();
    consumer<T, D, kDqTma, kExtras>(c, wg - 1, p);
  }
  // EXERCISE END
}

// ---- pre-pass and post-pass ----------------------------------------------------------------

constexpr int kPrepassThreads = 256, kPrepassRows = kPrepassThreads / 8;  // 8 lanes per row

// Rows of the padded [B H, m_pad] workspace: D_i = rowsum(dO_i o O_i) (8 lanes per row, 16-byte
// chunks, three xor-shuffles; O and dO in their own strides), L_i = LSE_i log2(e) with -inf ->
// +inf; the padding rows past seq_q get D = 0, L = +inf (so P = 0 there). Then a grid-stride
// zeroing of dQ_acc, and of the main kernel's work counter (if any: whatever an earlier launch
// that did not finish left there, this one starts from zero).
template <class T, int D>
__global__ void __launch_bounds__(kPrepassThreads)
    bwd_prepass_kernel(const T* o, const T* dout, Strides os, Strides ds, const float* lse,
                       float* lse2, float* dsum, float* dq_acc, unsigned int* counter, int heads,
                       int bh_count, int M, int m_pad) {
  const int sub = threadIdx.x & 7;
  const int64_t rows = int64_t(bh_count) * m_pad;
  const int64_t row = int64_t(blockIdx.x) * kPrepassRows + threadIdx.x / 8;
  const int64_t bh = row / m_pad;
  const int i = int(row % m_pad);
  const bool real = row < rows && i < M;
  float acc = 0.f;
  if (real) {
    const int64_t b = bh / heads, h = bh - b * heads;
    const T* orow = o + b * os.batch + h * os.head + i * os.row;
    const T* drow = dout + b * ds.batch + h * ds.head + i * ds.row;
    for (int ch = sub; ch < D / 8; ch += 8) {
      const uint4 a = *reinterpret_cast<const uint4*>(orow + ch * 8);
      const uint4 b = *reinterpret_cast<const uint4*>(drow + ch * 8);
      const uint32_t as[4] = {a.x, a.y, a.z, a.w}, bs[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 x = unpack2<T>(as[e]), y = unpack2<T>(bs[e]);
        acc = fmaf(x.x, y.x, acc);
        acc = fmaf(x.y, y.y, acc);
      }
    }
  }
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  acc += __shfl_xor_sync(0xffffffffu, acc, 2);
  acc += __shfl_xor_sync(0xffffffffu, acc, 4);
  if (sub == 0 && row < rows) {
    dsum[row] = acc;
    const float l = real ? lse[size_t(bh) * M + i] : -INFINITY;
    lse2[row] = l == -INFINITY ? INFINITY : l * kLog2e;
  }
  if (counter && blockIdx.x == 0 && threadIdx.x == 0) *counter = 0u;
  const int64_t n4 = int64_t(bh_count) * M * D / 4;
  for (int64_t k = int64_t(blockIdx.x) * kPrepassThreads + threadIdx.x; k < n4;
       k += int64_t(gridDim.x) * kPrepassThreads)
    reinterpret_cast<float4*>(dq_acc)[k] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// dQ = s dQ_acc in T (s = scale, or -scale for a caller who negated Q), 4 elements a step.
template <class T>
__global__ void __launch_bounds__(256)
    bwd_postpass_kernel(const float* dq_acc, T* dq, int64_t n4, float s) {
  for (int64_t k = int64_t(blockIdx.x) * 256 + threadIdx.x; k < n4; k += int64_t(gridDim.x) * 256) {
    const float4 a = reinterpret_cast<const float4*>(dq_acc)[k];
    reinterpret_cast<uint2*>(dq)[k] =
        make_uint2(pack2<T>(s * a.x, s * a.y), pack2<T>(s * a.z, s * a.w));
  }
}

// ---- host side ---------------------------------------------------------------------------------

int rows_padded(int seq_q) {
  return (seq_q + kBwdRowPad - 1) / kBwdRowPad * kBwdRowPad;
}

KParams kernel_params(const BwdPlan& plan, unsigned int* counter) {
  const BwdParams& f = plan.params;
  const int br = plan.br;
  KParams k{};
  k.lse2 = f.lse2, k.dsum = f.dsum, k.dq_acc = f.dq_acc, k.dk = f.dk, k.dv = f.dv;
  k.heads = f.heads, k.heads_kv = f.heads_kv, k.group = f.heads / f.heads_kv;
  k.seq_q = f.seq_q, k.seq_k = f.seq_k;
  k.m_pad = rows_padded(f.seq_q);
  k.n_kt = (f.seq_k + kBc - 1) / kBc;
  k.units = plan.units;
  k.counter = counter;
  k.score = score_params(f.scale, f.causal, f.dropout_p, f.dropout_seed);
  k.q_count = f.q_count, k.q_index = f.q_index;
  if (f.q_count) {
    k.mask_nI = (f.seq_q + f.block_m - 1) / f.block_m;
    k.mask_nJ = (f.seq_k + f.block_n - 1) / f.block_n;
    k.bm_tiles = f.block_m / br;
    k.bn_tiles = f.block_n / kBc;
    k.mask_batch = f.mask_batch, k.mask_heads = f.mask_heads;
  } else {
    k.bm_tiles = k.bn_tiles = k.mask_batch = k.mask_heads = 1;
  }
  return k;
}

// Pre-pass, main kernel and post-pass of one instantiation, each launch checked.
template <class T, int D, bool kDqTma, bool kExtras>
void launch_as(const BwdPlan& plan, cudaStream_t stream) {
  const BwdParams& f = plan.params;
  const int bh = f.batch * f.heads, m_pad = rows_padded(f.seq_q);
  const int64_t rows = int64_t(bh) * m_pad;
  // The persistent grid's work counter (tile_scheduler.cuh), zeroed by the pre-pass.
  unsigned int* counter = plan.persistent() ? f.tile_counter : nullptr;
  bwd_prepass_kernel<T, D>
      <<<unsigned((rows + kPrepassRows - 1) / kPrepassRows), kPrepassThreads, 0, stream>>>(
          static_cast<const T*>(f.o), static_cast<const T*>(f.dout),
          resolved(f.o_strides, f.heads, f.seq_q, f.dim),
          resolved(f.dout_strides, f.heads, f.seq_q, f.dim), f.lse, f.lse2, f.dsum, f.dq_acc,
          counter, f.heads, bh, f.seq_q, m_pad);
  CUDA_CHECK_LAUNCH();
  CUtensorMap maps[5];
  std::memcpy(maps, plan.tensor_maps, sizeof(maps));
  fa3_bwd_kernel<T, D, kDqTma, kExtras><<<plan.grid, plan.block, plan.smem_bytes, stream>>>(
      maps[0], maps[1], maps[2], maps[3], maps[4], kernel_params(plan, counter));
  CUDA_CHECK_LAUNCH();
  const int64_t n4 = int64_t(f.batch) * f.heads * f.seq_q * D / 4;
  const int64_t blocks = (n4 + 255) / 256;
  bwd_postpass_kernel<T><<<unsigned(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(
      f.dq_acc, static_cast<T*>(f.dq), n4, f.negate_dq ? -f.scale : f.scale);
  CUDA_CHECK_LAUNCH();
}

// One instantiation, as make_bwd_plan sees it.
struct Entry {
  const void* fn;
  void (*launch)(const BwdPlan&, cudaStream_t);
  int smem, br;
};
template <class T, int D, bool kDqTma, bool kExtras>
Entry entry() {
  return {reinterpret_cast<const void*>(&fa3_bwd_kernel<T, D, kDqTma, kExtras>),
          &launch_as<T, D, kDqTma, kExtras>, Cfg<D>::kDynamic, Cfg<D>::kBr};
}

}  // namespace

const char* bwd_variant_name(BwdVariant v) {
  return v == BwdVariant::atomic ? "atomic" : "tma-reduce";
}

BwdWorkspace bwd_workspace(const BwdParams& p) {
  BwdWorkspace w;
  const size_t bh = size_t(p.batch) * size_t(p.heads);
  w.rows_padded = rows_padded(p.seq_q);
  w.dq_acc_bytes = bh * size_t(p.seq_q) * size_t(p.dim) * sizeof(float);
  w.lse2_bytes = w.dsum_bytes = bh * size_t(w.rows_padded) * sizeof(float);
  return w;
}

BwdPlan make_bwd_plan(const BwdParams& f, BwdVariant v) {
  const char* who = "step 07 backward";
  const bool sparse = f.q_count != nullptr;
  check_params(f, who, {f.q, f.k, f.v, f.o, f.dout, f.dq, f.dk, f.dv, f.dq_acc, f.lse2, f.dsum},
               sparse);
  require(strides_ok(f.dout_strides), who, "every stride of dO must be a multiple of 8 elements");
  require(!sparse || f.q_index != nullptr, who, "q_count without q_index");
  require(f.max_ctas >= 0, who, "max_ctas must be >= 0 (0: as many CTAs as fit at once)");
  require_sm90(who);

  BwdPlan plan{};
  plan.params = f;
  plan.variant = v;
  const bool extras = sparse || f.dropout_p > 0.f;
  // The instantiation: (dtype, head dim, dQ variant, dropout and block-sparse compiled in).
  const Entry e = with_type_and_dim(f.bf16, f.dim, [&](auto t, auto d) {
    using T = decltype(t);
    constexpr int D = decltype(d)::value;
    const bool tma = v == BwdVariant::tma_reduce;
    if (extras) return tma ? entry<T, D, true, true>() : entry<T, D, false, true>();
    return tma ? entry<T, D, true, false>() : entry<T, D, false, false>();
  });
  plan.launcher = e.launch;
  const long long units = (long long)((f.seq_k + kBc - 1) / kBc) * f.heads_kv * f.batch;
  require(units <= INT_MAX / 2, who, "too many K/V tiles (key tiles x K/V heads x batch)");
  plan.units = int(units);
  plan.block = dim3(unsigned(kThreads));
  plan.smem_bytes = e.smem;
  plan.br = e.br, plan.bc = kBc, plan.stages = kStages;
  encode_4d(plan.tensor_maps[0], f, f.q, f.heads, f.seq_q, f.q_strides, e.br);
  encode_4d(plan.tensor_maps[1], f, f.k, f.heads_kv, f.seq_k, f.k_strides, kBc);
  encode_4d(plan.tensor_maps[2], f, f.v, f.heads_kv, f.seq_k, f.v_strides, kBc);
  encode_4d(plan.tensor_maps[3], f, f.dout, f.heads, f.seq_q, f.dout_strides, e.br);
  encode_dq_acc(plan.tensor_maps[4], f.dq_acc, f.dim, f.seq_q, f.batch * f.heads);
  plan.regs = set_smem_limit(e.fn, e.smem);
  // The grid (tile_scheduler.cuh): persistent, as many CTAs as fit at once, each taking units
  // from the work counter as it finishes one; without a counter, or with a block mask (which can
  // leave a unit without items), one CTA per unit.
  plan.grid = dim3(unsigned(units));
  if (f.tile_counter && !sparse) {
    int dev = 0, sms = 0, per_sm = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, e.fn, kThreads, e.smem));
    require(per_sm >= 1, who, "the backward kernel does not fit on an SM");
    long long ctas = std::min<long long>(units, (long long)sms * per_sm);
    if (f.max_ctas > 0) ctas = std::min<long long>(ctas, f.max_ctas);
    plan.grid = dim3(unsigned(ctas));
  }
  return plan;
}

void launch_bwd(const BwdPlan& plan, cudaStream_t stream) {
  if (!plan.launcher) throw std::invalid_argument("step 07 backward: launch of an empty plan");
  // A persistent plan's CTAs take units from the counter: without it, units past the grid's
  // would get no dK, dV at all (a caller who swapped the plan's parameters).
  if (plan.persistent() && !plan.params.tile_counter)
    throw std::invalid_argument(
        "step 07 backward: a persistent plan launched without tile_counter");
  plan.launcher(plan, stream);
}

std::string describe(const BwdPlan& plan) {
  std::ostringstream s;
  s << "bwd " << bwd_variant_name(plan.variant) << " " << (plan.params.bf16 ? "bf16" : "fp16")
    << " d=" << plan.params.dim << " Bc=" << plan.bc << " Br=" << plan.br
    << " threads=" << plan.block.x << " (producer + 2 consumer warpgroups) smem=" << plan.smem_bytes
    << " regs=" << plan.regs << " setmaxnreg=" << kProducerRegs << "/" << kConsumerRegs
    << " stages=" << plan.stages << " units=" << plan.units << " grid=" << plan.grid.x;
  if (plan.persistent()) s << " (persistent)";
  if (plan.params.q_count || plan.params.dropout_p > 0.f) s << " extras=dropout+block-sparse";
  return s.str();
}

}  // namespace ladder::fa3
