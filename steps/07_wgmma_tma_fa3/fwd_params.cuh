// Rung 07's forward, what every role shares: the tile sizes, where the tiles sit in shared
// memory, the mbarriers and their rings, the variant flags, the kernel's parameters, and the two
// hooks that are no-ops in the normal build: the trace stamps and the fault injection.
// Included by wgmma_tma_fa3.cu only (device code in an unnamed namespace).
#pragma once
#include <cuda.h>

#include <cmath>
#include <cstdint>

#include "fa3.cuh"
#include "wgmma_tma_fa3.hpp"

// ---- fault injection: a test of the self-test (off unless asked for) -----------------------
// Built with -DLADDER_07_FAULT=skip_k_wait, every consumer issues S_j = Q K_j^T BEFORE waiting
// on K_j's full barrier, the wait a missing-wait bug forgets (it still waits after the issue, so
// the phases stay balanced and nothing hangs). The thread that issues the K copies idles ~10^4
// clocks before each one, so that the race is lost every time; `selftest --expect-fault` passes
// only if the self-test's checks fail. The normal build has none of it (`if constexpr`).
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

constexpr bool kFaultSkipKWait = LADDER_07_FAULT_SKIP_K_WAIT != 0;

// ---- tiles ------------------------------------------------------------------------------
// Bc = 128 everywhere: S is 64 fp32 registers per thread, P 32 (16-bit pairs). Br = 64 per
// consumer warpgroup (wgmma's M): two consumers (Br = 128), or three at d = 64 (Br = 192).
//   d = 128, two consumers: O is 64 registers; with the next tile's S in flight (intra-overlap)
//     about 190 of the 240 a consumer gets. Two stages: 160 KiB (+ 32 KiB O buffer when
//     persistent); three would pass the 227 KiB limit.
//   d = 64, three consumers: O is 32 registers, S 64 + P 32 + O 32 + about 30 of addresses,
//     row state and loop counters: it fits the 160 that 4 warpgroups leave (fa3.cuh;
//     ptxas: R0-R157, no spill). Shared memory: Q 24 + 3 stages x 32 + O 24 = 144 KiB. A third
//     consumer at d = 128 would need 64 (O) + 96 (S, P) > 160.
//   Larger Bc instead (FA3's 192 at d = 64) would need P through shared memory to fit 160 or
//     more registers for S: a bigger change for the same aim (more GEMM time per softmax).
constexpr int kMaxStages = 3, kMaxConsumers = 3;
constexpr float kNegInf = -INFINITY;
static_assert(kBarEpilogue >= kBarSched + kMaxConsumers, "a ping-pong id per consumer");

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

// The mbarriers (static shared memory) and the rings over them (Pipeline, hopper.cuh): Q (one
// stage: a full barrier, and an empty one that the persistent kernels reload it on), K and V
// (kStages stages each) and the schedule's two-slot ring of item indices (tile_scheduler.cuh).
// A ring is made where it is used, so that its barriers' addresses stay constants.
template <int kStages>
struct Bars {
  uint64_t q_full, q_empty;
  uint64_t full_k[kMaxStages], full_v[kMaxStages], empty_k[kMaxStages], empty_v[kMaxStages];
  uint64_t sched_full[2], sched_empty[2];
  int next_item[2];

  __device__ __forceinline__ Pipeline<1> q() { return {&q_full, &q_empty}; }
  __device__ __forceinline__ Pipeline<kStages> k() { return {full_k, empty_k}; }
  __device__ __forceinline__ Pipeline<kStages> v() { return {full_v, empty_v}; }
  __device__ __forceinline__ Pipeline<2> sched() { return {sched_full, sched_empty}; }
  // Every full barrier completes on the producer's one arrive (and the bytes), every empty one
  // on one release per consumer warp.
  __device__ __forceinline__ void init(uint32_t consumer_warps) {
    q().init(1, consumer_warps);
#pragma unroll
    for (int st = 0; st < kStages; ++st) {  // K's and V's stage by stage
      mbar_init(&full_k[st], 1);
      mbar_init(&full_v[st], 1);
      mbar_init(&empty_k[st], consumer_warps);
      mbar_init(&empty_v[st], consumer_warps);
    }
    sched().init(1, consumer_warps);
  }
};

// One bit per idea; from tma-wgmma on a variant is a prefix of them (three-consumers differs
// from persistent in its warpgroup count, a template parameter); the baseline, wgmma, is
// tma-wgmma with its copies made by cp.async instead of the TMA unit.
enum Flag : int { kWarpSpec = 1, kPingPong = 2, kIntraOverlap = 4, kPersist = 8, kCpAsync = 16 };
constexpr int flags_of(Variant v) {
  return v == Variant::wgmma              ? kCpAsync
         : v == Variant::tma_wgmma        ? 0
         : v == Variant::warp_specialized ? kWarpSpec
         : v == Variant::pingpong         ? kWarpSpec | kPingPong
         : v == Variant::intra_overlap    ? kWarpSpec | kPingPong | kIntraOverlap
                                          : kWarpSpec | kPingPong | kIntraOverlap | kPersist;
}
constexpr int threads_of(int flags, int consumers) {
  return (consumers + ((flags & kWarpSpec) ? 1 : 0)) * kWGThreads;
}

// What the kernel needs besides the tensor maps (by value, in the parameter space).
struct KParams {
  void* o;
  float* lse;
  int heads, group, seq_q, seq_k;
  ScoreParams score;  // dropout (kExtras kernels): O *= drop_rescale
  // block-sparse (kExtras kernels; kv_count null = dense)
  const int* kv_count;
  const int* kv_index;
  int mask_nI, mask_nJ, block_m, bn_tiles, mask_batch, mask_heads;
  // persistent kernels: items = n_mt query tiles x n_bh (batch x heads), in sections of
  // sec_heads heads; the counter hands out items gridDim.x, gridDim.x + 1, ...
  int n_mt, n_bh, sec_heads, items;
  unsigned int* counter;
  unsigned long long* trace;
  const void *q, *k, *v;  // the wgmma variant's cp.async sources (the others use the maps)
  Strides q_strides, k_strides, v_strides, o_strides;  // resolved (elements)
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
  // An instant (t0 = t1 = now), e.g. a copy issued.
  __device__ __forceinline__ void mark(int phase, int tile) {
    const unsigned long long t = now();
    add(phase, tile, t, t);
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

// The fault build's delay before a K copy; nothing otherwise.
__device__ __forceinline__ void fault_delay() {
  if constexpr (kFaultSkipKWait) {
    const long long t0 = clock64();
    while (clock64() - t0 < 10000) {
    }
  }
}

}  // namespace
}  // namespace ladder::fa3
