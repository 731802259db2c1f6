// SPDX-License-Identifier: MIT (LICENSE). Follows the published structure of
// FlashAttention-2 (T. Dao, 2023, arXiv:2307.08691, Algorithm 2).
// Step 05's backward: the FA2 backward (FlashAttention-2, Algorithm 2), fp32.
//   pre-pass    D_i = rowsum(dO_i o O_i), dQ_acc = 0                backward_prepass_kernel
//   main        one block per (K/V tile j, K/V head, batch), dK_j and dV_j in registers;
//               for every query head h of the group, for every Q tile i that sees K_j:
//                 S_ij  = Q_i K_j^T,   P_ij = exp(scale S_ij - LSE_i)   (recomputed from LSE)
//                 dV_j += P_ij^T dO_i
//                 dP_ij = dO_i V_j^T,  dS_ij = P_ij o (dP_ij - D_i)
//                 dK_j += dS_ij^T Q_i  (times scale at the end)
//                 dQ_i += dS_ij K_j    (fp32 atomicAdd into dQ_acc: other blocks add to it too)
//   post-pass   dQ = scale * dQ_acc                              backward_dq_kernel
// The thread layout is the forward's (shared_memory_fa2.cuh) with 256 threads, Br = Bc = 64:
//   S_ij, dP_ij:  rows ty + 16a (a < 4), keys tx + 16b (b < 4)        abt_tile<D, 4>
//   dV_j, dK_j:   keys 4ty + a (a < 4), columns 2tx + 32c (+1)         atb_tile below
//   dQ_i:         rows ty + 16a (a < 4), columns 2tx + 32c (+1)        pv_tile<D, 4>
// Block-sparse masks: a block walks, for each query head, the kept query blocks of its key
// block's mask column (q_block_lists): a masked Q tile is never loaded. Dropout: Z_ij per
// element (dropout::keep) for dP_ij o Z_ij / (1 - p) and for P_ij o Z_ij, which goes to shared
// memory for dV_j (times 1 / (1 - p) once, at the end); dS_ij takes the undropped P_ij.
#pragma once
#include <atomic>
#include <type_traits>

#include "shared_memory_fa2.cuh"
#include "shared_memory_fa2_forward.cuh"  // so that this header gives both passes

