// Standalone self-test and benchmark of step 07's backward pass (needs an sm_90 GPU):
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icommon -Isteps/07_wgmma_tma_fa3
//     steps/07_wgmma_tma_fa3/selftest_backward.cu steps/07_wgmma_tma_fa3/wgmma_tma_fa3_backward.cu
//     -o /tmp/st07b && /tmp/st07b
//   (one command line, from the repository root)
//
//   /tmp/st07b                 checks, then timings (a few minutes on an H100)
//   /tmp/st07b --no-timing     checks only
//
// 1. For each dtype (bf16, fp16), head dim (64, 128) and dQ variant (tma-reduce, atomic): small
//    awkward shapes against a float64 backward computed here from the same rounded inputs
//    (Q, K, V, dO ~ N(0,1); O and LSE from a float64 forward, O rounded to the dtype as a caller's
//    forward would give it, and the reference's D = rowsum(dO o O) taken from that rounded O).
//    dQ, dK, dV are poisoned (0xFF bytes, NaN) before each run, the workspace too, and guarded
//    by canaries after their ends. Error = max |got - ref| / max |ref| per tensor; tolerance 2e-2
//    (bf16) or 5e-3 (fp16): several times the rounding of P, dS and the outputs, far below what a
//    wrong layout or a lost tile gives. Every element whose reference is exactly 0 (a query row
//    or a key with nothing visible) must be exactly 0; a NaN anywhere fails.
// 2. Dropout and block-sparse masks (the kExtras kernels): p = 0.1 and 0.5, block masks with an
//    empty query block and an empty key block, broadcast masks, 256 x 256 and 128 x 256 mask
//    blocks, mask + dropout; an all-ones mask must give exactly the dense kernel's dK and dV bits
//    (dQ's fp32 sums are added in whatever order the CTAs finish: compared with the tolerance).
// 3. Flash shapes (batch * seq = 16384, heads * d = 2048; seq 1024, 4096, 16384; causal 0/1):
//    O and LSE from a plain fp32 GPU forward written here, then for each variant the backward is
//    checked on sampled query rows (dQ) and keys (dK, dV) of two heads against float64, and only
//    if it passes (and the variant passed steps 1-2 for that dtype and head dim) timed: 3
//    warm-ups, median of 20, L2 flushed by a memset of twice its size before every run.
//    TFLOP/s = 2.5 * 4 B H M N d (/ 2 causal) / time, for the whole backward (pre-pass, main
//    kernel, post-pass) and for the main kernel alone.
// Every launch is followed by a synchronisation with a time limit: a kernel that does not finish
// in time (a barrier that never completes) prints TIMEOUT with its case and the program exits
// with status 3. Exit status 1: a check failed; 2: bad usage; 77: no sm_90 GPU (ctest: skipped).
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
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "dropout.hpp"
#include "selftest_util.cuh"
#include "wgmma_tma_fa3.hpp"

namespace {

using ladder::fa3::BwdParams;
using ladder::fa3::BwdPlan;
using ladder::fa3::BwdVariant;
using namespace selftest07;  // selftest_util.cuh

template <class T>
std::vector<float> download(const T* p, size_t n) {
  std::vector<T> h(n);
  CK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = to_f(h[i]);
  return f;
}

// ---- block masks ------------------------------------------------------------------------------

// [mb, mh, nI, nJ] of 0/1 and the backward's lists: per mask row (b', h', J) the kept query
// blocks, ascending (common/block_mask.hpp's q_block_lists, written again here).
struct BlockMask {
  int bm = 128, bn = 128, mb = 1, mh = 1, nI = 0, nJ = 0;
  std::vector<uint8_t> bits;
  std::vector<int> count, index;
  bool visible(int b, int h, int i, int j) const {
    const int b2 = mb == 1 ? 0 : b, h2 = mh == 1 ? 0 : h;
    return bits[((size_t(b2) * mh + h2) * nI + i / bm) * nJ + j / bn] != 0;
  }
  void build_lists() {
    count.assign(size_t(mb) * mh * nJ, 0);
    index.assign(size_t(mb) * mh * nJ * nI, 0);
    for (int bh = 0; bh < mb * mh; ++bh)
      for (int J = 0; J < nJ; ++J) {
        const size_t row = size_t(bh) * nJ + J;
        for (int I = 0; I < nI; ++I)
          if (bits[(size_t(bh) * nI + I) * nJ + J]) index[row * nI + size_t(count[row]++)] = I;
      }
  }
};

BlockMask random_mask(int mb, int mh, int nI, int nJ, int bm, int bn, double rho, uint64_t seed) {
  BlockMask m;
  m.bm = bm, m.bn = bn, m.mb = mb, m.mh = mh, m.nI = nI, m.nJ = nJ;
  m.bits.resize(size_t(mb) * mh * nI * nJ);
  const uint64_t cut = uint64_t(std::llround(rho * 16777216.0));
  for (size_t idx = 0; idx < m.bits.size(); ++idx)
    m.bits[idx] = (mix64(seed + (idx + 1) * 0x9e3779b97f4a7c15ull) >> 40) < cut;
  return m;
}

// ---- the float64 reference --------------------------------------------------------------------

struct RefOpts {
  double scale = 0;
  bool causal = false;
  double dropout_p = 0;
  uint64_t seed = 0;
  const BlockMask* mask = nullptr;
};

bool visible(const RefOpts& o, int M, int N, int b, int h, int i, int j) {
  if (o.causal && j > i + N - M) return false;
  return !o.mask || o.mask->visible(b, h, i, j);
}

// Z / (1 - p) of (b, h, i, j): 0 or 1 / (1 - p); 1 without dropout.
double drop_factor(const RefOpts& o, int b, int h, int i, int j) {
  if (o.dropout_p <= 0) return 1.0;
  const uint32_t t = ladder::dropout::threshold(o.dropout_p);
  return ladder::dropout::keep(o.seed, t, b, h, i, j) ? 1.0 / (1.0 - o.dropout_p) : 0.0;
}

double dot(const float* a, const float* b, int d) {
  double s = 0;
  for (int c = 0; c < d; ++c) s += double(a[c]) * double(b[c]);
  return s;
}

// A problem on the host (rounded values, as float) and on the device.
template <class T>
struct Problem {
  int B, H, Hkv, M, N, d;
  std::vector<float> q, k, v, dout, o;  // o: the forward's output rounded to T
  std::vector<float> lse;               // the forward's LSE, as float
  T *dq_in = nullptr, *dk_in = nullptr, *dv_in = nullptr, *d_o = nullptr, *d_dout = nullptr;
  T *d_dq = nullptr, *d_dk = nullptr, *d_dv = nullptr;
  float *d_lse = nullptr, *d_dq_acc = nullptr, *d_lse2 = nullptr, *d_dsum = nullptr;
  ladder::fa3::BwdWorkspace ws;

