// Step 06 — tensor-core FlashAttention-2 (CUDA, bf16 and fp16 with fp32 accumulation).
// Adds: mma.sync m16n8k16 with fp32 accumulation; ldmatrix (.trans for V); XOR-swizzled shared
// memory; cp.async double buffering of K_j and V_j; P kept in registers as the A operand; exp2
// with log2(e) folded into the scale; O staged through shared memory for 16-byte stores;
// backward with a D = rowsum(dO o O) pre-pass and P recomputed from LSE; K/V-outer backward
// loop with dK_j and dV_j in registers; S^T and dP^T so that P^T and dS^T are A operands in
// registers; dQ accumulated by fp32 atomics; block-sparse masks: masked tiles skipped, K/V never
// loaded; dropout regenerated in registers (Philox), never stored.
//
// SPDX-License-Identifier: MIT (LICENSE). Follows the published structure of
// FlashAttention-2 (T. Dao, 2023, arXiv:2307.08691, Algorithm 1).
//
// Where it sits: the top of the ladder. Step 05 has FlashAttention-2's loop order and
// tiling in fp32 on the CUDA cores, whose FFMA ceiling (~51 TFLOP/s measured) it cannot
// pass. This step keeps that algorithm and moves both matrix products onto the tensor
// cores (mma.sync, bf16/fp16 inputs, fp32 accumulation: ~626 TFLOP/s measured), then
// removes, one technique at a time, everything that would keep them waiting.
//
// The algorithm (FlashAttention-2, Dao 2023), for a query tile Q_i of Br rows, in a block:
//   Tr = ceil(M / Br) blocks per head, Tc = ceil(N / Bc) K/V tiles (fewer under causal)
//   m_i = -inf, l_i = 0, O_i = 0
//   for j < Tc:  S_ij = scale Q_i K_j^T                           (tensor cores)
//                m_new = max(m_i, rowmax S_ij),  P_ij = exp(S_ij - m_new)
//                l_i = exp(m_i - m_new) l_i + rowsum P_ij
//                O_i = diag(exp(m_i - m_new)) O_i + P_ij V_j       (tensor cores)
//                m_i = m_new
//   O_i = diag(l_i)^-1 O_i,  LSE_i = m_i + log l_i
// The backward (FlashAttention-2, Algorithm 2), with D_i = rowsum(dO_i o O_i) from a pre-pass:
//   for each K/V tile j (a block; dK_j = dV_j = 0 in registers):
//     for each query head of the GQA group, each Q tile i that sees a key of K_j:
//       P_ij = exp(scale S_ij - LSE_i)    recomputed: only LSE was saved, not P
//       dV_j += P_ij^T dO_i,  dP_ij = dO_i V_j^T,  dS_ij = P_ij o (dP_ij - D_i)
//       dK_j += dS_ij^T Q_i,  dQ_i += dS_ij K_j   (fp32 atomics: every K/V tile adds to it)
//   dK_j *= scale, dQ = scale dQ_acc
// This file holds the forward kernel and its launch; tensor_core_fa2_backward.cuh the backward's
// three kernels; forward_steps.cuh and backward_steps.cuh the steps of the two main kernels;
// masks.cuh the masks; params.cuh the kernels' arguments and tiles; tiles.cuh the shared tiles
// and their fragment loads; mma.cuh the fragment vocabulary; host.cu the descriptor, the
// variants and the launches. README.md gives the reading order.
// notes/06_tensor_core_fa2.md has the fragment drawings, the shared-memory and register
// budgets and the cost models of both passes.
// What the next step (07) fixes: on an H100 mma.sync reaches about two thirds of the tensor
// cores' rate; the rest is taken by Hopper-only instructions: wgmma (warpgroup MMA reading B
// from shared memory, asynchronous), TMA copies and warp specialisation (FlashAttention-3).
//
// The forward kernel, one kernel whose template flags switch each technique off for the
// variants (host.cu).
//
// One block per (Q tile i, head h, batch b); Br = kWarps * 16 * kSlices query rows. Warp w
// owns rows [w * 16 * kSlices, (w + 1) * 16 * kSlices) of the tile: kSlices m16 slices, whose
// S, m_i, l_i and O_i live in its registers, so no reduction ever crosses warps.
//   for j in the K/V tiles this Q tile can see (Bc keys each):
//     wait for K_j, V_j; barrier; start the copy of K_{j+1}, V_{j+1} (cp.async, other stage)
//     S = Q_i K_j^T               mma.sync, A = Q_i via ldmatrix, B = K_j via ldmatrix
//     mask (only tiles that straddle the diagonal or the end of the keys)
//     m_new = max(m_i, rowmax S)  quad shuffles: the 4 lanes of a row hold its 2*Bc/8 columns
//     P = exp2(S * scale*log2e - m_new * scale*log2e)   one FFMA + one ex2 per element
//     l_i = alpha l_i + rowsum P  per thread; the quad adds its partial sums once at the end
//     O_i = alpha O_i + P V_j     A = P straight from the S registers, B = V_j via ldmatrix.trans
//   O_i /= l_i (one division per row), LSE_i = scale * m_i + log l_i; O_i staged through
//   shared memory for 16-byte coalesced stores.
// Block-sparse masks and dropout are template flags of the full kernel (kSparse, kDropout), so
// the dense kernels without dropout are the code above, unchanged:
//   kSparse:  the loop walks the host's list of kept key blocks for this Q tile's mask row
//             (kv_block_lists, uploaded once, outside the timed region, as FlexAttention builds
//             its BlockMask): a masked tile is never loaded, and cp.async prefetches the next
//             kept tile. Inside a kept tile the causal and sequence-end masks apply as before.
//   kDropout: Z_ij is regenerated in registers (common/dropout.hpp): one Philox4x32-10 call per
//             16 x 16 block of S gives exactly this lane's 8 elements of it, applied to P after
//             the row sum (l sums the undropped P) and before P becomes the A operand of P V;
//             1 / (1 - p) is folded into the epilogue's 1 / l. Z is never stored.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "dropout.hpp"
#include "forward_steps.cuh"
#include "masks.cuh"
#include "mma.cuh"
#include "params.cuh"
#include "tiles.cuh"

