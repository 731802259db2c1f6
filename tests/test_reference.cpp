// The oracle (reference/oracle.cpp, step 00) checked without trusting it:
//  - its forward against a brute-force triple loop in long double written here, no Eigen;
//  - its gradients against central finite differences of L = sum(O o G), where G is dO;
//  - plain_attention, the yardstick of the harness's tolerance, against the oracle: small
//    but non-zero error in fp32, larger in fp16 and larger still in bf16 (LSE, fp32 in every
//    class, the same in all three).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "dropout.hpp"
#include "inputs.hpp"
#include "oracle.hpp"
#include "problem.hpp"
#include "test_util.hpp"

using namespace ladder;
using LD = long double;

namespace {

std::vector<LD> widen(const Tensor& t) {
  return std::vector<LD>(t.data.begin(), t.data.end());
}

// d loss / d x[e] for every e by central differences, each step 1e-5 relative to |x[e]| (at
// least 1e-5); x is perturbed in place and restored.
std::vector<LD> central_differences(std::vector<LD>& x, const std::function<LD()>& loss) {
  std::vector<LD> fd(x.size());
  for (size_t e = 0; e < x.size(); ++e) {
    const LD x0 = x[e], h = 1e-5L * std::max(LD(1), std::fabs(x0));
    x[e] = x0 + h;
    const LD up = loss();
    x[e] = x0 - h;
    const LD down = loss();
    x[e] = x0;
    fd[e] = (up - down) / (2 * h);
  }
  return fd;
}

struct Forward {
  std::vector<LD> o, lse;
  int64_t masked_rows = 0;
};

// Whether key j is visible to query i of head (b, h) beyond the causal rule (the block mask),
// and dropout's Z_ij; the defaults: everything visible, nothing dropped.
struct Extras {
  std::function<bool(int64_t, int64_t, int64_t, int64_t)> visible;
  std::function<bool(int64_t, int64_t, int64_t, int64_t)> keep;
  LD keep_scale = 1;
};

// Attention straight from the definition, in long double, one (batch, head, query) at a
// time. Deliberately shares nothing with the oracle: its own indexing, mask and scale.
Forward brute_forward(const Problem& p, const std::vector<LD>& q, const std::vector<LD>& k,
                      const std::vector<LD>& v, const Extras& x = {}) {
  const int64_t B = p.batch, H = p.heads, Hkv = p.heads_kv, M = p.seq_q, N = p.seq_k, d = p.dim;
  const LD scale = p.scale != 0 ? LD(p.scale) : 1.0L / std::sqrt(LD(d));
  Forward f;
  f.o.assign(size_t(B * H * M * d), 0.0L);
  f.lse.assign(size_t(B * H * M), 0.0L);
  std::vector<LD> s(static_cast<size_t>(N));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / (H / Hkv);
      for (int64_t i = 0; i < M; ++i) {
        const int64_t row = (b * H + h) * M + i;
        LD m = -std::numeric_limits<LD>::infinity();
        for (int64_t j = 0; j < N; ++j) {
          if (p.causal && j > i + N - M) continue;  // bottom-right: j visible iff j <= i + N - M
          if (x.visible && !x.visible(b, h, i, j)) continue;
          LD dot = 0;
          for (int64_t c = 0; c < d; ++c)
            dot += q[size_t(row * d + c)] * k[size_t(((b * Hkv + hk) * N + j) * d + c)];
          s[size_t(j)] = scale * dot;
          m = std::max(m, s[size_t(j)]);
        }
        if (std::isinf(m)) {  // no visible key
          f.lse[size_t(row)] = -std::numeric_limits<LD>::infinity();
          ++f.masked_rows;
          continue;
        }
        LD l = 0;
        for (int64_t j = 0; j < N; ++j) {
          if (p.causal && j > i + N - M) continue;
          if (x.visible && !x.visible(b, h, i, j)) continue;
          const LD e = std::exp(s[size_t(j)] - m);
          l += e;  // the softmax's sum counts every visible key, dropped or not
          if (x.keep && !x.keep(b, h, i, j)) continue;
          for (int64_t c = 0; c < d; ++c)
            f.o[size_t(row * d + c)] +=
                e * x.keep_scale * v[size_t(((b * Hkv + hk) * N + j) * d + c)];
        }
        for (int64_t c = 0; c < d; ++c) f.o[size_t(row * d + c)] /= l;
        f.lse[size_t(row)] = m + std::log(l);
      }
    }
  return f;
}

