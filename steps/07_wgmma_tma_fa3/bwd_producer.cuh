// Rung 07's backward producer warpgroup: the walk over the Q tiles that see this CTA's K/V tile
// (the backward's tile scheduler), the TMA and bulk copies of Q, L, dO and D into the ring
// (warp 0), and the dQ writer that adds each item's dQ with TMA reduce-add (warp 1).
// FlashAttention-3: CollectiveMainloopBwd::load and store_dq. Included by
// wgmma_tma_fa3_backward.cu only.
#pragma once
#include "bwd_params.cuh"

namespace ladder::fa3 {
namespace {

// ---- the items one CTA walks (the producer) --------------------------------------------------
// For each query head hh of the group in turn, the Q tiles from i_first (the first tile that sees
// a key of this K/V tile under the causal mask) to the end; block-sparse: only the tiles of the
// kept query blocks in that head's mask row for this key block (ascending).
// Only the position is state (the producer runs on 24 registers): the walk's constants are
// computed once into shared memory (g_walk, the producer's own) and read back when a range ends.
__shared__ int g_walk[4];  // tiles_q, i_first, mask row of head 0, mask row stride per head

template <bool kSparse, int kBr>
struct Walk {
  int hh, tile, tile_end, e;  // e: the next list entry of head hh (dense: 0 or 1)

