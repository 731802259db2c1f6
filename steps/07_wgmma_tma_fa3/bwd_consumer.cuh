// Rung 07's backward consumers: the wgmma products, dS^T through shared memory for dQ, dQ
// staged for the writer or added with atomics, and the per-item loop of a consumer warpgroup
// (FlashAttention-3: CollectiveMainloopBwd::mma and CollectiveEpilogueBwd). Included by
// wgmma_tma_fa3_backward.cu only.
#pragma once
#include <climits>

#include "bwd_params.cuh"
#include "tile_scheduler.cuh"

namespace ladder::fa3 {
namespace {

// ---- the consumer's products (S^T, dP^T, dV, dK: fa3.cuh's issue_abt and issue_rs) ----------

// acc (64 x 64) = dS K_j: A = dS (64 queries x Bc keys) read MN-major from the dS^T buffer
// ([key][64 queries] rows: k-step kk = keys 16kk.., 2048 bytes further), B = K_j (Bc keys x
// 64 dims) read N-major from one column half of the K tile. No commit.
template <class T>
__device__ __forceinline__ void issue_dq(float (&acc)[32], uint32_t ds, uint32_t k) {
  reg_fence(acc);
  wgmma_fence();
  const uint64_t a0 = make_desc_sw128(ds, kBc * kRowBytes, 1024);
  const uint64_t b0 = make_desc_sw128(k, kBc * kRowBytes, 1024);
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk)
    wgmma_ss<T, 64, 1, 1>(acc, desc_advance(a0, kk * 16 * kRowBytes),
                          desc_advance(b0, kk * 16 * kRowBytes), kk > 0);
}

// dS^T (A fragments f of this warp's 16 keys, rows key0 .. key0 + 15 of the tile) into the
// [Br / 64 query halves][Bc keys][64 queries] buffer, 128-byte swizzle: 16-byte chunk c of row r
// at c ^ (r % 8). Fragment register q of k-step kk is the 8 x 8 matrix of keys key0 + 8 (q & 1)
// .., queries 16kk + 8 (q >> 1) ..: one stmatrix per k-step, lane l giving the address of row
// l % 8 of matrix l / 8 (each matrix row is one 16-byte chunk; the 8 rows of a matrix sit in 8
// different chunk columns, so the stores are conflict-free).
template <int kBr>
__device__ __forceinline__ void store_ds_t(unsigned char* buf, const uint32_t (&f)[kBr / 16][4],
                                           int key0, int lane) {
  const int m = lane / 8, r = lane % 8, key = key0 + 8 * (m & 1) + r;  // key % 8 == r
  const uint32_t row = smem_u32(buf) + key * kRowBytes;
#pragma unroll
  for (int kk = 0; kk < kBr / 16; ++kk) {
    const int col = 16 * kk + 8 * (m >> 1);
    stmatrix_x4(row + (col / 64) * (kBc * kRowBytes) + ((((col % 64) / 8) ^ r) * 16), f[kk][0],
                f[kk][1], f[kk][2], f[kk][3]);
  }
}

// dQ part (64 x 64 fp32, accumulator layout: dq[4c + 2r + i] = row 16wp + g + 8r, column
// 8c + 2t + i) into this warpgroup's staging tile: box c / 4 (32 columns), row R at R * 128
// bytes, 16-byte chunk (column % 32) / 4 at chunk ^ (R % 8) — the TMA's 128-byte swizzle.
// Bank conflicts: a 64-bit store is served 16 lanes (rows g = 0..3 or 4..7, 32 bytes each) at a
// time. If every lane stored block c, rows g and g ^ 1 would land on the same two chunks (the
// swizzle flips chunk bit 0 with g's bit 0, and a row's 32 bytes are a chunk pair) and each
// half would take two wavefronts. So the odd rows store block c ^ 2 at the same time (chunk
// bit 2 flipped): the four rows of a half then cover the 8 chunk positions once (all 32 banks),
// one wavefront per half. The price is a select per register, on lanes that differ by g's bit 0.
__device__ __forceinline__ void stage_dq(unsigned char* buf, const float (&dq)[32], int wp, int g,
                                         int t) {
  const bool odd = g & 1;
  // Step cc's store lands at chunk 2 (cc % 4) ^ sw of its row (block cc ^ 2 on odd rows).
  const int sw = g ^ (t >> 1) ^ (odd ? 4 : 0);
#pragma unroll
  for (int cc = 0; cc < 8; ++cc)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = 16 * wp + g + 8 * r, e = 4 * cc + 2 * r, o = 4 * (cc ^ 2) + 2 * r;
      const int off =
          (cc / 4) * kDqBoxBytes + row * kRowBytes + (((2 * (cc % 4)) ^ sw) * 16) + (t & 1) * 8;
      *reinterpret_cast<float2*>(buf + off) =
          odd ? make_float2(dq[o], dq[o + 1]) : make_float2(dq[e], dq[e + 1]);
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

// The steps of consumer warpgroup w's loop, on consumer()'s registers and constants (held by
// reference): dQ out, dropout's keep bits, P^T, dS^T, and the final store of dK and dV.
template <class T, int D, bool kDqTma, bool kExtras>
struct BwdSteps {
  using C = Cfg<D>;
  static constexpr int kBr = C::kBr;
  const Ctx& c;  // the current unit's (consumer() moves it on)
  const int& w;
  const KParams& p;
  const int &wp, &lane, &g, &t, &M, &N, &row0, &dq_row0, &dq_col0;
  const float* const& s_l;
  const float* const& s_d;
  uint32_t (&keep)[(kBr / 16 + 3) / 4];
  float (&dk)[D / 2];
  float (&dv)[D / 2];

  // dQ of item `item` (plane bh, first row i0) out of the dq registers.
  __device__ __forceinline__ void dq_out(const float (&dq)[32], int item, int bh, int i0) {
    if constexpr (kDqTma) {
      dq_ring(w).acquire(item);  // the writer has read item - 1's part
      stage_dq(c.smem + C::kDQ + w * kDqWgBytes, dq, wp, g, t);
      fence_proxy_async_shared();  // generic writes -> the copy engine's reads
      dq_ring(w).commit(item);
    } else {
      atomic_dq<D>(p.dq_acc + size_t(bh) * M * D, i0 + dq_row0, dq_col0, M, dq, wp, g, t);
    }
  }

  // Dropout's Z for an item as 8 keep bits per k-step: bit 2q + i of byte kk of keep = element i
  // of pf[kk][q] (below). Z in the S^T layout: lane (g, t) holds keys {g, g + 8} x queries
  // {2t, 2t + 1, 2t + 8, 2t + 9} of each 16 x 16 block; the contract's Philox call for this
  // lane's NUMBER holds those of the transposed block (queries as rows) and of its neighbour
  // along the keys, so each of its four words, an 8 x 8 matrix of 16-bit halves across the warp,
  // is transposed with movmatrix (step 06's trick), after which word q covers exactly the two
  // elements of pf[kk][q], in byte key16 % 2 of each half (the other byte belongs to the
  // neighbouring warp's 16 keys). All ones without dropout. Computed while an S^T product runs,
  // where registers are to spare.
  __device__ __forceinline__ void make_keep(int h, int i0) {
#pragma unroll
    for (int k = 0; k < (kBr / 16 + 3) / 4; ++k) keep[k] = ~0u;
    if (!p.score.dropout) return;
    const uint32_t key16 = uint32_t(c.j0 + 64 * w + 16 * wp) / 16u;
#pragma unroll
    for (int kk = 0; kk < kBr / 16; ++kk) {
      const dropout::Philox4 ph =
          dropout::philox((key16 / 2) * 32u + uint32_t(lane), uint32_t(i0 / 16 + kk), uint32_t(h),
                          uint32_t(c.b), p.score.seed_lo, p.score.seed_hi);
      uint32_t bits = 0;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint32_t z = dropout::block_uniforms(transpose_b16(ph.w[q]), key16 % 2);
        bits |= uint32_t((z & 0xffffu) >= p.score.drop_threshold) << (2 * q);
        bits |= uint32_t((z >> 16) >= p.score.drop_threshold) << (2 * q + 1);
      }
      keep[kk / 4] = (keep[kk / 4] & ~(0xffu << (8 * (kk % 4)))) | (bits << (8 * (kk % 4)));
    }
  }

  // P^T = exp2(S^T scale log2e - L) for the item (first row i0) in stage st: s[4cc + 2r + i]
  // is key row r, query 8cc + 2t + i. Hidden pairs get -inf first (only items that straddle the
  // diagonal or the end of the keys pay for the test). L = +inf for a query with no visible key,
  // and for the padding rows past seq_q (whose Q, dO are zero-filled): P = 0 there. Each 16
  // queries (k-step kk: n8 blocks 2kk, 2kk + 1) are rounded to T and packed into the A fragment
  // pf[kk] at once (as the forward's convert_p), so the fp32 S^T dies early and leaves its
  // registers to dP^T. Register q of pf[kk] holds key row q & 1, queries 8cc + 2t (low half) and
  // + 1 (high half), cc = 2kk + (q >> 1). dS uses this rounded P (as step 06 does): the error is
  // that of rounding dS itself.
  __device__ __forceinline__ void exp_p(float (&s)[kBr / 2], uint32_t (&pf)[kBr / 16][4], int i0,
                                        int st) {
    const bool need_mask = c.j0 + kBc > N || (p.score.causal && c.j0 + kBc - 1 > i0 + N - M);
    // Query i0 + 8cc + 2t + i is hidden from key row r iff 8cc + i < lim[r]: keys past N are
    // hidden from every query; causal: key j needs query >= j - (N - M).
    int lim[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = c.j0 + row0 + 8 * r;
      lim[r] = key >= N ? INT_MAX : (p.score.causal ? key - (N - M) - i0 - 2 * t : INT_MIN);
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
            v = fast_exp2(fmaf(v, p.score.scale_log2, -(i ? l2.y : l2.x)));
          }
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) pf[kk][q] = pack2<T>(s[8 * kk + 2 * q], s[8 * kk + 2 * q + 1]);
    }
  }

  // dS^T = P^T o (dP^T - D) of the item in stage st, packed into sf like P. Dropout: dP^T o Z /
  // (1 - p) in dS (which takes the undropped P), and P^T o Z in pf for dV (1 / (1 - p) applied
  // to dV once, at the end). Without dropout every bit is kept and drop_rescale is 1.
  __device__ __forceinline__ void make_ds(uint32_t (&sf)[kBr / 16][4], const float (&dp)[kBr / 2],
                                          uint32_t (&pf)[kBr / 16][4], int st) {
    const float* dst = s_d + st * kBr;
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
          dp0 = (b & 1u) ? dp0 * p.score.drop_rescale : 0.f;
          dp1 = (b & 2u) ? dp1 * p.score.drop_rescale : 0.f;
          pf[kk][q] &= ((b & 1u) ? 0x0000ffffu : 0u) | ((b & 2u) ? 0xffff0000u : 0u);  // P o Z
        }
        sf[kk][q] = pack2<T>(pe.x * (dp0 - d2.x), pe.y * (dp1 - d2.y));
      }
    }
  }

  __device__ __forceinline__ void store_grads() {
    // dK_j = scale dK_j; dV_j (x 1 / (1 - p) with dropout), rounded to T and stored from the
    // accumulator layout (4-byte stores, once per unit). Keys past N are not stored. A unit
    // with no item stores zeros: keys that no query sees get zero gradients.
    float dv_scale = 1.f;
    if constexpr (kExtras) {
      if (p.score.dropout) dv_scale = p.score.drop_rescale;
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
            pack2<T>(dk[4 * cc + 2 * r] * p.score.scale, dk[4 * cc + 2 * r + 1] * p.score.scale);
        *reinterpret_cast<uint32_t*>(dvp + at) =
            pack2<T>(dv[4 * cc + 2 * r] * dv_scale, dv[4 * cc + 2 * r + 1] * dv_scale);
      }
    }
  }
};