// max |got - want| / max |want| over elements where want is finite; NaN in got counts as
// an infinite error.
double rel_error(const std::vector<double>& got, const std::vector<LD>& want) {
  LD max_abs = 0, max_ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(want[i])) continue;
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    max_abs = std::max(max_abs, std::fabs(LD(got[i]) - want[i]));
    max_ref = std::max(max_ref, std::fabs(want[i]));
  }
  return double(max_abs / std::max(max_ref, LD(1e-300)));
}

// Equal up to a few units of float64 roundoff (a different block of rows may take Eigen
// down another kernel), and -inf only where the other is -inf.
bool same(double a, double b) {
  if (std::isinf(b)) return a == b;
  return std::fabs(a - b) <= 1e-14 * std::max(1.0, std::fabs(b));
}

double max_abs_of(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

}  // namespace

TEST_CASE("oracle forward agrees with a long-double triple loop", "[reference]") {
  struct C {
    const char* name;
    Problem p;
    InputKind kind;
  };
  const std::vector<C> cases = {
      {"plain 5x7 d4", testing::problem(1, 2, 2, 5, 7, 4, false), InputKind::normal},
      {"causal square 9x9", testing::problem(1, 2, 2, 9, 9, 8, true), InputKind::normal},
      {"GQA 4->2 causal 6x11", testing::problem(1, 4, 2, 6, 11, 5, true), InputKind::normal},
      {"MQA 4->1 12x7", testing::problem(1, 4, 1, 12, 7, 6, false), InputKind::normal},
      {"causal seq_q < seq_k 3x10", testing::problem(1, 2, 1, 3, 10, 4, true), InputKind::normal},
      {"causal seq_q > seq_k 10x4 (masked rows)", testing::problem(1, 4, 2, 10, 4, 3, true),
       InputKind::normal},
      {"explicit scale 0.3", testing::problem(1, 2, 2, 7, 9, 4, false, 1, 0.3), InputKind::normal},
      {"batch 2 GQA causal 8x5", testing::problem(2, 4, 2, 8, 5, 4, true), InputKind::normal},
      {"seq 1x1", testing::problem(1, 1, 1, 1, 1, 3, true), InputKind::normal},
      {"large logits", testing::problem(1, 2, 2, 14, 19, 16, false), InputKind::large},
      {"large logits causal 19x14", testing::problem(2, 2, 1, 19, 14, 16, true), InputKind::large},
  };
  for (const C& c : cases) {
    INFO(c.name << ": " << c.p.describe());
    const Inputs in = make_inputs(c.p, c.kind);
    Outputs out = Outputs::poisoned(c.p);
    reference::attention(c.p, in, out);
    const Forward want = brute_forward(c.p, widen(in.q), widen(in.k), widen(in.v));

    // The mask itself: causal rows i < M - N see no key, in every batch and head.
    const int64_t expect_masked =
        c.p.causal ? c.p.batch * c.p.heads * std::max<int64_t>(0, c.p.seq_q - c.p.seq_k) : 0;
    REQUIRE(want.masked_rows == expect_masked);

    CHECK(rel_error(out.o.data, want.o) <= 1e-12);
    CHECK(rel_error(out.lse.data, want.lse) <= 1e-12);
    CHECK(max_abs_of(out.o.data) > 0.1);  // not trivially zero
    int64_t masked = 0;
    for (int64_t r = 0; r < c.p.rows(); ++r) {
      if (!std::isinf(want.lse[size_t(r)])) continue;
      ++masked;
      CHECK(out.lse.data[size_t(r)] == -std::numeric_limits<double>::infinity());
      for (int64_t x = 0; x < c.p.dim; ++x) CHECK(out.o.data[size_t(r * c.p.dim + x)] == 0.0);
    }
    CHECK(masked == expect_masked);
  }
}

