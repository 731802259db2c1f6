#include "check.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <utility>

#include "error.hpp"
#include "oracle.hpp"

namespace ladder {

namespace {
// The serial comparison of elements [begin, end).
ErrorStats compare_range(const double* got, const double* ref, int64_t begin, int64_t end) {
  ErrorStats e;
  for (int64_t i = begin; i < end; ++i) {
    const double g = got[i], r = ref[i];
    if (!std::isfinite(r)) {  // -inf LSE must be exactly -inf (NaN only matches NaN)
      if (g != r && !(std::isnan(g) && std::isnan(r)) && e.bad++ == 0) e.first_bad = i;
      continue;
    }
    if (!std::isfinite(g)) {
      if (e.bad++ == 0) e.first_bad = i;
      continue;
    }
    e.ref_max = std::max(e.ref_max, std::fabs(r));
    const double d = std::fabs(g - r);
    if (d > e.max_abs || e.where < 0) {
      e.max_abs = d;
      e.where = i;
    }
  }
  return e;
}
}  // namespace

ErrorStats compare(const std::vector<double>& got, const std::vector<double>& ref) {
  // Contiguous chunks (in parallel), merged in index order, so the result is the serial
  // pass's: where is the lowest index of the max, first_bad the lowest bad index.
  const int64_t n = int64_t(ref.size());
  const int chunks = parallel_chunk_count(n);
  std::vector<ErrorStats> part(static_cast<size_t>(chunks));
  parallel_chunks(n, chunks, [&](int c, int64_t begin, int64_t end) {
    part[size_t(c)] = compare_range(got.data(), ref.data(), begin, end);
  });
  ErrorStats e;
  for (const ErrorStats& x : part) {
    if (x.bad > 0 && e.bad == 0) e.first_bad = x.first_bad;
    e.bad += x.bad;
    e.ref_max = std::max(e.ref_max, x.ref_max);
    if (x.where >= 0 && (e.where < 0 || x.max_abs > e.max_abs)) {
      e.max_abs = x.max_abs;
      e.where = x.where;
    }
  }
  e.max_rel = e.ref_max > 0 ? e.max_abs / e.ref_max : e.max_abs;
  return e;
}

namespace {
// The draw of a sampled check's rows: fresh per check unless --check sampled:SEED fixed it.
bool g_draw_fixed = false;
uint64_t g_draw = 0;

uint64_t next_draw() {
  if (g_draw_fixed) return g_draw;
  std::random_device dev;
  return (uint64_t(dev()) << 32) ^ uint64_t(dev()) ^
         uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
}
}  // namespace

bool parse_check_mode(const std::string& s, CheckMode& out) {
  static const std::pair<const char*, CheckMode> names[] = {{"auto", CheckMode::automatic},
                                                            {"full", CheckMode::full},
                                                            {"sampled", CheckMode::sampled},
                                                            {"none", CheckMode::none}};
  for (const auto& [name, mode] : names)
    if (s == name) return out = mode, true;
  const std::string prefix = "sampled:";  // sampled:SEED repeats the draw a report printed
  if (s.rfind(prefix, 0) != 0 || s.size() == prefix.size() ||
      s.find_first_not_of("0123456789", prefix.size()) != std::string::npos ||
      s.size() - prefix.size() > 20)
    return false;
  errno = 0;
  const unsigned long long seed = std::strtoull(s.c_str() + prefix.size(), nullptr, 10);
  if (errno == ERANGE) return false;
  g_draw_fixed = true, g_draw = seed;
  return out = CheckMode::sampled, true;
}

std::string index_str(const std::vector<int64_t>& shape, int64_t flat) {
  std::vector<int64_t> idx(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    idx[k] = flat % shape[k];
    flat /= shape[k];
  }
  std::ostringstream s;
  s << "[";
  for (size_t k = 0; k < idx.size(); ++k) s << (k ? ", " : "") << idx[k];
  s << "]";
  return s.str();
}

namespace {
// kSampled rows of a sequence of n (all of them when n is smaller), the same in every (batch,
// head): both ends (tails, the causal diagonal's corner) and the rest drawn by rng, so that no
// fixed set of rows can be right while the others are wrong.
std::vector<int64_t> sample_rows(int64_t n, std::mt19937_64& rng) {
  std::set<int64_t> r;
  for (int64_t x : {int64_t(0), int64_t(1), n - 2, n - 1})
    if (x >= 0 && x < n) r.insert(x);
  while (int64_t(r.size()) < std::min(n, kSampled)) r.insert(int64_t(rng() % uint64_t(n)));
  return {r.begin(), r.end()};
}

// Whether query row i of head (b, h) sees any key (else its LSE is -inf by the contract).
bool row_sees_a_key(const Problem& p, const Inputs& in, int64_t b, int64_t h, int64_t i) {
  const int64_t n = p.visible_keys(i);
  if (n == 0 || in.mask.empty()) return n > 0;
  for (int64_t J = 0; J * in.mask.block_k < n; ++J)
    if (in.mask.at(b, h, i / in.mask.block_q, J)) return true;
  return false;
}

// A sampled check compares a few rows; every element of every output must still be finite
// (and LSE -inf only on a row that sees no key). One pass over the outputs, so a NaN outside
// the sampled rows fails the check too.
void scan_unsampled(const Problem& p, const Inputs& in, const Outputs& got, CheckReport& rep) {
  auto scan = [&](const char* name, const Tensor& t, bool lse) {
    if (t.empty()) return;
    TensorCheck c;
    c.name = std::string(name) + " (every element finite)";
    c.shape = t.shape;
    for (int64_t e = 0; e < t.numel(); ++e) {
      const double x = t.data[size_t(e)];
      bool ok = std::isfinite(x);
      if (lse && x == -std::numeric_limits<double>::infinity()) {
        const int64_t i = e % p.seq_q, bh = e / p.seq_q;
        ok = !row_sees_a_key(p, in, bh / p.heads, bh % p.heads, i);
      }
      if (!ok && c.step.bad++ == 0) c.step.first_bad = e;
    }
    c.pass = c.step.bad == 0;
    if (c.pass) return;  // reported only when it fails: the sampled rows carry the errors
    rep.pass = false;
    rep.tensors.push_back(c);
  };
  scan("O", got.o, false);
  scan("LSE", got.lse, true);
  if (p.backward) {
    scan("dQ", got.dq, false);
    scan("dK", got.dk, false);
    scan("dV", got.dv, false);
  }
}
}  // namespace

double max_abs(const Tensor& t) {
  const int chunks = parallel_chunk_count(t.numel());
  std::vector<double> part(size_t(chunks), 0.0);
  parallel_chunks(t.numel(), chunks, [&](int c, int64_t begin, int64_t end) {
    double m = 0;
    for (int64_t i = begin; i < end; ++i) m = std::max(m, std::fabs(t.data[size_t(i)]));
    part[size_t(c)] = m;
  });
  double m = 0;
  for (double x : part) m = std::max(m, x);
  return m;
}

Reference reference_for(const Problem& p, const Inputs& in, CheckMode mode) {
  Reference r;
  r.checked = mode != CheckMode::none;
  if (!r.checked) {
    r.mode = "not checked";
    return r;
  }
  const double cost = p.backward ? 3.5 * p.fwd_flops() : p.fwd_flops();
  r.sampled = mode == CheckMode::sampled || (mode == CheckMode::automatic && cost > 4e9);
  if (r.sampled) {
    r.draw = next_draw();
    std::mt19937_64 rng(r.draw);
    r.rows = sample_rows(p.seq_q, rng);
    if (p.backward) r.keys = sample_rows(p.seq_k, rng);
    r.mode = "sampled (draw " + std::to_string(r.draw) +
             "; --check sampled:" + std::to_string(r.draw) +
             " repeats it): " + std::to_string(r.rows.size()) + " query rows per head (O, LSE" +
             (p.backward ? ", dQ" : "") + ")" +
             (p.backward ? ", " + std::to_string(r.keys.size()) + " key rows per K/V head (dK, dV)"
                         : "") +
             ", every element finite" + (p.backward ? ", the gradient sums" : "");
  } else {
    r.mode = "full";
  }
  r.ref = r.sampled_outputs(p), r.plain = r.sampled_outputs(p);
  const std::vector<int64_t>* rows = r.sampled ? &r.rows : nullptr;
  reference::attention(p, in, r.ref, rows);
  if (r.sampled && p.backward) {  // dK, dV on the sampled keys: the oracle's forward, then columns
    Problem f = p;
    f.backward = false;
    Outputs all = Outputs::poisoned(f);
    reference::key_columns(p, in, r.keys, all, r.ref);
    reference::plain_key_columns(p, in, p.dtype, r.keys, all, r.plain);
  }
  // The oracle is float64 arithmetic: inputs so large that it overflows (|S| past 1e308)
  // cannot be checked, and are refused rather than compared with a NaN.
  const auto oracle_bad = [](const Tensor& t, bool lse) {
    for (double x : t.data)
      if (std::isnan(x) || (std::isinf(x) && !(lse && x < 0))) return true;
    return false;
  };
  const Outputs& ref = r.ref;
  if (oracle_bad(ref.o, false) || oracle_bad(ref.lse, true) ||
      (p.backward &&
       (oracle_bad(ref.dq, false) || oracle_bad(ref.dk, false) || oracle_bad(ref.dv, false))))
    throw BadInput(
        "the inputs overflow float64 arithmetic in the oracle (scores beyond 1e308): they "
        "cannot be checked");
  // The yardstick: a correct kernel of the step's precision class (reference/plain.cpp); in
  // float64 too, so that a float64 step is held to what another summation order gives.
  reference::plain_attention(p, in, p.dtype, r.plain, rows);
  // The cancellation term of dQ and dK's floor (below).
  const double mq = max_abs(in.q), mk = max_abs(in.k), mv = max_abs(in.v);
  const double mdo = p.backward ? max_abs(in.dout) : 0.0;
  r.cancel = double(p.dim) * unit_roundoff(accumulation_type(p.dtype)) *
             std::fabs(p.softmax_scale()) * mdo * mv * std::max(mq, mk);
  return r;
}

Outputs Reference::sampled_outputs(const Problem& p) const {
  if (!sampled) return Outputs::poisoned(p);
  // Sampled: the rows and keys are written compactly ([B, H, R, ...], [B, Hkv, Rk, d]).
  Problem q = p;
  q.seq_q = int64_t(rows.size());
  q.backward = false;
  Outputs o = Outputs::poisoned(q);
  if (p.backward) {
    const int64_t R = int64_t(rows.size()), Rk = int64_t(keys.size());
    o.dq = Tensor::poisoned({p.batch, p.heads, R, p.dim});
    o.dk = Tensor::poisoned({p.batch, p.heads_kv, Rk, p.dim});
    o.dv = Tensor::poisoned({p.batch, p.heads_kv, Rk, p.dim});
  }
  return o;
}

namespace {
// Rows `at` of every [B, H', n, row_len] slab of `from`, laid out compactly as `to` is.
void gather(const Tensor& from, Tensor& to, const std::vector<int64_t>& at, int64_t row_len) {
  if (to.empty()) return;
  const int64_t R = int64_t(at.size()), slabs = to.numel() / (R * row_len),
                n = from.numel() / (slabs * row_len);
  for (int64_t sl = 0; sl < slabs; ++sl)
    for (int64_t k = 0; k < R; ++k)
      std::copy_n(&from.data[size_t((sl * n + at[size_t(k)]) * row_len)], size_t(row_len),
                  &to.data[size_t((sl * R + k) * row_len)]);
}

// The gradient sums, which need no oracle and see every element: summed over keys, dK is 0
// (each row of dS sums to 0, dropout or not), and without dropout dV is the sum of dO over the
// query rows that see a key (each row of P sums to 1), per (batch, K/V head) and column. A
// correct result's elements are each off by their rounding to the dtype and their fp32 sums of
// seq_q x group terms, so a column's sum by at most (u + seq_q group u_32) sum_j |x_j|; 3x that
// (the gradients' factor) is the tolerance, with the largest column's sum of magnitudes. dK adds
// seq_k times its per-element cancellation term (`cancel`, judge()): where dP and D cancel, an
// element's error is that of its terms, not of its own small value.
void check_gradient_sums(const Problem& p, const Inputs& in, const Outputs& got, double cancel,
                         CheckReport& rep) {
  const int64_t N = p.seq_k, d = p.dim;
  const double u = unit_roundoff(p.dtype), u_acc = unit_roundoff(accumulation_type(p.dtype));
  const double per_unit = 3.0 * (u + double(p.seq_q * p.group()) * u_acc);
  auto check = [&](const char* name, const Tensor& g, bool dv) {
    TensorCheck t;
    t.name = name;
    t.shape = {p.batch, p.heads_kv, d};
    std::vector<double> got_sum(size_t(p.batch * p.heads_kv * d), 0.0), want = got_sum,
                                                                        magnitude = got_sum;
    for (int64_t bk = 0; bk < p.batch * p.heads_kv; ++bk)
      for (int64_t j = 0; j < N; ++j)
        for (int64_t c = 0; c < d; ++c) {
          const double x = g.data[size_t((bk * N + j) * d + c)];
          got_sum[size_t(bk * d + c)] += x;
          magnitude[size_t(bk * d + c)] += std::fabs(x);
        }
    if (dv)
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t h = 0; h < p.heads; ++h)
          for (int64_t i = 0; i < p.seq_q; ++i) {
            if (!row_sees_a_key(p, in, b, h, i)) continue;
            const size_t at = size_t((b * p.heads_kv + h / p.group()) * d);
            for (int64_t c = 0; c < d; ++c)
              want[at + size_t(c)] +=
                  in.dout.data[size_t(((b * p.heads + h) * p.seq_q + i) * d + c)];
          }
    double largest = 0;
    for (double m : magnitude) largest = std::isfinite(m) ? std::max(largest, m) : largest;
    t.tol = per_unit * largest + (dv ? 0.0 : double(N) * cancel);
    t.step = compare(got_sum, want);
    t.pass = t.step.bad == 0 && t.step.max_abs <= t.tol;
    rep.pass = rep.pass && t.pass;
    rep.tensors.push_back(t);
  };
  check("sum_j(dK)", got.dk, false);                     // = 0
  if (p.dropout == 0) check("sum_j(dV)", got.dv, true);  // = sum_i(dO)
}
}  // namespace

