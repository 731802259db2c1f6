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
// This file holds the forward kernel; tensor_core_fa2_backward.cuh the backward's three
// kernels; mma.cuh the fragment vocabulary; host.cu the descriptor, the variants and the
// launches.
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

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "dropout.hpp"
#include "exercise.hpp"
#include "mma.cuh"

namespace ladder::step06 {

// The forward's arguments, as its dense kernel takes them: exactly the fields it always took.
// nvcc treats a kernel parameter struct of over 128 bytes as memory, reading each field where
// it is used (ld.param inside the loop) instead of once at the top; at 255 registers the code
// that results spills (ptxas -v, d = 64: 32 bytes with a 136-byte struct, none at 128 bytes).
struct FwdArgs {
  const void* q;                      // [B, H, M, d] in T
  const void* k;                      // [B, Hkv, N, d]
  const void* v;                      // [B, Hkv, N, d]
  void* o;                            // [B, H, M, d]
  float* lse;                         // [B, H, M], natural log
  int batch, heads, heads_kv, group;  // group = heads / heads_kv query heads per K/V head
  int seq_q, seq_k;
  float scale;       // > 0: the host folds a negative scale into Q (exact)
  float scale_log2;  // scale * log2(e)
  bool causal;
};

// What a caller fills in to run the forward (FwdKernel::launch below): the arguments above and
// the features. Zero-initialised (FwdParams fp{}), there is neither block mask nor dropout and
// the dense kernel runs.
struct FwdParams : FwdArgs {
  // Block-sparse mask (blk_count null: dense), as the host's kv_block_lists (common/
  // block_mask.hpp): row r = (mask batch * mask_heads + mask head) * mask_q_blocks + query
  // block keeps blk_count[r] key blocks, ascending, at blk_index[r * mask_k_blocks ...].
  // mask_batch, mask_heads: 1 shares a row with every batch / query head. The tiles must
  // divide the mask block: Br | mask_block_q, Bc | mask_block_k.
  const int32_t* blk_count;
  const int32_t* blk_index;
  int mask_batch, mask_heads, mask_q_blocks, mask_k_blocks, mask_block_q, mask_block_k;
  // Dropout (dropout_p = 0: none): the rate in [0, 1) and the Philox key.
  double dropout_p;
  uint64_t dropout_seed;
};

// The kernels with a block mask or dropout: FwdArgs' fields and the features' in the form the
// kernel uses, ordered to fit in 128 bytes (after FwdArgs' own padding they would not).
struct FwdFeatureArgs {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  const int32_t* blk_count;  // the CSR lists, as in FwdParams
  const int32_t* blk_index;
  int batch, heads, heads_kv, group;
  int seq_q, seq_k;
  // This Q tile's mask row: b * mask_bstride + h * mask_hstride + (Q tile) / mask_q_tiles
  // (0 strides where the mask is shared); mask_k_tiles K/V tiles per mask key block.
  int mask_bstride, mask_hstride, mask_q_tiles, mask_k_tiles, mask_k_blocks;
  float scale, scale_log2;
  // Dropout's Philox key (the seed's two words) and keep threshold dropout::threshold(p);
  // drop_scale = 1 / (1 - p). Kernel parameters: uniform, so the key schedule stays in the
  // uniform datapath.
  uint32_t seed_lo, seed_hi, drop_thresh;
  float drop_scale;
  bool causal;
};
static_assert(sizeof(FwdArgs) <= 128 && sizeof(FwdFeatureArgs) <= 128, "see FwdArgs");
template <bool kDropout, bool kSparse>
using FwdArgsFor = std::conditional_t<kDropout || kSparse, FwdFeatureArgs, FwdArgs>;

// One bit per technique; a variant is the full kernel with some bits cleared.
enum FwdFlag : int {
  kSwizzle = 1,       // XOR-swizzled shared tiles (else plain row-major)
  kCpAsync = 2,       // cp.async into two K/V stages (else synchronous loads, one stage)
  kLdmatrix = 4,      // ldmatrix(.trans) fragments (else 32- and 16-bit shared loads)
  kPInRegisters = 8,  // P reused from the S registers (else written to and read from smem)
  kStagedStore = 16,  // O through shared memory, 16-byte stores (else 4-byte fragment stores)
  kFwdAll = 31,
};

// Tile shape per head dim. The constraints: 255 registers per thread hold the fp32 O_i
// (kSlices * d / 2 per thread) and S (kSlices * Bc / 2); shared memory holds Q_i and two
// stages of K_j, V_j. Two m16 slices per warp let every K/V fragment read from shared
// memory feed two mma instructions, which keeps ldmatrix traffic under the tensor cores'
// appetite; d = 256 has no registers for that and uses 8 warps of one slice.
// kQKUnroll: how many k16 steps of S = Q_i K_j^T are unrolled. Fully, except at d = 128,
// where ptxas, given all 8 steps or 4, hoists so many fragment loads that 255 registers spill
// (32 or 36 bytes, stored and reloaded on every tile). With 2 it spills nothing and still
// issues the second step's ldmatrix under the first step's mma; each pass recomputes the
// swizzled addresses, a few integer instructions per k-step (1270 instructions per tile, 1251
// fully rolled, which waits for every step's loads before its first mma).
template <int D>
struct FwdTiles;
template <>
struct FwdTiles<32> {
  static constexpr int kWarps = 4, kSlices = 2, kBc = 128, kQKUnroll = 2;
};
template <>
struct FwdTiles<64> {
  static constexpr int kWarps = 4, kSlices = 2, kBc = 128, kQKUnroll = 4;
};
template <>
struct FwdTiles<96> {
  static constexpr int kWarps = 4, kSlices = 2, kBc = 64, kQKUnroll = 6;
};
template <>
struct FwdTiles<128> {
  static constexpr int kWarps = 4, kSlices = 2, kBc = 64, kQKUnroll = 2;
};
template <>
struct FwdTiles<256> {
  static constexpr int kWarps = 8, kSlices = 1, kBc = 64, kQKUnroll = 16;
};

template <class T, int D, int kFlags>
struct FwdConfig {
  static constexpr int kD = D;
  static constexpr int kWarps = FwdTiles<D>::kWarps, kSlices = FwdTiles<D>::kSlices;
  static constexpr int kBr = kWarps * 16 * kSlices, kBc = FwdTiles<D>::kBc;
  static constexpr int kQKUnroll = FwdTiles<D>::kQKUnroll;
  static constexpr int kThreads = kWarps * 32;
  static constexpr bool kSwz = kFlags & kSwizzle, kAsync = kFlags & kCpAsync,
                        kLdsm = kFlags & kLdmatrix, kPRegs = kFlags & kPInRegisters,
                        kStage = kFlags & kStagedStore;
  static constexpr int kStages = kAsync ? 2 : 1;
  using QKV = SmemLayout<D, kSwz>;   // Q_i, K_j, V_j (and O_i on its way out): rows of d
  using PL = SmemLayout<kBc, kSwz>;  // P_ij, only without kPInRegisters: rows of Bc
  static constexpr int kSmemElems = kBr * D + 2 * kStages * kBc * D + (kPRegs ? 0 : kBr * kBc);
  static constexpr int kSmemBytes = kSmemElems * int(sizeof(T));
  static_assert(D % 16 == 0 && kBc % 16 == 0 && (D / 8) % 2 == 0, "mma k16 steps, n8 pairs");
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an H100 block can have");
};

// ---- fragment loads from shared tiles (layout L), by ldmatrix or by plain loads ----

template <class T>
__device__ __forceinline__ uint32_t ld_b32(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
template <class T>
__device__ __forceinline__ uint32_t ld_b16(const T* p) {
  return *reinterpret_cast<const uint16_t*>(p);
}

// A operand: the 16x16 block at (r0, c0) of a row-major tile (Q_i or P_ij).
template <class L, bool kLdsm, class T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* tile, int r0, int c0, int lane) {
  if constexpr (kLdsm) {
    // EXERCISE BEGIN ldmatrix-map [hard]
    // Concept: ldmatrix's lane-to-row-address map: which lane supplies which row of which 8 x 8
    // matrix, so that the four registers come out in the mma A-fragment order.
    //
    // One ldmatrix.x4 reads four 8 x 8 matrices of 16-bit elements: lanes 8q .. 8q + 7 give
    // the row addresses of matrix q, and register q of every lane receives matrix q in the
    // fragment layout (mma.cuh). For the 16 x 16 A block at (r0, c0), a[0..3] must be the
    // m16n8k16 A fragment: a[0] rows r0..r0+7, columns c0..c0+7; a[1] the 8 rows below it;
    // a[2] the 8 columns right of it; a[3] both. Give ldmatrix_x4 this lane's row address,
    // through L::at (the swizzle). Trap: the address a lane gives is not the element it
    // receives.
    ldmatrix_x4(a, tile + L::at(r0 + (lane & 15), c0 + (lane >> 4) * 8));
    // EXERCISE END
  } else {
    const int g = lane >> 2, t = lane & 3;
    a[0] = ld_b32(tile + L::at(r0 + g, c0 + 2 * t));
    a[1] = ld_b32(tile + L::at(r0 + g + 8, c0 + 2 * t));
    a[2] = ld_b32(tile + L::at(r0 + g, c0 + 8 + 2 * t));
    a[3] = ld_b32(tile + L::at(r0 + g + 8, c0 + 8 + 2 * t));
  }
}

// Two B operands from a tile stored [n][k] (K_j: key rows, head-dim columns; B = K_j^T):
// b[0..1] for the n8 tile at n0, b[2..3] for n0 + 8, both over k = k0..k0+15.
template <class L, bool kLdsm, class T>
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const T* tile, int n0, int k0,
                                          int lane) {
  if constexpr (kLdsm) {
    // Rows are n, so no transpose. The matrices are taken in the order (n0, k0) (n0, k0+8)
    // (n0+8, k0) (n0+8, k0+8): lanes 0-7 address rows n0.. at k0, lanes 8-15 the same rows at
    // k0+8, lanes 16-31 rows n0+8.. likewise. Register m is matrix m, so that is b[0], b[1],
    // b[2], b[3], each pair adjacent as mma.sync reads it. (load_a's map would give b0 of n0,
    // b0 of n0+8, b1 of n0, b1 of n0+8, and the permutation costs register moves: with it, 224
    // of the 1428 instructions per tile at d = 128 were moves in this product.)
    ldmatrix_x4(b, tile + L::at(n0 + (lane & 7) + ((lane >> 4) << 3), k0 + ((lane >> 3) & 1) * 8));
  } else {
    const int g = lane >> 2, t = lane & 3;
    b[0] = ld_b32(tile + L::at(n0 + g, k0 + 2 * t));
    b[1] = ld_b32(tile + L::at(n0 + g, k0 + 8 + 2 * t));
    b[2] = ld_b32(tile + L::at(n0 + 8 + g, k0 + 2 * t));
    b[3] = ld_b32(tile + L::at(n0 + 8 + g, k0 + 8 + 2 * t));
  }
}

