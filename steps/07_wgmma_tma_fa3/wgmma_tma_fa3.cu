// Step 07 — FlashAttention on Hopper: TMA, wgmma, warp specialisation (CUDA sm_90a, bf16/fp16).
// Adds: TMA tile loads completing on mbarriers; wgmma with B from swizzled shared memory and P
// from registers; a producer warpgroup and setmaxnreg; ping-pong scheduling of two consumer
// warpgroups; softmax overlapped with the next tile's GEMMs inside a warpgroup; dropout and
// block-sparse masks in the full kernel.
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
//   pingpong          + named barriers order the two consumers' GEMMs, so that one
//                     warpgroup's softmax runs while the other's GEMMs use the tensor cores.
//   intra-overlap     + inside a warpgroup, S_{j} = Q K_{j}^T and O += P_{j-1} V_{j-1} are
//                     issued together and the softmax of tile j runs while P_{j-1} V_{j-1} is
//                     still on the tensor cores; the O rescale moves under the next S GEMM.
//                     The full kernel; dropout and block-sparsity are built on it.
//
// One CTA per (query tile of Br = 128 rows, head, batch); consumer warpgroup c owns rows
// 64c .. 64c+63 and keeps their S, m, l and O in registers. Per K/V tile j (Bc = 128 keys):
//   S = Q K_j^T                      wgmma SS: A = Q (smem), B = K_j (smem, K-major)
//   mask (tiles past the causal diagonal's start or the end of the keys only)
//   m_new = max(m, rowmax S); P = exp2(S tau log2e - m_new tau log2e); l = alpha l + rowsum P
//   O = alpha O + P V_j              wgmma RS: A = P (registers), B = V_j (smem, N-major)
// and at the end O /= l, LSE = tau m + ln l, O through shared memory to 16-byte stores.
//
// Shared memory (d = 128): Q 32 KiB + 2 stages x (K 32 + V 32) KiB = 160 KiB. Each tile is
// stored as d / 64 "column halves" of [rows][64] elements, rows of 128 bytes in the TMA's
// 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r mod 8)), every half on a 1024-byte
// boundary: the layout the wgmma descriptors with swizzle mode 128B read (hopper.cuh).
#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes through the runtime
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>

#include "dropout.hpp"
#include "hopper.cuh"
#include "wgmma_tma_fa3.hpp"