// ---- the consumer warpgroup w (keys 64w .. 64w+63 of each unit's K/V tile) -------------------
template <class T, int D, bool kDqTma, bool kExtras>
__device__ __forceinline__ void consumer(Ctx c, int w, const KParams& p) {
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

  [[maybe_unused]] uint32_t keep[(kBr / 16 + 3) / 4];
  // clang-format off
  BwdSteps<T, D, kDqTma, kExtras> steps{
      c, w, p, wp, lane, g, t, M, N, row0, dq_row0, dq_col0, s_l, s_d, keep, dk, dv};
  // clang-format on

  // The schedule, per item x of a unit (every wgmma wait is either in the item that issued the
  // product or, for a product carried over the loop edge, a wait_group 0 at the top: ptxas
  // serialises all wgmma (C7514) when it cannot tell which group a wait leaves running, and it
  // moves a wait up through straight-line code, which only the loop edge stops):
  //   top      wait dP^T_x; dS_x; issue dV, dK; dS^T to shared memory; barrier; issue dQ_x;
  //            wait dV, dK -> release the stage
  //   next     issue S^T_{x+1}; [Z of x + 1]; wait dQ_x -> out (under S^T_{x+1});
  //            wait S^T_{x+1}; issue dP^T_{x+1}; P^T_{x+1} (under dP^T_{x+1}) -> loop edge
  // After a unit's last item the next S^T, dP^T and P^T are computed anyway on the stage just
  // used (released only after them) and dropped, so that issue, commit and wait are the same on
  // every path through the loop (another C7514 condition); it costs one item's first third per
  // unit. Then the unit's K_j, V_j are released (the producer loads the next unit's; its first
  // Q and dO tiles are already in flight), and dK_j, dV_j are stored while they land.
  const Pipeline<1> kv = kv_ring();
  kv.wait(0);  // unit 0's K_j, V_j landed (or the producer's plain arrive: it has no item)
  if (!g_has_items) {
    steps.store_grads();  // zeros
    return;
  }
  float s[kBr / 2], dp[kBr / 2], dq[32];
  uint32_t pf[kBr / 16][4];
  const Pipeline<kStages> q = q_ring(), dO = do_ring();
  for (int unit = 0, x = 0;; ++unit, ++x) {  // x: the CTA's items so far (the rings' uses)
    kv.wait(unit);
    q.wait(x);
    ItemInfo item = g_items[x % kItemSlots];  // (after the wait: written before the phase)
    set_unit(c, p, item.jt, item.h / p.group, item.b());
    issue_abt<T, D, kBc, kBr>(s, k_rows, base + C::kQ + q.stage(x) * C::kQBytes);
    if constexpr (kExtras) steps.make_keep(item.h, item.i0);
    wgmma_wait<0>();
    reg_fence(s);
    dO.wait(x);
    issue_abt<T, D, kBc, kBr>(dp, v_rows, base + C::kDO + q.stage(x) * C::kQBytes);
    steps.exp_p(s, pf, item.i0, int(q.stage(x)));
    for (;; ++x) {
      const int st = int(q.stage(x));
      const int h = item.h, i0 = item.i0, unit_last = item.unit_last();
      const uint32_t q_tile = base + C::kQ + st * C::kQBytes;
      const uint32_t do_tile = base + C::kDO + st * C::kQBytes;

      // dP^T_x done (carried over the loop edge): dS^T, and P^T o Z with dropout.
      wgmma_wait<0>();
      reg_fence(dp);
      reg_fence(pf);
      uint32_t sf[kBr / 16][4];
      steps.make_ds(sf, dp, pf, st);

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
      // Double-buffered: a warpgroup writes buffer x % 2 only after passing the barrier of item
      // x - 1, which the other warpgroup reaches only after its own dQ of item x - 2 (that
      // buffer's last reader) has completed.
      unsigned char* ds_buf = c.smem + C::kDS + (x & 1) * C::kDSBytes;
      store_ds_t<kBr>(ds_buf, sf, 64 * w + 16 * wp, lane);
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
      if (!unit_last) q.release(x, lane == 0);  // (and dO's)

      // The next item's S^T (on this stage again after the unit's last item); this item's dQ out
      // while it runs.
      const int nx = x + (unit_last ? 0 : 1), nst = unit_last ? st : st ^ 1;  // its use and stage
      if (!unit_last) {
        q.wait(nx);
        item = g_items[(x + 1) % kItemSlots];
      }
      issue_abt<T, D, kBc, kBr>(s, k_rows, base + C::kQ + nst * C::kQBytes);
      if constexpr (kExtras) {
        if (!unit_last) steps.make_keep(item.h, item.i0);
      }
      wgmma_wait<1>();
      reg_fence(dq);
      steps.dq_out(dq, x, c.b * p.heads + h, i0);

      // The next item's dP^T, and its P^T while dP^T runs.
      dO.wait(nx);
      wgmma_wait<0>();
      reg_fence(s);
      issue_abt<T, D, kBc, kBr>(dp, v_rows, base + C::kDO + nst * C::kQBytes);
      steps.exp_p(s, pf, item.i0, nst);
      if (unit_last) break;
    }
    wgmma_wait<0>();  // the dropped dP^T
    reg_fence(dp);
    q.release(x, lane == 0);
    kv.release(unit, lane == 0);
    steps.store_grads();
    if (item.last()) break;  // (the CTA's last item)
#pragma unroll
    for (int i = 0; i < D / 2; ++i) dk[i] = 0.f, dv[i] = 0.f;
  }
}

}  // namespace
}  // namespace ladder::fa3
