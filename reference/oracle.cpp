// The oracle (float64, Eigen): the top of the ladder's correctness, run as step 00 and used
// by the checker (runner/check.cpp) for every other step.
//
//   S = scale * Q K^T            (masked: key j visible to query i iff j <= i + N - M under
//                                 --causal, and the block of (i, j) kept by a block mask)
//   P = softmax(S) row by row    (max-shifted; a row with no visible key gives P = 0)
//   Pd = P o Z / (1 - p)         (dropout: Z from common/dropout.hpp; Pd = P without it)
//   O = Pd V,  LSE = m + log l   (m the row max, l the row sum of exp(S - m): Z plays no part)
// backward, from dO:
//   dV = Pd^T dO,  dP = (dO V^T) o Z / (1 - p),  D = rowsum(dO o O),  dS = P o (dP - D)
//   dQ = scale * dS K,  dK = scale * dS^T Q   (summed over the query heads of a GQA group)
#include "oracle.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>

#include "dropout.hpp"

namespace ladder::reference {
namespace {

using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Rows [row0, row0 + rows) of head `head` of a [.., heads, seq, d] tensor as a matrix.
Mat load(const Tensor& t, int64_t batch, int64_t head, const std::vector<int64_t>& rows) {
  const int64_t heads = t.shape[1], seq = t.shape[2], d = t.shape[3];
  Mat m(int64_t(rows.size()), d);
  for (size_t r = 0; r < rows.size(); ++r) {
    const double* src = &t.data[size_t(((batch * heads + head) * seq + rows[r]) * d)];
    for (int64_t c = 0; c < d; ++c) m(int64_t(r), c) = src[c];
  }
  return m;
}

// Every row of head `head` into m, which keeps its storage from head to head.
void load_all(const Tensor& t, int64_t batch, int64_t head, Mat& m) {
  const int64_t heads = t.shape[1], seq = t.shape[2], d = t.shape[3];
  m.resize(seq, d);
  std::copy_n(&t.data[size_t((batch * heads + head) * seq * d)], size_t(seq * d), m.data());
}

void store(Tensor& t, int64_t batch, int64_t head, const std::vector<int64_t>& rows, const Mat& m) {
  const int64_t heads = t.shape[1], seq = t.shape[2], d = t.shape[3];
  for (size_t r = 0; r < rows.size(); ++r) {
    double* dst = &t.data[size_t(((batch * heads + head) * seq + rows[r]) * d)];
    for (int64_t c = 0; c < d; ++c) dst[c] = m(int64_t(r), c);
  }
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = i;
  return v;
}

}  // namespace

void attention(const Problem& p, const Inputs& in, Outputs& out, const std::vector<int64_t>* sel) {
  const bool full = sel == nullptr;
  const std::vector<int64_t> all_rows = full ? iota(p.seq_q) : *sel;
  const std::vector<int64_t> out_rows = iota(int64_t(all_rows.size()));
  const int64_t out_seq = int64_t(all_rows.size());  // = seq_q when full
  const double scale = p.softmax_scale();
  const int64_t N = p.seq_k;
  const std::vector<int64_t> keys = iota(N);
  const size_t kBlock = 256;  // query rows per block: bounds the S and P scratch to 256 x N
  // One batch and K/V head: its query heads, block by block. K and V: scratch for its keys.
  const bool dropping = p.dropout > 0;
  const uint32_t thresh = dropout::threshold(p.dropout);
  const double inv_keep = 1.0 / (1.0 - p.dropout);
  auto head_group = [&](int64_t b, int64_t hk, Mat& K, Mat& V) {
    std::vector<unsigned char> visible(static_cast<size_t>(N)), keep(static_cast<size_t>(N));
    load_all(in.k, b, hk, K);
    load_all(in.v, b, hk, V);
    Mat dK_acc, dV_acc;
    if (p.backward && full) dK_acc = dV_acc = Mat::Zero(N, p.dim);
    for (int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h) {
      for (size_t r0 = 0; r0 < all_rows.size(); r0 += kBlock) {
        const size_t r1 = std::min(all_rows.size(), r0 + kBlock);
        const std::vector<int64_t> rows(all_rows.begin() + long(r0), all_rows.begin() + long(r1));
        // Where these rows go in `out`: the same index, or (sampled) their place in the list.
        const std::vector<int64_t> orows(out_rows.begin() + long(r0), out_rows.begin() + long(r1));
        const int64_t R = int64_t(rows.size());
        const Mat Q = load(in.q, b, h, rows);
        const Mat S = (Q * K.transpose()) * scale;
        Mat P = Mat::Zero(R, N), Z;  // Z: dropout's keep mask scaled by 1 / (1 - p)
        if (dropping) Z = Mat::Zero(R, N);
        for (int64_t r = 0; r < R; ++r) {
          const int64_t i = rows[size_t(r)], causal_keys = p.visible_keys(i);
          for (int64_t j = 0; j < N; ++j)
            visible[size_t(j)] = j < causal_keys && in.mask.visible(b, h, i, j);
          double& lse = out.lse.data[size_t((b * p.heads + h) * out_seq + orows[size_t(r)])];
          double m = -std::numeric_limits<double>::infinity();
          for (int64_t j = 0; j < N; ++j)
            if (visible[size_t(j)]) m = std::max(m, S(r, j));
          if (m == -std::numeric_limits<double>::infinity()) {  // no visible key: O = 0,
            lse = m;                                            // LSE = -inf, zero gradients
            continue;
          }
          double l = 0;
          for (int64_t j = 0; j < N; ++j)
            if (visible[size_t(j)]) l += (P(r, j) = std::exp(S(r, j) - m));
          P.row(r) /= l;
          lse = m + std::log(l);
          if (dropping) {
            dropout::keep_row(p.dropout_seed, thresh, b, h, i, N, keep.data());
            for (int64_t j = 0; j < N; ++j) Z(r, j) = keep[size_t(j)] ? inv_keep : 0.0;
          }
        }
        const Mat Pd = dropping ? Mat(P.cwiseProduct(Z)) : P;
        const Mat O = Pd * V;
        store(out.o, b, h, orows, O);
        if (!p.backward) continue;

        const Mat dO = load(in.dout, b, h, rows);
        Mat dP, dS, dQ;
        Eigen::VectorXd D;
        // dP = dO V^T (times Z / (1-p) with dropout), D = rowsum(dO o O),
        // dS = P o (dP - D) (D broadcast along each row), dQ = scale dS K.
        dP = dO * V.transpose();
        if (dropping) dP = dP.cwiseProduct(Z);
        D = (dO.array() * O.array()).rowwise().sum();
        dS = (P.array() * (dP.colwise() - D).array()).matrix();
        dQ = (dS * K) * scale;
        store(out.dq, b, h, orows, dQ);
        if (full) {
          dK_acc.noalias() += (dS.transpose() * Q) * scale;
          dV_acc.noalias() += Pd.transpose() * dO;
        }
      }
    }
    if (p.backward && full) {
      store(out.dk, b, hk, keys, dK_acc);
      store(out.dv, b, hk, keys, dV_acc);
    }
  };
  if (full) {  // step 00 itself, and the check of a small problem: one thread
    Mat K, V;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t hk = 0; hk < p.heads_kv; ++hk) head_group(b, hk, K, V);
    return;
  }
  // Sampled rows (the check of a large problem): the (batch, K/V head) groups write disjoint
  // outputs and do not depend on each other, so they run on parallel threads (common/tensor.hpp)
  // with the same arithmetic, hence the same values, as one after another.
  const int64_t groups = p.batch * p.heads_kv;
  parallel_chunks(groups, parallel_chunk_count(groups, 1), [&](int, int64_t g0, int64_t g1) {
    Mat K, V;
    for (int64_t g = g0; g < g1; ++g) head_group(g / p.heads_kv, g % p.heads_kv, K, V);
  });
}

}  // namespace ladder::reference