// The LSE floor's tensor-core term. A 16-bit kernel forms S on tensor cores, which add each
// k-step's 16 products to the fp32 accumulator and may truncate there rather than round: S, and
// LSE, which follows the row's largest scores, can then be off by about one fp32 unit of |S| per
// k-step, in one direction. The yardstick's round-to-nearest sums cannot show that bias (it
// averages out over the keys); measured on the H100, fp16 at d = 128 puts about 5e-6 into LSE
// at every length (notes/results/trust-h100). The term: ceil(d / 16) u_32 max|LSE| (|LSE| stands
// for the row's largest |S|), for fp16 and bf16 only.
namespace {
double lse_accumulation(const Problem& p, const Tensor& lse_ref) {
  if (p.dtype != DType::f16 && p.dtype != DType::bf16) return 0.0;
  double largest = 0;
  for (double x : lse_ref.data)
    if (std::isfinite(x)) largest = std::max(largest, std::fabs(x));
  return double((p.dim + 15) / 16) * unit_roundoff(DType::f32) * largest;
}
}  // namespace

CheckReport judge(const Problem& p, const Inputs& in, const Outputs& got, const Reference& r) {
  CheckReport rep;
  rep.mode = r.mode;
  if (!r.checked) return rep;
  Outputs gathered;
  const Outputs& step = r.sampled ? gathered : got;
  if (r.sampled) {  // the step's sampled rows and keys, laid out as the reference's
    gathered = r.sampled_outputs(p);
    gather(got.o, gathered.o, r.rows, p.dim);
    gather(got.lse, gathered.lse, r.rows, 1);
    gather(got.dq, gathered.dq, r.rows, p.dim);
    gather(got.dk, gathered.dk, r.keys, p.dim);
    gather(got.dv, gathered.dv, r.keys, p.dim);
  }

  // The floor: one unit roundoff of the output's scale (its largest reference value), which a
  // correct result rounded once to the stored type always meets. LSE is stored in fp32 by every
  // rung below fp64, so it is held to fp32's. dQ and dK add a cancellation term: where
  // dS = P (dP - D) cancels exactly (a row with one visible key), the yardstick may cancel to
  // exactly 0 and a correct kernel, summing dP and D in another order, to d accumulation
  // roundoffs of the terms, so those are allowed too (at fp32's roundoff, not the dtype's).
  const double u = unit_roundoff(p.dtype), u_acc = unit_roundoff(accumulation_type(p.dtype));
  // at: the rows (or keys) a sampled tensor holds; empty for a full one.
  auto check = [&](const char* name, const Tensor& g, const Tensor& ref, const Tensor& b,
                   double factor, double unit, double extra, const std::vector<int64_t>& at) {
    if (ref.empty()) return;
    TensorCheck t;
    t.name = name;
    t.shape = ref.shape;
    t.step = compare(g.data, ref.data);
    t.plain = compare(b.data, ref.data);
    t.factor = factor;
    t.floor = unit * t.step.ref_max + extra;
    t.tol = factor * t.plain.max_abs + t.floor;
    t.pass = t.step.bad == 0 && t.step.max_abs <= t.tol;
    t.sampled = at;
    rep.pass = rep.pass && t.pass;
    rep.tensors.push_back(t);
  };
  const Outputs &ref = r.ref, &plain = r.plain;
  check("O", step.o, ref.o, plain.o, 2.0, u, 0.0, r.rows);
  check("LSE", step.lse, ref.lse, plain.lse, 2.0, u_acc, lse_accumulation(p, ref.lse), r.rows);
  if (p.backward) {
    check("dQ", step.dq, ref.dq, plain.dq, 3.0, u, r.cancel, r.rows);
    check("dK", step.dk, ref.dk, plain.dk, 3.0, u, r.cancel, r.keys);
    check("dV", step.dv, ref.dv, plain.dv, 3.0, u, 0.0, r.keys);
  }
  if (r.sampled) {
    scan_unsampled(p, in, got, rep);
    if (p.backward) check_gradient_sums(p, in, got, r.cancel, rep);
  }
  return rep;
}

