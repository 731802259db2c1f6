// Step 05 — shared-memory FlashAttention-2 (CUDA, fp32).
// Adds: a block per Q tile, K/V tiles staged in shared memory (FA2 loop order); register
// micro-tiles of S and O per thread; row max and sum by warp shuffles, one division by l at the
// end; causal: tiles past the diagonal skipped, the mask only on straddling tiles; Br from the
// FlashAttention block-size rule; FA1 loop order as a variant; FA2 backward: D pre-pass, a block
// per K/V tile, dQ by fp32 atomics; block-sparse masks: masked tiles skipped, K/V never loaded;
// dropout regenerated per element (Philox), never stored.
//
// SPDX-License-Identifier: MIT (LICENSE). Follows the published structure of
// FlashAttention-2 (T. Dao, 2023, arXiv:2307.08691, Algorithm 1) and, for the fa1 variant's loop
// order, FlashAttention (Dao, Fu, Ermon, Rudra, Re, 2022, arXiv:2205.14135).
//
// Where it sits: step 04 gave each query row its own thread and streamed every K and V row
// from HBM (through L1/L2) for every query row. Here a block of threads shares the work of
// Br query rows, so each K/V row fetched from HBM serves Br rows: FlashAttention-2's tiling
// (Dao, 2023), in plain fp32 FMAs. row_per_thread.cuh is its first, simplest form (one thread
// per query row, the `row` variant); shared_memory_fa2_forward.cuh is where the step's variants
// take it, one idea at a time (host.cu lists them; the note measures each). In the papers'
// names, with Tr = ceil(M / Br) Q tiles and Tc = ceil(N / Bc) K/V tiles:
//   forward (shared_memory_fa2_forward.cuh), one block per (Q tile i, head, batch):
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
//   backward (shared_memory_fa2_backward.cuh): D_i = rowsum(dO_i o O_i); one block per (K/V
//     tile j, K/V head, batch) keeps dK_j, dV_j in registers and walks the Q tiles of every
//     query head of its group: P_ij recomputed from LSE_i, dV_j += P_ij^T dO_i,
//     dP_ij = dO_i V_j^T, dS_ij = P_ij o (dP_ij - D_i), dK_j += scale dS_ij^T Q_i,
//     dQ_i += scale dS_ij K_j (atomics).
// Block sizes (host.cu, the descriptor's tiles()): the FlashAttention rule for an on-chip memory of
// M_sram floats, Bc = ceil(M_sram / 4d), Br = min(Bc, d), capped by what the kernel's thread layout
// compiles (Bc = 64) and by measurement (Br). notes/05_shared_memory_fa2.md works the rule
// through for the H100, and has the cost model, the pitfalls and the exercises.
// What the next step (06) fixes: fp32 FMAs reach at most ~51 TFLOP/s; tensor cores (mma.sync
// in fp16/bf16) are ~12x faster, and with them come ldmatrix, swizzled shared memory,
// cp.async pipelining and P kept in registers.
// Block-sparse masks and dropout (FA2 order only; template flags kSparse and kDropout, so the
// kernels without them are unchanged):
//   block-sparse: the j loop walks the host's list of the kept key blocks of this Q tile's
//     mask row (kv_block_lists, built once outside the timed region, as FlexAttention builds
//     its BlockMask): a masked K/V tile is never loaded; the backward walks the kept query
//     blocks of its key block (q_block_lists) the same way.
//   dropout: Z_ij from common/dropout.hpp, one Philox call per element (dropout::keep), applied
//     to P_ij after the row sum (l sums the undropped P) on its way to shared memory; O is
//     divided by l and by 1 - p once, at the end. LSE is unaffected.
// This file: the thread layout and the tile machinery of both passes, and what their launches
// share (the features' arguments, the shared-memory opt-in). The forward kernels (FA2 and FA1
// loop orders) are shared_memory_fa2_forward.cuh, the backward shared_memory_fa2_backward.cuh;
// host.cu holds the descriptor, the tile choice and the launches.
//
// Thread layout, shared by every kernel of this step. A tile S_ij = Q_i K_j^T (Br x Bc) is
// computed by a grid of kTX x TY threads; thread (ty, tx) owns a kTM x kTN micro-tile of it:
//   query rows  ty + TY*a  (a < kTM)      keys  tx + kTX*b  (b < kTN)
// and the same rows of O_i, columns 2*tx + 32*c and 2*tx + 32*c + 1 (c < d/32).
// The kTX = 16 threads that share a row are one half warp, so a row's max and sum are four
// shuffles; interleaving rows and keys (instead of giving a thread a contiguous block) is what
// makes the shared-memory reads below conflict-free (see Layout).
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "dropout.hpp"
#include "exercise.hpp"
#include "row_per_thread.cuh"