  static constexpr size_t kGuard = 4096;
  static constexpr unsigned char kCanary = 0xA5;

  Problem(int B_, int H_, int Hkv_, int M_, int N_, int d_, uint64_t seed, float qk_mul)
      : B(B_), H(H_), Hkv(Hkv_), M(M_), N(N_), d(d_) {
    auto fill = [&](std::vector<float>& x, size_t n, uint64_t sd, float mul) {
      x.resize(n);
      for (size_t i = 0; i < n; ++i) x[i] = to_f(to_t<T>(mul * gauss(sd, i)));
    };
    fill(q, q_elems(), seed * 5 + 1, qk_mul);
    fill(k, kv_elems(), seed * 5 + 2, qk_mul);
    fill(v, kv_elems(), seed * 5 + 3, 1.f);
    fill(dout, q_elems(), seed * 5 + 4, 1.f);
    BwdParams shape;
    shape.batch = B, shape.heads = H, shape.heads_kv = Hkv, shape.seq_q = M, shape.seq_k = N;
    shape.dim = d;
    ws = ladder::fa3::bwd_workspace(shape);
    CK(cudaMalloc(&dq_in, q_elems() * sizeof(T)));
    CK(cudaMalloc(&dk_in, kv_elems() * sizeof(T)));
    CK(cudaMalloc(&dv_in, kv_elems() * sizeof(T)));
    CK(cudaMalloc(&d_o, q_elems() * sizeof(T)));
    CK(cudaMalloc(&d_dout, q_elems() * sizeof(T)));
    CK(cudaMalloc(&d_lse, rows() * sizeof(float)));
    CK(cudaMalloc(&d_dq, q_elems() * sizeof(T) + kGuard));
    CK(cudaMalloc(&d_dk, kv_elems() * sizeof(T) + kGuard));
    CK(cudaMalloc(&d_dv, kv_elems() * sizeof(T) + kGuard));
    CK(cudaMalloc(&d_dq_acc, ws.dq_acc_bytes + kGuard));
    CK(cudaMalloc(&d_lse2, ws.lse2_bytes + kGuard));
    CK(cudaMalloc(&d_dsum, ws.dsum_bytes + kGuard));
    upload(dq_in, q), upload(dk_in, k), upload(dv_in, v), upload(d_dout, dout);
  }
  ~Problem() {
    for (void* p :
         {static_cast<void*>(dq_in), static_cast<void*>(dk_in), static_cast<void*>(dv_in),
          static_cast<void*>(d_o), static_cast<void*>(d_dout), static_cast<void*>(d_dq),
          static_cast<void*>(d_dk), static_cast<void*>(d_dv), static_cast<void*>(d_lse),
          static_cast<void*>(d_dq_acc), static_cast<void*>(d_lse2), static_cast<void*>(d_dsum)})
      cudaFree(p);
  }
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  size_t q_elems() const { return size_t(B) * H * M * d; }
  size_t kv_elems() const { return size_t(B) * Hkv * N * d; }
  size_t rows() const { return size_t(B) * H * M; }
  static void upload(T* dst, const std::vector<float>& x) {
    std::vector<T> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = to_t<T>(x[i]);
    CK(cudaMemcpy(dst, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }

  // The forward in float64: O (rounded to T, as a forward in T would give it) and LSE (float).
  void forward(const RefOpts& ro) {
    o.assign(q_elems(), 0.f);
    lse.assign(rows(), -INFINITY);
    std::vector<double> s(static_cast<size_t>(N)), acc(static_cast<size_t>(d));
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h) {
        const int hk = h / (H / Hkv);
        const float* K = k.data() + (size_t(b) * Hkv + hk) * N * d;
        const float* V = v.data() + (size_t(b) * Hkv + hk) * N * d;
        for (int i = 0; i < M; ++i) {
          const size_t row = (size_t(b) * H + h) * M + i;
          double mx = -INFINITY;
          for (int j = 0; j < N; ++j) {
            s[size_t(j)] = visible(ro, M, N, b, h, i, j)
                               ? ro.scale * dot(q.data() + row * d, K + size_t(j) * d, d)
                               : -INFINITY;
            mx = std::max(mx, s[size_t(j)]);
          }
          if (mx == -INFINITY) continue;  // O = 0, LSE = -inf
          double l = 0;
          for (int j = 0; j < N; ++j)
            if (s[size_t(j)] != -INFINITY) l += std::exp(s[size_t(j)] - mx);
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int j = 0; j < N; ++j) {
            if (s[size_t(j)] == -INFINITY) continue;
            const double pj = std::exp(s[size_t(j)] - mx) / l * drop_factor(ro, b, h, i, j);
            for (int c = 0; c < d; ++c) acc[size_t(c)] += pj * double(V[size_t(j) * d + c]);
          }
          for (int c = 0; c < d; ++c) o[row * d + size_t(c)] = to_f(to_t<T>(float(acc[size_t(c)])));
          lse[row] = float(mx + std::log(l));
        }
      }
    upload(d_o, o);
    CK(cudaMemcpy(d_lse, lse.data(), lse.size() * sizeof(float), cudaMemcpyHostToDevice));
  }

