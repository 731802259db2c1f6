// Step 07 — FlashAttention on Hopper: TMA, wgmma, warp specialisation (CUDA sm_90a, bf16/fp16).
// Adds: TMA tile loads completing on mbarriers; wgmma with B from swizzled shared memory and P
// from registers; a producer warpgroup and setmaxnreg; ping-pong scheduling of the consumer
// warpgroups; softmax overlapped with the next tile's GEMMs inside a warpgroup; a persistent
// kernel fed by a tile scheduler, heaviest work first; three consumer warpgroups at d = 64;
// dropout and block-sparse masks in the persistent kernels; the backward on wgmma: a producer
// streams Q and dO tiles to two consumer warpgroups that keep dK and dV in registers, dQ added
// by the copy engine.
//
// SPDX-License-Identifier: MIT (LICENSE). Follows the published structure of FlashAttention-3
// (Shah, Bikshandi, Zhang, Thakkar, Ramani, Dao, 2024, arXiv:2407.08608).
//
// Step 06 runs FlashAttention-2 on mma.sync: every warp loads its own operand fragments
// (ldmatrix), issues 16 x 8 x 16 products one by one and waits for each; cp.async moves
// K_j, V_j and every thread computes addresses for it. On an H100 that tops out near
// 320 TFLOP/s. This step keeps the algorithm (online softmax over K/V tiles, P reused from
// registers) and changes the machinery, one idea per variant:
//
//   tma-wgmma         TMA copies whole tiles (one thread, one instruction per 64-column box,
//                     bytes counted on an mbarrier); wgmma multiplies 64 x N x 16 per
//                     warpgroup, B straight from swizzled shared memory, asynchronously.
//   warp-specialized  + a producer warpgroup that only issues copies, and two consumer
//                     warpgroups that only compute, talking through full/empty mbarriers;
//                     setmaxnreg moves registers from the producer to the consumers.
//   pingpong          + named barriers order the consumers' GEMMs, so that one warpgroup's
//                     softmax runs while another's GEMMs use the tensor cores.
//   intra-overlap     + inside a warpgroup, S_{j} = Q K_{j}^T and O += P_{j-1} V_{j-1} are
//                     issued together and the softmax of tile j runs while P_{j-1} V_{j-1} is
//                     still on the tensor cores; the O rescale moves under the next S GEMM.
//   persistent        + one CTA per SM, looping over work items (query tile, head, batch)
//                     that a tile scheduler hands out (an atomic counter; heaviest causal
//                     tiles first, heads in groups whose K/V fit in L2). The producer loads
//                     the next item's Q and K/V while the consumers finish this one (Q has an
//                     "empty" barrier, O its own staging buffer); V trails K by one tile;
//                     three stages at d = 64. Dropout and block-sparsity are built on it.
//   three-consumers   + at d = 64, three consumer warpgroups (Br = 192): each warpgroup's
//                     softmax hides under two others' GEMMs. At d = 128, with dropout or a
//                     block mask, and where seq_q pads badly to 192 rows (query_tile() in the
//                     .hpp; seq 1024), it runs the persistent kernel. The default.
//
// A CTA works on (query tile of Br = 64 x consumers rows, head, batch); consumer warpgroup c
// owns rows 64c .. 64c+63 and keeps their S, m, l and O in registers. Per K/V tile j (Bc = 128
// keys):
//   S = Q K_j^T                      wgmma SS: A = Q (smem), B = K_j (smem, K-major)
//   mask (tiles past the causal diagonal's start or the end of the keys only)
//   m, l and P by the online softmax, in base 2 (softmax_tile)
//   O = alpha O + P V_j              wgmma RS: A = P (registers), B = V_j (smem, N-major)
// and at the end O /= l, LSE = tau m + ln l, O through shared memory to 16-byte stores.
//
// Shared memory (d = 128, Br = 128): Q 32 KiB + 2 stages x (K 32 + V 32) KiB = 160 KiB, and a
// 32 KiB O buffer in the persistent kernels. Each tile is stored as d / 64 "column halves" of
// [rows][64] elements, rows of 128 bytes in the TMA's 128-byte swizzle (16-byte chunk c of row
// r at chunk c ^ (r mod 8)), every half on a 1024-byte boundary: the layout the wgmma
// descriptors with swizzle mode 128B read (hopper.cuh).
#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes through the runtime
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>

#include "dropout.hpp"
#include "exercise.hpp"
#include "hopper.cuh"
#include "tensor_map.hpp"
#include "wgmma_tma_fa3.hpp"

// ---- fault injection: a test of the self-test (off unless asked for) -----------------------
// Built with -DLADDER_07_FAULT=skip_k_wait, every consumer issues S_j = Q K_j^T BEFORE waiting
// on K_j's full barrier: the wait a missing-wait bug forgets. The wait still happens, after the
// issue, so the barrier's phases stay balanced and nothing hangs; the product reads K_j's
// stage before the copy is known to have landed. To make the race lose every time rather than
// now and then, the thread that issues the K copies also idles ~10^4 clocks before each one.
// Nothing documents compute-sanitizer as seeing a TMA-vs-wgmma race (the note says what its
// tools check); the self-test's checks can: `selftest --expect-fault` passes only if they fail.
// The normal build has none of it (every use is an `if constexpr` on a false constant).
#define LADDER_07_FAULT_ID_skip_k_wait 1
#define LADDER_07_FAULT_ID_(name) LADDER_07_FAULT_ID_##name
#define LADDER_07_FAULT_ID(name) LADDER_07_FAULT_ID_(name)
#if defined(LADDER_07_FAULT)
#if LADDER_07_FAULT_ID(LADDER_07_FAULT) != 1
#error "LADDER_07_FAULT: the one fault built in is skip_k_wait"
#endif
#define LADDER_07_FAULT_SKIP_K_WAIT 1
#else
#define LADDER_07_FAULT_SKIP_K_WAIT 0
#endif

