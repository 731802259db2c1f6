// The yardstick: a correct kernel of the step's precision class, written as plain loops.
//
// A step passes when its error vs the float64 oracle is at most 2x (3x for gradients) this
// computation's error vs the oracle, plus one unit roundoff of the output's scale
// (docs/CONTRACT.md, "The harness"). So the yardstick must make the errors a *correct* kernel
// of that class makes, and no more:
//  - inputs are the values the kernel sees (already rounded to the dtype by the caller);
//  - S = scale * QK^T, the row max m, the sum l and LSE = m + log l are fp32 (float64 for a
//    float64 step): every tensor-core rung keeps S in fp32 accumulators and stores LSE as fp32;
//  - the unnormalised weights exp(S - m) are rounded to the dtype before they multiply V
//    (the mma/wgmma operand), summed in fp32, divided by l once, and O is rounded to the dtype;
//  - backward as FlashAttention-2 computes it: D = rowsum(dO o O) from the stored O,
//    P = exp(S - LSE) in fp32, dS = P o (dP - D) in fp32; P and dS rounded to the dtype
//    before the products dV = P^T dO, dQ = dS K, dK = dS^T Q, which sum in fp32; the
//    gradients rounded to the dtype once.
//  - the row sum l is blocked as a tiled kernel's is: the weights of each run of kSumBlock
//    keys summed left to right, those partial sums added to l in order. Summed left to right
//    over all keys instead, l loses about seq_k unit roundoffs to swamping (1e-4 in LSE at
//    seq_k 16384, most of the tolerance), and a kernel whose LSE drifts with the number of
//    tiles would pass; blocked, it loses about kSumBlock + seq_k / kSumBlock.
// For fp32 and float64 the roundings to the dtype are no-ops: the class is "every value in
// that precision". The other sums (S over d, O and dQ over keys, dK and dV over query rows)
// run left to right, as the fp32 rungs accumulate O key by key; in the 16-bit rungs the
// rounding of the stored result dominates those (docs/CONTRACT.md, "The harness").
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "dropout.hpp"
#include "oracle.hpp"

