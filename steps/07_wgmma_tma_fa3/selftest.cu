// Standalone self-test and benchmark of step 07's forward kernels (needs an sm_90 GPU):
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isteps/07_wgmma_tma_fa3
//     -Icommon steps/07_wgmma_tma_fa3/selftest.cu steps/07_wgmma_tma_fa3/wgmma_tma_fa3.cu
//     -o /tmp/st07 && /tmp/st07
//   (one command line, from the repository root; CMake builds the same as build/steps/07_selftest)
//
//   /tmp/st07                     checks, then timings (two to three minutes on an H100)
//   /tmp/st07 --no-timing         checks only
//   /tmp/st07 --fp16-first        time fp16 before bf16 (to see whether the order, i.e. the
//                                 GPU's clock after minutes of load, moves the dtypes apart)
//   /tmp/st07 --trace out.csv     the first block of tma-wgmma, intra-overlap and the default,
//                                 traced (bf16, d = 128, seq 4096):
//                                 variant,warp,role,phase,tile,t0_ns,t1_ns
//   /tmp/st07 --expect-fault      for a copy built with -DLADDER_07_FAULT=skip_k_wait (both
//                                 files): every variant on a shape whose K/V ring wraps 5 to 8
//                                 times; exit status 0 only if every one of those checks FAILS
//                                 (the missing wait was caught), else 1 (also with no fault built)
//
// 1. Philox4x32-10 against Random123's known answers, on the host and on the device.
// 2. For every variant, dtype (bf16, fp16) and head dim (64, 128): small awkward shapes against
//    a float64 reference computed here from the same rounded inputs (N(0,1)). O and LSE are
//    poisoned (0xFF bytes, NaN) before each run and guarded by a canary after their ends.
//    Tolerances (max abs error): O 2e-2 (bf16), 4e-3 (fp16: the worst case of rounding P and O
//    to 11 bits with |V| ~ 4.5), LSE 1e-2; dropout multiplies the O tolerance by 1/(1-p).
//    The persistent variants run every case twice with the same plan (the second launch finds
//    the work counter the first one left, which must be zero again), and cases with more work
//    items than SMs (CTAs that take several items, some with no visible key) are included.
// 3. The persistent kernels' dropout and block-sparse builds: p = 0.1 and 0.5, block masks with
//    an empty query block, broadcast masks, 256 x 256 mask blocks, and an all-ones mask that
//    must give exactly the bits of the same kernel without them ('persistent').
// 4. Flash shapes (batch * seq = 16384, heads * d = 2048; seq 1024 ... 16384; causal 0/1):
//    each configuration is checked on sampled rows against the float64 reference, and only if
//    it passes (and its variant passed step 2) timed: 3 warm-ups, median of 20, L2 flushed by a
//    memset of twice its size before every run. TFLOP/s = 4 B H M N d (/ 2 causal) / time.
// Every launch is followed by a synchronisation with a time limit: a kernel that does not
// finish in 20 s (a barrier that never completes) is reported with its case, and the program
// exits with status 3. Exit status 1: a check failed; 2: bad usage; 77: no sm_90 GPU (ctest:
// skipped).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "dropout.hpp"
#include "hopper.cuh"
#include "selftest_util.cuh"
#include "wgmma_tma_fa3.hpp"

namespace {

using ladder::fa3::FwdParams;
using ladder::fa3::FwdPlan;
using ladder::fa3::kNumVariants;
using ladder::fa3::Variant;
using namespace selftest07;  // selftest_util.cuh

// ---- Philox, host side (written from the contract's formulas, independently of the kernel's
// register-layout version in hopper.cuh / wgmma_tma_fa3.cu) --------------------------------------
struct Words {
  uint32_t w[4];
};
Words philox_host(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c0, p1 = uint64_t(0xCD9E8D57u) * c2;
    const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0, n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c1 = uint32_t(p1), c3 = uint32_t(p0), c0 = n0, c2 = n2;
    k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
  }
  return Words{{c0, c1, c2, c3}};
}
uint32_t drop_threshold(double p) {
  return uint32_t(std::min(65535.0, std::floor(p * 65536 + 0.5)));
}
bool keep_host(uint64_t seed, uint32_t thresh, int b, int h, int i, int j) {
  const int I = i >> 4, r = i & 15, J = j >> 4, c = j & 15;
  const uint32_t lane = uint32_t((r & 7) * 4 + ((c & 7) >> 1));
  const Words w = philox_host(uint32_t(J) * 32u + lane, uint32_t(I), uint32_t(h), uint32_t(b),
                              uint32_t(seed), uint32_t(seed >> 32));
  const int k = (r >> 3) * 4 + (c >> 3) * 2 + (c & 1);
  return ((w.w[k >> 1] >> (16 * (k & 1))) & 0xffffu) >= thresh;
}

__global__ void philox_kat_kernel(uint32_t* out) {  // the device side of common/dropout.hpp
  using ladder::dropout::philox;
  const ladder::dropout::Philox4 v[3] = {
      philox(0, 0, 0, 0, 0, 0),
      philox(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu),
      philox(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u)};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) out[4 * i + j] = v[i].w[j];
}