  struct Grads {
    std::vector<double> dq, dk, dv;
    // Structurally zero: a query row that sees no key (dQ), a key no query sees (dK, dV). The
    // kernel must give exactly 0 there. Elsewhere a zero is a cancellation (a row with one
    // visible key has P = 1 and dP - D = 0 in exact arithmetic, which fp32 sums in another
    // order miss by an ulp): the tolerance judges those, as the harness's floor does.
    std::vector<char> dq_zero, dk_zero;
  };
  // The backward in float64, from the rounded inputs, the rounded O and the float LSE.
  Grads reference(const RefOpts& ro) const {
    Grads g;
    g.dq.assign(q_elems(), 0.0);
    g.dk.assign(kv_elems(), 0.0);
    g.dv.assign(kv_elems(), 0.0);
    g.dq_zero.assign(q_elems(), 1);
    g.dk_zero.assign(kv_elems(), 1);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h) {
        const int hk = h / (H / Hkv);
        const size_t kv0 = (size_t(b) * Hkv + hk) * N * d;
        for (int i = 0; i < M; ++i) {
          const size_t row = (size_t(b) * H + h) * M + i;
          if (lse[row] == -INFINITY) continue;  // nothing visible: zero gradients
          const float* qi = q.data() + row * d;
          const float* gi = dout.data() + row * d;
          const double Di = dot(gi, o.data() + row * d, d);
          for (int j = 0; j < N; ++j) {
            if (!visible(ro, M, N, b, h, i, j)) continue;
            const float* kj = k.data() + kv0 + size_t(j) * d;
            const float* vj = v.data() + kv0 + size_t(j) * d;
            const double P = std::exp(ro.scale * dot(qi, kj, d) - double(lse[row]));
            const double z = drop_factor(ro, b, h, i, j);
            const double dS = P * (dot(gi, vj, d) * z - Di);
            for (int c = 0; c < d; ++c) {
              g.dq_zero[row * d + size_t(c)] = 0;
              g.dk_zero[kv0 + size_t(j) * d + size_t(c)] = 0;
              g.dq[row * d + size_t(c)] += ro.scale * dS * kj[c];
              g.dk[kv0 + size_t(j) * d + size_t(c)] += ro.scale * dS * qi[c];
              g.dv[kv0 + size_t(j) * d + size_t(c)] += P * z * gi[c];
            }
          }
        }
      }
    return g;
  }

  BwdParams params(double scale, bool causal) const {
    BwdParams p;
    p.q = dq_in, p.k = dk_in, p.v = dv_in, p.o = d_o, p.dout = d_dout, p.lse = d_lse;
    p.dq = d_dq, p.dk = d_dk, p.dv = d_dv;
    p.dq_acc = d_dq_acc, p.lse2 = d_lse2, p.dsum = d_dsum;
    p.batch = B, p.heads = H, p.heads_kv = Hkv, p.seq_q = M, p.seq_k = N, p.dim = d;
    p.bf16 = std::is_same<T, bf16>::value;
    p.scale = float(scale);
    p.causal = causal;
    return p;
  }
  // Outputs and workspace to NaN (0xFF bytes), canaries after each.
  void poison() {
    const std::pair<void*, size_t> bufs[] = {
        {d_dq, q_elems() * sizeof(T)},  {d_dk, kv_elems() * sizeof(T)},
        {d_dv, kv_elems() * sizeof(T)}, {d_dq_acc, ws.dq_acc_bytes},
        {d_lse2, ws.lse2_bytes},        {d_dsum, ws.dsum_bytes}};
    for (const auto& [ptr, bytes] : bufs) {
      CK(cudaMemset(ptr, 0xFF, bytes));
      CK(cudaMemset(static_cast<unsigned char*>(ptr) + bytes, kCanary, kGuard));
    }
  }
  bool guards_intact() const {
    const std::pair<const void*, size_t> bufs[] = {
        {d_dq, q_elems() * sizeof(T)},  {d_dk, kv_elems() * sizeof(T)},
        {d_dv, kv_elems() * sizeof(T)}, {d_dq_acc, ws.dq_acc_bytes},
        {d_lse2, ws.lse2_bytes},        {d_dsum, ws.dsum_bytes}};
    std::vector<unsigned char> g(kGuard);
    for (const auto& [ptr, bytes] : bufs) {
      CK(cudaMemcpy(g.data(), static_cast<const unsigned char*>(ptr) + bytes, kGuard,
                    cudaMemcpyDeviceToHost));
      if (!std::all_of(g.begin(), g.end(), [](unsigned char x) { return x == kCanary; }))
        return false;
    }
    return true;
  }
};

