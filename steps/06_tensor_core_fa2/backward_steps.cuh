// The steps of step 06's backward main kernel (backward_kernel, tensor_core_fa2_backward.cuh),
// inlined into it; the masks are in masks.cuh, and the kernel writes out dropout's Z. An item
// is one (query head of the GQA group, Q tile i); per warp, the C fragments of its 16 keys x the
// item's Br queries.
#pragma once
#include <cstddef>
#include <cstdint>

#include "dropout.hpp"
#include "exercise.hpp"
#include "masks.cuh"
#include "mma.cuh"
#include "tiles.cuh"

namespace ladder::step06 {

// C = A B^T for the warp's 16 rows of A (rows row0.., D columns) and every row of B (the
// kNT * 8 rows of a Q-shaped tile): S^T = K_j Q_i^T and dP^T = V_j dO_i^T. A: plain
// ldmatrix of the rows; B[k = d][n = query] = tile[query][d], stored [n][k]: plain ldmatrix
// by load_b_nk (tiles.cuh), whose map gives the pairs b[0], b[1] and b[2], b[3] in order.
template <class L, class T, int D, int kNT>
__device__ __forceinline__ void warp_rows_abt(float (&c)[kNT][4], const T* a, int row0, const T* b,
                                              int lane) {
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) c[nt][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t af[4];
    load_a<L, true>(af, a, row0, kk * 16, lane);
#pragma unroll
    for (int nt = 0; nt < kNT; nt += 2) {
      uint32_t bf[4];
      load_b_nk<L, true>(bf, b, nt * 8, kk * 16, lane);
      mma_16816<T>(c[nt], af, bf[0], bf[1]);
      mma_16816<T>(c[nt + 1], af, bf[2], bf[3]);
    }
  }
}

// An item: one (query head of the GQA group, Q tile i). The kernel copies one field by field
// (prev.i0 = cur.i0, prev.bh = cur.bh): as a struct copy, the compiler orders the item loop's phi
// nodes otherwise, and ptxas assigns other registers.
struct BwdItem {
  size_t bh;  // batch * heads + query head
  int i0;     // first query row of the tile
};

// The items of the block of K/V tile j0, query head hk * group .. hk * group + group - 1 of the
// group in turn: each head's Q tiles that see a key of the tile, from i_first on (under the
// bottom-right causal mask, key j visible to query i iff j <= i + N - M, rows i < j0 - (N - M)
// see none: their tiles are skipped), or, block-sparse, of those only the Q tiles of the kept
// query blocks in the head's mask row for this key block (q_block_lists, KeptItems). A
// constructor, not aggregate initialisation, which would zero walk and bh0 for nothing.
template <int kBr, bool kSparse, class Args>
struct ItemWalk {
  const Args& p;
  const int& b;
  const int& hk;
  const int& M;
  const int tiles_q, i_first;
  KeptItems walk;
  size_t bh0;  // the group's first query head

  __device__ __forceinline__ ItemWalk(const Args& p, const int& b, const int& hk, const int& j0,
                                      const int& M, const int& N)
      : p(p),
        b(b),
        hk(hk),
        M(M),
        tiles_q((M + kBr - 1) / kBr),
        i_first(p.causal ? max(0, j0 - (N - M)) / kBr : 0) {}
  __device__ __forceinline__ int count() {
    if constexpr (kSparse)
      return walk.count(p, b, hk, i_first, tiles_q);
    else
      return p.group * (tiles_q - i_first);
  }
  __device__ __forceinline__ BwdItem first(int n_items) {
    BwdItem it = {size_t(b) * p.heads + size_t(hk) * p.group, i_first * kBr};
    bh0 = it.bh;
    if constexpr (kSparse) {
      if (n_items > 0) {
        walk.first(p, b, hk, i_first, tiles_q);
        it.bh = bh0 + walk.head, it.i0 = walk.kept.tile * kBr;
      }
    }
    return it;
  }
  // The item after it (block-sparse: only while another one is left, `more`).
  __device__ __forceinline__ BwdItem next(BwdItem it, bool more) {
    if constexpr (kSparse) {
      if (more) {
        walk.next(p, b, hk, i_first, tiles_q);
        it.bh = bh0 + walk.head, it.i0 = walk.kept.tile * kBr;
      }
    } else {
      it.i0 += kBr;
      if (it.i0 >= M) it.i0 = i_first * kBr, ++it.bh;
    }
    return it;
  }
};

