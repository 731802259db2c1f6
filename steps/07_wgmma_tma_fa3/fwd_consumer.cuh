// Rung 07's forward consumers: the GEMM issue, the masked online softmax, the three main loops
// (one per schedule) and the epilogue (FlashAttention-3's CollectiveMainloopFwd::mma and
// CollectiveEpilogueFwd). Included by wgmma_tma_fa3.cu only.
#pragma once
#include "dropout.hpp"
#include "exercise.hpp"
#include "fwd_producer.cuh"

namespace ladder::fa3 {
namespace {

// ---- the consumer's pieces --------------------------------------------------------------

// The thread's place in the softmax: rows row0 and row0 + 8 of the tile (query rows
// i0 + row0, + 8); columns 2t, 2t+1 of every n8 block.
struct RowInfo {
  int t, lane;
  int limit[2];  // first hidden key of each row (causal / end of keys)
  int row16;     // the 16-row block index of this warp's rows (dropout counter)
};

// Mask (when needed) and online softmax of S in place (S becomes unnormalised P, fp32); returns
// in `alpha` the factor by which each row's O must be rescaled.
__device__ __forceinline__ void softmax_tile(float (&s)[kBc / 2], float (&m)[2], float (&l)[2],
                                             float (&alpha)[2], const RowInfo& ri, int tile,
                                             bool need_mask, const KParams& p) {
  const int key0 = tile * kBc;
  if (need_mask) {
#pragma unroll
    for (int cb = 0; cb < kBc / 8; ++cb)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int i = 0; i < 2; ++i)
          if (key0 + cb * 8 + 2 * ri.t + i >= ri.limit[r]) s[4 * cb + 2 * r + i] = kNegInf;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = m[r];
#pragma unroll
    for (int cb = 0; cb < kBc / 8; ++cb)
      mx = fmaxf(mx, fmaxf(s[4 * cb + 2 * r], s[4 * cb + 2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the 4 lanes of a row
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // EXERCISE BEGIN softmax-tile [medium]
    // Concept: the online softmax in base 2 with tau log2(e) folded into one FFMA per score,
    // on the wgmma accumulator layout.
    //
    // m[r], l[r]: the running max (of unscaled scores) and this thread's share of row r's
    // sum; mx: the new max, over this tile's row (the quad's 4 threads) and m[r]. Leave
    // alpha[r] (the factor for O), m[r], the row's scores s[4 cb + 2 r + i] as the
    // unnormalised weights exp(tau (s - m)), and their sum folded into l[r]. Tools:
    // p.score.scale_log2 (tau log2 e) and fast_exp2; one fmaf and one exp2 per score. Trap: a row
    // that has seen only masked keys so far.
    const float mx_scaled = mx == kNegInf ? 0.f : mx * p.score.scale_log2;
    alpha[r] = rescale_factor(m[r], mx, p.score.scale_log2);  // exactly 1 if the max held
    m[r] = mx;
    float sum = 0.f;
#pragma unroll
    for (int cb = 0; cb < kBc / 8; ++cb)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        // exp(tau (s - m)) = exp2(s tau log2e - m tau log2e): one FFMA, one ex2
        const float pe = fast_exp2(fmaf(s[4 * cb + 2 * r + i], p.score.scale_log2, -mx_scaled));
        s[4 * cb + 2 * r + i] = pe;
        sum += pe;
      }
    l[r] = alpha[r] * l[r] + sum;  // this thread's columns; the quad adds up at the end
    // EXERCISE END
  }
}

template <int D>
__device__ __forceinline__ void rescale_o(float (&o)[D / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int cb = 0; cb < D / 8; ++cb)
#pragma unroll
    for (int r = 0; r < 2; ++r) o[4 * cb + 2 * r] *= alpha[r], o[4 * cb + 2 * r + 1] *= alpha[r];
}

// P (fp32 in the S registers) -> the A fragments of the PV product (hopper.cuh: the layouts).
template <class T>
__device__ __forceinline__ void convert_p(uint32_t (&pf)[kBc / 16][4], const float (&s)[kBc / 2]) {
  // EXERCISE BEGIN convert-p [easy]
  // Concept: wgmma's D layout, packed pairwise to 16 bits, is its A-from-registers layout.
  //
  // Fill pf[kk][0..3], the A fragment of P for the k16 step kk (keys 16kk .. 16kk + 15), from
  // the fp32 P in s, packing pairs with pack2<T>(lower column, higher column). hopper.cuh
  // lists both layouts; no shuffle is needed.
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk)
#pragma unroll
    for (int q = 0; q < 4; ++q) pf[kk][q] = pack2<T>(s[8 * kk + 2 * q], s[8 * kk + 2 * q + 1]);
  // EXERCISE END
}

// Dropout's keep flags for key tile `tile` (docs/CONTRACT.md): one Philox call per 16 rows x
// 32 keys gives this lane its 16 8-bit uniforms; zf[kq][w] has the msb of byte n set where
// byte n of word w keeps its element (dropout::kept_msb, four at once). Z does not depend on S,
// so this runs while the warpgroup's own GEMMs are on the tensor cores.
__device__ __forceinline__ void keep_flags(uint32_t (&zf)[kBc / 32][4], const RowInfo& ri, int tile,
                                           const KParams& p, const Item& c) {
  const uint32_t t4 = p.score.drop_threshold * 0x01010101u;
#pragma unroll
  for (int kq = 0; kq < kBc / 32; ++kq) {
    const uint32_t J = uint32_t(tile * (kBc / 32) + kq);
    const dropout::Philox4 w =
        dropout::philox(J * 32u + uint32_t(ri.lane), uint32_t(ri.row16), uint32_t(c.h),
                        uint32_t(c.b), p.score.seed_lo, p.score.seed_hi);
#pragma unroll
    for (int q = 0; q < 4; ++q) zf[kq][q] = dropout::kept_msb(w.w[q], t4);
  }
}

// P o Z on the packed P (convert_p's fragments): one AND per pair of 16-bit weights. l summed
// the undropped P (the LSE is that of P); Z only zeroes P on its way into PV.
__device__ __forceinline__ void drop_p(uint32_t (&pf)[kBc / 16][4],
                                       const uint32_t (&zf)[kBc / 32][4]) {
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      uint32_t mask;  // 0xffff over each kept weight of pf[kk][q]
      // EXERCISE BEGIN dropout-words [hard]
      // Concept: the dropout counter mapping: which byte of which Philox word belongs to each
      // weight of the lane's P fragment (docs/CONTRACT.md).
      //
      // pf[kk][q] holds row g + 8 (q & 1), columns 16 kk + 8 (q >> 1) + 2t (low half) and + 1
      // (high half). zf[kk / 2] are the flags of the call for keys 32 (kk / 2) ..: word w =
      // (r / 8) * 2 + (c / 8) for row r, column c of a 16 x 16 block; in each word, the even
      // column's bytes are 0 (block kk even) and 1 (block kk odd), the odd column's 2 and 3.
      // Set mask with dropout::pair_mask(flags, byte of the low weight, byte of the high one).
      // Trap: the order of the words is not the order of the fragments.
      const uint32_t e = uint32_t(kk % 2);
      mask = dropout::pair_mask(zf[kk / 2][(q & 1) * 2 + (q >> 1)], e, 2 + e);
      // EXERCISE END
      pf[kk][q] &= mask;
    }
}

// ---- the consumer warpgroup: one work item ----------------------------------------------
// The steps the main loops of consumer warpgroup `wg` are written in, on one work item. It
// works on consume_item's registers (O, S, P, the row state: held by reference, as a lambda
// would) and knows where the item's tiles sit in the K and V rings. Each step carries its own
// handshake (a ring's wait or release, the ping-pong turn), its trace stamp and the fault
// build's moved wait; the stamps and the fault are no-ops in the normal build.
template <class T, int D, int kFlags, int kConsumers, int kStages, bool kExtras, bool kTrace>
struct ItemSteps {
  static constexpr bool kWS = kFlags & kWarpSpec, kPP = kFlags & kPingPong,
                        kPers = kFlags & kPersist, kCp = kFlags & kCpAsync;
  using S = Smem<D, kConsumers, kStages, kPers>;
  static constexpr int kBr = S::kBr;

