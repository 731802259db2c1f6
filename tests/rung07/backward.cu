// selftest.07.backward: rung 07's backward pass against the float64 oracle (needs an sm_90 GPU).
//
//   build/tests/07_selftest_backward
//
// 1. For each dtype (bf16, fp16), head dim (64, 128) and dQ variant (tma-reduce, atomic): small
//    awkward shapes. The oracle's forward gives O (rounded to the dtype, as a caller's forward
//    would hand it over) and LSE, its backward the reference dQ, dK, dV. Outputs and workspace
//    are poisoned (NaN) before each run and guarded by canaries after their ends. Each shape
//    and variant once more on at most 3 persistent CTAs: dK, dV the full grid's bits; the
//    shapes with more than 3 K/V tiles (77 x 200, gqa 4:2 batch 2, 300 x 1500, batch 2 heads 2
//    384, the dropout ones) so have CTAs that take several in turn; the others run one CTA per
//    tile again. A persistent run starts with garbage in its work counter (the pre-pass zeroes
//    it) and must leave 0 there.
// 2. Dropout and block-sparse masks (the extras build), with an empty query block and an empty
//    key block; an all-ones mask must give exactly the dense kernel's dK and dV bits (dQ's fp32
//    sums are added in whatever order the CTAs finish: compared with the tolerance); dropout
//    without a mask on 3 CTAs as in 1.
// 3. Large shapes (batch x seq = 16384, heads x d = 2048; seq 1024, 4096, 16384; causal or not):
//    O and LSE from the rung's own forward (checked by selftest.07), then for each variant dQ on
//    sampled query rows and, up to seq 4096 (where the oracle's full backward of two heads takes
//    seconds), dK and dV on sampled keys, of two heads.
// 4. Strided layouts: Q, K, V, O, dO in [B, S, H, d] buffers: dK, dV the dense run's bits.
// Error = max |got - ref| / max |ref| per tensor (small shapes) or over the sampled rows of a
// tensor (large ones: a row of its own can be 0, dQ of a causal row that sees one key); tolerance 5
// unit roundoffs of bf16 (2e-2) or 10 of fp16 (5e-3): several times the rounding of P, dS and the
// outputs, far below what a wrong layout or a lost tile gives. Every element whose reference is
// structurally 0 (a query row or a key with nothing visible) must be exactly 0; a NaN anywhere
// fails. Exit status 1: a check failed; 2: bad usage; 3: a kernel did not finish (TIMEOUT); 77: no
// sm_90 GPU (ctest: skipped).
#include <memory>

#include "rung07_test.cuh"
#include "wgmma_tma_fa3.hpp"

namespace {

using namespace rung07test;
using ladder::fa3::BwdParams;
using ladder::fa3::BwdPlan;
using ladder::fa3::BwdVariant;

constexpr BwdVariant kVariants[] = {BwdVariant::tma_reduce, BwdVariant::atomic};

double tol_of(bool is_bf16) {
  return is_bf16 ? 2e-2 : 5e-3;
}

// max |got - ref| / max |ref| over a tensor (an all-zero reference: max |got| itself), with
// every structurally zero element required to be exactly zero and NaN failing.
struct TensorErr {
  double rel = 0;
  bool zeros_ok = true;
};
TensorErr compare(const Tensor& got, const Tensor& ref, const std::vector<char>& zero) {
  TensorErr e;
  double mx = 0, err = 0;
  for (size_t i = 0; i < ref.data.size(); ++i) {
    mx = std::max(mx, std::fabs(ref.data[i]));
    if (!std::isfinite(got.data[i])) err = INFINITY;
    if (zero[i] && got.data[i] != 0) e.zeros_ok = false;
    if (std::isfinite(got.data[i])) err = std::max(err, std::fabs(got.data[i] - ref.data[i]));
  }
  e.rel = mx > 0 ? err / mx : err;
  return e;
}

struct Case {
  const char* name;
  int64_t B, H, Hkv, M, N;
  bool causal;
  double scale;   // 0: 1/sqrt(d)
  double qk_mul;  // Q and K are N(0, qk_mul^2)
};

// A problem: inputs (rounded to T) on host and device, the oracle's forward and backward, the
// outputs and workspace with canaries.
template <class T>
struct Bwd {
  ladder::Problem p;
  ladder::Inputs in;
  ladder::Outputs ref;
  std::vector<char> dq_zero, dk_zero;  // structurally zero elements of dQ, of dK and dV
  ladder::DeviceBuffer<T> q, k, v, o, dout;
  ladder::DeviceBuffer<float> lse;
  Guarded<T> dq, dk, dv;
  Guarded<float> dq_acc, lse2, dsum;
  ladder::DeviceBuffer<unsigned int> counter{1};  // the persistent grid's work counter
  std::unique_ptr<DeviceLists> lists;             // q_block_lists of in.mask