void check_philox() {
  // Random123's kat_vectors for philox4x32-10: counter, key -> result.
  const uint32_t kat[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
      {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0x408f276du,
       0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
      {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u, 0xd16cfe09u,
       0x94fdccebu, 0x5001e420u, 0x24126ea1u}};
  uint32_t* d_out = nullptr;
  CK(cudaMalloc(&d_out, 12 * sizeof(uint32_t)));
  philox_kat_kernel<<<1, 1>>>(d_out);
  CK(cudaGetLastError());
  sync_or_die("philox KAT kernel");
  uint32_t dev[12];
  CK(cudaMemcpy(dev, d_out, sizeof(dev), cudaMemcpyDeviceToHost));
  CK(cudaFree(d_out));
  bool host_ok = true, dev_ok = true;
  for (int i = 0; i < 3; ++i) {
    const Words w = philox_host(kat[i][0], kat[i][1], kat[i][2], kat[i][3], kat[i][4], kat[i][5]);
    for (int j = 0; j < 4; ++j) {
      host_ok = host_ok && w.w[j] == kat[i][6 + j];
      dev_ok = dev_ok && dev[4 * i + j] == kat[i][6 + j];
    }
  }
  std::printf("%s philox4x32-10 known answers, host\n", host_ok ? "PASS" : "FAIL");
  std::printf("%s philox4x32-10 known answers, device\n", dev_ok ? "PASS" : "FAIL");
  g_failures += !host_ok + !dev_ok;
}

// ---- the float64 reference ------------------------------------------------------------------

// A block mask [mb, mh, nI, nJ] of 0/1 and its per-row lists of visible key blocks.
struct BlockMask {
  int bm = 128, bn = 128, mb = 1, mh = 1, nI = 0, nJ = 0;
  std::vector<uint8_t> bits;
  std::vector<int> count, index;
  bool visible(int b, int h, int i, int j) const {
    const int b2 = mb == 1 ? 0 : b, h2 = mh == 1 ? 0 : h;
    return bits[((size_t(b2) * mh + h2) * nI + i / bm) * nJ + j / bn] != 0;
  }
  void build_lists() {
    count.assign(size_t(mb) * mh * nI, 0);
    index.assign(size_t(mb) * mh * nI * nJ, 0);
    for (size_t row = 0; row < count.size(); ++row)
      for (int J = 0; J < nJ; ++J)
        if (bits[row * nJ + J]) index[row * nJ + size_t(count[row]++)] = J;
  }
};

struct RefOpts {
  double scale = 0;
  bool causal = false;
  double dropout_p = 0;
  uint64_t seed = 0;
  const BlockMask* mask = nullptr;
};

// One row of O (d doubles) and its LSE for query (b, h, i), from the query row q, and the keys
// and values K, V ([N][d]) of its K/V head.
void ref_row(const float* q, const float* K, const float* V, int M, int N, int d, int b, int h,
             int i, const RefOpts& o, std::vector<double>& s, double* out, double& lse) {
  s.assign(size_t(N), -INFINITY);
  double mx = -INFINITY;
  for (int j = 0; j < N; ++j) {
    if (o.causal && j > i + N - M) continue;
    if (o.mask && !o.mask->visible(b, h, i, j)) continue;
    double acc = 0;
    for (int c = 0; c < d; ++c) acc += double(q[c]) * double(K[size_t(j) * d + c]);
    s[size_t(j)] = acc * o.scale;
    mx = std::max(mx, s[size_t(j)]);
  }
  for (int c = 0; c < d; ++c) out[c] = 0;
  if (mx == -INFINITY) {
    lse = -INFINITY;
    return;
  }
  double l = 0;
  for (int j = 0; j < N; ++j)
    if (s[size_t(j)] != -INFINITY) l += std::exp(s[size_t(j)] - mx);
  lse = mx + std::log(l);
  const uint32_t thresh = drop_threshold(o.dropout_p);
  for (int j = 0; j < N; ++j) {
    if (s[size_t(j)] == -INFINITY) continue;
    double pj = std::exp(s[size_t(j)] - mx) / l;
    if (o.dropout_p > 0)
      pj = keep_host(o.seed, thresh, b, h, i, j) ? pj / (1.0 - o.dropout_p) : 0.0;
    for (int c = 0; c < d; ++c) out[c] += pj * double(V[size_t(j) * d + c]);
  }
}

struct Err {
  double o = 0, lse = 0;
};
double err_of(double got, double ref) {
  if (std::isnan(got)) return INFINITY;
  if (std::isinf(ref) || std::isinf(got)) return got == ref ? 0.0 : INFINITY;
  return std::fabs(got - ref);
}

// ---- a problem on the device ------------------------------------------------------------------

constexpr size_t kGuard = 4096;  // canary bytes after O and after LSE
constexpr unsigned char kCanary = 0xA5;

struct Case {
  const char* name;
  int batch, heads, heads_kv, seq_q, seq_k;
  bool causal;
  double scale;  // 0: 1/sqrt(d)
  float qk_mul;  // Q and K are N(0, qk_mul^2): large logits
};

template <class T>
struct Problem {
  int B, H, Hkv, M, N, d;
  std::vector<float> q, k, v;  // the rounded values, as float (exact)
  T *dq = nullptr, *dk = nullptr, *dv = nullptr, *dout = nullptr;
  float* dlse = nullptr;
  unsigned int* dcounter = nullptr;  // the persistent kernels' work counter

  Problem(int B_, int H_, int Hkv_, int M_, int N_, int d_, uint64_t seed, float qk_mul)
      : B(B_), H(H_), Hkv(Hkv_), M(M_), N(N_), d(d_) {
    auto fill = [&](std::vector<float>& x, size_t n, uint64_t sd, float mul) {
      x.resize(n);
      for (size_t i = 0; i < n; ++i) x[i] = to_f(to_t<T>(mul * gauss(sd, i)));
    };
    fill(q, q_elems(), seed * 3 + 1, qk_mul);
    fill(k, kv_elems(), seed * 3 + 2, qk_mul);
    fill(v, kv_elems(), seed * 3 + 3, 1.f);
    CK(cudaMalloc(&dq, q_elems() * sizeof(T)));
    CK(cudaMalloc(&dk, kv_elems() * sizeof(T)));
    CK(cudaMalloc(&dv, kv_elems() * sizeof(T)));
    CK(cudaMalloc(&dout, q_elems() * sizeof(T) + kGuard));
    CK(cudaMalloc(&dlse, size_t(B) * H * M * sizeof(float) + kGuard));
    CK(cudaMalloc(&dcounter, sizeof(unsigned int)));
    upload(dq, q), upload(dk, k), upload(dv, v);
  }
  ~Problem() {
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dlse), cudaFree(dcounter);
  }
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  size_t q_elems() const { return size_t(B) * H * M * d; }
  size_t kv_elems() const { return size_t(B) * Hkv * N * d; }
  static void upload(T* dst, const std::vector<float>& x) {
    std::vector<T> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = to_t<T>(x[i]);
    CK(cudaMemcpy(dst, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  void poison() {
    CK(cudaMemset(dout, 0xFF, q_elems() * sizeof(T)));
    CK(cudaMemset(reinterpret_cast<unsigned char*>(dout) + q_elems() * sizeof(T), kCanary, kGuard));
    CK(cudaMemset(dlse, 0xFF, size_t(B) * H * M * sizeof(float)));
    CK(cudaMemset(reinterpret_cast<unsigned char*>(dlse) + size_t(B) * H * M * sizeof(float),
                  kCanary, kGuard));
  }
  bool guards_intact() const {
    std::vector<unsigned char> g(kGuard);
    CK(cudaMemcpy(g.data(), reinterpret_cast<const unsigned char*>(dout) + q_elems() * sizeof(T),
                  kGuard, cudaMemcpyDeviceToHost));
    bool ok = std::all_of(g.begin(), g.end(), [](unsigned char x) { return x == kCanary; });
    CK(cudaMemcpy(g.data(),
                  reinterpret_cast<const unsigned char*>(dlse) + size_t(B) * H * M * sizeof(float),
                  kGuard, cudaMemcpyDeviceToHost));
    return ok && std::all_of(g.begin(), g.end(), [](unsigned char x) { return x == kCanary; });
  }
  FwdParams params(double scale, bool causal) const {
    FwdParams p;
    p.q = dq, p.k = dk, p.v = dv, p.o = dout, p.lse = dlse;
    p.batch = B, p.heads = H, p.heads_kv = Hkv, p.seq_q = M, p.seq_k = N, p.dim = d;
    p.bf16 = std::is_same<T, bf16>::value;
    p.scale = float(scale);
    p.causal = causal;
    p.tile_counter = dcounter;
    return p;
  }
  // The float64 reference for every row: O [B, H, M, d] and LSE [B, H, M].
  struct Ref {
    std::vector<double> o, lse;
  };
  Ref reference(const RefOpts& ro) const {
    Ref r;
    r.o.resize(q_elems());
    r.lse.resize(size_t(B) * H * M);
    std::vector<double> s;
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h) {
        const int hk = h / (H / Hkv);
        const float* K = k.data() + (size_t(b) * Hkv + hk) * N * d;
        const float* V = v.data() + (size_t(b) * Hkv + hk) * N * d;
        for (int i = 0; i < M; ++i) {
          const size_t row = (size_t(b) * H + h) * M + i;
          ref_row(q.data() + row * d, K, V, M, N, d, b, h, i, ro, s, r.o.data() + row * d,
                  r.lse[row]);
        }
      }
    return r;
  }
  // Max errors of the device's O and LSE against the reference, every row.
  Err compare(const Ref& ref) const {
    std::vector<T> o(q_elems());
    std::vector<float> lse(size_t(B) * H * M);
    CK(cudaMemcpy(o.data(), dout, o.size() * sizeof(T), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(lse.data(), dlse, lse.size() * sizeof(float), cudaMemcpyDeviceToHost));
    Err e;
    for (size_t i = 0; i < o.size(); ++i) e.o = std::max(e.o, err_of(to_f(o[i]), ref.o[i]));
    for (size_t i = 0; i < lse.size(); ++i) e.lse = std::max(e.lse, err_of(lse[i], ref.lse[i]));
    return e;
  }
};

double o_tol(bool is_bf16, double p) {
  return (is_bf16 ? 2e-2 : 4e-3) / (1.0 - p);
}
constexpr double kLseTol = 1e-2;

bool report(const char* tag, const std::string& what, const Err& e, double otol, bool guards) {
  const bool ok = e.o <= otol && e.lse <= kLseTol && guards;
  std::printf("%s %-18s %-58s O %.2e (tol %.0e)  LSE %.2e (tol %.0e)%s\n", ok ? "PASS" : "FAIL",
              tag, what.c_str(), e.o, otol, e.lse, kLseTol, guards ? "" : "  GUARD OVERWRITTEN");
  std::fflush(stdout);
  if (!ok) ++g_failures;
  return ok;
}

// make_plan, or a FAIL line (counted) and false: a rejected configuration (a tensor map the
// driver refuses, say) fails its case without stopping the others.
bool try_plan(const FwdParams& p, Variant v, const std::string& what, FwdPlan* plan) {
  try {
    *plan = ladder::fa3::make_plan(p, v);
    return true;
  } catch (const std::exception& ex) {
    std::printf("FAIL %-18s %s: make_plan: %s\n", ladder::fa3::variant_name(v), what.c_str(),
                ex.what());
    std::fflush(stdout);
    ++g_failures;
    return false;
  }
}

void run_or_die(const FwdPlan& plan, const std::string& what) {
  try {
    ladder::fa3::launch(plan);
  } catch (const std::exception& ex) {
    std::printf("FAIL launch of %s: %s\n", what.c_str(), ex.what());
    std::fflush(stdout);
    std::exit(1);
  }
  sync_or_die(what);
}

// 16 key tiles: the K/V ring (2 or 3 stages) wraps 5 to 8 times per item; logits x 2, so that
// a tile read before it has landed moves O by far more than the tolerance (--expect-fault).
// seq_q 384 runs three-consumers with Br = 192 at d = 64.
constexpr Case kRingWraps = {
    "ring wraps 5-8 times: 384 x 2048, gqa 2:1, logits x 2", 1, 4, 2, 384, 2048, false, 0, 2.f};

const Case kCases[] = {
    {"one tile 128x128", 1, 1, 1, 128, 128, false, 0, 1.f},
    {"seq 1", 1, 1, 1, 1, 1, false, 0, 1.f},
    {"seq 17", 1, 1, 1, 17, 17, false, 0, 1.f},
    {"seq 113 causal", 1, 1, 1, 113, 113, true, 0, 1.f},
    {"200 x 77", 1, 2, 2, 200, 77, false, 0, 1.f},
    {"200 x 77 causal (rows < 123 see no key)", 1, 2, 2, 200, 77, true, 0, 1.f},
    {"77 x 200", 1, 2, 2, 77, 200, false, 0, 1.f},
    {"77 x 200 causal", 1, 2, 2, 77, 200, true, 0, 1.f},
    {"gqa 4:1, 130 x 260", 1, 4, 1, 130, 260, false, 0, 1.f},
    {"gqa 4:2, batch 2, 257 causal", 2, 4, 2, 257, 257, true, 0, 1.f},
    {"scale 0.3, 150 x 300", 1, 1, 1, 150, 300, false, 0.3, 1.f},
    {"large logits (Q, K x 2, scale 1), 129 x 191", 1, 1, 1, 129, 191, false, 1.0, 2.f},
    {"large logits causal, 200", 1, 1, 1, 200, 200, true, 1.0, 2.f},
    {"ring wraps: 300 x 1500, gqa 2:1", 1, 2, 1, 300, 1500, false, 0, 1.f},
    {"ring wraps causal: 300 x 1500", 1, 2, 1, 300, 1500, true, 0, 1.f},
    {"batch 2, heads 2, 384 causal", 2, 2, 2, 384, 384, true, 0, 1.f},
    // More work items than SMs: persistent CTAs take several items each.
    {"many items: batch 2, heads 48, 384 x 200", 2, 48, 48, 384, 200, false, 0, 1.f},
    {"many items causal, 700 x 150 (empty items), gqa 4:1", 2, 40, 10, 700, 150, true, 0, 1.f},
    kRingWraps,
};

// Step 2: every case, every variant, for one dtype and head dim. Returns which variants passed.
template <class T>
void check_variants(int d, bool (&passed)[kNumVariants]) {
  const bool is_bf16 = std::is_same<T, bf16>::value;
  for (int vi = 0; vi < kNumVariants; ++vi) passed[vi] = true;
  uint64_t seed = 1;
  for (const Case& cs : kCases) {
    Problem<T> pr(cs.batch, cs.heads, cs.heads_kv, cs.seq_q, cs.seq_k, d, seed++, cs.qk_mul);
    const double scale = cs.scale > 0 ? cs.scale : 1.0 / std::sqrt(double(d));
    RefOpts ro;
    ro.scale = scale, ro.causal = cs.causal;
    const typename Problem<T>::Ref ref = pr.reference(ro);
    for (int vi = 0; vi < kNumVariants; ++vi) {
      const Variant v = ladder::fa3::kAllVariants[vi];
      const char* name = ladder::fa3::variant_name(v);
      char what[160];
      std::snprintf(what, sizeof(what), "%s d=%d %s", is_bf16 ? "bf16" : "fp16", d, cs.name);
      FwdPlan plan;
      if (!try_plan(pr.params(scale, cs.causal), v, what, &plan)) {
        passed[vi] = false;
        continue;
      }
      pr.poison();
      run_or_die(plan, std::string(name) + " " + what);
      bool guards = pr.guards_intact();
      bool ok = report(name, what, pr.compare(ref), o_tol(is_bf16, 0), guards);
      if (ladder::fa3::is_persistent(v)) {
        // The same plan again: it finds the work counter as the first launch left it.
        pr.poison();
        run_or_die(plan, std::string(name) + " " + what + " (second launch)");
        guards = pr.guards_intact();
        ok = report(name, std::string(what) + " (again)", pr.compare(ref), o_tol(is_bf16, 0),
                    guards) &&
             ok;
      }
      if (!ok) passed[vi] = false;
    }
  }
}

// Step 3: dropout and block-sparse, in the full kernel.
BlockMask random_mask(int mb, int mh, int nI, int nJ, int bm, int bn, double rho, uint64_t seed) {
  BlockMask m;
  m.bm = bm, m.bn = bn, m.mb = mb, m.mh = mh, m.nI = nI, m.nJ = nJ;
  m.bits.resize(size_t(mb) * mh * nI * nJ);
  const uint64_t cut = uint64_t(std::llround(rho * 16777216.0));
  for (size_t idx = 0; idx < m.bits.size(); ++idx)
    m.bits[idx] = (mix64(seed + (idx + 1) * 0x9e3779b97f4a7c15ull) >> 40) < cut;
  return m;
}

template <class T>
void check_extras(int d) {
  const bool is_bf16 = std::is_same<T, bf16>::value;
  // The default variant; with dropout or a mask it runs the persistent kernel with them
  // compiled in, whose dense twin is 'persistent' (same tiles at both head dims).
  const Variant v = ladder::fa3::kAllVariants[kNumVariants - 1];
  const Variant twin = Variant::persistent;
  const std::string tag = std::string(ladder::fa3::variant_name(v)) + "+";
  const char* dt = is_bf16 ? "bf16" : "fp16";
  struct Extra {
    const char* name;
    int B, H, Hkv, M, N;
    bool causal;
    double p;
    int mask;  // 0 none; 1 random 0.5 with query block 1 of (b 0, h 1) empty; 2 all ones
    int bm, bn;
    bool bcast_b, bcast_h;  // mask shaped [1, ...] / [., 1, ...]
  };
  const Extra extras[] = {
      {"dropout 0.1, 333 x 333, gqa 2:1", 2, 2, 1, 333, 333, false, 0.1, 0, 128, 128, false, false},
      {"dropout 0.5, 200 x 450 causal", 1, 2, 2, 200, 450, true, 0.5, 0, 128, 128, false, false},
      {"mask 0.5 [B,H,.,.], empty row block", 2, 2, 2, 700, 700, false, 0, 1, 128, 128, false,
       false},
      {"mask 0.5 [B,H,.,.], empty row block, causal", 2, 2, 2, 700, 700, true, 0, 1, 128, 128,
       false, false},
      {"mask 0.5 [1,H,.,.] 256x256, 600 x 900", 2, 2, 1, 600, 900, false, 0, 1, 256, 256, true,
       false},
      {"mask 0.5 [B,1,.,.] 128x256, 500 x 1100 causal", 2, 2, 2, 500, 1100, true, 0, 1, 128, 256,
       false, true},
      {"mask 0.5 + dropout 0.1, causal", 2, 2, 2, 700, 700, true, 0.1, 1, 128, 128, false, false},
      {"all-ones mask = dense, 520 x 777", 1, 2, 2, 520, 777, false, 0, 2, 128, 128, false, false},
      {"all-ones mask = dense, causal", 1, 2, 2, 520, 777, true, 0, 2, 128, 128, false, false},
  };
  uint64_t seed = 100;
  for (const Extra& x : extras) {
    Problem<T> pr(x.B, x.H, x.Hkv, x.M, x.N, d, seed++, 1.f);
    const double scale = 1.0 / std::sqrt(double(d));
    FwdParams p = pr.params(scale, x.causal);
    RefOpts ro;
    ro.scale = scale, ro.causal = x.causal, ro.dropout_p = x.p, ro.seed = 0x0123456789abcdefull;
    p.dropout_p = float(x.p), p.dropout_seed = ro.seed;
    BlockMask mask;
    int *dcount = nullptr, *dindex = nullptr;
    if (x.mask) {
      const int bm = x.bm, bn = x.bn, nI = (x.M + bm - 1) / bm, nJ = (x.N + bn - 1) / bn;
      const int mb = x.bcast_b ? 1 : x.B, mh = x.bcast_h ? 1 : x.H;
      mask = random_mask(mb, mh, nI, nJ, bm, bn, x.mask == 2 ? 1.0 : 0.5, seed * 77);
      if (x.mask == 1 && nI > 1)  // query block 1 of mask row (0, min(1, mh-1)) sees nothing
        for (int J = 0; J < nJ; ++J)
          mask.bits[((size_t(0) * mh + std::min(1, mh - 1)) * nI + 1) * nJ + J] = 0;
      mask.build_lists();
      CK(cudaMalloc(&dcount, mask.count.size() * sizeof(int)));
      CK(cudaMalloc(&dindex, mask.index.size() * sizeof(int)));
      CK(cudaMemcpy(dcount, mask.count.data(), mask.count.size() * sizeof(int),
                    cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dindex, mask.index.data(), mask.index.size() * sizeof(int),
                    cudaMemcpyHostToDevice));
      p.kv_count = dcount, p.kv_index = dindex;
      p.block_m = bm, p.block_n = bn, p.mask_batch = mb, p.mask_heads = mh;
      ro.mask = &mask;
    }
    char what[160];
    std::snprintf(what, sizeof(what), "%s d=%d %s", dt, d, x.name);
    FwdPlan plan;
    if (!try_plan(p, v, what, &plan)) continue;
    pr.poison();
    run_or_die(plan, std::string("extras ") + what);
    const bool guards = pr.guards_intact();
    report(tag.c_str(), what, pr.compare(pr.reference(ro)), o_tol(is_bf16, x.p), guards);
    if (x.mask == 2) {
      // The same problem through the plain full kernel: the bits must be identical.
      std::vector<unsigned char> o1(pr.q_elems() * sizeof(T)), l1(size_t(x.B) * x.H * x.M * 4);
      CK(cudaMemcpy(o1.data(), pr.dout, o1.size(), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(l1.data(), pr.dlse, l1.size(), cudaMemcpyDeviceToHost));
      FwdPlan dense;
      if (!try_plan(pr.params(scale, x.causal), twin, what, &dense)) continue;
      pr.poison();
      run_or_die(dense, std::string("dense twin of ") + what);
      std::vector<unsigned char> o2(o1.size()), l2(l1.size());
      CK(cudaMemcpy(o2.data(), pr.dout, o2.size(), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(l2.data(), pr.dlse, l2.size(), cudaMemcpyDeviceToHost));
      const bool same = o1 == o2 && l1 == l2;
      std::printf("%s %-18s %-58s sparse(all ones) and dense outputs %s\n", same ? "PASS" : "FAIL",
                  tag.c_str(), what, same ? "bit-identical" : "DIFFER");
      if (!same) ++g_failures;
    }
    if (dcount) CK(cudaFree(dcount));
    if (dindex) CK(cudaFree(dindex));
  }
}

// ---- flash shapes -------------------------------------------------------------------------------

template <class T>
struct FlashBuffers {
  T *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float* lse = nullptr;
  unsigned int* counter = nullptr;
  void* flush = nullptr;
  size_t flush_bytes = 0;
  static constexpr size_t kElems = size_t(16384) * 2048;  // tokens x (heads x d), every shape
  FlashBuffers() {
    CK(cudaMalloc(&q, kElems * sizeof(T)));
    CK(cudaMalloc(&k, kElems * sizeof(T)));
    CK(cudaMalloc(&v, kElems * sizeof(T)));
    CK(cudaMalloc(&o, kElems * sizeof(T)));
    CK(cudaMalloc(&lse, size_t(16384) * 32 * sizeof(float)));  // B*H*M <= 16384 * 2048 / 64
    CK(cudaMalloc(&counter, sizeof(unsigned int)));
    int dev = 0, l2 = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    flush_bytes = 2 * size_t(l2);
    CK(cudaMalloc(&flush, flush_bytes));
    init_normal<T><<<1024, 256>>>(q, kElems, 11);
    init_normal<T><<<1024, 256>>>(k, kElems, 12);
    init_normal<T><<<1024, 256>>>(v, kElems, 13);
    CK(cudaGetLastError());
    sync_or_die("input initialisation");
  }
  ~FlashBuffers() {
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(lse), cudaFree(counter);
    cudaFree(flush);
  }
  FlashBuffers(const FlashBuffers&) = delete;
  FlashBuffers& operator=(const FlashBuffers&) = delete;
};

template <class T>
std::vector<float> download(const T* p, size_t n) {
  std::vector<T> h(n);
  CK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = to_f(h[i]);
  return f;
}

// Sampled rows of a flash-shape run against the reference: 2 heads x 4 rows.
template <class T>
Err check_sampled(const FlashBuffers<T>& fb, const FwdParams& p) {
  Err e;
  const int M = p.seq_q, N = p.seq_k, d = p.dim;
  const int heads[2][2] = {{0, 0}, {p.batch - 1, p.heads - 1}};
  const int rows[2][4] = {{0, 1, M / 2 + 3, M - 1}, {5, 127, 128, M - 2}};
  RefOpts ro;
  ro.scale = p.scale, ro.causal = p.causal;
  std::vector<double> s, ref(static_cast<size_t>(d));
  for (int hi = 0; hi < 2; ++hi) {
    const int b = heads[hi][0], h = heads[hi][1], hk = h / (p.heads / p.heads_kv);
    const size_t kv_off = (size_t(b) * p.heads_kv + hk) * N * d;
    const std::vector<float> K = download(fb.k + kv_off, size_t(N) * d);
    const std::vector<float> V = download(fb.v + kv_off, size_t(N) * d);
    for (int ri = 0; ri < 4; ++ri) {
      const int i = rows[hi][ri];
      const size_t row = (size_t(b) * p.heads + h) * M + i;
      const std::vector<float> q = download(fb.q + row * d, size_t(d));
      const std::vector<float> o = download(fb.o + row * d, size_t(d));
      float lse = 0;
      CK(cudaMemcpy(&lse, fb.lse + row, sizeof(float), cudaMemcpyDeviceToHost));
      double rl = 0;
      ref_row(q.data(), K.data(), V.data(), M, N, d, b, h, i, ro, s, ref.data(), rl);
      for (int c = 0; c < d; ++c) e.o = std::max(e.o, err_of(o[size_t(c)], ref[size_t(c)]));
      e.lse = std::max(e.lse, err_of(lse, rl));
    }
  }
  return e;
}

template <class T>
void time_flash(const bool (&passed)[2][kNumVariants]) {
  const bool is_bf16 = std::is_same<T, bf16>::value;
  FlashBuffers<T> fb;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int di = 0; di < 2; ++di) {
    const int d = di == 0 ? 64 : 128;
    for (int causal = 0; causal < 2; ++causal)
      for (int seq : {1024, 2048, 4096, 8192, 16384}) {
        FwdParams p;
        p.q = fb.q, p.k = fb.k, p.v = fb.v, p.o = fb.o, p.lse = fb.lse;
        p.tile_counter = fb.counter;
        p.batch = 16384 / seq, p.heads = 2048 / d, p.heads_kv = p.heads;
        p.seq_q = p.seq_k = seq, p.dim = d, p.bf16 = is_bf16;
        p.scale = float(1.0 / std::sqrt(double(d))), p.causal = causal != 0;
        const double flops = 4.0 * p.batch * p.heads * double(seq) * seq * d * (causal ? 0.5 : 1.0);
        for (int vi = 0; vi < kNumVariants; ++vi) {
          const Variant v = ladder::fa3::kAllVariants[vi];
          char what[160];
          std::snprintf(what, sizeof(what), "%s d=%-3d causal=%d seq=%-5d B=%-2d H=%-2d",
                        is_bf16 ? "bf16" : "fp16", d, causal, seq, p.batch, p.heads);
          if (!passed[di][vi]) {
            std::printf("SKIP %-18s %s (failed the small cases)\n", ladder::fa3::variant_name(v),
                        what);
            continue;
          }
          FwdPlan plan;
          if (!try_plan(p, v, what, &plan)) continue;
          CK(cudaMemset(fb.o, 0xFF, size_t(p.batch) * p.heads * seq * d * sizeof(T)));
          CK(cudaMemset(fb.lse, 0xFF, size_t(p.batch) * p.heads * seq * sizeof(float)));
          run_or_die(plan, std::string(ladder::fa3::variant_name(v)) + " " + what);
          const Err err = check_sampled(fb, p);
          if (!report(ladder::fa3::variant_name(v), std::string(what) + " sampled rows", err,
                      o_tol(is_bf16, 0), true))
            continue;
          for (int w = 0; w < 3; ++w) ladder::fa3::launch(plan);
          sync_or_die(std::string("warm-up ") + what);
          std::vector<float> ms;
          for (int r = 0; r < 20; ++r) {
            CK(cudaMemsetAsync(fb.flush, r & 0xff, fb.flush_bytes));
            CK(cudaEventRecord(e0));
            ladder::fa3::launch(plan);
            CK(cudaEventRecord(e1));
            sync_or_die(std::string("timed run ") + what);
            float t = 0;
            CK(cudaEventElapsedTime(&t, e0, e1));
            ms.push_back(t);
          }
          std::sort(ms.begin(), ms.end());
          const double med = 0.5 * (ms[9] + ms[10]);
          std::printf("TIME %-18s %s  %8.3f ms  %6.1f TFLOP/s   [%s]\n",
                      ladder::fa3::variant_name(v), what, med, flops / (med * 1e-3) / 1e12,
                      ladder::fa3::describe(plan).c_str());
          std::fflush(stdout);
        }
      }
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
}

// ---- trace --------------------------------------------------------------------------------------

int run_trace(const char* path) {
  FlashBuffers<bf16> fb;
  unsigned long long* dtrace = nullptr;
  const size_t words = ladder::fa3::kTraceBufferWords;
  CK(cudaMalloc(&dtrace, words * sizeof(unsigned long long)));
  std::ofstream csv(path);
  if (!csv) {
    std::printf("cannot write %s\n", path);
    return 1;
  }
  csv << "variant,warp,role,phase,tile,t0_ns,t1_ns\n";
  for (Variant v : {Variant::tma_wgmma, Variant::intra_overlap, Variant::three_consumers}) {
    FwdParams p;
    p.q = fb.q, p.k = fb.k, p.v = fb.v, p.o = fb.o, p.lse = fb.lse;
    p.tile_counter = fb.counter;
    p.batch = 4, p.heads = 16, p.heads_kv = 16, p.seq_q = p.seq_k = 4096, p.dim = 128;
    p.bf16 = true, p.scale = float(1.0 / std::sqrt(128.0)), p.causal = false;
    p.trace = dtrace;
    const std::string what = std::string("trace ") + ladder::fa3::variant_name(v);
    FwdPlan plan;
    if (!try_plan(p, v, what, &plan)) continue;
    for (int rep = 0; rep < 2; ++rep) {  // the second run is recorded, on a warm GPU
      CK(cudaMemset(dtrace, 0, words * sizeof(unsigned long long)));
      CK(cudaMemset(fb.o, 0xFF, size_t(4) * 16 * 4096 * 128 * sizeof(bf16)));
      run_or_die(plan, what);
    }
    report(ladder::fa3::variant_name(v), "bf16 d=128 seq=4096 traced run, sampled rows",
           check_sampled(fb, p), o_tol(true, 0), true);
    std::vector<unsigned long long> rec(words);
    CK(cudaMemcpy(rec.data(), dtrace, words * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    unsigned long long t_min = ~0ull;
    size_t n = 0;
    for (size_t i = 0; i < words; i += ladder::fa3::kTraceWords)
      if (rec[i] != 0) t_min = std::min(t_min, rec[i + 2]), ++n;
    for (int w = 0; w < ladder::fa3::kTraceWarps; ++w)
      for (int sl = 0; sl < ladder::fa3::kTraceSlots; ++sl) {
        const unsigned long long* r =
            rec.data() + (size_t(w) * ladder::fa3::kTraceSlots + sl) * ladder::fa3::kTraceWords;
        if (r[0] == 0) continue;
        const int phase = int(r[0]);
        csv << ladder::fa3::variant_name(v) << ',' << w << ','
            << ladder::fa3::trace_role_name(phase) << ',' << ladder::fa3::trace_phase_name(phase)
            << ',' << r[1] << ',' << (r[2] - t_min) << ',' << (r[3] - t_min) << '\n';
      }
    std::printf("trace %s: %zu records\n", ladder::fa3::variant_name(v), n);
  }
  CK(cudaFree(dtrace));
  std::printf("wrote %s\n", path);
  return g_failures ? 1 : 0;
}

// ---- --expect-fault: the self-test of the self-test --------------------------------------------

// For a copy built with -DLADDER_07_FAULT=skip_k_wait (wgmma_tma_fa3.cu says what it does): the
// kRingWraps case, bf16, both head dims, every variant. The same case passes in the normal build
// (step 2), so a failure here is the fault's doing. Success = every one of these checks fails.
int run_expect_fault() {
  int caught = 0, missed = 0;
  bool fault_built = false;
  const Case& cs = kRingWraps;
  for (int d : {64, 128}) {
    Problem<bf16> pr(cs.batch, cs.heads, cs.heads_kv, cs.seq_q, cs.seq_k, d, 5, cs.qk_mul);
    const double scale = 1.0 / std::sqrt(double(d));
    RefOpts ro;
    ro.scale = scale, ro.causal = cs.causal;
    const Problem<bf16>::Ref ref = pr.reference(ro);
    for (const Variant v : ladder::fa3::kAllVariants) {
      const char* name = ladder::fa3::variant_name(v);
      char what[160];
      std::snprintf(what, sizeof(what), "bf16 d=%d %s", d, cs.name);
      FwdPlan plan;
      if (!try_plan(pr.params(scale, cs.causal), v, what, &plan)) {
        ++missed;
        continue;
      }
      fault_built = ladder::fa3::describe(plan).find("FAULT=") != std::string::npos;
      pr.poison();
      run_or_die(plan, std::string("fault-injected ") + name + " " + what);
      const Err e = pr.compare(ref);
      const bool fails = !(e.o <= o_tol(true, 0) && e.lse <= kLseTol && pr.guards_intact());
      std::printf("%s %-18s %-58s O %.2e LSE %.2e: the check %s\n", fails ? "CAUGHT" : "MISSED",
                  name, what, e.o, e.lse,
                  fails ? "fails, as it must" : "passes: the fault went unseen");
      std::fflush(stdout);
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

}  // namespace

int main(int argc, char** argv) {
  bool timing = true, expect_fault = false, fp16_first = false;
  const char* trace_path = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--no-timing")) {
      timing = false;
    } else if (!std::strcmp(argv[i], "--trace") && i + 1 < argc) {
      trace_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--expect-fault")) {
      expect_fault = true;
    } else if (!std::strcmp(argv[i], "--fp16-first")) {
      fp16_first = true;
    } else {
      std::printf("usage: %s [--no-timing] [--fp16-first] [--trace out.csv] [--expect-fault]\n",
                  argv[0]);
      return 2;
    }
  }
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess ||
      prop.major != 9 || prop.minor != 0) {
    std::printf("needs an sm_90 GPU (H100/H200)\n");
    return 77;  // ctest: skipped (no device to run on)
  }
  std::printf("device: %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  if (trace_path) return run_trace(trace_path);
  if (expect_fault) return run_expect_fault();

  const auto t0 = std::chrono::steady_clock::now();
  check_philox();
  bool passed[2][2][kNumVariants];  // [dtype][d][variant]
  check_variants<bf16>(64, passed[0][0]);
  check_variants<bf16>(128, passed[0][1]);
  check_variants<fp16>(64, passed[1][0]);
  check_variants<fp16>(128, passed[1][1]);
  check_extras<bf16>(64);
  check_extras<bf16>(128);
  check_extras<fp16>(64);
  check_extras<fp16>(128);
  std::printf("checks: %d failed (%.1f s)\n", g_failures,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  if (timing) {
    if (fp16_first) time_flash<fp16>(passed[1]);
    time_flash<bf16>(passed[0]);
    if (!fp16_first) time_flash<fp16>(passed[1]);
  }
  std::printf("%s: %d failed (%.1f s total)\n", g_failures ? "FAIL" : "PASS", g_failures,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return g_failures ? 1 : 0;
}