// dK_j = dV_j = 0.
template <class C>
__device__ __forceinline__ void zero_dk_dv(float (&acc_dk)[C::kD / 8][4],
                                           float (&acc_dv)[C::kD / 8][4]) {
#pragma unroll
  for (int nd = 0; nd < C::kD / 8; ++nd)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[nd][e] = 0.f, acc_dv[nd][e] = 0.f;
}

// Q_i, dO_i (zero-filled past M), L_i and D_i (zero past M) of an item into stage s.
template <class C, class T, class Args>
__device__ __forceinline__ void load_item(const BwdItem& it, int s, T* sQ, T* sdO, float* sL,
                                          float* sD, const T* Q, const T* dO, const Args& p, int M,
                                          int tid) {
  constexpr int kBr = C::kBr, D = C::kD;
  const size_t bh = it.bh;
  const int i0 = it.i0;
  load_tile<C, kBr>(sQ + s * kBr * D, Q + bh * M * D, i0, M, tid);
  load_tile<C, kBr>(sdO + s * kBr * D, dO + bh * M * D, i0, M, tid);
  if (tid < 2 * kBr) {
    const int r = tid % kBr, row = min(i0 + r, M - 1);  // past M: any valid address
    const float* src = (tid < kBr ? p.lse2 : p.dsum) + bh * M + row;
    cp_async_4((tid < kBr ? sL : sD) + s * kBr + r, src, i0 + r < M);
  }
}

// ---- the item loop's steps that hold references ----
// RecomputeP, DsTile and DvDk (and ItemWalk, above) hold references to the kernel's values, as
// step 07's ItemSteps does: written so, inlined, they hand ptxas the code the item loop had with
// them written out in it, where the same steps as functions of by-value arguments (or lambdas)
// changed its register allocation in some instantiations.

// P^T from S^T, recomputed from the saved L_i = LSE_i log2(e) (sLi: the item's stage), rounded
// to T and packed in pairs: p_t[nt][rh] holds key w_row0 + g + 8 rh, queries 8 nt + 2t and
// 8 nt + 2t + 1 (the C layout of S^T). The fp32 S^T dies here, which leaves the registers for
// dP^T.
template <class C, class T, class Args>
struct RecomputeP {
  static constexpr int kNT = C::kBr / 8;
  const Args& p;
  const int& t;  // this lane's t (g = lane / 4, t = lane % 4)

  __device__ __forceinline__ void operator()(uint32_t (&p_t)[kNT][2], const float (&s_t)[kNT][4],
                                             const float* sLi) const {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const float2 li = *reinterpret_cast<const float2*>(sLi + nt * 8 + 2 * t);
#pragma unroll
      for (int rh = 0; rh < 2; ++rh) {
        float pe[2];
        // EXERCISE BEGIN backward-p [medium]
        // Concept: P recomputed from the saved LSE in base 2: exp(scale S - LSE) as one fmaf
        // and one exp2.
        //
        // Into pe[e], e = 0, 1: P of this lane's two scores s_t[nt][2 rh + e] (unscaled,
        // queries 8 nt + 2t + e), from the saved L = LSE log2(e) of those queries in li.x,
        // li.y (the pre-pass made it), p.scale_log2 and fast_exp2 (mma.cuh). Trap: masked
        // scores are -inf, and L is +inf for a query with no visible key: both must give
        // P = 0, never NaN.
        pe[0] = fast_exp2(fmaf(s_t[nt][2 * rh], p.scale_log2, -li.x));
        pe[1] = fast_exp2(fmaf(s_t[nt][2 * rh + 1], p.scale_log2, -li.y));
        // EXERCISE END
        p_t[nt][rh] = pack2<T>(pe[0], pe[1]);
      }
    }
  }
};