  Bwd(const Case& c, int64_t d, uint64_t seed) {
    p.batch = c.B, p.heads = c.H, p.heads_kv = c.Hkv, p.seq_q = c.M, p.seq_k = c.N, p.dim = d;
    p.causal = c.causal, p.scale = c.scale, p.dtype = dtype_of<T>(), p.backward = true;
    in.q = normal_tensor<T>({c.B, c.H, c.M, d}, seed * 5 + 1, c.qk_mul);
    in.k = normal_tensor<T>({c.B, c.Hkv, c.N, d}, seed * 5 + 2, c.qk_mul);
    in.v = normal_tensor<T>({c.B, c.Hkv, c.N, d}, seed * 5 + 3, 1.0);
    in.dout = normal_tensor<T>({c.B, c.H, c.M, d}, seed * 5 + 4, 1.0);
  }
  // After the problem (dropout, mask) is complete: the oracle, and everything on the device.
  void prepare() {
    ref = ladder::Outputs::poisoned(p);
    ladder::reference::attention(p, in, ref);
    structural_zeros();
    auto up = [](ladder::DeviceBuffer<T>& b, const Tensor& t) {
      b = ladder::DeviceBuffer<T>(t.data.size());
      b.upload(ladder::to_device<T>(t));
    };
    up(q, in.q), up(k, in.k), up(v, in.v), up(dout, in.dout);
    up(o, ref.o);  // O rounded to T, as the forward in T gives it
    lse = ladder::DeviceBuffer<float>(ref.lse.data.size());
    lse.upload(ladder::to_float(ref.lse));
    if (!in.mask.empty()) lists = std::make_unique<DeviceLists>(ladder::q_block_lists(in.mask));
    BwdParams shape = params();
    const ladder::fa3::BwdWorkspace ws = ladder::fa3::bwd_workspace(shape);
    dq = Guarded<T>(size_t(p.q_numel())), dk = Guarded<T>(size_t(p.kv_numel()));
    dv = Guarded<T>(size_t(p.kv_numel()));
    dq_acc = Guarded<float>(ws.dq_acc_bytes / 4), lse2 = Guarded<float>(ws.lse2_bytes / 4);
    dsum = Guarded<float>(ws.dsum_bytes / 4);
  }
  // A query row that sees no key has dQ = 0, a key that no query sees dK = dV = 0, exactly.
  // Elsewhere a zero is a cancellation (a row with one visible key has P = 1 and dP - D = 0 in
  // exact arithmetic, which fp32 sums in another order miss by an ulp): the tolerance judges it.
  void structural_zeros() {
    std::vector<char> row_seen(size_t(p.rows()), 0),
        key_seen(size_t(p.batch * p.heads_kv * p.seq_k), 0);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads; ++h)
        for (int64_t i = 0; i < p.seq_q; ++i)
          for (int64_t j = 0; j < p.visible_keys(i); ++j) {
            if (!in.mask.visible(b, h, i, j)) continue;
            row_seen[size_t((b * p.heads + h) * p.seq_q + i)] = 1;
            key_seen[size_t((b * p.heads_kv + h / p.group()) * p.seq_k + j)] = 1;
          }
    auto expand = [&](const std::vector<char>& seen) {  // per row -> per element, 1 = zero
      std::vector<char> z(seen.size() * size_t(p.dim));
      for (size_t r = 0; r < seen.size(); ++r)
        std::fill_n(z.begin() + long(r * size_t(p.dim)), p.dim, seen[r] ? 0 : 1);
      return z;
    };
    dq_zero = expand(row_seen), dk_zero = expand(key_seen);
  }
  BwdParams params() const {
    BwdParams f;
    f.q = q.get(), f.k = k.get(), f.v = v.get(), f.o = o.get(), f.dout = dout.get();
    f.lse = lse.get(), f.dq = dq.get(), f.dk = dk.get(), f.dv = dv.get();
    f.dq_acc = dq_acc.get(), f.lse2 = lse2.get(), f.dsum = dsum.get();
    f.tile_counter = counter.get();
    f.batch = int(p.batch), f.heads = int(p.heads), f.heads_kv = int(p.heads_kv);
    f.seq_q = int(p.seq_q), f.seq_k = int(p.seq_k), f.dim = int(p.dim);
    f.bf16 = std::is_same_v<T, bf16>;
    f.scale = float(p.softmax_scale()), f.causal = p.causal;
    f.dropout_p = float(p.dropout), f.dropout_seed = p.dropout_seed;
    if (lists) {
      f.q_count = lists->count.get(), f.q_index = lists->index.get();
      f.block_m = int(in.mask.block_q), f.block_n = int(in.mask.block_k);
      f.mask_batch = int(in.mask.batch), f.mask_heads = int(in.mask.heads);
    }
    return f;
  }
  void poison() {
    dq.poison(), dk.poison(), dv.poison(), dq_acc.poison(), lse2.poison(), dsum.poison();
  }
  bool intact() const {
    return dq.intact() && dk.intact() && dv.intact() && dq_acc.intact() && lse2.intact() &&
           dsum.intact();
  }
};

