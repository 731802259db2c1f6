// SPDX-License-Identifier: MIT (LICENSE). Follows the published structure of
// FlashAttention-2 (T. Dao, 2023, arXiv:2307.08691, Algorithm 2).
// The backward pass of step 06: FlashAttention-2's backward (Dao 2023, Algorithm 2) on
// mma.sync tensor cores, in three kernels.
//
//   pre-pass  D_i = rowsum(dO_i o O_i) in fp32 (O is the forward's output, in T);
//             L_i = LSE_i * log2(e), +inf where LSE_i = -inf; zeroes the fp32 dQ accumulator
//   main      one block per (K/V tile j, K/V head, batch): Bc = 128 keys, 8 warps, warp w
//             owns keys 16w..16w+15 of K_j, V_j and their dK_j, dV_j (fp32 registers).
//             For every query head of the GQA group, for every Q tile i that sees K_j:
//               S^T  = K_j Q_i^T                      [Bc x Br], a warp's 16 rows in registers
//               P^T  from S^T and L_i                 (recomputed: only LSE was saved, not P)
//               dP^T = V_j dO_i^T
//               dS^T = P^T o (dP^T - D_i)
//               dV_j += P^T dO_i,  dK_j += dS^T Q_i   (A operands straight from registers)
//               dQ_i += dS_ij K_j                     (dS^T via shared memory; fp32 atomics)
//             then dK_j = scale * dK_j; both through shared memory to 16-byte stores
//   post-pass dQ = scale * dQ_acc, rounded to T
//
// Why S^T and not S: a warp that owns key rows of dK_j, dV_j needs P^T and dS^T as the A
// operand of dV_j += P^T dO_i and dK_j += dS^T Q_i. Computing the transposed products
// directly puts P^T and dS^T in the C layout of the warp's own rows, which is the A layout
// (the forward's "P from the S registers" trick), so neither goes through shared memory for
// those two products. Only dQ_i = dS K_j needs all warps' dS^T: it is written to shared memory
// once and read back with ldmatrix.trans as the A operand dS.
//
// Q_i, dO_i, L_i, D_i arrive by cp.async in two stages (item x + 1 loads during item x), and
// dS^T has two buffers, so that the dQ product of item x runs after the barrier that opens
// item x + 1: one barrier per Q tile.
//
// Block-sparse masks and dropout, template flags of the main kernel as in the forward:
//   kSparse:  the block walks, for each query head of the group, the host's list of kept query
//             blocks of its key block (q_block_lists): a masked Q tile is never loaded.
//   kDropout: Z is regenerated per 16 x 16 block of S^T (below, at the dS^T loop), then
//             dV_j += (P o Z)^T dO_i (1 / (1 - p) applied to dV_j once, at the end),
//             dP = (dO_i V_j^T) o Z / (1 - p), dS = P o (dP - D) with the undropped P; D is the
//             pre-pass's rowsum(dO o O) as before (O already holds the dropout).
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "backward_steps.cuh"
#include "dropout.hpp"
#include "exercise.hpp"
#include "masks.cuh"
#include "mma.cuh"
#include "params.cuh"
#include "tensor_core_fa2.cuh"  // the forward: including this file gives a caller both passes
#include "tiles.cuh"