namespace ladder::step05 {

constexpr int kTX = 16;           // threads across a row of S: a half warp
constexpr int kTN = 4;            // keys per thread
constexpr int kBc = kTX * kTN;    // keys per K/V tile: 64, compiled into the layout
constexpr int kTM = 8;            // query rows per thread in the forward
constexpr int kBrStep = 2 * kTM;  // Br granularity: a warp holds two row groups (ty even, odd)
constexpr int kBrMax = 128;       // forward: threads = kTX * Br / kTM = 2 * Br <= 256
constexpr int kFwdMaxThreads = kTX * kBrMax / kTM;
constexpr unsigned kFull = 0xffffffffu;

// Shared-memory bank conflicts, counted at compile time: Layout's static_asserts below reject
// a row stride that conflicts (the harness checks results only, and a conflicting layout is
// correct, only slower). Shared memory is 32 banks of 4-byte words, word w in bank w % 32; it
// serves a warp's access in wavefronts of at most one word per bank, and lanes that name the
// same word share it (a broadcast). An access is conflict-free when its busiest bank holds no
// more distinct words than the fewest wavefronts those words need, ceil(words / 32). A 16-byte
// access may be served a quarter warp (8 lanes) at a time, so each quarter must be too.
// WarpAccess: lane (g, tx) of a warp (row group g = lane / 16, tx = lane % 16: the thread layout
// above) touches `words` consecutive words from row g * row_g + tx * row_tx, column tx * col_tx,
// of a tile with row stride ld. The access's other rows and columns (the loops' a, b, c, k)
// shift every lane alike: the same banks, rotated, and the same conflicts.
struct WarpAccess {
  int row_g, row_tx, col_tx, words;
};
constexpr bool conflict_free_lanes(WarpAccess a, int ld, int first, int lanes) {
  int word[32 * 4] = {};  // the distinct words touched
  int n = 0;
  for (int lane = first; lane < first + lanes; ++lane)
    for (int w = 0; w < a.words; ++w) {
      const int g = lane / kTX, tx = lane % kTX;
      const int x = (g * a.row_g + tx * a.row_tx) * ld + tx * a.col_tx + w;
      bool seen = false;
      for (int i = 0; i < n; ++i) seen = seen || word[i] == x;
      if (!seen) word[n++] = x;
    }
  for (int bank = 0; bank < 32; ++bank) {
    int in_bank = 0;
    for (int i = 0; i < n; ++i) in_bank += word[i] % 32 == bank;
    if (in_bank > (n + 31) / 32) return false;
  }
  return true;
}
constexpr bool conflict_free(WarpAccess a, int ld) {
  bool ok = conflict_free_lanes(a, ld, 0, 32);
  for (int q = 0; a.words == 4 && q < 32; q += 8) ok = ok && conflict_free_lanes(a, ld, q, 8);
  return ok;
}
// The accesses whose banks the row strides decide (the others take consecutive words of one
// row or, in the tile copies, 128 consecutive bytes per quarter warp). 16 bytes of rows R and
// R+1, the same for every lane of a row group: Q_i (dO_i) in abt_tile, P_ij (dS_ij) in pv_tile.
// 16 bytes of rows tx + 16b, the same for both row groups: K_j (V_j) in abt_tile. 4 bytes, keys
// tx + 16c of rows R and R+1: the writes of P_ij (dS_ij).
constexpr WarpAccess kRowPairRead{1, 0, 0, 4}, kRowsRead{0, 1, 0, 4}, kRowPairWrite{1, 0, 1, 1};

// Layout's row pads, in floats: qk for the rows of Q_i and K_j (and, in the backward, dO_i and
// V_j), p for the rows of P_ij (and dS_ij).
struct RowPads {
  int qk, p;
};
constexpr RowPads row_pads() {
  // EXERCISE BEGIN padding [medium]
  // Concept: padding against bank conflicts: rows a multiple of 32 floats long all start in
  // bank 0, so rows that a warp reads at once queue on the same banks; a pad spreads them.
  //
  // Return the pads, in floats: qk for the rows of Q_i and K_j (row stride d + qk, where d is
  // a multiple of 32) and p for the rows of P_ij (row stride kBc + p = 64 + p). Layout's
  // static_asserts simulate the warp accesses of abt_tile, pv_tile and the P_ij writes
  // (conflict_free) and name the one that collides. Which rows does one warp access at once
  // in each? Keep the pads small: shared memory limits the blocks per SM. Why must a pad be a
  // multiple of 4 floats?
  RowPads pads{};
  // Q_i, K_j: 4 floats start consecutive rows 4 banks apart, so the 16-byte reads of 8
  // consecutive rows cover all 32 banks once (d is a multiple of 32: without the pad every row
  // would start in bank 0), and rows R and R+1 never share a bank.
  pads.qk = 4;
  // P_ij: 16 floats put the rows of the two row groups of a warp (R and R+1) 16 banks apart,
  // so their scalar writes and their 16-byte reads never collide.
  pads.p = 16;
  return pads;
  // EXERCISE END
}
// The pads, evaluated once, here: while the region above is blank (LADDER_TODO), row_pads() is
// no constant expression, and the build stops on this line.
constexpr RowPads kRowPads = row_pads();

// Shared-memory row strides (floats): d + qk for Q_i and K_j, kBc + p for P_ij (row_pads). V_j
// rows are read whole and in order by 16 lanes (the other half warp reads the same addresses:
// a broadcast), so they need no pad in the forward; the backward reads V_j like K_j and pads it
// the same way. kPad = false (the '+micro-tiles' and '+16-byte-reads' variants) leaves every
// row unpadded, to measure what the pads buy. The static_asserts hold the padded rows of every
// d built to conflict-free reads and writes (conflict_free).
template <int D, bool kPad = true>
struct Layout {
  static_assert(D % 32 == 0, "d must be a multiple of 32");
  static constexpr int kLd = D + (kPad ? kRowPads.qk : 0);    // Q_i, K_j (backward: dO_i, V_j)
  static constexpr int kLdP = kBc + (kPad ? kRowPads.p : 0);  // P_ij, dS_ij
  static constexpr int kCols = D / 16;                        // O_i columns per thread
  static_assert(kLd % 4 == 0 && kLdP % 4 == 0,
                "Layout: the 16-byte reads (ld4) need every row to start on 16 bytes: the row "
                "strides kLd and kLdP must be multiples of 4 floats");
  static_assert(!kPad || conflict_free(kRowsRead, kLd),
                "Layout::kLd: bank conflict reading K_j in abt_tile: the 16 lanes of a row group "
                "read 16 bytes of 16 different rows (keys tx + 16b) at once, and with this row "
                "stride some of those rows share banks");
  static_assert(!kPad || conflict_free(kRowPairRead, kLd),
                "Layout::kLd: bank conflict reading Q_i in abt_tile: the two row groups of a warp "
                "read 16 bytes of rows R and R+1 at once, and with this row stride the two rows "
                "share banks");
  static_assert(!kPad || conflict_free(kRowPairWrite, kLdP),
                "Layout::kLdP: bank conflict writing P_ij: the two row groups of a warp write keys "
                "tx + 16c of rows R and R+1 (4 bytes a lane) at once, and with this row stride "
                "the two rows share banks");
  static_assert(!kPad || conflict_free(kRowPairRead, kLdP),
                "Layout::kLdP: bank conflict reading P_ij in pv_tile: the two row groups of a warp "
                "read 16 bytes of rows R and R+1 at once, and with this row stride the two rows "
                "share banks");
};

__device__ __forceinline__ float4 ld4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ float2 ld2(const float* p) {
  return *reinterpret_cast<const float2*>(p);
}
__device__ __forceinline__ float lane_of(const float4& v,
                                         int u) {  // u is a constant after unrolling
  return u == 0 ? v.x : u == 1 ? v.y : u == 2 ? v.z : v.w;
}
// W consecutive floats in one shared-memory read: W = 4, 16 bytes (LDS.128); W = 1, 4 bytes
// (LDS), in .x. abt_tile and pv_tile read with W = 4 unless kWide is off.
template <int W>
__device__ __forceinline__ float4 ldw(const float* p) {
  static_assert(W == 4 || W == 1, "reads of 16 or 4 bytes");
  if constexpr (W == 4)
    return ld4(p);
  else
    return make_float4(*p, 0.f, 0.f, 0.f);
}

// Max and sum over the 16 threads that share a row (a half warp; xor offsets < 16 stay in it).
__device__ __forceinline__ float row_max(float x) {
  for (int o = kTX / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(kFull, x, o));
  return x;
}
__device__ __forceinline__ float row_sum(float x) {
  for (int o = kTX / 2; o > 0; o /= 2) x += __shfl_xor_sync(kFull, x, o);
  return x;
}

// One tile copy: `rows` rows of D floats, row-major in global memory at `src`, into shared
// memory at `dst` with row stride `ld`; rows at or past `valid` are zero-filled (a zero K or V
// row is harmless once its score is masked; garbage could be NaN, and 0 * NaN = NaN).
struct TileCopy {
  float* dst;
  const float* src;
  int ld, valid;
};

// All threads copy kCopies tiles of the same shape together, 16 bytes per load (coalesced:
// consecutive threads take consecutive float4s of a row). Each thread first issues kBatch
// loads per tile, then stores them, so kCopies * kBatch loads are in flight at once instead
// of one round trip to HBM per float4 (step 06 does this with cp.async instead). kBatch = 1
// (the variants before 'fa2'): each load is stored before the next is issued.
template <int D, int kCopies, int kBatch = 4>
__device__ __forceinline__ void load_tiles(const TileCopy (&c)[kCopies], int rows, int tid,
                                           int nthreads) {
  constexpr int kVec = D / 4;
  const int total = rows * kVec;
  for (int base = tid; base < total; base += kBatch * nthreads) {
    float4 r[kCopies][kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int idx = base + u * nthreads, row = idx / kVec, col = idx % kVec * 4;
#pragma unroll
      for (int t = 0; t < kCopies; ++t)
        r[t][u] = idx < total && row < c[t].valid
                      ? __ldg(reinterpret_cast<const float4*>(c[t].src + size_t(row) * D + col))
                      : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int idx = base + u * nthreads, row = idx / kVec, col = idx % kVec * 4;
      if (idx < total)
#pragma unroll
        for (int t = 0; t < kCopies; ++t)
          *reinterpret_cast<float4*>(c[t].dst + row * c[t].ld + col) = r[t][u];
    }
  }
}

// acc += A B^T on a TM x kTN micro-tile: rows r0 + rstep*a of A, rows (keys) tx + kTX*b of B,
// both Layout<D>::kLd-strided in shared memory. Each step over k reads kW floats of each of the
// TM + kTN rows, one read each, and does kW * TM * kTN FMAs: kW = 4 (kWide: 16-byte reads), or
// kW = 1 (the '+micro-tiles' variant: 4 times the reads for the same FMAs). Every dot product
// is summed over k in order, so both give the same result, bit for bit.
// S_ij = Q_i K_j^T in the forward; S_ij and dP_ij = dO_i V_j^T in the backward.
template <int D, int TM, bool kPad = true, bool kWide = true>
__device__ __forceinline__ void abt_tile(float (&acc)[TM][kTN], const float* A, int r0, int rstep,
                                         const float* B, int tx) {
  constexpr int ld = Layout<D, kPad>::kLd, kW = kWide ? 4 : 1;
  const float* a_rows = A + r0 * ld;
  const float* b_rows = B + tx * ld;
  // Not unrolled: one step is already kW * TM * kTN independent FMAs. Unrolling by 4 lets
  // ptxas hoist the next steps' loads into registers: 190 instead of 128 at d = 64, which
  // halves the blocks that fit on an SM. At kW = 1 it would also let the compiler merge the 4
  // floats of a row into one 16-byte read: the very thing kWide measures.
#pragma unroll 1
  for (int k = 0; k < D; k += kW) {
    // EXERCISE BEGIN micro-tile [medium]
    // Concept: the register micro-tile: a thread computes a TM x kTN block of S, so each
    // value it reads from shared memory feeds several FMAs instead of one.
    //
    // This step over k adds, for every a < TM and b < kTN, the products of columns
    // k .. k + kW - 1 of A's row r0 + rstep*a and B's row tx + kTX*b to acc[a][b], in order of
    // k (the result must match the other variants bit for bit). ldw<kW>(ptr) reads kW floats
    // (a float4, kW = 4, or one float in .x, kW = 1) and lane_of(v, u) picks float u of it. The
    // trap is the reads: read each of the TM + kTN rows once per step into registers, then
    // reuse them, rather than reading an operand once per product.
    float4 bv[kTN];
#pragma unroll
    for (int b = 0; b < kTN; ++b) bv[b] = ldw<kW>(b_rows + b * kTX * ld + k);
#pragma unroll
    for (int a = 0; a < TM; ++a) {
      const float4 av = ldw<kW>(a_rows + a * rstep * ld + k);
#pragma unroll
      for (int b = 0; b < kTN; ++b)
#pragma unroll
        for (int u = 0; u < kW; ++u) acc[a][b] = fmaf(lane_of(av, u), lane_of(bv[b], u), acc[a][b]);
    }
    // EXERCISE END
  }
}

// acc += P X on a TM x (D/16) micro-tile: rows r0 + rstep*a of P (kBc columns, kLdP-strided),
// columns 2*tx + 32*c (+1) of X (kBc rows, ldx-strided). Per kW keys (kW as in abt_tile): TM
// reads of kW floats of P and kW * D/32 float2s of X for kW * TM * D/16 FMAs; summed over the
// keys in order. O_i += P_ij V_j in the forward; dQ_i += dS_ij K_j in the backward.
template <int D, int TM, bool kPad = true, bool kWide = true>
__device__ __forceinline__ void pv_tile(float (&acc)[TM][D / 16], const float* P, int r0, int rstep,
                                        const float* X, int ldx, int tx) {
  constexpr int ldp = Layout<D, kPad>::kLdP, kW = kWide ? 4 : 1;
  const float* p_rows = P + r0 * ldp;
  const float* x_cols = X + 2 * tx;
#pragma unroll 1  // as in abt_tile: registers, not instructions, limit the blocks per SM
  for (int j = 0; j < kBc; j += kW) {
    float4 pv[TM];
#pragma unroll
    for (int a = 0; a < TM; ++a) pv[a] = ldw<kW>(p_rows + a * rstep * ldp + j);
#pragma unroll
    for (int u = 0; u < kW; ++u)
#pragma unroll
      for (int c = 0; c < D / 32; ++c) {
        const float2 x = ld2(x_cols + (j + u) * ldx + 32 * c);
#pragma unroll
        for (int a = 0; a < TM; ++a) {
          const float p = lane_of(pv[a], u);
          acc[a][2 * c] = fmaf(p, x.x, acc[a][2 * c]);
          acc[a][2 * c + 1] = fmaf(p, x.y, acc[a][2 * c + 1]);
        }
      }
  }
}

// ---------------------------------------------------------------------------------------------
// What both passes' launches share: the features (block-sparse mask, dropout) as the kernels
// take them, and the opt-in to more than 48 KiB of shared memory.

// The features as the kernels use them, computed on the host from the params (feature_args):
// the mask row of (b, h, tile) is b * mask_bstride + h * mask_hstride + tile / mask_tiles (0
// strides where the mask is shared); a kept block covers mask_sub tiles of the loop's
// dimension; its list holds up to mask_blocks entries. Dropout: the seed, the keep threshold
// dropout::threshold(p) and 1 / (1 - p).
struct Features {
  const int32_t* blk_count;
  const int32_t* blk_index;
  int mask_bstride, mask_hstride, mask_tiles, mask_sub, mask_blocks;
  uint64_t seed;
  uint32_t drop_thresh;
  float drop_scale;
};
template <class Args>
struct WithFeatures : Args {
  Features f;
};

// The features as the kernels use them (Features): the mask row strides (0 where shared), the
// loop's tiles per mask block, the Philox key, the threshold and 1 / (1 - p). `lists_per_q`:
// the forward's lists (rows per query block, entries over key blocks) or the backward's.
template <class Params>
Features feature_args(const Params& p, bool lists_per_q, int br, int bc) {
  Features f{};
  if (p.blk_count) {
    const int row_blocks = lists_per_q ? p.mask_q_blocks : p.mask_k_blocks;
    f.blk_count = p.blk_count, f.blk_index = p.blk_index;
    f.mask_hstride = p.mask_heads == 1 ? 0 : row_blocks;
    f.mask_bstride = p.mask_batch == 1 ? 0 : p.mask_heads * row_blocks;
    f.mask_tiles = lists_per_q ? p.mask_block_q / br : p.mask_block_k / bc;
    f.mask_sub = lists_per_q ? p.mask_block_k / bc : p.mask_block_q / br;
    f.mask_blocks = lists_per_q ? p.mask_k_blocks : p.mask_q_blocks;
  }
  if (p.dropout_p > 0) {
    f.seed = p.dropout_seed;
    f.drop_thresh = dropout::threshold(p.dropout_p);
    f.drop_scale = float(1.0 / (1.0 - p.dropout_p));
  }
  return f;
}

// Dynamic shared memory above 48 KiB needs a kernel's opt-in. The launch functions give it,
// for as much as the device allows, once per kernel and device (`done`: one bit per device),
// so that a caller never has to. Errors are returned, and left for cudaGetLastError().
inline cudaError_t allow_device_smem(const void* kernel, std::atomic<uint64_t>& done) {
  int dev = 0, max_bytes = 0;
  cudaError_t e = cudaGetDevice(&dev);
  const uint64_t bit = dev < 64 ? uint64_t(1) << dev : 0;
  if (e != cudaSuccess || (done.load() & bit) != 0) return e;
  e = cudaDeviceGetAttribute(&max_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_bytes);
  if (e == cudaSuccess) done.fetch_or(bit);
  return e;
}

}  // namespace ladder::step05
