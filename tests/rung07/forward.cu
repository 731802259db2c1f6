// selftest.07: rung 07's forward kernels against the float64 oracle (needs an sm_90 GPU).
//
//   build/tests/07_selftest                   the checks below
//   build/tests/07_selftest --trace out.csv   the first block of tma-wgmma, intra-overlap and the
//                                             default, traced (bf16, d = 128, seq 4096):
//                                             variant,warp,role,phase,tile,t0_ns,t1_ns
//   build/tests/07_fault --expect-fault       (tests/fault07.sh) the forward built with
//                                             LADDER_07_FAULT=skip_k_wait: every TMA variant on
//                                             a shape whose K/V ring wraps 5 to 8 times; exit 0
//                                             only if every one of those checks FAILS
//
// 1. Philox4x32-10 (common/dropout.hpp) against Random123's known answers, host and device.
// 2. Every variant, dtype (bf16, fp16) and head dim (64, 128) on small awkward shapes. O and LSE
//    are poisoned (NaN) before each run and guarded by canaries after their ends. The persistent
//    variants run every case twice with one plan (the second launch finds the work counter the
//    first left, which must be zero again); cases with more work items than SMs are included.
// 3. Dropout and block-sparse masks (the persistent kernels' extras build), and an all-ones mask
//    that must give exactly the bits of 'persistent' without them.
// 4. Large shapes (batch x seq = 16384, heads x d = 2048; seq 1024 ... 16384, causal or not),
//    every variant, on sampled rows of two heads.
// 5. Strided layouts: Q, K, V, O in [B, S, H, d] buffers, every variant: the dense run's bits.
// Tolerances are relative (rows judged against their own magnitude, rung07_test.cuh): O within
// 4 unit roundoffs of T of its row's largest |O| (x 1 / (1 - p) with dropout); LSE within 1e-3 x
// max(1, |LSE|). A forward that drops the last 64 of 16384 keys moves O by ~6 % of that scale.
// Exit status 1: a check failed; 2: bad usage; 3: a kernel did not finish (TIMEOUT); 77: no
// sm_90 GPU (ctest: skipped).
#include <cstring>
#include <fstream>
#include <memory>

#include "dropout.hpp"
#include "rung07_test.cuh"
#include "wgmma_tma_fa3.hpp"