CheckReport verify(const Problem& p, const Inputs& in, const Outputs& got, CheckMode mode) {
  return judge(p, in, got, reference_for(p, in, mode));
}

std::string TensorCheck::at(int64_t flat) const {
  if (sampled.empty() || shape.size() < 3) return index_str(shape, flat);
  std::vector<int64_t> full = shape;
  full[2] = sampled.back() + 1;  // a shape with room for the real index
  int64_t inner = 1;
  for (size_t k = 3; k < shape.size(); ++k) inner *= shape[k];
  const int64_t outer = flat / (inner * shape[2]), k = flat / inner % shape[2];
  return index_str(full, (outer * full[2] + sampled[size_t(k)]) * inner + flat % inner);
}

namespace {
// "plain E, " where the tensor was compared with the yardstick too (an invariant is not).
std::string plain_part(const TensorCheck& t) {
  if (t.plain.where < 0) return "";
  std::ostringstream s;
  s.precision(3);
  s << "plain " << std::scientific << t.plain.max_abs << ", ";
  return s.str();
}
}  // namespace

std::string CheckReport::summary() const {
  std::ostringstream s;
  s.precision(3);
  for (const TensorCheck& t : tensors) {
    s << "  " << t.name << ": ";
    if (t.step.bad > 0 && t.step.where < 0)  // no finite element measured
      s << t.step.bad << " non-finite or wrong-infinity elements (first at "
        << t.at(t.step.first_bad) << "), no finite one measured";
    else
      s << "max abs err " << std::scientific << t.step.max_abs << " (" << plain_part(t) << "tol "
        << t.tol << ")";
    if (t.step.bad > 0 && t.step.where >= 0)
      s << ", " << t.step.bad << " non-finite or wrong-infinity elements (first at "
        << t.at(t.step.first_bad) << ")";
    s << (t.pass ? "  ok" : "  FAIL") << "\n";
  }
  return s.str();
}

std::string CheckReport::first_failure() const {
  for (const TensorCheck& t : tensors)
    if (!t.pass) {
      std::ostringstream s;
      s.precision(3);
      s << t.name << " ";
      if (t.step.bad)
        s << "has " << t.step.bad << " non-finite/wrong-infinity elements (first at "
          << t.at(t.step.first_bad) << ")";
      else
        s << "error " << std::scientific << t.step.max_abs << " > tol " << t.tol << " at "
          << t.at(t.step.where);
      return s.str();
    }
  return "";
}

}  // namespace ladder