// max |got - ref| / max |ref| over a tensor (an all-zero reference: max |got| itself), with
// every structurally zero element (Grads) required to be exactly zero and NaN failing.
struct TensorErr {
  double rel = 0;
  bool zeros_ok = true;
  size_t zeros = 0;
};
TensorErr compare(const std::vector<float>& got, const std::vector<double>& ref,
                  const std::vector<char>& structural_zero) {
  TensorErr e;
  double mx = 0, err = 0;
  for (size_t i = 0; i < ref.size(); ++i) mx = std::max(mx, std::fabs(ref[i]));
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(got[i]) || std::isinf(got[i])) {
      err = INFINITY;
      continue;
    }
    if (structural_zero[i]) {
      ++e.zeros;
      if (got[i] != 0.f) e.zeros_ok = false;
    }
    err = std::max(err, std::fabs(double(got[i]) - ref[i]));
  }
  e.rel = mx > 0 ? err / mx : err;  // all zero by cancellation (seq 1): the absolute error
  return e;
}

double tol_of(bool is_bf16) {
  return is_bf16 ? 2e-2 : 5e-3;
}

bool report(const std::string& tag, const std::string& what, const TensorErr (&e)[3], double tol,
            bool guards) {
  bool ok = guards;
  for (const TensorErr& x : e) ok = ok && x.rel <= tol && x.zeros_ok;
  std::printf("%s %-11s %-58s dQ %.1e dK %.1e dV %.1e (tol %.0e)%s%s\n", ok ? "PASS" : "FAIL",
              tag.c_str(), what.c_str(), e[0].rel, e[1].rel, e[2].rel, tol,
              guards ? "" : "  GUARD OVERWRITTEN",
              e[0].zeros_ok && e[1].zeros_ok && e[2].zeros_ok ? "" : "  NONZERO WHERE 0");
  std::fflush(stdout);
  if (!ok) ++g_failures;
  return ok;
}

// make_bwd_plan, or a FAIL line (counted) and false.
bool try_plan(const BwdParams& p, BwdVariant v, const std::string& what, BwdPlan* plan) {
  try {
    *plan = ladder::fa3::make_bwd_plan(p, v);
    return true;
  } catch (const std::exception& ex) {
    std::printf("FAIL %-11s %s: make_bwd_plan: %s\n", ladder::fa3::bwd_variant_name(v),
                what.c_str(), ex.what());
    std::fflush(stdout);
    ++g_failures;
    return false;
  }
}

void run_or_die(const BwdPlan& plan, const std::string& what) {
  try {
    ladder::fa3::launch_bwd(plan);
  } catch (const std::exception& ex) {
    std::printf("FAIL launch of %s: %s\n", what.c_str(), ex.what());
    std::fflush(stdout);
    std::exit(1);
  }
  sync_or_die(what);
}

