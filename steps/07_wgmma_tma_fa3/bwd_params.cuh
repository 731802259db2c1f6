// Rung 07's backward, what every role shares: the tiles, where they sit in shared memory, the
// mbarriers and their rings, the kernel's parameters and the item slots the producer fills.
// Included by wgmma_tma_fa3_backward.cu only (device code in an unnamed namespace).
#pragma once
#include <cuda.h>

#include <cmath>
#include <cstdint>

#include "fa3.cuh"

namespace ladder::fa3 {
namespace {

// ---- tiles, shared memory, barriers ------------------------------------------------------
// Bc = 128 keys per unit: two consumer warpgroups x 64 (wgmma's M). The register split is the
// forward's with two consumers, 24 / 240 (fa3.cuh).
constexpr int kStages = 2, kThreads = 3 * kWGThreads;
constexpr int kConsumerRegs = consumer_regs(2);
constexpr float kLog2e = 1.4426950408889634f;

// The dQ staging of the tma-reduce variant: per consumer warpgroup a 64 x 64 fp32 part, two
// TMA boxes of 64 rows x 32 floats (128-byte rows, the TMA's 128-byte swizzle).
constexpr int kDqBoxBytes = 64 * 32 * 4, kDqWgBytes = 2 * kDqBoxBytes;

template <int D>
struct Cfg {
  // Br: the registers decide (wgmma_tma_fa3_backward.cu): S^T and dP^T are Br / 2 fp32 each.
  static constexpr int kBr = D == 64 ? 128 : 64;
  static constexpr int kQBytes = kBr * D * 2;     // one stage of Q (or dO): d / 64 column halves
  static constexpr int kKVBytes = kBc * D * 2;    // K or V
  static constexpr int kDSBytes = kBc * kBr * 2;  // one dS^T buffer: Br / 64 query halves
  // One K/V stage: a second (the next unit's K_j, V_j landing while this one's last items run)
  // would need 64 KiB more at d = 128 and 32 at d = 64. Neither fits beside the rest: at d = 64
  // the dynamic shared memory would be 232 448 bytes with the 1 KiB alignment slack, the whole
  // per-block limit, with the static barriers and item slots still to come.
  static constexpr int kK = 0;
  static constexpr int kV = kK + kKVBytes;
  static constexpr int kQ = kV + kKVBytes;
  static constexpr int kDO = kQ + kStages * kQBytes;
  static constexpr int kDS = kDO + kStages * kQBytes;
  static constexpr int kDQ = kDS + 2 * kDSBytes;
  static constexpr int kL = kDQ + 2 * kDqWgBytes;
  static constexpr int kDsum = kL + kStages * kBr * 4;
  static constexpr int kBytes = kDsum + kStages * kBr * 4;
  static constexpr int kDynamic = kBytes + 1024;  // slack to round the base up to 1024
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0 && kDSBytes % 1024 == 0,
                "every swizzled tile starts on a 1024-byte boundary");
  static_assert(kDynamic <= 227 * 1024, "more shared memory than an H100 block can have");
};

// The mbarriers (static shared memory).
struct Bars {
  uint64_t kv_full;      // a unit's K_j and V_j landed (1 arrival + bytes)
  uint64_t kv_empty;     // both warpgroups done with a unit's K_j, V_j (8 warps)
  uint64_t full_q[2];    // Q_i and L_i of a stage landed
  uint64_t full_do[2];   // dO_i and D_i landed
  uint64_t empty[2];     // both warpgroups done with a stage (8 warps)
  uint64_t dq_full[2];   // warpgroup w's dQ part staged (128 threads)
  uint64_t dq_empty[2];  // the writer has read warpgroup w's part (1)
};

// What the kernel needs besides the tensor maps (by value, in the parameter space).
struct KParams {
  const float* lse2;  // [B H, m_pad]
  const float* dsum;  // [B H, m_pad]
  float* dq_acc;      // [B H, M, d] (the atomic variant writes it directly)
  void* dk;
  void* dv;
  int heads, heads_kv, group, seq_q, seq_k, m_pad;
  // K/V tiles per K/V plane; units = n_kt x heads_kv x batch (tile_scheduler.cuh); the
  // persistent CTAs' work counter (null: one unit per CTA)
  int n_kt, units;
  unsigned int* counter;
  ScoreParams score;  // dropout (kExtras): dV *= drop_rescale
  // block-sparse (kExtras; q_count null = dense): the host's lists of kept query blocks
  const int* q_count;
  const int* q_index;
  int mask_nI, mask_nJ, bm_tiles, bn_tiles, mask_batch, mask_heads;
};

// What the producer tells the others about item x, in shared memory slot x % 4: query head h,
// first query row i0, the unit's K/V tile jt and batch b, and two flags: the item is its unit's
// last (dK, dV are complete after it) and the CTA's last. Written before the arrive that
// completes the full_q phase of item x's stage, so a consumer that has waited for that phase
// reads it, and so does the dQ writer, which waits for the consumers' dq_full of item x. Four
// slots: the producer rewrites slot x % 4 for item x + 4 only after both consumers released item
// x + 2's stage, by which time they have staged item x + 1's dQ, which needed the writer to be
// done with item x. Only the producer walks the items.
struct ItemInfo {
  int h, i0, jt, b_flags;  // b_flags = b << 2 | 2 (the unit's last item) | 1 (the CTA's last)
  __device__ __forceinline__ int b() const { return b_flags >> 2; }
  __device__ __forceinline__ bool unit_last() const { return b_flags & 2; }
  __device__ __forceinline__ bool last() const { return b_flags & 1; }
};
constexpr int kItemSlots = 4;

// The small shared objects live at fixed shared-memory addresses (static allocation), so that
// no role spends registers on pointers to them.
__shared__ Bars g_bars;
__shared__ ItemInfo g_items[kItemSlots];  // written by the producer
__shared__ int g_has_items;  // the CTA's first unit has an item: thread 0, before __syncthreads
__shared__ int g_walk[8];    // the producer's BwdWalk constants (tile_scheduler.cuh)

// The rings over g_bars (Pipeline, hopper.cuh). Q_i (+ L_i) and dO_i (+ D_i) fill one stage
// with a full barrier each and share its empty barrier: both are released at once. Consumer
// warpgroup w hands its dQ part to the dQ writer through a one-stage ring of its own.
__device__ __forceinline__ Pipeline<kStages> q_ring() {
  return {g_bars.full_q, g_bars.empty};
}
__device__ __forceinline__ Pipeline<kStages> do_ring() {
  return {g_bars.full_do, g_bars.empty};
}
// K_j and V_j of the CTA's units in a one-stage ring: use u is the CTA's unit u.
__device__ __forceinline__ Pipeline<1> kv_ring() {
  return {&g_bars.kv_full, &g_bars.kv_empty};
}
__device__ __forceinline__ Pipeline<1> dq_ring(int w) {
  return {&g_bars.dq_full[w], &g_bars.dq_empty[w]};
}

}  // namespace
}  // namespace ladder::fa3
