// SPDX-License-Identifier: MIT (LICENSE). Follows the published structure of
// FlashAttention-2 (T. Dao, 2023, arXiv:2307.08691, Algorithm 1) and, for fa1_forward_kernel,
// FlashAttention (Dao, Fu, Ermon, Rudra, Re, 2022, arXiv:2205.14135, Algorithm 1).
// Step 05's forward kernels (the step's overview and the thread layout: shared_memory_fa2.cuh):
// forward_kernel, FA2's loop order, whose template flags switch off the ideas the variants
// measure, and fa1_forward_kernel, FA1's loop order; then their launches.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "dropout.hpp"
#include "exercise.hpp"
#include "shared_memory_fa2.cuh"

namespace ladder::step05 {

// FwdArgs (what every forward kernel needs to know) and store_lse are in row_per_thread.cuh.

// What a caller fills in (launch_forward below): FwdArgs and the features.
// Zero-initialised (FwdParams fp{}), there is neither block mask nor dropout.
struct FwdParams : FwdArgs {
  // Block-sparse mask (blk_count null: dense), as the host's kv_block_lists (common/
  // block_mask.hpp): row r = (mask batch * mask_heads + mask head) * mask_q_blocks + query
  // block keeps blk_count[r] key blocks, ascending, at blk_index[r * mask_k_blocks ...].
  // mask_batch, mask_heads: 1 shares a row with every batch / query head. The tiles must
  // divide the mask block: Br | mask_block_q, Bc = 64 | mask_block_k.
  const int32_t* blk_count;
  const int32_t* blk_index;
  int mask_batch, mask_heads, mask_q_blocks, mask_k_blocks, mask_block_q, mask_block_k;
  // Dropout (dropout_p = 0: none): the rate in [0, 1) and the Philox key.
  double dropout_p;
  uint64_t dropout_seed;
};

// What a forward kernel takes: FwdArgs, and the features (Features) if it has one.
template <bool kDropout, bool kSparse>
using FwdArgsFor = std::conditional_t<kDropout || kSparse, WithFeatures<FwdArgs>, FwdArgs>;

// Scales this thread's scores and, on a tile that needs it, masks them: a key past the end of
// the sequence, or (causal) past the row's last visible key i + N - M, gets S_ij = -inf.
// __fmul_rn: scale * S rounded on its own, never fused with the later "- m" into an FMA, so the
// backward (which recomputes it the same way) sees the very same S_ij. A row with a single
// visible key then has S_ij - LSE_i = 0 and P_ij = exp(0) = 1 exactly in both passes.
__device__ __forceinline__ void scale_and_mask(float (&s)[kTM][kTN], const FwdArgs& p, bool mask,
                                               int i0, int j0, int ty, int TY, int tx) {
#pragma unroll
  for (int r = 0; r < kTM; ++r)
#pragma unroll
    for (int b = 0; b < kTN; ++b) {
      const int i = i0 + ty + TY * r, j = j0 + tx + kTX * b;
      const bool hidden = mask && (j >= p.seq_k || (p.causal && j > i + p.seq_k - p.seq_q));
      s[r][b] = hidden ? -INFINITY : __fmul_rn(s[r][b], p.scale);
    }
}

// The K/V tiles this Q tile needs: keys up to the last row's last visible key (all when not
// causal). Tiles past it are fully masked for every row here and are never loaded.
__device__ __forceinline__ int visible_tiles(const FwdArgs& p, int i0, int rows) {
  int tc;
  // EXERCISE BEGIN causal-tile-bound [medium]
  // Concept: the causal tile bound: the last key tile a Q tile needs is decided by its last
  // row, bottom-right aligned.
  //
  // Set tc, the number of K/V tiles (of kBc keys) this Q tile (rows i0 .. i0 + rows - 1) must
  // visit: every tile that some row of the tile can see, none that no row can (those are never
  // loaded). Causal is bottom-right aligned: key j is visible to query i iff
  // j <= i + seq_k - seq_q. Which row of the tile sees the most keys? Without causal, all
  // tiles. Traps: seq_q > seq_k (early rows see nothing) and the last, partial tile.
  const int n_vis = p.causal ? min(p.seq_k, max(0, i0 + rows + p.seq_k - p.seq_q)) : p.seq_k;
  tc = (n_vis + kBc - 1) / kBc;
  // EXERCISE END
  return tc;
}

// One K/V tile folded into this thread's rows of m_i, l_i and O_i (the online softmax); s
// becomes the tile's unnormalised weights P_ij.
template <class L>
__device__ __forceinline__ void online_update(float (&s)[kTM][kTN], float (&m)[kTM],
                                              float (&l)[kTM], float (&o)[kTM][L::kCols]) {
  // EXERCISE BEGIN online-update [hard]
  // Concept: the online-softmax rescale across threads: a row max shared by the row's 16
  // threads, each thread's share of l and its rows of O rescaled once per tile.
  //
  // For each of this thread's kTM rows r, s[r][0..kTN) holds its scores of this tile (-inf
  // where masked). Afterwards s must hold the row's unnormalised weights for P V, and m[r],
  // l[r], o[r][..] must describe all tiles so far relative to the new running max (l[r] is
  // only this thread's share: the 16 shares are added once, at the end). row_max() combines
  // the 16 threads of a row. Trap: a row that has seen only masked keys (m = -inf) must not
  // produce exp(-inf - -inf).
#pragma unroll
  for (int r = 0; r < kTM; ++r) {
    float mx = s[r][0];
#pragma unroll
    for (int b = 1; b < kTN; ++b) mx = fmaxf(mx, s[r][b]);
    const float m_new = fmaxf(m[r], row_max(mx));
    const float shift = m_new == -INFINITY ? 0.f : m_new;
    const float alpha = expf(m[r] - shift);  // rescales what was summed under the old max
    float sum = 0.f;
#pragma unroll
    for (int b = 0; b < kTN; ++b) {
      s[r][b] = expf(s[r][b] - shift);
      sum += s[r][b];
    }
    l[r] = alpha * l[r] + sum;  // partial: the row's 16 threads are summed once, at the end
#pragma unroll
    for (int c = 0; c < L::kCols; ++c) o[r][c] *= alpha;
    m[r] = m_new;
  }
  // EXERCISE END
}

// Deferred normalisation: one division per row, by l_i and, with dropout, by 1 - p. l = 0
// means no visible key: O = 0, LSE = -inf.
template <int D, bool kDropout, class Args>
__device__ __forceinline__ void store_rows(const float (&o)[kTM][D / 16], const float (&m)[kTM],
                                           const float (&l)[kTM], const Args& p, size_t q_off,
                                           int rows, int ty, int TY, int tx) {
#pragma unroll
  for (int r = 0; r < kTM; ++r) {
    const float l_row = row_sum(l[r]);  // all 16 lanes take part, so before the bounds check
    const int i = ty + TY * r;
    if (i >= rows) continue;
    float inv_l = l_row > 0.f ? 1.f / l_row : 0.f;
    if constexpr (kDropout) inv_l *= p.f.drop_scale;
    float* out = p.o + (q_off + i) * D + 2 * tx;
#pragma unroll
    for (int c = 0; c < D / 32; ++c)
      *reinterpret_cast<float2*>(out + 32 * c) =
          make_float2(o[r][2 * c] * inv_l, o[r][2 * c + 1] * inv_l);
    if (tx == 0) store_lse(p.lse + q_off + i, p.lse_lo + q_off + i, m[r], l_row);
  }
}

// ---------------------------------------------------------------------------------------------
// FA2 forward: one block per (Q tile i, head h, batch b), Br = 2 * blockDim.x / kTX rows.
// Q_i stays in shared memory for the whole loop over K/V tiles j; m_i, l_i and the
// unnormalised O_i stay in registers; O_i / l_i and LSE_i = m_i + log l_i are written once.
// Shared memory: [Q_i: Br x kLd][K_j: Bc x kLd, reused for P_ij][V_j: Bc x D].
// kWide, kPad, kBatch: the 16-byte shared-memory reads (abt_tile, pv_tile), the padded rows
// (Layout) and the loads in flight (load_tiles); all on in the default variant, off in the
// ones that measure them.
template <int D, bool kDropout = false, bool kSparse = false, bool kPad = true, int kBatch = 4,
          bool kWide = true>
__global__ void __launch_bounds__(kFwdMaxThreads)
    forward_kernel(const FwdArgsFor<kDropout, kSparse> p) {
  using L = Layout<D, kPad>;
  extern __shared__ float4 smem4[];
  const int Br = p.Br, TY = Br / kTM, tid = threadIdx.x, tx = tid % kTX, ty = tid / kTX;
  float* Qs = reinterpret_cast<float*>(smem4);
  float* Ks = Qs + Br * L::kLd;
  float* Ps = Ks;  // P_ij overwrites K_j once S_ij is in registers
  float* Vs = Ks + max(kBc * L::kLd, Br * L::kLdP);

  // Causal: the last Q tiles see the most keys; launching them first shortens the tail.
  const int it = p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int i0 = it * Br, h = blockIdx.y, b = blockIdx.z, hk = h / p.group;
  const int rows = min(Br, p.seq_q - i0);
  const size_t q_off = (size_t(b) * p.heads + h) * p.seq_q + i0;  // first row of Q_i, O_i, LSE_i
  const size_t kv_off = (size_t(b) * (p.heads / p.group) + hk) * p.seq_k;
  const float* K = p.k + kv_off * D;
  const float* V = p.v + kv_off * D;

  const int tc = visible_tiles(p, i0, rows);

  load_tiles<D, 1, kBatch>({TileCopy{Qs, p.q + q_off * D, L::kLd, rows}}, Br, tid, blockDim.x);

  float m[kTM], l[kTM], o[kTM][L::kCols];  // l: this thread's share of the row sum
#pragma unroll
  for (int r = 0; r < kTM; ++r) {
    m[r] = -INFINITY, l[r] = 0.f;
#pragma unroll
    for (int c = 0; c < L::kCols; ++c) o[r][c] = 0.f;
  }

  // The K/V tiles visited: jt = 0 .. tc - 1, or (block-sparse) the tiles of the kept key
  // blocks in this Q tile's mask row, in ascending order up to tc: x counts them, and tile x
  // is the (x % sub)-th tile of block list[x / sub] (a block covers sub = mask_sub tiles).
  int n_tiles = tc;
  [[maybe_unused]] const int32_t* list = nullptr;
  if constexpr (kSparse) {
    const size_t row =
        size_t(b) * p.f.mask_bstride + size_t(h) * p.f.mask_hstride + it / p.f.mask_tiles;
    list = p.f.blk_index + row * p.f.mask_blocks;
    n_tiles = p.f.blk_count[row] * p.f.mask_sub;
  }
  for (int x = 0; x < n_tiles; ++x) {
    int jt = x;
    if constexpr (kSparse) {
      // EXERCISE BEGIN block-skip [medium]
      // Concept: the block-sparse skip: walk the list of kept key blocks, so that a masked
      // tile is never loaded or multiplied, and stop at the causal limit.
      //
      // list[0 .. blk_count) holds the kept key blocks of this Q tile's mask row, ascending;
      // a mask block covers p.f.mask_sub key tiles of kBc. Set jt to the x-th kept tile, and
      // leave the loop once jt reaches tc (the tiles this Q tile may see at all).
      jt = list[x / p.f.mask_sub] * p.f.mask_sub + x % p.f.mask_sub;
      if (jt >= tc) break;  // ascending: every later kept tile is past the causal limit too
      // EXERCISE END
    }
    const int j0 = jt * kBc;
    __syncthreads();  // everyone is done with the last tile's P_ij (in K's buffer) and V_j
    load_tiles<D, 2, kBatch>({TileCopy{Ks, K + size_t(j0) * D, L::kLd, p.seq_k - j0},
                              TileCopy{Vs, V + size_t(j0) * D, D, p.seq_k - j0}},
                             kBc, tid, blockDim.x);
    __syncthreads();  // K_j, V_j (and, the first time, Q_i) are in shared memory

    float s[kTM][kTN] = {};
    abt_tile<D, kTM, kPad, kWide>(s, Qs, ty, TY, Ks, tx);  // S_ij = Q_i K_j^T
    // Only a tile that straddles the diagonal (its last key is past the first row's last
    // visible key i0 + N - M) or the end of the sequence needs the mask.
    const bool mask = j0 + kBc > p.seq_k || (p.causal && j0 + kBc - 1 > i0 + p.seq_k - p.seq_q);
    scale_and_mask(s, p, mask, i0, j0, ty, TY, tx);

    online_update<L>(s, m, l, o);

    // Dropout: Z_ij of this thread's kTM x kTN elements, bit kTN r + c (one Philox call each,
    // in a loop kept rolled: unrolled, the 32 calls in flight cost ~50 registers). A dropped
    // P_ij goes to shared memory as 0; l_i has counted it already.
    [[maybe_unused]] uint32_t kept_bits = 0;
    if constexpr (kDropout) {
#pragma unroll 1
      for (int e = 0; e < kTM * kTN; ++e) {
        const int i = i0 + ty + TY * (e / kTN), j = j0 + tx + kTX * (e % kTN);
        kept_bits |= uint32_t(dropout::keep(p.f.seed, p.f.drop_thresh, b, h, i, j)) << e;
      }
    }

    __syncthreads();  // everyone has read K_j: P_ij may overwrite it
#pragma unroll
    for (int r = 0; r < kTM; ++r)
#pragma unroll
      for (int c = 0; c < kTN; ++c) {
        float pij = s[r][c];
        if constexpr (kDropout)
          if (!((kept_bits >> (kTN * r + c)) & 1u)) pij = 0.f;
        Ps[(ty + TY * r) * L::kLdP + tx + kTX * c] = pij;
      }
    __syncthreads();                                         // P_ij is complete
    pv_tile<D, kTM, kPad, kWide>(o, Ps, ty, TY, Vs, D, tx);  // O_i += P_ij V_j (unnormalised)
  }

  store_rows<D, kDropout>(o, m, l, p, q_off, rows, ty, TY, tx);
}

// ---------------------------------------------------------------------------------------------
// FA1 loop order (the `fa1` variant), for comparison: one block per (head, batch), K/V tiles
// j outer, Q tiles i inner (FlashAttention-1, Algorithm 1). O_i, m_i and l_i live in HBM and
// are read and written back for every K/V tile; O_i is kept normalised after every tile:
//   O_i <- diag(l_new)^-1 (diag(l_i) exp(m_i - m_new) O_i + P_ij V_j),  P_ij = exp(S_ij - m_new).
// Needs fa1_init_kernel (O = 0, m = -inf, l = 0) before and fa1_lse_kernel after.
// Shared memory: [Q_i: Br x kLd, reused for P_ij][K_j: Bc x kLd][V_j: Bc x D].
template <int D>
__global__ void __launch_bounds__(kFwdMaxThreads)
    fa1_forward_kernel(const FwdArgs p, float* __restrict__ m_hbm, float* __restrict__ l_hbm) {
  using L = Layout<D>;
  extern __shared__ float4 smem4[];
  const int Br = p.Br, TY = Br / kTM, tid = threadIdx.x, tx = tid % kTX, ty = tid / kTX;
  float* Qs = reinterpret_cast<float*>(smem4);
  float* Ps = Qs;  // Q_i is reloaded for every (j, i): P_ij may overwrite it
  float* Ks = Qs + max(Br * L::kLd, Br * L::kLdP);
  float* Vs = Ks + kBc * L::kLd;

  const int h = blockIdx.x, b = blockIdx.y, hk = h / p.group;
  const size_t q_head = (size_t(b) * p.heads + h) * p.seq_q;
  const size_t kv_off = (size_t(b) * (p.heads / p.group) + hk) * p.seq_k;
  const int tr = (p.seq_q + Br - 1) / Br, tc = (p.seq_k + kBc - 1) / kBc;

  for (int jt = 0; jt < tc; ++jt) {
    const int j0 = jt * kBc;
    __syncthreads();  // the last (j, i) is done with V_j and P_ij
    load_tiles<D, 2>({TileCopy{Ks, p.k + (kv_off + j0) * D, L::kLd, p.seq_k - j0},
                      TileCopy{Vs, p.v + (kv_off + j0) * D, D, p.seq_k - j0}},
                     kBc, tid, blockDim.x);
    // Causal: rows i < j0 - (N - M) see no key of this tile; their Q tiles are skipped.
    const int it0 = p.causal ? max(0, j0 - (p.seq_k - p.seq_q)) / Br : 0;
    for (int it = it0; it < tr; ++it) {
      const int i0 = it * Br, rows = min(Br, p.seq_q - i0);
      __syncthreads();  // the last i is done with P_ij (in Q's buffer)
      load_tiles<D, 1>({TileCopy{Qs, p.q + (q_head + i0) * D, L::kLd, rows}}, Br, tid, blockDim.x);
      float m[kTM], l[kTM], o[kTM][L::kCols];
      // EXERCISE BEGIN fa1-state-in [medium]
      // Concept: FA1's loop order: with K/V tiles outer, a Q tile's running O_i, m_i and l_i
      // cannot stay on chip between its K/V tiles, so every (j, i) reads them back from HBM.
      //
      // Fill this thread's kTM rows (ty + TY*r of the tile, rows q_head + i0 + ty + TY*r of
      // the problem) of m, l and o (columns 2*tx + 32*c and 2*tx + 32*c + 1, c < D/32) with
      // what the previous K/V tile left in m_hbm, l_hbm and p.o (fa1_init_kernel's values
      // before the first). Trap: rows past `rows` are outside the problem: read nothing there,
      // and give them the values of a row that has seen no key.
#pragma unroll
      for (int r = 0; r < kTM; ++r) {
        const int i = ty + TY * r;
        const size_t row = q_head + i0 + i;
        m[r] = i < rows ? m_hbm[row] : -INFINITY;
        l[r] = i < rows ? l_hbm[row] : 0.f;
#pragma unroll
        for (int c = 0; c < D / 32; ++c) {
          const float2 x = i < rows ? ld2(p.o + row * D + 2 * tx + 32 * c) : make_float2(0.f, 0.f);
          o[r][2 * c] = x.x, o[r][2 * c + 1] = x.y;
        }
      }
      // EXERCISE END
      __syncthreads();  // Q_i (and K_j, V_j) are in shared memory

      float s[kTM][kTN] = {};
      abt_tile<D, kTM>(s, Qs, ty, TY, Ks, tx);
      const bool mask = j0 + kBc > p.seq_k || (p.causal && j0 + kBc - 1 > i0 + p.seq_k - p.seq_q);
      scale_and_mask(s, p, mask, i0, j0, ty, TY, tx);
      // EXERCISE BEGIN fa1-rescale [hard]
      // Concept: FA1's update keeps O_i normalised in HBM after every K/V tile, so it needs the
      // row's whole sum at once and must undo the last normalisation before rescaling; FA2
      // keeps O unnormalised on chip and divides once, at the end.
      //
      // For each of this thread's rows r: s[r][..] holds its scores of this tile (-inf where
      // masked), m[r] and l[r] the row's max and full sum over the tiles so far, o[r][..] the
      // normalised O from HBM. Afterwards s holds the unnormalised weights for P V (taken
      // against the new max), m[r] and l[r] describe every tile so far, and o[r][..] is scaled
      // so that adding P V and then dividing by l[r] (as the code after this does) gives the
      // new normalised O. row_max and row_sum combine the row's 16 threads. Trap: a row with
      // only masked keys so far (m = -inf).
#pragma unroll
      for (int r = 0; r < kTM; ++r) {
        float mx = s[r][0];
#pragma unroll
        for (int b = 1; b < kTN; ++b) mx = fmaxf(mx, s[r][b]);
        const float m_new = fmaxf(m[r], row_max(mx));
        const float shift = m_new == -INFINITY ? 0.f : m_new;
        const float alpha = expf(m[r] - shift);
        float sum = 0.f;
#pragma unroll
        for (int b = 0; b < kTN; ++b) {
          s[r][b] = expf(s[r][b] - shift);
          sum += s[r][b];
        }
        const float l_new = alpha * l[r] + row_sum(sum);  // FA1 needs the whole row sum now
        const float undo = alpha * l[r];  // the stored O_i was divided by l_i: undo, rescale
#pragma unroll
        for (int c = 0; c < L::kCols; ++c) o[r][c] *= undo;
        m[r] = m_new, l[r] = l_new;
      }
      // EXERCISE END
      __syncthreads();  // everyone has read Q_i: P_ij may overwrite it
#pragma unroll
      for (int r = 0; r < kTM; ++r)
#pragma unroll
        for (int b = 0; b < kTN; ++b) Ps[(ty + TY * r) * L::kLdP + tx + kTX * b] = s[r][b];
      __syncthreads();
      pv_tile<D, kTM>(o, Ps, ty, TY, Vs, D, tx);

      // Normalise and write O_i, m_i, l_i back to HBM.
#pragma unroll
      for (int r = 0; r < kTM; ++r) {
        const int i = ty + TY * r;
        if (i >= rows) continue;
        const size_t row = q_head + i0 + i;
        const float inv_l = l[r] > 0.f ? 1.f / l[r] : 0.f;
#pragma unroll
        for (int c = 0; c < D / 32; ++c)
          *reinterpret_cast<float2*>(p.o + row * D + 2 * tx + 32 * c) =
              make_float2(o[r][2 * c] * inv_l, o[r][2 * c + 1] * inv_l);
        if (tx == 0) m_hbm[row] = m[r], l_hbm[row] = l[r];
      }
    }
  }
}

// FA1's initialisation in HBM: O = 0, m = -inf, l = 0 (rows no K/V tile reaches keep them).
__global__ void fa1_init_kernel(float* __restrict__ o, float* __restrict__ m, float* __restrict__ l,
                                int64_t rows, int d) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t x = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; x < rows * d; x += stride) {
    o[x] = 0.f;
    if (x < rows) m[x] = -INFINITY, l[x] = 0.f;
  }
}

