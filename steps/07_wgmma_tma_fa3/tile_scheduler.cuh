// Rung 07's forward tile scheduler, in one place: which K/V tiles a work item visits (dense, or
// the block mask's list), the item a CTA index or a counter value stands for (heaviest causal
// tiles first, heads in L2-sized sections), and how the persistent producer takes the next item
// from the counter and hands it to the consumers through a two-slot ring in shared memory.
// Included by wgmma_tma_fa3.cu only.
#pragma once
#include "fwd_params.cuh"

namespace ladder::fa3 {
namespace {

// ---- the K/V tiles one work item visits ------------------------------------------------
// Dense: tiles 0 .. n_iter-1. Block-sparse: the listed key blocks, each bn_tiles kernel tiles,
// ascending, cut where the causal limit ends (the visible tiles are a prefix of that walk).
struct TileWalk {
  const int* list = nullptr;  // null: dense
  int bn_tiles = 1;
  int n_iter = 0;
  __device__ __forceinline__ int tile(int it) const {
    return list ? __ldg(list + it / bn_tiles) * bn_tiles + it % bn_tiles : it;
  }
};

// One work item: a query tile of one head.
struct Item {
  int i0, h, b, bh, bhk;  // first query row; head; batch; Q/O plane b*H+h; K/V plane
  int n_unmasked;         // tiles below this index are visible to every row: no mask
  TileWalk walk;
};

// Query tile mt of plane bh = b * heads + h.
template <int kBr, bool kExtras>
__device__ __forceinline__ Item make_item(const KParams& p, int mt, int bh) {
  Item c;
  const int M = p.seq_q, N = p.seq_k;
  c.i0 = mt * kBr;
  c.bh = bh;
  c.b = bh / p.heads, c.h = bh - c.b * p.heads;
  c.bhk = c.b * (p.heads / p.group) + c.h / p.group;
  // Keys this tile sees: all N, or (bottom-right causal: key j visible to query i iff
  // j <= i + N - M) up to the last row's last visible key; tiles past it are never loaded.
  const int last_row = min(c.i0 + kBr, M) - 1;
  const int n_end = p.causal ? max(0, min(N, last_row + 1 + N - M)) : N;
  const int tiles_end = (n_end + kBc - 1) / kBc;
  c.n_unmasked = (p.causal ? max(0, min(N, c.i0 + 1 + N - M)) : N) / kBc;
  c.walk.n_iter = tiles_end;
  if constexpr (kExtras) {
    if (p.kv_count) {
      const int mb = p.mask_batch == 1 ? 0 : c.b, mh = p.mask_heads == 1 ? 0 : c.h;
      const int row = (mb * p.mask_heads + mh) * p.mask_nI + c.i0 / p.block_m;
      const int count = __ldg(p.kv_count + row);
      c.walk.list = p.kv_index + size_t(row) * p.mask_nJ;
      c.walk.bn_tiles = p.bn_tiles;
      int n = 0;
      for (int e = 0; e < count; ++e)
        n += max(0, min(p.bn_tiles, tiles_end - __ldg(c.walk.list + e) * p.bn_tiles));
      c.walk.n_iter = n;
    }
  }
  return c;
}

// The persistent kernels' order of work: heads in sections of sec_heads (their K/V stay in L2
// while the section runs), and inside a section the last query tiles first (causal: the ones
// that see the most keys), every head of the section at each tile. Item idx -> (mt, bh).
__device__ __forceinline__ void item_coords(const KParams& p, int idx, int& mt, int& bh) {
  const int per_section = p.sec_heads * p.n_mt;
  const int sec = idx / per_section, j = idx - sec * per_section;
  const int h0 = sec * p.sec_heads, hs = min(p.sec_heads, p.n_bh - h0);
  mt = p.n_mt - 1 - j / hs;
  bh = h0 + j % hs;
}

// The persistent kernels' next item. The first item of CTA b is b; the counter hands out
// gridDim.x, gridDim.x + 1, ..., and an index >= items means "no more". Every CTA takes exactly
// one such index, so the counter is incremented exactly `items` times per launch (items -
// gridDim.x real ones + gridDim.x final ones): the CTA that receives items - 1 made the last
// increment and sets the counter back to zero for the next launch. The producer's thread.
__device__ __forceinline__ int take_next_item(const KParams& p) {
  const unsigned int taken = atomicAdd(p.counter, 1u);
  if (taken == unsigned(p.items) - 1u) atomicExch(p.counter, 0u);
  return int(gridDim.x + taken);
}

// The producer hands item indices to the consumers through a two-slot ring in shared memory
// with its own full/empty barriers; `published` and `taken` count the uses on either side.
__device__ __forceinline__ void publish_item(Bars& bars, uint32_t& published, int idx) {
  const uint32_t slot = published & 1;
  mbar_wait(&bars.sched_empty[slot], ((published >> 1) & 1) ^ 1);
  *reinterpret_cast<volatile int*>(&bars.next_item[slot]) = idx;
  mbar_arrive_if(&bars.sched_full[slot], true);  // release: the index is visible to waiters
  ++published;
}
__device__ __forceinline__ int receive_item(Bars& bars, uint32_t& taken, int lane) {
  const uint32_t slot = taken & 1;
  mbar_wait(&bars.sched_full[slot], (taken >> 1) & 1);
  const int idx = *reinterpret_cast<volatile int*>(&bars.next_item[slot]);
  __syncwarp();  // every lane has read the slot before lane 0 frees it
  mbar_arrive_if(&bars.sched_empty[slot], lane == 0);
  ++taken;
  return idx;
}

// How many K (or V, or Q) tiles a role has loaded or consumed so far: the ring position. A
// persistent CTA keeps counting across its items, so producer and consumers stay in step.
struct RingPos {
  uint32_t k = 0, v = 0, q = 0;
};

}  // namespace
}  // namespace ladder::fa3