  const Item& c;
  const int wg;
  const KParams& p;
  unsigned char* const smem;
  Bars<kStages>& bars;
  const KVCopies<S, kStages, kTrace>& copy;  // tma-wgmma's refills
  Trace<kTrace>& tr;
  const int &tid, &warp, &lane, &g, &t, &n, &M;
  const uint32_t &kc, &vc;  // ring positions of this item's tile 0
  const uint32_t &base, &q_addr;
  const RowInfo& ri;
  float (&o)[D / 2];
  float (&s)[kBc / 2];
  float (&m)[2];
  float (&l)[2];
  float (&alpha)[2];
  uint32_t (&pf)[kBc / 16][4];
  uint32_t (&zf)[kBc / 32][4];     // dropout (kExtras): the keep flags of the tile in softmax
  unsigned long long &t_s, &t_pv;  // trace: when the S and the PV GEMM in flight began

  __device__ __forceinline__ uint32_t k_addr(int it) const {
    return base + S::kK + bars.k().stage(kc + it) * S::kKVBytes;
  }
  __device__ __forceinline__ uint32_t v_addr(int it) const {
    return base + S::kV + bars.v().stage(vc + it) * S::kKVBytes;
  }

  // The rings' handshakes. Waits: all 128 threads spin on the phase. Releases (warp-
  // specialised kernels): one arrive per warp once its wgmma wait has returned.
  // wgmma (cp.async): K_it and V_it are one group of every thread's copies, kStages - 1
  // groups (tiles it + 1 ..., some empty) were committed after it; once this thread's copies
  // have landed it fences them for the async proxy, and the barrier waits for everyone's.
  __device__ __forceinline__ void wait_k(int it) {
    const unsigned long long t0 = tr.now();
    if constexpr (kCp) {
      cp_async_wait<kStages - 1>();
      fence_proxy_async_shared();
      __syncthreads();
    } else {
      bars.k().wait(kc + uint32_t(it));
    }
    tr.add(kTraceWaitK, c.walk.tile(it), t0, tr.now());
  }
  __device__ __forceinline__ void wait_v(int it) {
    if constexpr (kCp) return;  // (landed with K_it)
    const unsigned long long t0 = tr.now();
    bars.v().wait(vc + uint32_t(it));
    tr.add(kTraceWaitV, c.walk.tile(it), t0, tr.now());
  }
  // K_it's wait belongs before the S GEMM that reads K_it; the fault build moves it after.
  __device__ __forceinline__ void k_wait_before(int it) {
    if constexpr (!kFaultSkipKWait) wait_k(it);
  }
  __device__ __forceinline__ void k_wait_after(int it) {
    if constexpr (kFaultSkipKWait) wait_k(it);
  }
  __device__ __forceinline__ void release_k(int it) {
    if constexpr (kWS) bars.k().release(kc + uint32_t(it), lane == 0);
  }
  __device__ __forceinline__ void release_v(int it) {
    if constexpr (kWS) bars.v().release(vc + uint32_t(it), lane == 0);
  }
  // Persistent: once the item's last S GEMM has been waited for, Q is free for the next item.
  __device__ __forceinline__ void release_q(int it) {
    if constexpr (kPers) {
      if (it == n - 1) bars.q().release(0, lane == 0);  // (one stage)
    }
  }
  // Ping-pong: before its GEMMs a warpgroup waits for its turn (bar.sync on its own id, 256
  // threads: itself + the previous warpgroup's arrive); after issuing them it hands the turn to
  // the next one, round robin.
  __device__ __forceinline__ void sched_wait() {
    if constexpr (kPP) bar_sync(kBarSched + wg, 2 * kWGThreads);
  }
  __device__ __forceinline__ void sched_pass() {
    if constexpr (kPP) bar_arrive(kBarSched + (wg + 1) % kConsumers, 2 * kWGThreads);
  }

