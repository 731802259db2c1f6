// Step 04 — one thread per query row, online softmax (CUDA, fp32).
// Adds: one fused kernel, one thread per query row; online softmax over keys streamed from
// global memory; q_i and the unnormalised O_i in registers (kernel templated on d); no S or P in
// memory: O(1) workspace.
//
// Where it sits: step 03 ran GEMM, softmax, GEMM as three kernels and parked S and P
// (B*H*M*N floats each) in HBM between them. This step fuses the three into one kernel by
// running step 02's one-pass recurrence on the GPU, one thread per query row i of one
// (batch, head): q_i, the running m_i and l_i and the unnormalised O_i (d floats) live in
// registers while the thread streams every visible key j (j <= i + N - M when causal,
// bottom-right) from global memory; one division at the end (notes/04_thread_per_row.md).
// S and P never exist anywhere: the workspace is O(1) (registers), and HBM sees Q, K, V read
// and O, LSE written. GQA: query head h reads K/V head h / (H / Hkv).
// Why it is still slow (notes/04_thread_per_row.md): the 32 threads of a warp read the same
// K_j, V_j element at the same time (a broadcast: coalescing is not the problem), but nothing
// is reused beyond the warp: every warp streams all of K and V of its head through L1/L2, a
// row's d-long dot product is one serial chain in one thread, the rescale costs a
// multiply per element per key, and there are only B*H*M threads. What the next step (05)
// fixes: a block of Br rows (Q_i) stages K_j, V_j tiles of Bc keys in shared memory once for
// all its rows (Tc = ceil(N / Bc) tiles), and rescales once per tile instead of once per key.
#include <cmath>
#include <string>

#include "fault.hpp"
#include "exercise.hpp"
#include "gpu_run.cuh"
#include "steps.hpp"

namespace ladder {
namespace {

constexpr int kThreads = 128;  // query rows per block, all of one (batch, head)
constexpr int kSumBlock = 32;  // keys per partial sum of l (the yardstick's, reference/plain.cpp)
// The head dims the kernel is instantiated for (it keeps q_i and O_i in registers).
using HeadDims = Dims<16, 32, 64, 96, 128, 256>;

struct Shape {  // what the kernel needs of the Problem (which is host-only)
  int64_t heads, heads_kv, seq_q, seq_k;
  bool causal;
  float scale;
};

// One thread per query row i of head h of batch b: grid (ceil(M / kThreads), H, B).
// No shared memory and no barriers, so a thread past the last row may simply return.
template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_row(const float* __restrict__ Q, const float* __restrict__ K,
                  const float* __restrict__ V, float* __restrict__ O, float* __restrict__ lse,
                  Shape s) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= s.seq_q) return;
  const int64_t b = blockIdx.z, h = blockIdx.y, hk = h / (s.heads / s.heads_kv);
  const int64_t row = (b * s.heads + h) * s.seq_q + i;
  const float* Kh = K + (b * s.heads_kv + hk) * s.seq_k * D;
  const float* Vh = V + (b * s.heads_kv + hk) * s.seq_k * D;
  // Bottom-right causal mask: keys 0 .. i + N - M are visible (none when that is negative).
  // (The fault build sees one key past the diagonal: common/fault.hpp.)
  const int64_t last = !s.causal ? s.seq_k - 1
                       : kFault  ? min(i + s.seq_k - s.seq_q + 1, s.seq_k - 1)
                                 : i + s.seq_k - s.seq_q;
  const int64_t n = last < 0 ? 0 : (last < s.seq_k ? last + 1 : s.seq_k);

  // Rows are D floats (D % 4 == 0) and cudaMalloc is 256-byte aligned: float4 loads are legal
  // and take a quarter of the load instructions.
  float q[D], o[D];
  const float* Qi = Q + row * D;
#pragma unroll
  for (int c = 0; c < D; c += 4) {
    const float4 x = *reinterpret_cast<const float4*>(Qi + c);
    q[c] = x.x, q[c + 1] = x.y, q[c + 2] = x.z, q[c + 3] = x.w;
  }
#pragma unroll
  for (int c = 0; c < D; ++c) o[c] = 0.f;
  float m = -INFINITY, l = 0.f;
  // l is summed in blocks of kSumBlock keys, as a tiled kernel's is: the update below sums one
  // block into l, and each block's sum is added to l_done, the blocks before, rescaled from the
  // max they were summed under (m_done; the factor is exactly 1 when the max held). One running
  // sum over 32k keys would lose about ten times more to rounding (notes/04_thread_per_row.md).
  float m_done = -INFINITY, l_done = 0.f;
  auto fold = [&] {
    l_done = (m_done == -INFINITY ? 0.f : l_done * expf(m_done - m)) + l;
    m_done = m, l = 0.f;
  };

