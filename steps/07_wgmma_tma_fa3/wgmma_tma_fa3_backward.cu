// SPDX-License-Identifier: MIT (LICENSE). Follows the published structure of
// FlashAttention-2 (T. Dao, 2023, arXiv:2307.08691, Algorithm 2) on the machinery of
// FlashAttention-3 (Shah, Bikshandi, Zhang, Thakkar, Ramani, Dao, 2024, arXiv:2407.08608).
// Step 07 — FlashAttention's backward pass on Hopper: TMA, wgmma, a producer warpgroup, dQ
// accumulated by TMA reduce-add (or vector atomics). sm_90a, bf16/fp16, head dims 64 and 128.
//
// The algorithm is step 06's backward (FlashAttention-2, Dao 2023, Algorithm 2) in three kernels:
//
//   pre-pass  D_i = rowsum(dO_i o O_i) (fp32); L_i = LSE_i log2(e), +inf where LSE_i = -inf;
//             zero the fp32 dQ accumulator
//   main      one CTA per (K/V tile j of Bc = 128 keys, K/V head, batch). K_j, V_j arrive once;
//             then for every query head of the GQA group and every Q tile i that sees K_j
//             (an "item"): recompute P from the saved L, form dS, accumulate dK_j, dV_j in
//             registers and add dS K_j to the fp32 dQ_i of the other CTAs' tiles
//   post-pass dQ = scale dQ_acc, rounded to T
//
// What changes from step 06 is the machinery (the forward's, wgmma_tma_fa3.cu):
//   - a producer warpgroup: warp 0 streams Q_i (+ L_i) and dO_i (+ D_i) by TMA and 1-D bulk copies
//     into a 2-stage ring of full/empty mbarriers; warp 1 (tma-reduce variant) adds each item's
//     dQ tile to global memory with cp.reduce.async.bulk.tensor (the copy engine adds at the L2);
//   - two consumer warpgroups (setmaxnreg 24 / 240); warpgroup w owns keys 64w .. 64w+63 of the
//     tile and keeps their dK, dV (fp32) in registers for the whole CTA;
//   - every product is a wgmma.
//
// Which products are transposed, and why. A warpgroup owns 64 KEY rows, so it computes the
// transposed products S^T = K_w Q_i^T and dP^T = V_w dO_i^T (M = 64 keys, N = Br queries, both
// operands K-major as stored). Their accumulators then hold P^T and dS^T with this warpgroup's
// keys as rows: exactly the A-fragment layout of dV_w += P^T dO_i and dK_w += dS^T Q_i, so those
// two products take A from registers (the forward's P trick) and B = dO_i, Q_i read N-major
// (the transpose bit, like V in the forward). Only dQ_i = dS K_j needs every key of the tile: each
// warpgroup writes its dS^T to shared memory ([key][query], 128-byte swizzle, conflict-free
// 4-byte stores) and, after one named barrier of both warpgroups, reads dS back as an MN-major A
// operand (the A transpose bit) against K_j read N-major.
//
//   d = 128: Br = 64 queries per item. Per thread: dK, dV 64 + 64 fp32, S^T and dP^T 32 + 32;
//            the dQ product is split by columns (warpgroup w: columns 64w .., all 64 rows).
//   d = 64:  Br = 128. dK, dV 32 + 32, S^T and dP^T 64 + 64; dQ split by rows (warpgroup w:
//            queries 64w .., all 64 columns). Either way every wgmma of dQ is 64 x 64 x 16.
//
// Per item x, in each consumer warpgroup (the loop body; S^T_x, dP^T_x and P^T_x were done at the
// end of the previous iteration):
//   wait dP^T_x -> dS^T = P^T o (dP^T - D_i) (fp32, then both P^T and dS^T as 16-bit A fragments)
//   issue dV += P^T dO_i, dK += dS^T Q_i
//   dS^T -> shared memory; fence.proxy.async; named barrier (both warpgroups); issue dQ = dS K_j
//   wait dV, dK -> release the Q/dO stage to the producer
//   issue S^T_{x+1} = K_w Q_{x+1}^T; wait dQ_x -> dQ out (the stores run under S^T_{x+1})
//   wait S^T_{x+1}; issue dP^T_{x+1} = V_w dO_{x+1}^T; P^T_{x+1} = exp2(S^T scale log2e - L)
//   (the exps run under dP^T_{x+1}) -> loop edge
// then dK *= scale, and dK, dV stored. The dS^T buffer is double-buffered: a warpgroup writes
// buffer x % 2 of item x only after passing the barrier of item x - 1, which the other warpgroup
// reaches only after its own dQ of item x - 2 (the last reader of that buffer) has completed.
// The two warpgroups run in step (the barrier), and their products share the tensor cores.
//
// dQ out, two variants (a template flag):
//   tma-reduce  the warpgroup stores its fp32 64 x 64 part into a swizzled staging tile (waiting
//               first for the writer to have read the previous one: dq_empty), fences, and
//               arrives on dq_full; producer warp 1 issues two cp.reduce.async.bulk.tensor boxes
//               of 64 rows x 32 columns, waits until they have been read and arrives on dq_empty.
//               Rows past seq_q are clipped by the copy engine.
//   atomic      lanes t, t ^ 1 swap halves so each holds 4 adjacent floats, then
//               red.global.add.v4.f32 straight from registers (step 06's dQ path).
//
// Dropout and block-sparse masks live in a separate instantiation (kExtras), as in the forward.
#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes through the runtime
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>

#include "dropout.hpp"
#include "hopper.cuh"
#include "tensor_map.hpp"
#include "wgmma_tma_fa3.hpp"

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