TEST_CASE("oracle gradients agree with central finite differences", "[reference]") {
  struct C {
    const char* name;
    Problem p;
  };
  const std::vector<C> cases = {
      {"GQA 2->1 causal 5x7 d4", testing::problem(1, 2, 1, 5, 7, 4, true, 3)},
      {"causal seq_q > seq_k 7x4 d3, batch 2 (masked rows)",
       testing::problem(2, 2, 2, 7, 4, 3, true, 4)},
      {"GQA 4->2 3x6 d2, scale 0.7", testing::problem(1, 4, 2, 3, 6, 2, false, 5, 0.7)},
  };
  for (const C& c : cases) {
    Problem p = c.p;
    p.backward = true;
    INFO(c.name << ": " << p.describe());
    const Inputs in = make_inputs(p);  // in.dout is G, the fixed weights of the loss
    Outputs out = Outputs::poisoned(p);
    reference::attention(p, in, out);

    std::vector<LD> x[3] = {widen(in.q), widen(in.k), widen(in.v)};
    const std::vector<LD> G = widen(in.dout);
    auto loss = [&] {
      const Forward f = brute_forward(p, x[0], x[1], x[2]);
      LD L = 0;
      for (size_t e = 0; e < G.size(); ++e) L += f.o[e] * G[e];
      return L;
    };
    const Tensor* grads[3] = {&out.dq, &out.dk, &out.dv};
    const char* names[3] = {"dQ", "dK", "dV"};
    for (int t = 0; t < 3; ++t) {
      INFO(names[t]);
      const double err = rel_error(grads[t]->data, central_differences(x[t], loss));
      INFO("finite-difference rel err " << err);
      CHECK(err <= 1e-7);
      CHECK(max_abs_of(grads[t]->data) > 1e-2);  // a real gradient, not zeros matching zeros
    }

    // Rows with no visible key get exactly zero dQ (and contribute nothing to dK, dV,
    // which the finite differences above already cover).
    int64_t masked = 0;
    for (int64_t r = 0; r < p.rows(); ++r) {
      if (p.visible_keys(r % p.seq_q) != 0) continue;
      ++masked;
      for (int64_t e = 0; e < p.dim; ++e) CHECK(out.dq.data[size_t(r * p.dim + e)] == 0.0);
    }
    CHECK(masked == (p.causal ? p.batch * p.heads * std::max<int64_t>(0, p.seq_q - p.seq_k) : 0));
  }
}

TEST_CASE("the oracle's sampled rows equal its full computation", "[reference]") {
  Problem p = testing::problem(1, 4, 2, 23, 17, 8, true, 9);
  p.backward = true;
  const Inputs in = make_inputs(p);
  Outputs full = Outputs::poisoned(p);
  reference::attention(p, in, full);
  const std::vector<int64_t> rows = {22, 0, 5, 6};  // 0..5 see no key (M - N = 6); any order
  // Sampled rows come back compactly, in the order given: [B, H, R, d].
  Problem c = p;
  c.seq_q = int64_t(rows.size());
  Outputs part = Outputs::poisoned(c);
  reference::attention(p, in, part, &rows);
  for (int64_t bh = 0; bh < p.batch * p.heads; ++bh)
    for (size_t k = 0; k < rows.size(); ++k) {
      const int64_t r = bh * p.seq_q + rows[k], s = bh * c.seq_q + int64_t(k);
      INFO("row " << rows[k] << " of head " << bh);
      CHECK(same(part.lse.data[size_t(s)], full.lse.data[size_t(r)]));
      for (int64_t e = 0; e < p.dim; ++e) {
        CHECK(same(part.o.data[size_t(s * p.dim + e)], full.o.data[size_t(r * p.dim + e)]));
        CHECK(same(part.dq.data[size_t(s * p.dim + e)], full.dq.data[size_t(r * p.dim + e)]));
      }
    }
  // dK and dV need every query row: the sampled form must not pretend to have them.
  for (double x : part.dk.data) REQUIRE(std::isnan(x));
  for (double x : part.dv.data) REQUIRE(std::isnan(x));
}