  // The GEMMs (fa3.cuh's): S = Q_c K^T for this warpgroup's 64 rows, and O += P V over the Bc
  // keys, V read N-major. Issued (stamping the start), and done once a wgmma wait covers them.
  __device__ __forceinline__ void issue_s_of(int it) {
    t_s = tr.now();
    issue_abt<T, D, kBr, kBc>(s, q_addr, k_addr(it));
  }
  __device__ __forceinline__ void issue_pv_of(int it) {
    t_pv = tr.now();
    const uint32_t v = v_addr(it);
    reg_fence(o);
    reg_fence(pf);
    wgmma_fence();
    issue_rs<T, D, kBc>(o, pf, v);
    wgmma_commit();
  }
  __device__ __forceinline__ void s_done(int tile) { tr.add(kTraceGemmS, tile, t_s, tr.now()); }
  __device__ __forceinline__ void pv_done(int tile) { tr.add(kTraceGemmPV, tile, t_pv, tr.now()); }
  __device__ __forceinline__ void softmax(int it) {
    const int tile = c.walk.tile(it);
    const unsigned long long t0 = tr.now();
    softmax_tile(s, m, l, alpha, ri, tile, tile >= c.n_unmasked, p);
    tr.add(kTraceSoftmax, tile, t0, tr.now());
  }
  // Dropout (kExtras): tile it's keep flags, made under the GEMMs, applied once P is packed.
  __device__ __forceinline__ void make_keep(int it) {
    if constexpr (kExtras) {
      if (p.score.dropout) keep_flags(zf, ri, c.walk.tile(it), p, c);
    }
  }
  __device__ __forceinline__ void pack_p() {
    convert_p<T>(pf, s);
    if constexpr (kExtras) {
      if (p.score.dropout) drop_p(pf, zf);
    }
  }
  // No producer (wgmma, tma-wgmma): everyone is done with tile it's stage, so it is refilled
  // with tile it + 2 (tile it + 1 is already in flight in the other stage): by thread 0's TMA
  // copies, or by every thread's cp.async (one group per refill, empty past the last tile).
  __device__ __forceinline__ void refill(int it) {
    __syncthreads();
    const int st = int(bars.k().stage(kc + it));
    if constexpr (kCp) {
      if (it + kStages < n)
        cp_async_kv<S, D, kConsumers * kWGThreads>(c, p, base, st, c.walk.tile(it + kStages));
      cp_async_commit();
    } else if (threadIdx.x == 0 && it + kStages < n) {
      copy.both(st, c.walk.tile(it + kStages));
    }
  }

