#include "check.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
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

bool parse_check_mode(const std::string& s, CheckMode& out) {
  static const std::pair<const char*, CheckMode> names[] = {{"auto", CheckMode::automatic},
                                                            {"full", CheckMode::full},
                                                            {"sampled", CheckMode::sampled},
                                                            {"none", CheckMode::none}};
  for (const auto& [name, mode] : names)
    if (s == name) return out = mode, true;
  return false;
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
// A few query rows spread over the sequence, the same in every (batch, head).
std::vector<int64_t> sample_rows(const Problem& p) {
  std::vector<int64_t> r = {0, 1, p.seq_q / 3, p.seq_q / 2, p.seq_q - 2, p.seq_q - 1};
  std::mt19937_64 rng(p.seed + 7);
  for (int k = 0; k < 6; ++k) r.push_back(int64_t(rng() % uint64_t(p.seq_q)));
  r.erase(std::remove_if(r.begin(), r.end(), [&](int64_t x) { return x < 0 || x >= p.seq_q; }),
          r.end());
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return r;
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
  Problem c = p;  // the problem the reference computes: every row, or just the sampled ones
  if (r.sampled) {
    r.rows = sample_rows(p);
    c.seq_q = int64_t(r.rows.size());
    r.mode =
        "sampled: " + std::to_string(r.rows.size()) + " query rows per head (dK, dV not checked)";
  } else {
    r.mode = "full";
  }
  r.ref = r.sampled_outputs(p, c.seq_q), r.plain = r.sampled_outputs(p, c.seq_q);
  const std::vector<int64_t>* rows = r.sampled ? &r.rows : nullptr;
  reference::attention(p, in, r.ref, rows);
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

Outputs Reference::sampled_outputs(const Problem& p, int64_t seq_q) const {
  // Sampled: the rows are written compactly ([B, H, R, ...]); there are no dK, dV.
  Problem q = p;
  q.seq_q = seq_q;
  q.backward = p.backward && !sampled;
  Outputs o = Outputs::poisoned(q);
  if (p.backward && sampled) o.dq = Tensor::poisoned({p.batch, p.heads, seq_q, p.dim});
  return o;
}

CheckReport judge(const Problem& p, const Inputs& in, const Outputs& got, const Reference& r) {
  CheckReport rep;
  rep.mode = r.mode;
  if (!r.checked) return rep;
  Outputs gathered;
  const Outputs& step = r.sampled ? gathered : got;
  if (r.sampled) {  // the step's sampled rows, laid out as the reference's
    const int64_t R = int64_t(r.rows.size());
    gathered = r.sampled_outputs(p, R);
    auto gather = [&](const Tensor& from, Tensor& to, int64_t row_len) {
      if (to.empty()) return;
      for (int64_t bh = 0; bh < p.batch * p.heads; ++bh)
        for (int64_t k = 0; k < R; ++k)
          for (int64_t e = 0; e < row_len; ++e)
            to.data[size_t((bh * R + k) * row_len + e)] =
                from.data[size_t((bh * p.seq_q + r.rows[size_t(k)]) * row_len + e)];
    };
    gather(got.o, gathered.o, p.dim);
    gather(got.lse, gathered.lse, 1);
    gather(got.dq, gathered.dq, p.dim);
  }

  // The floor: one unit roundoff of the output's scale (its largest reference value), which a
  // correct result rounded once to the stored type always meets. LSE is stored in fp32 by every
  // rung below fp64, so it is held to fp32's. dQ and dK add a cancellation term: where
  // dS = P (dP - D) cancels exactly (a row with one visible key), the yardstick may cancel to
  // exactly 0 and a correct kernel, summing dP and D in another order, to d accumulation
  // roundoffs of the terms, so those are allowed too (at fp32's roundoff, not the dtype's).
  const double u = unit_roundoff(p.dtype), u_acc = unit_roundoff(accumulation_type(p.dtype));
  auto check = [&](const char* name, const Tensor& g, const Tensor& ref, const Tensor& b,
                   double factor, double unit, double extra) {
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
    rep.pass = rep.pass && t.pass;
    rep.tensors.push_back(t);
  };
  const Outputs &ref = r.ref, &plain = r.plain;
  check("O", step.o, ref.o, plain.o, 2.0, u, 0.0);
  check("LSE", step.lse, ref.lse, plain.lse, 2.0, u_acc, 0.0);
  if (p.backward) {
    check("dQ", step.dq, ref.dq, plain.dq, 3.0, u, r.cancel);
    if (!r.sampled) {
      check("dK", step.dk, ref.dk, plain.dk, 3.0, u, r.cancel);
      check("dV", step.dv, ref.dv, plain.dv, 3.0, u, 0.0);
    }
  }
  if (r.sampled) scan_unsampled(p, in, got, rep);
  return rep;
}

CheckReport verify(const Problem& p, const Inputs& in, const Outputs& got, CheckMode mode) {
  return judge(p, in, got, reference_for(p, in, mode));
}

std::string CheckReport::summary() const {
  std::ostringstream s;
  s.precision(3);
  for (const TensorCheck& t : tensors) {
    s << "  " << t.name << ": ";
    if (t.step.bad > 0 && t.step.where < 0)  // no finite element measured
      s << t.step.bad << " non-finite or wrong-infinity elements (first at "
        << index_str(t.shape, t.step.first_bad) << "), no finite one measured";
    else
      s << "max abs err " << std::scientific << t.step.max_abs << " (plain " << t.plain.max_abs
        << ", tol " << t.tol << ")";
    if (t.step.bad > 0 && t.step.where >= 0)
      s << ", " << t.step.bad << " non-finite or wrong-infinity elements (first at "
        << index_str(t.shape, t.step.first_bad) << ")";
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
          << index_str(t.shape, t.step.first_bad) << ")";
      else
        s << "error " << std::scientific << t.step.max_abs << " > tol " << t.tol << " at "
          << index_str(t.shape, t.step.where);
      return s.str();
    }
  return "";
}

}  // namespace ladder