namespace ladder::step06 {

// kDropout, kSparse: the features, instantiated for the full variant only (host.cu).
template <class T, int D, int kFlags, bool kDropout = false, bool kSparse = false>
__global__ void __launch_bounds__(FwdConfig<T, D, kFlags>::kThreads)
    forward_kernel(const FwdArgsFor<kDropout, kSparse> p) {
  using C = FwdConfig<T, D, kFlags>;
  static_assert(kFlags == kFwdAll || (!kDropout && !kSparse),
                "dropout and block-sparse masks are built into the full variant only");
  using QKV = typename C::QKV;
  constexpr int kBr = C::kBr, kBc = C::kBc, kS = C::kSlices;
  constexpr int kNT = kBc / 8;  // n8 tiles of S per slice
  constexpr int kDT = D / 8;    // n8 tiles of O per slice

  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);  // Br x d, later O_i
  T* sK = sQ + kBr * D;                // kStages x Bc x d
  T* sV = sK + C::kStages * kBc * D;   // kStages x Bc x d
  T* sP = sV + C::kStages * kBc * D;   // Br x Bc (p-via-smem only)

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;  // the mma fragment coordinates of this lane
  const int M = p.seq_q, N = p.seq_k;
  // Q tiles in reverse order: under the causal mask the last tiles see the most keys, so
  // running them first leaves the short ones for the last wave. Without a mask every tile
  // costs the same and the order changes nothing.
  const int i0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * kBr;
  const int h = blockIdx.y, b = blockIdx.z;
  const size_t bh = size_t(b) * p.heads + h, bhk = size_t(b) * p.heads_kv + h / p.group;
  const T* Q = static_cast<const T*>(p.q) + bh * M * D;
  const T* K = static_cast<const T*>(p.k) + bhk * N * D;
  const T* V = static_cast<const T*>(p.v) + bhk * N * D;