namespace ladder::step05 {

constexpr int kBwdThreads = 256;
constexpr int kBrBwd = 64;                            // query rows per Q tile in the backward
constexpr int kBwdTM = kBrBwd / (kBwdThreads / kTX);  // 4 rows of S_ij per thread
static_assert(kBwdTM == 4 && kBc / 4 == kBwdThreads / kTX, "atb_tile's 4 keys per thread");

// What the backward's main kernel needs; the kernels without block mask or dropout take
// exactly this (as they always did).
struct BwdArgs {
  const float* __restrict__ q;
  const float* __restrict__ k;
  const float* __restrict__ v;
  const float* __restrict__ o;
  const float* __restrict__ dout;
  const float* __restrict__ lse;
  const float* __restrict__ lse_lo;  // LSE's rounding residual (store_lse)
  const float* __restrict__ dsum;    // D_i
  float* __restrict__ dq_acc;        // fp32, [B, H, M, D], zeroed by the pre-pass
  float* __restrict__ dk;
  float* __restrict__ dv;
  int batch, heads, heads_kv, group, seq_q, seq_k;
  float scale;
  bool causal;
};

// What a caller fills in (launch_backward below): the arguments above, dQ, and the features.
// Zero-initialised (BwdParams bp{}), block mask and dropout are off.
struct BwdParams : BwdArgs {
  float* __restrict__ dq;  // [B, H, M, D], the output: scale * dQ_acc
  // Block-sparse mask (blk_count null: dense), as the host's q_block_lists (common/
  // block_mask.hpp): row r = (mask batch * mask_heads + mask head) * mask_k_blocks + key block
  // keeps blk_count[r] query blocks, ascending, at blk_index[r * mask_q_blocks ...]. The tiles
  // must divide the mask block: Br = 64 | mask_block_q, Bc = 64 | mask_block_k.
  const int32_t* blk_count;
  const int32_t* blk_index;
  int mask_batch, mask_heads, mask_q_blocks, mask_k_blocks, mask_block_q, mask_block_k;
  // Dropout (dropout_p = 0: none): the forward's rate and Philox key.
  double dropout_p;
  uint64_t dropout_seed;
};
template <bool kDropout, bool kSparse>
using BwdArgsFor = std::conditional_t<kDropout || kSparse, WithFeatures<BwdArgs>, BwdArgs>;

// D_i = dO_i . O_i, one thread per row, summed over k in order with one fmaf per term: the
// order in which abt_tile sums dP_ij = dO_i . V_j. Where a row sees a single key, P_ij = 1 and
// O_i = V_j exactly, so dP_ij - D_i is exactly 0 and so are dS_ij, dQ_i, dK_j, as in the
// float64 reference; a tree sum here would leave rounding noise of ~1e-7 where 0 is exact.
// The block also zeroes its rows of dQ_acc for the atomics (coalesced: consecutive threads,
// consecutive float4s).
__global__ void __launch_bounds__(256)
    backward_prepass_kernel(const float* __restrict__ dout, const float* __restrict__ o,
                            float* __restrict__ dsum, float* __restrict__ dq_acc, int64_t rows,
                            int d) {
  const int64_t row0 = int64_t(blockIdx.x) * blockDim.x, row = row0 + threadIdx.x;
  if (row < rows) {
    // EXERCISE BEGIN d-prepass [medium]
    // Concept: the FA2 backward's pre-pass: D_i = sum_j P_ij dP_ij without P or dP, summed in
    // the order that makes a one-key row cancel exactly.
    //
    // dsum[row] must be D_i = sum_j P_ij dP_ij for this row, but only dO and O are here (rows
    // of d floats). Why do they suffice? Trap: where a row sees one key, P = 1 and O_i = V_j
    // exactly, so dP_ij - D_i must come out exactly 0 (cases seq1, q200_k1_causal): sum in the
    // order abt_tile sums dP_ij = dO_i . V_j (in k, one fmaf per term), not as a tree.
    float acc = 0.f;
    for (int c = 0; c < d; c += 4) {
      const float4 x = __ldg(reinterpret_cast<const float4*>(dout + row * d + c));
      const float4 y = __ldg(reinterpret_cast<const float4*>(o + row * d + c));
      acc = fmaf(x.x, y.x, acc);
      acc = fmaf(x.y, y.y, acc);
      acc = fmaf(x.z, y.z, acc);
      acc = fmaf(x.w, y.w, acc);
    }
    dsum[row] = acc;
    // EXERCISE END
  }
  const int64_t mine = rows - row0 < blockDim.x ? rows - row0 : blockDim.x, n4 = mine * d / 4;
  float4* zero = reinterpret_cast<float4*>(dq_acc + row0 * d);
  for (int64_t x = threadIdx.x; x < n4; x += blockDim.x) zero[x] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// dQ = scale * dQ_acc, into the (poisoned) output.
__global__ void backward_dq_kernel(const float* __restrict__ dq_acc, float* __restrict__ dq,
                                   int64_t n, float scale) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t x = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; x < n; x += stride)
    dq[x] = scale * dq_acc[x];
}

