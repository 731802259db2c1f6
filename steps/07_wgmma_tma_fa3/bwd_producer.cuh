// Rung 07's backward producer warpgroup: the TMA and bulk copies of Q, L, dO and D into the ring
// (warp 0), over the CTA's units and the Q tiles that see each unit's K/V tile
// (tile_scheduler.cuh's take_next and BwdWalk), and
// the dQ writer that adds each item's dQ with TMA reduce-add (warp 1). FlashAttention-3:
// CollectiveMainloopBwd::load and store_dq. Included by wgmma_tma_fa3_backward.cu only.
#pragma once
#include "bwd_params.cuh"
#include "tile_scheduler.cuh"

namespace ladder::fa3 {
namespace {

// ---- the producer: warp 0, one elected thread ---------------------------------------------
// Per unit of the CTA (tile_scheduler.cuh: its first, then from the work counter), per item, into
// stage x % 2 once both consumers released it: Q_i with L_i on full_q, dO_i with D_i on full_do;
// after the unit's first item, once both consumers are done with the previous unit's, K_j and V_j
// on kv_full. L and D are 1-D bulk copies of Br floats from the padded pre-pass rows (always in
// bounds and 16-byte aligned). A unit with no item (only a block mask leaves one, and then the CTA
// owns that one unit) has nothing to load: the kernel's prologue found it (g_has_items = 0), a
// plain arrive completes kv_full's first phase, and the consumers store zeros. At 24 registers the
// loops spill a few words to the stack (ptxas -v): per unit, and one store and load per item,
// against an item's thousands of cycles.
template <int D, bool kExtras>
__device__ __forceinline__ void producer(unsigned char* smem, const CUtensorMap* tm_q,
                                         const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                         const CUtensorMap* tm_do, const KParams& p) {
  using C = Cfg<D>;
  constexpr int kBr = C::kBr;
  BwdWalk<KParams, kExtras, kBr> walk{g_walk};
  const Pipeline<kStages> q = q_ring(), dO = do_ring();
  const Pipeline<1> kv = kv_ring();
  int x = 0;
  for (int r = 0, u = int(blockIdx.x);; ++r) {
    walk.start(p, u);
    if (!walk.valid(p)) {  // (a CTA's first unit, with a block mask: g_has_items = 0)
      mbar_arrive_if(kv.full_bar(0), true);  // the consumers wait for unit 0's K/V first
      return;
    }
    for (bool first = true;; ++x, first = false) {
      const int st = int(q.stage(x));
      const int h = walk.hk() * p.group + walk.hh, i0 = walk.tile * kBr, b = walk.b();
      const int bh = b * p.heads + h;
      walk.next(p);
      const bool unit_last = !walk.valid(p);
      q.acquire(x);  // (dO's ring shares the empty barriers)
      // The next unit, if any, taken at the last item's stage, two items before the consumers
      // finish this unit: taken at its first, a CTA would hold on to the next unit for the whole
      // of a long one, and the end of a causal launch would wait on it (causal seq 16384 at
      // d = 128: units of 2 to 256 items).
      if (unit_last) u = p.counter ? take_next(p.counter, p.units) : p.units;
      g_items[x % kItemSlots] = ItemInfo{
          h, i0, walk.jt(), b << 2 | (unit_last ? 2 : 0) | (unit_last && u >= p.units ? 1 : 0)};
      // A tile (Q_i or dO_i) at byte offset `tile` and its Br floats (L_i or D_i) at `row`.
      auto load = [&](uint64_t* full, const CUtensorMap* tm, int tile, int row, const float* rows) {
        mbar_arrive_expect_tx(full, C::kQBytes + kBr * 4);
#pragma unroll
        for (int hf = 0; hf < D / 64; ++hf)
          tma_load_4d(smem + tile + st * C::kQBytes + hf * kBr * kRowBytes, tm, full, hf * 64, i0,
                      h, b);
        bulk_load(smem + row + st * kBr * 4, rows + size_t(bh) * p.m_pad + i0, kBr * 4, full);
      };
      load(q.full_bar(x), tm_q, C::kQ, C::kL, p.lse2);
      load(dO.full_bar(x), tm_do, C::kDO, C::kDsum, p.dsum);
      // The unit's K_j, V_j after its first Q_i and dO_i, which so land while the consumers
      // finish the previous unit; K_j, V_j wait until they have.
      if (first) {
        kv.acquire(r);
        mbar_arrive_expect_tx(kv.full_bar(r), 2 * C::kKVBytes);
#pragma unroll
        for (int hf = 0; hf < D / 64; ++hf) {
          const int j0 = walk.jt() * kBc;
          tma_load_4d(smem + C::kK + hf * kBc * kRowBytes, tm_k, kv.full_bar(r), hf * 64, j0,
                      walk.hk(), walk.b());
          tma_load_4d(smem + C::kV + hf * kBc * kRowBytes, tm_v, kv.full_bar(r), hf * 64, j0,
                      walk.hk(), walk.b());
        }
      }
      if (unit_last) break;
    }
    ++x;
    if (u >= p.units) break;
  }
}

// ---- the dQ writer (tma-reduce): warp 1, one elected thread -------------------------------
// Per item, once warpgroup w has staged its part (dq_full), add it to dQ_acc: two boxes of
// 64 rows x 32 columns. d = 128: warpgroup w has columns 64w .. of the item's 64 rows; d = 64:
// rows 64w .. of its 128, all 64 columns. Then wait until the copy engine has read both parts
// and hand the staging tiles back (dq_empty). It waits on no other barrier: one that the
// consumers can move on by two phases before the writer first looks (kv_full, after a one-item
// unit) would leave it waiting on the wrong phase for ever.
template <int D>
__device__ __forceinline__ void dq_writer(unsigned char* smem, const CUtensorMap* tm_dq,
                                          const KParams& p) {
  using C = Cfg<D>;
  if (!g_has_items) return;
  tma_prefetch_descriptor(tm_dq);
  for (int x = 0;; ++x) {
    ItemInfo item{};
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      dq_ring(w).wait(x);
      item = g_items[x % kItemSlots];  // (complete once a dq_full of item x is seen)
      const int row = item.i0 + (D == 128 ? 0 : 64 * w), col = D == 128 ? 64 * w : 0;
      if (row < p.seq_q) {  // (a part wholly past seq_q would be clipped anyway)
#pragma unroll
        for (int box = 0; box < 2; ++box)
          tma_reduce_add_3d(tm_dq, smem + C::kDQ + w * kDqWgBytes + box * kDqBoxBytes,
                            col + 32 * box, row, item.b() * p.heads + item.h);
      }
    }
    bulk_commit();
    bulk_wait_read<0>();
    dq_ring(0).release(x, true);
    dq_ring(1).release(x, true);
    if (item.last()) break;
  }
  bulk_wait<0>();  // every add done before the CTA ends
}

}  // namespace
}  // namespace ladder::fa3