  // The K/V tiles this Q tile sees, and those that need no mask.
  int n_tiles, n_unmasked;
  visible_tiles<C>(n_tiles, n_unmasked, p.causal, i0, M, N);

  const int w_row0 = warp * 16 * kS;  // this warp's first row within the tile
  float acc_o[kS][kDT][4];            // O_i, unnormalised
  float row_m[kS][2], row_l[kS][2];   // m_i, l_i of rows g and g + 8 of each slice
  init_rows<C>(acc_o, row_m, row_l);

  // The tiles visited: j = 0 .. n_tiles - 1, or (block-sparse) those of the kept key blocks
  // of this Q tile's mask row below n_tiles. j is the tile, x counts the tiles visited.
  int j = 0;
  [[maybe_unused]] KeptTiles kept;
  if constexpr (kSparse) kept.begin_q_tile(p, b, h, i0 / kBr), j = kept.tile;
  // Dropout's Philox counter is (32 * key 16-block + lane, query 16-block, h, b): the query
  // 16-block of slice mi is q16 + mi.
  [[maybe_unused]] const uint32_t q16 = uint32_t(i0 + w_row0) / 16u;

  if (j < n_tiles) {
    load_tile<C, kBr>(sQ, Q, i0, M, tid);
    load_kv<C>(sK, sV, K, V, j * kBc, N, tid);
    if constexpr (C::kAsync) cp_async_commit();

    for (int x = 0; j < n_tiles; ++x) {
      // K_j, V_j (and the first time, Q_i) have landed for every thread, and every warp is
      // done with the previous tile, whose stage the next copy overwrites.
      if constexpr (C::kAsync) cp_async_wait_all();
      __syncthreads();
      const int stage = C::kStages == 2 ? ((kSparse ? x : j) & 1) : 0;
      int jn = j + 1;  // the next tile to visit
      if constexpr (kSparse) {
        kept.advance(p.mask_k_tiles);
        jn = kept.tile;
      }
      // (kSparse ? jn : j + 1) below is jn, but spelled so the dense kernel's machine code
      // stays exactly what it was before the features: with jn, ptxas schedules it otherwise.
      if constexpr (C::kAsync)
        if ((kSparse ? jn : j + 1) < n_tiles) {  // overlaps with all of this tile's compute
          const int next = ((kSparse ? x : j) + 1) & 1;
          load_kv<C>(sK + next * kBc * D, sV + next * kBc * D, K, V, (kSparse ? jn : j + 1) * kBc,
                     N, tid);
          cp_async_commit();
        }
      const T* sKj = sK + stage * kBc * D;
      const T* sVj = sV + stage * kBc * D;

      // S = Q_i K_j^T, fp32 accumulators in the mma C layout.
      float s[kS][kNT][4];
      zero_scores<C>(s);
#pragma unroll C::kQKUnroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[kS][4];
#pragma unroll
        for (int mi = 0; mi < kS; ++mi)
          load_a<QKV, C::kLdsm>(a[mi], sQ, w_row0 + mi * 16, kk * 16, lane);
#pragma unroll
        for (int nj = 0; nj < kNT; nj += 2) {
          uint32_t bk[4];
          load_b_nk<QKV, C::kLdsm>(bk, sKj, nj * 8, kk * 16, lane);
#pragma unroll
          for (int mi = 0; mi < kS; ++mi) {
            mma_16816<T>(s[mi][nj], a[mi], bk[0], bk[1]);
            mma_16816<T>(s[mi][nj + 1], a[mi], bk[2], bk[3]);
          }
        }
      }

      // Only tiles that straddle the diagonal or the end of the keys pay for the mask.
      if (j >= n_unmasked) mask_scores<C>(s, p, i0, w_row0, j, g, t);

      online_softmax<C>(s, row_m, row_l, acc_o, p);

      // O_i += P V_j, with P as the A operand: from the S registers (p_fragment), or through
      // shared memory (store_p, then load_a).
      if constexpr (!C::kPRegs) store_p<C>(sP, s, w_row0, g, t);
      [[maybe_unused]] dropout::Philox4 z[kS];  // dropout: this 32-key block's calls, per slice
      static_assert(kBc % 32 == 0, "dropout's Philox calls cover 32 keys");
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) {
        uint32_t a[kS][4];
#pragma unroll
        for (int mi = 0; mi < kS; ++mi) {
          if constexpr (C::kPRegs) {
            if constexpr (kDropout) {  // Z of keys 16kk.. of tile j, rows of slice mi
              // One Philox call per 32 keys: made at even kk, its odd bytes used at kk + 1.
              const uint32_t key32 = uint32_t(j) * (kBc / 32) + kk / 2;
              if (kk % 2 == 0)
                z[mi] = dropout::philox(key32 * 32u + lane, q16 + mi, h, b, p.seed_lo, p.seed_hi);
              drop_block(s[mi][2 * kk], s[mi][2 * kk + 1], z[mi], kk % 2, p.drop_thresh);
            }
            p_fragment<T>(a[mi], s[mi], kk);
          } else {
            load_a<typename C::PL, C::kLdsm>(a[mi], sP, w_row0 + mi * 16, kk * 16, lane);
          }
        }
#pragma unroll
        for (int nd = 0; nd < kDT; nd += 2) {
          uint32_t bv[4];
          load_b_kn<QKV, C::kLdsm>(bv, sVj, kk * 16, nd * 8, lane);
#pragma unroll
          for (int mi = 0; mi < kS; ++mi) {
            mma_16816<T>(acc_o[mi][nd], a[mi], bv[0], bv[1]);
            mma_16816<T>(acc_o[mi][nd + 1], a[mi], bv[2], bv[3]);
          }
        }
      }