  for (int64_t j = 0; j < n; ++j) {
    if (j % kSumBlock == 0) fold();
    // Every thread of the warp loads the same K_j: one broadcast per warp, not 32 reads.
    const float* Kj = Kh + j * D;
    float dot = 0.f;  // q_i . K_j, summed left to right as the plain loop does
#pragma unroll
    for (int c = 0; c < D; c += 4) {
      const float4 x = *reinterpret_cast<const float4*>(Kj + c);
      dot += q[c] * x.x;
      dot += q[c + 1] * x.y;
      dot += q[c + 2] * x.z;
      dot += q[c + 3] * x.w;
    }
    const float sij = s.scale * dot;
    // EXERCISE BEGIN online-update [hard]
    // Concept: the online-softmax rescale in one thread's registers: a running max, sum and
    // unnormalised output row that stay exact as the max grows.
    //
    // Invariant, over the keys folded so far: m is their largest score, l = sum of
    // exp(score - m) (over this block's keys: the loop moves l to l_done at each block's
    // start), o[0..D) = sum of exp(score - m) * V. Fold in key j (score sij, value
    // row Vh + j * D) so that it holds for one more key; V rows are 16-byte aligned (float4
    // loads). The first key arrives with m = -inf and must not make a NaN. No division here.
    const float m_new = fmaxf(m, sij);    // finite from the first key on
    const float alpha = expf(m - m_new);  // rescales what was summed under the old max (0 at j=0)
    const float pij = expf(sij - m_new);
    l = alpha * l + pij;
    const float* Vj = Vh + j * D;
#pragma unroll
    for (int c = 0; c < D; c += 4) {
      const float4 x = *reinterpret_cast<const float4*>(Vj + c);
      o[c] = alpha * o[c] + pij * x.x;
      o[c + 1] = alpha * o[c + 1] + pij * x.y;
      o[c + 2] = alpha * o[c + 2] + pij * x.z;
      o[c + 3] = alpha * o[c + 3] + pij * x.w;
    }
    m = m_new;
    // EXERCISE END
  }
  fold();
  l = l_done;

  // EXERCISE BEGIN finish-row [easy]
  // Concept: deferred normalisation: one division per row, after the last key, and the
  // convention for a row that saw no key.
  //
  // Write O_i (D floats at O + row * D, float4 stores) and lse[row] from m, l and o. l == 0
  // only when no key is visible: then O_i = 0 and LSE_i = -inf, never 0 * (1 / 0).
  const float inv_l = l > 0.f ? 1.f / l : 0.f;
  float* Oi = O + row * D;
#pragma unroll
  for (int c = 0; c < D; c += 4)
    *reinterpret_cast<float4*>(Oi + c) =
        make_float4(o[c] * inv_l, o[c + 1] * inv_l, o[c + 2] * inv_l, o[c + 3] * inv_l);
  lse[row] = l > 0.f ? m + logf(l) : -INFINITY;
  // EXERCISE END
}

template <int D>
void launch(dim3 grid, const float* Q, const float* K, const float* V, float* O, float* lse,
            const Shape& s) {
  attention_row<D><<<grid, kThreads>>>(Q, K, V, O, lse, s);
  CUDA_CHECK_LAUNCH();
}

RunResult run(const Problem& p, const Inputs& in, Outputs& out, const RunOptions& opt) {
  GpuRun<float> g(p, in, opt);
  const Shape s{p.heads, p.heads_kv, p.seq_q, p.seq_k, p.causal, float(p.softmax_scale())};
  const dim3 grid(unsigned((p.seq_q + kThreads - 1) / kThreads), unsigned(p.heads),
                  unsigned(p.batch));
  const float *q = g.q.get(), *k = g.k.get(), *v = g.v.get();
  float *o = g.o.get(), *l = g.lse.get();
  g.forward([&] {  // the instantiation for p.dim, one of HeadDims (the runner checked it)
    HeadDims::dispatch(p.dim,
                       [&](auto dim) { launch<decltype(dim)::value>(grid, q, k, v, o, l, s); });
  });
  g.result.workspace_bytes = 0;  // m_i, l_i, q_i and O_i live in registers
  g.result.config =
      "threads=" + std::to_string(kThreads) + " (1 query row each) d=" + std::to_string(p.dim);
  return g.finish(out);
}

}  // namespace

const Step& step_04() {
  static const Step s =
      StepBuilder(4, "04_thread_per_row", Device::cuda,
                  "one fused kernel, one thread per query row: online softmax over every visible "
                  "key, S and P never stored")
          .adds({"one fused kernel, one thread per query row",
                 "online softmax over keys streamed from global memory",
                 "q_i and the unnormalised O_i in registers (kernel templated on d)",
                 "no S or P in memory: O(1) workspace"})
          .dtypes({DType::f32})
          .head_dims(HeadDims())
          .max_sizes(kGridLimits.batch, kGridLimits.heads, 0)  // grid.z and grid.y
          .limits(
              "no workspace: q_i, O_i, m_i, l_i live in registers (d = 256 spills to local "
              "memory)")
          .variants(
              {{"thread-per-row", "one thread per query row streams K and V from global memory"}})
          .run(run);
  return s;
}

}  // namespace ladder