// mbarriers (static shared memory), by index.
constexpr int kBarKV = 0;              // K_j and V_j landed (1 arrival + bytes)
constexpr int kFullQ = 1;              // [2] Q_i and L_i of a stage landed
constexpr int kFullDO = kFullQ + 2;    // [2] dO_i and D_i landed
constexpr int kEmpty = kFullDO + 2;    // [2] both warpgroups done with a stage (8 warps)
constexpr int kDqFull = kEmpty + 2;    // [2] warpgroup w's dQ part staged (128 threads)
constexpr int kDqEmpty = kDqFull + 2;  // [2] the writer has read warpgroup w's part (1)
constexpr int kNumBars = kDqEmpty + 2;
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
__shared__ uint64_t g_bars[kNumBars];
__shared__ ItemInfo g_items[kItemSlots];  // written by the producer
__shared__ int g_has_items;               // written by the producer before it arrives on bar_kv

struct Ctx {
  int j0, hk, b, bhk;  // first key; K/V head; batch; K/V plane b * heads_kv + hk
  int M, N;
  unsigned char* smem;  // 1024-aligned base of the dynamic shared memory
};

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
    mbar_arrive_if(g_bars + kBarKV, true);
    return;
  }
  {
    const int j0 = int(blockIdx.x) * kBc, bhk = int(blockIdx.z) * p.heads_kv + int(blockIdx.y);
    mbar_arrive_expect_tx(g_bars + kBarKV, 2 * C::kKVBytes);
#pragma unroll
    for (int hf = 0; hf < D / 64; ++hf) {
      tma_load_3d(smem + C::kK + hf * kBc * kRowBytes, tm_k, g_bars + kBarKV, hf * 64, j0, bhk);
      tma_load_3d(smem + C::kV + hf * kBc * kRowBytes, tm_v, g_bars + kBarKV, hf * 64, j0, bhk);
    }
  }
  for (int x = 0;; ++x) {
    const int st = x % kStages, use = x / kStages;
    const int h = int(blockIdx.y) * p.group + walk.hh, i0 = walk.tile * kBr;
    const int bh = int(blockIdx.z) * p.heads + h;
    walk.next(p);
    mbar_wait(g_bars + kEmpty + st, (use & 1) ^ 1);  // the first pass is free (parity 1)
    g_items[x % kItemSlots] = ItemInfo{h, i0, walk.valid(p) ? 0 : 1, 0};
    uint64_t* fq = g_bars + kFullQ + st;
    mbar_arrive_expect_tx(fq, C::kQBytes + kBr * 4);
#pragma unroll
    for (int hf = 0; hf < D / 64; ++hf)
      tma_load_3d(smem + C::kQ + st * C::kQBytes + hf * kBr * kRowBytes, tm_q, fq, hf * 64, i0, bh);
    bulk_load(smem + C::kL + st * kBr * 4, p.lse2 + size_t(bh) * p.m_pad + i0, kBr * 4, fq);
    uint64_t* fd = g_bars + kFullDO + st;
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
  mbar_wait(g_bars + kBarKV, 0);
  if (!g_has_items) return;
  tma_prefetch_descriptor(tm_dq);
  for (int x = 0;; ++x) {
    ItemInfo item{};
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      mbar_wait(g_bars + kDqFull + w, x & 1);
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
    mbar_arrive_if(g_bars + kDqEmpty + 0, true);
    mbar_arrive_if(g_bars + kDqEmpty + 1, true);
    if (item.last) break;
  }
  bulk_wait<0>();  // every add done before the CTA ends
}

// Two packed 16-bit values (pack2's layout) back to fp32, low half first.
template <class T>
__device__ __forceinline__ float2 unpack2(uint32_t v) {
  if constexpr (kIsBf16<T>)
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
  else
    return __half22float2(*reinterpret_cast<const __half2*>(&v));
}

// ---- the consumer's products -----------------------------------------------------------------

// acc (64 x kN) = A B^T: A = 64 rows of a [Bc][D] tile (K_j or V_j: this warpgroup's keys), B =
// a [kN][D] tile (Q_i or dO_i); both K-major, d / 16 k-steps of 32 bytes inside a 128-byte row,
// the next 64 dims one column half further (the forward's S = Q K^T). No commit.
template <class T, int D, int kN>
__device__ __forceinline__ void issue_abt(float (&acc)[kN / 2], uint32_t a_rows, uint32_t b_tile) {
  reg_fence(acc);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t col = (kk % 4) * 32;
    const uint64_t da = make_desc_sw128(a_rows + (kk / 4) * (kBc * kRowBytes) + col, 16, 1024);
    const uint64_t db = make_desc_sw128(b_tile + (kk / 4) * (kN * kRowBytes) + col, 16, 1024);
    wgmma_ss<T, kN, 0>(acc, da, db, kk > 0);
  }
}

// acc (64 x D) += A B: A (64 x Br, this warpgroup's keys x the item's queries) from registers,
// B = a [Br][D] tile (dO_i or Q_i) read N-major: k-step kk = rows 16kk.. (2048 bytes further),
// the next 64 columns one column half (Br rows) away (the forward's O += P V). No fence, no
// commit (the caller does both around the two products).
template <class T, int D, int kBr>
__device__ __forceinline__ void issue_rs(float (&acc)[D / 2], const uint32_t (&a)[kBr / 16][4],
                                         uint32_t b_tile) {
#pragma unroll
  for (int kk = 0; kk < kBr / 16; ++kk) {
    const uint64_t db = make_desc_sw128(b_tile + kk * 16 * kRowBytes, kBr * kRowBytes, 1024);
    wgmma_rs<T, D, 1>(acc, a[kk], db, true);
  }
}

// acc (64 x 64) = dS K_j: A = dS (64 queries x Bc keys) read MN-major from the dS^T buffer
// ([key][64 queries] rows: k-step kk = keys 16kk.., 2048 bytes further), B = K_j (Bc keys x
// 64 dims) read N-major from one column half of the K tile. No commit.
template <class T>
__device__ __forceinline__ void issue_dq(float (&acc)[32], uint32_t ds, uint32_t k) {
  reg_fence(acc);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk) {
    const uint64_t da = make_desc_sw128(ds + kk * 16 * kRowBytes, kBc * kRowBytes, 1024);
    const uint64_t db = make_desc_sw128(k + kk * 16 * kRowBytes, kBc * kRowBytes, 1024);
    wgmma_ss_t<T, 64, 1, 1>(acc, da, db, kk > 0);
  }
}