      // no-cp-async: one stage, loaded only after everyone is done (a dense kernel: the
      // features are built into the full variant only)
      if constexpr (!C::kAsync)
        if (j + 1 < n_tiles) {
          __syncthreads();
          load_kv<C>(sK, sV, K, V, (j + 1) * kBc, N, tid);
        }
      j = jn;
    }
  }

  float inv_l[kS][2];
  finish_rows<C, kDropout>(inv_l, row_m, row_l, p, bh, i0, w_row0, g, t);

  store_o<C>(static_cast<T*>(p.o), bh, sQ, acc_o, inv_l, M, i0, w_row0, lane, g, t);
}

// What a caller needs to run one (T, d, variant): the launch picks the instantiation for the
// params' features. fn is the dense, no-dropout one (occupancy and resource queries).
struct FwdKernel {
  const void* fn = nullptr;
  // The instantiation launch() runs for these params (dropout and block-sparse ones differ).
  const void* (*fn_for)(const FwdParams& p) = nullptr;
  // Sets the dynamic shared-memory limit and the shared-memory carve-out of every instantiation
  // launch() may run: call it once per device before the first launch. Returns the first
  // error.
  cudaError_t (*configure)() = nullptr;
  // Enqueues the forward on `stream`: the grid, the instantiation and its arguments (mask
  // strides, Philox key, threshold, 1 / (1 - p)) from the params, on the host. Launch errors
  // are left for the caller's cudaGetLastError().
  void (*launch)(const FwdParams& p, cudaStream_t stream) = nullptr;
  int br = 0, bc = 0, warps = 0, smem_bytes = 0;
  bool features = false;  // dropout and block-sparse masks (the full variant; others ignore them)
};

// The arguments of a kernel with the features, from p, on the host: FwdArgs' fields, then the
// features (set_features); a mask row holds mask_k_blocks key blocks.
inline FwdFeatureArgs fwd_feature_args(const FwdParams& p, int br, int bc) {
  FwdFeatureArgs a{};
  a.q = p.q, a.k = p.k, a.v = p.v, a.o = p.o, a.lse = p.lse;
  a.batch = p.batch, a.heads = p.heads, a.heads_kv = p.heads_kv, a.group = p.group;
  a.seq_q = p.seq_q, a.seq_k = p.seq_k, a.scale = p.scale, a.scale_log2 = p.scale_log2;
  a.causal = p.causal;
  set_features(a, p, p.mask_q_blocks, br, bc);
  if (p.blk_count) a.mask_k_blocks = p.mask_k_blocks;
  return a;
}