// make_bwd_plan, or a FAIL line (counted) and false.
bool try_plan(const BwdParams& p, BwdVariant v, const std::string& what, BwdPlan* plan) {
  try {
    *plan = ladder::fa3::make_bwd_plan(p, v);
    return true;
  } catch (const std::exception& ex) {
    verdict(false, std::string(ladder::fa3::bwd_variant_name(v)) + " " + what +
                       ": make_bwd_plan: " + ex.what());
    return false;
  }
}

// One run of a problem against the oracle: the three errors. dkdv_bits: dK and dV as run.
template <class T>
bool check_run(Bwd<T>& b, const BwdParams& f, BwdVariant v, const std::string& what,
               std::vector<unsigned char>* dkdv_bits) {
  BwdPlan plan;
  if (!try_plan(f, v, what, &plan)) return false;
  b.poison();
  // A persistent plan must not depend on what the counter holds (the pre-pass zeroes it) and
  // must leave it at 0: the package's forward, which shares it, starts from 0.
  const bool persistent = plan.persistent();
  const unsigned int before = persistent ? 0xdeadu : 0u;
  CUDA_CHECK(cudaMemcpy(b.counter.get(), &before, sizeof before, cudaMemcpyHostToDevice));
  ladder::fa3::launch_bwd(plan);
  sync_or_die(std::string(ladder::fa3::bwd_variant_name(v)) + " " + what);
  unsigned int after = 1;
  CUDA_CHECK(cudaMemcpy(&after, b.counter.get(), sizeof after, cudaMemcpyDeviceToHost));
  const ladder::Problem& p = b.p;
  const TensorErr e[3] = {compare(download(b.dq.get(), {p.q_numel()}), b.ref.dq, b.dq_zero),
                          compare(download(b.dk.get(), {p.kv_numel()}), b.ref.dk, b.dk_zero),
                          compare(download(b.dv.get(), {p.kv_numel()}), b.ref.dv, b.dk_zero)};
  if (dkdv_bits) {
    *dkdv_bits = b.dk.bits();
    const std::vector<unsigned char> x = b.dv.bits();
    dkdv_bits->insert(dkdv_bits->end(), x.begin(), x.end());
  }
  const bool guards = b.intact();
  const double tol = tol_of(f.bf16);
  bool ok = guards && after == 0;
  for (const TensorErr& x : e) ok = ok && x.rel <= tol && x.zeros_ok;
  char line[320];
  std::snprintf(line, sizeof(line), "%-11s %-58s dQ %.1e dK %.1e dV %.1e (tol %.0e)%s%s%s",
                ladder::fa3::bwd_variant_name(v), what.c_str(), e[0].rel, e[1].rel, e[2].rel, tol,
                guards ? "" : "  GUARD OVERWRITTEN",
                e[0].zeros_ok && e[1].zeros_ok && e[2].zeros_ok ? "" : "  NONZERO WHERE 0",
                after == 0 ? "" : "  WORK COUNTER NOT RESET");
  return verdict(ok, line);
}

