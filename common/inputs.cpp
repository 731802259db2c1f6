#include "inputs.hpp"

#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace ladder {

void Outputs::poison(const Problem& p) {
  // A tensor keeps its storage when it already holds as many elements (a sweep's points of
  // one size do not page in fresh memory each time), else it is allocated afresh.
  auto fit = [](Tensor& t, std::vector<int64_t> shape) {
    if (t.numel() == Tensor::numel(shape)) {
      t.shape = std::move(shape);
      fill_nan(t);
    } else {
      t = Tensor();  // free the old storage first
      t = Tensor::poisoned(std::move(shape));
    }
  };
  fit(o, {p.batch, p.heads, p.seq_q, p.dim});
  fit(lse, {p.batch, p.heads, p.seq_q});
  if (p.backward) {
    fit(dq, {p.batch, p.heads, p.seq_q, p.dim});
    fit(dk, {p.batch, p.heads_kv, p.seq_k, p.dim});
    fit(dv, {p.batch, p.heads_kv, p.seq_k, p.dim});
  } else {
    dq = dk = dv = Tensor();
  }
}

Outputs Outputs::poisoned(const Problem& p) {
  Outputs o;
  o.poison(p);
  return o;
}

bool parse_input_kind(const std::string& s, InputKind& out) {
  static const std::pair<const char*, InputKind> names[] = {
      {"normal", InputKind::normal}, {"large", InputKind::large}, {"late", InputKind::late}};
  for (const auto& [name, kind] : names)
    if (s == name) return out = kind, true;
  return false;
}

namespace {
// Normal values with a mean shift; `row_boost` scales every 13th row up.
void fill(Tensor& t, std::mt19937_64& rng, double shift, double scale, double row_boost) {
  std::normal_distribution<double> n(0.0, 1.0);
  const int64_t d = t.shape.back();
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int64_t row = i / d;
    const double boost = (row % 13 == 5) ? row_boost : 1.0;
    t.data[size_t(i)] = (n(rng) + shift) * scale * boost;
  }
}
}  // namespace

Inputs make_inputs(const Problem& p, InputKind kind) {
  std::mt19937_64 rng(p.seed * 0x9E3779B97F4A7C15ull + 12345);
  Inputs in;
  in.q = Tensor({p.batch, p.heads, p.seq_q, p.dim});
  in.k = Tensor({p.batch, p.heads_kv, p.seq_k, p.dim});
  in.v = Tensor({p.batch, p.heads_kv, p.seq_k, p.dim});
  // Logits S = scale * q.k: with shift 0.5 their mean is about 0.25*sqrt(d); boosted keys
  // (x3) give a few rows of large logits. The "large" kind makes |S| reach hundreds.
  const double qk_scale = kind == InputKind::large ? 6.0 : 1.0;
  fill(in.q, rng, 0.5, qk_scale, 1.0);
  fill(in.k, rng, 0.5, qk_scale, 3.0);
  if (kind == InputKind::late) {  // key j scaled by 1 + 3 j / seq_k
    const int64_t d = p.dim, n = p.seq_k;
    for (int64_t e = 0; e < in.k.numel(); ++e)
      in.k.data[size_t(e)] *= 1.0 + 3.0 * double(e / d % n) / double(n);
  }
  fill(in.v, rng, 0.25, 1.0, 1.0);
  if (p.backward) {
    in.dout = Tensor({p.batch, p.heads, p.seq_q, p.dim});
    fill(in.dout, rng, 0.0, 1.0, 1.0);
  }
  round_inputs(in, p.dtype);
  in.mask = make_block_mask(p);
  return in;
}

void round_inputs(Inputs& in, DType t) {
  if (t == DType::f64) return;
  for (Tensor* x : {&in.q, &in.k, &in.v, &in.dout}) {
    double* d = x->data.data();
    parallel_for(x->numel(), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) d[i] = round_to(t, d[i]);
    });
  }
}

std::string non_finite_input(const Inputs& in) {
  const std::pair<const char*, const Tensor*> named[] = {
      {"Q", &in.q}, {"K", &in.k}, {"V", &in.v}, {"dO", &in.dout}};
  for (const auto& [name, t] : named) {
    const double* d = t->data.data();
    const int chunks = parallel_chunk_count(t->numel());
    std::vector<int64_t> first(size_t(chunks), -1);
    parallel_chunks(t->numel(), chunks, [&](int c, int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        if (!std::isfinite(d[i])) {
          first[size_t(c)] = i;
          return;
        }
    });
    for (int64_t f : first) {
      if (f < 0) continue;
      std::string where;  // [b, h, i, c]
      for (size_t k = t->shape.size(), rest = size_t(f); k-- > 0; rest /= size_t(t->shape[k]))
        where = std::to_string(rest % size_t(t->shape[k])) + (where.empty() ? "" : ", ") + where;
      const double x = d[f];
      return std::string(name) + "[" + where + "] is " +
             (std::isnan(x) ? "NaN"
              : x > 0       ? "+inf"
                            : "-inf");
    }
  }
  return "";
}

}  // namespace ladder
