// Which keys a query sees, in step 06's kernels: the causal and sequence-end masks (the K/V
// tiles a forward Q tile visits and the scores to hide in them; in the backward, the first query
// each key sees and the S^T scores to hide), and the walk over the kept tiles of a block-sparse
// mask.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "params.cuh"

namespace ladder::step06 {

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

// This lane's keys (key0 and key0 + 8: rows g and g + 8 of the warp's slice) see queries
// q >= q_min: the causal boundary, shifted to no query at all for keys past N.
__device__ __forceinline__ void first_queries(int (&q_min)[2], int key0, bool causal, int M,
                                              int N) {
#pragma unroll
  for (int rh = 0; rh < 2; ++rh) {
    const int key = key0 + rh * 8;
    q_min[rh] = key >= N ? M : (causal ? key - (N - M) : 0);
  }
}

// Mask of S^T: only tiles that straddle the diagonal, or hold the end of the keys, need it.
// This lane's keys see queries q >= q_min[rh]; the rest become -inf.
template <class C>
__device__ __forceinline__ void mask_scores_t(float (&s_t)[C::kBr / 8][4], const int (&q_min)[2],
                                              int i0, int t) {
  constexpr int kNT = C::kBr / 8;
  constexpr float kNegInf = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (i0 + nt * 8 + 2 * t + (e & 1) < q_min[e >> 1]) s_t[nt][e] = kNegInf;
}

// ---- block-sparse masks: the kept tiles a block walks ----

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
  // The forward's walk: Q tile q_tile's mask row of query head h of batch b, from tile 0.
  __device__ __forceinline__ void begin_q_tile(const FwdFeatureArgs& p, int b, int h, int q_tile) {
    const size_t row =
        size_t(b) * p.mask_bstride + size_t(h) * p.mask_hstride + q_tile / p.mask_q_tiles;
    begin(p.blk_index + row * p.mask_k_blocks, p.blk_count[row], p.mask_k_tiles, 0);
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

// The Q tiles of the kept query blocks in each query head's mask row for this block's key
// block (blockIdx.x), head after head of the GQA group, each head from Q tile lo up to (not
// including) end. The row of query head hk * group + hh: b * mask_bstride + (hk * group + hh)
// * mask_hstride + blockIdx.x / mask_k_tiles.
struct KeptItems {
  KeptTiles kept;
  int head;  // the head of the group the walk is in

  __device__ __forceinline__ static size_t row(const BwdFeatureArgs& p, int b, int hk, int hh) {
    return size_t(b) * p.mask_bstride + (size_t(hk) * p.group + hh) * p.mask_hstride +
           blockIdx.x / p.mask_k_tiles;
  }
  __device__ __forceinline__ void begin_head(const BwdFeatureArgs& p, int b, int hk, int lo) {
    const size_t r = row(p, b, hk, head);
    kept.begin(p.blk_index + r * p.mask_q_blocks, p.blk_count[r], p.mask_q_tiles, lo);
  }
  // How many items there are in all.
  __device__ __forceinline__ static int count(const BwdFeatureArgs& p, int b, int hk, int lo,
                                              int end) {
    int n = 0;
    for (int hh = 0; hh < p.group; ++hh) {
      const size_t r = row(p, b, hk, hh);
      const int32_t* list = p.blk_index + r * p.mask_q_blocks;
      for (int e = 0; e < p.blk_count[r]; ++e) {
        const int first = __ldg(list + e) * p.mask_q_tiles;
        n += max(0, min(first + p.mask_q_tiles, end) - max(first, lo));
      }
    }
    return n;
  }
  // To the first item, and from one item to the next: only while another one is left.
  __device__ __forceinline__ void first(const BwdFeatureArgs& p, int b, int hk, int lo, int end) {
    head = 0;
    begin_head(p, b, hk, lo);
    while (kept.tile >= end) ++head, begin_head(p, b, hk, lo);
  }
  __device__ __forceinline__ void next(const BwdFeatureArgs& p, int b, int hk, int lo, int end) {
    kept.advance(p.mask_q_tiles);
    while (kept.tile >= end) ++head, begin_head(p, b, hk, lo);
  }
};

}  // namespace ladder::step06