const Case kCases[] = {
    {"one tile 128 x 128", 1, 1, 1, 128, 128, false, 0, 1},
    {"seq 1", 1, 1, 1, 1, 1, false, 0, 1},
    {"seq 17", 1, 1, 1, 17, 17, false, 0, 1},
    {"seq 113 causal", 1, 1, 1, 113, 113, true, 0, 1},
    {"200 x 77", 1, 2, 2, 200, 77, false, 0, 1},
    {"200 x 77 causal (rows < 123 see no key)", 1, 2, 2, 200, 77, true, 0, 1},
    {"77 x 200", 1, 2, 2, 77, 200, false, 0, 1},
    {"77 x 200 causal", 1, 2, 2, 77, 200, true, 0, 1},
    {"gqa 4:1, 130 x 260", 1, 4, 1, 130, 260, false, 0, 1},
    {"gqa 4:2, batch 2, 257 causal", 2, 4, 2, 257, 257, true, 0, 1},
    {"scale 0.3, 150 x 300", 1, 1, 1, 150, 300, false, 0.3, 1},
    {"larger logits (Q, K x 2), 129 x 191", 1, 1, 1, 129, 191, false, 0, 2},
    {"ring wraps: 300 x 1500, gqa 2:1", 1, 2, 1, 300, 1500, false, 0, 1},
    {"ring wraps: 1000 x 300 causal, gqa 2:1", 1, 2, 1, 1000, 300, true, 0, 1},
    {"batch 2, heads 2, 384 causal", 2, 2, 2, 384, 384, true, 0, 1},
};

std::string label(bool is_bf16, int d, const char* name) {
  return std::string(is_bf16 ? "bf16" : "fp16") + " d=" + std::to_string(d) + " " + name;
}

// The persistent kernel on at most 3 CTAs: where a shape has more than 3 K/V tiles (units), CTAs
// take several in turn from the work counter, and the result must be the oracle's dQ and the
// full grid's dK, dV bits (each tile's dK, dV come from one CTA's registers, whichever CTA it
// is). Shapes with 3 tiles or fewer run one CTA per tile, as on the full grid.
template <class T>
void check_few_ctas(Bwd<T>& b, const BwdParams& f, BwdVariant v, const std::string& what,
                    const std::vector<unsigned char>& full_bits) {
  BwdParams few = f;
  few.max_ctas = 3;
  std::vector<unsigned char> bits;
  check_run(b, few, v, what + " (3 CTAs)", &bits);
  const bool same = !bits.empty() && bits == full_bits;
  verdict(same,
          std::string(ladder::fa3::bwd_variant_name(v)) + " " + what +
              ": dK, dV on 3 CTAs and on the full grid: " + (same ? "bit-identical" : "DIFFER"));
}

template <class T>
void check_cases(int d) {
  uint64_t seed = 1;
  for (const Case& cs : kCases) {
    Bwd<T> b(cs, d, seed++);
    b.prepare();
    const std::string what = label(std::is_same_v<T, bf16>, d, cs.name);
    for (const BwdVariant v : kVariants) {
      std::vector<unsigned char> bits;
      check_run(b, b.params(), v, what, &bits);
      check_few_ctas(b, b.params(), v, what, bits);
    }
  }
}