// dS^T = P^T o (dP^T - D_i) for n8 tile nt of the item's queries (sDi: the item's stage of D),
// from the rounded P (the P that dV uses), packed like P^T into ds_t. With dropout, Z of the
// 16 x 16 block of S^T that holds tile nt (this warp's keys, queries 16 (nt / 2)..: z, which the
// kernel regenerates) first turns dP^T into dP^T o Z / (1 - p) and P^T, for dV, into P^T o Z; dS
// takes the undropped P.
//   Z in the S^T layout: lane (g, t) holds keys {g, g + 8} x queries {2t, 2t + 1, 2t + 8,
//   2t + 9} of the block, which the forward's layout spreads over lanes 8t + g / 2 and
//   8t + 4 + g / 2, four halves of each one's Philox call. Two calls per lane would double
//   the generator (about 40 instructions per call: 10 rounds of 2 IMAD.WIDE + 2 LOP3).
//   Instead each lane makes the forward's call for its own lane number: its 8 16-bit halves
//   hold the transposed block's positions (byte key16 % 2 of each, the other byte the
//   neighbouring 16 keys'), and as four 8 x 8 matrices of 16-bit values in the fragment
//   layout, one movmatrix each (transpose_b16) hands every lane its own: one Philox call + 4
//   movmatrix per 16 x 16 block (about 48 instructions for 8 elements: this warp owns only
//   16 of the call's 32 keys), then per element about 4.5 (compare, two selects, a multiply,
//   half a pack).
template <class C, bool kDropout, class T, class Args>
struct DsTile {
  static constexpr int kNT = C::kBr / 8;
  uint32_t (&ds_t)[kNT][2];
  uint32_t (&p_t)[kNT][2];
  float (&dp_t)[kNT][4];
  const Args& p;
  const int& t;
  uint32_t (&z)[4];  // dropout: Z of the 16 x 16 block of tiles nt & ~1, nt | 1
  const float* const& sDi;

  __device__ __forceinline__ void operator()(const int& nt) const {
    const float2 di = *reinterpret_cast<const float2*>(sDi + nt * 8 + 2 * t);
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      const float2 pe = unpack2<T>(p_t[nt][rh]);
      [[maybe_unused]] uint32_t p_dropped;
      if constexpr (kDropout) {
        const uint32_t w = z[(nt & 1) * 2 + rh];
        const bool keep0 = (w & 0xffffu) >= p.drop_thresh, keep1 = w >= (p.drop_thresh << 16);
        dp_t[nt][2 * rh] = keep0 ? dp_t[nt][2 * rh] * p.drop_scale : 0.f;
        dp_t[nt][2 * rh + 1] = keep1 ? dp_t[nt][2 * rh + 1] * p.drop_scale : 0.f;
        p_dropped = pack2<T>(keep0 ? pe.x : 0.f, keep1 ? pe.y : 0.f);
      }
      float ds[2];
      // EXERCISE BEGIN backward-ds [easy]
      // Concept: dS = P o (dP - D) per element, in the S^T fragment layout.
      //
      // Into ds[e], e = 0, 1: the softmax backward of this lane's two elements (derived in
      // notes/00_cpu_reference.md) from P in pe.x, pe.y (rounded to T, the P that dV uses),
      // dP in dp_t[nt][2 rh + e] (dropout already applied) and D_i of their queries in
      // di.x, di.y.
      ds[0] = pe.x * (dp_t[nt][2 * rh] - di.x);
      ds[1] = pe.y * (dp_t[nt][2 * rh + 1] - di.y);
      // EXERCISE END
      ds_t[nt][rh] = pack2<T>(ds[0], ds[1]);
      if constexpr (kDropout) p_t[nt][rh] = p_dropped;  // dV's operand: P o Z
    }
  }
};

// The A fragment of k-step kk (k = the Br queries) from a warp's C tiles 2kk, 2kk + 1 of P^T
// or dS^T, packed in T (p_t, ds_t), as P in the forward: a = {tile 2kk rows g, tile 2kk rows
// g + 8, tile 2kk + 1 rows g, tile 2kk + 1 rows g + 8}.
template <int kNT>
__device__ __forceinline__ void tile_pair_a(uint32_t (&a)[4], const uint32_t (&c)[kNT][2], int kk) {
  a[0] = c[2 * kk][0], a[1] = c[2 * kk][1], a[2] = c[2 * kk + 1][0], a[3] = c[2 * kk + 1][1];
}

// dS^T into shared memory for the dQ product: the A fragment ads of k-step kk (as dV_j, dK_j
// read it) at key rows g, g + 8 (r & 1) of the warp's 16, queries 16kk + 8 (r >> 1) + 2t.
template <class C, class T>
__device__ __forceinline__ void store_ds_t(T* sdSx, const uint32_t (&ads)[4], int w_row0, int kk,
                                           int g, int t) {
  using DSL = typename C::DSL;
#pragma unroll
  for (int r = 0; r < 4; ++r)
    *reinterpret_cast<uint32_t*>(
        sdSx + DSL::at(w_row0 + g + 8 * (r & 1), kk * 16 + 8 * (r >> 1) + 2 * t)) = ads[r];
}