// dS^T (A fragments f, this thread's keys row0 and row0 + 8 of the tile, row0 = 64w + 16wp + g)
// into the [Br / 64 query halves][Bc keys][64 queries] buffer, 128-byte swizzle: 16-byte chunk
// c of row r at c ^ (r % 8). Fragment register q holds key row0 + 8 (q & 1), queries
// 16kk + 8 (q >> 1) + 2t, +1: one 4-byte store; the 32 lanes hit 32 different banks.
template <int kBr>
__device__ __forceinline__ void store_ds_t(unsigned char* buf, const uint32_t (&f)[kBr / 16][4],
                                           int row0, int g, int t) {
#pragma unroll
  for (int kk = 0; kk < kBr / 16; ++kk)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int row = row0 + 8 * (q & 1), col = 16 * kk + 8 * (q >> 1) + 2 * t;
      const int off = (col / 64) * (kBc * kRowBytes) + row * kRowBytes +
                      ((((col % 64) / 8) ^ g) * 16) + (col % 8) * 2;  // row % 8 == g
      *reinterpret_cast<uint32_t*>(buf + off) = f[kk][q];
    }
}

// dQ part (64 x 64 fp32, accumulator layout: dq[4c + 2r + i] = row 16wp + g + 8r, column
// 8c + 2t + i) into this warpgroup's staging tile: box c / 4 (32 columns), row R at R * 128
// bytes, 16-byte chunk (column % 32) / 4 at chunk ^ (R % 8) — the TMA's 128-byte swizzle.
__device__ __forceinline__ void stage_dq(unsigned char* buf, const float (&dq)[32], int wp, int g,
                                         int t) {
#pragma unroll
  for (int cc = 0; cc < 8; ++cc)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = 16 * wp + g + 8 * r, chunk = 2 * (cc % 4) + (t >> 1);
      const int off = (cc / 4) * kDqBoxBytes + row * kRowBytes + ((chunk ^ g) * 16) + (t & 1) * 8;
      *reinterpret_cast<float2*>(buf + off) =
          make_float2(dq[4 * cc + 2 * r], dq[4 * cc + 2 * r + 1]);
    }
}

// dQ part straight to dQ_acc with 16-byte atomics: lanes t and t ^ 1 swap one float2 so that an
// even lane holds columns 8c + 2t .. +3 of n8 block c and an odd lane 8(c + 1) + 2t - 2 .. +1
// of block c + 1; rows past seq_q are skipped (after the shuffles, which every lane joins).
template <int D>
__device__ __forceinline__ void atomic_dq(float* plane, int row0, int col0, int M,
                                          const float (&dq)[32], int wp, int g, int t) {
  const bool odd = t & 1;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 16 * wp + g + 8 * r;
    float4 v[4];
#pragma unroll
    for (int cc = 0; cc < 8; cc += 2) {
      const float2 a = make_float2(dq[4 * cc + 2 * r], dq[4 * cc + 2 * r + 1]);
      const float2 bb = make_float2(dq[4 * cc + 4 + 2 * r], dq[4 * cc + 4 + 2 * r + 1]);
      const float2 send = odd ? a : bb;
      const float2 got = make_float2(__shfl_xor_sync(0xffffffffu, send.x, 1),
                                     __shfl_xor_sync(0xffffffffu, send.y, 1));
      v[cc / 2] = odd ? make_float4(got.x, got.y, bb.x, bb.y) : make_float4(a.x, a.y, got.x, got.y);
    }
    if (row >= M) continue;
#pragma unroll
    for (int cc = 0; cc < 8; cc += 2)
      atomicAdd(reinterpret_cast<float4*>(plane + size_t(row) * D + col0 +
                                          8 * (cc + (odd ? 1 : 0)) + 2 * (t & 2)),
                v[cc / 2]);
  }
}