// acc += A^T X on a 4 x (D/16) micro-tile: rows (keys) 4*ty + a of A^T, i.e. columns of A
// (kBrBwd x kBc, kLdP-strided), columns 2*tx + 32*c (+1) of X (kBrBwd x D, kLd-strided);
// summed over the query rows in order. Per row: one float4 of A (the two row groups of a warp
// read 32 consecutive bytes) and D/32 float2s of X (16 lanes, 128 consecutive bytes).
// dV_j += P_ij^T dO_i and dK_j += dS_ij^T Q_i.
template <int D>
__device__ __forceinline__ void atb_tile(float (&acc)[4][D / 16], const float* A, const float* X,
                                         int ty, int tx) {
  constexpr int ldp = Layout<D>::kLdP, ld = Layout<D>::kLd;
#pragma unroll 1  // as in abt_tile: registers, not instructions, limit the blocks per SM
  for (int i = 0; i < kBrBwd; ++i) {
    const float4 av = ld4(A + i * ldp + 4 * ty);
#pragma unroll
    for (int c = 0; c < D / 32; ++c) {
      const float2 x = ld2(X + i * ld + 2 * tx + 32 * c);
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        const float p = lane_of(av, a);
        acc[a][2 * c] = fmaf(p, x.x, acc[a][2 * c]);
        acc[a][2 * c + 1] = fmaf(p, x.y, acc[a][2 * c + 1]);
      }
    }
  }
}

// Shared memory: [Q_i][dO_i][K_j][V_j]: kBrBwd or kBc rows of kLd; [P_ij][dS_ij]: kBrBwd rows
// of kLdP; [LSE_i][LSE_lo_i][D_i]: kBrBwd floats each.
template <int D>
constexpr size_t bwd_smem_bytes() {
  using L = Layout<D>;
  return sizeof(float) *
         size_t((2 * kBrBwd + 2 * kBc) * L::kLd + 2 * kBrBwd * L::kLdP + 3 * kBrBwd);
}

// ---- the main kernel's steps, each inlined into backward_kernel below ----

// Q_i and dO_i (rows from q_off, `rows` of them) into Qs and dOs; LSE_i (+inf where -inf or
// past the end), its residual and D_i (rows q_head + i0 ..) into Ls, Lo and Ds.
template <int D, class Args>
__device__ __forceinline__ void load_q_tile(float* Qs, float* dOs, float* Ls, float* Lo, float* Ds,
                                            const Args& p, size_t q_head, int i0, int rows,
                                            size_t q_off, int tid) {
  using L = Layout<D>;
  load_tiles<D, 2>(
      {TileCopy{Qs, p.q + q_off, L::kLd, rows}, TileCopy{dOs, p.dout + q_off, L::kLd, rows}},
      kBrBwd, tid, kBwdThreads);
  if (tid < kBrBwd) {
    const float lse = tid < rows ? p.lse[q_head + i0 + tid] : -INFINITY;
    // exp(S - (+inf)) = 0 for every finite S: a row with no visible key (LSE = -inf) or
    // past the end gets P = 0 with no test per element, and never -inf - -inf = NaN.
    Ls[tid] = lse == -INFINITY ? INFINITY : lse;
    Lo[tid] = tid < rows ? p.lse_lo[q_head + i0 + tid] : 0.f;
    Ds[tid] = tid < rows ? p.dsum[q_head + i0 + tid] : 0.f;
  }
}

// Dropout's Z_ij of this thread's 16 elements (query head hk * group + g of batch b; rows
// i0 + ty + 16r, keys j0 + tx + 16c): dP_ij becomes dP_ij o Z_ij / (1 - p). Returns Z as bits
// 4r + c, for P_ij o Z_ij.
template <class Args>
__device__ __forceinline__ uint32_t drop_dp(float (&dp)[4][kTN], const Args& p, int b, int hk,
                                            int g, int i0, int j0, int ty, int tx) {
  uint32_t kept_bits = 0;
#pragma unroll 1
  for (int e = 0; e < 4 * kTN; ++e) {
    const int i = i0 + ty + kTX * (e / kTN), j = j0 + tx + kTX * (e % kTN);
    kept_bits |= uint32_t(dropout::keep(p.f.seed, p.f.drop_thresh, b, hk * p.group + g, i, j)) << e;
  }
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < kTN; ++c)
      dp[r][c] = (kept_bits >> (4 * r + c)) & 1u ? dp[r][c] * p.f.drop_scale : 0.f;
  return kept_bits;
}

