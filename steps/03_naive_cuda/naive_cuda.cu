// Step 03 — naive CUDA: GEMM, softmax, GEMM as separate kernels (CUDA, fp32).
// Adds: CUDA kernels, one thread per output element; one batched matmul kernel for every
// product (strides, transposes, GQA); S and P materialised in global memory (B*H*M*N floats
// each); a softmax kernel: a warp per row, three passes, LSE; backward: D = rowsum(dO o O), dP,
// dS = P o (dP - D), dQ, dK, dV; block masks and dropout applied element by element to the
// materialised S and P.
//
// Where it sits: the first GPU rung, the port of step 01 that a first CUDA implementation
// writes (and what a framework's "math" attention does): attention is just GEMM, softmax, GEMM,
// each a kernel of its own, talking through global memory.
//   forward:   S = scale * Q K^T               batched_matmul  (S: B*H*M*N floats in HBM)
//              P = softmax(S), LSE               softmax_rows    (P: B*H*M*N floats in HBM),
//                                                step 01's three passes, a warp per row
//              O = P V                           batched_matmul
//   backward:  the pre-pass D                    row_dot
//              four products: dV, dP, dQ, dK     batched_matmul  (dP into S's buffer: S is dead)
//              dS from P, dP and D               ds_from_dp      (in place over dP)
//   notes/00_cpu_reference.md derives the backward, notes/03_naive_cuda.md maps it to kernels.
// The causal mask (key j visible to query i iff j <= i + N - M) is a prefix of each row, so
// the softmax kernel reads only the visible S_ij: masked keys count as S_ij = -inf, P_ij = 0.
// GQA: query head h reads K/V head h / group; dK and dV of a K/V head sum the products of its
// group's query heads inside one thread's loop (no atomics).
// Block masks and dropout, the naive way: the softmax kernel looks up every S_ij's mask
// block (a hidden key is one more masked key: P_ij = 0); with dropout a kernel writes
// Pd = P o Z / (1 - p) into S's buffer (S is dead by then), O = Pd V, and the backward
// regenerates Z_ij per element (common/dropout.hpp). Nothing is skipped: every masked block is
// still computed and thrown away, the cost this step's memory lesson is about.
// What it costs: S and P are B*H*M*N floats each, 32 GiB at B=1, H=16, M=N=16384, and every
// element crosses HBM four times (S written, read; P written, read): see
// notes/03_naive_cuda.md. What the next step (04) fixes: one fused kernel with step 02's
// online softmax, so S and P never leave the chip and the workspace is O(1).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "fault.hpp"
#include "dropout.hpp"
#include "exercise.hpp"
#include "gpu_run.cuh"
#include "steps.hpp"

