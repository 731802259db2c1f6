// Rung 07's tile schedulers, in one place: which work a CTA does, forward (the items, their K/V
// walk, the persistent order and hand-off) and backward (the K/V tiles a CTA owns in turn, the
// walk over the Q tiles of each). P is the kernel's KParams (fwd_params.cuh or bwd_params.cuh).
#pragma once
#include "fa3.cuh"

namespace ladder::fa3 {
namespace {

// ---- forward: the K/V tiles one work item visits ---------------------------------------
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
  int i0, h, b, bh, hk, bhk;  // first query row; head; batch; plane b*H+h; K/V head, plane
  int n_unmasked;             // tiles below this index are visible to every row: no mask
  TileWalk walk;
};

// Query tile mt of plane bh = b * heads + h.
template <int kBr, bool kExtras, class P>
__device__ __forceinline__ Item make_item(const P& p, int mt, int bh) {
  Item c;
  const int M = p.seq_q, N = p.seq_k;
  c.i0 = mt * kBr;
  c.bh = bh;
  c.b = bh / p.heads, c.h = bh - c.b * p.heads;
  c.hk = c.h / p.group;
  c.bhk = c.b * (p.heads / p.group) + c.hk;
  // Keys this tile sees: all N, or (bottom-right causal: key j visible to query i iff
  // j <= i + N - M) up to the last row's last visible key; tiles past it are never loaded.
  const int last_row = min(c.i0 + kBr, M) - 1;
  const int n_end = p.score.causal ? max(0, min(N, last_row + 1 + N - M)) : N;
  const int tiles_end = (n_end + kBc - 1) / kBc;
  c.n_unmasked = (p.score.causal ? max(0, min(N, c.i0 + 1 + N - M)) : N) / kBc;
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

// The one-item kernels' item of this CTA: the last query tiles first (causal: they see the most
// keys), so that the last wave is made of short ones.
template <int kBr, bool kExtras, class P>
__device__ __forceinline__ Item cta_item(const P& p) {
  return make_item<kBr, kExtras>(p, int(gridDim.x) - 1 - int(blockIdx.x),
                                 int(blockIdx.z) * p.heads + int(blockIdx.y));
}

// The persistent kernels' order of work: heads in sections of sec_heads (their K/V stay in L2
// while the section runs), and inside a section the last query tiles first (causal: the ones
// that see the most keys), every head of the section at each tile. Item idx -> (mt, bh).
template <class P>
__device__ __forceinline__ void item_coords(const P& p, int idx, int& mt, int& bh) {
  const int per_section = p.sec_heads * p.n_mt;
  const int sec = idx / per_section, j = idx - sec * per_section;
  const int h0 = sec * p.sec_heads, hs = min(p.sec_heads, p.n_bh - h0);
  mt = p.n_mt - 1 - j / hs;
  bh = h0 + j % hs;
}

// The persistent kernels' next work index (the forward's items, the backward's units). The
// first of CTA b is b; the counter hands out gridDim.x, gridDim.x + 1, ..., and an index >= count
// means "no more". Every CTA takes exactly one such index, so the counter is incremented exactly
// `count` times per launch (count - gridDim.x real ones + gridDim.x final ones): the CTA that
// receives count - 1 made the last increment and sets the counter back to zero for the next
// launch. The producer's thread.
__device__ __forceinline__ int take_next(unsigned int* counter, int count) {
  const unsigned int taken = atomicAdd(counter, 1u);
  if (taken == unsigned(count) - 1u) atomicExch(counter, 0u);
  return int(gridDim.x + taken);
}

// The producer hands item indices to the consumers through a two-slot ring in shared memory
// (`slots`, with the ring's own full/empty barriers); `published` and `taken` count the uses on
// either side.
__device__ __forceinline__ void publish_item(const Pipeline<2>& ring, int* slots,
                                             uint32_t& published, int idx) {
  ring.acquire(published);
  *reinterpret_cast<volatile int*>(&slots[ring.stage(published)]) = idx;
  ring.commit(published);  // release: the index is visible to waiters
  ++published;
}
__device__ __forceinline__ int receive_item(const Pipeline<2>& ring, const int* slots,
                                            uint32_t& taken, int lane) {
  ring.wait(taken);
  const int idx = *reinterpret_cast<const volatile int*>(&slots[ring.stage(taken)]);
  __syncwarp();  // every lane has read the slot before lane 0 frees it
  ring.release(taken, lane == 0);
  ++taken;
  return idx;
}

// How many K (or V, or Q) tiles a role has loaded or consumed so far: its counts of the rings'
// uses (Pipeline). A persistent CTA keeps counting across its items, so producer and consumers
// stay in step.
struct RingPos {
  uint32_t k = 0, v = 0, q = 0;
};

// ---- backward: the units (K/V tiles) a CTA owns -----------------------------------------
// Unit u is K/V tile u % n_kt of K/V plane u / n_kt (plane = b heads_kv + hk): a plane's tiles
// are consecutive, so the CTAs running at once share a few planes' Q and dO in the L2, and
// inside a plane the first tiles come first (causal: they are seen by the most Q tiles, and the
// last units of the launch are the lightest). CTA b's first unit is b; with a work counter the
// persistent CTAs take the next ones from it (take_next) as they finish, else each owns one.
// Unit u's K/V tile jt, K/V head hk and batch b.
template <class P>
__device__ __forceinline__ void unit_coords(const P& p, int u, int& jt, int& hk, int& b) {
  const int bhk = u / p.n_kt;
  jt = u - bhk * p.n_kt, hk = bhk % p.heads_kv, b = bhk / p.heads_kv;
}
struct Ctx {
  int j0, hk, b, bhk;  // first key; K/V head; batch; K/V plane b * heads_kv + hk
  int M, N;
  unsigned char* smem;  // 1024-aligned base of the dynamic shared memory
};
// The unit of K/V tile jt of K/V head hk, batch b.
template <class P>
__device__ __forceinline__ void set_unit(Ctx& c, const P& p, int jt, int hk, int b) {
  c.j0 = jt * kBc, c.hk = hk, c.b = b;
  c.bhk = b * p.heads_kv + hk;
}
template <class P>
__device__ __forceinline__ Ctx unit_ctx(const P& p, int u, unsigned char* smem) {
  Ctx c;
  int jt, hk, b;
  unit_coords(p, u, jt, hk, b);
  set_unit(c, p, jt, hk, b);
  c.M = p.seq_q, c.N = p.seq_k;
  c.smem = smem;
  return c;
}

// ---- backward: the items of one unit (the producer) --------------------------------------
// For each query head hh of the group in turn, the Q tiles from i_first (the first tile that sees
// a key of this K/V tile under the causal mask) to the end; block-sparse: only the tiles of the
// kept query blocks in that head's mask row for this key block (ascending).
// Only the position is state (the producer runs on 24 registers): the walk's constants and the
// unit's coordinates are computed once per unit into shared memory (`k`, the producer's own:
// bwd_params.cuh's g_walk) and read back when a range ends or a load needs them.
template <class P, bool kSparse, int kBr>
struct BwdWalk {
  // tiles_q, i_first, mask row of head 0, mask row stride per head; the unit's jt, hk, b
  int (&k)[8];
  int hh, tile, tile_end, e;  // e: the next list entry of head hh (dense: 0 or 1)

  __device__ __forceinline__ int jt() const { return k[4]; }
  __device__ __forceinline__ int hk() const { return k[5]; }
  __device__ __forceinline__ int b() const { return k[6]; }
  __device__ __forceinline__ bool valid(const P& p) const { return hh < p.group; }
  // The walk of unit u.
  __device__ __forceinline__ void start(const P& p, int u) {
    int jt, hk, b;
    unit_coords(p, u, jt, hk, b);
    k[4] = jt, k[5] = hk, k[6] = b;
    k[0] = (p.seq_q + kBr - 1) / kBr;
    // Bottom-right causal: key j visible to query i iff j <= i + N - M, so rows below
    // j0 - (N - M) see no key of this tile (every key < N is seen by the last row).
    k[1] = p.score.causal ? max(0, jt * kBc - (p.seq_k - p.seq_q)) / kBr : 0;
    if constexpr (kSparse) {
      // Mask row of (b', h', key block J): (b' mask_heads + h') nJ + J, with b' = 0 if the mask
      // is shared by the batch, h' = 0 if shared by the heads; query head h = hk group + hh.
      const int mb = p.mask_batch == 1 ? 0 : b;
      const int mh0 = p.mask_heads == 1 ? 0 : hk * p.group;
      k[2] = (mb * p.mask_heads + mh0) * p.mask_nJ + jt / p.bn_tiles;
      k[3] = p.mask_heads == 1 ? 0 : p.mask_nJ;
    }
    hh = 0, e = 0, tile = tile_end = 0;
    seek(p);
  }
  __device__ __forceinline__ void next(const P& p) {
    if (++tile < tile_end) return;
    seek(p);
  }
  // To the first tile of the next non-empty range: the next list entry of this head (dense: one
  // entry, all tiles), else the next head's first.
  __device__ __forceinline__ void seek(const P& p) {
    const int tiles_q = k[0], i_first = k[1];
    for (; hh < p.group; ++hh, e = 0) {
      if (!kSparse || !p.q_count) {
        if (e++ == 0 && i_first < tiles_q) {
          tile = i_first, tile_end = tiles_q;
          return;
        }
        continue;
      }
      const int row = k[2] + hh * k[3];
      const int n_e = __ldg(p.q_count + row);
      while (e < n_e) {
        const int lo = __ldg(p.q_index + size_t(row) * p.mask_nI + e) * p.bm_tiles;
        ++e;
        tile = max(lo, i_first), tile_end = min(lo + p.bm_tiles, tiles_q);
        if (tile < tile_end) return;
      }
    }
  }
};

}  // namespace
}  // namespace ladder::fa3