// dV_j += P^T dO_i and dK_j += dS^T Q_i, k-step kk of the Br queries: A = ap (P^T) and ads
// (dS^T) from tile_pair_a; B[k = query][n = d] = dO_i[query][d] (Q_i[query][d]): stored [k][n],
// ldmatrix.trans.
template <class C, class T>
struct DvDk {
  static constexpr int kDT = C::kD / 8;
  float (&acc_dv)[kDT][4];
  float (&acc_dk)[kDT][4];
  const T* const& sdOi;
  const T* const& sQi;
  const int& lane;

  __device__ __forceinline__ void operator()(const uint32_t (&ap)[4], const uint32_t (&ads)[4],
                                             const int& kk) const {
    using QKV = typename C::QKV;
#pragma unroll
    for (int nd = 0; nd < kDT; nd += 2) {
      uint32_t bo[4], bq[4];
      load_b_kn<QKV, true>(bo, sdOi, kk * 16, nd * 8, lane);
      mma_16816<T>(acc_dv[nd], ap, bo[0], bo[1]);
      mma_16816<T>(acc_dv[nd + 1], ap, bo[2], bo[3]);
      load_b_kn<QKV, true>(bq, sQi, kk * 16, nd * 8, lane);
      mma_16816<T>(acc_dk[nd], ads, bq[0], bq[1]);
      mma_16816<T>(acc_dk[nd + 1], ads, bq[2], bq[3]);
    }
  }
};

// dQ_i += dS K_j for an item (dS^T in buf), the product: a kDQRows x kDQCols part per warp
// (warp wq of the rows, wd of the columns), k = the Bc keys.
template <class C, class T>
__device__ __forceinline__ void dq_product(float (&acc)[C::kDQRows / 16][C::kDQCols / 8][4],
                                           const T* buf, const T* sK, int wq, int wd, int lane) {
  using QKV = typename C::QKV;
  using DSL = typename C::DSL;
  constexpr int kBc = C::kBc;
  constexpr int kMT = C::kDQRows / 16, kNQ = C::kDQCols / 8;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNQ; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk) {
    uint32_t a[kMT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
      load_a_trans<DSL>(a[mt], buf, wq * C::kDQRows + mt * 16, kk * 16, lane);
#pragma unroll
    for (int nt = 0; nt < kNQ; nt += 2) {
      uint32_t bk[4];  // B[k = key][n = d] = K_j[key][d]: stored [k][n], ldmatrix.trans
      load_b_kn<QKV, true>(bk, sK, kk * 16, wd * C::kDQCols + nt * 8, lane);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        mma_16816<T>(acc[mt][nt], a[mt], bk[0], bk[1]);
        mma_16816<T>(acc[mt][nt + 1], a[mt], bk[2], bk[3]);
      }
    }
  }
}

// dQ_i += dS K_j, the sum: this warp's part into dQ_acc by fp32 atomics, since other blocks
// (the other K/V tiles) add to the same rows. 16-byte atomics, red.global.add.v4.f32 (sm_90):
// half the atomic instructions of float2, which ncu showed queueing behind the atomics (+4-6%
// measured).
template <class C, class Args>
__device__ __forceinline__ void dq_atomics(const float (&acc)[C::kDQRows / 16][C::kDQCols / 8][4],
                                           const BwdItem& it, const Args& p, int M, int wq, int wd,
                                           int g, int t) {
  constexpr int D = C::kD;
  constexpr int kMT = C::kDQRows / 16, kNQ = C::kDQCols / 8;
  // EXERCISE BEGIN dq-atomics [hard]
  // Concept: dQ accumulation: the K/V-outer loop's dQ goes through fp32 atomics, paired
  // across two lanes into 16-byte red.global.add.v4.
  //
  // Add this warp's part of dQ_i, acc[mt][nt][0..3] (the C layout of the 16-row block
  // wq * kDQRows + 16 mt and the n8 tile at column wd * kDQCols + 8 nt), to p.dq_acc: rows
  // it.i0 + r of plane it.bh, [B, H, M, d] fp32, zeroed by the pre-pass and scaled by the
  // post-pass. A lane holds 2 adjacent floats of a row per n8 tile and its neighbour (t ^ 1)
  // the next 2: exchange so that each lane owns 4 adjacent floats, one float4 atomicAdd
  // per pair of n8 tiles. Trap: every lane takes part in the shuffles; rows past M add
  // nothing.
  const int i0 = it.i0;
  float* dq = p.dq_acc + (it.bh * M + i0) * D;
  const bool odd = t & 1;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      const int r = wq * C::kDQRows + mt * 16 + g + rh * 8;
      float4 v[kNQ / 2];
#pragma unroll
      for (int nt = 0; nt < kNQ; nt += 2) {
        const float2 a = make_float2(acc[mt][nt][2 * rh], acc[mt][nt][2 * rh + 1]);
        const float2 bb = make_float2(acc[mt][nt + 1][2 * rh], acc[mt][nt + 1][2 * rh + 1]);
        const float2 send = odd ? a : bb;
        const float2 got = make_float2(__shfl_xor_sync(0xffffffffu, send.x, 1),
                                       __shfl_xor_sync(0xffffffffu, send.y, 1));
        v[nt / 2] =
            odd ? make_float4(got.x, got.y, bb.x, bb.y) : make_float4(a.x, a.y, got.x, got.y);
      }
      if (i0 + r >= M) continue;  // (after the shuffles: every lane takes part in them)
#pragma unroll
      for (int nt = 0; nt < kNQ; nt += 2)
        atomicAdd(reinterpret_cast<float4*>(dq + size_t(r) * D + wd * C::kDQCols +
                                            (nt + (odd ? 1 : 0)) * 8 + 2 * (t & 2)),
                  v[nt / 2]);
    }
  // EXERCISE END
}