namespace ladder {
namespace {

constexpr int kThreads = 256;  // per block, every kernel here
constexpr int kWarp = 32;

// The problem's shape and masks as the kernels see them (Problem itself is host-only).
struct Shape {
  int64_t batch, heads, heads_kv, seq_q, seq_k, dim;
  bool causal;
  // Block mask (null: dense): [mask_batch, mask_heads, q_blocks, k_blocks] bytes, 1 = kept.
  const uint8_t* mask;
  int64_t mask_batch, mask_heads, q_blocks, k_blocks, block_q, block_k;
  // Dropout (drop = false: none): Z_ij from common/dropout.hpp, kept values scaled by keep_scale.
  bool drop;
  uint64_t seed;
  uint32_t thresh;
  float keep_scale;
  // Bottom-right causal mask: query i sees keys 0 .. i + N - M (clamped to [0, N]).
  __device__ int64_t visible_keys(int64_t i) const {
    if (!causal) return seq_k;
    const int64_t last = i + seq_k - seq_q;
    return last < 0 ? 0 : (last + 1 < seq_k ? last + 1 : seq_k);
  }
  // Whether the block mask keeps key j for query i of row `row` = (b * heads + h) * M + i.
  __device__ bool kept_block(int64_t row, int64_t j) const {
    if (!mask) return true;
    const int64_t i = row % seq_q, bh = row / seq_q, b = bh / heads, h = bh % heads;
    const int64_t mb = mask_batch == 1 ? 0 : b, mh = mask_heads == 1 ? 0 : h;
    return mask[((mb * mask_heads + mh) * q_blocks + i / block_q) * k_blocks + j / block_k] != 0;
  }
  // Z_ij / (1 - p) for element (row, j): 0 or keep_scale (1 without dropout).
  __device__ float dropout_factor(int64_t row, int64_t j) const {
    if (!drop) return 1.f;
    const int64_t i = row % seq_q, bh = row / seq_q;
    return dropout::keep(seed, thresh, bh / heads, bh % heads, i, j) ? keep_scale : 0.f;
  }
};

// One operand of a batched product, as strides: element (r, k) of the matrix that query head
// h of batch b uses is  data[b*batch + (h / head_div)*head + r*row + k*col].
// Transposing swaps row and col; GQA is head_div = group (K/V heads shared by a group).
struct Operand {
  const float* data;
  int64_t batch, head, row, col, head_div;
  __device__ const float* at(int64_t b, int64_t h) const {
    return data + b * batch + (h / head_div) * head;
  }
};

// A [batch, heads, rows, cols] row-major tensor with one matrix per query head (Q, O, dO, S, P).
Operand per_query_head(const float* x, const Shape& s, int64_t rows, int64_t cols) {
  return {x, s.heads * rows * cols, rows * cols, cols, 1, 1};
}
// The same with one matrix per K/V head, read by all the query heads of its group (K, V).
Operand per_kv_head(const float* x, const Shape& s, int64_t rows, int64_t cols) {
  return {x, s.heads_kv * rows * cols, rows * cols, cols, 1, s.heads / s.heads_kv};
}
Operand transposed(Operand o) {
  std::swap(o.row, o.col);
  return o;
}

// C[b, hc] = alpha * sum_{t < T} A[b, h] B[b, h], h = hc*T + t: every product of this step.
// One thread per element C(r, c), a plain loop over the reduction index k, summed left to
// right. T = 1 except for dK and dV, where the output head is a K/V head and the T = group
// query heads that read it are summed in the same loop. Consecutive threads take consecutive
// columns c, so reads of B are coalesced when B's columns are contiguous (O = PV, dQ = dS K,
// dK, dV) and strided by d floats when B is a transposed K or V (S = QK^T, dP = dO V^T).
__global__ void __launch_bounds__(kThreads)
    batched_matmul(Operand A, Operand B, float* __restrict__ C, int64_t batch, int64_t heads_c,
                   int64_t R, int64_t Cn, int64_t K, int64_t T, float alpha) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= batch * heads_c * R * Cn) return;
  const int64_t c = idx % Cn, r = (idx / Cn) % R, z = idx / (Cn * R);
  const int64_t b = z / heads_c, hc = z % heads_c;
  float acc = 0.f;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t h = hc * T + t;
    const float* a = A.at(b, h) + r * A.row;  // walks row r of A
    const float* x = B.at(b, h) + c * B.col;  // walks column c of B
    for (int64_t k = 0; k < K; ++k, a += A.col, x += B.row) acc += *a * *x;
  }
  C[idx] = alpha * acc;
}