namespace ladder::fa3 {
namespace {

using namespace ladder::hopper;
using bf16 = __nv_bfloat16;
using fp16 = __half;

constexpr bool kFaultSkipKWait = LADDER_07_FAULT_SKIP_K_WAIT != 0;

// ---- tiles ------------------------------------------------------------------------------
// Bc = 128 everywhere: S is 64 fp32 registers per thread, P 32 (16-bit pairs). Br = 64 per
// consumer warpgroup (wgmma's M): two consumers (Br = 128), or three at d = 64 (Br = 192).
//   d = 128, two consumers: O is 64 registers; with the next tile's S in flight (intra-overlap)
//     about 190 of the 240 a consumer gets. Two stages: 160 KiB (+ 32 KiB O buffer when
//     persistent); three would pass the 227 KiB limit.
//   d = 64, three consumers: O is 32 registers, S 64 + P 32 + O 32 + about 30 of addresses,
//     row state and loop counters: it fits the 160 that 4 warpgroups leave (24 x 128 +
//     160 x 384 = 64512 <= 65536; ptxas: R0-R157, no spill). Shared memory: Q 24 + 3 stages x
//     32 + O 24 = 144 KiB. A third consumer at d = 128 would need 64 (O) + 96 (S, P) > 160.
//   Larger Bc instead (FA3's 192 at d = 64) would need P through shared memory to fit 160 or
//     more registers for S: a bigger change for the same aim (more GEMM time per softmax).
constexpr int kBc = 128;
constexpr int kWGThreads = 128;
constexpr int kRowBytes = 128;  // one swizzled row: 64 16-bit elements
constexpr int kMaxStages = 3, kMaxConsumers = 3;
constexpr float kNegInf = -INFINITY;

// Register split of the warp-specialised kernels (setmaxnreg): the producer keeps 24, the
// consumers take the rest. Two consumers: 128 x 24 + 256 x 240 = 64512; three: 128 x 24 +
// 384 x 160 = 64512; both <= 65536. At launch __launch_bounds__(threads, 1) gives every thread
// 65536 / threads (168 for 384 threads, 128 for 512).
constexpr int kProducerRegs = 24;
constexpr int consumer_regs(int consumers) {
  return consumers == 2 ? 240 : 160;
}
static_assert(kWGThreads * (kProducerRegs + 2 * consumer_regs(2)) <= 65536, "register file");
static_assert(kWGThreads * (kProducerRegs + 3 * consumer_regs(3)) <= 65536, "register file");

// Byte offsets of the tiles in dynamic shared memory (1024-aligned base).
template <int D, int kConsumers, int kStages, bool kOwnO>
struct Smem {
  static constexpr int kBr = 64 * kConsumers;
  static constexpr int kHalves = D / 64;
  static constexpr int kQBytes = kBr * D * 2;
  static constexpr int kKVBytes = kBc * D * 2;  // one K or one V tile
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBytes;
  static constexpr int kV = kK + kStages * kKVBytes;
  static constexpr int kO = kV + kStages * kKVBytes;  // persistent: O's staging buffer
  static constexpr int kBytes = kO + (kOwnO ? kQBytes : 0);
  static constexpr int kDynamic = kBytes + 1024;  // slack to round the base up to 1024
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "1024-byte aligned halves");
  static_assert(kStages <= kMaxStages && kConsumers <= kMaxConsumers, "see Bars");
  static_assert(kDynamic <= 227 * 1024, "more shared memory than an H100 block can have");
};

// The mbarriers (static shared memory). K and V have a full/empty pair per stage; Q a full one
// and, for the persistent kernels, an empty one; the schedule a two-slot ring of item indices.
struct Bars {
  uint64_t q_full, q_empty;
  uint64_t full_k[kMaxStages], full_v[kMaxStages], empty_k[kMaxStages], empty_v[kMaxStages];
  uint64_t sched_full[2], sched_empty[2];
  int next_item[2];
};

// One bit per idea; a variant is a prefix of them (three-consumers differs from persistent in
// its warpgroup count, a template parameter).
enum Flag : int { kWarpSpec = 1, kPingPong = 2, kIntraOverlap = 4, kPersist = 8 };
constexpr int flags_of(Variant v) {
  return v == Variant::tma_wgmma          ? 0
         : v == Variant::warp_specialized ? kWarpSpec
         : v == Variant::pingpong         ? kWarpSpec | kPingPong
         : v == Variant::intra_overlap    ? kWarpSpec | kPingPong | kIntraOverlap
                                          : kWarpSpec | kPingPong | kIntraOverlap | kPersist;
}
constexpr int threads_of(int flags, int consumers) {
  return (consumers + ((flags & kWarpSpec) ? 1 : 0)) * kWGThreads;
}

// Named barrier ids (0 is __syncthreads): the ping-pong turn of consumer c waits on 1 + c; the
// epilogue of consumer c syncs its 128 threads on 4 + c.
constexpr int kBarSched = 1, kBarEpilogue = 1 + kMaxConsumers;

// What the kernel needs besides the tensor maps (by value, in the parameter space).
struct KParams {
  void* o;
  float* lse;
  int heads, group, seq_q, seq_k;
  float scale, scale_log2;  // tau and tau log2(e), tau > 0
  int causal;
  // dropout (kExtras kernels): keep iff the 16-bit uniform >= threshold; O *= rescale
  int dropout;
  uint32_t drop_threshold, seed_lo, seed_hi;
  float drop_rescale;
  // block-sparse (kExtras kernels; kv_count null = dense)
  const int* kv_count;
  const int* kv_index;
  int mask_nI, mask_nJ, block_m, bn_tiles, mask_batch, mask_heads;
  // persistent kernels: items = n_mt query tiles x n_bh (batch x heads), in sections of
  // sec_heads heads; the counter hands out items gridDim.x, gridDim.x + 1, ...
  int n_mt, n_bh, sec_heads, items;
  unsigned int* counter;
  unsigned long long* trace;
};

// ---- trace (compiled only into the kTrace instantiations) -------------------------------
template <bool kOn>
struct Trace {
  unsigned long long* rec = nullptr;
  int n = 0;
  bool writer = false;  // lane 0 of each warp, or the producer's elected thread
  __device__ __forceinline__ void init(unsigned long long* buf, int warp) {
    if constexpr (kOn) {
      if (buf && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && warp < kTraceWarps)
        rec = buf + size_t(warp) * kTraceSlots * kTraceWords;
      writer = (threadIdx.x & 31) == 0;
    }
  }
  __device__ __forceinline__ unsigned long long now() const {
    if constexpr (kOn) return global_timer_ns();
    return 0;
  }
  // The writer records (and counts, in n; the other lanes' n is never used).
  __device__ __forceinline__ void add(int phase, int tile, unsigned long long t0,
                                      unsigned long long t1) {
    if constexpr (kOn) {
      if (rec && n < kTraceSlots && writer) {
        unsigned long long* r = rec + size_t(n) * kTraceWords;
        r[0] = unsigned(phase), r[1] = unsigned(tile), r[2] = t0, r[3] = t1;
      }
      ++n;
    }
  }
};

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

// How many K (or V, or Q) tiles a role has loaded or consumed so far: the ring position. A
// persistent CTA keeps counting across its items, so producer and consumers stay in step.
struct RingPos {
  uint32_t k = 0, v = 0, q = 0;
};

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

// The fault build's delay before a K copy (see the top of the file); nothing otherwise.
__device__ __forceinline__ void fault_delay() {
  if constexpr (kFaultSkipKWait) {
    const long long t0 = clock64();
    while (clock64() - t0 < 10000) {
    }
  }
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
// item from the counter and publish it to the consumers (a two-slot ring in shared memory with
// its own full/empty barriers). The first item of CTA b is b; the counter hands out gridDim.x,
// gridDim.x + 1, ..., and an index >= items means "no more". Every CTA takes exactly one such
// index, so the counter is incremented exactly `items` times per launch (items - gridDim.x
// real ones + gridDim.x final ones): the CTA that receives items - 1 made the last increment
// and sets the counter back to zero for the next launch.
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
    const unsigned int taken = atomicAdd(p.counter, 1u);
    if (taken == unsigned(p.items) - 1u) atomicExch(p.counter, 0u);
    idx = int(gridDim.x + taken);
    const uint32_t slot = published & 1;
    mbar_wait(&bars.sched_empty[slot], ((published >> 1) & 1) ^ 1);
    *reinterpret_cast<volatile int*>(&bars.next_item[slot]) = idx;
    mbar_arrive_if(&bars.sched_full[slot], true);  // release: the index is visible to waiters
    ++published;
  }
}
// ---- the consumer's pieces --------------------------------------------------------------

