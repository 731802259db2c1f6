// The plain same-precision computation that sets the harness's tolerance.
//
// The textbook algorithm in the step's precision, with no tricks: every dot product
// summed left to right in float32, softmax with the max shift, and, for fp16/bf16,
// S, P, O and each gradient product rounded to that type as a framework's matmuls
// would. A step passes when its error vs the float64 oracle is at most 2x (3x for
// gradients) this computation's error vs the oracle (LADDER.md, "The harness").
// Summation order matters in float32: a blocked matrix product sums more accurately
// than a loop, so the yardstick is the loop every first implementation writes.
#include <cmath>
#include <limits>
#include <vector>

#include "reference.hpp"

namespace ladder::reference {

void plain_attention(const Problem& p, const Inputs& in, DType precision, Outputs& out,
                     const std::vector<int64_t>* rows) {
  const int64_t M = p.seq_q, N = p.seq_k, d = p.dim;
  const float scale = float(p.softmax_scale());
  auto r = [precision](float x) { return float(round_to(precision, x)); };
  const bool full = rows == nullptr;
  std::vector<int64_t> all;
  if (full)
    for (int64_t i = 0; i < M; ++i) all.push_back(i);
  const std::vector<int64_t>& sel = full ? all : *rows;
  const std::vector<float> Q = to_float(in.q), K = to_float(in.k), V = to_float(in.v);
  const std::vector<float> dO = p.backward ? to_float(in.dout) : std::vector<float>();
  std::vector<float> dK, dV;  // float accumulators over every query row of the group
  if (p.backward && full)
    dK.assign(size_t(p.kv_numel()), 0.f), dV.assign(size_t(p.kv_numel()), 0.f);
  std::vector<float> S(static_cast<size_t>(N)), P(static_cast<size_t>(N)),
      o(static_cast<size_t>(d));

  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h) {
      const size_t kv0 = size_t((b * p.heads_kv + h / p.group()) * N * d);
      for (int64_t i : sel) {
        const size_t row = size_t((b * p.heads + h) * M + i);
        const float* q = &Q[row * size_t(d)];
        const int64_t n = p.visible_keys(i);
        float m = -std::numeric_limits<float>::infinity(), l = 0;
        for (int64_t j = 0; j < n; ++j) {
          float s = 0;
          for (int64_t c = 0; c < d; ++c) s += q[c] * K[kv0 + size_t(j * d + c)];
          S[size_t(j)] = r(scale * s);
          m = std::max(m, S[size_t(j)]);
        }
        for (int64_t j = 0; j < n; ++j) l += std::exp(S[size_t(j)] - m);
        for (int64_t j = 0; j < n; ++j) P[size_t(j)] = r(std::exp(S[size_t(j)] - m) / l);
        for (int64_t c = 0; c < d; ++c) {
          float acc = 0;
          for (int64_t j = 0; j < n; ++j) acc += P[size_t(j)] * V[kv0 + size_t(j * d + c)];
          o[size_t(c)] = r(acc);
          out.o.data[row * size_t(d) + size_t(c)] = o[size_t(c)];
        }
        out.lse.data[row] =
            n == 0 ? -std::numeric_limits<double>::infinity() : double(m + std::log(l));
        if (!p.backward) continue;

        const float* g = &dO[row * size_t(d)];
        float D = 0;
        for (int64_t c = 0; c < d; ++c) D += g[c] * o[size_t(c)];
        for (int64_t j = 0; j < n; ++j) {  // dS_ij = P_ij (dP_ij - D_i), dP_ij = dO_i . V_j
          float dp = 0;
          for (int64_t c = 0; c < d; ++c) dp += g[c] * V[kv0 + size_t(j * d + c)];
          S[size_t(j)] = r(P[size_t(j)] * (r(dp) - D));  // S now holds dS
        }
        for (int64_t c = 0; c < d; ++c) {
          float acc = 0;
          for (int64_t j = 0; j < n; ++j) acc += S[size_t(j)] * K[kv0 + size_t(j * d + c)];
          out.dq.data[row * size_t(d) + size_t(c)] = r(scale * acc);
        }
        if (!full) continue;
        for (int64_t j = 0; j < n; ++j)
          for (int64_t c = 0; c < d; ++c) {
            dK[kv0 + size_t(j * d + c)] += scale * S[size_t(j)] * q[c];
            dV[kv0 + size_t(j * d + c)] += P[size_t(j)] * g[c];
          }
      }
    }
  if (p.backward && full)
    for (size_t e = 0; e < dK.size(); ++e) {
      out.dk.data[e] = r(dK[e]);
      out.dv.data[e] = r(dV[e]);
    }
}

}  // namespace ladder::reference