namespace {

using namespace rung07test;
using ladder::fa3::FwdParams;
using ladder::fa3::FwdPlan;
using ladder::fa3::Variant;

// ---- 1. Philox known answers ----------------------------------------------------------------

// Random123's kat_vectors for philox4x32-10: counter, key -> result.
constexpr uint32_t kKat[3][10] = {
    {0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
    {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0x408f276du,
     0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
    {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u, 0xd16cfe09u,
     0x94fdccebu, 0x5001e420u, 0x24126ea1u}};

// The known answers' inputs reach the device as a kernel parameter (by value).
struct KatInputs {
  uint32_t in[3][6];
};

__global__ void philox_kat_kernel(KatInputs k, uint32_t* out) {
  for (int i = 0; i < 3; ++i) {
    const ladder::dropout::Philox4 v = ladder::dropout::philox(k.in[i][0], k.in[i][1], k.in[i][2],
                                                               k.in[i][3], k.in[i][4], k.in[i][5]);
    for (int j = 0; j < 4; ++j) out[4 * i + j] = v.w[j];
  }
}

void check_philox() {
  ladder::DeviceBuffer<uint32_t> d_out(12);
  KatInputs k{};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 6; ++j) k.in[i][j] = kKat[i][j];
  philox_kat_kernel<<<1, 1>>>(k, d_out.get());
  CUDA_CHECK_LAUNCH();
  sync_or_die("philox KAT kernel");
  const std::vector<uint32_t> dev = d_out.download();
  bool host_ok = true, dev_ok = true;
  for (int i = 0; i < 3; ++i) {
    const ladder::dropout::Philox4 w = ladder::dropout::philox(kKat[i][0], kKat[i][1], kKat[i][2],
                                                               kKat[i][3], kKat[i][4], kKat[i][5]);
    for (int j = 0; j < 4; ++j) {
      host_ok = host_ok && w.w[j] == kKat[i][6 + j];
      dev_ok = dev_ok && dev[size_t(4 * i + j)] == kKat[i][6 + j];
    }
  }
  verdict(host_ok, "philox4x32-10 known answers, host");
  verdict(dev_ok, "philox4x32-10 known answers, device");
}

// ---- a problem on the device ----------------------------------------------------------------

struct Case {
  const char* name;
  int64_t batch, heads, heads_kv, seq_q, seq_k;
  bool causal;
  double scale;   // 0: 1/sqrt(d)
  double qk_mul;  // Q and K are N(0, qk_mul^2): large logits
};

// A problem's inputs (rounded to T) on host and device, and its outputs with canaries.
template <class T>
struct Fwd {
  ladder::Problem p;
  ladder::Inputs in;
  ladder::DeviceBuffer<T> q, k, v;
  Guarded<T> o;
  Guarded<float> lse;
  ladder::DeviceBuffer<unsigned int> counter{1};  // the persistent kernels' work counter
  std::unique_ptr<DeviceLists> lists;             // kv_block_lists of in.mask

  Fwd(const Case& c, int64_t d, uint64_t seed) {
    p.batch = c.batch, p.heads = c.heads, p.heads_kv = c.heads_kv;
    p.seq_q = c.seq_q, p.seq_k = c.seq_k, p.dim = d, p.causal = c.causal, p.scale = c.scale;
    p.dtype = dtype_of<T>();
    in.q = normal_tensor<T>({p.batch, p.heads, p.seq_q, d}, seed * 3 + 1, c.qk_mul);
    in.k = normal_tensor<T>({p.batch, p.heads_kv, p.seq_k, d}, seed * 3 + 2, c.qk_mul);
    in.v = normal_tensor<T>({p.batch, p.heads_kv, p.seq_k, d}, seed * 3 + 3, 1.0);
    q = ladder::DeviceBuffer<T>(size_t(p.q_numel())), q.upload(ladder::to_device<T>(in.q));
    k = ladder::DeviceBuffer<T>(size_t(p.kv_numel())), k.upload(ladder::to_device<T>(in.k));
    v = ladder::DeviceBuffer<T>(size_t(p.kv_numel())), v.upload(ladder::to_device<T>(in.v));
    o = Guarded<T>(size_t(p.q_numel()));
    lse = Guarded<float>(size_t(p.rows()));
  }
  void set_mask(ladder::BlockMask m) {
    in.mask = std::move(m);
    lists = std::make_unique<DeviceLists>(ladder::kv_block_lists(in.mask));
  }
  FwdParams params() const {
    FwdParams f;
    f.q = q.get(), f.k = k.get(), f.v = v.get(), f.o = o.get(), f.lse = lse.get();
    f.batch = int(p.batch), f.heads = int(p.heads), f.heads_kv = int(p.heads_kv);
    f.seq_q = int(p.seq_q), f.seq_k = int(p.seq_k), f.dim = int(p.dim);
    f.bf16 = std::is_same_v<T, bf16>;
    f.scale = float(p.softmax_scale());
    f.causal = p.causal;
    f.dropout_p = float(p.dropout), f.dropout_seed = p.dropout_seed;
    f.tile_counter = counter.get();
    if (lists) {
      f.kv_count = lists->count.get(), f.kv_index = lists->index.get();
      f.block_m = int(in.mask.block_q), f.block_n = int(in.mask.block_k);
      f.mask_batch = int(in.mask.batch), f.mask_heads = int(in.mask.heads);
    }
    return f;
  }
  ladder::Outputs reference() const {
    ladder::Outputs ref = ladder::Outputs::poisoned(p);
    ladder::reference::attention(p, in, ref);
    return ref;
  }
  void poison() { o.poison(), lse.poison(); }
};

double o_tol(bool is_bf16, double p) {
  return 4 * (is_bf16 ? unit_roundoff<bf16>() : unit_roundoff<fp16>()) / (1.0 - p);
}
constexpr double kLseTol = 1e-3;

// The errors of a run (its outputs on the device) against the oracle's, judged and printed.
template <class T>
bool judge(const char* tag, const std::string& what, const Fwd<T>& f, const ladder::Outputs& ref,
           double otol) {
  const ladder::Problem& p = f.p;
  const double eo =
      row_relative_error(download(f.o.get(), {p.batch, p.heads, p.seq_q, p.dim}), ref.o, p.dim);
  const double el = lse_error(download(f.lse.get(), {p.batch, p.heads, p.seq_q}), ref.lse);
  const bool guards = f.o.intact() && f.lse.intact();
  char line[320];
  std::snprintf(line, sizeof(line), "%-18s %-58s O %.2e (tol %.1e)  LSE %.2e (tol %.0e)%s", tag,
                what.c_str(), eo, otol, el, kLseTol, guards ? "" : "  GUARD OVERWRITTEN");
  return verdict(eo <= otol && el <= kLseTol && guards, line);
}

// make_plan, or a FAIL line (counted) and false: a rejected configuration fails its case
// without stopping the others.
bool try_plan(const FwdParams& p, Variant v, const std::string& what, FwdPlan* plan) {
  try {
    *plan = ladder::fa3::make_plan(p, v);
    return true;
  } catch (const std::exception& ex) {
    verdict(false,
            std::string(ladder::fa3::variant_name(v)) + " " + what + ": make_plan: " + ex.what());
    return false;
  }
}

// Every variant, in the ladder's order (the step's table).
std::vector<Variant> all_variants() {
  std::vector<Variant> v;
  for (const ladder::fa3::VariantInfo& x : ladder::fa3::kVariants) v.push_back(x.id);
  return v;
}

void run(const FwdPlan& plan, const std::string& what) {
  ladder::fa3::launch(plan);
  sync_or_die(what);
}

// ---- 2. every variant on awkward shapes -------------------------------------------------------

// 16 key tiles: the K/V ring (2 or 3 stages) wraps 5 to 8 times per item; logits x 2, so that
// a tile read before it has landed moves O by far more than the tolerance (--expect-fault).
// seq_q 384 runs three-consumers with Br = 192 at d = 64.
constexpr Case kRingWraps = {
    "ring wraps 5-8 times: 384 x 2048, gqa 2:1, logits x 2", 1, 4, 2, 384, 2048, false, 0, 2.0};

const Case kCases[] = {
    {"one tile 128x128", 1, 1, 1, 128, 128, false, 0, 1},
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
    {"large logits (Q, K x 2, scale 1), 129 x 191", 1, 1, 1, 129, 191, false, 1.0, 2},
    {"large logits causal, 200", 1, 1, 1, 200, 200, true, 1.0, 2},
    {"ring wraps: 300 x 1500, gqa 2:1", 1, 2, 1, 300, 1500, false, 0, 1},
    {"ring wraps causal: 300 x 1500", 1, 2, 1, 300, 1500, true, 0, 1},
    {"batch 2, heads 2, 384 causal", 2, 2, 2, 384, 384, true, 0, 1},
    // More work items than SMs: persistent CTAs take several items each.
    {"many items: batch 2, heads 48, 384 x 200", 2, 48, 48, 384, 200, false, 0, 1},
    {"many items causal, 700 x 150 (empty items), gqa 4:1", 2, 40, 10, 700, 150, true, 0, 1},
    kRingWraps,
};

const char* dtype_name(bool is_bf16) {
  return is_bf16 ? "bf16" : "fp16";
}

template <class T>
void check_variants(int d) {
  const bool is_bf16 = std::is_same_v<T, bf16>;
  uint64_t seed = 1;
  for (const Case& cs : kCases) {
    Fwd<T> f(cs, d, seed++);
    const ladder::Outputs ref = f.reference();
    const std::string what =
        std::string(dtype_name(is_bf16)) + " d=" + std::to_string(d) + " " + cs.name;
    for (const Variant v : all_variants()) {
      const char* name = ladder::fa3::variant_name(v);
      FwdPlan plan;
      if (!try_plan(f.params(), v, what, &plan)) continue;
      // The persistent variants twice: the second launch finds the counter the first left.
      for (int rep = 0; rep < (ladder::fa3::is_persistent(v) ? 2 : 1); ++rep) {
        f.poison();
        run(plan, std::string(name) + " " + what);
        judge(name, what + (rep ? " (again)" : ""), f, ref, o_tol(is_bf16, 0));
      }
    }
  }
}

// ---- 3. dropout and block-sparse --------------------------------------------------------------

template <class T>
void check_extras(int d) {
  const bool is_bf16 = std::is_same_v<T, bf16>;
  // The default variant: with dropout or a mask it runs the persistent kernel with them compiled
  // in, whose dense twin is 'persistent' (the same tiles at both head dims).
  const Variant v = Variant::three_consumers, twin = Variant::persistent;
  const std::string tag = std::string(ladder::fa3::variant_name(v)) + "+";
  uint64_t seed = 100;
  for (const Extra& x : kExtras) {
    Fwd<T> f(Case{x.name, x.B, x.H, x.Hkv, x.M, x.N, x.causal, 0, 1}, d, seed++);
    f.p.dropout = x.p, f.p.dropout_seed = kDropoutSeed;
    if (x.mask) f.set_mask(extra_mask(x, f.p, seed * 77));
    const std::string what =
        std::string(dtype_name(is_bf16)) + " d=" + std::to_string(d) + " " + x.name;
    FwdPlan plan;
    if (!try_plan(f.params(), v, what, &plan)) continue;
    f.poison();
    run(plan, "extras " + what);
    judge(tag.c_str(), what, f, f.reference(), o_tol(is_bf16, x.p));
    if (x.mask != 2) continue;
    // The same problem through the plain persistent kernel: the bits must be identical.
    const std::vector<unsigned char> o1 = f.o.bits(), l1 = f.lse.bits();
    f.lists.reset();
    FwdPlan dense;
    if (!try_plan(f.params(), twin, what, &dense)) continue;
    f.poison();
    run(dense, "dense twin of " + what);
    const bool same = o1 == f.o.bits() && l1 == f.lse.bits();
    verdict(same, tag + " " + what + ": sparse (all ones) and dense outputs " +
                      (same ? "bit-identical" : "DIFFER"));
  }
}

// ---- 4. large shapes, sampled rows --------------------------------------------------------------

// One buffer per input for every large shape (tokens x heads x d = 16384 x 2048 elements), N(0, 1)
// generated on the device, reinterpreted per shape.
template <class T>
struct Large {
  static constexpr size_t kElems = size_t(16384) * 2048;
  ladder::DeviceBuffer<T> q{kElems}, k{kElems}, v{kElems}, o{kElems};
  ladder::DeviceBuffer<float> lse{kElems / 64};  // B H M <= 16384 x 2048 / 64
  ladder::DeviceBuffer<unsigned int> counter{1};
  Large() {
    init_normal<T><<<1024, 256>>>(q.get(), kElems, 11);
    init_normal<T><<<1024, 256>>>(k.get(), kElems, 12);
    init_normal<T><<<1024, 256>>>(v.get(), kElems, 13);
    CUDA_CHECK_LAUNCH();
    sync_or_die("input initialisation");
  }
  FwdParams params(int seq, int d, bool causal) const {
    FwdParams p;
    p.q = q.get(), p.k = k.get(), p.v = v.get(), p.o = o.get(), p.lse = lse.get();
    p.tile_counter = counter.get();
    p.batch = 16384 / seq, p.heads = 2048 / d, p.heads_kv = p.heads;
    p.seq_q = p.seq_k = seq, p.dim = d, p.bf16 = std::is_same_v<T, bf16>;
    p.scale = float(1.0 / std::sqrt(double(d))), p.causal = causal;
    return p;
  }
};

// The sampled rows' reference: heads (0, 0) and (B-1, H-1) as a 2-head problem, the oracle on
// rows {0, 1, M/2 + 3, M - 1, 5, 127, 128, M - 2} of both.
struct Sampled {
  ladder::Problem p;
  ladder::Inputs in;
  std::vector<int64_t> rows;
  ladder::Outputs ref;
  size_t plane[2];  // offsets of the two heads' Q/O planes (elements)
};

template <class T>
Sampled sampled_reference(const Large<T>& lg, const FwdParams& f) {
  Sampled s;
  const int64_t M = f.seq_q, N = f.seq_k, d = f.dim;
  s.p.batch = 1, s.p.heads = s.p.heads_kv = 2, s.p.seq_q = M, s.p.seq_k = N, s.p.dim = d;
  s.p.causal = f.causal, s.p.scale = f.scale, s.p.dtype = dtype_of<T>();
  s.rows = {0, 1, M / 2 + 3, M - 1, 5, 127, 128, M - 2};
  s.in.q = Tensor({1, 2, M, d}), s.in.k = Tensor({1, 2, N, d}), s.in.v = Tensor({1, 2, N, d});
  const int64_t bh[2] = {0, int64_t(f.batch) * f.heads - 1};
  for (int i = 0; i < 2; ++i) {
    s.plane[i] = size_t(bh[i] * M * d);  // heads == heads_kv: K/V plane = Q plane
    const Tensor q = download(lg.q.get() + s.plane[i], {M * d});
    const Tensor k = download(lg.k.get() + s.plane[i], {N * d});
    const Tensor v = download(lg.v.get() + s.plane[i], {N * d});
    std::copy(q.data.begin(), q.data.end(), s.in.q.data.begin() + long(i * M * d));
    std::copy(k.data.begin(), k.data.end(), s.in.k.data.begin() + long(i * N * d));
    std::copy(v.data.begin(), v.data.end(), s.in.v.data.begin() + long(i * N * d));
  }
  s.ref = ladder::Outputs::poisoned(s.p);
  s.ref.o = Tensor::poisoned({1, 2, int64_t(s.rows.size()), d});
  s.ref.lse = Tensor::poisoned({1, 2, int64_t(s.rows.size())});
  ladder::reference::attention(s.p, s.in, s.ref, &s.rows);
  return s;
}

// The device's O and LSE of the sampled rows, as the oracle lays them out.
template <class T>
bool judge_sampled(const char* tag, const std::string& what, const Large<T>& lg, const Sampled& s) {
  const int64_t d = s.p.dim, R = int64_t(s.rows.size());
  Tensor o({1, 2, R, d}), lse({1, 2, R});
  for (int i = 0; i < 2; ++i)
    for (int64_t r = 0; r < R; ++r) {
      const size_t row = s.plane[i] / size_t(d) + size_t(s.rows[size_t(r)]);
      const Tensor x = download(lg.o.get() + row * size_t(d), {d});
      std::copy(x.data.begin(), x.data.end(), o.data.begin() + long((i * R + r) * d));
      const Tensor l = download(lg.lse.get() + row, {1});
      lse.data[size_t(i * R + r)] = l.data[0];
    }
  const double eo = row_relative_error(o, s.ref.o, d), el = lse_error(lse, s.ref.lse);
  const double otol = o_tol(std::is_same_v<T, bf16>, 0);
  char line[320];
  std::snprintf(line, sizeof(line), "%-18s %-58s O %.2e (tol %.1e)  LSE %.2e (tol %.0e)", tag,
                what.c_str(), eo, otol, el, kLseTol);
  return verdict(eo <= otol && el <= kLseTol, line);
}

template <class T>
void check_large() {
  const bool is_bf16 = std::is_same_v<T, bf16>;
  const Large<T> lg;
  for (int d : {64, 128})
    for (bool causal : {false, true})
      for (int seq : {1024, 2048, 4096, 8192, 16384}) {
        const FwdParams p = lg.params(seq, d, causal);
        const Sampled s = sampled_reference(lg, p);
        char what[160];
        std::snprintf(what, sizeof(what), "%s d=%-3d causal=%d seq=%-5d B=%-2d H=%-2d sampled rows",
                      dtype_name(is_bf16), d, int(causal), seq, p.batch, p.heads);
        for (const Variant v : all_variants()) {
          FwdPlan plan;
          if (!try_plan(p, v, what, &plan)) continue;
          CUDA_CHECK(cudaMemset(lg.o.get(), 0xFF, size_t(p.batch) * p.heads * seq * d * sizeof(T)));
          CUDA_CHECK(cudaMemset(lg.lse.get(), 0xFF, size_t(p.batch) * p.heads * seq * 4));
          run(plan, std::string(ladder::fa3::variant_name(v)) + " " + what);
          judge_sampled(ladder::fa3::variant_name(v), what, lg, s);
        }
      }
}

// ---- 5. strided layouts ----------------------------------------------------------------------

// Q, K, V read from and O written to [B, S, H, d] buffers seen through strides (a fused
// projection's view): every variant must give the bits of its dense run, since only addresses
// change.
template <class T>
void check_strided(int d) {
  const bool is_bf16 = std::is_same_v<T, bf16>;
  for (const Case& cs : {kCases[9], kCases[4]}) {
    Fwd<T> f(cs, d, 500);
    const ladder::Problem& p = f.p;
    const std::string what = std::string(dtype_name(is_bf16)) + " d=" + std::to_string(d) + " " +
                             cs.name + ", [B, S, H, d] strides";
    ladder::DeviceBuffer<T> q = bshd_copy(f.q.get(), p.batch, p.heads, p.seq_q, p.dim);
    ladder::DeviceBuffer<T> k = bshd_copy(f.k.get(), p.batch, p.heads_kv, p.seq_k, p.dim);
    ladder::DeviceBuffer<T> v = bshd_copy(f.v.get(), p.batch, p.heads_kv, p.seq_k, p.dim);
    ladder::DeviceBuffer<T> o(size_t(p.q_numel()));
    FwdParams s = f.params();
    s.q = q.get(), s.k = k.get(), s.v = v.get(), s.o = o.get();
    s.q_strides = s.o_strides = bshd_strides(p.heads, p.seq_q, p.dim);
    s.k_strides = s.v_strides = bshd_strides(p.heads_kv, p.seq_k, p.dim);
    for (const Variant var : all_variants()) {
      const char* name = ladder::fa3::variant_name(var);
      FwdPlan dense, strided;
      if (!try_plan(f.params(), var, what, &dense) || !try_plan(s, var, what, &strided)) continue;
      f.poison();
      run(dense, std::string(name) + " dense " + what);
      const std::vector<unsigned char> lse_bits = f.lse.bits();
      std::vector<T> o_dense(f.o.size());
      CUDA_CHECK(cudaMemcpy(o_dense.data(), f.o.get(), f.o.bytes(), cudaMemcpyDeviceToHost));
      f.poison();
      CUDA_CHECK(cudaMemset(o.get(), 0xFF, o.bytes()));
      run(strided, std::string(name) + " " + what);
      const std::vector<T> o_back =
          bhsd_to_bshd(o.download(), p.batch, p.heads, p.seq_q, p.dim, /*inverse=*/true);
      const bool same =
          std::memcmp(o_back.data(), o_dense.data(), o.bytes()) == 0 && lse_bits == f.lse.bits();
      verdict(same, std::string(name) + " " + what + ": O and LSE " +
                        (same ? "bit-identical to the dense run" : "DIFFER from the dense run"));
    }
  }
}

// ---- --trace
// -------------------------------------------------------------------------------------

int run_trace(const char* path) {
  namespace fa3 = ladder::fa3;
  const Large<bf16> lg;
  ladder::DeviceBuffer<unsigned long long> dtrace(fa3::kTraceBufferWords);
  std::ofstream csv(path);
  if (!csv) {
    std::printf("cannot write %s\n", path);
    return 1;
  }
  csv << "variant,warp,role,phase,tile,t0_ns,t1_ns\n";
  for (Variant v : {Variant::tma_wgmma, Variant::intra_overlap, Variant::three_consumers}) {
    FwdParams p = lg.params(4096, 128, false);  // batch 4, heads 16
    p.trace = dtrace.get();
    const std::string what = std::string("trace ") + fa3::variant_name(v);
    FwdPlan plan;
    if (!try_plan(p, v, what, &plan)) continue;
    for (int rep = 0; rep < 2; ++rep) {  // the second run is recorded, on a warm GPU
      CUDA_CHECK(cudaMemset(dtrace.get(), 0, dtrace.bytes()));
      CUDA_CHECK(cudaMemset(lg.o.get(), 0xFF, size_t(4) * 16 * 4096 * 128 * sizeof(bf16)));
      run(plan, what);
    }
    judge_sampled(fa3::variant_name(v), "bf16 d=128 seq=4096 traced run, sampled rows", lg,
                  sampled_reference(lg, p));
    const std::vector<unsigned long long> rec = dtrace.download();
    unsigned long long t_min = ~0ull;
    size_t n = 0;
    for (size_t i = 0; i < rec.size(); i += fa3::kTraceWords)
      if (rec[i] != 0) t_min = std::min(t_min, rec[i + 2]), ++n;
    for (int w = 0; w < fa3::kTraceWarps; ++w)
      for (int sl = 0; sl < fa3::kTraceSlots; ++sl) {
        const unsigned long long* r =
            rec.data() + (size_t(w) * fa3::kTraceSlots + size_t(sl)) * fa3::kTraceWords;
        if (r[0] == 0) continue;
        const int phase = int(r[0]);
        csv << fa3::variant_name(v) << ',' << w << ',' << fa3::trace_role_name(phase) << ','
            << fa3::trace_phase_name(phase) << ',' << r[1] << ',' << (r[2] - t_min) << ','
            << (r[3] - t_min) << '\n';
      }
    std::printf("trace %s: %zu records\n", fa3::variant_name(v), n);
  }
  std::printf("wrote %s\n", path);
  return g_failures ? 1 : 0;
}

// ---- --expect-fault: the self-test of the self-test
// ----------------------------------------------

// For a copy built with -DLADDER_07_FAULT=skip_k_wait (fwd_params.cuh says what it does): the
// kRingWraps case, bf16, both head dims, every TMA variant. The same case passes in the normal
// build (step 2), so a failure here is the fault's doing. Success = every one of these checks
// fails.
int run_expect_fault() {
  int caught = 0, missed = 0;
  bool fault_built = false;
  for (int d : {64, 128}) {
    Fwd<bf16> f(kRingWraps, d, 5);
    const ladder::Outputs ref = f.reference();
    const std::string what = "bf16 d=" + std::to_string(d) + " " + kRingWraps.name;
    for (const Variant v : all_variants()) {
      const char* name = ladder::fa3::variant_name(v);
      if (v == Variant::wgmma) {  // no mbarrier wait to move: nothing to inject
        std::printf(
            "SKIP   %-18s its K/V copies are cp.async by the computing threads, a tile "
            "ahead and waited for by wait_group and a block barrier: the fault (a TMA "
            "copy's full-barrier wait moved after the S GEMM) does not exist in it\n",
            name);
        continue;
      }
      FwdPlan plan;
      if (!try_plan(f.params(), v, what, &plan)) {
        ++missed;
        continue;
      }
      fault_built = ladder::fa3::describe(plan).find("FAULT=") != std::string::npos;
      f.poison();
      run(plan, std::string("fault-injected ") + name + " " + what);
      const int before = g_failures;
      judge(name, what, f, ref, o_tol(true, 0));
      const bool fails = g_failures > before;
      g_failures = before;  // here a failing check is the expected outcome
      std::printf("%s %-18s the check %s\n", fails ? "CAUGHT" : "MISSED", name,
                  fails ? "fails, as it must" : "passes: the fault went unseen");
      ++(fails ? caught : missed);
    }
  }
  if (!fault_built)
    std::printf(
        "this binary has no fault built in (build it with -DLADDER_07_FAULT=skip_k_wait)\n");
  const bool ok = fault_built && missed == 0;
  std::printf("%s: %d of %d fault-injected runs caught by the checks\n", ok ? "PASS" : "FAIL",
              caught, caught + missed);
  return ok ? 0 : 1;
}

int self_test(int argc, char** argv) {
  bool expect_fault = false;
  const char* trace_path = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--trace") && i + 1 < argc) {
      trace_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--expect-fault")) {
      expect_fault = true;
    } else {
      std::printf("usage: %s [--trace out.csv] [--expect-fault]\n", argv[0]);
      return 2;
    }
  }
  if (const int skip = need_sm90(); skip >= 0) return skip;
  if (trace_path) return run_trace(trace_path);
  if (expect_fault) return run_expect_fault();
  check_philox();
  check_variants<bf16>(64);
  check_variants<bf16>(128);
  check_variants<fp16>(64);
  check_variants<fp16>(128);
  check_extras<bf16>(64);
  check_extras<bf16>(128);
  check_extras<fp16>(64);
  check_extras<fp16>(128);
  check_large<bf16>();
  check_large<fp16>();
  check_strided<bf16>(64);
  check_strided<bf16>(128);
  check_strided<fp16>(64);
  std::printf("%s: %d failed\n", g_failures ? "FAIL" : "PASS", g_failures);
  return g_failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ladder::guarded([&] { return self_test(argc, argv); });
}