namespace ladder::fa3 {
namespace {

using namespace ladder::hopper;
using bf16 = __nv_bfloat16;
using fp16 = __half;

// ---- tiles ------------------------------------------------------------------------------
// Br = 128: two consumer warpgroups x 64 rows (wgmma's M is 64 per warpgroup). Bc = 128: S is
// 64 fp32 registers per thread, O 64 (d = 128), P 32 as bf16 pairs: with the next tile's S in
// flight (intra-overlap) that is about 200 of the 240 registers a consumer gets. Two stages:
// 160 KiB at d = 128 (three would be 224 KiB, at the 227 KiB limit with no room to grow).
constexpr int kBr = 128, kBc = 128, kStages = 2, kConsumerWGs = 2;
constexpr int kWGThreads = 128;
constexpr int kRowBytes = 128;  // one swizzled row: 64 16-bit elements
constexpr float kNegInf = -INFINITY;

// Register split of the warp-specialised kernels: 128 x 24 + 256 x 240 = 64512 <= 65536.
// At launch __launch_bounds__(384, 1) gives every thread 168 (65536 / 384, rounded down to 8).
constexpr int kProducerRegs = 24, kConsumerRegs = 240;

template <int D>
struct Smem {
  static constexpr int kHalves = D / 64;
  static constexpr int kQBytes = kBr * D * 2;
  static constexpr int kKVBytes = kBc * D * 2;  // one K or one V tile
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBytes;
  static constexpr int kV = kK + kStages * kKVBytes;
  static constexpr int kBytes = kV + kStages * kKVBytes;
  static constexpr int kDynamic = kBytes + 1024;  // slack to round the base up to 1024
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "1024-byte aligned halves");
  static_assert(kDynamic <= 227 * 1024, "more shared memory than an H100 block can have");
};

// One bit per idea; a variant is a prefix of them.
enum Flag : int { kWarpSpec = 1, kPingPong = 2, kIntraOverlap = 4 };
constexpr int flags_of(Variant v) {
  return v == Variant::tma_wgmma          ? 0
         : v == Variant::warp_specialized ? kWarpSpec
         : v == Variant::pingpong         ? kWarpSpec | kPingPong
                                          : kWarpSpec | kPingPong | kIntraOverlap;
}
constexpr int threads_of(int flags) {
  return (kConsumerWGs + ((flags & kWarpSpec) ? 1 : 0)) * kWGThreads;
}

// Named barrier ids (0 is __syncthreads): the ping-pong hand-off of warpgroup c waits on
// 1 + c; the epilogue of warpgroup c syncs its 128 threads on 3 + c.
constexpr int kBarSched = 1, kBarEpilogue = 3;

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

// ---- the K/V tiles one CTA visits ------------------------------------------------------
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

struct Cta {
  int i0, h, b, bh, bhk;  // first query row; head; batch; Q/O plane b*H+h; K/V plane
  int M, N;
  int n_unmasked;  // tiles below this index are visible to every row: no mask
  TileWalk walk;
  unsigned char* smem;  // 1024-aligned base
  uint64_t *bar_q, *full_k, *full_v, *empty_k, *empty_v;
};

template <bool kExtras>
__device__ __forceinline__ Cta make_cta(const KParams& p, unsigned char* smem, uint64_t* bars) {
  Cta c;
  // Causal tiles near the end of the sequence see the most keys: launch them first, so the
  // last wave is made of short ones.
  c.i0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * kBr;
  c.h = blockIdx.y, c.b = blockIdx.z;
  c.bh = c.b * p.heads + c.h;
  c.bhk = c.b * (p.heads / p.group) + c.h / p.group;
  c.M = p.seq_q, c.N = p.seq_k;
  // Keys this tile sees: all N, or (bottom-right causal: key j visible to query i iff
  // j <= i + N - M) up to the last row's last visible key; tiles past it are never loaded.
  const int last_row = min(c.i0 + kBr, c.M) - 1;
  const int n_end = p.causal ? max(0, min(c.N, last_row + 1 + c.N - c.M)) : c.N;
  const int tiles_end = (n_end + kBc - 1) / kBc;
  c.n_unmasked = (p.causal ? max(0, min(c.N, c.i0 + 1 + c.N - c.M)) : c.N) / kBc;
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
  c.smem = smem;
  c.bar_q = bars;
  c.full_k = bars + 1, c.full_v = c.full_k + kStages;
  c.empty_k = c.full_v + kStages, c.empty_v = c.empty_k + kStages;
  return c;
}

// ---- TMA issue (one thread) -------------------------------------------------------------
template <int D>
__device__ __forceinline__ void load_q(const Cta& c, const CUtensorMap* tm) {
  using S = Smem<D>;
  mbar_arrive_expect_tx(c.bar_q, S::kQBytes);
#pragma unroll
  for (int hf = 0; hf < S::kHalves; ++hf)
    tma_load_3d(c.smem + S::kQ + hf * kBr * kRowBytes, tm, c.bar_q, hf * 64, c.i0, c.bh);
}
// K or V tile `tile` into stage `st` of the ring at byte offset `base`.
template <int D>
__device__ __forceinline__ void load_kv(const Cta& c, const CUtensorMap* tm, int base,
                                        uint64_t* full, int st, int tile) {
  using S = Smem<D>;
  mbar_arrive_expect_tx(full, S::kKVBytes);
#pragma unroll
  for (int hf = 0; hf < S::kHalves; ++hf)
    tma_load_3d(c.smem + base + st * S::kKVBytes + hf * kBc * kRowBytes, tm, full, hf * 64,
                tile * kBc, c.bhk);
}

// The producer of the warp-specialised kernels: one elected thread walks the tiles, waits
// for a free slot (empty barrier), announces the bytes and starts the copies. The first pass
// over the ring waits on parity 1 of fresh barriers, which passes at once.
template <int D, bool kTrace>
__device__ __forceinline__ void producer(const Cta& c, const CUtensorMap* tm_q,
                                         const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                         Trace<kTrace>& tr) {
  using S = Smem<D>;
  if (c.walk.n_iter == 0) return;
  tr.writer = true;  // elect.sync need not pick lane 0
  tma_prefetch_descriptor(tm_q);
  tma_prefetch_descriptor(tm_k);
  tma_prefetch_descriptor(tm_v);
  load_q<D>(c, tm_q);
  for (int it = 0; it < c.walk.n_iter; ++it) {
    const int st = it % kStages, use = it / kStages, tile = c.walk.tile(it);
    mbar_wait(&c.empty_k[st], (use & 1) ^ 1);
    load_kv<D>(c, tm_k, S::kK, &c.full_k[st], st, tile);
    const unsigned long long tk = tr.now();
    mbar_wait(&c.empty_v[st], (use & 1) ^ 1);
    load_kv<D>(c, tm_v, S::kV, &c.full_v[st], st, tile);
    const unsigned long long tv = tr.now();
    tr.add(kTraceTmaIssueK, tile, tk, tk);
    tr.add(kTraceTmaIssueV, tile, tv, tv);
  }
}

// ---- the consumer's pieces --------------------------------------------------------------

// S = Q_c K^T for this warpgroup's 64 rows: d/16 wgmma k-steps. Step kk reads columns
// 16kk..16kk+15: column half kk / 4, 32 bytes further per step inside the 128-byte row.
template <class T, int D>
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
// dropout; returns alpha = exp(tau (m_old - m_new)) per row in `alpha`.
template <bool kExtras>
__device__ __forceinline__ void softmax_tile(float (&s)[kBc / 2], float (&m)[2], float (&l)[2],
                                             float (&alpha)[2], const RowInfo& ri, int tile,
                                             bool need_mask, const KParams& p, const Cta& c) {
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
    // A row that has seen only masked keys keeps m = -inf; subtract 0 then, so that
    // exp2(-inf - 0) = 0 instead of exp2(-inf + inf) = NaN.
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
  }
  if constexpr (kExtras) {
    if (p.dropout) {
      // l summed the undropped P (the LSE is that of P); Z only zeroes P on its way into PV.
      // One Philox call per 16 x 16 block gives this lane its 8 elements (docs/CONTRACT.md):
      // words 0, 1 = row g, even / odd n8 block; 2, 3 = row g + 8; low half = even column.
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) {
        const uint32_t J = uint32_t(key0 / 16 + kk);
        const dropout::Philox4 w =
            dropout::philox(J * 32u + uint32_t(ri.lane), uint32_t(ri.row16), uint32_t(c.h),
                            uint32_t(c.b), p.seed_lo, p.seed_hi);
        const uint32_t(&words)[4] = w.w;
#pragma unroll
        for (int e = 0; e < 8; ++e) {  // s[8kk + e]: n8 block 2kk + e/4, row half (e/2)&1
          const uint32_t word = words[(e >> 2) + 2 * ((e >> 1) & 1)];
          const uint32_t u = (word >> (16 * (e & 1))) & 0xffffu;
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
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk)
#pragma unroll
    for (int q = 0; q < 4; ++q) pf[kk][q] = pack2<T>(s[8 * kk + 2 * q], s[8 * kk + 2 * q + 1]);
}

// ---- the consumer warpgroup -------------------------------------------------------------
template <class T, int D, int kFlags, bool kExtras, bool kTrace>
__device__ __forceinline__ void consumer(const Cta& c, int wg, const KParams& p,
                                         const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                         Trace<kTrace>& tr) {
  using S = Smem<D>;
  constexpr bool kWS = kFlags & kWarpSpec, kPP = kFlags & kPingPong,
                 kOverlap = kFlags & kIntraOverlap;
  const int tid = threadIdx.x % kWGThreads, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int n = c.walk.n_iter;

  RowInfo ri;
  ri.t = t, ri.lane = lane;
  ri.row16 = (c.i0 + wg * 64 + warp * 16) / 16;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = c.i0 + wg * 64 + warp * 16 + g + 8 * r;
    ri.limit[r] = p.causal ? min(c.N, row + 1 + c.N - c.M) : c.N;
  }

  const uint32_t base = smem_u32(c.smem);
  const uint32_t q_addr = base + S::kQ + wg * 64 * kRowBytes;  // this warpgroup's 64 rows
  auto k_addr = [&](int st) { return base + S::kK + st * S::kKVBytes; };
  auto v_addr = [&](int st) { return base + S::kV + st * S::kKVBytes; };

  float o[D / 2], s[kBc / 2], m[2], l[2], alpha[2];
  uint32_t pf[kBc / 16][4];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
#pragma unroll
  for (int r = 0; r < 2; ++r) m[r] = kNegInf, l[r] = 0.f, alpha[r] = 1.f;

  // The mbarrier handshakes. Waits: all 128 threads spin on the phase. Releases (warp-
  // specialised kernels): one arrive per warp once its wgmma wait has returned, 8 per phase.
  auto wait_k = [&](int it) {
    const unsigned long long t0 = tr.now();
    mbar_wait(&c.full_k[it % kStages], (it / kStages) & 1);
    tr.add(kTraceWaitK, c.walk.tile(it), t0, tr.now());
  };
  auto wait_v = [&](int it) {
    const unsigned long long t0 = tr.now();
    mbar_wait(&c.full_v[it % kStages], (it / kStages) & 1);
    tr.add(kTraceWaitV, c.walk.tile(it), t0, tr.now());
  };
  auto release_k = [&](int it) {
    if constexpr (kWS) mbar_arrive_if(&c.empty_k[it % kStages], lane == 0);
  };
  auto release_v = [&](int it) {
    if constexpr (kWS) mbar_arrive_if(&c.empty_v[it % kStages], lane == 0);
  };
  // Ping-pong: before its GEMMs a warpgroup waits for its turn (bar.sync on its own id, 256
  // threads: itself + the other's arrive); after issuing them it hands the turn over.
  auto sched_wait = [&]() {
    if constexpr (kPP) bar_sync(kBarSched + wg, 2 * kWGThreads);
  };
  auto sched_pass = [&]() {
    if constexpr (kPP) bar_arrive(kBarSched + (1 - wg), 2 * kWGThreads);
  };
  auto softmax = [&](int it) {
    const int tile = c.walk.tile(it);
    const unsigned long long t0 = tr.now();
    softmax_tile<kExtras>(s, m, l, alpha, ri, tile, tile >= c.n_unmasked, p, c);
    tr.add(kTraceSoftmax, tile, t0, tr.now());
  };

  if (n > 0) {
    mbar_wait(c.bar_q, 0);
    if constexpr (!kPP) {
      // tma-wgmma and warp-specialized: one tile at a time, each GEMM waited for at once.
      for (int it = 0; it < n; ++it) {
        const int st = it % kStages, tile = c.walk.tile(it);
        wait_k(it);
        unsigned long long t0 = tr.now();
        issue_s<T, D>(s, q_addr, k_addr(st));
        wgmma_wait<0>();
        reg_fence(s);
        tr.add(kTraceGemmS, tile, t0, tr.now());
        release_k(it);
        softmax(it);
        rescale_o<D>(o, alpha);
        convert_p<T>(pf, s);
        wait_v(it);
        t0 = tr.now();
        issue_pv<T, D>(o, pf, v_addr(st));
        wgmma_wait<0>();
        reg_fence(o);
        tr.add(kTraceGemmPV, tile, t0, tr.now());
        release_v(it);
        if constexpr (!kWS) {
          // No producer: everyone is done with stage st, so thread 0 refills it with tile
          // it + 2 (tile it + 1 is already in flight in the other stage).
          __syncthreads();
          if (threadIdx.x == 0 && it + kStages < n) {
            const int nt = c.walk.tile(it + kStages);
            load_kv<D>(c, tm_k, S::kK, &c.full_k[st], st, nt);
            load_kv<D>(c, tm_v, S::kV, &c.full_v[st], st, nt);
            const unsigned long long ti = tr.now();
            tr.add(kTraceTmaIssueK, nt, ti, ti);
          }
        }
      }
    } else {
      // Ping-pong (and intra-overlap): the GEMMs of a step travel together, S_j = Q K_j^T with
      // O += P_{j-1} V_{j-1}, between sched_wait and sched_pass. Warpgroup 1 gives warpgroup 0
      // the first turn, and skips its very last hand-over, so both barriers end balanced.
      if (wg == 1) bar_arrive(kBarSched + 0, 2 * kWGThreads);
      // Tile 0: S only.
      wait_k(0);
      sched_wait();
      unsigned long long t0 = tr.now(), t1 = 0;
      issue_s<T, D>(s, q_addr, k_addr(0));
      sched_pass();
      wgmma_wait<0>();
      reg_fence(s);
      tr.add(kTraceGemmS, c.walk.tile(0), t0, tr.now());
      release_k(0);
      softmax(0);
      if constexpr (!kOverlap) {
        // pingpong: each step waits for both of its GEMMs, then runs the softmax; the overlap
        // is between the warpgroups only.
        rescale_o<D>(o, alpha);
        convert_p<T>(pf, s);
        for (int it = 1; it < n; ++it) {
          wait_k(it);
          sched_wait();
          t0 = tr.now();
          issue_s<T, D>(s, q_addr, k_addr(it % kStages));
          wait_v(it - 1);
          t1 = tr.now();
          issue_pv<T, D>(o, pf, v_addr((it - 1) % kStages));
          sched_pass();
          wgmma_wait<0>();
          reg_fence(s);
          reg_fence(o);
          tr.add(kTraceGemmS, c.walk.tile(it), t0, tr.now());
          tr.add(kTraceGemmPV, c.walk.tile(it - 1), t1, tr.now());
          release_k(it);
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
          wait_k(it);
          sched_wait();
          t0 = tr.now();
          issue_s<T, D>(s, q_addr, k_addr(it % kStages));
          rescale_o<D>(o, alpha);
          wait_v(it - 1);
          t1 = tr.now();
          issue_pv<T, D>(o, pf, v_addr((it - 1) % kStages));
          sched_pass();
          wgmma_wait<1>();  // S_it done; PV_{it-1} may still run
          reg_fence(s);
          tr.add(kTraceGemmS, c.walk.tile(it), t0, tr.now());
          release_k(it);
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
      issue_pv<T, D>(o, pf, v_addr((n - 1) % kStages));
      if (wg == 0) sched_pass();
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
    if (t == 0 && row < c.M)
      p.lse[size_t(c.bh) * c.M + row] = lr > 0.f ? m[r] * p.scale + logf(lr) : kNegInf;
  }
  // This warpgroup's 64 rows of the Q tile are free (its last S GEMM has been waited for, and
  // no other warpgroup reads them): stage O there in the same swizzled layout, so that the
  // 4-byte fragment writes and the 16-byte row reads both avoid bank conflicts.
  T* sq = reinterpret_cast<T*>(c.smem + S::kQ);
  auto at = [&](int row, int col) {  // element offset of (tile row, column)
    return (col / 64) * (kBr * 64) + row * 64 + ((((col % 64) / 8) ^ (row % 8)) * 8) + col % 8;
  };
#pragma unroll
  for (int cb = 0; cb < D / 8; ++cb)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = wg * 64 + warp * 16 + g + 8 * r, col = cb * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(sq + at(row, col)) =
          pack2<T>(o[4 * cb + 2 * r] * inv_l[r], o[4 * cb + 2 * r + 1] * inv_l[r]);
    }
  bar_sync(kBarEpilogue + wg, kWGThreads);
  T* out = static_cast<T*>(p.o) + size_t(c.bh) * c.M * D;
  constexpr int kRowChunks = D / 8;
#pragma unroll
  for (int k = 0; k < 64 * kRowChunks / kWGThreads; ++k) {
    const int idx = k * kWGThreads + tid, row = wg * 64 + idx / kRowChunks;
    const int col = (idx % kRowChunks) * 8;
    if (c.i0 + row < c.M)
      *reinterpret_cast<uint4*>(out + size_t(c.i0 + row) * D + col) =
          *reinterpret_cast<const uint4*>(sq + at(row, col));
  }
}

// ---- the kernel -------------------------------------------------------------------------
template <class T, int D, int kFlags, bool kExtras, bool kTrace>
__global__ void __launch_bounds__(threads_of(kFlags), 1)
    fa3_fwd_kernel(const __grid_constant__ CUtensorMap tm_q,
                   const __grid_constant__ CUtensorMap tm_k,
                   const __grid_constant__ CUtensorMap tm_v, const KParams p) {
  using S = Smem<D>;
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint64_t bars[1 + 4 * kStages];
  // 128-byte swizzled tiles must start on 1024-byte boundaries: round the base up.
  unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const Cta c = make_cta<kExtras>(p, smem, bars);

  if (threadIdx.x == 0) {
    mbar_init(c.bar_q, 1);
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      mbar_init(&c.full_k[st], 1);  // the issuing thread's arrive.expect_tx; then the bytes
      mbar_init(&c.full_v[st], 1);
      mbar_init(&c.empty_k[st], kConsumerWGs * 4);  // one arrive per consumer warp
      mbar_init(&c.empty_v[st], kConsumerWGs * 4);
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  Trace<kTrace> tr;
  tr.init(p.trace, threadIdx.x / 32);

  if constexpr (kFlags & kWarpSpec) {
    // Roles: warpgroup 0 produces, warpgroups 1 and 2 consume. Each role is one branch, with
    // its setmaxnreg first, executed by whole warpgroups.
    const int wg = threadIdx.x / kWGThreads;
    if (wg == 0) {
      setmaxnreg_dec<kProducerRegs>();
      if (threadIdx.x / 32 == 0 && elect_one()) producer<D, kTrace>(c, &tm_q, &tm_k, &tm_v, tr);
    } else {
      setmaxnreg_inc<kConsumerRegs>();
      consumer<T, D, kFlags, kExtras, kTrace>(c, wg - 1, p, &tm_k, &tm_v, tr);
    }
  } else {
    // No roles: thread 0 starts Q and the first two K/V tiles, then computes like the others.
    if (threadIdx.x == 0 && c.walk.n_iter > 0) {
      load_q<D>(c, &tm_q);
      for (int it = 0; it < kStages && it < c.walk.n_iter; ++it) {
        load_kv<D>(c, &tm_k, S::kK, &c.full_k[it], it, c.walk.tile(it));
        load_kv<D>(c, &tm_v, S::kV, &c.full_v[it], it, c.walk.tile(it));
        const unsigned long long ti = tr.now();
        tr.add(kTraceTmaIssueK, c.walk.tile(it), ti, ti);
      }
    }
    __syncwarp();
    consumer<T, D, kFlags, kExtras, kTrace>(c, threadIdx.x / kWGThreads, p, &tm_k, &tm_v, tr);
  }
}

// ---- host side ---------------------------------------------------------------------------

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("step 07: ") + what + ": " + cudaGetErrorString(e));
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's cuTensorMapEncodeTiled, found through the runtime (no -lcuda at link time).
EncodeTiled encoder() {
  static EncodeTiled fn = nullptr;
  if (!fn) {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    cuda_ok(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                             &q),
            "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
    if (q != cudaDriverEntryPointSuccess || !f)
      throw std::runtime_error("step 07: the driver has no cuTensorMapEncodeTiled");
    fn = reinterpret_cast<EncodeTiled>(f);
  }
  return fn;
}

// A [planes, rows, dim] tensor of 16-bit elements as a 3-D map {dim, rows, planes} (innermost
// first), boxes of 64 columns x box_rows rows x 1 plane, 128-byte swizzle, zero fill out of
// bounds. A box never reaches into the next plane (head): rows past `rows` read as zeros.
void encode(void* map, const void* base, bool is_bf16, int dim, int rows, int planes,
            int box_rows) {
  const cuuint64_t gdim[3] = {cuuint64_t(dim), cuuint64_t(rows), cuuint64_t(planes)};
  const cuuint64_t gstride[2] = {cuuint64_t(dim) * 2, cuuint64_t(rows) * dim * 2};  // bytes
  const cuuint32_t box[3] = {64, cuuint32_t(box_rows), 1};
  const cuuint32_t estride[3] = {1, 1, 1};
  const CUresult r =
      encoder()(static_cast<CUtensorMap*>(map),
                is_bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
                const_cast<void*>(base), gdim, gstride, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("step 07: cuTensorMapEncodeTiled failed with CUresult " +
                             std::to_string(int(r)));
}

KParams kernel_params(const FwdParams& f) {
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
  k.block_m = f.block_m > 0 ? f.block_m : kBr;
  k.bn_tiles = f.block_n > 0 ? f.block_n / kBc : 1;
  k.mask_nI = (f.seq_q + k.block_m - 1) / k.block_m;
  k.mask_nJ = f.block_n > 0 ? (f.seq_k + f.block_n - 1) / f.block_n : 1;
  k.mask_batch = f.mask_batch, k.mask_heads = f.mask_heads;
  k.trace = f.trace;
  return k;
}

template <class T, int D, int kFlags, bool kExtras, bool kTrace>
void launch_one(const FwdPlan& plan, cudaStream_t stream) {
  CUtensorMap maps[3];
  std::memcpy(maps, plan.tensor_maps, sizeof(maps));
  fa3_fwd_kernel<T, D, kFlags, kExtras, kTrace><<<plan.grid, plan.block, plan.smem_bytes, stream>>>(
      maps[0], maps[1], maps[2], kernel_params(plan.params));
}

struct Entry {
  const void* fn = nullptr;
  void (*launch)(const FwdPlan&, cudaStream_t) = nullptr;
  int threads = 0, smem = 0;
};

template <class T, int D, int kFlags, bool kExtras, bool kTrace>
Entry entry() {
  return {reinterpret_cast<const void*>(&fa3_fwd_kernel<T, D, kFlags, kExtras, kTrace>),
          &launch_one<T, D, kFlags, kExtras, kTrace>, threads_of(kFlags), Smem<D>::kDynamic};
}

constexpr int kBase = 0, kWS = kWarpSpec, kPP = kWarpSpec | kPingPong,
              kFull = kWarpSpec | kPingPong | kIntraOverlap;

// Instantiation ids: 0..15 = variant * 4 + (fp16 ? 2 : 0) + (d == 128); 16..19 = the full
// kernel with dropout / block-sparse compiled in, (fp16 ? 2 : 0) + (d == 128); 20, 21 = the
// trace builds of tma-wgmma and intra-overlap (bf16, d = 128).
int instantiation_id(Variant v, bool is_bf16, int dim, bool extras, bool trace) {
  const int dt = (is_bf16 ? 0 : 2) + (dim == 128 ? 1 : 0);
  if (trace) return v == Variant::tma_wgmma ? 20 : 21;
  if (extras) return 16 + dt;
  return int(v) * 4 + dt;
}

// The one switch that picks the instantiation.
Entry select(int id) {
  switch (id) {
    case 0:
      return entry<bf16, 64, kBase, false, false>();
    case 1:
      return entry<bf16, 128, kBase, false, false>();
    case 2:
      return entry<fp16, 64, kBase, false, false>();
    case 3:
      return entry<fp16, 128, kBase, false, false>();
    case 4:
      return entry<bf16, 64, kWS, false, false>();
    case 5:
      return entry<bf16, 128, kWS, false, false>();
    case 6:
      return entry<fp16, 64, kWS, false, false>();
    case 7:
      return entry<fp16, 128, kWS, false, false>();
    case 8:
      return entry<bf16, 64, kPP, false, false>();
    case 9:
      return entry<bf16, 128, kPP, false, false>();
    case 10:
      return entry<fp16, 64, kPP, false, false>();
    case 11:
      return entry<fp16, 128, kPP, false, false>();
    case 12:
      return entry<bf16, 64, kFull, false, false>();
    case 13:
      return entry<bf16, 128, kFull, false, false>();
    case 14:
      return entry<fp16, 64, kFull, false, false>();
    case 15:
      return entry<fp16, 128, kFull, false, false>();
    case 16:
      return entry<bf16, 64, kFull, true, false>();
    case 17:
      return entry<bf16, 128, kFull, true, false>();
    case 18:
      return entry<fp16, 64, kFull, true, false>();
    case 19:
      return entry<fp16, 128, kFull, true, false>();
    case 20:
      return entry<bf16, 128, kBase, false, true>();
    case 21:
      return entry<bf16, 128, kFull, false, true>();
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
  require(!extras || v == Variant::intra_overlap,
          "dropout and block-sparse are built into the intra-overlap variant only");
  if (sparse) {
    require(f.kv_index != nullptr, "kv_count without kv_index");
    require(f.block_m > 0 && f.block_m % kBr == 0 && f.block_n > 0 && f.block_n % kBc == 0,
            "mask blocks must be multiples of 128 x 128");
    require(f.mask_batch == 1 || f.mask_batch == f.batch, "mask_batch must be 1 or batch");
    require(f.mask_heads == 1 || f.mask_heads == f.heads, "mask_heads must be 1 or heads");
  }
  const bool trace = f.trace != nullptr;
  require(!trace || ((v == Variant::tma_wgmma || v == Variant::intra_overlap) && f.bf16 &&
                     f.dim == 128 && !extras),
          "the trace build exists for tma-wgmma and intra-overlap, bf16, d = 128, no extras");

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
  plan.instantiation = instantiation_id(v, f.bf16, f.dim, extras, trace);
  const Entry e = select(plan.instantiation);
  require(e.fn != nullptr, "no instantiation");
  plan.kernel = e.fn;
  plan.grid = dim3(unsigned((f.seq_q + kBr - 1) / kBr), unsigned(f.heads), unsigned(f.batch));
  plan.block = dim3(unsigned(e.threads));
  plan.smem_bytes = e.smem;
  plan.br = kBr, plan.bc = kBc, plan.stages = kStages;
  encode(plan.tensor_maps[0], f.q, f.bf16, f.dim, f.seq_q, f.batch * f.heads, kBr);
  encode(plan.tensor_maps[1], f.k, f.bf16, f.dim, f.seq_k, f.batch * f.heads_kv, kBc);
  encode(plan.tensor_maps[2], f.v, f.bf16, f.dim, f.seq_k, f.batch * f.heads_kv, kBc);
  cuda_ok(cudaFuncSetAttribute(e.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, e.smem),
          "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  cudaFuncAttributes attr{};
  cuda_ok(cudaFuncGetAttributes(&attr, e.fn), "cudaFuncGetAttributes");
  plan.regs = attr.numRegs;
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
    << " threads=" << plan.block.x
    << (ws ? " (1 producer + 2 consumer warpgroups)" : " (2 consumer warpgroups)")
    << " smem=" << plan.smem_bytes << " regs=" << plan.regs << " stages=" << plan.stages;
  if (ws) s << " setmaxnreg=" << kProducerRegs << "/" << kConsumerRegs;
  if (plan.instantiation >= 16 && plan.instantiation < 20) s << " extras=dropout+block-sparse";
  if (plan.instantiation >= 20) s << " trace";
  return s.str();
}

}  // namespace ladder::fa3