// dK_j = scale * sum dS^T Q, dV_j = sum P^T dO (with dropout, times 1 / (1 - p)): written
// once, by the only block that owns them (keys 4ty + r from kv_off, `keys` of them).
template <int D, bool kDropout, class Args>
__device__ __forceinline__ void store_dk_dv(const float (&dk)[4][Layout<D>::kCols],
                                            const float (&dv)[4][Layout<D>::kCols], const Args& p,
                                            size_t kv_off, int keys, int ty, int tx) {
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int j = 4 * ty + r;
    if (j >= keys) continue;
    const size_t row = kv_off + size_t(j) * D + 2 * tx;
#pragma unroll
    for (int c = 0; c < D / 32; ++c) {
      *reinterpret_cast<float2*>(p.dk + row + 32 * c) =
          make_float2(p.scale * dk[r][2 * c], p.scale * dk[r][2 * c + 1]);
      if constexpr (kDropout)  // dV_j summed P o Z: now the 1 / (1 - p)
        *reinterpret_cast<float2*>(p.dv + row + 32 * c) =
            make_float2(p.f.drop_scale * dv[r][2 * c], p.f.drop_scale * dv[r][2 * c + 1]);
      else
        *reinterpret_cast<float2*>(p.dv + row + 32 * c) =
            make_float2(dv[r][2 * c], dv[r][2 * c + 1]);
    }
  }
}

