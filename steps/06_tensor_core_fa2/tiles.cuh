// Step 06's shared tiles, as both passes use them: load_tile copies rows of a [rows, d] matrix
// into a row-major shared tile of 16-bit elements (cp.async, or plain 16-byte copies), and the
// fragment loaders read a tile out as mma.sync operands (ldmatrix, or plain 32- and 16-bit
// loads), through the tile's layout L (mma.cuh's SmemLayout: the swizzle).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "exercise.hpp"
#include "mma.cuh"

namespace ladder::step06 {

// ---- fragment loads from shared tiles (layout L), by ldmatrix or by plain loads ----
// The fragment loaders (load_a, load_b_nk, load_b_kn and the backward's load_a_trans) choose
// their lane -> address maps so that ldmatrix's four registers come out in the order mma.sync
// reads them: four adjacent registers for A, and for B the pair (b[0], b[1]) of each n8 tile
// adjacent. (A permutation after the load costs register moves: about 0.6 instructions per mma
// in the backward kernel.)

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

// A operand (the 16x16 block at rows r0, columns c0 of A) from a tile that holds A^T
// row-major: dS from the dS^T buffer. ldmatrix.trans of the 8x8 block at A^T rows c0..,
// columns r0.. gives lane (g, t) A[r0 + g][c0 + 2t, +1], register a[0]; the matrices are
// taken in the order a[0] (A^T rows c0.., columns r0..), a[1] (rows c0.., columns r0 + 8..),
// a[2] (rows c0 + 8.., columns r0..), a[3].
template <class L, class T>
__device__ __forceinline__ void load_a_trans(uint32_t (&a)[4], const T* tile_t, int r0, int c0,
                                             int lane) {
  ldmatrix_x4_trans(
      a, tile_t + L::at(c0 + (lane & 7) + ((lane >> 4) << 3), r0 + ((lane >> 3) & 1) * 8));
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
    // EXERCISE BEGIN cp-async [medium]
    // Concept: cp.async, a 16-byte copy from global to shared memory that skips the registers
    // and lands later (the kernel commits a group and waits for it), and its zero-fill.
    //
    // Copy chunk c (8 elements) of tile row r, which is row r of `base`, to its swizzled place
    // in the tile (C::QKV::at takes a row and a column): with cp_async_16 where C::kAsync, by
    // a plain 16-byte load and store otherwise. A row at or past `rows` must arrive as zeros,
    // read from nowhere. Trap: cp.async with nothing to read still needs a source address that
    // is mapped.
    const bool ok = r < rows;
    const T* from = base + (min(r, rows - 1) * C::kD + c * 8);  // skipped rows: any valid address
    T* to = tile + C::QKV::at(r, c * 8);
    if constexpr (C::kAsync) {
      cp_async_16(to, from, ok);
    } else {
      *reinterpret_cast<uint4*>(to) =
          ok ? *reinterpret_cast<const uint4*>(from) : make_uint4(0u, 0u, 0u, 0u);
    }
    // EXERCISE END
  }
}

}  // namespace ladder::step06