// S = Q_c K^T for this warpgroup's 64 rows: d/16 wgmma k-steps. Step kk reads columns
// 16kk..16kk+15: column half kk / 4 (Br or Bc rows further), 32 bytes further per step inside
// the 128-byte row.
template <class T, int D, int kBr>
__device__ __forceinline__ void issue_s(float (&s)[kBc / 2], uint32_t q_addr, uint32_t k_addr) {
  reg_fence(s);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t col = (kk % 4) * 32;
    const uint64_t da = make_desc_sw128(q_addr + (kk / 4) * (kBr * kRowBytes) + col, 16, 1024);
    const uint64_t db = make_desc_sw128(k_addr + (kk / 4) * (kBc * kRowBytes) + col, 16, 1024);
    wgmma_ss<T, kBc, 0>(s, da, db, kk > 0);
  }
  wgmma_commit();
}

// O += P V: Bc/16 k-steps over the keys; B = V rows 16kk..16kk+15 (2048 bytes further per
// step), read N-major (the transpose bit), the next 64 columns (d = 128) one column half away.
template <class T, int D>
__device__ __forceinline__ void issue_pv(float (&o)[D / 2], uint32_t (&p)[kBc / 16][4],
                                         uint32_t v_addr) {
  reg_fence(o);
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk) reg_fence(p[kk]);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk) {
    const uint64_t db = make_desc_sw128(v_addr + kk * 16 * kRowBytes, kBc * kRowBytes, 1024);
    wgmma_rs<T, D, 1>(o, p[kk], db, true);
  }
  wgmma_commit();
}

// The thread's place in the softmax: rows row0 and row0 + 8 of the tile (query rows
// i0 + row0, + 8); columns 2t, 2t+1 of every n8 block.
struct RowInfo {
  int t, lane;
  int limit[2];  // first hidden key of each row (causal / end of keys)
  int row16;     // the 16-row block index of this warp's rows (dropout counter)
};

// Mask (when needed), online softmax of S in place (S becomes unnormalised P, fp32), and
// dropout; returns in `alpha` the factor by which each row's O must be rescaled.
template <bool kExtras>
__device__ __forceinline__ void softmax_tile(float (&s)[kBc / 2], float (&m)[2], float (&l)[2],
                                             float (&alpha)[2], const RowInfo& ri, int tile,
                                             bool need_mask, const KParams& p, const Item& c) {
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
    // p.scale_log2 (tau log2 e) and fast_exp2; one fmaf and one exp2 per score. Trap: a row
    // that has seen only masked keys so far.
    const float mx_scaled = mx == kNegInf ? 0.f : mx * p.scale_log2;
    alpha[r] = fast_exp2(m[r] * p.scale_log2 - mx_scaled);
    m[r] = mx;
    float sum = 0.f;
#pragma unroll
    for (int cb = 0; cb < kBc / 8; ++cb)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        // exp(tau (s - m)) = exp2(s tau log2e - m tau log2e): one FFMA, one ex2
        const float pe = fast_exp2(fmaf(s[4 * cb + 2 * r + i], p.scale_log2, -mx_scaled));
        s[4 * cb + 2 * r + i] = pe;
        sum += pe;
      }
    l[r] = alpha[r] * l[r] + sum;  // this thread's columns; the quad adds up at the end
    // EXERCISE END
  }
  if constexpr (kExtras) {
    if (p.dropout) {
      // l summed the undropped P (the LSE is that of P); Z only zeroes P on its way into PV.
      // One Philox call per 16 x 16 block gives this lane its 8 elements (docs/CONTRACT.md).
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) {
        const uint32_t J = uint32_t(key0 / 16 + kk);
        const dropout::Philox4 w =
            dropout::philox(J * 32u + uint32_t(ri.lane), uint32_t(ri.row16), uint32_t(c.h),
                            uint32_t(c.b), p.seed_lo, p.seed_hi);
        const uint32_t(&words)[4] = w.w;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          uint32_t u;  // the 16-bit uniform of s[8kk + e]
          // EXERCISE BEGIN dropout-words [hard]
          // Concept: the dropout counter mapping: which of a Philox call's 8 halves belongs to
          // each of the lane's 8 accumulators of a 16 x 16 block (docs/CONTRACT.md).
          //
          // Set u to the 16-bit uniform of s[8kk + e], from the 4 words of this block's call.
          // s[8kk + e] is n8 block 2kk + e / 4, row half (e / 2) & 1, column 2t + (e & 1). The
          // contract: w0 = row g of the even n8 block, w1 = row g of the odd one, w2, w3 the
          // same for row g + 8; the low 16 bits are the even column's. Trap: the order of the
          // words is not the order of the accumulators.
          const uint32_t word = words[(e >> 2) + 2 * ((e >> 1) & 1)];
          u = (word >> (16 * (e & 1))) & 0xffffu;
          // EXERCISE END
          if (u < p.drop_threshold) s[8 * kk + e] = 0.f;
        }
      }
    }
  }
}

template <int D>
__device__ __forceinline__ void rescale_o(float (&o)[D / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int cb = 0; cb < D / 8; ++cb)
#pragma unroll
    for (int r = 0; r < 2; ++r) o[4 * cb + 2 * r] *= alpha[r], o[4 * cb + 2 * r + 1] *= alpha[r];
}

// P (fp32 in the S registers) -> the A fragments of the PV product: S columns 16kk..16kk+15
// are accumulators 8kk..8kk+7, in A-fragment order already (hopper.cuh).
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