namespace ladder::reference {

namespace {

// Keys per partial sum of l: the smallest key tile of the tiled rungs (step 05's row-per-thread
// kernel and step 04's blocks of keys), so that every rung's l is at least this blocked.
constexpr int64_t kSumBlock = 32;

// The yardstick's arithmetic that plain() and plain_columns() share: the problem's constants,
// a value rounded as the kernel stores it in the dtype (an mma operand or an output), and the
// backward of one score, which both must compute alike.
template <class F>
struct Arith {
  DType precision;
  F scale, inv_keep;
  bool dropping;
  uint32_t thresh;
  Arith(const Problem& p, DType t)
      : precision(t),
        scale(F(p.softmax_scale())),
        inv_keep(F(1.0 / (1.0 - p.dropout))),
        dropping(p.dropout > 0),
        thresh(dropout::threshold(p.dropout)) {}
  F round(F x) const { return F(round_to(precision, double(x))); }
  // From S_ij (scale q.k in F), LSE_i, dov = dO_i . V_j (0 for a dropped key) and D_i: the dS
  // operand of dQ and dK, dS = P (dP - D), and the P operand of dV, P Z / (1 - p), both rounded.
  void backward(F S, F lse, F dov, bool keep, F D, F& dS, F& Pd) const {
    const F P = std::exp(S - lse);
    const F dp = dropping ? dov * inv_keep : dov;  // dP_ij = dO_i . V_j Z_ij / (1 - p)
    dS = round(P * (dp - D));
    Pd = !keep ? F(0) : round(dropping ? P * inv_keep : P);
  }
};

// F: the accumulation type (float, or double for a float64 step).
template <class F>
void plain(const Problem& p, const Inputs& in, DType precision, Outputs& out,
           const std::vector<int64_t>* rows) {
  const int64_t M = p.seq_q, N = p.seq_k, d = p.dim;
  const Arith<F> a(p, precision);
  const F scale = a.scale;
  auto r = [&a](F x) { return a.round(x); };
  const bool full = rows == nullptr;
  std::vector<int64_t> all;
  if (full)
    for (int64_t i = 0; i < M; ++i) all.push_back(i);
  const std::vector<int64_t>& sel = full ? all : *rows;
  const bool dropping = a.dropping;
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
    std::vector<F> S(static_cast<size_t>(N)), dS(static_cast<size_t>(N));
    std::vector<F> o(static_cast<size_t>(d)), q(static_cast<size_t>(d)), g(static_cast<size_t>(d)),
        q_acc(static_cast<size_t>(d));  // O, Q, dO and dQ of a row
    std::vector<unsigned char> vis(static_cast<size_t>(N)), keep(static_cast<size_t>(N), 1);
    auto kv = [&](size_t kv0, int64_t j, int64_t c) { return kv0 + size_t(j * d + c); };

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
          if (dropping) dropout::keep_row(p.dropout_seed, a.thresh, b, h, i, n, keep.data());

          // Forward. S and its statistics in F; the weights rounded as the P.V operand.
          F m = -std::numeric_limits<F>::infinity(), l = 0;
          for (int64_t j = 0; j < n; ++j) {
            if (!vis[size_t(j)]) continue;
            F s = 0;
            for (int64_t c = 0; c < d; ++c) s += q[size_t(c)] * F(K[kv(kv0, j, c)]);
            S[size_t(j)] = scale * s;
            m = std::max(m, S[size_t(j)]);
          }
          std::fill(o.begin(), o.end(), F(0));
          F part = 0;  // l's partial sum over the current block of kSumBlock keys
          for (int64_t j = 0; j < n; ++j) {
            if (j % kSumBlock == 0) l += part, part = 0;
            if (!vis[size_t(j)]) continue;
            const F e = std::exp(S[size_t(j)] - m);
            part += e;
            if (!keep[size_t(j)]) continue;
            const F w = r(e);  // O_i = sum_j w_ij V_j / l_i (/ (1 - p) with dropout)
            for (int64_t c = 0; c < d; ++c) o[size_t(c)] += w * F(V[kv(kv0, j, c)]);
          }
          l += part;
          const F norm = l == 0 ? F(0) : (dropping ? a.inv_keep : F(1)) / l;
          for (int64_t c = 0; c < d; ++c) {
            o[size_t(c)] = r(o[size_t(c)] * norm);
            out.o.data[orow * size_t(d) + size_t(c)] = double(o[size_t(c)]);
          }
          const F lse = l == 0 ? -std::numeric_limits<F>::infinity() : m + std::log(l);
          out.lse.data[orow] = double(lse);
          if (!p.backward) continue;

          // Backward: D from the stored O; P recomputed from LSE; dS in F.
          for (int64_t c = 0; c < d; ++c) g[size_t(c)] = F(dO[row * size_t(d) + size_t(c)]);
          F D = 0;
          for (int64_t c = 0; c < d; ++c) D += g[size_t(c)] * o[size_t(c)];
          for (int64_t j = 0; j < n; ++j) {
            if (!vis[size_t(j)]) {
              S[size_t(j)] = dS[size_t(j)] = 0;
              continue;
            }
            F dov = 0;
            if (keep[size_t(j)])
              for (int64_t c = 0; c < d; ++c) dov += g[size_t(c)] * F(V[kv(kv0, j, c)]);
            // S now holds the P operand of dV.
            a.backward(S[size_t(j)], lse, dov, keep[size_t(j)], D, dS[size_t(j)], S[size_t(j)]);
          }
          std::fill(q_acc.begin(), q_acc.end(), F(0));  // dQ_i = scale sum_j dS_ij K_j
          for (int64_t j = 0; j < n; ++j)
            for (int64_t c = 0; c < d; ++c) q_acc[size_t(c)] += dS[size_t(j)] * F(K[kv(kv0, j, c)]);
          for (int64_t c = 0; c < d; ++c)
            out.dq.data[orow * size_t(d) + size_t(c)] = double(r(scale * q_acc[size_t(c)]));
          if (!full) continue;
          for (int64_t j = 0; j < n; ++j)
            for (int64_t c = 0; c < d; ++c) {
              dK[kv(kv0, j, c)] += scale * dS[size_t(j)] * q[size_t(c)];
              dV[kv(kv0, j, c)] += S[size_t(j)] * g[size_t(c)];
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

// The yardstick's dK, dV on the key rows `keys` (plain_key_columns).
template <class F>
void plain_columns(const Problem& p, const Inputs& in, DType precision,
                   const std::vector<int64_t>& keys, const Outputs& rows, Outputs& out) {
  const int64_t M = p.seq_q, R = int64_t(keys.size()), d = p.dim;
  const Arith<F> a(p, precision);
  const double *Q = in.q.data.data(), *K = in.k.data.data(), *V = in.v.data.data(),
               *dO = in.dout.data.data();
  const int64_t groups = p.batch * p.heads_kv;
  parallel_chunks(groups, parallel_chunk_count(groups, 1), [&](int, int64_t g0, int64_t g1) {
    std::vector<F> dK(static_cast<size_t>(R * d)), dV(static_cast<size_t>(R * d));
    std::vector<unsigned char> keep(static_cast<size_t>(p.seq_k), 1);
    for (int64_t grp = g0; grp < g1; ++grp) {
      const int64_t b = grp / p.heads_kv, hk = grp % p.heads_kv;
      const size_t kv0 = size_t((b * p.heads_kv + hk) * p.seq_k * d);
      std::fill(dK.begin(), dK.end(), F(0)), std::fill(dV.begin(), dV.end(), F(0));
      for (int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h)
        for (int64_t i = 0; i < M; ++i) {
          const size_t row = size_t((b * p.heads + h) * M + i);
          const double lse64 = rows.lse.data[row];
          if (lse64 == -std::numeric_limits<double>::infinity()) continue;  // sees no key
          const F lse = F(lse64);  // as the kernel stores it
          const double *q = Q + row * size_t(d), *g = dO + row * size_t(d);
          F D = 0;  // from O as the kernel stores it
          for (int64_t c = 0; c < d; ++c)
            D += F(g[c]) * a.round(F(rows.o.data[row * size_t(d) + size_t(c)]));
          if (a.dropping)
            dropout::keep_row(p.dropout_seed, a.thresh, b, h, i, p.seq_k, keep.data());
          for (int64_t k = 0; k < R; ++k) {
            const int64_t j = keys[size_t(k)];
            if (j >= p.visible_keys(i) || !in.mask.visible(b, h, i, j)) continue;
            const double *kj = K + kv0 + size_t(j * d), *vj = V + kv0 + size_t(j * d);
            F s = 0, dov = 0, dS, Pd;
            for (int64_t c = 0; c < d; ++c) s += F(q[c]) * F(kj[c]);
            if (keep[size_t(j)])
              for (int64_t c = 0; c < d; ++c) dov += F(g[c]) * F(vj[c]);
            a.backward(a.scale * s, lse, dov, keep[size_t(j)], D, dS, Pd);
            for (int64_t c = 0; c < d; ++c) {
              dK[size_t(k * d + c)] += a.scale * dS * F(q[c]);
              dV[size_t(k * d + c)] += Pd * F(g[c]);
            }
          }
        }
      const size_t out0 = size_t(grp * R * d);  // compact: [B, Hkv, R, d]
      for (size_t e = 0; e < dK.size(); ++e) {
        out.dk.data[out0 + e] = double(a.round(dK[e]));
        out.dv.data[out0 + e] = double(a.round(dV[e]));
      }
    }
  });
}

}  // namespace

void plain_key_columns(const Problem& p, const Inputs& in, DType precision,
                       const std::vector<int64_t>& keys, const Outputs& rows, Outputs& out) {
  if (precision == DType::f64)
    plain_columns<double>(p, in, precision, keys, rows, out);
  else
    plain_columns<float>(p, in, precision, keys, rows, out);
}

void plain_attention(const Problem& p, const Inputs& in, DType precision, Outputs& out,
                     const std::vector<int64_t>* rows) {
  if (precision == DType::f64)
    plain<double>(p, in, precision, out, rows);
  else
    plain<float>(p, in, precision, out, rows);
}

}  // namespace ladder::reference
