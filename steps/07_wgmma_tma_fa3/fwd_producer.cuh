// Rung 07's forward producer: one elected thread of warpgroup 0 issues the TMA copies of Q and
// of the K/V tiles into the rings, waiting for a free stage on the empty barriers
// (FlashAttention-3's CollectiveMainloopFwd::load). Included by wgmma_tma_fa3.cu only.
#pragma once
#include "exercise.hpp"
#include "fwd_params.cuh"
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
    tma_load_4d(smem + S::kQ + hf * S::kBr * kRowBytes, tm, bar, hf * 64, c.i0, c.h, c.b);
}
// K or V tile `tile` into stage `st` of the ring at byte offset `base`.
template <class S>
__device__ __forceinline__ void load_kv(const Item& c, unsigned char* smem, const CUtensorMap* tm,
                                        int base, uint64_t* full, int st, int tile) {
  // EXERCISE BEGIN tma-expect-tx [medium]
  // Concept: a TMA copy completes on an mbarrier by its bytes: the issuing thread announces
  // how many will land (arrive.expect_tx), then starts the copies, whose bytes count it down.
  //
  // Copy K (or V) tile `tile`, rows tile * kBc .. of K/V head c.hk of batch c.b, into stage st
  // of the ring at byte offset `base`, completing on `full`. The stage holds S::kHalves column
  // halves of kBc rows x 64 columns, half hf at hf * kBc * kRowBytes; tma_load_4d takes the
  // box's coordinates innermost first (column, row, head, batch). Trap: the count is whole boxes,
  // rows past the last key (zero-filled) included: too many bytes never complete the phase, too few
  // let the consumers read a tile before it has landed.
  mbar_arrive_expect_tx(full, S::kKVBytes);
#pragma unroll
  for (int hf = 0; hf < S::kHalves; ++hf)
    tma_load_4d(smem + base + st * S::kKVBytes + hf * kBc * kRowBytes, tm, full, hf * 64,
                tile * kBc, c.hk, c.b);
  // EXERCISE END
}

// ---- cp.async issue (every thread of the CTA: the wgmma variant) ------------------------
// Rows row0 .. row0 + kRows - 1 of one head of a 16-bit tensor (its row 0 `head` elements past
// `base`, rows `row` elements apart) into the layout the TMA writes (fa3.cuh), rows past `rows`
// zero-filled; each of the kThreads threads copies every kThreads-th chunk (the caller commits).
template <int kRows, int D, int kThreads>
__device__ __forceinline__ void cp_async_tile(uint32_t dst, const void* base, int64_t head,
                                              int64_t row, int row0, int rows) {
  constexpr int kChunks = D / 8;  // per row
  static_assert(kRows * kChunks % kThreads == 0, "whole chunks per thread");
#pragma unroll
  for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
    const int idx = i * kThreads + int(threadIdx.x), r = idx / kChunks, cc = idx % kChunks;
    const bool valid = row0 + r < rows;
    const int64_t at = valid ? head + (row0 + r) * row + cc * 8 : 0;  // elements
    cp_async_16(dst + (cc / 8) * (kRows * kRowBytes) + r * kRowBytes + ((cc % 8) ^ (r % 8)) * 16,
                static_cast<const uint16_t*>(base) + at, valid);
  }
}
template <class S, int D, int kThreads>
__device__ __forceinline__ void cp_async_q(const Item& c, const KParams& p, uint32_t base) {
  const Strides& st = p.q_strides;
  cp_async_tile<S::kBr, D, kThreads>(base + S::kQ, p.q, c.b * st.batch + c.h * st.head, st.row,
                                     c.i0, p.seq_q);
}
template <class S, int D, int kThreads>
__device__ __forceinline__ void cp_async_kv(const Item& c, const KParams& p, uint32_t base, int st,
                                            int tile) {
  const Strides &ks = p.k_strides, &vs = p.v_strides;
  cp_async_tile<kBc, D, kThreads>(base + S::kK + st * S::kKVBytes, p.k,
                                  c.b * ks.batch + c.hk * ks.head, ks.row, tile * kBc, p.seq_k);
  cp_async_tile<kBc, D, kThreads>(base + S::kV + st * S::kKVBytes, p.v,
                                  c.b * vs.batch + c.hk * vs.head, vs.row, tile * kBc, p.seq_k);
}

// The K and V copies of one item into the stage of a ring use (`count`), with the hooks: the
// fault build idles before each K copy (fwd_params.cuh), the trace marks each issue.
template <class S, int kStages, bool kTrace>
struct KVCopies {
  const Item& c;
  unsigned char* const smem;
  Bars<kStages>& bars;
  const CUtensorMap* const tm_k;
  const CUtensorMap* const tm_v;
  Trace<kTrace>& tr;