template <class T>
void check_extras(int d) {
  uint64_t seed = 100;
  for (const Extra& x : kExtras) {
    Bwd<T> b(Case{x.name, x.B, x.H, x.Hkv, x.M, x.N, x.causal, 0, 1}, d, seed++);
    b.p.dropout = x.p, b.p.dropout_seed = kDropoutSeed;
    if (x.mask) b.in.mask = extra_mask(x, b.p, seed * 77);
    b.prepare();
    const std::string what = label(std::is_same_v<T, bf16>, d, x.name);
    for (const BwdVariant v : kVariants) {
      std::vector<unsigned char> run_bits, dense_bits;
      check_run(b, b.params(), v, what, x.mask == 2 || !x.mask ? &run_bits : nullptr);
      if (!x.mask) check_few_ctas(b, b.params(), v, what, run_bits);
      if (x.mask != 2) continue;
      // The same problem through the dense kernel: dK and dV must be the same bits.
      BwdParams dense = b.params();
      dense.q_count = dense.q_index = nullptr;
      check_run(b, dense, v, what + " (dense twin)", &dense_bits);
      const bool same = !run_bits.empty() && run_bits == dense_bits;
      verdict(same, std::string(ladder::fa3::bwd_variant_name(v)) + " " + what +
                        ": dK, dV of the all-ones mask and dense: " +
                        (same ? "bit-identical" : "DIFFER"));
    }
  }
}

// Q, K, V, O and dO read from [B, S, H, d] buffers through strides (a fused projection's view):
// dK and dV must be the dense run's bits, dQ (fp32 sums in whatever order the CTAs finish) the
// oracle's within the tolerance.
template <class T>
void check_strided(int d) {
  for (const Case& cs : {kCases[9], kCases[4]}) {
    Bwd<T> b(cs, d, 500);
    b.prepare();
    const ladder::Problem& p = b.p;
    const std::string what = label(std::is_same_v<T, bf16>, d, cs.name) + ", [B, S, H, d] strides";
    ladder::DeviceBuffer<T> q = bshd_copy(b.q.get(), p.batch, p.heads, p.seq_q, p.dim);
    ladder::DeviceBuffer<T> k = bshd_copy(b.k.get(), p.batch, p.heads_kv, p.seq_k, p.dim);
    ladder::DeviceBuffer<T> v = bshd_copy(b.v.get(), p.batch, p.heads_kv, p.seq_k, p.dim);
    ladder::DeviceBuffer<T> o = bshd_copy(b.o.get(), p.batch, p.heads, p.seq_q, p.dim);
    ladder::DeviceBuffer<T> dout = bshd_copy(b.dout.get(), p.batch, p.heads, p.seq_q, p.dim);
    BwdParams s = b.params();
    s.q = q.get(), s.k = k.get(), s.v = v.get(), s.o = o.get(), s.dout = dout.get();
    s.q_strides = s.o_strides = s.dout_strides = bshd_strides(p.heads, p.seq_q, p.dim);
    s.k_strides = s.v_strides = bshd_strides(p.heads_kv, p.seq_k, p.dim);
    for (const BwdVariant var : kVariants) {
      std::vector<unsigned char> dense_bits, strided_bits;
      check_run(b, b.params(), var, what + " (dense)", &dense_bits);
      check_run(b, s, var, what, &strided_bits);
      const bool same = !dense_bits.empty() && dense_bits == strided_bits;
      verdict(same, std::string(ladder::fa3::bwd_variant_name(var)) + " " + what + ": dK, dV " +
                        (same ? "bit-identical to the dense run" : "DIFFER"));
    }
  }
}

// ---- large shapes -------------------------------------------------------------------------------

template <class T>
struct Large {
  static constexpr size_t kElems = size_t(16384) * 2048;  // tokens x (heads x d), every shape
  static constexpr size_t kRows = kElems / 64;            // B H M <= 16384 x 2048 / 64
  ladder::DeviceBuffer<T> q{kElems}, k{kElems}, v{kElems}, o{kElems}, dout{kElems};
  ladder::DeviceBuffer<T> dq{kElems}, dk{kElems}, dv{kElems};
  ladder::DeviceBuffer<float> lse{kRows}, lse2{kRows}, dsum{kRows}, dq_acc{kElems};
  ladder::DeviceBuffer<unsigned int> counter{1};
  Large() {
    init_normal<T><<<1024, 256>>>(q.get(), kElems, 21);
    init_normal<T><<<1024, 256>>>(k.get(), kElems, 22);
    init_normal<T><<<1024, 256>>>(v.get(), kElems, 23);
    init_normal<T><<<1024, 256>>>(dout.get(), kElems, 24);
    CUDA_CHECK_LAUNCH();
    sync_or_die("input initialisation");
  }
};