TEST_CASE("plain_attention: the tolerance yardstick scales with the dtype", "[reference]") {
  // Inputs rounded to bf16, so every precision starts from the same values.
  Problem p = testing::problem(1, 2, 1, 37, 53, 32, true, 11);
  p.backward = true;
  p.dtype = DType::bf16;
  const Inputs in = make_inputs(p);
  Outputs ref = Outputs::poisoned(p);
  reference::attention(p, in, ref);

  const char* names[5] = {"O", "LSE", "dQ", "dK", "dV"};
  auto errors = [&](DType t) {
    Outputs got = Outputs::poisoned(p);
    reference::plain_attention(p, in, t, got);
    const Tensor* g[5] = {&got.o, &got.lse, &got.dq, &got.dk, &got.dv};
    const Tensor* r[5] = {&ref.o, &ref.lse, &ref.dq, &ref.dk, &ref.dv};
    std::vector<double> e(5);
    for (int k = 0; k < 5; ++k) e[size_t(k)] = rel_error(g[k]->data, widen(*r[k]));
    return e;
  };
  const std::vector<double> e32 = errors(DType::f32), e16 = errors(DType::f16),
                            ebf16 = errors(DType::bf16);
  for (int k = 0; k < 5; ++k) {
    INFO(names[k] << ": fp32 " << e32[size_t(k)] << ", fp16 " << e16[size_t(k)] << ", bf16 "
                  << ebf16[size_t(k)]);
    CHECK(e32[size_t(k)] > 0);  // a float32 computation really happened
    CHECK(e32[size_t(k)] < 1e-5);
    if (k == 1) {
      // LSE comes from fp32 S and fp32 statistics in every class (the kernels store it as
      // fp32): the same error whatever the dtype.
      CHECK(e16[size_t(k)] == e32[size_t(k)]);
      CHECK(ebf16[size_t(k)] == e32[size_t(k)]);
      continue;
    }
    CHECK(e16[size_t(k)] > 4 * e32[size_t(k)]);
    CHECK(ebf16[size_t(k)] > 2 * e16[size_t(k)]);  // bf16 keeps 3 fewer mantissa bits than fp16
    CHECK(ebf16[size_t(k)] > 100 * e32[size_t(k)]);
    CHECK(ebf16[size_t(k)] < 0.02);  // a few bf16 roundings, not noise
  }
}

TEST_CASE("plain_attention: rows with no visible key", "[reference]") {
  Problem p = testing::problem(1, 2, 2, 9, 5, 8, true, 13);
  p.backward = true;
  const Inputs in = make_inputs(p);
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    INFO(dtype_name(t));
    Outputs got = Outputs::poisoned(p);
    reference::plain_attention(p, in, t, got);
    for (int64_t r = 0; r < p.rows(); ++r) {
      const bool masked = p.visible_keys(r % p.seq_q) == 0;
      if (masked)
        CHECK(got.lse.data[size_t(r)] == -std::numeric_limits<double>::infinity());
      else
        CHECK(std::isfinite(got.lse.data[size_t(r)]));
      for (int64_t c = 0; c < p.dim; ++c) {
        const size_t e = size_t(r * p.dim + c);
        if (masked) {
          CHECK(got.o.data[e] == 0.0);
          CHECK(got.dq.data[e] == 0.0);
        } else {
          CHECK(std::isfinite(got.o.data[e]));
          CHECK(std::isfinite(got.dq.data[e]));
        }
      }
    }
    for (const Tensor* g : {&got.dk, &got.dv})
      for (double x : g->data) CHECK(std::isfinite(x));
  }
}

namespace {
// The block mask of a problem, as the brute force sees it: from the mask's bytes directly.
Extras extras_of(const Problem& p, const Inputs& in) {
  Extras x;
  if (!in.mask.empty())
    x.visible = [&in](int64_t b, int64_t h, int64_t i, int64_t j) {
      return in.mask.at(b, h, i / in.mask.block_q, j / in.mask.block_k);
    };
  if (p.dropout > 0) {
    const uint32_t t = dropout::threshold(p.dropout);
    x.keep = [p, t](int64_t b, int64_t h, int64_t i, int64_t j) {
      return dropout::keep(p.dropout_seed, t, b, h, i, j);
    };
    x.keep_scale = 1.0L / (1.0L - LD(p.dropout));
  }
  return x;
}
}  // namespace