template <class T, int D, int kFlags, bool kDropout, bool kSparse>
void launch_fwd_as(const FwdArgsFor<kDropout, kSparse>& a, int batch, cudaStream_t stream) {
  using C = FwdConfig<T, D, kFlags>;
  const dim3 grid(unsigned((a.seq_q + C::kBr - 1) / C::kBr), unsigned(a.heads), unsigned(batch));
  forward_kernel<T, D, kFlags, kDropout, kSparse><<<grid, C::kThreads, C::kSmemBytes, stream>>>(a);
}

// The instantiation for p's features (the teaching variants have only the dense one).
template <class T, int D, int kFlags>
const void* fwd_fn_for(const FwdParams& p) {
  if constexpr (kFlags == kFwdAll) {
    const bool drop = p.dropout_p > 0, sparse = p.blk_count != nullptr;
    if (drop && sparse)
      return reinterpret_cast<const void*>(&forward_kernel<T, D, kFlags, true, true>);
    if (drop) return reinterpret_cast<const void*>(&forward_kernel<T, D, kFlags, true, false>);
    if (sparse) return reinterpret_cast<const void*>(&forward_kernel<T, D, kFlags, false, true>);
  }
  return reinterpret_cast<const void*>(&forward_kernel<T, D, kFlags>);
}

template <class T, int D, int kFlags>
void launch_fwd(const FwdParams& p, cudaStream_t stream) {
  using C = FwdConfig<T, D, kFlags>;
  if constexpr (kFlags == kFwdAll) {
    // dropout_p = 0 is no dropout at all: the kernel without it, bit for bit.
    const bool drop = p.dropout_p > 0, sparse = p.blk_count != nullptr;
    if (drop || sparse) {
      const FwdFeatureArgs a = fwd_feature_args(p, C::kBr, C::kBc);
      if (drop && sparse) return launch_fwd_as<T, D, kFlags, true, true>(a, p.batch, stream);
      if (drop) return launch_fwd_as<T, D, kFlags, true, false>(a, p.batch, stream);
      return launch_fwd_as<T, D, kFlags, false, true>(a, p.batch, stream);
    }
  }
  launch_fwd_as<T, D, kFlags, false, false>(p, p.batch, stream);  // FwdArgs: p's first part
}

template <class T, int D, int kFlags>
cudaError_t configure_fwd() {
  const void* fns[4] = {reinterpret_cast<const void*>(&forward_kernel<T, D, kFlags>)};
  int n = 1;
  if constexpr (kFlags == kFwdAll) {
    fns[n++] = reinterpret_cast<const void*>(&forward_kernel<T, D, kFlags, true, false>);
    fns[n++] = reinterpret_cast<const void*>(&forward_kernel<T, D, kFlags, false, true>);
    fns[n++] = reinterpret_cast<const void*>(&forward_kernel<T, D, kFlags, true, true>);
  }
  for (int i = 0; i < n; ++i) {
    cudaError_t e = cudaFuncSetAttribute(fns[i], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         FwdConfig<T, D, kFlags>::kSmemBytes);
    // Two blocks of up to 112 KiB per SM need the largest shared-memory carve-out of L1.
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(fns[i], cudaFuncAttributePreferredSharedMemoryCarveout,
                               int(cudaSharedmemCarveoutMaxShared));
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

template <class T, int D, int kFlags>
FwdKernel fwd_kernel() {
  using C = FwdConfig<T, D, kFlags>;
  FwdKernel k;
  k.fn = reinterpret_cast<const void*>(&forward_kernel<T, D, kFlags>);
  k.fn_for = &fwd_fn_for<T, D, kFlags>;
  k.configure = &configure_fwd<T, D, kFlags>;
  k.launch = &launch_fwd<T, D, kFlags>;
  k.br = C::kBr, k.bc = C::kBc, k.warps = C::kWarps, k.smem_bytes = C::kSmemBytes;
  k.features = kFlags == kFwdAll;
  return k;
}

}  // namespace ladder::step06