// ---- the consumer warpgroup: one work item ----------------------------------------------
// Main loop and epilogue of one item for consumer warpgroup `wg`. `pos` is where this item's
// tiles start in the K, V and Q rings (all zero for the one-item kernels); it advances past
// them. The persistent kernels (kPersist) also release Q after the item's last S GEMM, keep
// the ping-pong turn going from one item to the next, and stage O in their own buffer.
template <class T, int D, int kFlags, int kConsumers, int kStages, bool kExtras, bool kTrace>
__device__ __forceinline__ void consume_item(const Item& c, int wg, const KParams& p,
                                             unsigned char* smem, Bars& bars, RingPos& pos,
                                             const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                             Trace<kTrace>& tr) {
  constexpr bool kWS = kFlags & kWarpSpec, kPP = kFlags & kPingPong,
                 kOverlap = kFlags & kIntraOverlap, kPers = kFlags & kPersist;
  using S = Smem<D, kConsumers, kStages, kPers>;
  constexpr int kBr = S::kBr;
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
    ri.limit[r] = p.causal ? min(N, row + 1 + N - M) : N;
  }

  const uint32_t base = smem_u32(smem);
  const uint32_t q_addr = base + S::kQ + wg * 64 * kRowBytes;  // this warpgroup's 64 rows
  auto k_addr = [&](int it) { return base + S::kK + ((kc + it) % kStages) * S::kKVBytes; };
  auto v_addr = [&](int it) { return base + S::kV + ((vc + it) % kStages) * S::kKVBytes; };

  float o[D / 2], s[kBc / 2], m[2], l[2], alpha[2];
  uint32_t pf[kBc / 16][4];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
#pragma unroll
  for (int r = 0; r < 2; ++r) m[r] = kNegInf, l[r] = 0.f, alpha[r] = 1.f;

  // The mbarrier handshakes. Waits: all 128 threads spin on the phase. Releases (warp-
  // specialised kernels): one arrive per warp once its wgmma wait has returned.
  auto wait_k = [&](int it) {
    const uint32_t u = kc + uint32_t(it);
    const unsigned long long t0 = tr.now();
    mbar_wait(&bars.full_k[u % kStages], (u / kStages) & 1);
    tr.add(kTraceWaitK, c.walk.tile(it), t0, tr.now());
  };
  auto wait_v = [&](int it) {
    const uint32_t u = vc + uint32_t(it);
    const unsigned long long t0 = tr.now();
    mbar_wait(&bars.full_v[u % kStages], (u / kStages) & 1);
    tr.add(kTraceWaitV, c.walk.tile(it), t0, tr.now());
  };
  // K_it's wait belongs before the S GEMM that reads K_it; the fault build moves it after.
  auto k_wait_before = [&](int it) {
    if constexpr (!kFaultSkipKWait) wait_k(it);
  };
  auto k_wait_after = [&](int it) {
    if constexpr (kFaultSkipKWait) wait_k(it);
  };
  auto release_k = [&](int it) {
    if constexpr (kWS) mbar_arrive_if(&bars.empty_k[(kc + uint32_t(it)) % kStages], lane == 0);
  };
  auto release_v = [&](int it) {
    if constexpr (kWS) mbar_arrive_if(&bars.empty_v[(vc + uint32_t(it)) % kStages], lane == 0);
  };
  // Persistent: once the item's last S GEMM has been waited for, Q is free for the next item.
  auto release_q = [&](int it) {
    if constexpr (kPers) {
      if (it == n - 1) mbar_arrive_if(&bars.q_empty, lane == 0);
    }
  };
  // Ping-pong: before its GEMMs a warpgroup waits for its turn (bar.sync on its own id, 256
  // threads: itself + the previous warpgroup's arrive); after issuing them it hands the turn to
  // the next one, round robin.
  auto sched_wait = [&]() {
    if constexpr (kPP) bar_sync(kBarSched + wg, 2 * kWGThreads);
  };
  auto sched_pass = [&]() {
    if constexpr (kPP) bar_arrive(kBarSched + (wg + 1) % kConsumers, 2 * kWGThreads);
  };
  auto softmax = [&](int it) {
    const int tile = c.walk.tile(it);
    const unsigned long long t0 = tr.now();
    softmax_tile<kExtras>(s, m, l, alpha, ri, tile, tile >= c.n_unmasked, p, c);
    tr.add(kTraceSoftmax, tile, t0, tr.now());
  };

  if (n > 0) {
    mbar_wait(&bars.q_full, pos.q & 1);
    if constexpr (!kPP) {
      // tma-wgmma and warp-specialized: one tile at a time, each GEMM waited for at once.
      for (int it = 0; it < n; ++it) {
        const int tile = c.walk.tile(it);
        k_wait_before(it);
        unsigned long long t0 = tr.now();
        issue_s<T, D, kBr>(s, q_addr, k_addr(it));
        k_wait_after(it);
        wgmma_wait<0>();
        reg_fence(s);
        tr.add(kTraceGemmS, tile, t0, tr.now());
        release_k(it);
        softmax(it);
        rescale_o<D>(o, alpha);
        convert_p<T>(pf, s);
        wait_v(it);
        t0 = tr.now();
        issue_pv<T, D>(o, pf, v_addr(it));
        wgmma_wait<0>();
        reg_fence(o);
        tr.add(kTraceGemmPV, tile, t0, tr.now());
        release_v(it);
        if constexpr (!kWS) {
          // No producer: everyone is done with stage st, so thread 0 refills it with tile
          // it + 2 (tile it + 1 is already in flight in the other stage).
          __syncthreads();
          if (threadIdx.x == 0 && it + kStages < n) {
            const int st = int((kc + uint32_t(it)) % kStages);
            const int nt = c.walk.tile(it + kStages);
            fault_delay();
            load_kv<S>(c, smem, tm_k, S::kK, &bars.full_k[st], st, nt);
            load_kv<S>(c, smem, tm_v, S::kV, &bars.full_v[st], st, nt);
            const unsigned long long ti = tr.now();
            tr.add(kTraceTmaIssueK, nt, ti, ti);
          }
        }
      }
    } else {
      // Ping-pong (and intra-overlap): the GEMMs of a step travel together, S_j = Q K_j^T with
      // O += P_{j-1} V_{j-1}, between sched_wait and sched_pass. The last warpgroup gives
      // warpgroup 0 the first turn and (one-item kernels) skips its very last hand-over, so
      // the barriers end balanced; the persistent kernels do that once per CTA instead.
      if (!kPers && wg == kConsumers - 1) bar_arrive(kBarSched + 0, 2 * kWGThreads);
      // Tile 0: S only.
      k_wait_before(0);
      sched_wait();
      unsigned long long t0 = tr.now(), t1 = 0;
      issue_s<T, D, kBr>(s, q_addr, k_addr(0));
      sched_pass();
      k_wait_after(0);
      wgmma_wait<0>();
      reg_fence(s);
      tr.add(kTraceGemmS, c.walk.tile(0), t0, tr.now());
      release_k(0);
      release_q(0);
      softmax(0);
      if constexpr (!kOverlap) {
        // pingpong: each step waits for both of its GEMMs, then runs the softmax; the overlap
        // is between the warpgroups only.
        rescale_o<D>(o, alpha);
        convert_p<T>(pf, s);
        for (int it = 1; it < n; ++it) {
          k_wait_before(it);
          sched_wait();
          t0 = tr.now();
          issue_s<T, D, kBr>(s, q_addr, k_addr(it));
          wait_v(it - 1);
          t1 = tr.now();
          issue_pv<T, D>(o, pf, v_addr(it - 1));
          sched_pass();
          k_wait_after(it);
          wgmma_wait<0>();
          reg_fence(s);
          reg_fence(o);
          tr.add(kTraceGemmS, c.walk.tile(it), t0, tr.now());
          tr.add(kTraceGemmPV, c.walk.tile(it - 1), t1, tr.now());
          release_k(it);
          release_q(it);
          release_v(it - 1);
          softmax(it);
          rescale_o<D>(o, alpha);
          convert_p<T>(pf, s);
        }
      } else {
        // intra-overlap: softmax_j runs while P_{j-1} V_{j-1} is still on the tensor cores.
        // Step j: [wait for PV_{j-2}; P_{j-1} to 16 bits] issue S_j; rescale O by alpha_{j-1}
        // (under S_j); issue PV_{j-1}; wait for S_j only (wait_group 1); softmax_j.
        // The wait for PV_{j-2} sits at the top of step j, not at the end of step j-1: the two
        // are the same moment, but ptxas hoists a wait_group 0 to the top of the basic block it
        // shares with the softmax (which would serialise them again); the loop edge stops it.
        for (int it = 1; it < n; ++it) {
          wgmma_wait<0>();  // PV_{it-2} (nothing pending at it = 1)
          reg_fence(o);
          reg_fence(pf);
          if (it >= 2) {
            tr.add(kTraceGemmPV, c.walk.tile(it - 2), t1, tr.now());
            release_v(it - 2);
          }
          convert_p<T>(pf, s);
          k_wait_before(it);
          sched_wait();
          t0 = tr.now();
          issue_s<T, D, kBr>(s, q_addr, k_addr(it));
          rescale_o<D>(o, alpha);
          wait_v(it - 1);
          t1 = tr.now();
          issue_pv<T, D>(o, pf, v_addr(it - 1));
          sched_pass();
          k_wait_after(it);
          wgmma_wait<1>();  // S_it done; PV_{it-1} may still run
          reg_fence(s);
          tr.add(kTraceGemmS, c.walk.tile(it), t0, tr.now());
          release_k(it);
          release_q(it);
          softmax(it);
        }
        wgmma_wait<0>();  // PV_{n-2}
        reg_fence(o);
        reg_fence(pf);
        if (n >= 2) {
          tr.add(kTraceGemmPV, c.walk.tile(n - 2), t1, tr.now());
          release_v(n - 2);
        }
        convert_p<T>(pf, s);
        rescale_o<D>(o, alpha);
      }
      // The last tile's PV.
      wait_v(n - 1);
      sched_wait();
      t0 = tr.now();
      issue_pv<T, D>(o, pf, v_addr(n - 1));
      if (kPers || wg != kConsumers - 1) sched_pass();
      wgmma_wait<0>();
      reg_fence(o);
      tr.add(kTraceGemmPV, c.walk.tile(n - 1), t0, tr.now());
      release_v(n - 1);
    }
  }

  // ---- epilogue: l across the quad, O /= l, LSE, O through shared memory ----
  float inv_l[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float lr = l[r];
    lr += __shfl_xor_sync(0xffffffffu, lr, 1);
    lr += __shfl_xor_sync(0xffffffffu, lr, 2);
    inv_l[r] = lr > 0.f ? 1.f / lr : 0.f;  // l = 0: no visible key, O = 0
    if constexpr (kExtras) {
      if (p.dropout) inv_l[r] *= p.drop_rescale;
    }
    const int row = c.i0 + wg * 64 + warp * 16 + g + 8 * r;
    if (t == 0 && row < M)
      p.lse[size_t(c.bh) * M + row] = lr > 0.f ? m[r] * p.scale + logf(lr) : kNegInf;
  }
  // O is staged in shared memory in the tiles' swizzled layout, so that the 4-byte fragment
  // writes and the 16-byte row reads both avoid bank conflicts; each warpgroup uses its own 64
  // rows. One-item kernels stage it in the Q tile (its last S GEMM has been waited for, and no
  // other warpgroup reads those rows). Persistent kernels have an O buffer, since the next
  // item's Q may already be landing in the Q tile; the first barrier makes sure the previous
  // item's reads of this warpgroup's rows are done before they are overwritten.
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
  T* out = static_cast<T*>(p.o) + size_t(c.bh) * M * D;
  constexpr int kRowChunks = D / 8;