  __device__ __forceinline__ bool valid(const KParams& p) const { return hh < p.group; }
  __device__ __forceinline__ void start(const KParams& p) {
    g_walk[0] = (p.seq_q + kBr - 1) / kBr;
    // Bottom-right causal: key j visible to query i iff j <= i + N - M, so rows below
    // j0 - (N - M) see no key of this tile (every key < N is seen by the last row).
    g_walk[1] = p.causal ? max(0, int(blockIdx.x) * kBc - (p.seq_k - p.seq_q)) / kBr : 0;
    if constexpr (kSparse) {
      // Mask row of (b', h', key block J): (b' mask_heads + h') nJ + J, with b' = 0 if the mask
      // is shared by the batch, h' = 0 if shared by the heads; query head h = hk group + hh.
      const int mb = p.mask_batch == 1 ? 0 : int(blockIdx.z);
      const int mh0 = p.mask_heads == 1 ? 0 : int(blockIdx.y) * p.group;
      g_walk[2] = (mb * p.mask_heads + mh0) * p.mask_nJ + int(blockIdx.x) / p.bn_tiles;
      g_walk[3] = p.mask_heads == 1 ? 0 : p.mask_nJ;
    }
    hh = 0, e = 0, tile = tile_end = 0;
    seek(p);
  }
  __device__ __forceinline__ void next(const KParams& p) {
    if (++tile < tile_end) return;
    seek(p);
  }
  // To the first tile of the next non-empty range: the next list entry of this head (dense: one
  // entry, all tiles), else the next head's first.
  __device__ __forceinline__ void seek(const KParams& p) {
    const int tiles_q = g_walk[0], i_first = g_walk[1];
    for (; hh < p.group; ++hh, e = 0) {
      if (!kSparse || !p.q_count) {
        if (e++ == 0 && i_first < tiles_q) {
          tile = i_first, tile_end = tiles_q;
          return;
        }
        continue;
      }
      const int row = g_walk[2] + hh * g_walk[3];
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

// ---- the producer: warp 0, one elected thread ---------------------------------------------
// K_j, V_j once; then per item, into stage x % 2 once both consumers released it: Q_i with L_i
// on full_q, dO_i with D_i on full_do. L and D are 1-D bulk copies of Br floats from the
// padded pre-pass rows (always in bounds and 16-byte aligned). With no item at all it only
// says so (has_items = 0, a plain arrive on bar_kv): the others wait for bar_kv first.
template <int D, bool kExtras>
__device__ __forceinline__ void producer(unsigned char* smem, const CUtensorMap* tm_q,
                                         const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                         const CUtensorMap* tm_do, const KParams& p) {
  using C = Cfg<D>;
  constexpr int kBr = C::kBr;
  // (Block coordinates are re-read where needed rather than kept: 24 registers.)
  Walk<kExtras, kBr> walk;
  walk.start(p);
  g_has_items = walk.valid(p) ? 1 : 0;
  if (!walk.valid(p)) {
    mbar_arrive_if(&g_bars.kv, true);
    return;
  }
  {
    const int j0 = int(blockIdx.x) * kBc, bhk = int(blockIdx.z) * p.heads_kv + int(blockIdx.y);
    mbar_arrive_expect_tx(&g_bars.kv, 2 * C::kKVBytes);
#pragma unroll
    for (int hf = 0; hf < D / 64; ++hf) {
      tma_load_3d(smem + C::kK + hf * kBc * kRowBytes, tm_k, &g_bars.kv, hf * 64, j0, bhk);
      tma_load_3d(smem + C::kV + hf * kBc * kRowBytes, tm_v, &g_bars.kv, hf * 64, j0, bhk);
    }
  }
  for (int x = 0;; ++x) {
    const int st = x % kStages, use = x / kStages;
    const int h = int(blockIdx.y) * p.group + walk.hh, i0 = walk.tile * kBr;
    const int bh = int(blockIdx.z) * p.heads + h;
    walk.next(p);
    mbar_wait(&g_bars.empty[st], (use & 1) ^ 1);  // the first pass is free (parity 1)
    g_items[x % kItemSlots] = ItemInfo{h, i0, walk.valid(p) ? 0 : 1, 0};
    uint64_t* fq = &g_bars.full_q[st];
    mbar_arrive_expect_tx(fq, C::kQBytes + kBr * 4);
#pragma unroll
    for (int hf = 0; hf < D / 64; ++hf)
      tma_load_3d(smem + C::kQ + st * C::kQBytes + hf * kBr * kRowBytes, tm_q, fq, hf * 64, i0, bh);
    bulk_load(smem + C::kL + st * kBr * 4, p.lse2 + size_t(bh) * p.m_pad + i0, kBr * 4, fq);
    uint64_t* fd = &g_bars.full_do[st];
    mbar_arrive_expect_tx(fd, C::kQBytes + kBr * 4);
#pragma unroll
    for (int hf = 0; hf < D / 64; ++hf)
      tma_load_3d(smem + C::kDO + st * C::kQBytes + hf * kBr * kRowBytes, tm_do, fd, hf * 64, i0,
                  bh);
    bulk_load(smem + C::kDsum + st * kBr * 4, p.dsum + size_t(bh) * p.m_pad + i0, kBr * 4, fd);
    if (!walk.valid(p)) break;
  }
}

// ---- the dQ writer (tma-reduce): warp 1, one elected thread -------------------------------
// Per item, once warpgroup w has staged its part (dq_full), add it to dQ_acc: two boxes of
// 64 rows x 32 columns. d = 128: warpgroup w has columns 64w .. of the item's 64 rows; d = 64:
// rows 64w .. of its 128, all 64 columns. Then wait until the copy engine has read both parts
// and hand the staging tiles back (dq_empty).
template <int D>
__device__ __forceinline__ void dq_writer(const Ctx& c, const CUtensorMap* tm_dq,
                                          const KParams& p) {
  using C = Cfg<D>;
  mbar_wait(&g_bars.kv, 0);
  if (!g_has_items) return;
  tma_prefetch_descriptor(tm_dq);
  for (int x = 0;; ++x) {
    ItemInfo item{};
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      mbar_wait(&g_bars.dq_full[w], x & 1);
      item = g_items[x % kItemSlots];  // (complete once a dq_full of item x is seen)
      const int row = item.i0 + (D == 128 ? 0 : 64 * w), col = D == 128 ? 64 * w : 0;
      if (row < c.M) {  // (a part wholly past seq_q would be clipped anyway)
#pragma unroll
        for (int box = 0; box < 2; ++box)
          tma_reduce_add_3d(tm_dq, c.smem + C::kDQ + w * kDqWgBytes + box * kDqBoxBytes,
                            col + 32 * box, row, c.b * p.heads + item.h);
      }
    }
    bulk_commit();
    bulk_wait_read<0>();
    mbar_arrive_if(&g_bars.dq_empty[0], true);
    mbar_arrive_if(&g_bars.dq_empty[1], true);
    if (item.last) break;
  }
  bulk_wait<0>();  // every add done before the CTA ends
}

}  // namespace
}  // namespace ladder::fa3