// ---- the consumer warpgroup w (keys 64w .. 64w+63 of the tile) --------------------------------
template <class T, int D, bool kDqTma, bool kExtras>
__device__ __forceinline__ void consumer(const Ctx& c, int w, const KParams& p) {
  using C = Cfg<D>;
  constexpr int kBr = C::kBr;
  const int tid = threadIdx.x % kWGThreads, wp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int M = c.M, N = c.N;

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = 0.f, dv[i] = 0.f;

  // This thread's keys: tile rows row0 = 64w + 16wp + g and row0 + 8.
  const int row0 = 64 * w + 16 * wp + g;

  const uint32_t base = smem_u32(c.smem);
  const uint32_t k_rows = base + C::kK + w * 64 * kRowBytes;  // A of S^T: this warpgroup's keys
  const uint32_t v_rows = base + C::kV + w * 64 * kRowBytes;  // A of dP^T
  // The dQ split: d = 128, columns 64w .. (K_j's column half w, dS of all 64 queries); d = 64,
  // queries 64w .. (query half w of the dS^T buffer, all of K_j).
  const uint32_t k_dq = base + C::kK + (D == 128 ? w : 0) * (kBc * kRowBytes);
  const uint32_t ds_half = (D == 128 ? 0 : w) * (kBc * kRowBytes);
  const int dq_row0 = D == 128 ? 0 : 64 * w, dq_col0 = D == 128 ? 64 * w : 0;
  const float* s_l = reinterpret_cast<const float*>(c.smem + C::kL);
  const float* s_d = reinterpret_cast<const float*>(c.smem + C::kDsum);
  [[maybe_unused]] const uint32_t key16 = uint32_t(c.j0 + 64 * w + 16 * wp) / 16u;

  // dQ of item `item` (plane bh, first row i0) out of the dq registers.
  auto dq_out = [&](const float(&dq)[32], int item, int bh, int i0) {
    if constexpr (kDqTma) {
      mbar_wait(g_bars + kDqEmpty + w, (item & 1) ^ 1);  // the writer has read item - 1's part
      stage_dq(c.smem + C::kDQ + w * kDqWgBytes, dq, wp, g, t);
      fence_proxy_async_shared();  // generic writes -> the copy engine's reads
      mbar_arrive_if(g_bars + kDqFull + w, true);
    } else {
      atomic_dq<D>(p.dq_acc + size_t(bh) * M * D, i0 + dq_row0, dq_col0, M, dq, wp, g, t);
    }
  };

  // Dropout's Z for an item as 8 keep bits per k-step: bit 2q + i of byte kk of keep = element i
  // of pf[kk][q] (below). Z in the S^T layout: lane (g, t) holds keys {g, g + 8} x queries
  // {2t, 2t + 1, 2t + 8, 2t + 9} of each 16 x 16 block; the contract's Philox call for this
  // lane's NUMBER holds those of the transposed block (queries as rows), so each of its four
  // words, an 8 x 8 matrix of 16-bit uniforms across the warp, is transposed with movmatrix
  // (step 06's trick), after which word q covers exactly the two elements of pf[kk][q]. All ones
  // without dropout. Computed while an S^T product runs, where registers are to spare.
  [[maybe_unused]] uint32_t keep[(kBr / 16 + 3) / 4];
  [[maybe_unused]] auto make_keep = [&](int h, int i0) {
#pragma unroll
    for (int k = 0; k < (kBr / 16 + 3) / 4; ++k) keep[k] = ~0u;
    if (!p.dropout) return;
#pragma unroll
    for (int kk = 0; kk < kBr / 16; ++kk) {
      const dropout::Philox4 ph =
          dropout::philox(key16 * 32u + uint32_t(lane), uint32_t(i0 / 16 + kk), uint32_t(h),
                          uint32_t(c.b), p.seed_lo, p.seed_hi);
      uint32_t bits = 0;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint32_t z = transpose_b16(ph.w[q]);
        bits |= uint32_t((z & 0xffffu) >= p.drop_threshold) << (2 * q);
        bits |= uint32_t((z >> 16) >= p.drop_threshold) << (2 * q + 1);
      }
      keep[kk / 4] = (keep[kk / 4] & ~(0xffu << (8 * (kk % 4)))) | (bits << (8 * (kk % 4)));
    }
  };

  // P^T = exp2(S^T scale log2e - L) for the item (first row i0) in stage st: s[4cc + 2r + i]
  // is key row r, query 8cc + 2t + i. Hidden pairs get -inf first (only items that straddle the
  // diagonal or the end of the keys pay for the test). L = +inf for a query with no visible key,
  // and for the padding rows past seq_q (whose Q, dO are zero-filled): P = 0 there. Each 16
  // queries (k-step kk: n8 blocks 2kk, 2kk + 1) are rounded to T and packed into the A fragment
  // pf[kk] at once (columns 16kk.. are accumulators 8kk..8kk+7, in A-fragment order already,
  // hopper.cuh), so the fp32 S^T dies early and leaves its registers to dP^T. Register q of
  // pf[kk] holds key row q & 1, queries 8cc + 2t (low half) and + 1 (high half), cc = 2kk +
  // (q >> 1). dS uses this rounded P (as step 06 does): the error is that of rounding dS itself.
  auto exp_p = [&](float(&s)[kBr / 2], uint32_t(&pf)[kBr / 16][4], int i0, int st) {
    const bool need_mask = c.j0 + kBc > N || (p.causal && c.j0 + kBc - 1 > i0 + N - M);
    // Query i0 + 8cc + 2t + i is hidden from key row r iff 8cc + i < lim[r]: keys past N are
    // hidden from every query; causal: key j needs query >= j - (N - M).
    int lim[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = c.j0 + row0 + 8 * r;
      lim[r] = key >= N ? INT_MAX : (p.causal ? key - (N - M) - i0 - 2 * t : INT_MIN);
    }
    const float* lst = s_l + st * kBr;
#pragma unroll
    for (int kk = 0; kk < kBr / 16; ++kk) {
#pragma unroll
      for (int cc = 2 * kk; cc < 2 * kk + 2; ++cc) {
        const float2 l2 = *reinterpret_cast<const float2*>(lst + 8 * cc + 2 * t);
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            float& v = s[4 * cc + 2 * r + i];
            if (need_mask && 8 * cc + i < lim[r]) v = -INFINITY;
            v = fast_exp2(fmaf(v, p.scale_log2, -(i ? l2.y : l2.x)));
          }
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) pf[kk][q] = pack2<T>(s[8 * kk + 2 * q], s[8 * kk + 2 * q + 1]);
    }
  };

  // The schedule, per item x (every wgmma wait is either in the item that issued the product or,
  // for a product carried over the loop edge, a wait_group 0 at the top: ptxas serialises all
  // wgmma (C7514) when it cannot tell which group a wait leaves running, and it moves a wait
  // up through straight-line code, which only the loop edge stops):
  //   top      wait dP^T_x; dS_x; issue dV, dK; dS^T to shared memory; barrier; issue dQ_x;
  //            wait dV, dK -> release the stage
  //   next     issue S^T_{x+1}; [Z of x + 1]; wait dQ_x -> out (under S^T_{x+1});
  //            wait S^T_{x+1}; issue dP^T_{x+1}; P^T_{x+1} (under dP^T_{x+1}) -> loop edge
  // After the last item the next S^T, dP^T and P^T are computed anyway on the stage just used
  // (nobody writes it any more) and dropped, so that issue, commit and wait are the same on
  // every path through the loop (another C7514 condition); it costs one item's first third.
  mbar_wait(g_bars + kBarKV, 0);  // K_j, V_j landed (or the producer said there is no item)
  if (g_has_items) {
    float s[kBr / 2], dp[kBr / 2], dq[32];
    uint32_t pf[kBr / 16][4];
    mbar_wait(g_bars + kFullQ + 0, 0);
    ItemInfo item = g_items[0];  // (after the wait: written before the phase completed)
    issue_abt<T, D, kBr>(s, k_rows, base + C::kQ);
    wgmma_commit();
    if constexpr (kExtras) make_keep(item.h, item.i0);
    wgmma_wait<0>();
    reg_fence(s);
    mbar_wait(g_bars + kFullDO + 0, 0);
    issue_abt<T, D, kBr>(dp, v_rows, base + C::kDO);
    wgmma_commit();
    exp_p(s, pf, item.i0, 0);
    for (int x = 0;; ++x) {
      const int st = x % kStages;
      const int h = item.h, i0 = item.i0, last = item.last;
      const uint32_t q_tile = base + C::kQ + st * C::kQBytes;
      const uint32_t do_tile = base + C::kDO + st * C::kQBytes;

      // dP^T_x done (carried over the loop edge): dS^T = P^T o (dP^T - D), packed into sf like
      // P. Dropout: dP^T o Z / (1 - p) in dS (which takes the undropped P), and P^T o Z in pf
      // for dV (1 / (1 - p) applied to dV once, at the end). Without dropout every bit is
      // kept and drop_rescale is 1: one code path.
      wgmma_wait<0>();
      reg_fence(dp);
      reg_fence(pf);
      const float* dst = s_d + st * kBr;
      uint32_t sf[kBr / 16][4];
#pragma unroll
      for (int kk = 0; kk < kBr / 16; ++kk) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int cc = 2 * kk + (q >> 1), e = 4 * cc + 2 * (q & 1);
          const float2 d2 = *reinterpret_cast<const float2*>(dst + 8 * cc + 2 * t);
          const float2 pe = unpack2<T>(pf[kk][q]);
          float dp0 = dp[e], dp1 = dp[e + 1];
          if constexpr (kExtras) {
            const uint32_t b = keep[kk / 4] >> (8 * (kk % 4) + 2 * q);
            dp0 = (b & 1u) ? dp0 * p.drop_rescale : 0.f;
            dp1 = (b & 2u) ? dp1 * p.drop_rescale : 0.f;
            pf[kk][q] &= ((b & 1u) ? 0x0000ffffu : 0u) | ((b & 2u) ? 0xffff0000u : 0u);  // P o Z
          }
          sf[kk][q] = pack2<T>(pe.x * (dp0 - d2.x), pe.y * (dp1 - d2.y));
        }
      }

      // dV_w += P^T dO_i, dK_w += dS^T Q_i (A from registers).
      reg_fence(dv);
      reg_fence(dk);
      reg_fence(pf);
      reg_fence(sf);
      wgmma_fence();
      issue_rs<T, D, kBr>(dv, pf, do_tile);
      issue_rs<T, D, kBr>(dk, sf, q_tile);
      wgmma_commit();

      // dS^T to shared memory for dQ; both warpgroups' halves must be there before dQ starts.
      unsigned char* ds_buf = c.smem + C::kDS + (x & 1) * C::kDSBytes;
      store_ds_t<kBr>(ds_buf, sf, row0, g, t);
      fence_proxy_async_shared();
      bar_sync(kBarDS, 2 * kWGThreads);
      issue_dq<T>(dq, smem_u32(ds_buf) + ds_half, k_dq);
      wgmma_commit();

      // dV, dK done: Q_i, dO_i (and L_i, D_i, read above) are no longer needed.
      wgmma_wait<1>();
      reg_fence(dv);
      reg_fence(dk);
      reg_fence(pf);
      reg_fence(sf);
      mbar_arrive_if(g_bars + kEmpty + st, lane == 0);

      // The next item's S^T (on this stage again after the last item); this item's dQ out
      // while it runs.
      const int nst = last ? st : st ^ 1;
      const uint32_t npar = ((x + (last ? 0 : 1)) / kStages) & 1;
      if (!last) {
        mbar_wait(g_bars + kFullQ + nst, npar);
        item = g_items[(x + 1) % kItemSlots];
      }
      issue_abt<T, D, kBr>(s, k_rows, base + C::kQ + nst * C::kQBytes);
      wgmma_commit();
      if constexpr (kExtras) {
        if (!last) make_keep(item.h, item.i0);
      }
      wgmma_wait<1>();
      reg_fence(dq);
      dq_out(dq, x, c.b * p.heads + h, i0);

      // The next item's dP^T, and its P^T while dP^T runs.
      mbar_wait(g_bars + kFullDO + nst, npar);
      wgmma_wait<0>();
      reg_fence(s);
      issue_abt<T, D, kBr>(dp, v_rows, base + C::kDO + nst * C::kQBytes);
      wgmma_commit();
      exp_p(s, pf, item.i0, nst);
      if (last) break;
    }
    wgmma_wait<0>();  // the dropped dP^T
    reg_fence(dp);
  }

  // dK_j = scale dK_j; dV_j (x 1 / (1 - p) with dropout), rounded to T and stored from the
  // accumulator layout (4-byte stores, once per CTA). Keys past N are not stored. A CTA with
  // no item stores zeros: keys that no query sees get zero gradients.
  float dv_scale = 1.f;
  if constexpr (kExtras) {
    if (p.dropout) dv_scale = p.drop_rescale;
  }
  T* dkp = static_cast<T*>(p.dk) + size_t(c.bhk) * N * D;
  T* dvp = static_cast<T*>(p.dv) + size_t(c.bhk) * N * D;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = c.j0 + row0 + 8 * r;
    if (key >= N) continue;