#pragma unroll
  for (int k = 0; k < 64 * kRowChunks / kWGThreads; ++k) {
    const int idx = k * kWGThreads + tid, row = wg * 64 + idx / kRowChunks;
    const int col = (idx % kRowChunks) * 8;
    if (c.i0 + row < M)
      *reinterpret_cast<uint4*>(out + size_t(c.i0 + row) * D + col) =
          *reinterpret_cast<const uint4*>(so + at(row, col));
  }
  if (n > 0) pos.k += uint32_t(n), pos.v += uint32_t(n), pos.q += 1;
}

// The consumers of the persistent kernels: the items the producer publishes, until an index
// past the end. The ping-pong turn runs on across items (the next item's first S GEMM is the
// turn after the last PV of this one); the last warpgroup's opening arrive on warpgroup 0's
// barrier is matched by warpgroup 0's closing wait, so every named barrier ends balanced
// however many items (or empty items) the CTA gets.
template <class T, int D, int kFlags, int kConsumers, int kStages, bool kExtras, bool kTrace>
__device__ __forceinline__ void persistent_consumer(int wg, const KParams& p, unsigned char* smem,
                                                    Bars& bars, Trace<kTrace>& tr) {
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
    const uint32_t slot = taken & 1;
    mbar_wait(&bars.sched_full[slot], (taken >> 1) & 1);
    idx = *reinterpret_cast<volatile int*>(&bars.next_item[slot]);
    __syncwarp();  // every lane has read the slot before lane 0 frees it
    mbar_arrive_if(&bars.sched_empty[slot], lane == 0);
    ++taken;
  }
  if (wg == 0) bar_sync(kBarSched + 0, 2 * kWGThreads);
}