// O and LSE of a large shape by the rung's default forward.
template <class T>
void large_forward(const Large<T>& lg, const BwdParams& b) {
  ladder::fa3::FwdParams f;
  f.q = lg.q.get(), f.k = lg.k.get(), f.v = lg.v.get(), f.o = lg.o.get(), f.lse = lg.lse.get();
  f.batch = b.batch, f.heads = b.heads, f.heads_kv = b.heads_kv;
  f.seq_q = b.seq_q, f.seq_k = b.seq_k, f.dim = b.dim, f.bf16 = b.bf16;
  f.scale = b.scale, f.causal = b.causal, f.tile_counter = lg.counter.get();
  ladder::fa3::launch(ladder::fa3::make_plan(f, ladder::fa3::Variant::three_consumers));
  sync_or_die("forward for the backward's large shape");
}

// The oracle on heads (0, 0) and (B-1, H-1) of a large shape, as a 2-head problem: full (dQ,
// dK, dV) when keys are sampled, else dQ on the sampled rows alone.
struct Sampled {
  ladder::Problem p;
  ladder::Inputs in;
  ladder::Outputs ref;
  std::vector<int64_t> rows, keys;  // keys: empty unless dK, dV are checked
  size_t plane[2];
};

template <class T>
Sampled sampled_reference(const Large<T>& lg, const BwdParams& f, bool keys) {
  Sampled s;
  const int64_t M = f.seq_q, N = f.seq_k, d = f.dim;
  s.p.batch = 1, s.p.heads = s.p.heads_kv = 2, s.p.seq_q = M, s.p.seq_k = N, s.p.dim = d;
  s.p.causal = f.causal, s.p.scale = f.scale, s.p.dtype = dtype_of<T>(), s.p.backward = true;
  s.rows = {0, 1, 127, 128, M / 2 + 3, M - 1};
  if (keys) s.keys = {0, 1, 127, 128, N / 2 + 3, N - 1};
  s.in.q = Tensor({1, 2, M, d}), s.in.dout = Tensor({1, 2, M, d});
  s.in.k = Tensor({1, 2, N, d}), s.in.v = Tensor({1, 2, N, d});
  const int64_t bh[2] = {0, int64_t(f.batch) * f.heads - 1};
  for (int i = 0; i < 2; ++i) {
    s.plane[i] = size_t(bh[i] * M * d);  // heads == heads_kv: K/V plane = Q plane
    const std::pair<const T*, Tensor*> parts[] = {{lg.q.get(), &s.in.q},
                                                  {lg.dout.get(), &s.in.dout},
                                                  {lg.k.get(), &s.in.k},
                                                  {lg.v.get(), &s.in.v}};
    for (const auto& [src, dst] : parts) {
      const Tensor x = download(src + s.plane[i], {M * d});
      std::copy(x.data.begin(), x.data.end(), dst->data.begin() + long(i * M * d));
    }
  }
  s.ref = ladder::Outputs::poisoned(s.p);
  if (keys) {
    ladder::reference::attention(s.p, s.in, s.ref);
  } else {
    const int64_t R = int64_t(s.rows.size());
    s.ref.o = Tensor::poisoned({1, 2, R, d}), s.ref.lse = Tensor::poisoned({1, 2, R});
    s.ref.dq = Tensor::poisoned({1, 2, R, d});
    ladder::reference::attention(s.p, s.in, s.ref, &s.rows);
  }
  return s;
}

// Rows `idx` of the two heads of a [B H, n, d] device tensor, and the same rows of the oracle's.
template <class T>
double sampled_error(const T* dev, const Sampled& s, const Tensor& ref, int64_t n,
                     const std::vector<int64_t>& idx, bool compact) {
  const int64_t d = s.p.dim, R = int64_t(idx.size());
  Tensor got({2 * R, d}), want({2 * R, d});
  for (int i = 0; i < 2; ++i)
    for (int64_t r = 0; r < R; ++r) {
      const Tensor x = download(dev + s.plane[i] + size_t(idx[size_t(r)] * d), {d});
      std::copy(x.data.begin(), x.data.end(), got.data.begin() + long((i * R + r) * d));
      const int64_t at = (i * (compact ? R : n) + (compact ? r : idx[size_t(r)])) * d;
      std::copy_n(ref.data.begin() + long(at), d, want.data.begin() + long((i * R + r) * d));
    }
  return tensor_relative_error(got, want);
}