  // wgmma, tma-wgmma and warp-specialized: one tile at a time, each GEMM waited for at once.
  __device__ __forceinline__ void mainloop_serial() {
    for (int it = 0; it < n; ++it) {
      const int tile = c.walk.tile(it);
      k_wait_before(it);
      issue_s_of(it);
      k_wait_after(it);
      make_keep(it);
      wgmma_wait<0>();
      reg_fence(s);
      s_done(tile);
      release_k(it);
      softmax(it);
      rescale_o<D>(o, alpha);
      pack_p();
      wait_v(it);
      issue_pv_of(it);
      wgmma_wait<0>();
      reg_fence(o);
      pv_done(tile);
      release_v(it);
      if constexpr (!kWS) refill(it);
    }
  }

  // Ping-pong and intra-overlap open alike: the last warpgroup gives warpgroup 0 the first turn
  // (one-item kernels; the persistent ones do that once per CTA), and tile 0 runs S alone.
  __device__ __forceinline__ void first_s() {
    if (!kPers && wg == kConsumers - 1) bar_arrive(kBarSched + 0, 2 * kWGThreads);
    k_wait_before(0);
    sched_wait();
    issue_s_of(0);
    sched_pass();
    k_wait_after(0);
    make_keep(0);
    wgmma_wait<0>();
    reg_fence(s);
    s_done(c.walk.tile(0));
    release_k(0);
    release_q(0);
    softmax(0);
  }
  // ... and close alike: the last tile's PV. The one-item kernels' last warpgroup skips its
  // very last hand-over, so the barriers end balanced.
  __device__ __forceinline__ void last_pv() {
    wait_v(n - 1);
    sched_wait();
    issue_pv_of(n - 1);
    if (kPers || wg != kConsumers - 1) sched_pass();
    wgmma_wait<0>();
    reg_fence(o);
    pv_done(c.walk.tile(n - 1));
    release_v(n - 1);
  }