#pragma unroll
    for (int cc = 0; cc < D / 8; ++cc) {
      const size_t at = size_t(key) * D + 8 * cc + 2 * t;
      *reinterpret_cast<uint32_t*>(dkp + at) =
          pack2<T>(dk[4 * cc + 2 * r] * p.scale, dk[4 * cc + 2 * r + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(dvp + at) =
          pack2<T>(dv[4 * cc + 2 * r] * dv_scale, dv[4 * cc + 2 * r + 1] * dv_scale);
    }
  }
}

// ---- the main kernel ---------------------------------------------------------------------------
template <class T, int D, bool kDqTma, bool kExtras>
__global__ void __launch_bounds__(kThreads, 1)
    fa3_bwd_kernel(const __grid_constant__ CUtensorMap tm_q,
                   const __grid_constant__ CUtensorMap tm_k,
                   const __grid_constant__ CUtensorMap tm_v,
                   const __grid_constant__ CUtensorMap tm_do,
                   const __grid_constant__ CUtensorMap tm_dq, const KParams p) {
  extern __shared__ unsigned char smem_raw[];
  Ctx c;
  c.j0 = int(blockIdx.x) * kBc, c.hk = int(blockIdx.y), c.b = int(blockIdx.z);
  c.bhk = c.b * p.heads_kv + c.hk;
  c.M = p.seq_q, c.N = p.seq_k;
  // 128-byte swizzled tiles must start on 1024-byte boundaries: round the base up.
  c.smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);

  if (threadIdx.x == 0) {
    mbar_init(g_bars + kBarKV, 1);
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      mbar_init(g_bars + kFullQ + st, 1);  // the producer's arrive.expect_tx, then the bytes
      mbar_init(g_bars + kFullDO + st, 1);
      mbar_init(g_bars + kEmpty + st, 2 * 4);  // one arrive per consumer warp
    }
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      mbar_init(g_bars + kDqFull + w, kWGThreads);  // every thread that staged a part of dQ
      mbar_init(g_bars + kDqEmpty + w, 1);          // the writer
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  // Roles: warpgroup 0 produces (warp 0 loads, warp 1 writes dQ), 1 and 2 consume; each role
  // is one branch with its setmaxnreg first, executed by whole warpgroups.
  const int wg = threadIdx.x / kWGThreads;
  if (wg == 0) {
    setmaxnreg_dec<kProducerRegs>();
    const int warp = threadIdx.x / 32;
    if (warp == 0) {
      if (elect_one()) producer<D, kExtras>(c.smem, &tm_q, &tm_k, &tm_v, &tm_do, p);
    } else if (kDqTma && warp == 1) {
      if (elect_one()) dq_writer<D>(c, &tm_dq, p);
    }
  } else {
    setmaxnreg_inc<kConsumerRegs>();
    consumer<T, D, kDqTma, kExtras>(c, wg - 1, p);
  }
}

