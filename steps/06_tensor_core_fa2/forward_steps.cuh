// The steps of step 06's forward kernel (forward_kernel, tensor_core_fa2.cuh), in the order it
// runs them, inlined into it; a K/V tile's two products, S = Q_i K_j^T and O_i += P V_j, are
// written out in the kernel, and its masks are in masks.cuh. Per warp: s[mi][nj] is the mma C
// fragment of slice mi (16 query rows), n8 tile nj of S (then P); acc_o[mi][nd] that of O_i;
// row_m, row_l hold m_i, l_i of rows g and g + 8 of each slice.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "dropout.hpp"
#include "exercise.hpp"
#include "mma.cuh"
#include "tiles.cuh"

namespace ladder::step06 {

// O_i = 0, m_i = -inf, l_i = 0.
template <class C>
__device__ __forceinline__ void init_rows(float (&acc_o)[C::kSlices][C::kD / 8][4],
                                          float (&row_m)[C::kSlices][2],
                                          float (&row_l)[C::kSlices][2]) {
#pragma unroll
  for (int mi = 0; mi < C::kSlices; ++mi) {
#pragma unroll
    for (int nd = 0; nd < C::kD / 8; ++nd)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mi][nd][e] = 0.f;
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) row_m[mi][rh] = -INFINITY, row_l[mi][rh] = 0.f;
  }
}

// K_j and V_j (rows row0.. of K and V, N in all) into the tiles of one stage, sK and sV.
template <class C, class T>
__device__ __forceinline__ void load_kv(T* sK, T* sV, const T* K, const T* V, int row0, int N,
                                        int tid) {
  load_tile<C, C::kBc>(sK, K, row0, N, tid);
  load_tile<C, C::kBc>(sV, V, row0, N, tid);
}

// S = 0, before the k-steps of S = Q_i K_j^T accumulate into it.
template <class C>
__device__ __forceinline__ void zero_scores(float (&s)[C::kSlices][C::kBc / 8][4]) {
#pragma unroll
  for (int mi = 0; mi < C::kSlices; ++mi)
#pragma unroll
    for (int nj = 0; nj < C::kBc / 8; ++nj)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mi][nj][e] = 0.f;
}