// dQ_i += dS K_j for an item whose dS^T is in buf: the product, then the atomics.
template <class C, class T, class Args>
__device__ __forceinline__ void dq_update(const BwdItem& it, const T* buf, const T* sK,
                                          const Args& p, int M, int wq, int wd, int lane, int g,
                                          int t) {
  float acc[C::kDQRows / 16][C::kDQCols / 8][4];
  dq_product<C>(acc, buf, sK, wq, wd, lane);
  dq_atomics<C>(acc, it, p, M, wq, wd, g, t);
}

// dK_j = scale dK_j and dV_j (with dropout, times 1 / (1 - p)), rounded to T, through this
// warp's own rows of sK and sV, then 16-byte stores to dK and dV (K/V plane bhk, keys from j0,
// N in all). The caller's barrier: every warp has finished reading K_j for dQ.
template <class C, bool kDropout, class T, class Args>
__device__ __forceinline__ void store_dk_dv(T* sK, T* sV, const float (&acc_dk)[C::kD / 8][4],
                                            const float (&acc_dv)[C::kD / 8][4], const Args& p,
                                            size_t bhk, int j0, int N, int w_row0, int lane, int g,
                                            int t) {
  using QKV = typename C::QKV;
  constexpr int D = C::kD, kDT = D / 8;
#pragma unroll
  for (int nd = 0; nd < kDT; ++nd)
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      const int at = QKV::at(w_row0 + g + rh * 8, nd * 8 + 2 * t);
      *reinterpret_cast<uint32_t*>(sK + at) =
          pack2<T>(p.scale * acc_dk[nd][2 * rh], p.scale * acc_dk[nd][2 * rh + 1]);
      if constexpr (kDropout)  // dV summed P o Z: now the 1 / (1 - p)
        *reinterpret_cast<uint32_t*>(sV + at) =
            pack2<T>(p.drop_scale * acc_dv[nd][2 * rh], p.drop_scale * acc_dv[nd][2 * rh + 1]);
      else
        *reinterpret_cast<uint32_t*>(sV + at) =
            pack2<T>(acc_dv[nd][2 * rh], acc_dv[nd][2 * rh + 1]);
    }
  __syncwarp();
  T* dK = static_cast<T*>(p.dk) + bhk * N * D;
  T* dV = static_cast<T*>(p.dv) + bhk * N * D;
  constexpr int kRowChunks = D / 8, kWarpChunks = 16 * kRowChunks;
  static_assert(kWarpChunks % 32 == 0, "every lane stores the same number of chunks");
#pragma unroll
  for (int it = 0; it < kWarpChunks / 32; ++it) {
    const int idx = it * 32 + lane, r = w_row0 + idx / kRowChunks, c = idx % kRowChunks;
    if (j0 + r < N) {
      const size_t to = size_t(j0 + r) * D + c * 8;
      *reinterpret_cast<uint4*>(dK + to) = *reinterpret_cast<const uint4*>(sK + QKV::at(r, c * 8));
      *reinterpret_cast<uint4*>(dV + to) = *reinterpret_cast<const uint4*>(sV + QKV::at(r, c * 8));
    }
  }
}

}  // namespace ladder::step06