// ---- pre-pass and post-pass ----------------------------------------------------------------

constexpr int kPrepassThreads = 256, kPrepassRows = kPrepassThreads / 8;  // 8 lanes per row

// Rows of the padded [B H, m_pad] workspace: D_i = rowsum(dO_i o O_i) (8 lanes per row, 16-byte
// chunks, three xor-shuffles), L_i = LSE_i log2(e) with -inf -> +inf; the padding rows past
// seq_q get D = 0, L = +inf (so P = 0 there). Then a grid-stride zeroing of dQ_acc.
template <class T, int D>
__global__ void __launch_bounds__(kPrepassThreads)
    bwd_prepass_kernel(const T* o, const T* dout, const float* lse, float* lse2, float* dsum,
                       float* dq_acc, int bh_count, int M, int m_pad) {
  const int sub = threadIdx.x & 7;
  const int64_t rows = int64_t(bh_count) * m_pad;
  const int64_t row = int64_t(blockIdx.x) * kPrepassRows + threadIdx.x / 8;
  const int64_t bh = row / m_pad;
  const int i = int(row % m_pad);
  const bool real = row < rows && i < M;
  float acc = 0.f;
  if (real) {
    const size_t src = (size_t(bh) * M + i) * D;
    for (int ch = sub; ch < D / 8; ch += 8) {
      const uint4 a = *reinterpret_cast<const uint4*>(o + src + ch * 8);
      const uint4 b = *reinterpret_cast<const uint4*>(dout + src + ch * 8);
      const uint32_t as[4] = {a.x, a.y, a.z, a.w}, bs[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 x = unpack2<T>(as[e]), y = unpack2<T>(bs[e]);
        acc = fmaf(x.x, y.x, acc);
        acc = fmaf(x.y, y.y, acc);
      }
    }
  }
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  acc += __shfl_xor_sync(0xffffffffu, acc, 2);
  acc += __shfl_xor_sync(0xffffffffu, acc, 4);
  if (sub == 0 && row < rows) {
    dsum[row] = acc;
    const float l = real ? lse[size_t(bh) * M + i] : -INFINITY;
    lse2[row] = l == -INFINITY ? INFINITY : l * kLog2e;
  }
  const int64_t n4 = int64_t(bh_count) * M * D / 4;
  for (int64_t k = int64_t(blockIdx.x) * kPrepassThreads + threadIdx.x; k < n4;
       k += int64_t(gridDim.x) * kPrepassThreads)
    reinterpret_cast<float4*>(dq_acc)[k] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// dQ = s dQ_acc in T (s = scale, or -scale for a caller who negated Q), 4 elements a step.
template <class T>
__global__ void __launch_bounds__(256)
    bwd_postpass_kernel(const float* dq_acc, T* dq, int64_t n4, float s) {
  for (int64_t k = int64_t(blockIdx.x) * 256 + threadIdx.x; k < n4; k += int64_t(gridDim.x) * 256) {
    const float4 a = reinterpret_cast<const float4*>(dq_acc)[k];
    reinterpret_cast<uint2*>(dq)[k] =
        make_uint2(pack2<T>(s * a.x, s * a.y), pack2<T>(s * a.z, s * a.w));
  }
}

// ---- host side ---------------------------------------------------------------------------------

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("step 07 backward: " + what);
}

int rows_padded(int seq_q) {
  return (seq_q + kBwdRowPad - 1) / kBwdRowPad * kBwdRowPad;
}