template <class T>
void check_large() {
  const bool is_bf16 = std::is_same_v<T, bf16>;
  const Large<T> lg;
  for (int d : {64, 128})
    for (bool causal : {false, true})
      for (int seq : {1024, 4096, 16384}) {
        BwdParams p;
        p.q = lg.q.get(), p.k = lg.k.get(), p.v = lg.v.get(), p.o = lg.o.get();
        p.dout = lg.dout.get(), p.lse = lg.lse.get();
        p.dq = lg.dq.get(), p.dk = lg.dk.get(), p.dv = lg.dv.get();
        p.dq_acc = lg.dq_acc.get(), p.lse2 = lg.lse2.get(), p.dsum = lg.dsum.get();
        p.tile_counter = lg.counter.get();  // (the forward's: one stream)
        p.batch = 16384 / seq, p.heads = 2048 / d, p.heads_kv = p.heads;
        p.seq_q = p.seq_k = seq, p.dim = d, p.bf16 = is_bf16;
        p.scale = float(1.0 / std::sqrt(double(d))), p.causal = causal;
        large_forward(lg, p);
        const bool keys = seq <= 4096;
        const Sampled s = sampled_reference(lg, p, keys);
        char what[160];
        std::snprintf(what, sizeof(what), "%s d=%-3d causal=%d seq=%-5d B=%-2d H=%-2d sampled %s",
                      is_bf16 ? "bf16" : "fp16", d, int(causal), seq, p.batch, p.heads,
                      keys ? "rows, keys" : "rows");
        for (const BwdVariant v : kVariants) {
          BwdPlan plan;
          if (!try_plan(p, v, what, &plan)) continue;
          const size_t n = size_t(p.batch) * p.heads * seq * d;
          for (T* x : {lg.dq.get(), lg.dk.get(), lg.dv.get()})
            CUDA_CHECK(cudaMemset(x, 0xFF, n * sizeof(T)));
          ladder::fa3::launch_bwd(plan);
          sync_or_die(std::string(ladder::fa3::bwd_variant_name(v)) + " " + what);
          double err = sampled_error(lg.dq.get(), s, s.ref.dq, seq, s.rows, !keys);
          if (keys) {
            err = std::max(err, sampled_error(lg.dk.get(), s, s.ref.dk, seq, s.keys, false));
            err = std::max(err, sampled_error(lg.dv.get(), s, s.ref.dv, seq, s.keys, false));
          }
          unsigned int counter = 1;  // the next forward starts from it
          CUDA_CHECK(
              cudaMemcpy(&counter, lg.counter.get(), sizeof counter, cudaMemcpyDeviceToHost));
          char line[320];
          std::snprintf(line, sizeof(line), "%-11s %s: worst %.1e (tol %.0e)%s",
                        ladder::fa3::bwd_variant_name(v), what, err, tol_of(is_bf16),
                        counter == 0 ? "" : "  WORK COUNTER NOT RESET");
          verdict(err <= tol_of(is_bf16) && counter == 0, line);
        }
      }
}

int self_test(int argc, char** argv) {
  if (argc > 1) {
    std::printf("usage: %s\n", argv[0]);
    return 2;
  }
  if (const int skip = need_sm90(); skip >= 0) return skip;
  check_cases<bf16>(64);
  check_cases<bf16>(128);
  check_cases<fp16>(64);
  check_cases<fp16>(128);
  check_extras<bf16>(64);
  check_extras<bf16>(128);
  check_extras<fp16>(64);
  check_extras<fp16>(128);
  check_large<bf16>();
  check_large<fp16>();
  check_strided<bf16>(64);
  check_strided<bf16>(128);
  check_strided<fp16>(128);
  std::printf("%s: %d failed\n", g_failures ? "FAIL" : "PASS", g_failures);
  return g_failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ladder::guarded([&] { return self_test(argc, argv); });
}
