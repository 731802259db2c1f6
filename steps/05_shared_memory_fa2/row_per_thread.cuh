// SPDX-License-Identifier: MIT (LICENSE). Follows the published structure of
// FlashAttention-2 (T. Dao, 2023, arXiv:2307.08691, Algorithm 1).
// Step 05, read this file first: the simplest shared-memory FlashAttention-2 forward (the
// `row` variant, `--variant row`), from which the step's other kernels are built up one idea
// at a time (shared_memory_fa2.cuh, the step's overview, then shared_memory_fa2_forward.cuh;
// notes/05_shared_memory_fa2.md has the measured path).
//
// Step 04 gave each query row its own thread and read every K and V row from global memory
// once per query row. Here the threads of a block, one per query row as before, first copy a
// tile of Bc keys (K_j and V_j) into shared memory together; each thread then streams its own
// row through that tile. A K/V row read from HBM now serves the block's Br rows instead of one.
//   one block per (Q tile of Br rows, head, batch); thread t owns query row i = i0 + t:
//     q = Q_i (registers), m = -inf, l = 0, o = 0 (registers)
//     for each K/V tile j that some row of the block can see:
//       K_j, V_j -> shared memory (all threads, coalesced), barrier
//       s = scale q K_j^T, masked keys -inf              (Bc scores, registers)
//       fold the tile into m, l, o                     (the online rescale, once per tile)
//     O_i = o / l,  LSE_i = m + log l
// Correct for any lengths: keys past the end are zero-filled and masked, rows past the end
// only help to load. What it does not do yet, and the next variants add: a thread holds all
// d floats of q and of o (at d = 128 that is more registers than a thread has, so some live
// in local memory), and every float read from shared memory feeds a single FMA (the compiler,
// unrolling the loops over c, reads 4 floats at a time: 16-byte reads, broadcast to all).
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "exercise.hpp"