template <int D, bool kDropout = false, bool kSparse = false>
__global__ void __launch_bounds__(kBwdThreads)
    backward_kernel(const BwdArgsFor<kDropout, kSparse> p) {
  using L = Layout<D>;
  extern __shared__ float4 smem4[];
  const int tid = threadIdx.x, tx = tid % kTX, ty = tid / kTX;
  float* Qs = reinterpret_cast<float*>(smem4);
  float* dOs = Qs + kBrBwd * L::kLd;
  float* Ks = dOs + kBrBwd * L::kLd;
  float* Vs = Ks + kBc * L::kLd;
  float* Ps = Vs + kBc * L::kLd;
  float* dSs = Ps + kBrBwd * L::kLdP;
  float* Ls = dSs + kBrBwd * L::kLdP;  // LSE_i, with -inf (and rows past M) as +inf: P = 0
  float* Lo = Ls + kBrBwd;             // LSE_lo_i
  float* Ds = Lo + kBrBwd;             // D_i

  const int jt = blockIdx.x, hk = blockIdx.y, b = blockIdx.z, j0 = jt * kBc;
  const int Hkv = p.heads / p.group, keys = min(kBc, p.seq_k - j0);
  const size_t kv_off = ((size_t(b) * Hkv + hk) * p.seq_k + j0) * D;
  load_tiles<D, 2>(
      {TileCopy{Ks, p.k + kv_off, L::kLd, keys}, TileCopy{Vs, p.v + kv_off, L::kLd, keys}}, kBc,
      tid, kBwdThreads);

  float dk[4][L::kCols] = {}, dv[4][L::kCols] = {};
  // Causal: rows i < j0 - (N - M) see no key of this tile; their Q tiles are skipped.
  const int it0 = p.causal ? max(0, j0 - (p.seq_k - p.seq_q)) / kBrBwd : 0;
  const int tr = (p.seq_q + kBrBwd - 1) / kBrBwd;
  // GQA: the group's query heads all read K_j, V_j, so this block sums their contributions
  // to dK_j, dV_j on chip: no atomics for dK, dV.
  for (int g = 0; g < p.group; ++g) {
    const size_t q_head = (size_t(b) * p.heads + hk * p.group + g) * p.seq_q;
    // The Q tiles visited: it = it0 .. tr - 1, or (block-sparse) the tiles of the kept query
    // blocks in this head's mask row for K_j, ascending, within [it0, tr): x counts them, and
    // tile x is the (x % sub)-th tile of block list[x / sub] (sub = mask_sub tiles a block).
    int x0 = it0, n_x = tr;
    [[maybe_unused]] const int32_t* list = nullptr;
    if constexpr (kSparse) {
      const size_t row = size_t(b) * p.f.mask_bstride +
                         (size_t(hk) * p.group + g) * p.f.mask_hstride + jt / p.f.mask_tiles;
      list = p.f.blk_index + row * p.f.mask_blocks;
      x0 = 0, n_x = p.f.blk_count[row] * p.f.mask_sub;
    }
    for (int x = x0; x < n_x; ++x) {
      int it = x;
      if constexpr (kSparse) {
        it = list[x / p.f.mask_sub] * p.f.mask_sub + x % p.f.mask_sub;
        if (it < it0) continue;  // causally invisible
        if (it >= tr) break;     // past the last query (a mask block may extend past it)
      }
      const int i0 = it * kBrBwd, rows = min(kBrBwd, p.seq_q - i0);
      const size_t q_off = (q_head + i0) * D;
      __syncthreads();  // the last Q tile is done with Q_i, dO_i, P_ij, dS_ij, L_i, D_i
      load_q_tile<D>(Qs, dOs, Ls, Lo, Ds, p, q_head, i0, rows, q_off, tid);
      __syncthreads();

      float s[4][kTN] = {}, dp[4][kTN] = {};
      abt_tile<D, 4>(s, Qs, ty, kTX, Ks, tx);    // S_ij = Q_i K_j^T
      abt_tile<D, 4>(dp, dOs, ty, kTX, Vs, tx);  // dP_ij = dO_i V_j^T
      const bool mask = j0 + kBc > p.seq_k || (p.causal && j0 + kBc - 1 > i0 + p.seq_k - p.seq_q);
      // Dropout: Z_ij of this thread's 16 elements, bit 4r + c (row ty + 16r, key tx + 16c;
      // one Philox call each, in a rolled loop as in the forward); dP_ij becomes
      // dP_ij o Z_ij / (1 - p) here, P_ij becomes P_ij o Z_ij after the exercise below.
      [[maybe_unused]] uint32_t kept_bits = 0;
      if constexpr (kDropout) kept_bits = drop_dp(dp, p, b, hk, g, i0, j0, ty, tx);
        // EXERCISE BEGIN backward-ds [medium]
        // Concept: P recomputed from the saved LSE instead of stored, and the softmax backward
        // dS from P, dP and D.
        //
        // For this thread's 4 x kTN elements (row ty + 16r, key tx + 16c of the tile): write P_ij
        // to Ps and dS_ij to dSs at [row * kLdP + key]. P is not stored anywhere: recompute it
        // from s[r][c] (= Q_i . K_j, unscaled) and the saved row statistics Ls (LSE, +inf for a
        // row with no visible key) and Lo (its rounding residual), rounding scale * S exactly as
        // the forward did (scale_and_mask). dp[r][c] holds dP_ij (dropout already applied) and Ds
        // the rows' D_i. A key the tile's causal mask or the sequence end hides has P = 0.
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i = ty + kTX * r;
        const float lse = Ls[i], lo = Lo[i], di = Ds[i];
#pragma unroll
        for (int c = 0; c < kTN; ++c) {
          const int j = tx + kTX * c;
          const bool hidden =
              mask && (j0 + j >= p.seq_k || (p.causal && j0 + j > i0 + i + p.seq_k - p.seq_q));
          // scale * S rounded as in the forward (scale_and_mask), then LSE and its residual.
          const float pij = hidden ? 0.f : expf((__fmul_rn(s[r][c], p.scale) - lse) - lo);
          Ps[i * L::kLdP + j] = pij;
          dSs[i * L::kLdP + j] = pij * (dp[r][c] - di);
        }
      }
      // EXERCISE END
      if constexpr (kDropout)  // dV_j's P_ij o Z_ij (the same thread wrote it: no barrier)
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int c = 0; c < kTN; ++c)
            if (!((kept_bits >> (4 * r + c)) & 1u))
              Ps[(ty + kTX * r) * L::kLdP + tx + kTX * c] = 0.f;
      __syncthreads();  // P_ij and dS_ij are complete

      atb_tile<D>(dv, Ps, dOs, ty, tx);  // dV_j += P_ij^T dO_i
      atb_tile<D>(dk, dSs, Qs, ty, tx);  // dK_j += dS_ij^T Q_i
      // EXERCISE BEGIN dq-accumulate [hard]
      // Concept: dQ in the K/V-outer loop: every K/V block adds its dS_ij K_j to rows that
      // other blocks also add to, so the sum goes through fp32 atomics.
      //
      // This block owns K_j, V_j; dQ_i needs dS_ij K_j from every key tile j, and the other
      // key tiles are other blocks running at the same time. Add this tile's part of dQ_i (dSs
      // is complete in shared memory, K_j is in Ks) to p.dq_acc (fp32, zeroed by the pre-pass;
      // the post-pass multiplies by scale). This thread's elements: rows ty + 16r, columns
      // 2tx + 32c (+1) (pv_tile's layout). Rows past `rows` do not exist.
      float dq[4][L::kCols] = {};
      pv_tile<D, 4>(dq, dSs, ty, kTX, Ks, L::kLd, tx);  // dQ_i (this tile's part) = dS_ij K_j
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i = ty + kTX * r;
        if (i >= rows) continue;
        float* acc = p.dq_acc + q_off + size_t(i) * D + 2 * tx;
#pragma unroll
        for (int c = 0; c < D / 32; ++c) {
          atomicAdd(acc + 32 * c, dq[r][2 * c]);
          atomicAdd(acc + 32 * c + 1, dq[r][2 * c + 1]);
        }
      }
      // EXERCISE END
    }
  }

  store_dk_dv<D, kDropout>(dk, dv, p, kv_off, keys, ty, tx);
}