// Online softmax, rows g and g + 8 of each slice: the new row max m, P = exp(S - m) in place
// of S, l rescaled and this thread's columns added, O_i rescaled. The 4 lanes of a quad (same
// g) hold all Bc columns of their rows, 2 per n8 tile: two xor-shuffles give the max.
template <class C, class Args>
__device__ __forceinline__ void online_softmax(float (&s)[C::kSlices][C::kBc / 8][4],
                                               float (&row_m)[C::kSlices][2],
                                               float (&row_l)[C::kSlices][2],
                                               float (&acc_o)[C::kSlices][C::kD / 8][4],
                                               const Args& p) {
  constexpr int kS = C::kSlices, kNT = C::kBc / 8, kDT = C::kD / 8;
  constexpr float kNegInf = -INFINITY;
#pragma unroll
  for (int mi = 0; mi < kS; ++mi)
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      float mx = row_m[mi][rh];
#pragma unroll
      for (int nj = 0; nj < kNT; ++nj)
        mx = fmaxf(mx, fmaxf(s[mi][nj][2 * rh], s[mi][nj][2 * rh + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A row that has seen only masked keys keeps m = -inf; subtract 0 then, so that
      // exp2(-inf - 0) = 0 instead of exp2(-inf + inf) = NaN.
      const float mx_scaled = mx == kNegInf ? 0.f : mx * p.scale_log2;
      const float alpha = rescale_factor(row_m[mi][rh], mx, p.scale_log2);  // 1 if the max held
      row_m[mi][rh] = mx;
      float sum = 0.f;
#pragma unroll
      for (int nj = 0; nj < kNT; ++nj)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          // exp(scale * (s - m)) = exp2(s * scale*log2e - m * scale*log2e): one FFMA
          const float pe = fast_exp2(fmaf(s[mi][nj][2 * rh + e], p.scale_log2, -mx_scaled));
          s[mi][nj][2 * rh + e] = pe;
          sum += pe;
        }
      row_l[mi][rh] = alpha * row_l[mi][rh] + sum;  // this thread's columns only
#pragma unroll
      for (int nd = 0; nd < kDT; ++nd) {
        acc_o[mi][nd][2 * rh] *= alpha;
        acc_o[mi][nd][2 * rh + 1] *= alpha;
      }
    }
}

// Dropout of one 16 x 16 block of P held in the mma C layout: `ev` and `od` are the lane's
// elements of the even and odd n8 tile ([0], [1] = row g, columns 2t, 2t + 1; [2], [3] = row
// g + 8). The lane's Philox call (common/dropout.hpp) covers this block and its neighbour (32
// keys): w0 = row g of the even tile, w1 = row g of the odd tile, w2 and w3 the same for row
// g + 8, the even column in the low 16 bits; in each 16-bit half, byte e is block e's uniform.
// A dropped P_ij becomes 0. Per pair of elements: the block's two bytes moved to the bottom of
// each half (dropout::block_uniforms: a shift and an AND), the high half one unsigned compare (w >=
// t << 16: its low bits cannot change the outcome), the low half an AND and a compare, then two
// selects.
__device__ __forceinline__ void keep_pair(float& lo, float& hi, uint32_t w, uint32_t e,
                                          uint32_t t) {
  w = dropout::block_uniforms(w, e);
  lo = (w & 0xffffu) >= t ? lo : 0.f;
  hi = w >= (t << 16) ? hi : 0.f;
}
__device__ __forceinline__ void drop_block(float (&ev)[4], float (&od)[4],
                                           const dropout::Philox4& z, uint32_t e, uint32_t t) {
  keep_pair(ev[0], ev[1], z.w[0], e, t);
  keep_pair(od[0], od[1], z.w[1], e, t);
  keep_pair(ev[2], ev[3], z.w[2], e, t);
  keep_pair(od[2], od[3], z.w[3], e, t);
}

// p-via-smem: P written to this warp's own rows of the shared P tile, to be read back as the
// A operand: the round trip that keeping P in registers avoids.
template <class C, class T>
__device__ __forceinline__ void store_p(T* sP, const float (&s)[C::kSlices][C::kBc / 8][4],
                                        int w_row0, int g, int t) {
  constexpr int kS = C::kSlices, kNT = C::kBc / 8;
#pragma unroll
  for (int mi = 0; mi < kS; ++mi)
#pragma unroll
    for (int nj = 0; nj < kNT; ++nj)
#pragma unroll
      for (int rh = 0; rh < 2; ++rh)
        *reinterpret_cast<uint32_t*>(sP +
                                     C::PL::at(w_row0 + mi * 16 + g + rh * 8, nj * 8 + 2 * t)) =
            pack2<T>(s[mi][nj][2 * rh], s[mi][nj][2 * rh + 1]);
  __syncwarp();  // a warp reads only its own rows of P
}

// P's A fragment for keys 16kk .. 16kk + 15 of one slice, straight from the slice's S (now P)
// accumulators s[nj][0..3] in the mma C layout.
template <class T, int kNT>
__device__ __forceinline__ void p_fragment(uint32_t (&a)[4], const float (&s)[kNT][4], int kk) {
  // EXERCISE BEGIN p-fragment [hard]
  // Concept: P stays in registers: the mma C fragment of S, rounded to 16 bits, is
  // the A fragment of P V.
  //
  // Fill a[0..3], the A fragment of P for keys 16kk .. 16kk + 15 of this slice, from
  // this lane's S accumulators s[nj][0..3] (n8 tiles nj of the C layout), packing
  // pairs with pack2<T>(lower column, higher column). Write down which (row, column)
  // of its 16 x 8 C tile each s[nj][k] holds for lane (g = lane / 4, t = lane % 4),
  // then which (row, column) each a[k] of the m16n8k16 A fragment must hold (mma.cuh):
  // no shuffle is needed.
  a[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
  a[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
  a[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  a[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  // EXERCISE END
}

// Epilogue, rows: l_i. Each lane summed its own columns; the quad adds its four partial sums
// once, here, instead of once per tile. Then one division per row, by l_i and, with dropout,
// by 1 - p (l_i summed the undropped P: LSE is unaffected); LSE_i = scale m_i + log l_i, into
// plane bh of LSE.
template <class C, bool kDropout, class Args>
__device__ __forceinline__ void finish_rows(float (&inv_l)[C::kSlices][2],
                                            const float (&row_m)[C::kSlices][2],
                                            const float (&row_l)[C::kSlices][2], const Args& p,
                                            size_t bh, int i0, int w_row0, int g, int t) {
  constexpr int kS = C::kSlices;
  constexpr float kNegInf = -INFINITY;
  const int M = p.seq_q;
  float* LSE = p.lse + bh * M;
#pragma unroll
  for (int mi = 0; mi < kS; ++mi)
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      float l = row_l[mi][rh];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      inv_l[mi][rh] = l > 0.f ? 1.f / l : 0.f;  // l = 0: no visible key, O = 0
      if constexpr (kDropout) inv_l[mi][rh] *= p.drop_scale;
      const int row = i0 + w_row0 + mi * 16 + g + rh * 8;
      if (t == 0 && row < M) LSE[row] = l > 0.f ? row_m[mi][rh] * p.scale + logf(l) : kNegInf;
    }
}

// Epilogue, O_i = O_i / l_i rounded to T, stored to O (rows i0.., M rows in all): through
// shared memory for 16-byte stores (kStagedStore), or straight from the fragments. O is formed
// here, from the base and the plane bh: formed in the kernel, ptxas was given other code.
template <class C, class T>
__device__ __forceinline__ void store_o(T* O_base, size_t bh, T* sQ,
                                        const float (&acc_o)[C::kSlices][C::kD / 8][4],
                                        const float (&inv_l)[C::kSlices][2], int M, int i0,
                                        int w_row0, [[maybe_unused]] int lane, int g, int t) {
  using QKV = typename C::QKV;
  constexpr int kS = C::kSlices, kDT = C::kD / 8, D = C::kD;
  T* O = O_base + bh * M * D;
  if constexpr (C::kStage) {
    // O_i through this warp's own rows of the Q tile (no other warp reads them), then
    // 16-byte chunks: consecutive lanes write consecutive chunks of a row.
    T* sO = sQ;
    __syncwarp();  // the warp's last ldmatrix reads of those rows are done
#pragma unroll
    for (int mi = 0; mi < kS; ++mi)
#pragma unroll
      for (int nd = 0; nd < kDT; ++nd)
#pragma unroll
        for (int rh = 0; rh < 2; ++rh)
          *reinterpret_cast<uint32_t*>(sO +
                                       QKV::at(w_row0 + mi * 16 + g + rh * 8, nd * 8 + 2 * t)) =
              pack2<T>(acc_o[mi][nd][2 * rh] * inv_l[mi][rh],
                       acc_o[mi][nd][2 * rh + 1] * inv_l[mi][rh]);
    __syncwarp();
    constexpr int kRowChunks = D / 8, kWarpChunks = 16 * kS * kRowChunks;
    static_assert(kWarpChunks % 32 == 0, "every lane stores the same number of chunks");
#pragma unroll
    for (int it = 0; it < kWarpChunks / 32; ++it) {
      const int idx = it * 32 + lane, r = w_row0 + idx / kRowChunks, c = idx % kRowChunks;
      if (i0 + r < M)
        *reinterpret_cast<uint4*>(O + size_t(i0 + r) * D + c * 8) =
            *reinterpret_cast<const uint4*>(sO + QKV::at(r, c * 8));
    }
  } else {  // direct-store: each lane writes its 4-byte pairs straight from the C fragments
#pragma unroll
    for (int mi = 0; mi < kS; ++mi)
#pragma unroll
      for (int rh = 0; rh < 2; ++rh) {
        const int row = i0 + w_row0 + mi * 16 + g + rh * 8;
        if (row >= M) continue;
#pragma unroll
        for (int nd = 0; nd < kDT; ++nd)
          *reinterpret_cast<uint32_t*>(O + size_t(row) * D + nd * 8 + 2 * t) = pack2<T>(
              acc_o[mi][nd][2 * rh] * inv_l[mi][rh], acc_o[mi][nd][2 * rh + 1] * inv_l[mi][rh]);
      }
  }
}

}  // namespace ladder::step06