// One run of a problem against its reference: the three errors.
template <class T>
bool check_run(Problem<T>& pr, const BwdParams& p, BwdVariant v, const std::string& what,
               const typename Problem<T>::Grads& ref, std::vector<unsigned char>* dkdv_bits) {
  BwdPlan plan;
  if (!try_plan(p, v, what, &plan)) return false;
  pr.poison();
  run_or_die(plan, std::string(ladder::fa3::bwd_variant_name(v)) + " " + what);
  const bool guards = pr.guards_intact();
  const TensorErr e[3] = {compare(download(pr.d_dq, pr.q_elems()), ref.dq, ref.dq_zero),
                          compare(download(pr.d_dk, pr.kv_elems()), ref.dk, ref.dk_zero),
                          compare(download(pr.d_dv, pr.kv_elems()), ref.dv, ref.dk_zero)};
  if (dkdv_bits) {
    dkdv_bits->resize(2 * pr.kv_elems() * sizeof(T));
    CK(cudaMemcpy(dkdv_bits->data(), pr.d_dk, pr.kv_elems() * sizeof(T), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(dkdv_bits->data() + pr.kv_elems() * sizeof(T), pr.d_dv, pr.kv_elems() * sizeof(T),
                  cudaMemcpyDeviceToHost));
  }
  return report(ladder::fa3::bwd_variant_name(v), what, e, tol_of(p.bf16), guards);
}

struct Case {
  const char* name;
  int B, H, Hkv, M, N;
  bool causal;
  double scale;  // 0: 1/sqrt(d)
  float qk_mul;  // Q and K are N(0, qk_mul^2)
};

const Case kCases[] = {
    {"one tile 128 x 128", 1, 1, 1, 128, 128, false, 0, 1.f},
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
    {"larger logits (Q, K x 2), 129 x 191", 1, 1, 1, 129, 191, false, 0, 2.f},
    {"ring wraps: 300 x 1500, gqa 2:1", 1, 2, 1, 300, 1500, false, 0, 1.f},
    {"ring wraps: 1000 x 300 causal, gqa 2:1", 1, 2, 1, 1000, 300, true, 0, 1.f},
    {"batch 2, heads 2, 384 causal", 2, 2, 2, 384, 384, true, 0, 1.f},
};

constexpr BwdVariant kVariants[] = {BwdVariant::tma_reduce, BwdVariant::atomic};

// Step 1: every case, both variants, for one dtype and head dim. passed[v] stays true if all did.
template <class T>
void check_cases(int d, bool (&passed)[2]) {
  const bool is_bf16 = std::is_same<T, bf16>::value;
  uint64_t seed = 1;
  for (const Case& cs : kCases) {
    Problem<T> pr(cs.B, cs.H, cs.Hkv, cs.M, cs.N, d, seed++, cs.qk_mul);
    RefOpts ro;
    ro.scale = cs.scale > 0 ? cs.scale : 1.0 / std::sqrt(double(d));
    ro.causal = cs.causal;
    pr.forward(ro);
    const auto ref = pr.reference(ro);
    char what[160];
    std::snprintf(what, sizeof(what), "%s d=%d %s", is_bf16 ? "bf16" : "fp16", d, cs.name);
    for (int vi = 0; vi < 2; ++vi)
      if (!check_run(pr, pr.params(ro.scale, cs.causal), kVariants[vi], what, ref, nullptr))
        passed[vi] = false;
  }
}

// Step 2: dropout and block-sparse masks.
template <class T>
void check_extras(int d, bool (&passed)[2]) {
  const bool is_bf16 = std::is_same<T, bf16>::value;
  struct Extra {
    const char* name;
    int B, H, Hkv, M, N;
    bool causal;
    double p;
    int mask;  // 0 none; 1 random 0.5 + an empty query block and an empty key block; 2 all ones
    int bm, bn;
    bool bcast_b, bcast_h;  // mask shaped [1, ...] / [., 1, ...]
  };
  const Extra extras[] = {
      {"dropout 0.1, 333 x 333, gqa 2:1", 2, 2, 1, 333, 333, false, 0.1, 0, 128, 128, false, false},
      {"dropout 0.5, 200 x 450 causal", 1, 2, 2, 200, 450, true, 0.5, 0, 128, 128, false, false},
      {"mask 0.5 [B,H], empty query and key block", 2, 2, 2, 700, 700, false, 0, 1, 128, 128, false,
       false},
      {"mask 0.5 [B,H], empty blocks, causal", 2, 2, 2, 700, 700, true, 0, 1, 128, 128, false,
       false},
      {"mask 0.5 [1,H] 256x256, 600 x 900, gqa 2:1", 2, 2, 1, 600, 900, false, 0, 1, 256, 256, true,
       false},
      {"mask 0.5 [B,1] 128x256, 500 x 1100 causal", 2, 2, 2, 500, 1100, true, 0, 1, 128, 256, false,
       true},
      {"mask 0.5 + dropout 0.1, causal", 2, 2, 2, 700, 700, true, 0.1, 1, 128, 128, false, false},
      {"all-ones mask = dense, 520 x 777", 1, 2, 2, 520, 777, false, 0, 2, 128, 128, false, false},
      {"all-ones mask = dense, causal, gqa 2:1", 1, 2, 1, 520, 777, true, 0, 2, 128, 128, false,
       false},
  };
  uint64_t seed = 100;
  for (const Extra& x : extras) {
    Problem<T> pr(x.B, x.H, x.Hkv, x.M, x.N, d, seed++, 1.f);
    RefOpts ro;
    ro.scale = 1.0 / std::sqrt(double(d));
    ro.causal = x.causal, ro.dropout_p = x.p, ro.seed = 0x0123456789abcdefull;
    BwdParams p = pr.params(ro.scale, x.causal);
    p.dropout_p = float(x.p), p.dropout_seed = ro.seed;
    BlockMask mask;
    int *dcount = nullptr, *dindex = nullptr;
    if (x.mask) {
      const int nI = (x.M + x.bm - 1) / x.bm, nJ = (x.N + x.bn - 1) / x.bn;
      const int mb = x.bcast_b ? 1 : x.B, mh = x.bcast_h ? 1 : x.H;
      mask = random_mask(mb, mh, nI, nJ, x.bm, x.bn, x.mask == 2 ? 1.0 : 0.5, seed * 77);
      if (x.mask == 1) {
        const int h1 = std::min(1, mh - 1);
        if (nI > 1)  // query block 1 of mask row (0, h1) sees nothing: dQ rows exactly 0
          for (int J = 0; J < nJ; ++J) mask.bits[((size_t(0) * mh + h1) * nI + 1) * nJ + J] = 0;
        if (nJ > 2)  // key block 2 of mask row (0, 0) is seen by nothing
          for (int I = 0; I < nI; ++I) mask.bits[(size_t(0) * nI + I) * nJ + 2] = 0;
      }
      mask.build_lists();
      CK(cudaMalloc(&dcount, mask.count.size() * sizeof(int)));
      CK(cudaMalloc(&dindex, mask.index.size() * sizeof(int)));
      CK(cudaMemcpy(dcount, mask.count.data(), mask.count.size() * sizeof(int),
                    cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dindex, mask.index.data(), mask.index.size() * sizeof(int),
                    cudaMemcpyHostToDevice));
      p.q_count = dcount, p.q_index = dindex;
      p.block_m = x.bm, p.block_n = x.bn, p.mask_batch = mb, p.mask_heads = mh;
      ro.mask = &mask;
    }
    pr.forward(ro);
    const auto ref = pr.reference(ro);
    char what[160];
    std::snprintf(what, sizeof(what), "%s d=%d %s", is_bf16 ? "bf16" : "fp16", d, x.name);
    for (int vi = 0; vi < 2; ++vi) {
      const BwdVariant v = kVariants[vi];
      std::vector<unsigned char> sparse_bits, dense_bits;
      if (!check_run(pr, p, v, what, ref, x.mask == 2 ? &sparse_bits : nullptr)) passed[vi] = false;
      if (x.mask == 2) {
        // The same problem through the dense kernel: dK and dV must be the same bits (dQ's fp32
        // additions come in any order).
        if (!check_run(pr, pr.params(ro.scale, x.causal), v, std::string(what) + " (dense twin)",
                       ref, &dense_bits))
          passed[vi] = false;
        const bool same = sparse_bits == dense_bits;
        std::printf("%s %-11s %-58s dK, dV of the all-ones mask and dense: %s\n",
                    same ? "PASS" : "FAIL", ladder::fa3::bwd_variant_name(v), what,
                    same ? "bit-identical" : "DIFFER");
        if (!same) ++g_failures, passed[vi] = false;
      }
    }
    if (dcount) CK(cudaFree(dcount));
    if (dindex) CK(cudaFree(dindex));
  }
}

// ---- flash shapes -------------------------------------------------------------------------------

// A plain fp32 forward for the timing runs' O and LSE: one thread per query row, K and V staged
// through shared memory 32 keys at a time; pass 1 the row max and sum, pass 2 O in 32-column
// chunks (to keep the registers of q and one chunk of O).
template <class T, int D>
__global__ void __launch_bounds__(64)
    ref_forward_kernel(const T* q, const T* k, const T* v, T* o, float* lse, int H, int Hkv, int M,
                       int N, float scale, int causal) {
  constexpr int kRows = 64, kKeys = 32;
  __shared__ float sk[kKeys][D], sv[kKeys][D];
  const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hkv);
  const int i = blockIdx.x * kRows + threadIdx.x;
  const T* kp = k + (size_t(b) * Hkv + hk) * N * D;
  const T* vp = v + (size_t(b) * Hkv + hk) * N * D;
  float qr[D];  // (every loop over it unrolled: it stays in registers)
#pragma unroll
  for (int c = 0; c < D; ++c) qr[c] = i < M ? to_f(q[(size_t(bh) * M + i) * D + c]) : 0.f;
  const int last_row = min(M - 1, int(blockIdx.x) * kRows + kRows - 1);
  const int n_end = causal ? max(0, min(N, last_row + 1 + N - M)) : N;  // the block's keys
  const int lim = causal ? i + N - M : N - 1;                           // this row's last key
  auto load = [&](int j0, bool with_v) {
    __syncthreads();
    for (int x = threadIdx.x; x < kKeys * D; x += kRows) {
      const int jj = x / D, c = x % D, j = j0 + jj;
      sk[jj][c] = j < N ? to_f(kp[size_t(j) * D + c]) : 0.f;
      if (with_v) sv[jj][c] = j < N ? to_f(vp[size_t(j) * D + c]) : 0.f;
    }
    __syncthreads();
  };
  float m = -INFINITY, l = 0.f;
  for (int j0 = 0; j0 < n_end; j0 += kKeys) {
    load(j0, false);
    for (int jj = 0; jj < kKeys; ++jj) {
      const int j = j0 + jj;
      if (i >= M || j >= n_end || j > lim) continue;
      float s = 0.f;
#pragma unroll
      for (int c = 0; c < D; ++c) s = fmaf(qr[c], sk[jj][c], s);
      s *= scale;
      const float mn = fmaxf(m, s);
      l = l * expf(m - mn) + expf(s - mn);
      m = mn;
    }
  }
  const float L = l > 0.f ? m + logf(l) : -INFINITY;
  if (i < M) lse[size_t(bh) * M + i] = L;
  for (int c0 = 0; c0 < D; c0 += 32) {
    float acc[32];
#pragma unroll
    for (int c = 0; c < 32; ++c) acc[c] = 0.f;
    for (int j0 = 0; j0 < n_end; j0 += kKeys) {
      load(j0, true);
      for (int jj = 0; jj < kKeys; ++jj) {
        const int j = j0 + jj;
        if (i >= M || j >= n_end || j > lim) continue;
        float s = 0.f;
#pragma unroll
        for (int c = 0; c < D; ++c) s = fmaf(qr[c], sk[jj][c], s);
        const float pj = expf(s * scale - L);
#pragma unroll
        for (int c = 0; c < 32; ++c) acc[c] = fmaf(pj, sv[jj][c0 + c], acc[c]);
      }
    }
    if (i < M) {
#pragma unroll
      for (int c = 0; c < 32; ++c) o[(size_t(bh) * M + i) * D + c0 + c] = to_t<T>(acc[c]);
    }
  }
}

