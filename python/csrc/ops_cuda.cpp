// The CUDA implementations of the ladder::fwd and ladder::bwd operators (schemas and fake
// implementations: ladder_torch/ops.py). Checks the tensors, allocates outputs and workspaces
// through PyTorch's caching allocator, and hands raw pointers to the rung's kernels (found in
// the registry the .cu adaptors fill) on PyTorch's current stream, so the kernels order with
// the rest of the model's work and with CUDA graphs' capture.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "checks.h"
#include "dims.hpp"
#include "rung_api.h"

namespace ladder_torch {

// ------------------------------------------------------------------------------- registry

namespace {
std::vector<RungKernels>& registry() {
  static std::vector<RungKernels> r;  // filled by static initialisers of the adaptors
  return r;
}

std::vector<std::pair<std::string, const std::atomic<int64_t>*>>& counters() {
  static std::vector<std::pair<std::string, const std::atomic<int64_t>*>> c;
  return c;
}

const char* torch_dtype_name(DType t) {
  static const char* const names[] = {"float64", "float32", "float16",
                                      "bfloat16"};  // DType's order
  return names[int(t)];
}

}  // namespace

void register_counter(const char* name, const std::atomic<int64_t>* value) {
  counters().emplace_back(name, value);
}

namespace {

// One line per compiled instantiation, "rung dtype dim backward lse_lo" (e.g. "7 bfloat16 64 1
// 0"): what ladder_torch checks calls against, so that Python holds no copy of the list.
std::string capabilities() {
  std::ostringstream s;
  for (const RungKernels& k : registry())
    s << k.rung << " " << torch_dtype_name(k.dtype) << " " << k.dim << " "
      << (k.backward != nullptr) << " " << k.lse_lo << "\n";
  return s.str();
}

std::string counter_values() {
  std::ostringstream s;
  for (const auto& [name, value] : counters()) s << name << " " << value->load() << "\n";
  return s.str();
}

}  // namespace

void register_kernels(const RungKernels& k) {
  registry().push_back(k);
}

const RungKernels* find_kernels(int rung, DType dtype, int dim) {
  for (const RungKernels& k : registry())
    if (k.rung == rung && k.dtype == dtype && k.dim == dim) return &k;
  return nullptr;
}

std::string built_kernels() {
  std::map<int, std::map<std::string, std::vector<int>>> by_rung;  // sorted: stable text
  for (const RungKernels& k : registry())
    by_rung[k.rung]
           [std::string(ladder::dtype_name(k.dtype)) + (k.backward ? "" : " (forward only)")]
               .push_back(k.dim);
  std::ostringstream s;
  for (auto& [rung, dtypes] : by_rung) {
    if (s.tellp() > 0) s << "\n";
    s << "rung " << rung << ":";
    const char* sep = " ";
    for (auto& [name, dims] : dtypes) {
      std::sort(dims.begin(), dims.end());
      s << sep << name << " d=";
      for (size_t i = 0; i < dims.size(); ++i) s << (i ? " " : "") << dims[i];
      sep = "; ";
    }
  }
  return s.str();
}

// ------------------------------------------------------------------------------- operators

namespace {

// The kernels' limits, as the steps' descriptors state them: batch and heads on grid.z and
// grid.y, sequences in 32-bit row indices.
constexpr ladder::GridLimits kLimits = ladder::kGridLimits;

struct Shape {
  int batch, heads, heads_kv, seq_q, seq_k, dim;
  int64_t rows() const { return int64_t(batch) * heads * seq_q; }
};

DType dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return DType::f32;
    case at::kHalf:
      return DType::f16;
    case at::kBFloat16:
      return DType::bf16;
    default:
      TORCH_CHECK_TYPE(false, "ladder: no CUDA rung takes ", t.scalar_type(), " tensors. Built:\n",
                       built_kernels());
  }
}

// Q [B, H, M, d], K and V [B, Hkv, N, d] on one CUDA device, one dtype, H a multiple of Hkv.
Shape check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  check_4d(q, k, v);
  TORCH_CHECK_VALUE(q.is_cuda() && k.device() == q.device() && v.device() == q.device(),
                    "ladder: q, k, v must be on one CUDA device; got ", q.device(), ", ",
                    k.device(), ", ", v.device());
  TORCH_CHECK_TYPE(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
                   "ladder: q, k, v must have one dtype; got ", q.scalar_type(), ", ",
                   k.scalar_type(), ", ", v.scalar_type());
  check_kv_shapes(q, k, v);
  const int64_t h = q.size(1), hkv = k.size(1);
  TORCH_CHECK_VALUE(q.size(0) <= kLimits.batch && h <= kLimits.heads,
                    "ladder: batch and heads must be at most ", kLimits.batch, " and ",
                    kLimits.heads, "; got ", q.size(0), ", ", h);
  TORCH_CHECK_VALUE(q.size(2) <= kLimits.seq && k.size(2) <= kLimits.seq,
                    "ladder: sequence lengths must be at most ", kLimits.seq, "; got ", q.size(2),
                    ", ", k.size(2));
  return Shape{int(q.size(0)), int(h), int(hkv), int(q.size(2)), int(k.size(2)), int(q.size(3))};
}