namespace ladder::step06 {

// ---- pre-pass: D = rowsum(dO o O), L = LSE log2(e), dQ_acc = 0 ----

constexpr int kPrepassThreads = 256, kPrepassRows = kPrepassThreads / 8;  // 8 lanes per row

// Eight lanes per row, each summing 8-element (16-byte) chunks c, c + 8, ... of dO and O in
// fp32, then three xor-shuffles within the 8. Memory-bound: it reads O and dO once.
template <class T>
__global__ void __launch_bounds__(kPrepassThreads) backward_prepass_kernel(const BwdArgs p, int d) {
  const int64_t rows = int64_t(p.batch) * p.heads * p.seq_q;
  const int sub = threadIdx.x & 7;
  const int64_t row0 = int64_t(blockIdx.x) * kPrepassRows, row = row0 + threadIdx.x / 8;
  float acc = 0.f;
  if (row < rows) {
    const T* o = static_cast<const T*>(p.o) + row * d;
    const T* g = static_cast<const T*>(p.dout) + row * d;
    for (int c = sub * 8; c < d; c += 64) {
      const uint4 x = *reinterpret_cast<const uint4*>(o + c);
      const uint4 y = *reinterpret_cast<const uint4*>(g + c);
      const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 a = unpack2<T>(xs[e]), b = unpack2<T>(ys[e]);
        acc = fmaf(a.x, b.x, acc);
        acc = fmaf(a.y, b.y, acc);
      }
    }
  }
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  acc += __shfl_xor_sync(0xffffffffu, acc, 2);
  acc += __shfl_xor_sync(0xffffffffu, acc, 4);
  if (sub == 0 && row < rows) {
    p.dsum[row] = acc;
    // exp2(x - (+inf)) = 0 for every x < +inf: a row with no visible key gets P = 0 from
    // the formula itself, and never exp2(-inf - (-inf)) = NaN.
    const float lse = p.lse[row];
    p.lse2[row] = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
  }
  // This block's rows of the dQ accumulator, for the main kernel's atomics.
  const int64_t mine = rows - row0 < kPrepassRows ? rows - row0 : kPrepassRows;
  float4* z = reinterpret_cast<float4*>(p.dq_acc + row0 * d);
  for (int64_t x = threadIdx.x; x < mine * d / 4; x += kPrepassThreads)
    z[x] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// ---- the main kernel ----

template <class T, int D, bool kDropout = false, bool kSparse = false>
__global__ void __launch_bounds__(BwdConfig<T, D>::kThreads, 1)
    backward_kernel(const BwdArgsFor<kDropout, kSparse> p) {
  using C = BwdConfig<T, D>;
  using Args = BwdArgsFor<kDropout, kSparse>;
  using QKV = typename C::QKV;
  constexpr int kBr = C::kBr, kBc = C::kBc;
  constexpr int kNT = kBr / 8;  // n8 tiles of S^T, dP^T per warp (query columns)
  constexpr int kDT = D / 8;    // n8 tiles of dK_j, dV_j per warp

  extern __shared__ __align__(128) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);                         // Bc x d, K_j (dK_j on the way out)
  T* sV = sK + kBc * D;                                       // Bc x d, V_j (dV_j on the way out)
  T* sQ = sV + kBc * D;                                       // 2 stages x Br x d
  T* sdO = sQ + 2 * kBr * D;                                  // 2 stages x Br x d
  T* sdS = sdO + 2 * kBr * D;                                 // 2 buffers x Bc x Br: dS^T
  float* sL = reinterpret_cast<float*>(sdS + 2 * kBc * kBr);  // 2 stages x Br: L_i
  float* sD = sL + 2 * kBr;                                   // 2 stages x Br: D_i

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;  // the mma fragment coordinates of this lane
  const int M = p.seq_q, N = p.seq_k;
  // blockIdx.x is the K/V tile, the fastest grid dimension: the blocks running at one time
  // are the K/V tiles of a few heads, which read the same Q_i, dO_i (from L2) and add to the
  // same dQ rows. Under causal masking the first K/V tiles have the most Q tiles to walk.
  const int j0 = blockIdx.x * kBc, hk = blockIdx.y, b = blockIdx.z;
  const size_t bhk = size_t(b) * p.heads_kv + hk;
  const T* K = static_cast<const T*>(p.k) + bhk * N * D;
  const T* V = static_cast<const T*>(p.v) + bhk * N * D;
  const T* Q = static_cast<const T*>(p.q);
  const T* dO = static_cast<const T*>(p.dout);

  // The items, one (query head of the group, Q tile i) each: of each head in turn, the Q tiles
  // that see a key of this tile (ItemWalk).
  ItemWalk<kBr, kSparse, Args> items{p, b, hk, j0, M, N};
  const int n_items = items.count();

  // The dQ product's split over the warps: wq of the rows, wd of the columns.
  const int wq = warp % C::kWarpsQ, wd = warp / C::kWarpsQ;

  const int w_row0 = warp * 16;  // this warp's keys within the tile
  float acc_dk[kDT][4], acc_dv[kDT][4];
  zero_dk_dv<C>(acc_dk, acc_dv);