template <class T>
struct FlashBuffers {
  static constexpr size_t kElems = size_t(16384) * 2048;  // tokens x (heads x d), every shape
  static constexpr size_t kRows = size_t(16384) * 32;     // B H M <= 16384 * 2048 / 64
  T *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *dout = nullptr;
  T *dq = nullptr, *dk = nullptr, *dv = nullptr;
  float *lse = nullptr, *dq_acc = nullptr, *lse2 = nullptr, *dsum = nullptr;
  void* flush = nullptr;
  size_t flush_bytes = 0;
  FlashBuffers() {
    T** const bufs[8] = {&q, &k, &v, &o, &dout, &dq, &dk, &dv};
    for (T** p : bufs) CK(cudaMalloc(p, kElems * sizeof(T)));
    CK(cudaMalloc(&lse, kRows * sizeof(float)));
    CK(cudaMalloc(&lse2, kRows * sizeof(float)));  // flash seq_q are multiples of 128: no pad
    CK(cudaMalloc(&dsum, kRows * sizeof(float)));
    CK(cudaMalloc(&dq_acc, kElems * sizeof(float)));
    int dev = 0, l2 = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    flush_bytes = 2 * size_t(l2);
    CK(cudaMalloc(&flush, flush_bytes));
    init_normal<T><<<1024, 256>>>(q, kElems, 21);
    init_normal<T><<<1024, 256>>>(k, kElems, 22);
    init_normal<T><<<1024, 256>>>(v, kElems, 23);
    init_normal<T><<<1024, 256>>>(dout, kElems, 24);
    CK(cudaGetLastError());
    sync_or_die("input initialisation");
  }
  ~FlashBuffers() {
    for (void* p :
         {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v),
          static_cast<void*>(o), static_cast<void*>(dout), static_cast<void*>(dq),
          static_cast<void*>(dk), static_cast<void*>(dv), static_cast<void*>(lse),
          static_cast<void*>(dq_acc), static_cast<void*>(lse2), static_cast<void*>(dsum), flush})
      cudaFree(p);
  }
  FlashBuffers(const FlashBuffers&) = delete;
  FlashBuffers& operator=(const FlashBuffers&) = delete;
};