template <int D, bool kDropout, bool kSparse>
void launch_backward_main(const BwdParams& p, cudaStream_t stream) {
  static std::atomic<uint64_t> done{0};  // devices this kernel may use all shared memory on
  const auto kernel = backward_kernel<D, kDropout, kSparse>;
  if (allow_device_smem(reinterpret_cast<const void*>(kernel), done) != cudaSuccess) return;
  const dim3 grid(unsigned((p.seq_k + kBc - 1) / kBc), unsigned(p.heads_kv), unsigned(p.batch));
  if constexpr (kDropout || kSparse) {
    WithFeatures<BwdArgs> a{};
    static_cast<BwdArgs&>(a) = p;
    a.f = feature_args(p, false, kBrBwd, kBc);
    kernel<<<grid, kBwdThreads, bwd_smem_bytes<D>(), stream>>>(a);
  } else {
    kernel<<<grid, kBwdThreads, bwd_smem_bytes<D>(), stream>>>(p);  // the BwdArgs part of p
  }
}

// The backward of head dim D on `stream`, from the forward's O, LSE and LSE_lo: the pre-pass
// (D_i, dQ_acc = 0), the main kernel (dK, dV; dQ_acc by atomics; its instantiation from the
// features) and dQ = scale dQ_acc. Launch errors are left for the caller's cudaGetLastError().
template <int D>
void launch_backward(const BwdParams& p, cudaStream_t stream) {
  const int64_t rows = int64_t(p.batch) * p.heads * p.seq_q, n = rows * D;
  // (D_i: the pre-pass writes it, the main kernel reads it through the const pointer.)
  backward_prepass_kernel<<<unsigned((rows + 255) / 256), 256, 0, stream>>>(
      p.dout, p.o, const_cast<float*>(p.dsum), p.dq_acc, rows, D);
  const bool drop = p.dropout_p > 0, sparse = p.blk_count != nullptr;
  if (drop && sparse)
    launch_backward_main<D, true, true>(p, stream);
  else if (drop)
    launch_backward_main<D, true, false>(p, stream);
  else if (sparse)
    launch_backward_main<D, false, true>(p, stream);
  else
    launch_backward_main<D, false, false>(p, stream);
  const int64_t blocks = (n + 255) / 256;  // a grid-stride loop: any count of blocks works
  backward_dq_kernel<<<unsigned(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(p.dq_acc, p.dq,
                                                                                    n, p.scale);
}

}  // namespace ladder::step05