// Two B operands from a tile stored [k][n] (V_j: key rows = k, head-dim columns = n):
// b[0..1] for the n8 tile at n0, b[2..3] for n0 + 8, over k = k0..k0+15. A thread needs two
// elements of one column from adjacent rows: ldmatrix.trans delivers exactly that.
template <class L, bool kLdsm, class T>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const T* tile, int k0, int n0,
                                          int lane) {
  if constexpr (kLdsm) {
    // EXERCISE BEGIN ldmatrix-trans-map [easy]
    // Concept: ldmatrix.trans: a [k][n] tile (V) delivered as B fragments without a transpose
    // in memory, its matrices in the order mma.sync reads b[0], b[1] of two n8 tiles.
    //
    // b[0], b[1] must be the B fragment of the n8 tile at n0 over k = k0..k0+15, b[2], b[3]
    // that of n0 + 8. Rows of this tile are k, and .trans hands each lane a column of its
    // 8 x 8 matrix (mma.cuh). As in load_a, lanes 8q .. 8q + 7 address the rows of matrix q,
    // which lands in b[q]. Give ldmatrix_x4_trans this lane's row address, through L::at.
    // Trap: b[0] and b[1] are one n8 tile's two halves of k, not two n8 tiles.
    ldmatrix_x4_trans(b, tile + L::at(k0 + (lane & 15), n0 + (lane >> 4) * 8));
    // EXERCISE END
  } else {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int k = k0 + (r & 1) * 8 + 2 * t, n = n0 + (r >> 1) * 8 + g;
      b[r] = ld_b16(tile + L::at(k, n)) | (ld_b16(tile + L::at(k + 1, n)) << 16);
    }
  }
}