namespace ladder::step05 {

// What every forward kernel of the step needs to know. Q, O: [B, H, M, D]; K, V: [B, Hkv, N,
// D]; LSE, LSE_lo: [B, H, M]. group = H / Hkv: query head h reads K/V head h / group.
struct FwdArgs {
  const float* __restrict__ q;
  const float* __restrict__ k;
  const float* __restrict__ v;
  float* __restrict__ o;
  float* __restrict__ lse;
  float* __restrict__ lse_lo;  // for the backward: see store_lse
  int batch, heads, heads_kv, group, seq_q, seq_k, Br;
  float scale;
  bool causal;
};

// LSE_i = m_i + log l_i, stored as the float LSE (the output) plus the rounding residual
// LSE_lo = (m_i + log l_i) - LSE (Fast2Sum: exact when |m_i| >= log l_i, the case where it
// matters). The backward recomputes P_ij = exp(S_ij - LSE_i): at |LSE| ~ 300, rounding LSE to
// float alone is an error of up to 1.5e-5 in every P_ij of the row, 100x float's rounding of
// P_ij itself, and it shows in dV where softmax is nearly one-hot. No visible key (l = 0):
// LSE = -inf, LSE_lo = 0.
__device__ __forceinline__ void store_lse(float* lse, float* lse_lo, float m, float l) {
  if (l > 0.f) {
    const float log_l = logf(l), hi = m + log_l;
    *lse = hi;
    *lse_lo = log_l - (hi - m);
  } else {
    *lse = -INFINITY;
    *lse_lo = 0.f;
  }
}

constexpr int kRowBr = 64;  // query rows per block: one thread each
constexpr int kRowBc = 32;  // keys per K/V tile: K_j and V_j are 2 x 32 x d floats, 32 KB at d 128

// The kernel's (static) shared memory: K_j and V_j, kRowBc x d floats each.
constexpr size_t row_smem_bytes(int d) {
  return 2 * size_t(kRowBc) * size_t(d) * sizeof(float);
}

template <int D>
__global__ void __launch_bounds__(kRowBr) row_forward_kernel(const FwdArgs p) {
  __shared__ float Ks[kRowBc][D];
  __shared__ float Vs[kRowBc][D];
  static_assert(sizeof(Ks) + sizeof(Vs) == row_smem_bytes(D), "row_smem_bytes is the layout");
  const int t = threadIdx.x;
  // Causal: the last Q tiles see the most keys; launching them first shortens the tail.
  const int it = p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int i0 = it * kRowBr, i = i0 + t, h = blockIdx.y, b = blockIdx.z;
  const bool active = i < p.seq_q;  // a thread past the last row only helps to load
  const size_t row = (size_t(b) * p.heads + h) * p.seq_q + i;
  const size_t kv_off = (size_t(b) * p.heads_kv + h / p.group) * p.seq_k;
  const float* K = p.k + kv_off * D;
  const float* V = p.v + kv_off * D;

  float q[D], o[D];
#pragma unroll
  for (int c = 0; c < D; ++c) q[c] = active ? p.q[row * D + c] : 0.f, o[c] = 0.f;
  float m = -INFINITY, l = 0.f;

  // Keys this row may see: j <= last (bottom-right causal), j < N. The block visits every
  // tile up to its last row's limit; the tiles past it are never loaded.
  const int last = p.causal ? i + p.seq_k - p.seq_q : p.seq_k - 1;
  const int rows = min(kRowBr, p.seq_q - i0);
  const int n_vis = p.causal ? min(p.seq_k, max(0, i0 + rows + p.seq_k - p.seq_q)) : p.seq_k;

  for (int j0 = 0; j0 < n_vis; j0 += kRowBc) {
    // EXERCISE BEGIN smem-staging [medium]
    // Concept: staging a tile in shared memory: every thread copies a share, and two barriers
    // order the copy against the reads of the previous tile and of this one.
    //
    // Fill Ks[jj][c], Vs[jj][c] (jj < kRowBc, c < D) with keys j0 + jj, the kRowBr threads
    // (t = 0 .. kRowBr - 1) sharing the copy so that consecutive threads read consecutive
    // floats. Keys past seq_k must be zeros, not garbage: why? Which threads may still be
    // reading the previous tile when the first one starts writing this one, and which
    // threads' floats does each thread read afterwards?
    __syncthreads();  // every thread is done with the previous tile
    // Consecutive threads copy consecutive floats: coalesced. Keys past the end are zeros
    // (their scores are masked below; garbage could be NaN, and 0 * NaN = NaN in o).
    for (int e = t; e < kRowBc * D; e += kRowBr) {
      const int jj = e / D, c = e % D;
      const bool in = j0 + jj < p.seq_k;
      Ks[jj][c] = in ? K[size_t(j0 + jj) * D + c] : 0.f;
      Vs[jj][c] = in ? V[size_t(j0 + jj) * D + c] : 0.f;
    }
    __syncthreads();  // the tile is in shared memory
    // EXERCISE END

    float s[kRowBc];
    float tile_max = -INFINITY;
#pragma unroll
    for (int jj = 0; jj < kRowBc; ++jj) {
      float dot = 0.f;
#pragma unroll
      for (int c = 0; c < D; ++c) dot = fmaf(q[c], Ks[jj][c], dot);  // a broadcast read
      const int j = j0 + jj;
      s[jj] = j < p.seq_k && j <= last ? __fmul_rn(dot, p.scale) : -INFINITY;
      tile_max = fmaxf(tile_max, s[jj]);
    }
    // EXERCISE BEGIN row-online-update [medium]
    // Concept: the online-softmax rescale in one thread's registers, a tile of keys at a time:
    // one rescale of l and o per tile, then the tile's weights added.
    //
    // s[0..kRowBc) holds this tile's scores (-inf where masked), tile_max their max; m, l,
    // o[0..D) describe the tiles before. Afterwards they must describe this tile too, relative
    // to the new running max. Trap: a row that has seen only masked keys (m = -inf).
    // The online update, once per tile. A row that has seen only masked keys keeps m = -inf:
    // shift by 0 then, so that exp(-inf - 0) = 0 instead of exp(-inf + inf) = NaN.
    const float m_new = fmaxf(m, tile_max);
    const float shift = m_new == -INFINITY ? 0.f : m_new;
    const float alpha = expf(m - shift);
#pragma unroll
    for (int c = 0; c < D; ++c) o[c] *= alpha;
    float sum = 0.f;  // the tile's weights, then added to l: l is summed a tile at a time
#pragma unroll
    for (int jj = 0; jj < kRowBc; ++jj) {
      const float pj = expf(s[jj] - shift);
      sum += pj;
#pragma unroll
      for (int c = 0; c < D; ++c) o[c] = fmaf(pj, Vs[jj][c], o[c]);
    }
    l = alpha * l + sum;
    m = m_new;
    // EXERCISE END
  }

  if (!active) return;
  const float inv_l = l > 0.f ? 1.f / l : 0.f;  // l = 0: no visible key, O = 0, LSE = -inf
#pragma unroll
  for (int c = 0; c < D; ++c) p.o[row * D + c] = o[c] * inv_l;
  store_lse(p.lse + row, p.lse_lo + row, m, l);
}

// The launch: Br = 64 rows per block, Bc = 32 keys per tile (compiled); p.Br is ignored.
template <int D>
void launch_row_forward(const FwdArgs& p, cudaStream_t stream) {
  const dim3 grid(unsigned((p.seq_q + kRowBr - 1) / kRowBr), unsigned(p.heads), unsigned(p.batch));
  row_forward_kernel<D><<<grid, kRowBr, 0, stream>>>(p);
}

}  // namespace ladder::step05
