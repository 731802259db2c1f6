// Step 01 — three-pass safe softmax attention (CPU, fp32).
// Adds: fp32; row by row; pass 1: max; pass 2: sum of exp(s - max); pass 3: normalize and P.V.
//
// Where it sits: the first rung after the float64 oracle (00). It computes the same
// O and LSE, in float32, one query row at a time: a row of scores S_i (N floats of
// workspace), then softmax written out as the three passes over that row a first
// implementation uses, each needing the previous one's result (notes/01_three_pass_softmax.md
// derives them).
// What it adds over 00: the max shift made explicit ("safe" softmax). The variant `unsafe`
// drops the shift and overflows to inf/NaN as soon as a logit passes ~88 (float32's exp
// limit).
// What the next step (02) fixes: three passes over S per row become one.
#include <cmath>
#include <limits>
#include <vector>

#include "exercise.hpp"
#include "step.hpp"
#include "steps.hpp"
#include "timing.hpp"

namespace ladder {
namespace {

// Keys per partial sum of l. A running fp32 sum of N terms loses about N unit roundoffs to
// rounding, blocks of 32 about 32 + N / 32: what a tiled kernel loses, and what the harness's
// yardstick (reference/plain.cpp) allows.
constexpr int64_t kSumBlock = 32;

void three_pass_attention(const Problem& p, const std::vector<float>& Q,
                          const std::vector<float>& K, const std::vector<float>& V, Outputs& out,
                          bool safe) {
  const int64_t M = p.seq_q, N = p.seq_k, d = p.dim;
  const float scale = float(p.softmax_scale());
  std::vector<float> S(static_cast<size_t>(N)), o(static_cast<size_t>(d));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t hk = h / p.group();  // GQA: the K/V head this query head reads
      const float* Kh = &K[size_t((b * p.heads_kv + hk) * N * d)];
      const float* Vh = &V[size_t((b * p.heads_kv + hk) * N * d)];
      for (int64_t i = 0; i < M; ++i) {
        const float* q = &Q[size_t(((b * p.heads + h) * M + i) * d)];
        const int64_t n = p.visible_keys(i);  // keys 0..n-1 are visible (causal: bottom-right)
        // EXERCISE BEGIN scores [easy]
        // Concept: one row of S = scale * Q K^T, over the keys this query can see.
        //
        // Fill S[0..n) with the scores of query row q against the keys of its K/V head (Kh, row
        // j at Kh + j * d). Where does `scale` go, and which keys does a causal row skip?
        for (int64_t j = 0; j < n; ++j) {
          float s = 0;
          for (int64_t c = 0; c < d; ++c) s += q[c] * Kh[j * d + c];
          S[size_t(j)] = scale * s;
        }
        // EXERCISE END
        float m = -std::numeric_limits<float>::infinity(), l = 0;
        std::fill(o.begin(), o.end(), 0.f);
        // EXERCISE BEGIN three-passes [medium]
        // Concept: safe softmax: a shift that keeps every exp finite without changing P, and
        // the row statistics m, l from which LSE = m + log l.
        //
        // From the n scores S[0..n) and the value rows V_j (Vh + j * d), leave o = the softmax-
        // weighted sum of the V_j (normalised: nothing divides it later) and m, l with
        // m + log l = log sum_j exp(S[j]). Exact for any finite logits, including ones in the
        // hundreds (the large_logits cases). The `unsafe` variant (safe == false) must skip the
        // shift: m = 0. A row with n == 0 leaves m = -inf, l = 0, o = 0 (LSE is written below).
        // Trap: one running fp32 sum over a thousand keys loses more to rounding than the
        // check allows; sum l as a tiled kernel does, kSumBlock keys at a time.
        for (int64_t j = 0; j < n; ++j) m = std::max(m, S[size_t(j)]);  // pass 1: the row max
        if (!safe) m = 0;                                               // unsafe: no shift
        for (int64_t j0 = 0; j0 < n; j0 += kSumBlock) {  // pass 2: l, a block of keys at a time
          float part = 0;
          for (int64_t j = j0; j < std::min(n, j0 + kSumBlock); ++j)
            part += std::exp(S[size_t(j)] - m);
          l += part;
        }
        for (int64_t j = 0; j < n; ++j) {  // pass 3: normalise, accumulate O = P V
          const float pij = std::exp(S[size_t(j)] - m) / l;
          for (int64_t c = 0; c < d; ++c) o[size_t(c)] += pij * Vh[j * d + c];
        }
        // EXERCISE END
        const int64_t row = (b * p.heads + h) * M + i;
        for (int64_t c = 0; c < d; ++c) out.o.data[size_t(row * d + c)] = o[size_t(c)];
        // No visible key: O = 0 (the loops above did nothing) and LSE = -inf.
        out.lse.data[size_t(row)] =
            n == 0 ? -std::numeric_limits<double>::infinity() : double(m + std::log(l));
      }
    }
}

}  // namespace

const Step& step_01() {
  static const Step s =
      StepBuilder(1, "01_three_pass_softmax", Device::cpu,
                  "safe softmax in 3 passes per row (max, sum, normalize), fp32")
          .adds({"fp32", "row by row", "pass 1: max", "pass 2: sum of exp(s - max)",
                 "pass 3: normalize and P.V"})
          .dtypes({DType::f32})
          .limits("workspace: one row of S (seq_k floats)")
          .variants(
              {{"safe", "subtract the row max before exp (exact for any finite logits)", true},
               {"unsafe",
                "no max shift: exp overflows to inf and P to NaN once a logit exceeds ~88", false}})
          .workspace([](const Problem& p, const RunOptions&) {
            return 4.0 * double(p.seq_k) +
                   4.0 * double(p.q_numel() + 2 * p.kv_numel());  // + fp32 copies
          })
          .run([](const Problem& p, const Inputs& in, Outputs& out, const RunOptions& opt) {
            const std::vector<float> Q = to_float(in.q), K = to_float(in.k), V = to_float(in.v);
            const bool safe = opt.variant != "unsafe";
            RunResult r;
            r.fwd_ms = time_cpu_ms([&] { three_pass_attention(p, Q, K, V, out, safe); },
                                   opt.repeats, opt.warmup);
            r.workspace_bytes = double(p.seq_k) * sizeof(float);
            return r;
          });
  return s;
}

}  // namespace ladder