// Rows [row0, row0 + kRows) of a [rows, d] matrix into a shared tile; rows past `rows` are
// zero-filled (so 0 * V stays 0 for masked keys). Consecutive threads take consecutive
// 16-byte chunks of a row: a warp reads whole 128-byte lines of global memory.
template <class C, int kRows, class T>
__device__ __forceinline__ void load_tile(T* tile, const T* src, int row0, int rows, int tid) {
  constexpr int kRowChunks = C::kD / 8, kChunks = kRows * kRowChunks;
  static_assert(kChunks % C::kThreads == 0, "every thread copies the same number of chunks");
  // When a pass of the block covers whole rows (all d but 96), a thread keeps its column
  // chunk and steps down by a multiple of 8 rows: the same swizzle, constant offsets.
  constexpr bool kFixedColumn = C::kThreads % kRowChunks == 0;
  const T* base = src + size_t(row0) * C::kD;
  rows -= row0;  // rows left from row0 on (>= 1)
#pragma unroll
  for (int it = 0; it < kChunks / C::kThreads; ++it) {
    const int idx = it * C::kThreads + tid;
    const int r =
        kFixedColumn ? it * (C::kThreads / kRowChunks) + tid / kRowChunks : idx / kRowChunks;
    const int c = kFixedColumn ? tid % kRowChunks : idx % kRowChunks;
    const bool ok = r < rows;
    const T* from = base + (min(r, rows - 1) * C::kD + c * 8);  // skipped rows: any valid address
    T* to = tile + C::QKV::at(r, c * 8);
    if constexpr (C::kAsync) {
      cp_async_16(to, from, ok);
    } else {
      *reinterpret_cast<uint4*>(to) =
          ok ? *reinterpret_cast<const uint4*>(from) : make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

// ---- block-sparse masks and dropout, shared with the backward ----

// The tiles of the kept blocks in one row of a CSR block list (the host's kv_block_lists or
// q_block_lists): kept block J covers tiles J * sub .. J * sub + sub - 1 (sub = the mask block
// over the tile), visited in ascending order from tile `lo` on; `tile` is kNoTile once the
// row is done. The list entry after the current block is read one block ahead, so that its
// global-memory latency overlaps a tile's compute instead of holding up the next prefetch.
// Six registers: the kernels that walk it are at 255 already.
struct KeptTiles {
  static constexpr int kNoTile = 0x7fffffff;
  const int32_t* next;  // the list entry after the current block
  int remaining;        // entries from `next` on
  int upcoming;         // *next, read ahead (while remaining > 0)
  int tile, block_end;  // the current tile; one past the current block's last tile

  __device__ __forceinline__ void begin(const int32_t* row, int count, int sub, int lo) {
    next = row, remaining = count;
    while (remaining > 0 && (__ldg(next) + 1) * sub <= lo) ++next, --remaining;  // below lo
    tile = kNoTile;
    if (remaining == 0) return;
    const int first = __ldg(next) * sub;
    tile = max(lo, first), block_end = first + sub;
    ++next, --remaining;
    if (remaining > 0) upcoming = __ldg(next);
  }
  __device__ __forceinline__ void advance(int sub) {
    if (++tile < block_end) return;
    if (remaining == 0) {
      tile = kNoTile;
      return;
    }
    tile = upcoming * sub, block_end = tile + sub;
    ++next, --remaining;
    if (remaining > 0) upcoming = __ldg(next);
  }
};

// Dropout of one 16 x 16 block of P held in the mma C layout: `ev` and `od` are the lane's
// elements of the even and odd n8 tile ([0], [1] = row g, columns 2t, 2t + 1; [2], [3] = row
// g + 8). The lane's Philox call (common/dropout.hpp) holds exactly these 8 elements: w0 = row
// g of the even tile, w1 = row g of the odd tile, w2 and w3 the same for row g + 8, the even
// column in the low 16 bits. A dropped P_ij becomes 0. Per pair of elements: the high half is
// one unsigned compare (w >= t << 16: its low bits cannot change the outcome), the low half
// an AND and a compare, then two selects: 5 instructions.
__device__ __forceinline__ void keep_pair(float& lo, float& hi, uint32_t w, uint32_t t) {
  lo = (w & 0xffffu) >= t ? lo : 0.f;
  hi = w >= (t << 16) ? hi : 0.f;
}
__device__ __forceinline__ void drop_block(float (&ev)[4], float (&od)[4],
                                           const dropout::Philox4& z, uint32_t t) {
  keep_pair(ev[0], ev[1], z.w[0], t);
  keep_pair(od[0], od[1], z.w[1], t);
  keep_pair(ev[2], ev[3], z.w[2], t);
  keep_pair(od[2], od[3], z.w[3], t);
}

// ---- the forward kernel's steps ----
// Pieces of forward_kernel below, in the order it runs them, inlined into it; a K/V tile's two
// products, S = Q_i K_j^T and O_i += P V_j, are written out in the kernel. Per warp: s[mi][nj]
// is the mma C fragment of slice mi (16 query rows), n8 tile nj of S (then P); acc_o[mi][nd]
// that of O_i; row_m, row_l hold m_i, l_i of rows g and g + 8 of each slice.

// O_i = 0, m_i = -inf, l_i = 0.
template <class C>
__device__ __forceinline__ void init_rows(float (&acc_o)[C::kSlices][C::kD / 8][4],
                                          float (&row_m)[C::kSlices][2],
                                          float (&row_l)[C::kSlices][2]) {
#pragma unroll
  for (int mi = 0; mi < C::kSlices; ++mi) {
#pragma unroll
    for (int nd = 0; nd < C::kD / 8; ++nd)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mi][nd][e] = 0.f;
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) row_m[mi][rh] = -INFINITY, row_l[mi][rh] = 0.f;
  }
}

// The K/V tiles Q tile i0 sees: all N keys, or under the bottom-right causal mask (key j
// visible to query i iff j <= i + N - M) up to its last row's last visible key; tiles from
// n_tiles on are never loaded. Tiles below n_unmasked are visible to every row: no mask there.
template <class C>
__device__ __forceinline__ void visible_tiles(int& n_tiles, int& n_unmasked, bool causal, int i0,
                                              int M, int N) {
  constexpr int kBr = C::kBr, kBc = C::kBc;
  const int last_row = min(i0 + kBr, M) - 1;
  const int n_end = causal ? max(0, min(N, last_row + 1 + N - M)) : N;
  n_tiles = (n_end + kBc - 1) / kBc;
  n_unmasked = (causal ? max(0, min(N, i0 + 1 + N - M)) : N) / kBc;
}

// S = 0, before the k-steps of S = Q_i K_j^T accumulate into it.
template <class C>
__device__ __forceinline__ void zero_scores(float (&s)[C::kSlices][C::kBc / 8][4]) {
#pragma unroll
  for (int mi = 0; mi < C::kSlices; ++mi)
#pragma unroll
    for (int nj = 0; nj < C::kBc / 8; ++nj)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mi][nj][e] = 0.f;
}