// ---- the kernel -------------------------------------------------------------------------
template <class T, int D, int kFlags, int kConsumers, int kStages, bool kExtras, bool kTrace>
__global__ void __launch_bounds__(threads_of(kFlags, kConsumers), 1)
    fa3_fwd_kernel(const __grid_constant__ CUtensorMap tm_q,
                   const __grid_constant__ CUtensorMap tm_k,
                   const __grid_constant__ CUtensorMap tm_v, const KParams p) {
  constexpr bool kPers = kFlags & kPersist;
  using S = Smem<D, kConsumers, kStages, kPers>;
  extern __shared__ unsigned char smem_raw[];
  __shared__ Bars bars;
  // 128-byte swizzled tiles must start on 1024-byte boundaries: round the base up.
  unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);

  if (threadIdx.x == 0) {
    constexpr uint32_t kConsumerWarps = kConsumers * 4;  // one release per consumer warp
    mbar_init(&bars.q_full, 1);  // the issuing thread's arrive.expect_tx; then the bytes
    mbar_init(&bars.q_empty, kConsumerWarps);
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      mbar_init(&bars.full_k[st], 1);
      mbar_init(&bars.full_v[st], 1);
      mbar_init(&bars.empty_k[st], kConsumerWarps);
      mbar_init(&bars.empty_v[st], kConsumerWarps);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mbar_init(&bars.sched_full[i], 1);
      mbar_init(&bars.sched_empty[i], kConsumerWarps);
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  Trace<kTrace> tr;
  tr.init(p.trace, threadIdx.x / 32);

  if constexpr (kPers) {
    // Roles as in the warp-specialised kernels, each looping over the CTA's items.
    const int wg = threadIdx.x / kWGThreads;
    if (wg == 0) {
      setmaxnreg_dec<kProducerRegs>();
      if (threadIdx.x / 32 == 0 && elect_one())
        persistent_producer<S, kStages, kExtras, kTrace>(p, smem, bars, &tm_q, &tm_k, &tm_v, tr);
    } else {
      setmaxnreg_inc<consumer_regs(kConsumers)>();
      persistent_consumer<T, D, kFlags, kConsumers, kStages, kExtras, kTrace>(wg - 1, p, smem, bars,
                                                                              tr);
    }
  } else {
    // One item per CTA: the last query tiles first (causal: they see the most keys), so that
    // the last wave is made of short ones.
    const Item c = make_item<S::kBr, kExtras>(p, int(gridDim.x) - 1 - int(blockIdx.x),
                                              int(blockIdx.z) * p.heads + int(blockIdx.y));
    RingPos pos;
    if constexpr (kFlags & kWarpSpec) {
      // Roles: warpgroup 0 produces, the others consume. Each role is one branch, with its
      // setmaxnreg first, executed by whole warpgroups.
      const int wg = threadIdx.x / kWGThreads;
      if (wg == 0) {
        setmaxnreg_dec<kProducerRegs>();
        if (threadIdx.x / 32 == 0 && elect_one())
          producer<S, kStages, kTrace>(c, smem, bars, &tm_q, &tm_k, &tm_v, tr);
      } else {
        setmaxnreg_inc<consumer_regs(kConsumers)>();
        consume_item<T, D, kFlags, kConsumers, kStages, kExtras, kTrace>(c, wg - 1, p, smem, bars,
                                                                         pos, &tm_k, &tm_v, tr);
      }
    } else {
      // No roles: thread 0 starts Q and the first two K/V tiles, then computes like the others.
      if (threadIdx.x == 0 && c.walk.n_iter > 0) {
        load_q<S>(c, smem, &bars.q_full, &tm_q);
        for (int it = 0; it < kStages && it < c.walk.n_iter; ++it) {
          fault_delay();
          load_kv<S>(c, smem, &tm_k, S::kK, &bars.full_k[it], it, c.walk.tile(it));
          load_kv<S>(c, smem, &tm_v, S::kV, &bars.full_v[it], it, c.walk.tile(it));
          const unsigned long long ti = tr.now();
          tr.add(kTraceTmaIssueK, c.walk.tile(it), ti, ti);
        }
      }
      __syncwarp();
      consume_item<T, D, kFlags, kConsumers, kStages, kExtras, kTrace>(
          c, threadIdx.x / kWGThreads, p, smem, bars, pos, &tm_k, &tm_v, tr);
    }
  }
}
// ---- host side ---------------------------------------------------------------------------

KParams kernel_params(const FwdPlan& plan) {
  const FwdParams& f = plan.params;
  KParams k{};
  k.o = f.o, k.lse = f.lse;
  k.heads = f.heads, k.group = f.heads / f.heads_kv, k.seq_q = f.seq_q, k.seq_k = f.seq_k;
  k.scale = f.scale;
  k.scale_log2 = float(double(f.scale) * 1.4426950408889634);
  k.causal = f.causal ? 1 : 0;
  k.dropout = f.dropout_p > 0.f ? 1 : 0;
  k.drop_threshold = dropout::threshold(f.dropout_p);
  k.drop_rescale = float(1.0 / (1.0 - double(f.dropout_p)));
  k.seed_lo = uint32_t(f.dropout_seed & 0xffffffffu), k.seed_hi = uint32_t(f.dropout_seed >> 32);
  k.kv_count = f.kv_count, k.kv_index = f.kv_index;
  k.block_m = f.block_m > 0 ? f.block_m : plan.br;
  k.bn_tiles = f.block_n > 0 ? f.block_n / kBc : 1;
  k.mask_nI = (f.seq_q + k.block_m - 1) / k.block_m;
  k.mask_nJ = f.block_n > 0 ? (f.seq_k + f.block_n - 1) / f.block_n : 1;
  k.mask_batch = f.mask_batch, k.mask_heads = f.mask_heads;
  k.n_mt = (f.seq_q + plan.br - 1) / plan.br;
  k.n_bh = f.batch * f.heads;
  k.sec_heads = std::max(1, plan.section_heads);
  k.items = plan.items;
  k.counter = f.tile_counter;
  k.trace = f.trace;
  return k;
}

template <class T, int D, int kFlags, int kConsumers, int kStages, bool kExtras, bool kTrace>
void launch_one(const FwdPlan& plan, cudaStream_t stream) {
  CUtensorMap maps[3];
  std::memcpy(maps, plan.tensor_maps, sizeof(maps));
  fa3_fwd_kernel<T, D, kFlags, kConsumers, kStages, kExtras, kTrace>
      <<<plan.grid, plan.block, plan.smem_bytes, stream>>>(maps[0], maps[1], maps[2],
                                                           kernel_params(plan));
}

struct Entry {
  const void* fn = nullptr;
  void (*launch)(const FwdPlan&, cudaStream_t) = nullptr;
  int threads = 0, smem = 0, br = 0, stages = 0, consumers = 0;
  bool persistent = false;
};

