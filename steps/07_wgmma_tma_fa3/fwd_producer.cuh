// Rung 07's forward producer: one elected thread of warpgroup 0 issues the TMA copies of Q and
// of the K/V tiles into the rings, waiting for a free stage on the empty barriers
// (FlashAttention-3's CollectiveMainloopFwd::load). Included by wgmma_tma_fa3.cu only.
#pragma once
#include "exercise.hpp"
#include "tile_scheduler.cuh"

namespace ladder::fa3 {
namespace {

// ---- TMA issue (one thread) -------------------------------------------------------------
template <class S>
__device__ __forceinline__ void load_q(const Item& c, unsigned char* smem, uint64_t* bar,
                                       const CUtensorMap* tm) {
  mbar_arrive_expect_tx(bar, S::kQBytes);
#pragma unroll
  for (int hf = 0; hf < S::kHalves; ++hf)
    tma_load_3d(smem + S::kQ + hf * S::kBr * kRowBytes, tm, bar, hf * 64, c.i0, c.bh);
}
// K or V tile `tile` into stage `st` of the ring at byte offset `base`.
template <class S>
__device__ __forceinline__ void load_kv(const Item& c, unsigned char* smem, const CUtensorMap* tm,
                                        int base, uint64_t* full, int st, int tile) {
  mbar_arrive_expect_tx(full, S::kKVBytes);
#pragma unroll
  for (int hf = 0; hf < S::kHalves; ++hf)
    tma_load_3d(smem + base + st * S::kKVBytes + hf * kBc * kRowBytes, tm, full, hf * 64,
                tile * kBc, c.bhk);
}
// The K/V copies of one item, by the producer's one thread: for each tile wait for a free
// stage (empty barrier), announce the bytes and start the copy. A fresh barrier's parity-1
// wait passes at once, so the first pass over the ring does not wait. kVLag: V_{t-1} is issued
// after K_t (as FlashAttention-3 does), so K_{t+1}, which the next S GEMM needs first, is not
// held up behind V_t's wait for its stage.
template <class S, int kStages, bool kVLag, bool kTrace>
__device__ __forceinline__ void produce_kv(const Item& c, unsigned char* smem, Bars& bars,
                                           RingPos& pos, const CUtensorMap* tm_k,
                                           const CUtensorMap* tm_v, Trace<kTrace>& tr) {
  const int n = c.walk.n_iter;
  auto load_k = [&](int t) {
    const uint32_t st = pos.k % kStages, use = pos.k / kStages;
    const int tile = c.walk.tile(t);
    // EXERCISE BEGIN ring-parity [hard]
    // Concept: an mbarrier ring: the phase parity of the k-th use of a stage, and why the
    // producer's first wait on an empty slot must pass at once.
    //
    // Stage st of K's ring is about to be used for the use-th time (use = pos.k / kStages).
    // Wait on bars.empty_k[st] until the consumers have released it from its previous use
    // (their releases of each use complete one phase of that barrier). The parity of a phase
    // is its index mod 2. Trap: on use 0 nothing has been released yet, and the wait must
    // still pass: on a fresh barrier, parity 1 counts as the phase before the first.
    mbar_wait(&bars.empty_k[st], (use & 1) ^ 1);
    // EXERCISE END
    fault_delay();
    load_kv<S>(c, smem, tm_k, S::kK, &bars.full_k[st], int(st), tile);
    const unsigned long long ti = tr.now();
    tr.add(kTraceTmaIssueK, tile, ti, ti);
    ++pos.k;
  };
  auto load_v = [&](int t) {
    const uint32_t st = pos.v % kStages, use = pos.v / kStages;
    const int tile = c.walk.tile(t);
    // EXERCISE BEGIN ring-parity-v [easy]
    // Concept: V's ring: its own stages, barriers and position counter, the same phase rule.
    //
    // As in load_k, for stage st of V's ring (use = pos.v / kStages) and bars.empty_v[st].
    mbar_wait(&bars.empty_v[st], (use & 1) ^ 1);
    // EXERCISE END
    load_kv<S>(c, smem, tm_v, S::kV, &bars.full_v[st], int(st), tile);
    const unsigned long long ti = tr.now();
    tr.add(kTraceTmaIssueV, tile, ti, ti);
    ++pos.v;
  };
  for (int t = 0; t < n; ++t) {
    load_k(t);
    if constexpr (kVLag) {
      if (t > 0) load_v(t - 1);
    } else {
      load_v(t);
    }
  }
  if constexpr (kVLag) {
    if (n > 0) load_v(n - 1);
  }
}

// The producer of the warp-specialised (one item per CTA) kernels: Q, then K_t, V_t per tile.
template <class S, int kStages, bool kTrace>
__device__ __forceinline__ void producer(const Item& c, unsigned char* smem, Bars& bars,
                                         const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                                         const CUtensorMap* tm_v, Trace<kTrace>& tr) {
  if (c.walk.n_iter == 0) return;
  tr.writer = true;  // elect.sync need not pick lane 0
  tma_prefetch_descriptor(tm_q);
  tma_prefetch_descriptor(tm_k);
  tma_prefetch_descriptor(tm_v);
  load_q<S>(c, smem, &bars.q_full, tm_q);
  RingPos pos;
  produce_kv<S, kStages, false, kTrace>(c, smem, bars, pos, tm_k, tm_v, tr);
}

// The producer of the persistent kernels. Per item: wait until the consumers' last S GEMM of
// the previous item has read Q (q_empty), load Q, then the item's K/V tiles; then take the next
// item from the scheduler and hand it to the consumers (tile_scheduler.cuh).
template <class S, int kStages, bool kExtras, bool kTrace>
__device__ __forceinline__ void persistent_producer(const KParams& p, unsigned char* smem,
                                                    Bars& bars, const CUtensorMap* tm_q,
                                                    const CUtensorMap* tm_k,
                                                    const CUtensorMap* tm_v, Trace<kTrace>& tr) {
  tr.writer = true;
  tma_prefetch_descriptor(tm_q);
  tma_prefetch_descriptor(tm_k);
  tma_prefetch_descriptor(tm_v);
  RingPos pos;
  uint32_t published = 0;
  for (int idx = int(blockIdx.x); idx < p.items;) {
    int mt, bh;
    item_coords(p, idx, mt, bh);
    const Item c = make_item<S::kBr, kExtras>(p, mt, bh);
    if (c.walk.n_iter > 0) {
      mbar_wait(&bars.q_empty, (pos.q & 1) ^ 1);
      load_q<S>(c, smem, &bars.q_full, tm_q);
      ++pos.q;
      produce_kv<S, kStages, true, kTrace>(c, smem, bars, pos, tm_k, tm_v, tr);
    }
    idx = take_next_item(p);
    publish_item(bars, published, idx);
  }
}

}  // namespace
}  // namespace ladder::fa3