__device__ float warp_max(float x) {
  for (int o = kWarp / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ float warp_sum(float x) {
  for (int o = kWarp / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Step 01's three passes over one row of S per warp: the 32 lanes stride the row (coalesced)
// and combine their partial max and sum with shuffles. Writes the whole row of P (zeros for
// masked keys) and LSE_i. A row with no visible key: m = -inf, l = 0, P = 0, LSE = -inf.
__global__ void __launch_bounds__(kThreads)
    softmax_rows(const float* __restrict__ S, float* __restrict__ P, float* __restrict__ lse,
                 Shape s) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= s.batch * s.heads * s.seq_q) return;  // the whole warp leaves together
  const int64_t N = s.seq_k, n = s.visible_keys(row % s.seq_q);
  const float* Si = S + row * N;
  float* Pi = P + row * N;
  // A key the block mask hides reads as S_ij = -inf, like a causally masked one.
  auto score = [&](int64_t j) { return s.kept_block(row, j) ? Si[j] : -INFINITY; };
  float m = -INFINITY, l = 0.f;
  // EXERCISE BEGIN softmax-row [medium]
  // Concept: a row reduction spread over a warp: each lane takes every 32nd element, and
  // shuffles combine the 32 partial results (here the max and the sum of step 01's passes).
  //
  // The row's scores are score(j) for the n visible keys j < n (a hidden block reads -inf).
  // Write the whole row of P: P_ij for j < n and 0 for every masked key in [n, N), and leave m
  // and l (the same in all 32 lanes) for the LSE line below. warp_max and warp_sum combine the
  // lanes. A row with nothing visible keeps m = -inf, l = 0: never compute exp(-inf - -inf).
  for (int64_t j = lane; j < n; j += kWarp) m = fmaxf(m, score(j));  // pass 1: the row max
  m = warp_max(m);
  // pass 2: l_i = sum_j exp(S_ij - m_i); m = -inf when nothing is visible: l stays 0
  if (m != -INFINITY)
    for (int64_t j = lane; j < n; j += kWarp) l += expf(score(j) - m);
  l = warp_sum(l);
  for (int64_t j = lane; j < N; j += kWarp)  // pass 3: normalise (masked keys: P_ij = 0)
    Pi[j] = j < n && l > 0.f ? expf(score(j) - m) / l : 0.f;
  // EXERCISE END
  if (lane == 0) lse[row] = l > 0.f ? m + logf(l) : -INFINITY;
}

// D, the backward's pre-pass: one thread per row, O(B*H*M*d) work: negligible.
__global__ void __launch_bounds__(kThreads)
    row_dot(const float* __restrict__ dO, const float* __restrict__ O, float* __restrict__ D,
            int64_t rows, int64_t d) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  // EXERCISE BEGIN row-dot [medium]
  // Concept: the softmax backward's row term D_i = sum_j P_ij dP_ij, computed without P or dP.
  //
  // D[row] must equal sum_j P_ij dP_ij for this row, but this kernel sees only dO and O (rows
  // of d floats at row * d). Why is that enough? The trap: where a row sees one key, P = 1
  // and O_i = V_j exactly, so dP_ij - D_i must come out exactly 0 (the seq1 cases), which
  // holds only if D is summed in the same order, with the same operations, as batched_matmul
  // sums dP_ij.
  float acc = 0.f;
  for (int64_t c = 0; c < d; ++c) acc += dO[row * d + c] * O[row * d + c];
  D[row] = acc;
  // EXERCISE END
}

// Pd = P o Z / (1 - p): dropout applied to the materialised P (into another buffer: the
// backward needs both).
__global__ void __launch_bounds__(kThreads)
    apply_dropout(const float* __restrict__ P, float* __restrict__ Pd, int64_t n_elems, Shape s) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_elems) return;
  Pd[idx] = P[idx] * s.dropout_factor(idx / s.seq_k, idx % s.seq_k);
}

// dS from P, dP and D, in place over dP (each element read, then written, by one thread). No
// mask test: a masked key's dS comes out 0 by itself.
__global__ void __launch_bounds__(kThreads)
    ds_from_dp(const float* __restrict__ P, const float* __restrict__ D, float* dP_dS,
               int64_t n_elems, Shape s) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_elems) return;
  const int64_t row = idx / s.seq_k;
  // EXERCISE BEGIN ds-from-dp [easy]
  // Concept: the softmax backward, dS = P o (dP - D), with dropout's Z / (1 - p) on dP.
  //
  // Element idx is (row, key idx % seq_k). dP_dS[idx] holds dP_ij = dO_i . V_j (no dropout
  // applied yet), P[idx] the softmax probability, D[row] the row term. With dropout, dP must
  // first be multiplied by this element's Z / (1 - p): s.dropout_factor(row, key). Overwrite
  // dP_dS[idx] with dS.
  dP_dS[idx] = P[idx] * (dP_dS[idx] * s.dropout_factor(row, idx % s.seq_k) - D[row]);
  // EXERCISE END
}