TEST_CASE("oracle with block masks and dropout: forward and finite-difference gradients",
          "[reference]") {
  struct C {
    const char* name;
    Problem p;
  };
  auto with = [](Problem p, double dropout, BlockSparsity::Kind kind, double rho, int64_t width,
                 int64_t block) {
    p.dropout = dropout, p.dropout_seed = 77;
    p.sparsity.kind = kind, p.sparsity.density = rho, p.sparsity.width = width;
    p.sparsity.block_q = p.sparsity.block_k = block;
    return p;
  };
  using K = BlockSparsity::Kind;
  const std::vector<C> cases = {
      {"dropout 0.3, GQA 2->1 causal 5x9 d3",
       with(testing::problem(1, 2, 1, 5, 9, 3, true, 3), 0.3, K::none, 1, 0, 128)},
      {"random:0.5 blocks of 2, 7x6 d3 (empty block rows)",
       with(testing::problem(2, 2, 2, 7, 6, 3, false, 5), 0.0, K::random, 0.5, 0, 2)},
      {"local:2 blocks of 3, causal 9x9, dropout 0.5",
       with(testing::problem(1, 2, 2, 9, 9, 2, true, 6), 0.5, K::local, 1, 2, 3)},
  };
  for (const C& c : cases) {
    Problem p = c.p;
    p.backward = true;
    INFO(c.name << ": " << p.describe());
    const Inputs in = make_inputs(p);
    const Extras extras = extras_of(p, in);
    Outputs out = Outputs::poisoned(p);
    reference::attention(p, in, out);
    std::vector<LD> x[3] = {widen(in.q), widen(in.k), widen(in.v)};
    const Forward want = brute_forward(p, x[0], x[1], x[2], extras);
    CHECK(rel_error(out.o.data, want.o) <= 1e-12);
    CHECK(rel_error(out.lse.data, want.lse) <= 1e-12);

    const std::vector<LD> G = widen(in.dout);
    auto loss = [&] {
      const Forward f = brute_forward(p, x[0], x[1], x[2], extras);
      LD L = 0;
      for (size_t e = 0; e < G.size(); ++e) L += f.o[e] * G[e];
      return L;
    };
    const Tensor* grads[3] = {&out.dq, &out.dk, &out.dv};
    for (int t = 0; t < 3; ++t) {
      INFO("gradient " << t);
      CHECK(rel_error(grads[t]->data, central_differences(x[t], loss)) <= 1e-7);
      CHECK(max_abs_of(grads[t]->data) > 1e-2);
    }
  }
}

TEST_CASE("the yardstick agrees with the oracle on masks and dropout", "[reference]") {
  Problem p = testing::problem(1, 2, 1, 40, 70, 16, true, 12);
  p.dtype = DType::f32, p.backward = true, p.dropout = 0.25, p.dropout_seed = 3;
  p.sparsity.kind = BlockSparsity::Kind::random, p.sparsity.density = 0.6;
  p.sparsity.block_q = p.sparsity.block_k = 16;
  const Inputs in = make_inputs(p);
  Outputs ref = Outputs::poisoned(p), plain = Outputs::poisoned(p);
  reference::attention(p, in, ref);
  reference::plain_attention(p, in, DType::f32, plain);
  for (auto [a, b] : {std::pair{&plain.o, &ref.o},
                      {&plain.dq, &ref.dq},
                      {&plain.dk, &ref.dk},
                      {&plain.dv, &ref.dv}}) {
    double worst = 0;
    for (size_t e = 0; e < a->data.size(); ++e)
      worst = std::max(worst, std::fabs(a->data[e] - b->data[e]));
    CHECK(worst < 1e-4);  // float32 sums against float64: small, and not zero
    CHECK(worst > 0);
  }
}