// Mask: keys past N, and under causal keys past row + N - M, become -inf (tile j, whose first
// key is j * Bc; the warp's rows from i0 + w_row0).
template <class C, class Args>
__device__ __forceinline__ void mask_scores(float (&s)[C::kSlices][C::kBc / 8][4], const Args& p,
                                            int i0, int w_row0, int j, int g, int t) {
  constexpr int kS = C::kSlices, kNT = C::kBc / 8, kBc = C::kBc;
  constexpr float kNegInf = -INFINITY;
  const int M = p.seq_q, N = p.seq_k;
#pragma unroll
  for (int mi = 0; mi < kS; ++mi)
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      const int row = i0 + w_row0 + mi * 16 + g + rh * 8;
      const int limit = p.causal ? min(N, row + 1 + N - M) : N;  // first hidden key
#pragma unroll
      for (int nj = 0; nj < kNT; ++nj)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (j * kBc + nj * 8 + 2 * t + e >= limit) s[mi][nj][2 * rh + e] = kNegInf;
    }
}

// Online softmax, rows g and g + 8 of each slice: the new row max m, P = exp(S - m) in place
// of S, l rescaled and this thread's columns added, O_i rescaled. The 4 lanes of a quad (same
// g) hold all Bc columns of their rows, 2 per n8 tile: two xor-shuffles give the max.
template <class C, class Args>
__device__ __forceinline__ void online_softmax(float (&s)[C::kSlices][C::kBc / 8][4],
                                               float (&row_m)[C::kSlices][2],
                                               float (&row_l)[C::kSlices][2],
                                               float (&acc_o)[C::kSlices][C::kD / 8][4],
                                               const Args& p) {
  constexpr int kS = C::kSlices, kNT = C::kBc / 8, kDT = C::kD / 8;
  constexpr float kNegInf = -INFINITY;
#pragma unroll
  for (int mi = 0; mi < kS; ++mi)
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      float mx = row_m[mi][rh];
#pragma unroll
      for (int nj = 0; nj < kNT; ++nj)
        mx = fmaxf(mx, fmaxf(s[mi][nj][2 * rh], s[mi][nj][2 * rh + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A row that has seen only masked keys keeps m = -inf; subtract 0 then, so that
      // exp2(-inf - 0) = 0 instead of exp2(-inf + inf) = NaN.
      const float mx_scaled = mx == kNegInf ? 0.f : mx * p.scale_log2;
      const float alpha = fast_exp2(row_m[mi][rh] * p.scale_log2 - mx_scaled);
      row_m[mi][rh] = mx;
      float sum = 0.f;
#pragma unroll
      for (int nj = 0; nj < kNT; ++nj)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          // exp(scale * (s - m)) = exp2(s * scale*log2e - m * scale*log2e): one FFMA
          const float pe = fast_exp2(fmaf(s[mi][nj][2 * rh + e], p.scale_log2, -mx_scaled));
          s[mi][nj][2 * rh + e] = pe;
          sum += pe;
        }
      row_l[mi][rh] = alpha * row_l[mi][rh] + sum;  // this thread's columns only
#pragma unroll
      for (int nd = 0; nd < kDT; ++nd) {
        acc_o[mi][nd][2 * rh] *= alpha;
        acc_o[mi][nd][2 * rh + 1] *= alpha;
      }
    }
}

// p-via-smem: P written to this warp's own rows of the shared P tile, to be read back as the
// A operand: the round trip that keeping P in registers avoids.
template <class C, class T>
__device__ __forceinline__ void store_p(T* sP, const float (&s)[C::kSlices][C::kBc / 8][4],
                                        int w_row0, int g, int t) {
  constexpr int kS = C::kSlices, kNT = C::kBc / 8;
#pragma unroll
  for (int mi = 0; mi < kS; ++mi)
#pragma unroll
    for (int nj = 0; nj < kNT; ++nj)
#pragma unroll
      for (int rh = 0; rh < 2; ++rh)
        *reinterpret_cast<uint32_t*>(sP +
                                     C::PL::at(w_row0 + mi * 16 + g + rh * 8, nj * 8 + 2 * t)) =
            pack2<T>(s[mi][nj][2 * rh], s[mi][nj][2 * rh + 1]);
  __syncwarp();  // a warp reads only its own rows of P
}

// P's A fragment for keys 16kk .. 16kk + 15 of one slice, straight from the slice's S (now P)
// accumulators s[nj][0..3] in the mma C layout.
template <class T, int kNT>
__device__ __forceinline__ void p_fragment(uint32_t (&a)[4], const float (&s)[kNT][4], int kk) {
  // EXERCISE BEGIN p-fragment [hard]
  // Concept: P stays in registers: the mma C fragment of S, rounded to 16 bits, is
  // the A fragment of P V.
  //
  // Fill a[0..3], the A fragment of P for keys 16kk .. 16kk + 15 of this slice, from
  // this lane's S accumulators s[nj][0..3] (n8 tiles nj of the C layout), packing
  // pairs with pack2<T>(lower column, higher column). Write down which (row, column)
  // of its 16 x 8 C tile each s[nj][k] holds for lane (g = lane / 4, t = lane % 4),
  // then which (row, column) each a[k] of the m16n8k16 A fragment must hold (mma.cuh):
  // no shuffle is needed.
  a[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
  a[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
  a[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  a[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  // EXERCISE END
}

// Epilogue, rows: l_i. Each lane summed its own columns; the quad adds its four partial sums
// once, here, instead of once per tile. Then one division per row, by l_i and, with dropout,
// by 1 - p (l_i summed the undropped P: LSE is unaffected); LSE_i = scale m_i + log l_i, into
// plane bh of LSE.
template <class C, bool kDropout, class Args>
__device__ __forceinline__ void finish_rows(float (&inv_l)[C::kSlices][2],
                                            const float (&row_m)[C::kSlices][2],
                                            const float (&row_l)[C::kSlices][2], const Args& p,
                                            size_t bh, int i0, int w_row0, int g, int t) {
  constexpr int kS = C::kSlices;
  constexpr float kNegInf = -INFINITY;
  const int M = p.seq_q;
  float* LSE = p.lse + bh * M;
#pragma unroll
  for (int mi = 0; mi < kS; ++mi)
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      float l = row_l[mi][rh];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      inv_l[mi][rh] = l > 0.f ? 1.f / l : 0.f;  // l = 0: no visible key, O = 0
      if constexpr (kDropout) inv_l[mi][rh] *= p.drop_scale;
      const int row = i0 + w_row0 + mi * 16 + g + rh * 8;
      if (t == 0 && row < M) LSE[row] = l > 0.f ? row_m[mi][rh] * p.scale + logf(l) : kNegInf;
    }
}

// Epilogue, O_i = O_i / l_i rounded to T, stored to O (rows i0.., M rows in all): through
// shared memory for 16-byte stores (kStagedStore), or straight from the fragments. O is formed
// here, from the base and the plane bh: formed in the kernel, ptxas was given other code.
template <class C, class T>
__device__ __forceinline__ void store_o(T* O_base, size_t bh, T* sQ,
                                        const float (&acc_o)[C::kSlices][C::kD / 8][4],
                                        const float (&inv_l)[C::kSlices][2], int M, int i0,
                                        int w_row0, [[maybe_unused]] int lane, int g, int t) {
  using QKV = typename C::QKV;
  constexpr int kS = C::kSlices, kDT = C::kD / 8, D = C::kD;
  T* O = O_base + bh * M * D;
  if constexpr (C::kStage) {
    // O_i through this warp's own rows of the Q tile (no other warp reads them), then
    // 16-byte chunks: consecutive lanes write consecutive chunks of a row.
    T* sO = sQ;
    __syncwarp();  // the warp's last ldmatrix reads of those rows are done
#pragma unroll
    for (int mi = 0; mi < kS; ++mi)
#pragma unroll
      for (int nd = 0; nd < kDT; ++nd)
#pragma unroll
        for (int rh = 0; rh < 2; ++rh)
          *reinterpret_cast<uint32_t*>(sO +
                                       QKV::at(w_row0 + mi * 16 + g + rh * 8, nd * 8 + 2 * t)) =
              pack2<T>(acc_o[mi][nd][2 * rh] * inv_l[mi][rh],
                       acc_o[mi][nd][2 * rh + 1] * inv_l[mi][rh]);
    __syncwarp();
    constexpr int kRowChunks = D / 8, kWarpChunks = 16 * kS * kRowChunks;
    static_assert(kWarpChunks % 32 == 0, "every lane stores the same number of chunks");
#pragma unroll
    for (int it = 0; it < kWarpChunks / 32; ++it) {
      const int idx = it * 32 + lane, r = w_row0 + idx / kRowChunks, c = idx % kRowChunks;
      if (i0 + r < M)
        *reinterpret_cast<uint4*>(O + size_t(i0 + r) * D + c * 8) =
            *reinterpret_cast<const uint4*>(sO + QKV::at(r, c * 8));
    }
  } else {  // direct-store: each lane writes its 4-byte pairs straight from the C fragments
#pragma unroll
    for (int mi = 0; mi < kS; ++mi)
#pragma unroll
      for (int rh = 0; rh < 2; ++rh) {
        const int row = i0 + w_row0 + mi * 16 + g + rh * 8;
        if (row >= M) continue;
#pragma unroll
        for (int nd = 0; nd < kDT; ++nd)
          *reinterpret_cast<uint32_t*>(O + size_t(row) * D + nd * 8 + 2 * t) = pack2<T>(
              acc_o[mi][nd][2 * rh] * inv_l[mi][rh], acc_o[mi][nd][2 * rh + 1] * inv_l[mi][rh]);
      }
  }
}

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
  if constexpr (kSparse) {
    const size_t row =
        size_t(b) * p.mask_bstride + size_t(h) * p.mask_hstride + (i0 / kBr) / p.mask_q_tiles;
    kept.begin(p.blk_index + row * p.mask_k_blocks, p.blk_count[row], p.mask_k_tiles, 0);
    j = kept.tile;
  }
  // Dropout's Philox counter is (32 * key 16-block + lane, query 16-block, h, b): the query
  // 16-block of slice mi is q16 + mi.
  [[maybe_unused]] const uint32_t q16 = uint32_t(i0 + w_row0) / 16u;

  if (j < n_tiles) {
    load_tile<C, kBr>(sQ, Q, i0, M, tid);
    load_tile<C, kBc>(sK, K, j * kBc, N, tid);
    load_tile<C, kBc>(sV, V, j * kBc, N, tid);
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
      if constexpr (C::kAsync) {
        if ((kSparse ? jn : j + 1) < n_tiles) {  // overlaps with all of this tile's compute
          const int next = ((kSparse ? x : j) + 1) & 1;
          load_tile<C, kBc>(sK + next * kBc * D, K, (kSparse ? jn : j + 1) * kBc, N, tid);
          load_tile<C, kBc>(sV + next * kBc * D, V, (kSparse ? jn : j + 1) * kBc, N, tid);
          cp_async_commit();
        }
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
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) {
        uint32_t a[kS][4];
#pragma unroll
        for (int mi = 0; mi < kS; ++mi) {
          if constexpr (C::kPRegs) {
            if constexpr (kDropout) {  // Z of keys 16kk.. of tile j, rows of slice mi
              const uint32_t key16 = uint32_t(j) * (kBc / 16) + kk;
              drop_block(s[mi][2 * kk], s[mi][2 * kk + 1],
                         dropout::philox(key16 * 32u + lane, q16 + mi, h, b, p.seed_lo, p.seed_hi),
                         p.drop_thresh);
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
      if constexpr (!C::kAsync) {
        if (j + 1 < n_tiles) {
          __syncthreads();
          load_tile<C, kBc>(sK, K, (j + 1) * kBc, N, tid);
          load_tile<C, kBc>(sV, V, (j + 1) * kBc, N, tid);
        }
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

// The arguments of a kernel with the features, from p: the mask row strides (0 where shared),
// the tiles per mask block, the Philox key, the threshold and 1 / (1 - p), all computed here,
// on the host.
inline FwdFeatureArgs fwd_feature_args(const FwdParams& p, int br, int bc) {
  FwdFeatureArgs a{};
  a.q = p.q, a.k = p.k, a.v = p.v, a.o = p.o, a.lse = p.lse;
  a.batch = p.batch, a.heads = p.heads, a.heads_kv = p.heads_kv, a.group = p.group;
  a.seq_q = p.seq_q, a.seq_k = p.seq_k, a.scale = p.scale, a.scale_log2 = p.scale_log2;
  a.causal = p.causal;
  if (p.blk_count) {
    a.blk_count = p.blk_count, a.blk_index = p.blk_index;
    a.mask_hstride = p.mask_heads == 1 ? 0 : p.mask_q_blocks;
    a.mask_bstride = p.mask_batch == 1 ? 0 : p.mask_heads * p.mask_q_blocks;
    a.mask_q_tiles = p.mask_block_q / br, a.mask_k_tiles = p.mask_block_k / bc;
    a.mask_k_blocks = p.mask_k_blocks;
  }
  if (p.dropout_p > 0) {
    a.seed_lo = uint32_t(p.dropout_seed), a.seed_hi = uint32_t(p.dropout_seed >> 32);
    a.drop_thresh = dropout::threshold(p.dropout_p);
    a.drop_scale = float(1.0 / (1.0 - p.dropout_p));
  }
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