  __device__ __forceinline__ void k(uint32_t count, int tile) const {
    fault_delay();
    load_kv<S>(c, smem, tm_k, S::kK, bars.k().full_bar(count), int(bars.k().stage(count)), tile);
    tr.mark(kTraceTmaIssueK, tile);
  }
  __device__ __forceinline__ void v(uint32_t count, int tile) const {
    load_kv<S>(c, smem, tm_v, S::kV, bars.v().full_bar(count), int(bars.v().stage(count)), tile);
    tr.mark(kTraceTmaIssueV, tile);
  }
  // tma-wgmma (no producer, no empty barriers): K and V together into stage st, by the
  // computing threads' thread 0.
  __device__ __forceinline__ void both(int st, int tile) const {
    fault_delay();
    load_kv<S>(c, smem, tm_k, S::kK, &bars.full_k[st], st, tile);
    load_kv<S>(c, smem, tm_v, S::kV, &bars.full_v[st], st, tile);
    tr.mark(kTraceTmaIssueK, tile);
  }
};

// The K/V copies of one item, by the producer's one thread: for each tile wait for a free
// stage (empty barrier), announce the bytes and start the copy. kVLag: V_{t-1} is issued after
// K_t (as FlashAttention-3 does), so K_{t+1}, which the next S GEMM needs first, is not held up
// behind V_t's wait for its stage.
template <bool kVLag, class S, int kStages, bool kTrace>
__device__ __forceinline__ void produce_kv(const KVCopies<S, kStages, kTrace>& copy, RingPos& pos) {
  const Item& c = copy.c;
  const int n = c.walk.n_iter;
  auto load_k = [&](int t) {
    const int tile = c.walk.tile(t);
    copy.bars.k().acquire(pos.k);
    copy.k(pos.k, tile);
    ++pos.k;
  };
  auto load_v = [&](int t) {
    const int tile = c.walk.tile(t);
    // EXERCISE BEGIN ring-parity-v [easy]
    // Concept: V's ring: its own stages, barriers and position counter, the same phase rule.
    //
    // As load_k does for K's ring: wait until V's stage for its use pos.v is free
    // (copy.bars.v(), a Pipeline: hopper.cuh).
    copy.bars.v().acquire(pos.v);
    // EXERCISE END
    copy.v(pos.v, tile);
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

// Every producer's start: it records the trace (elect.sync need not pick lane 0) and brings
// the tensor maps into the cache.
template <bool kTrace>
__device__ __forceinline__ void producer_start(const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                                               const CUtensorMap* tm_v, Trace<kTrace>& tr) {
  tr.writer = true;
  tma_prefetch_descriptor(tm_q);
  tma_prefetch_descriptor(tm_k);
  tma_prefetch_descriptor(tm_v);
}

// The producer of the warp-specialised (one item per CTA) kernels: Q, then K_t, V_t per tile.
template <class S, int kStages, bool kTrace>
__device__ __forceinline__ void producer(const Item& c, unsigned char* smem, Bars<kStages>& bars,
                                         const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                                         const CUtensorMap* tm_v, Trace<kTrace>& tr) {
  if (c.walk.n_iter == 0) return;
  producer_start(tm_q, tm_k, tm_v, tr);
  load_q<S>(c, smem, bars.q().full_bar(0), tm_q);
  RingPos pos;
  produce_kv<false>(KVCopies<S, kStages, kTrace>{c, smem, bars, tm_k, tm_v, tr}, pos);
}

// The producer of the persistent kernels. Per item: wait until the consumers' last S GEMM of
// the previous item has read Q (Q's ring), load Q, then the item's K/V tiles; then take the
// next item from the scheduler and hand it to the consumers (tile_scheduler.cuh).
template <class S, int kStages, bool kExtras, bool kTrace>
__device__ __forceinline__ void persistent_producer(const KParams& p, unsigned char* smem,
                                                    Bars<kStages>& bars, const CUtensorMap* tm_q,
                                                    const CUtensorMap* tm_k,
                                                    const CUtensorMap* tm_v, Trace<kTrace>& tr) {
  producer_start(tm_q, tm_k, tm_v, tr);
  RingPos pos;
  uint32_t published = 0;
  for (int idx = int(blockIdx.x); idx < p.items;) {
    int mt, bh;
    item_coords(p, idx, mt, bh);
    const Item c = make_item<S::kBr, kExtras>(p, mt, bh);
    if (c.walk.n_iter > 0) {
      bars.q().acquire(pos.q);
      load_q<S>(c, smem, bars.q().full_bar(pos.q), tm_q);
      ++pos.q;
      produce_kv<true>(KVCopies<S, kStages, kTrace>{c, smem, bars, tm_k, tm_v, tr}, pos);
    }
    idx = take_next(p.counter, p.items);
    publish_item(bars.sched(), bars.next_item, published, idx);
  }
}

}  // namespace
}  // namespace ladder::fa3