  // pingpong: the GEMMs of a step travel together, S_j = Q K_j^T with O += P_{j-1} V_{j-1},
  // between sched_wait and sched_pass; each step waits for both, then runs the softmax. The
  // overlap is between the warpgroups only.
  __device__ __forceinline__ void mainloop_pingpong() {
    first_s();
    rescale_o<D>(o, alpha);
    pack_p();
    for (int it = 1; it < n; ++it) {
      k_wait_before(it);
      sched_wait();
      issue_s_of(it);
      wait_v(it - 1);
      issue_pv_of(it - 1);
      sched_pass();
      k_wait_after(it);
      make_keep(it);
      wgmma_wait<0>();
      reg_fence(s);
      reg_fence(o);
      s_done(c.walk.tile(it));
      pv_done(c.walk.tile(it - 1));
      release_k(it);
      release_q(it);
      release_v(it - 1);
      softmax(it);
      rescale_o<D>(o, alpha);
      pack_p();
    }
    last_pv();
  }

  // intra-overlap's wait for PV_j (j < 0: none was issued), then V_j's stage is free.
  __device__ __forceinline__ void pv_retire(int j) {
    wgmma_wait<0>();
    reg_fence(o);
    reg_fence(pf);
    if (j >= 0) {
      pv_done(c.walk.tile(j));
      release_v(j);
    }
  }

  // intra-overlap: softmax_j runs while P_{j-1} V_{j-1} is still on the tensor cores (within
  // one warpgroup, on top of ping-pong between the warpgroups).
  __device__ __forceinline__ void mainloop_overlap() {
    first_s();
    for (int it = 1; it < n; ++it) {
      // EXERCISE BEGIN intra-overlap [hard]
      // Concept: overlap inside a warpgroup: wgmma is asynchronous, and wait_group N waits until
      // at most N of this warpgroup's committed GEMMs are still running, so the softmax of one
      // tile can run while the previous tile's P V is still on the tensor cores.
      //
      // One step of mainloop_pingpong above, reordered. On entry (it >= 1) softmax(it - 1) is
      // done, its P is not yet packed, and P_{it-2} V_{it-2} may still be running (none at
      // it = 1); on exit the same holds one tile later. Use the same calls as the ping-pong
      // step (pv_retire(j) waits for P_j V_j and frees V_j's stage; j < 0: nothing to wait
      // for). Traps: the registers a pending GEMM reads (P) or writes (O) may not be touched
      // until it is waited for; wait only for S_it before its softmax; and a wait for every
      // pending GEMM in the basic block of the softmax serialises them again, whatever its
      // place (ptxas hoists it to the top of that block).
      pv_retire(it - 2);  // (nothing pending at it = 1)
      // Step j: [wait for PV_{j-2}; P_{j-1} to 16 bits] issue S_j; rescale O by alpha_{j-1}
      // (under S_j); issue PV_{j-1}; wait for S_j only (wait_group 1); softmax_j. The wait for
      // PV_{j-2} sits at the top of step j, not at the end of step j-1: the two are the same
      // moment, but ptxas hoists a wait_group 0 to the top of the basic block it shares with
      // the softmax (which would serialise them again); the loop edge stops it.
      pack_p();
      k_wait_before(it);
      sched_wait();
      issue_s_of(it);
      rescale_o<D>(o, alpha);
      wait_v(it - 1);
      issue_pv_of(it - 1);
      sched_pass();
      k_wait_after(it);
      make_keep(it);    // under S_it and PV_{it-1}
      wgmma_wait<1>();  // S_it done; PV_{it-1} may still run
      reg_fence(s);
      s_done(c.walk.tile(it));
      release_k(it);
      release_q(it);
      softmax(it);
      // EXERCISE END
    }
    pv_retire(n - 2);
    pack_p();
    rescale_o<D>(o, alpha);
    last_pv();
  }