namespace ladder::reference {

void key_columns(const Problem& p, const Inputs& in, const std::vector<int64_t>& keys,
                 Outputs& rows, Outputs& out) {
  Problem fwd = p;
  fwd.backward = false;
  attention(fwd, in, rows);  // O and LSE of every query row: P and D need them
  const double scale = p.softmax_scale();
  const int64_t M = p.seq_q, R = int64_t(keys.size()), d = p.dim;
  const size_t kBlock = 256;  // query rows per block, as attention() takes them
  const bool dropping = p.dropout > 0;
  const uint32_t thresh = dropout::threshold(p.dropout);
  const double inv_keep = 1.0 / (1.0 - p.dropout);
  std::vector<unsigned char> keep(static_cast<size_t>(p.seq_k));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      const Mat K = load(in.k, b, hk, keys), V = load(in.v, b, hk, keys);
      Mat dK = Mat::Zero(R, d), dV = Mat::Zero(R, d);
      for (int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h)
        for (int64_t r0 = 0; r0 < M; r0 += int64_t(kBlock)) {
          const std::vector<int64_t> blk = [&] {
            std::vector<int64_t> v;
            for (int64_t i = r0; i < std::min<int64_t>(M, r0 + int64_t(kBlock)); ++i)
              v.push_back(i);
            return v;
          }();
          const int64_t B = int64_t(blk.size());
          const Mat Q = load(in.q, b, h, blk), dO = load(in.dout, b, h, blk);
          const Mat O = load(rows.o, b, h, blk);
          const Mat S = (Q * K.transpose()) * scale;
          Mat P = Mat::Zero(B, R), Z = Mat::Constant(B, R, 1.0);
          for (int64_t r = 0; r < B; ++r) {
            const int64_t i = blk[size_t(r)];
            const double lse = rows.lse.data[size_t((b * p.heads + h) * M + i)];
            if (lse == -std::numeric_limits<double>::infinity()) continue;  // sees no key
            if (dropping) dropout::keep_row(p.dropout_seed, thresh, b, h, i, p.seq_k, keep.data());
            for (int64_t c = 0; c < R; ++c) {
              const int64_t j = keys[size_t(c)];
              if (j < p.visible_keys(i) && in.mask.visible(b, h, i, j))
                P(r, c) = std::exp(S(r, c) - lse);
              if (dropping) Z(r, c) = keep[size_t(j)] ? inv_keep : 0.0;
            }
          }
          // The oracle's formulas (above), on these key columns only.
          const Mat Pd = P.cwiseProduct(Z);
          const Mat dP = (dO * V.transpose()).cwiseProduct(Z);
          const Eigen::VectorXd D = (dO.array() * O.array()).rowwise().sum();
          const Mat dS = (P.array() * (dP.colwise() - D).array()).matrix();
          dK.noalias() += (dS.transpose() * Q) * scale;
          dV.noalias() += Pd.transpose() * dO;
        }
      const std::vector<int64_t> at = iota(R);  // compact: [B, Hkv, R, d]
      store(out.dk, b, hk, at, dK);
      store(out.dv, b, hk, at, dV);
    }
}

}  // namespace ladder::reference