  int q_min[2];
  first_queries(q_min, j0 + w_row0 + g, p.causal, M, N);

  load_tile<C, kBc>(sK, K, j0, N, tid);
  load_tile<C, kBc>(sV, V, j0, N, tid);
  BwdItem cur = items.first(n_items), prev = cur;
  if (n_items > 0) load_item<C>(cur, 0, sQ, sdO, sL, sD, Q, dO, p, M, tid);
  cp_async_commit();

  for (int x = 0; x < n_items; ++x) {
    // Item x's tiles (and at x = 0, K_j, V_j) have landed for every thread; every warp is
    // done with item x - 1 (its stage is loaded next) and has written its dS^T.
    cp_async_wait_all();
    __syncthreads();
    const int s = x & 1;
    const BwdItem next = items.next(cur, x + 1 < n_items);
    if (x + 1 < n_items) {  // overlaps with all of this item's compute
      load_item<C>(next, s ^ 1, sQ, sdO, sL, sD, Q, dO, p, M, tid);
      cp_async_commit();
    }
    if (x > 0) dq_update<C>(prev, sdS + (s ^ 1) * kBc * kBr, sK, p, M, wq, wd, lane, g, t);

    const T* sQi = sQ + s * kBr * D;
    const T* sdOi = sdO + s * kBr * D;
    const float* sLi = sL + s * kBr;
    const float* sDi = sD + s * kBr;
    const int i0 = cur.i0;

    // S^T = K_j Q_i^T for this warp's 16 keys.
    float s_t[kNT][4];
    warp_rows_abt<QKV, T, D>(s_t, sK, w_row0, sQi, lane);

    // Mask: only tiles that straddle the diagonal, or hold the end of the keys, pay for it.
    // (Queries past M need none: their Q, dO, L, D rows are zeros, so S = dP = 0, P = 1 and
    // dS = 0, and P dO = 0: they add exactly nothing.)
    const bool mask = j0 + kBc > N || (p.causal && j0 + kBc - 1 > i0 + (N - M));
    if (mask) mask_scores_t<C>(s_t, q_min, i0, t);

    // P^T recomputed from S^T and L_i, packed in T (RecomputeP).
    uint32_t p_t[kNT][2];
    const RecomputeP<C, T, Args> recompute_p{p, t};
    recompute_p(p_t, s_t, sLi);

    // dP^T = V_j dO_i^T, as S^T.
    float dp_t[kNT][4];
    warp_rows_abt<QKV, T, D>(dp_t, sV, w_row0, sdOi, lane);

    // dS^T = P^T o (dP^T - D_i), packed like P^T (DsTile, which also says how dropout's Z is
    // regenerated in the S^T layout: the Philox call and its movmatrix below).
    [[maybe_unused]] uint32_t z[4];
    [[maybe_unused]] const uint32_t key16 = uint32_t(j0 + w_row0) / 16u, q16 = uint32_t(i0) / 16u;
    [[maybe_unused]] const uint32_t hq = uint32_t(cur.bh - size_t(b) * p.heads);
    uint32_t ds_t[kNT][2];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      if constexpr (kDropout) {
        if (nt % 2 == 0) {
          // EXERCISE BEGIN dropout-regenerate [hard]
          // Concept: Z is a pure function of (seed, b, h, i, j), so the backward regenerates the
          // forward's bits; in the transposed S^T layout, by moving them between lanes.
          //
          // Z of the 16 x 16 block of S^T at this warp's 16 keys (key 16-block key16) and the
          // queries of n8 tiles nt, nt + 1 (query 16-block q16 + nt / 2), for query head hq of
          // batch b. Fill z[0..3], one word per C-layout register pair of that block: z[0] =
          // key g, tile nt; z[1] = key g + 8, tile nt; z[2], z[3] the same for tile nt + 1; in
          // each, the low 16 bits hold query 2t's 8-bit uniform, the high 16 bits query 2t + 1's.
          // Tools: dropout::philox (common/dropout.hpp: which lane of the FORWARD's layout holds
          // an element, and which byte of which 16-bit half), dropout::block_uniforms (a block's
          // bytes at the bottom of their halves) and transpose_b16 (mma.cuh). One
          // call per block is enough (this warp uses the bytes of its own 16 keys; the other
          // half of the call belongs to the neighbouring warp's keys): ask which forward lane's
          // elements this lane's own number selects, and where those elements sit in S^T.
          const dropout::Philox4 zf =
              dropout::philox((key16 / 2) * 32u + lane, q16 + nt / 2, hq, b, p.seed_lo, p.seed_hi);
#pragma unroll
          for (int r = 0; r < 4; ++r)
            z[r] = dropout::block_uniforms(transpose_b16(zf.w[r]), key16 % 2);
          // EXERCISE END
        }
      }
      DsTile<C, kDropout, T, Args>{ds_t, p_t, dp_t, p, t, z, sDi}(nt);
    }