  // The epilogue: l across the quad, O /= l, LSE, O through shared memory to 16-byte stores.
  // O is staged in shared memory in the tiles' swizzled layout, so that the 4-byte fragment
  // writes and the 16-byte row reads both avoid bank conflicts; each warpgroup uses its own 64
  // rows. One-item kernels stage it in the Q tile (its last S GEMM has been waited for, and no
  // other warpgroup reads those rows). Persistent kernels have an O buffer, since the next
  // item's Q may already be landing in the Q tile; the first barrier makes sure the previous
  // item's reads of this warpgroup's rows are done before they are overwritten.
  __device__ __forceinline__ void epilogue() {
    float inv_l[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float lr = l[r];
      lr += __shfl_xor_sync(0xffffffffu, lr, 1);
      lr += __shfl_xor_sync(0xffffffffu, lr, 2);
      inv_l[r] = lr > 0.f ? 1.f / lr : 0.f;  // l = 0: no visible key, O = 0
      if constexpr (kExtras) {
        if (p.score.dropout) inv_l[r] *= p.score.drop_rescale;
      }
      const int row = c.i0 + wg * 64 + warp * 16 + g + 8 * r;
      if (t == 0 && row < M)
        p.lse[size_t(c.bh) * M + row] = lr > 0.f ? m[r] * p.score.scale + logf(lr) : kNegInf;
    }
    T* so = reinterpret_cast<T*>(smem + (kPers ? S::kO : S::kQ));
    auto at = [&](int row, int col) {  // element offset of (tile row, column)
      return (col / 64) * (kBr * 64) + row * 64 + ((((col % 64) / 8) ^ (row % 8)) * 8) + col % 8;
    };
    if constexpr (kPers) bar_sync(kBarEpilogue + wg, kWGThreads);
#pragma unroll
    for (int cb = 0; cb < D / 8; ++cb)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = wg * 64 + warp * 16 + g + 8 * r, col = cb * 8 + 2 * t;
        *reinterpret_cast<uint32_t*>(so + at(row, col)) =
            pack2<T>(o[4 * cb + 2 * r] * inv_l[r], o[4 * cb + 2 * r + 1] * inv_l[r]);
      }
    bar_sync(kBarEpilogue + wg, kWGThreads);
    T* out = static_cast<T*>(p.o) + c.b * p.o_strides.batch + c.h * p.o_strides.head;
    constexpr int kRowChunks = D / 8;
#pragma unroll
    for (int k = 0; k < 64 * kRowChunks / kWGThreads; ++k) {
      const int idx = k * kWGThreads + tid, row = wg * 64 + idx / kRowChunks;
      const int col = (idx % kRowChunks) * 8;
      if (c.i0 + row < M)
        *reinterpret_cast<uint4*>(out + (c.i0 + row) * p.o_strides.row + col) =
            *reinterpret_cast<const uint4*>(so + at(row, col));
    }
  }
};

