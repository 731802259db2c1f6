// Rung 07's backward producer warpgroup: the TMA and bulk copies of Q, L, dO and D into the ring
// (warp 0), over the Q tiles that see this CTA's K/V tile (tile_scheduler.cuh's BwdWalk), and
// the dQ writer that adds each item's dQ with TMA reduce-add (warp 1). FlashAttention-3:
// CollectiveMainloopBwd::load and store_dq. Included by wgmma_tma_fa3_backward.cu only.
#pragma once
#include "bwd_params.cuh"
#include "tile_scheduler.cuh"

namespace ladder::fa3 {
namespace {

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
  BwdWalk<KParams, kExtras, kBr> walk{g_walk};
  walk.start(p);
  g_has_items = walk.valid(p) ? 1 : 0;
  if (!walk.valid(p)) {
    mbar_arrive_if(&g_bars.kv, true);
    return;
  }
  {
    const int j0 = int(blockIdx.x) * kBc, hk = int(blockIdx.y), b = int(blockIdx.z);
    mbar_arrive_expect_tx(&g_bars.kv, 2 * C::kKVBytes);
#pragma unroll
    for (int hf = 0; hf < D / 64; ++hf) {
      tma_load_4d(smem + C::kK + hf * kBc * kRowBytes, tm_k, &g_bars.kv, hf * 64, j0, hk, b);
      tma_load_4d(smem + C::kV + hf * kBc * kRowBytes, tm_v, &g_bars.kv, hf * 64, j0, hk, b);
    }
  }
  const Pipeline<kStages> q = q_ring(), dO = do_ring();
  for (int x = 0;; ++x) {
    const int st = int(q.stage(x));
    const int h = int(blockIdx.y) * p.group + walk.hh, i0 = walk.tile * kBr;
    const int bh = int(blockIdx.z) * p.heads + h;
    walk.next(p);
    q.acquire(x);  // (dO's ring shares the empty barriers)
    g_items[x % kItemSlots] = ItemInfo{h, i0, walk.valid(p) ? 0 : 1, 0};
    // A tile (Q_i or dO_i) at byte offset `tile` and its Br floats (L_i or D_i) at `row`.
    auto load = [&](uint64_t* full, const CUtensorMap* tm, int tile, int row, const float* rows) {
      mbar_arrive_expect_tx(full, C::kQBytes + kBr * 4);
#pragma unroll
      for (int hf = 0; hf < D / 64; ++hf)
        tma_load_4d(smem + tile + st * C::kQBytes + hf * kBr * kRowBytes, tm, full, hf * 64, i0, h,
                    int(blockIdx.z));
      bulk_load(smem + row + st * kBr * 4, rows + size_t(bh) * p.m_pad + i0, kBr * 4, full);
    };
    load(q.full_bar(x), tm_q, C::kQ, C::kL, p.lse2);
    load(dO.full_bar(x), tm_do, C::kDO, C::kDsum, p.dsum);
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
      dq_ring(w).wait(x);
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
    dq_ring(0).release(x, true);
    dq_ring(1).release(x, true);
    if (item.last) break;
  }
  bulk_wait<0>();  // every add done before the CTA ends
}

}  // namespace
}  // namespace ladder::fa3