template <class T, int D, int kFlags, int kConsumers, int kStages, bool kExtras, bool kTrace>
Entry entry() {
  constexpr bool kPers = (kFlags & kPersist) != 0;
  using S = Smem<D, kConsumers, kStages, kPers>;
  return {reinterpret_cast<const void*>(
              &fa3_fwd_kernel<T, D, kFlags, kConsumers, kStages, kExtras, kTrace>),
          &launch_one<T, D, kFlags, kConsumers, kStages, kExtras, kTrace>,
          threads_of(kFlags, kConsumers),
          S::kDynamic,
          S::kBr,
          kStages,
          kConsumers,
          kPers};
}

constexpr int kBase = 0, kWS = kWarpSpec, kPP = kWarpSpec | kPingPong,
              kFull = kWarpSpec | kPingPong | kIntraOverlap, kPers = kFull | kPersist;
// The persistent kernels' stages: three at d = 64 (the tiles are half as long to compute, so
// the ring must run further ahead; 144 KiB with three consumers), two at d = 128 (192 KiB).
template <int D>
inline constexpr int kPersStages = D == 64 ? 3 : 2;

// Instantiation ids: 0..15 = variant * 4 + (fp16 ? 2 : 0) + (d == 128) for the one-item
// kernels; 16..19 = persistent (two consumers), same order; 20, 21 = three consumers, d = 64,
// bf16 / fp16; 22..25 = persistent with dropout / block-sparse compiled in; 26, 27, 28 = the
// trace builds of tma-wgmma, intra-overlap and persistent (bf16, d = 128).
int instantiation_id(Variant v, bool is_bf16, int dim, int seq_q, bool extras, bool trace) {
  const int dt = (is_bf16 ? 0 : 2) + (dim == 128 ? 1 : 0);
  if (trace) return v == Variant::tma_wgmma ? 26 : v == Variant::intra_overlap ? 27 : 28;
  if (extras) return 22 + dt;
  if (query_tile(v, dim, extras, seq_q) == 192) return is_bf16 ? 20 : 21;
  if (is_persistent(v)) return 16 + dt;
  return int(v) * 4 + dt;
}

// The one switch that picks the instantiation.
Entry select(int id) {
  switch (id) {
    case 0:
      return entry<bf16, 64, kBase, 2, 2, false, false>();
    case 1:
      return entry<bf16, 128, kBase, 2, 2, false, false>();
    case 2:
      return entry<fp16, 64, kBase, 2, 2, false, false>();
    case 3:
      return entry<fp16, 128, kBase, 2, 2, false, false>();
    case 4:
      return entry<bf16, 64, kWS, 2, 2, false, false>();
    case 5:
      return entry<bf16, 128, kWS, 2, 2, false, false>();
    case 6:
      return entry<fp16, 64, kWS, 2, 2, false, false>();
    case 7:
      return entry<fp16, 128, kWS, 2, 2, false, false>();
    case 8:
      return entry<bf16, 64, kPP, 2, 2, false, false>();
    case 9:
      return entry<bf16, 128, kPP, 2, 2, false, false>();
    case 10:
      return entry<fp16, 64, kPP, 2, 2, false, false>();
    case 11:
      return entry<fp16, 128, kPP, 2, 2, false, false>();
    case 12:
      return entry<bf16, 64, kFull, 2, 2, false, false>();
    case 13:
      return entry<bf16, 128, kFull, 2, 2, false, false>();
    case 14:
      return entry<fp16, 64, kFull, 2, 2, false, false>();
    case 15:
      return entry<fp16, 128, kFull, 2, 2, false, false>();
    case 16:
      return entry<bf16, 64, kPers, 2, kPersStages<64>, false, false>();
    case 17:
      return entry<bf16, 128, kPers, 2, kPersStages<128>, false, false>();
    case 18:
      return entry<fp16, 64, kPers, 2, kPersStages<64>, false, false>();
    case 19:
      return entry<fp16, 128, kPers, 2, kPersStages<128>, false, false>();
    case 20:
      return entry<bf16, 64, kPers, 3, kPersStages<64>, false, false>();
    case 21:
      return entry<fp16, 64, kPers, 3, kPersStages<64>, false, false>();
    case 22:
      return entry<bf16, 64, kPers, 2, kPersStages<64>, true, false>();
    case 23:
      return entry<bf16, 128, kPers, 2, kPersStages<128>, true, false>();
    case 24:
      return entry<fp16, 64, kPers, 2, kPersStages<64>, true, false>();
    case 25:
      return entry<fp16, 128, kPers, 2, kPersStages<128>, true, false>();
    case 26:
      return entry<bf16, 128, kBase, 2, 2, false, true>();
    case 27:
      return entry<bf16, 128, kFull, 2, 2, false, true>();
    case 28:
      return entry<bf16, 128, kPers, 2, kPersStages<128>, false, true>();
    default:
      return {};
  }
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("step 07: " + what);
}

}  // namespace

const char* variant_name(Variant v) {
  switch (v) {
    case Variant::tma_wgmma:
      return "tma-wgmma";
    case Variant::warp_specialized:
      return "warp-specialized";
    case Variant::pingpong:
      return "pingpong";
    case Variant::intra_overlap:
      return "intra-overlap";
    case Variant::persistent:
      return "persistent";
    case Variant::three_consumers:
      return "three-consumers";
  }
  return "?";
}

const char* trace_phase_name(int phase) {
  switch (phase) {
    case kTraceTmaIssueK:
      return "tma_issue_k";
    case kTraceTmaIssueV:
      return "tma_issue_v";
    case kTraceWaitK:
      return "wait_k";
    case kTraceWaitV:
      return "wait_v";
    case kTraceGemmS:
      return "wgmma_s";
    case kTraceGemmPV:
      return "wgmma_pv";
    case kTraceSoftmax:
      return "softmax";
    default:
      return "unused";
  }
}

const char* trace_role_name(int phase) {
  return phase == kTraceTmaIssueK || phase == kTraceTmaIssueV ? "producer" : "consumer";
}

bool supported(Variant, bool, int dim, std::string* why) {
  if (dim == 64 || dim == 128) return true;
  if (why)
    *why =
        "head dims 64 and 128 (bf16 and fp16, every variant); 256 is not built: its O alone "
        "is 128 fp32 registers per consumer thread, which with S needs smaller key tiles";
  return false;
}