// Sampled query rows (dQ) and keys (dK, dV) of heads (0, 0) and (B-1, H-1) against float64,
// each sampled vector normalised by its own largest reference element.
template <class T>
double check_sampled(const FlashBuffers<T>& fb, const BwdParams& p) {
  const int M = p.seq_q, N = p.seq_k, d = p.dim, group = p.heads / p.heads_kv;
  const double scale = p.scale;
  const int heads[2][2] = {{0, 0}, {p.batch - 1, p.heads - 1}};
  const int rows[] = {0, 1, 127, 128, M / 2 + 3, M - 1};
  const int keys[] = {0, 1, 127, 128, N / 2 + 3, N - 1};
  double worst = 0;
  auto vec_err = [&](const std::vector<float>& got, const std::vector<double>& ref) {
    double mx = 0, err = 0;
    for (size_t c = 0; c < ref.size(); ++c) {
      mx = std::max(mx, std::fabs(ref[c]));
      err = std::isfinite(got[c]) ? std::max(err, std::fabs(double(got[c]) - ref[c])) : INFINITY;
    }
    return mx > 0 ? err / mx : (err > 0 ? INFINITY : 0.0);
  };
  for (const auto& bhh : heads) {
    const int b = bhh[0], h = bhh[1], hk = h / group;
    const size_t qoff = (size_t(b) * p.heads + h) * M * d,
                 kvoff = (size_t(b) * p.heads_kv + hk) * N * d;
    const std::vector<float> Q = download(fb.q + qoff, size_t(M) * d);
    const std::vector<float> G = download(fb.dout + qoff, size_t(M) * d);
    const std::vector<float> O = download(fb.o + qoff, size_t(M) * d);
    const std::vector<float> K = download(fb.k + kvoff, size_t(N) * d);
    const std::vector<float> V = download(fb.v + kvoff, size_t(N) * d);
    std::vector<float> L(static_cast<size_t>(M));
    CK(cudaMemcpy(L.data(), fb.lse + (size_t(b) * p.heads + h) * M, M * sizeof(float),
                  cudaMemcpyDeviceToHost));
    std::vector<double> Dv(static_cast<size_t>(M));
    for (int i = 0; i < M; ++i) Dv[size_t(i)] = dot(&G[size_t(i) * d], &O[size_t(i) * d], d);
    auto vis = [&](int i, int j) { return !p.causal || j <= i + N - M; };
    for (int i : rows) {
      std::vector<double> ref(static_cast<size_t>(d), 0.0);
      for (int j = 0; j < N; ++j) {
        if (!vis(i, j)) continue;
        const double P =
            std::exp(scale * dot(&Q[size_t(i) * d], &K[size_t(j) * d], d) - L[size_t(i)]);
        const double dS = P * (dot(&G[size_t(i) * d], &V[size_t(j) * d], d) - Dv[size_t(i)]);
        for (int c = 0; c < d; ++c) ref[size_t(c)] += scale * dS * K[size_t(j) * d + c];
      }
      worst = std::max(worst, vec_err(download(fb.dq + qoff + size_t(i) * d, size_t(d)), ref));
    }
    for (int j : keys) {
      // With heads == heads_kv (the flash shapes) key j of K/V head hk sees only query head h.
      std::vector<double> rk(static_cast<size_t>(d), 0.0), rv(static_cast<size_t>(d), 0.0);
      for (int i = 0; i < M; ++i) {
        if (!vis(i, j)) continue;
        const double P =
            std::exp(scale * dot(&Q[size_t(i) * d], &K[size_t(j) * d], d) - L[size_t(i)]);
        const double dS = P * (dot(&G[size_t(i) * d], &V[size_t(j) * d], d) - Dv[size_t(i)]);
        for (int c = 0; c < d; ++c) {
          rk[size_t(c)] += scale * dS * Q[size_t(i) * d + c];
          rv[size_t(c)] += P * G[size_t(i) * d + c];
        }
      }
      worst = std::max(worst, vec_err(download(fb.dk + kvoff + size_t(j) * d, size_t(d)), rk));
      worst = std::max(worst, vec_err(download(fb.dv + kvoff + size_t(j) * d, size_t(d)), rv));
    }
  }
  return worst;
}