// Main loop and epilogue of one item for consumer warpgroup `wg`, in the schedule the variant
// names; `pos` advances past the item's tiles.
template <class T, int D, int kFlags, int kConsumers, int kStages, bool kExtras, bool kTrace>
__device__ __forceinline__ void consume_item(const Item& c, int wg, const KParams& p,
                                             unsigned char* smem, Bars<kStages>& bars, RingPos& pos,
                                             const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                             Trace<kTrace>& tr) {
  using Steps = ItemSteps<T, D, kFlags, kConsumers, kStages, kExtras, kTrace>;
  const int tid = threadIdx.x % kWGThreads, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int n = c.walk.n_iter;
  const int M = p.seq_q, N = p.seq_k;
  const uint32_t kc = pos.k, vc = pos.v;  // ring positions of this item's tile 0

  RowInfo ri;
  ri.t = t, ri.lane = lane;
  ri.row16 = (c.i0 + wg * 64 + warp * 16) / 16;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = c.i0 + wg * 64 + warp * 16 + g + 8 * r;
    ri.limit[r] = p.score.causal ? min(N, row + 1 + N - M) : N;
  }
  const uint32_t base = smem_u32(smem);
  const uint32_t q_addr = base + Steps::S::kQ + wg * 64 * kRowBytes;  // this warpgroup's rows

  float o[D / 2], s[kBc / 2], m[2], l[2], alpha[2];
  uint32_t pf[kBc / 16][4], zf[kBc / 32][4];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
#pragma unroll
  for (int r = 0; r < 2; ++r) m[r] = kNegInf, l[r] = 0.f, alpha[r] = 1.f;

  unsigned long long t_s = 0, t_pv = 0;
  const KVCopies<typename Steps::S, kStages, kTrace> copy{c, smem, bars, tm_k, tm_v, tr};
  // clang-format off
  Steps ic{c, wg, p, smem, bars, copy, tr, tid, warp, lane, g, t, n, M, kc, vc, base, q_addr,
           ri, o, s, m, l, alpha, pf, zf, t_s, t_pv};
  // clang-format on
  if (n > 0) {
    if constexpr (!(kFlags & kCpAsync)) bars.q().wait(pos.q);  // (cp.async: with K_0)
    if constexpr (!(kFlags & kPingPong))
      ic.mainloop_serial();
    else if constexpr (!(kFlags & kIntraOverlap))
      ic.mainloop_pingpong();
    else
      ic.mainloop_overlap();
  }
  ic.epilogue();
  if (n > 0) pos.k += uint32_t(n), pos.v += uint32_t(n), pos.q += 1;
}

// The consumers of the persistent kernels: the items the producer publishes, until an index
// past the end. The ping-pong turn runs on across items (the next item's first S GEMM is the
// turn after the last PV of this one); the last warpgroup's opening arrive on warpgroup 0's
// barrier is matched by warpgroup 0's closing wait, so every named barrier ends balanced
// however many items (or empty items) the CTA gets.
template <class T, int D, int kFlags, int kConsumers, int kStages, bool kExtras, bool kTrace>
__device__ __forceinline__ void persistent_consumer(int wg, const KParams& p, unsigned char* smem,
                                                    Bars<kStages>& bars, Trace<kTrace>& tr) {
  const int lane = threadIdx.x % 32;
  RingPos pos;
  uint32_t taken = 0;
  if (wg == kConsumers - 1) bar_arrive(kBarSched + 0, 2 * kWGThreads);
  for (int idx = int(blockIdx.x); idx < p.items;) {
    int mt, bh;
    item_coords(p, idx, mt, bh);
    const Item c = make_item<64 * kConsumers, kExtras>(p, mt, bh);
    consume_item<T, D, kFlags, kConsumers, kStages, kExtras, kTrace>(c, wg, p, smem, bars, pos,
                                                                     nullptr, nullptr, tr);
    idx = receive_item(bars.sched(), bars.next_item, taken, lane);
  }
  if (wg == 0) bar_sync(kBarSched + 0, 2 * kWGThreads);
}

}  // namespace
}  // namespace ladder::fa3