KParams kernel_params(const BwdParams& f, int br) {
  KParams k{};
  k.lse2 = f.lse2, k.dsum = f.dsum, k.dq_acc = f.dq_acc, k.dk = f.dk, k.dv = f.dv;
  k.heads = f.heads, k.heads_kv = f.heads_kv, k.group = f.heads / f.heads_kv;
  k.seq_q = f.seq_q, k.seq_k = f.seq_k;
  k.m_pad = rows_padded(f.seq_q);
  k.scale = f.scale;
  k.scale_log2 = float(double(f.scale) * 1.4426950408889634);
  k.causal = f.causal ? 1 : 0;
  k.dropout = f.dropout_p > 0.f ? 1 : 0;
  k.drop_threshold = dropout::threshold(f.dropout_p);
  k.drop_rescale = float(1.0 / (1.0 - double(f.dropout_p)));
  k.seed_lo = uint32_t(f.dropout_seed & 0xffffffffu), k.seed_hi = uint32_t(f.dropout_seed >> 32);
  k.q_count = f.q_count, k.q_index = f.q_index;
  if (f.q_count) {
    k.mask_nI = (f.seq_q + f.block_m - 1) / f.block_m;
    k.mask_nJ = (f.seq_k + f.block_n - 1) / f.block_n;
    k.bm_tiles = f.block_m / br;
    k.bn_tiles = f.block_n / kBc;
    k.mask_batch = f.mask_batch, k.mask_heads = f.mask_heads;
  } else {
    k.bm_tiles = k.bn_tiles = k.mask_batch = k.mask_heads = 1;
  }
  return k;
}

template <class T, int D, bool kDqTma, bool kExtras>
void launch_main_as(const BwdPlan& plan, cudaStream_t stream) {
  CUtensorMap maps[5];
  std::memcpy(maps, plan.tensor_maps, sizeof(maps));
  fa3_bwd_kernel<T, D, kDqTma, kExtras><<<plan.grid, plan.block, plan.smem_bytes, stream>>>(
      maps[0], maps[1], maps[2], maps[3], maps[4], kernel_params(plan.params, Cfg<D>::kBr));
}

template <class T, int D>
void launch_prepass_as(const BwdPlan& plan, cudaStream_t stream) {
  const BwdParams& f = plan.params;
  const int bh = f.batch * f.heads, m_pad = rows_padded(f.seq_q);
  const int64_t rows = int64_t(bh) * m_pad;
  bwd_prepass_kernel<T, D>
      <<<unsigned((rows + kPrepassRows - 1) / kPrepassRows), kPrepassThreads, 0, stream>>>(
          static_cast<const T*>(f.o), static_cast<const T*>(f.dout), f.lse, f.lse2, f.dsum,
          f.dq_acc, bh, f.seq_q, m_pad);
}

template <class T, int D>
void launch_postpass_as(const BwdPlan& plan, cudaStream_t stream) {
  const BwdParams& f = plan.params;
  const int64_t n4 = int64_t(f.batch) * f.heads * f.seq_q * D / 4;
  const int64_t blocks = (n4 + 255) / 256;
  bwd_postpass_kernel<T><<<unsigned(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(
      f.dq_acc, static_cast<T*>(f.dq), n4, f.negate_dq ? -f.scale : f.scale);
}

struct Entry {
  const void* fn = nullptr;
  void (*main)(const BwdPlan&, cudaStream_t) = nullptr;
  void (*prepass)(const BwdPlan&, cudaStream_t) = nullptr;
  void (*postpass)(const BwdPlan&, cudaStream_t) = nullptr;
  int smem = 0, br = 0;
};

template <class T, int D, bool kDqTma, bool kExtras>
Entry entry() {
  return {reinterpret_cast<const void*>(&fa3_bwd_kernel<T, D, kDqTma, kExtras>),
          &launch_main_as<T, D, kDqTma, kExtras>,
          &launch_prepass_as<T, D>,
          &launch_postpass_as<T, D>,
          Cfg<D>::kDynamic,
          Cfg<D>::kBr};
}

// Instantiation ids: (fp16 ? 4 : 0) + (d == 128 ? 2 : 0) + (atomic ? 1 : 0), + 8 with dropout
// and block-sparse compiled in.
int instantiation_id(BwdVariant v, bool is_bf16, int dim, bool extras) {
  return (extras ? 8 : 0) + (is_bf16 ? 0 : 4) + (dim == 128 ? 2 : 0) +
         (v == BwdVariant::atomic ? 1 : 0);
}

// The one switch that picks the instantiation.
Entry select(int id) {
  switch (id) {
    case 0:
      return entry<bf16, 64, true, false>();
    case 1:
      return entry<bf16, 64, false, false>();
    case 2:
      return entry<bf16, 128, true, false>();
    case 3:
      return entry<bf16, 128, false, false>();
    case 4:
      return entry<fp16, 64, true, false>();
    case 5:
      return entry<fp16, 64, false, false>();
    case 6:
      return entry<fp16, 128, true, false>();
    case 7:
      return entry<fp16, 128, false, false>();
    case 8:
      return entry<bf16, 64, true, true>();
    case 9:
      return entry<bf16, 64, false, true>();
    case 10:
      return entry<bf16, 128, true, true>();
    case 11:
      return entry<bf16, 128, false, true>();
    case 12:
      return entry<fp16, 64, true, true>();
    case 13:
      return entry<fp16, 64, false, true>();
    case 14:
      return entry<fp16, 128, true, true>();
    case 15:
      return entry<fp16, 128, false, true>();
    default:
      return {};
  }
}

}  // namespace

const char* bwd_variant_name(BwdVariant v) {
  switch (v) {
    case BwdVariant::tma_reduce:
      return "tma-reduce";
    case BwdVariant::atomic:
      return "atomic";
  }
  return "?";
}

bool bwd_supported(bool, int dim, std::string* why) {
  if (dim == 64 || dim == 128) return true;
  if (why) *why = "the backward has head dims 64 and 128 (bf16 and fp16, both dQ variants)";
  return false;
}

BwdWorkspace bwd_workspace(const BwdParams& p) {
  BwdWorkspace w;
  const size_t bh = size_t(p.batch) * size_t(p.heads);
  w.rows_padded = rows_padded(p.seq_q);
  w.dq_acc_bytes = bh * size_t(p.seq_q) * size_t(p.dim) * sizeof(float);
  w.lse2_bytes = w.dsum_bytes = bh * size_t(w.rows_padded) * sizeof(float);
  return w;
}

