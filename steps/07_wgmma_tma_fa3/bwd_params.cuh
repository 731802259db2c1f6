// Rung 07's backward, what every role shares: the tiles and the register split, where the tiles
// sit in shared memory, the mbarriers and the named barrier, the kernel's parameters, the item
// slots the producer fills, and the CTA's coordinates. Included by wgmma_tma_fa3_backward.cu
// only (device code in an unnamed namespace).
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "hopper.cuh"

namespace ladder::fa3 {
namespace {

using namespace ladder::hopper;
using bf16 = __nv_bfloat16;
using fp16 = __half;

// ---- tiles, shared memory, barriers ------------------------------------------------------
constexpr int kBc = 128;  // keys per CTA: two consumer warpgroups x 64 (wgmma's M)
constexpr int kStages = 2, kWGThreads = 128, kThreads = 3 * kWGThreads;
constexpr int kRowBytes = 128;  // one swizzled row: 64 16-bit elements (or 32 floats)
constexpr float kLog2e = 1.4426950408889634f;

// Register split: 128 x 24 + 256 x 240 = 64512 <= 65536 (the forward's).
constexpr int kProducerRegs = 24, kConsumerRegs = 240;

// The dQ staging of the tma-reduce variant: per consumer warpgroup a 64 x 64 fp32 part, two
// TMA boxes of 64 rows x 32 floats (128-byte rows, the TMA's 128-byte swizzle).
constexpr int kDqBoxBytes = 64 * 32 * 4, kDqWgBytes = 2 * kDqBoxBytes;

template <int D>
struct Cfg {
  // Br: the registers decide (see the top of the file): S^T and dP^T are Br / 2 fp32 each.
  static constexpr int kBr = D == 64 ? 128 : 64;
  static constexpr int kQBytes = kBr * D * 2;     // one stage of Q (or dO): d / 64 column halves
  static constexpr int kKVBytes = kBc * D * 2;    // K or V
  static constexpr int kDSBytes = kBc * kBr * 2;  // one dS^T buffer: Br / 64 query halves
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

// The mbarriers (static shared memory), in the forward's style: one struct, named members.
struct Bars {
  uint64_t kv;           // K_j and V_j landed (1 arrival + bytes)
  uint64_t full_q[2];    // Q_i and L_i of a stage landed
  uint64_t full_do[2];   // dO_i and D_i landed
  uint64_t empty[2];     // both warpgroups done with a stage (8 warps)
  uint64_t dq_full[2];   // warpgroup w's dQ part staged (128 threads)
  uint64_t dq_empty[2];  // the writer has read warpgroup w's part (1)
};
constexpr int kBarDS = 1;  // named barrier: both consumers wrote their dS^T

// What the kernel needs besides the tensor maps (by value, in the parameter space).
struct KParams {
  const float* lse2;  // [B H, m_pad]
  const float* dsum;  // [B H, m_pad]
  float* dq_acc;      // [B H, M, d] (the atomic variant writes it directly)
  void* dk;
  void* dv;
  int heads, heads_kv, group, seq_q, seq_k, m_pad;
  float scale, scale_log2;
  int causal;
  // dropout (kExtras): keep iff the 16-bit uniform >= threshold; dV *= drop_rescale
  int dropout;
  uint32_t drop_threshold, seed_lo, seed_hi;
  float drop_rescale;
  // block-sparse (kExtras; q_count null = dense): the host's lists of kept query blocks
  const int* q_count;
  const int* q_index;
  int mask_nI, mask_nJ, bm_tiles, bn_tiles, mask_batch, mask_heads;
};

// What the producer tells the others about item x, in shared memory slot x % 4: query head h,
// first query row i0, last = no item follows. Written before the arrive that completes the full_q
// phase of item x's stage, so a consumer that has waited for that phase reads it, and so does the
// dQ writer, which waits for the consumers' dq_full of item x. Four slots: the producer rewrites
// slot x % 4 for item x + 4 only after both consumers released item x + 2's stage, by which time
// they have staged item x + 1's dQ, which needed the writer to be done with item x. Only the
// producer walks the items.
struct ItemInfo {
  int h, i0, last, pad;
};
constexpr int kItemSlots = 4;

// The small shared objects live at fixed shared-memory addresses (static allocation), so that
// no role spends registers on pointers to them.
__shared__ Bars g_bars;
__shared__ ItemInfo g_items[kItemSlots];  // written by the producer
__shared__ int g_has_items;               // written by the producer before it arrives on bar_kv

struct Ctx {
  int j0, hk, b, bhk;  // first key; K/V head; batch; K/V plane b * heads_kv + hk
  int M, N;
  unsigned char* smem;  // 1024-aligned base of the dynamic shared memory
};

// Two packed 16-bit values (pack2's layout) back to fp32, low half first.
template <class T>
__device__ __forceinline__ float2 unpack2(uint32_t v) {
  if constexpr (kIsBf16<T>)
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
  else
    return __half22float2(*reinterpret_cast<const __half2*>(&v));
}

}  // namespace
}  // namespace ladder::fa3