template <class T>
void time_flash(const bool (&passed)[2][2]) {
  const bool is_bf16 = std::is_same<T, bf16>::value;
  FlashBuffers<T> fb;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int di = 0; di < 2; ++di) {
    const int d = di == 0 ? 64 : 128;
    for (int causal = 0; causal < 2; ++causal)
      for (int seq : {1024, 4096, 16384}) {
        BwdParams p;
        p.q = fb.q, p.k = fb.k, p.v = fb.v, p.o = fb.o, p.dout = fb.dout, p.lse = fb.lse;
        p.dq = fb.dq, p.dk = fb.dk, p.dv = fb.dv;
        p.dq_acc = fb.dq_acc, p.lse2 = fb.lse2, p.dsum = fb.dsum;
        p.batch = 16384 / seq, p.heads = 2048 / d, p.heads_kv = p.heads;
        p.seq_q = p.seq_k = seq, p.dim = d, p.bf16 = is_bf16;
        p.scale = float(1.0 / std::sqrt(double(d))), p.causal = causal != 0;
        const double flops =
            2.5 * 4.0 * p.batch * p.heads * double(seq) * seq * d * (causal ? 0.5 : 1.0);
        char what[160];
        std::snprintf(what, sizeof(what), "%s d=%-3d causal=%d seq=%-5d B=%-2d H=%-2d",
                      is_bf16 ? "bf16" : "fp16", d, causal, seq, p.batch, p.heads);
        // O and LSE for these inputs.
        if (d == 64)
          ref_forward_kernel<T, 64><<<dim3(unsigned(seq / 64), unsigned(p.batch * p.heads)), 64>>>(
              fb.q, fb.k, fb.v, fb.o, fb.lse, p.heads, p.heads_kv, seq, seq, p.scale, causal);
        else
          ref_forward_kernel<T, 128><<<dim3(unsigned(seq / 64), unsigned(p.batch * p.heads)), 64>>>(
              fb.q, fb.k, fb.v, fb.o, fb.lse, p.heads, p.heads_kv, seq, seq, p.scale, causal);
        CK(cudaGetLastError());
        sync_or_die(std::string("reference forward ") + what, 300.0);
        for (int vi = 0; vi < 2; ++vi) {
          const BwdVariant v = kVariants[vi];
          const char* vn = ladder::fa3::bwd_variant_name(v);
          if (!passed[di][vi]) {
            std::printf("SKIP %-11s %s (failed the small cases)\n", vn, what);
            continue;
          }
          BwdPlan plan;
          if (!try_plan(p, v, what, &plan)) continue;
          T* const outs[3] = {fb.dq, fb.dk, fb.dv};
          for (T* x : outs)
            CK(cudaMemset(x, 0xFF, size_t(p.batch) * p.heads * seq * d * sizeof(T)));
          run_or_die(plan, std::string(vn) + " " + what);
          const double err = check_sampled(fb, p);
          const bool ok = err <= tol_of(is_bf16);
          std::printf("%s %-11s %s sampled rows/keys: worst %.1e (tol %.0e)\n",
                      ok ? "PASS" : "FAIL", vn, what, err, tol_of(is_bf16));
          std::fflush(stdout);
          if (!ok) {
            ++g_failures;
            continue;
          }
          auto median_ms = [&](bool main_only) {
            for (int w = 0; w < 3; ++w)
              main_only ? ladder::fa3::launch_bwd_main(plan) : ladder::fa3::launch_bwd(plan);
            sync_or_die(std::string("warm-up ") + what);
            std::vector<float> ms;
            for (int r = 0; r < 20; ++r) {
              CK(cudaMemsetAsync(fb.flush, r & 0xff, fb.flush_bytes));
              CK(cudaEventRecord(e0));
              main_only ? ladder::fa3::launch_bwd_main(plan) : ladder::fa3::launch_bwd(plan);
              CK(cudaEventRecord(e1));
              sync_or_die(std::string("timed run ") + what);
              float t = 0;
              CK(cudaEventElapsedTime(&t, e0, e1));
              ms.push_back(t);
            }
            std::sort(ms.begin(), ms.end());
            return 0.5 * (ms[9] + ms[10]);
          };
          const double all = median_ms(false), main = median_ms(true);
          std::printf(
              "TIME bwd %-11s %s  %8.3f ms  %6.1f TFLOP/s   main kernel %8.3f ms  %6.1f "
              "TFLOP/s   [%s]\n",
              vn, what, all, flops / (all * 1e-3) / 1e12, main, flops / (main * 1e-3) / 1e12,
              ladder::fa3::describe(plan).c_str());
          std::fflush(stdout);
        }
      }
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
}

}  // namespace

int main(int argc, char** argv) {
  bool timing = true;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--no-timing")) {
      timing = false;
    } else {
      std::printf("usage: %s [--no-timing]\n", argv[0]);
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
  const auto t0 = std::chrono::steady_clock::now();
  bool passed[2][2][2];  // [dtype][d][variant]
  for (auto& a : passed)
    for (auto& b : a)
      for (bool& c : b) c = true;
  check_cases<bf16>(64, passed[0][0]);
  check_cases<bf16>(128, passed[0][1]);
  check_cases<fp16>(64, passed[1][0]);
  check_cases<fp16>(128, passed[1][1]);
  check_extras<bf16>(64, passed[0][0]);
  check_extras<bf16>(128, passed[0][1]);
  check_extras<fp16>(64, passed[1][0]);
  check_extras<fp16>(128, passed[1][1]);
  std::printf("checks: %d failed (%.1f s)\n", g_failures,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  if (timing) {
    time_flash<bf16>(passed[0]);
    time_flash<fp16>(passed[1]);
  }
  std::printf("%s: %d failed (%.1f s total)\n", g_failures ? "FAIL" : "PASS", g_failures,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return g_failures ? 1 : 0;
}