unsigned blocks_for(int64_t threads) {
  return unsigned((threads + kThreads - 1) / kThreads);
}

// C = alpha * sum_t A B over R x Cn outputs per (batch, output head), reduction length K.
void matmul(const Operand& A, const Operand& B, float* C, int64_t batch, int64_t heads_c, int64_t R,
            int64_t Cn, int64_t K, int64_t T, float alpha) {
  batched_matmul<<<blocks_for(batch * heads_c * R * Cn), kThreads>>>(A, B, C, batch, heads_c, R, Cn,
                                                                     K, T, alpha);
  CUDA_CHECK_LAUNCH();
}

// Workspace: S and P (B*H*M*N floats each; the backward puts dP, then dS, in S's buffer), the
// block mask's bytes, and the backward's D (B*H*M floats).
double workspace_bytes(const Problem& p) {
  const double mn = double(p.rows()) * double(p.seq_k);
  return 4.0 * (2.0 * mn + (p.backward ? double(p.rows()) : 0.0)) +
         (p.sparsity.active() ? double(p.batch * p.heads * p.q_blocks() * p.k_blocks()) : 0.0);
}

RunResult run(const Problem& p, const Inputs& in, Outputs& out, const RunOptions& opt) {
  const int64_t B = p.batch, H = p.heads, Hkv = p.heads_kv, M = p.seq_q, N = p.seq_k, d = p.dim;
  const int64_t group = p.group(), rows = p.rows(), mn = rows * N;  // mn: elements of S (and P)
  const float scale = float(p.softmax_scale() * (kFault ? 1.005 : 1.0));  // fault build: 0.5 % off
  GpuRun<float> g(p, in, opt);
  DeviceBuffer<float> S{size_t(mn)}, P{size_t(mn)};  // the workspace this step is about
  DeviceBuffer<uint8_t> mask{in.mask.keep.size()};
  if (!in.mask.empty()) mask.upload(in.mask.keep);
  const BlockMask& bm = in.mask;
  const bool drop = p.dropout > 0;
  const Shape s{B,
                H,
                Hkv,
                M,
                N,
                d,
                p.causal,
                bm.empty() ? nullptr : mask.get(),
                bm.batch,
                bm.heads,
                bm.q_blocks,
                bm.k_blocks,
                bm.block_q,
                bm.block_k,
                drop,
                p.dropout_seed,
                dropout::threshold(p.dropout),
                float(1.0 / (1.0 - p.dropout))};
  // With dropout, Pd = P o Z / (1 - p) lives in S's buffer (S is dead once P exists).
  float* Pd = drop ? S.get() : P.get();

  g.forward([&] {
    matmul(per_query_head(g.q.get(), s, M, d), transposed(per_kv_head(g.k.get(), s, N, d)), S.get(),
           B, H, M, N, d, 1, scale);  // S = scale Q K^T
    softmax_rows<<<blocks_for(rows * kWarp), kThreads>>>(S.get(), P.get(), g.lse.get(), s);
    CUDA_CHECK_LAUNCH();
    if (drop) {
      apply_dropout<<<blocks_for(mn), kThreads>>>(P.get(), Pd, mn, s);
      CUDA_CHECK_LAUNCH();
    }
    matmul(per_query_head(Pd, s, M, N), per_kv_head(g.v.get(), s, N, d), g.o.get(), B, H, M, d, N,
           1, 1.f);  // O = Pd V
  });
  g.result.workspace_bytes = workspace_bytes(p);
  g.result.config = "matmul: 1 output/thread, " + std::to_string(kThreads) +
                    " threads/block; softmax: 1 warp/row";

  if (p.backward) {
    DeviceBuffer<float> D{size_t(rows)};
    float* dS = S.get();  // dP, then dS, live where S (or Pd) was
    g.backward([&] {
      row_dot<<<blocks_for(rows), kThreads>>>(g.dout.get(), g.o.get(), D.get(), rows, d);
      CUDA_CHECK_LAUNCH();
      if (drop) {  // Pd again: the previous repetition left dS in its buffer
        apply_dropout<<<blocks_for(mn), kThreads>>>(P.get(), Pd, mn, s);
        CUDA_CHECK_LAUNCH();
      }
      // EXERCISE BEGIN backward-products [hard]
      // Concept: the attention backward as four matrix products and one elementwise kernel;
      // a transpose as swapped strides; GQA's dK and dV summed over a group; buffer reuse.
      //
      // D is ready (row_dot) and so is Pd (the dropped P, = P without dropout). Compute dV,
      // dP (into dS's buffer), dS (ds_from_dp, in place), dQ and dK into g.dv, g.dq, g.dk, with
      // matmul(A, B, C, batch, heads_c, R, Cn, K, T, alpha) and the operands per_query_head,
      // per_kv_head and transposed (see batched_matmul). A K/V head's dK and dV sum the T =
      // group query heads that read it. With dropout Pd lives in dS's buffer: which product
      // must read it before dP overwrites it? Where does the softmax scale enter?
      matmul(transposed(per_query_head(Pd, s, M, N)), per_query_head(g.dout.get(), s, M, d),
             g.dv.get(), B, Hkv, N, d, M, group, 1.f);  // dV = Pd^T dO, summed over the group
      matmul(per_query_head(g.dout.get(), s, M, d), transposed(per_kv_head(g.v.get(), s, N, d)), dS,
             B, H, M, N, d, 1, 1.f);  // dP = dO V^T (over Pd: dV has used it)
      ds_from_dp<<<blocks_for(mn), kThreads>>>(P.get(), D.get(), dS, mn, s);
      CUDA_CHECK_LAUNCH();
      matmul(per_query_head(dS, s, M, N), per_kv_head(g.k.get(), s, N, d), g.dq.get(), B, H, M, d,
             N, 1, scale);  // dQ = scale dS K
      matmul(transposed(per_query_head(dS, s, M, N)), per_query_head(g.q.get(), s, M, d),
             g.dk.get(), B, Hkv, N, d, M, group, scale);  // dK = scale dS^T Q, summed over group
      // EXERCISE END
    });
  }
  return g.finish(out);
}

}  // namespace

const Step& step_03() {
  static const Step s =
      StepBuilder(3, "03_naive_cuda", Device::cuda,
                  "the first GPU port: S = scale QK^T, softmax and O = PV as separate kernels "
                  "through global memory; naive backward")
          .adds({"CUDA kernels, one thread per output element",
                 "one batched matmul kernel for every product (strides, transposes, GQA)",
                 "S and P materialised in global memory (B*H*M*N floats each)",
                 "a softmax kernel: a warp per row, three passes, LSE",
                 "backward: D = rowsum(dO o O), dP, dS = P o (dP - D), dQ, dK, dV",
                 "block masks and dropout applied element by element to the materialised S and P"})
          .dtypes({DType::f32})
          .backward()
          .dropout()
          .block_sparse()
          .limits(
              "workspace 2 x batch*heads*seq_q*seq_k floats (S and P; the backward reuses S's "
              "buffer for dP and dS), refused (exit 2) when it would not fit in free device "
              "memory; masked blocks are computed and then thrown away")
          .variants({{"naive", "GEMM, softmax, GEMM: one kernel each, S and P in global memory"}})
          .workspace([](const Problem& p, const RunOptions&) { return workspace_bytes(p); })
          .run(run);
  return s;
}

}  // namespace ladder