    // dV_j += P^T dO_i and dK_j += dS^T Q_i, k = the Br queries, with P^T and dS^T straight
    // from registers (tile_pair_a); dS^T also goes to shared memory for the dQ product.
    T* sdSx = sdS + s * kBc * kBr;
#pragma unroll
    for (int kk = 0; kk < kBr / 16; ++kk) {
      uint32_t ap[4], ads[4];
      tile_pair_a(ap, p_t, kk);
      tile_pair_a(ads, ds_t, kk);
      store_ds_t<C>(sdSx, ads, w_row0, kk, g, t);
      DvDk<C, T>{acc_dv, acc_dk, sdOi, sQi, lane}(ap, ads, kk);
    }
    prev.i0 = cur.i0, prev.bh = cur.bh, cur = next;  // (field by field: BwdItem)
  }

  // The last item's dQ product, once every warp has written its dS^T.
  cp_async_wait_all();  // (nothing is in flight here unless there was no item at all)
  __syncthreads();
  if (n_items > 0)
    dq_update<C>(prev, sdS + ((n_items - 1) & 1) * kBc * kBr, sK, p, M, wq, wd, lane, g, t);

  // dK_j, dV_j out through sK and sV: every warp has finished reading K_j for dQ.
  __syncthreads();
  store_dk_dv<C, kDropout>(sK, sV, acc_dk, acc_dv, p, bhk, j0, N, w_row0, lane, g, t);
}

// ---- post-pass: dQ = scale_dq * dQ_acc in T, 4 elements per thread and step ----

template <class T>
__global__ void __launch_bounds__(256) backward_dq_kernel(const BwdArgs p, int d) {
  const int64_t n4 = int64_t(p.batch) * p.heads * p.seq_q * d / 4;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t x = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; x < n4; x += stride) {
    const float4 a = reinterpret_cast<const float4*>(p.dq_acc)[x];
    reinterpret_cast<uint2*>(p.dq)[x] = make_uint2(pack2<T>(p.scale_dq * a.x, p.scale_dq * a.y),
                                                   pack2<T>(p.scale_dq * a.z, p.scale_dq * a.w));
  }
}

// What a caller needs to run the backward of one (T, d): three launches on one stream, in
// order (prepass, main, finish), each followed by the caller's launch check. The main launch
// picks the instantiation for the params' features.
struct BwdKernel {
  const void* fn = nullptr;  // the dense main kernel without dropout: occupancy, resources
  // The main kernel's instantiation for these params.
  const void* (*fn_for)(const BwdParams& p) = nullptr;
  // Sets the dynamic shared-memory limit and the carve-out of every main-kernel instantiation:
  // call it once per device before the first launch. Returns the first error.
  cudaError_t (*configure)() = nullptr;
  void (*prepass)(const BwdParams& p, cudaStream_t stream) = nullptr;
  void (*main)(const BwdParams& p, cudaStream_t stream) = nullptr;
  void (*finish)(const BwdParams& p, cudaStream_t stream) = nullptr;
  int br = 0, bc = 0, warps = 0, smem_bytes = 0;
};

// The arguments of the main kernel with the features, from p, on the host: BwdArgs' fields,
// then the features (set_features); a mask row holds mask_q_blocks query blocks.
inline BwdFeatureArgs bwd_feature_args(const BwdParams& p, int br, int bc) {
  BwdFeatureArgs a{};
  static_cast<BwdArgs&>(a) = p;
  set_features(a, p, p.mask_k_blocks, br, bc);
  if (p.blk_count) a.mask_q_blocks = p.mask_q_blocks;
  return a;
}