// LSE_i = m_i + log l_i (and its residual), or -inf for a row with no visible key (l_i = 0).
__global__ void fa1_lse_kernel(const float* __restrict__ m, const float* __restrict__ l,
                               float* __restrict__ lse, float* __restrict__ lse_lo, int64_t rows) {
  const int64_t x = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (x < rows) store_lse(lse + x, lse_lo + x, m[x], l[x]);
}

// ---------------------------------------------------------------------------------------------
// The launches (host code), for host.cu and for any other caller, e.g. a PyTorch extension.

// Shared memory of a forward block in bytes: [Q_i | K_j or P_ij | V_j] for FA2, [Q_i or P_ij |
// K_j | V_j] for FA1; pad: Layout's pads (off in '+micro-tiles' and '+16-byte-reads').
constexpr size_t fwd_smem_bytes(int d, int br, bool fa1 = false, bool pad = true) {
  const int ld = d + (pad ? kRowPads.qk : 0), ldp = kBc + (pad ? kRowPads.p : 0), q = br * ld,
            k = kBc * ld, p = br * ldp;
  const int floats = fa1 ? (q > p ? q : p) + k + kBc * d : q + (k > p ? k : p) + kBc * d;
  return size_t(floats) * sizeof(float);
}

template <int D, bool kDropout, bool kSparse, bool kPad = true, int kBatch = 4, bool kWide = true>
void launch_forward_as(const FwdParams& p, cudaStream_t stream) {
  static std::atomic<uint64_t> done{0};  // devices this kernel may use all shared memory on
  const auto kernel = forward_kernel<D, kDropout, kSparse, kPad, kBatch, kWide>;
  if (allow_device_smem(reinterpret_cast<const void*>(kernel), done) != cudaSuccess) return;
  const dim3 grid(unsigned((p.seq_q + p.Br - 1) / p.Br), unsigned(p.heads), unsigned(p.batch));
  const unsigned threads = unsigned(kTX * p.Br / kTM);
  const size_t smem = fwd_smem_bytes(D, p.Br, false, kPad);
  if constexpr (kDropout || kSparse) {
    WithFeatures<FwdArgs> a{};
    static_cast<FwdArgs&>(a) = p;
    a.f = feature_args(p, true, p.Br, kBc);
    kernel<<<grid, threads, smem, stream>>>(a);
  } else {
    kernel<<<grid, threads, smem, stream>>>(p);  // the FwdArgs part of p
  }
}

// The FA2 forward of head dim D on `stream`: grid, threads and shared memory from p (Br = p.Br,
// a multiple of 16 up to 128; Bc = 64), the kernel from its features (dropout_p > 0,
// blk_count). Launch errors are left for the caller's cudaGetLastError().
template <int D>
void launch_forward(const FwdParams& p, cudaStream_t stream) {
  // dropout_p = 0 is no dropout at all: the kernel without it, bit for bit.
  const bool drop = p.dropout_p > 0, sparse = p.blk_count != nullptr;
  if (drop && sparse) return launch_forward_as<D, true, true>(p, stream);
  if (drop) return launch_forward_as<D, true, false>(p, stream);
  if (sparse) return launch_forward_as<D, false, true>(p, stream);
  launch_forward_as<D, false, false>(p, stream);
}

}  // namespace ladder::step05