FwdPlan make_plan(const FwdParams& f, Variant v) {
  std::string why;
  require(supported(v, f.bf16, f.dim, &why), why);
  require(f.batch >= 1 && f.heads >= 1 && f.heads_kv >= 1 && f.seq_q >= 1 && f.seq_k >= 1,
          "batch, heads, heads_kv, seq_q, seq_k must be >= 1");
  require(f.heads % f.heads_kv == 0, "heads must be a multiple of heads_kv");
  require(f.batch <= 65535 && f.heads <= 65535, "batch and heads are grid dimensions (<= 65535)");
  require(std::isfinite(f.scale) && f.scale > 0.f,
          "scale must be finite and > 0 (negate Q for a negative scale)");
  require(f.q && f.k && f.v && f.o && f.lse, "null tensor pointer");
  for (const void* ptr : {f.q, f.k, f.v, static_cast<const void*>(f.o)})
    require(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, "Q, K, V, O must be 16-byte aligned");
  require(f.dropout_p >= 0.f && f.dropout_p < 1.f, "dropout_p must be in [0, 1)");
  const bool sparse = f.kv_count != nullptr;
  const bool extras = sparse || f.dropout_p > 0.f;
  require(!extras || is_persistent(v),
          "dropout and block-sparse are built into the persistent variants only "
          "('persistent', 'three-consumers')");
  if (sparse) {
    require(f.kv_index != nullptr, "kv_count without kv_index");
    // The dropout / block-sparse kernels have two consumers: Br = Bc = 128.
    require(f.block_m > 0 && f.block_m % 128 == 0 && f.block_n > 0 && f.block_n % kBc == 0,
            "mask blocks must be multiples of 128 x 128");
    require(f.mask_batch == 1 || f.mask_batch == f.batch, "mask_batch must be 1 or batch");
    require(f.mask_heads == 1 || f.mask_heads == f.heads, "mask_heads must be 1 or heads");
  }
  const bool trace = f.trace != nullptr;
  require(!trace || ((v == Variant::tma_wgmma || v == Variant::intra_overlap || is_persistent(v)) &&
                     f.bf16 && f.dim == 128 && !extras),
          "the trace build exists for tma-wgmma, intra-overlap and the persistent variants, "
          "bf16, d = 128, no extras");
  require(!is_persistent(v) || f.tile_counter != nullptr,
          "the persistent variants need tile_counter (4 bytes of device memory)");

  int dev = 0;
  cuda_ok(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  if (prop.major != 9 || prop.minor != 0)
    throw std::runtime_error("step 07: needs an sm_90 GPU (H100/H200); this is sm_" +
                             std::to_string(prop.major) + std::to_string(prop.minor));

  FwdPlan plan{};
  plan.params = f;
  plan.variant = v;
  plan.instantiation = instantiation_id(v, f.bf16, f.dim, f.seq_q, extras, trace);
  const Entry e = select(plan.instantiation);
  require(e.fn != nullptr, "no instantiation");
  plan.kernel = e.fn;
  plan.block = dim3(unsigned(e.threads));
  plan.smem_bytes = e.smem;
  plan.br = e.br, plan.bc = kBc, plan.stages = e.stages, plan.consumers = e.consumers;
  const int n_mt = (f.seq_q + e.br - 1) / e.br;
  const CUtensorMapDataType t16 =
      f.bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  // Boxes of 64 columns (128 bytes) x the tile's rows.
  encode_3d(plan.tensor_maps[0], f.q, t16, 2, f.dim, f.seq_q, f.batch * f.heads, 64, e.br);
  encode_3d(plan.tensor_maps[1], f.k, t16, 2, f.dim, f.seq_k, f.batch * f.heads_kv, 64, kBc);
  encode_3d(plan.tensor_maps[2], f.v, t16, 2, f.dim, f.seq_k, f.batch * f.heads_kv, 64, kBc);
  cuda_ok(cudaFuncSetAttribute(e.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, e.smem),
          "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  cudaFuncAttributes attr{};
  cuda_ok(cudaFuncGetAttributes(&attr, e.fn), "cudaFuncGetAttributes");
  plan.regs = attr.numRegs;
  if (!e.persistent) {
    plan.grid = dim3(unsigned(n_mt), unsigned(f.heads), unsigned(f.batch));
    return plan;
  }
  // Persistent: as many CTAs as fit at once (one per SM), never more than there are items.
  const long long items = (long long)n_mt * f.batch * f.heads;
  require(items <= INT_MAX / 2, "too many work items (query tiles x heads x batch)");
  int per_sm = 0;
  cuda_ok(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, e.fn, e.threads, e.smem),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  require(per_sm >= 1, "the persistent kernel does not fit on an SM");
  plan.items = int(items);
  plan.grid =
      dim3(unsigned(std::min<long long>(items, (long long)prop.multiProcessorCount * per_sm)));
  // Heads per L2 section: as many as have their K and V (seq_k x d x 2 bytes each, shared by
  // `group` query heads) in half of the L2, so that the section's K/V tiles are read from
  // memory about once while every query tile of those heads runs.
  const double kv_bytes = 4.0 * f.seq_k * f.dim / double(f.heads / f.heads_kv);
  const double fit = 0.5 * double(prop.l2CacheSize) / kv_bytes;
  plan.section_heads = int(std::max(1.0, std::min(double(f.batch) * f.heads, std::floor(fit))));
  // The counter starts at zero (each launch leaves it so); make sure before the first one.
  cuda_ok(cudaMemset(f.tile_counter, 0, sizeof(unsigned int)), "cudaMemset(tile_counter)");
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize after zeroing tile_counter");
  return plan;
}

void launch(const FwdPlan& plan, cudaStream_t stream) {
  const Entry e = select(plan.instantiation);
  if (!e.launch) throw std::invalid_argument("step 07: launch of an empty plan");
  e.launch(plan, stream);
  cuda_ok(cudaGetLastError(), "kernel launch");
}

std::string describe(const FwdPlan& plan) {
  std::ostringstream s;
  const bool ws = flags_of(plan.variant) & kWarpSpec;
  s << variant_name(plan.variant) << " " << (plan.params.bf16 ? "bf16" : "fp16")
    << " d=" << plan.params.dim << " Br=" << plan.br << " Bc=" << plan.bc
    << " threads=" << plan.block.x << " (" << (ws ? "1 producer + " : "") << plan.consumers
    << " consumer warpgroups)"
    << " smem=" << plan.smem_bytes << " regs=" << plan.regs << " stages=" << plan.stages;
  if (ws) s << " setmaxnreg=" << kProducerRegs << "/" << consumer_regs(plan.consumers);
  if (plan.items > 0)
    s << " persistent grid=" << plan.grid.x << " items=" << plan.items
      << " section=" << plan.section_heads << " heads";
  if (plan.instantiation >= 22 && plan.instantiation < 26) s << " extras=dropout+block-sparse";
  if (plan.instantiation >= 26) s << " trace";
  if (kFaultSkipKWait) s << " FAULT=skip_k_wait";
  return s.str();
}

}  // namespace ladder::fa3