BwdPlan make_bwd_plan(const BwdParams& f, BwdVariant v) {
  std::string why;
  require(bwd_supported(f.bf16, f.dim, &why), why);
  require(f.batch >= 1 && f.heads >= 1 && f.heads_kv >= 1 && f.seq_q >= 1 && f.seq_k >= 1,
          "batch, heads, heads_kv, seq_q, seq_k must be >= 1");
  require(f.heads % f.heads_kv == 0, "heads must be a multiple of heads_kv");
  require(f.batch <= 65535 && f.heads_kv <= 65535, "batch and heads_kv are grid dimensions");
  require(f.seq_q <= (1 << 30) && f.seq_k <= (1 << 30), "seq_q, seq_k <= 2^30");
  require(std::isfinite(f.scale) && f.scale > 0.f,
          "scale must be finite and > 0 (negate Q for a negative scale, and set negate_dq)");
  require(f.q && f.k && f.v && f.o && f.dout && f.lse && f.dq && f.dk && f.dv && f.dq_acc &&
              f.lse2 && f.dsum,
          "null pointer");
  for (const void* ptr :
       {f.q, f.k, f.v, f.o, f.dout, static_cast<const void*>(f.dq), static_cast<const void*>(f.dk),
        static_cast<const void*>(f.dv), static_cast<const void*>(f.dq_acc),
        static_cast<const void*>(f.lse2), static_cast<const void*>(f.dsum)})
    require(reinterpret_cast<uintptr_t>(ptr) % 16 == 0,
            "Q, K, V, O, dO, dQ, dK, dV and the workspace must be 16-byte aligned");
  require(f.dropout_p >= 0.f && f.dropout_p < 1.f, "dropout_p must be in [0, 1)");
  const bool sparse = f.q_count != nullptr;
  const bool extras = sparse || f.dropout_p > 0.f;
  if (sparse) {
    require(f.q_index != nullptr, "q_count without q_index");
    require(f.block_m > 0 && f.block_m % 128 == 0 && f.block_n > 0 && f.block_n % 128 == 0,
            "mask blocks must be multiples of 128 x 128");
    require(f.mask_batch == 1 || f.mask_batch == f.batch, "mask_batch must be 1 or batch");
    require(f.mask_heads == 1 || f.mask_heads == f.heads, "mask_heads must be 1 or heads");
  }

  int dev = 0;
  cuda_ok(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  if (prop.major != 9 || prop.minor != 0)
    throw std::runtime_error("step 07 backward: needs an sm_90 GPU (H100/H200); this is sm_" +
                             std::to_string(prop.major) + std::to_string(prop.minor));

  BwdPlan plan{};
  plan.params = f;
  plan.variant = v;
  plan.instantiation = instantiation_id(v, f.bf16, f.dim, extras);
  const Entry e = select(plan.instantiation);
  require(e.fn != nullptr, "no instantiation");
  plan.kernel = e.fn;
  plan.grid = dim3(unsigned((f.seq_k + kBc - 1) / kBc), unsigned(f.heads_kv), unsigned(f.batch));
  plan.block = dim3(unsigned(kThreads));
  plan.smem_bytes = e.smem;
  plan.br = e.br, plan.bc = kBc, plan.stages = kStages;
  const CUtensorMapDataType t16 =
      f.bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const int bh = f.batch * f.heads, bhk = f.batch * f.heads_kv;
  encode_3d(plan.tensor_maps[0], f.q, t16, 2, f.dim, f.seq_q, bh, 64, e.br);
  encode_3d(plan.tensor_maps[1], f.k, t16, 2, f.dim, f.seq_k, bhk, 64, kBc);
  encode_3d(plan.tensor_maps[2], f.v, t16, 2, f.dim, f.seq_k, bhk, 64, kBc);
  encode_3d(plan.tensor_maps[3], f.dout, t16, 2, f.dim, f.seq_q, bh, 64, e.br);
  encode_3d(plan.tensor_maps[4], f.dq_acc, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, f.dim, f.seq_q, bh,
            32, 64);
  cuda_ok(cudaFuncSetAttribute(e.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, e.smem),
          "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  cudaFuncAttributes attr{};
  cuda_ok(cudaFuncGetAttributes(&attr, e.fn), "cudaFuncGetAttributes");
  plan.regs = attr.numRegs;
  return plan;
}

void launch_bwd(const BwdPlan& plan, cudaStream_t stream) {
  const Entry e = select(plan.instantiation);
  if (!e.main) throw std::invalid_argument("step 07 backward: launch of an empty plan");
  e.prepass(plan, stream);
  cuda_ok(cudaGetLastError(), "pre-pass launch");
  e.main(plan, stream);
  cuda_ok(cudaGetLastError(), "main kernel launch");
  e.postpass(plan, stream);
  cuda_ok(cudaGetLastError(), "post-pass launch");
}

void launch_bwd_main(const BwdPlan& plan, cudaStream_t stream) {
  const Entry e = select(plan.instantiation);
  if (!e.main) throw std::invalid_argument("step 07 backward: launch of an empty plan");
  e.main(plan, stream);
  cuda_ok(cudaGetLastError(), "main kernel launch");
}

std::string describe(const BwdPlan& plan) {
  std::ostringstream s;
  s << "bwd " << bwd_variant_name(plan.variant) << " " << (plan.params.bf16 ? "bf16" : "fp16")
    << " d=" << plan.params.dim << " Bc=" << plan.bc << " Br=" << plan.br
    << " threads=" << plan.block.x << " (producer + 2 consumer warpgroups) smem=" << plan.smem_bytes
    << " regs=" << plan.regs << " setmaxnreg=" << kProducerRegs << "/" << kConsumerRegs
    << " stages=" << plan.stages;
  if (plan.instantiation >= 8) s << " extras=dropout+block-sparse";
  return s.str();
}

}  // namespace ladder::fa3