const RungKernels& kernels_for(int64_t rung, const at::Tensor& q, bool backward) {
  const RungKernels* k = find_kernels(int(rung), dtype_of(q), int(q.size(3)));
  TORCH_CHECK_NOT_IMPLEMENTED(k != nullptr && (!backward || k->backward != nullptr),
                              "ladder: rung ", rung, " has no ", backward ? "backward" : "forward",
                              " for ", q.scalar_type(), " with head dim ", q.size(3),
                              " in this build. Built:\n", built_kernels());
  return *k;
}

// The kernels read 16-byte vectors from dense row-major tensors: a strided or misaligned
// view (a slice at an odd offset) is copied first; `negate` makes the copy -t.
at::Tensor dense(const at::Tensor& t, bool negate = false) {
  if (negate) return t.neg().contiguous();  // a fresh, aligned allocation
  const at::Tensor c = t.contiguous();
  return reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 == 0 ? c : c.clone();
}

float* f32_or_null(const at::Tensor& t) {
  return t.numel() > 0 ? t.data_ptr<float>() : nullptr;
}

// Calls a rung's forward or backward and turns what goes wrong into a Python exception: a CUDA
// error as PyTorch reports its own, and an exception from the rung's host code (rung 07 checks
// its parameters and throws) as a RuntimeError that keeps its message.
template <class Call>
void run_rung(int64_t rung, const char* what, Call&& call) {
  cudaError_t e = cudaSuccess;
  try {
    e = call();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& x) {
    TORCH_CHECK(false, "ladder: rung ", rung, " ", what, ": ", x.what());
  }
  C10_CUDA_CHECK(e);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fwd_cuda(const at::Tensor& q_in,
                                                        const at::Tensor& k_in,
                                                        const at::Tensor& v_in, bool causal,
                                                        double scale, int64_t rung) {
  const Shape s = check_qkv(q_in, k_in, v_in);
  check_scale(scale);
  const RungKernels& kern = kernels_for(rung, q_in, false);
  const c10::cuda::CUDAGuard guard(q_in.device());
  const auto f32 = q_in.options().dtype(at::kFloat);
  const bool negate = kern.positive_scale && scale < 0;
  const at::Tensor q = dense(q_in, negate), k = dense(k_in), v = dense(v_in);
  at::Tensor o = at::empty_like(q, at::MemoryFormat::Contiguous);
  at::Tensor lse = at::empty({s.batch, s.heads, s.seq_q}, f32);
  // lse_lo: [B, H, M] for a rung that keeps LSE's rounding residual, else an empty [0].
  at::Tensor lse_lo =
      kern.lse_lo ? at::empty({s.batch, s.heads, s.seq_q}, f32) : at::empty({0}, f32);
  if (s.rows() == 0 || s.seq_k == 0) {  // nothing to launch: no visible key anywhere
    o.zero_();
    lse.fill_(-std::numeric_limits<float>::infinity());
    lse_lo.zero_();
    return {o, lse, lse_lo};
  }
  FwdArgs a{};
  a.q = q.data_ptr(), a.k = k.data_ptr(), a.v = v.data_ptr(), a.o = o.data_ptr();
  a.lse = lse.data_ptr<float>(), a.lse_lo = f32_or_null(lse_lo);
  a.batch = s.batch, a.heads = s.heads, a.heads_kv = s.heads_kv;
  a.seq_q = s.seq_q, a.seq_k = s.seq_k, a.dim = s.dim;
  a.scale = float(negate ? -scale : scale), a.causal = causal;
  run_rung(rung, "forward", [&] { return kern.forward(a, c10::cuda::getCurrentCUDAStream()); });
  return {o, lse, lse_lo};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_cuda(
    const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in,
    const at::Tensor& v_in, const at::Tensor& o_in, const at::Tensor& lse_in,
    const at::Tensor& lse_lo_in, bool causal, double scale, int64_t rung) {
  const Shape s = check_qkv(q_in, k_in, v_in);
  check_scale(scale);
  const RungKernels& kern = kernels_for(rung, q_in, true);
  TORCH_CHECK_VALUE(
      dout_in.sizes() == q_in.sizes() && o_in.sizes() == q_in.sizes() &&
          dout_in.scalar_type() == q_in.scalar_type() && o_in.scalar_type() == q_in.scalar_type() &&
          dout_in.device() == q_in.device() && o_in.device() == q_in.device(),
      "ladder: dout and out must match q (", q_in.sizes(), ", ", q_in.scalar_type(), "); got ",
      dout_in.sizes(), " ", dout_in.scalar_type(), " and ", o_in.sizes(), " ", o_in.scalar_type());
  const std::vector<int64_t> rows_shape{s.batch, s.heads, s.seq_q};
  TORCH_CHECK_VALUE(lse_in.sizes() == rows_shape && lse_in.scalar_type() == at::kFloat &&
                        lse_in.device() == q_in.device(),
                    "ladder: lse must be float32 ", c10::IntArrayRef(rows_shape), "; got ",
                    lse_in.sizes(), " ", lse_in.scalar_type());
  TORCH_CHECK_VALUE(
      !kern.lse_lo || (lse_lo_in.sizes() == rows_shape && lse_lo_in.scalar_type() == at::kFloat &&
                       lse_lo_in.device() == q_in.device()),
      "ladder: rung ", rung, " needs the forward's lse_lo, float32 ", c10::IntArrayRef(rows_shape),
      "; got ", lse_lo_in.sizes());
  const c10::cuda::CUDAGuard guard(q_in.device());
  const auto f32 = q_in.options().dtype(at::kFloat);
  const bool negate = kern.positive_scale && scale < 0;  // the Q the forward used
  const at::Tensor q = dense(q_in, negate), k = dense(k_in), v = dense(v_in);
  const at::Tensor o = dense(o_in), dout = dense(dout_in), lse = dense(lse_in);
  const at::Tensor lse_lo = kern.lse_lo ? dense(lse_lo_in) : lse_lo_in;
  at::Tensor dq = at::empty_like(q, at::MemoryFormat::Contiguous);
  at::Tensor dk = at::empty_like(k, at::MemoryFormat::Contiguous);
  at::Tensor dv = at::empty_like(v, at::MemoryFormat::Contiguous);
  if (s.rows() == 0 || s.seq_k == 0) {  // no visible key anywhere: zero gradients
    dq.zero_(), dk.zero_(), dv.zero_();
    return {dq, dk, dv};
  }
  // Workspaces, written by the kernels before they are read: the pre-pass zeroes dq_acc. LSE
  // log2(e) and D per query row, the rows padded to the rung's multiple (rung 07 copies a
  // tile's rows in whole aligned blocks).
  const int64_t pad = std::max(1, kern.bwd_row_pad);
  const std::vector<int64_t> padded_shape{s.batch, s.heads, (s.seq_q + pad - 1) / pad * pad};
  at::Tensor lse2 = at::empty(padded_shape, f32), dsum = at::empty(padded_shape, f32);
  at::Tensor dq_acc = at::empty(q.sizes(), f32);
  BwdArgs a{};
  a.q = q.data_ptr(), a.k = k.data_ptr(), a.v = v.data_ptr(), a.o = o.data_ptr();
  a.dout = dout.data_ptr(), a.lse = lse.data_ptr<float>();
  a.lse_lo = kern.lse_lo ? lse_lo.data_ptr<float>() : nullptr;
  a.lse2 = lse2.data_ptr<float>(), a.dsum = dsum.data_ptr<float>();
  a.dq_acc = dq_acc.data_ptr<float>();
  a.dq = dq.data_ptr(), a.dk = dk.data_ptr(), a.dv = dv.data_ptr();
  a.batch = s.batch, a.heads = s.heads, a.heads_kv = s.heads_kv;
  a.seq_q = s.seq_q, a.seq_k = s.seq_k, a.dim = s.dim;
  a.scale = float(negate ? -scale : scale), a.scale_dq = float(scale), a.causal = causal;
  run_rung(rung, "backward", [&] { return kern.backward(a, c10::cuda::getCurrentCUDAStream()); });
  return {dq, dk, dv};
}

}  // namespace
}  // namespace ladder_torch

TORCH_LIBRARY_IMPL(ladder, CUDA, m) {
  m.impl("fwd", &ladder_torch::fwd_cuda);
  m.impl("bwd", &ladder_torch::bwd_cuda);
}

// Which (rung, dtype, head dim) instantiations this build has, for messages and the tests.
TORCH_LIBRARY_FRAGMENT(ladder, m) {
  m.def("cuda_kernels() -> str", &ladder_torch::built_kernels);
  m.def("cuda_capabilities() -> str", &ladder_torch::capabilities);
  m.def("cuda_counters() -> str", &ladder_torch::counter_values);
}