template <class T, int D>
void launch_bwd_prepass(const BwdParams& p, cudaStream_t stream) {
  const int64_t rows = int64_t(p.batch) * p.heads * p.seq_q;
  backward_prepass_kernel<T>
      <<<unsigned((rows + kPrepassRows - 1) / kPrepassRows), kPrepassThreads, 0, stream>>>(
          static_cast<const BwdArgs&>(p), D);
}

template <class T, int D, bool kDropout, bool kSparse>
void launch_bwd_main_as(const BwdParams& p, cudaStream_t stream) {
  using C = BwdConfig<T, D>;
  const dim3 grid(unsigned((p.seq_k + C::kBc - 1) / C::kBc), unsigned(p.heads_kv),
                  unsigned(p.batch));
  if constexpr (kDropout || kSparse)
    backward_kernel<T, D, kDropout, kSparse>
        <<<grid, C::kThreads, C::kSmemBytes, stream>>>(bwd_feature_args(p, C::kBr, C::kBc));
  else
    backward_kernel<T, D>
        <<<grid, C::kThreads, C::kSmemBytes, stream>>>(static_cast<const BwdArgs&>(p));
}

template <class T, int D>
void launch_bwd_main(const BwdParams& p, cudaStream_t stream) {
  // dropout_p = 0 is no dropout at all: the kernel without it, bit for bit.
  const bool drop = p.dropout_p > 0, sparse = p.blk_count != nullptr;
  if (drop && sparse) return launch_bwd_main_as<T, D, true, true>(p, stream);
  if (drop) return launch_bwd_main_as<T, D, true, false>(p, stream);
  if (sparse) return launch_bwd_main_as<T, D, false, true>(p, stream);
  launch_bwd_main_as<T, D, false, false>(p, stream);
}

template <class T, int D>
const void* bwd_fn_for(const BwdParams& p) {
  const bool drop = p.dropout_p > 0, sparse = p.blk_count != nullptr;
  if (drop && sparse) return reinterpret_cast<const void*>(&backward_kernel<T, D, true, true>);
  if (drop) return reinterpret_cast<const void*>(&backward_kernel<T, D, true, false>);
  if (sparse) return reinterpret_cast<const void*>(&backward_kernel<T, D, false, true>);
  return reinterpret_cast<const void*>(&backward_kernel<T, D>);
}

template <class T, int D>
cudaError_t configure_bwd() {
  const void* fns[4] = {reinterpret_cast<const void*>(&backward_kernel<T, D>),
                        reinterpret_cast<const void*>(&backward_kernel<T, D, true, false>),
                        reinterpret_cast<const void*>(&backward_kernel<T, D, false, true>),
                        reinterpret_cast<const void*>(&backward_kernel<T, D, true, true>)};
  for (const void* fn : fns) {
    cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         BwdConfig<T, D>::kSmemBytes);
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                               int(cudaSharedmemCarveoutMaxShared));
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

template <class T, int D>
void launch_bwd_dq(const BwdParams& p, cudaStream_t stream) {
  const int64_t n4 = int64_t(p.batch) * p.heads * p.seq_q * D / 4;
  const int64_t blocks = (n4 + 255) / 256;
  backward_dq_kernel<T><<<unsigned(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(
      static_cast<const BwdArgs&>(p), D);
}

template <class T, int D>
BwdKernel bwd_kernel() {
  using C = BwdConfig<T, D>;
  BwdKernel k;
  k.fn = reinterpret_cast<const void*>(&backward_kernel<T, D>);
  k.fn_for = &bwd_fn_for<T, D>;
  k.configure = &configure_bwd<T, D>;
  k.prepass = &launch_bwd_prepass<T, D>;
  k.main = &launch_bwd_main<T, D>;
  k.finish = &launch_bwd_dq<T, D>;
  k.br = C::kBr, k.bc = C::kBc, k.warps = C::kWarps, k.smem_bytes = C::kSmemBytes;
  return k;
}

}  // namespace ladder::step06
