// The plain same-precision computation that sets the harness's tolerance.
//
// The textbook algorithm in the step's precision, with no tricks: every dot product
// summed left to right (in float32 for fp32, fp16 and bf16; in float64 for fp64), softmax
// with the max shift, and, for fp16/bf16, S, P, O and each gradient product rounded to that
// type as a framework's matmuls would. A step passes when its error vs the float64 oracle is
// at most 2x (3x for gradients) this computation's error vs the oracle (docs/CONTRACT.md,
// "The harness"). Summation order matters: a blocked matrix product sums more accurately
// than a loop, so the yardstick is the loop every first implementation writes.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "dropout.hpp"
#include "oracle.hpp"

namespace ladder::reference {

namespace {

// F: the accumulation type (float, or double for a float64 step).
template <class F>
void plain(const Problem& p, const Inputs& in, DType precision, Outputs& out,
           const std::vector<int64_t>* rows) {
  const int64_t M = p.seq_q, N = p.seq_k, d = p.dim;
  const F scale = F(p.softmax_scale());
  auto r = [precision](F x) { return F(round_to(precision, double(x))); };
  const bool full = rows == nullptr;
  std::vector<int64_t> all;
  if (full)
    for (int64_t i = 0; i < M; ++i) all.push_back(i);
  const std::vector<int64_t>& sel = full ? all : *rows;
  const bool dropping = p.dropout > 0;
  const uint32_t thresh = dropout::threshold(p.dropout);
  const F inv_keep = F(1.0 / (1.0 - p.dropout));
  // The inputs hold values already rounded to `precision`: reading them as F is exact.
  // (Read in place: a sampled check of a large problem touches a few rows of Q and dO.)
  const double *Q = in.q.data.data(), *K = in.k.data.data(), *V = in.v.data.data();
  const double* dO = p.backward ? in.dout.data.data() : nullptr;
  std::vector<F> dK, dV;  // accumulators over every query row of the group
  if (p.backward && full)
    dK.assign(size_t(p.kv_numel()), F(0)), dV.assign(size_t(p.kv_numel()), F(0));
  // One batch and K/V head at a time: the groups write disjoint outputs (and dK, dV
  // accumulators), so they run on parallel threads (common/tensor.hpp); within a group the
  // query heads and rows go in order, so every sum is the one a single thread makes.
  const int64_t groups = p.batch * p.heads_kv;
  parallel_chunks(groups, parallel_chunk_count(groups, 1), [&](int, int64_t g0, int64_t g1) {
    std::vector<F> S(static_cast<size_t>(N)), P(static_cast<size_t>(N)), o(static_cast<size_t>(d));
    std::vector<F> q(static_cast<size_t>(d)), g(static_cast<size_t>(d));  // this row's Q, dO
    std::vector<F> q_acc(static_cast<size_t>(d));                         // its dQ
    std::vector<unsigned char> vis(static_cast<size_t>(N)), keep(static_cast<size_t>(N), 1);

    for (int64_t grp = g0; grp < g1; ++grp)
      for (int64_t h = grp % p.heads_kv * p.group(); h < (grp % p.heads_kv + 1) * p.group(); ++h) {
        const int64_t b = grp / p.heads_kv;
        const size_t kv0 = size_t((b * p.heads_kv + h / p.group()) * N * d);
        for (size_t k = 0; k < sel.size(); ++k) {
          const int64_t i = sel[k];
          const size_t row = size_t((b * p.heads + h) * M + i);  // in the inputs
          const size_t orow = size_t((b * p.heads + h) * int64_t(sel.size()) + int64_t(k));  // out
          for (int64_t c = 0; c < d; ++c) q[size_t(c)] = F(Q[row * size_t(d) + size_t(c)]);
          const int64_t n = p.visible_keys(i);  // the causal prefix; the block mask inside it
          for (int64_t j = 0; j < n; ++j) vis[size_t(j)] = in.mask.visible(b, h, i, j);
          if (dropping) dropout::keep_row(p.dropout_seed, thresh, b, h, i, n, keep.data());
          F m = -std::numeric_limits<F>::infinity(), l = 0;
          for (int64_t j = 0; j < n; ++j) {
            if (!vis[size_t(j)]) continue;
            F s = 0;
            for (int64_t c = 0; c < d; ++c) s += q[size_t(c)] * F(K[kv0 + size_t(j * d + c)]);
            S[size_t(j)] = r(scale * s);
            m = std::max(m, S[size_t(j)]);
          }
          for (int64_t j = 0; j < n; ++j)
            if (vis[size_t(j)]) l += std::exp(S[size_t(j)] - m);
          // P: the softmax (0 for hidden keys); o sums Pd V with Pd = P Z / (1 - p).
          for (int64_t j = 0; j < n; ++j)
            P[size_t(j)] = vis[size_t(j)] ? r(std::exp(S[size_t(j)] - m) / l) : F(0);
          // O_i = sum_j Pd_ij V_j: each column summed left to right in j (the j-outer loop
          // order only keeps the reads of V contiguous; the arithmetic is the same).
          std::fill(o.begin(), o.end(), F(0));
          for (int64_t j = 0; j < n; ++j) {
            if (!vis[size_t(j)] || !keep[size_t(j)]) continue;
            const F pd = dropping ? r(P[size_t(j)] * inv_keep) : P[size_t(j)];
            for (int64_t c = 0; c < d; ++c) o[size_t(c)] += pd * F(V[kv0 + size_t(j * d + c)]);
          }
          for (int64_t c = 0; c < d; ++c) {
            o[size_t(c)] = r(o[size_t(c)]);
            out.o.data[orow * size_t(d) + size_t(c)] = double(o[size_t(c)]);
          }
          out.lse.data[orow] =
              l == 0 ? -std::numeric_limits<double>::infinity() : double(m + std::log(l));
          if (!p.backward) continue;

          for (int64_t c = 0; c < d; ++c) g[size_t(c)] = F(dO[row * size_t(d) + size_t(c)]);
          F D = 0;
          for (int64_t c = 0; c < d; ++c) D += g[size_t(c)] * o[size_t(c)];
          for (int64_t j = 0; j < n;
               ++j) {  // dS_ij = P_ij (dP_ij - D_i), dP_ij = dO_i . V_j Z/(1-p)
            if (!vis[size_t(j)]) {
              S[size_t(j)] = 0;
              continue;
            }
            F dp = 0;
            if (keep[size_t(j)])
              for (int64_t c = 0; c < d; ++c) dp += g[size_t(c)] * F(V[kv0 + size_t(j * d + c)]);
            if (dropping) dp = dp * inv_keep;
            S[size_t(j)] = r(P[size_t(j)] * (r(dp) - D));  // S now holds dS
          }
          std::fill(q_acc.begin(), q_acc.end(), F(0));  // dQ_i = scale sum_j dS_ij K_j
          for (int64_t j = 0; j < n; ++j)
            for (int64_t c = 0; c < d; ++c)
              q_acc[size_t(c)] += S[size_t(j)] * F(K[kv0 + size_t(j * d + c)]);
          for (int64_t c = 0; c < d; ++c)
            out.dq.data[orow * size_t(d) + size_t(c)] = double(r(scale * q_acc[size_t(c)]));
          if (!full) continue;
          for (int64_t j = 0; j < n; ++j) {
            const F pd = !keep[size_t(j)] ? F(0)
                         : dropping       ? P[size_t(j)] * inv_keep
                                          : P[size_t(j)];
            for (int64_t c = 0; c < d; ++c) {
              dK[kv0 + size_t(j * d + c)] += scale * S[size_t(j)] * q[size_t(c)];
              dV[kv0 + size_t(j * d + c)] += pd * g[size_t(c)];
            }
          }
        }
      }
  });
  if (p.backward && full)
    for (size_t e = 0; e < dK.size(); ++e) {
      out.dk.data[e] = double(r(dK[e]));
      out.dv.data[e] = double(r(dV[e]));
    }
}

}  // namespace

void plain_attention(const Problem& p, const Inputs& in, DType precision, Outputs& out,
                     const std::vector<int64_t>* rows) {
  if (precision == DType::f64)
    plain<double>(p, in, precision, out, rows);
  else
    plain<float>(p, in, precision, out, rows);
}

}  // namespace ladder::reference
