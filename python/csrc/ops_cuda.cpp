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
#include <optional>
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

// One line per compiled instantiation, "rung dtype dim backward lse_lo strides dropout
// mask_block_q mask_block_k" (e.g. "7 bfloat16 64 1 0 1 1 128 128"): what ladder_torch checks
// calls against, so that Python holds no copy of the list.
std::string capabilities() {
  std::ostringstream s;
  for (const RungKernels& k : registry())
    s << k.rung << " " << torch_dtype_name(k.dtype) << " " << k.dim << " "
      << (k.backward != nullptr) << " " << k.lse_lo << " " << (k.takes_strides != nullptr) << " "
      << k.dropout << " " << k.mask_block_q << " " << k.mask_block_k << "\n";
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

// Copies made because a rung could not read a tensor where it was (its layout, or a base that
// is not 16-byte aligned): what a test reads to see that a rung with strides reads views in place.
std::atomic<int64_t> g_layout_copies{0};
const CounterRegistrar kCounters{{"ops.layout_copies", &g_layout_copies}};

// A dense, 16-byte-aligned tensor with t's contents: t itself when it is one, else a copy.
at::Tensor dense(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  const at::Tensor d = reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 == 0 ? c : c.clone();
  if (!d.is_same(t)) g_layout_copies.fetch_add(1, std::memory_order_relaxed);
  return d;
}

// t's strides as `kern` would read them in place, where it takes them (its takes_strides: the
// step's own rule) and the head dim is contiguous and the base 16-byte aligned; nothing
// otherwise. A dimension of extent 1 is never stepped along: its stride is taken as the dense
// one. A dense tensor gives all 0 (the kernels' dense).
std::optional<Strides> strides_of(const at::Tensor& t, const RungKernels& kern) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return std::nullopt;
  if (t.is_contiguous()) return Strides{};
  if (!kern.takes_strides || (t.size(3) > 1 && t.stride(3) != 1)) return std::nullopt;
  int64_t s[3], inner = t.size(3);
  for (int i = 2; i >= 0; --i) {
    s[i] = t.size(i) == 1 ? inner : t.stride(i);
    inner = s[i] * t.size(i);
  }
  const Strides st{s[0], s[1], s[2]};
  if (st.batch == 0 && st.head == 0 && st.row == 0) return std::nullopt;  // all 0 reads as dense
  return kern.takes_strides(st) ? std::optional<Strides>(st) : std::nullopt;
}

// A tensor as the kernels read it: in place, with its strides, where the rung takes strides and
// the tensor keeps their rule; else a dense copy. `negate` reads -t (a fresh tensor in t's
// dimension order: a view of a [B, M, H, d] buffer gives a dense [B, M, H, d] one).
struct Operand {
  at::Tensor t;
  Strides strides;
};
Operand operand(const at::Tensor& t, const RungKernels& kern, bool negate = false) {
  const at::Tensor x = negate ? t.neg() : t;
  if (const std::optional<Strides> s = strides_of(x, kern)) return {x, *s};
  return {dense(x), Strides{}};
}

// The output O. For a rung that writes through strides, in the layout SDPA's flash and cuDNN
// backends give: where q is a view of [B, M, H, d] storage (q.stride(1) < q.stride(2)), O is
// [B, M, H, d] storage too, so that O.transpose(1, 2).reshape(B, M, H * d) is free; else dense.
// The fake implementation (_schema.py) follows the same rule.
at::Tensor new_out(const at::Tensor& q, const RungKernels& kern) {
  if (kern.takes_strides && q.stride(1) < q.stride(2))
    return at::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, q.options()).transpose(1, 2);
  return at::empty(q.sizes(), q.options());
}

float* f32_or_null(const at::Tensor& t) {
  return t.numel() > 0 ? t.data_ptr<float>() : nullptr;
}

// What a rung must have for the call's dropout and block mask, as Python exceptions naming what
// it takes; and no dropout during a CUDA graph capture, whose replays would all repeat the
// captured mask (the seed is a launch parameter, read on the host).
void check_features(const RungKernels& kern, int64_t rung, double dropout_p,
                    const std::optional<at::Tensor>& mask, int64_t block_q, int64_t block_k,
                    cudaStream_t stream) {
  TORCH_CHECK_NOT_IMPLEMENTED(dropout_p == 0 || kern.dropout, "ladder: rung ", rung,
                              " has no dropout");
  if (mask) {
    TORCH_CHECK_NOT_IMPLEMENTED(kern.mask_block_q > 0, "ladder: rung ", rung,
                                " has no block masks");
    TORCH_CHECK_VALUE(block_q % kern.mask_block_q == 0 && block_k % kern.mask_block_k == 0,
                      "ladder: rung ", rung, " takes mask blocks that are multiples of ",
                      kern.mask_block_q, " x ", kern.mask_block_k, " (its tiles); got ", block_q,
                      " x ", block_k);
  }
  if (dropout_p > 0) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    TORCH_CHECK(capture == cudaStreamCaptureStatusNone,
                "ladder: dropout while a CUDA graph is being captured: the seed is read on the "
                "host when the kernel is enqueued, so every replay would repeat one dropout mask. "
                "Run dropout outside CUDA graphs (dropout_p = 0 inside them)");
  }
}

// The kernels' lists of a [Bm, Hm, nI, nJ] bool block mask (BlockLists), made on the device with
// torch ops, so that no call waits for the device: per mask row the number of kept blocks, and
// their indices, ascending, first (a stable sort on "dropped" puts them there, in order).
// by_key: the backward's lists, per key block the kept query blocks.
struct DeviceLists {
  at::Tensor count, index;
  BlockLists lists;
};
DeviceLists block_lists(const std::optional<at::Tensor>& mask, int64_t block_q, int64_t block_k,
                        bool by_key) {
  DeviceLists d;
  if (!mask) return d;
  const at::Tensor rows = by_key ? mask->transpose(2, 3) : *mask;
  d.count = rows.sum({-1}, false, at::kInt).contiguous();
  d.index = at::argsort(rows.logical_not().to(at::kByte), /*stable=*/true, /*dim=*/-1)
                .to(at::kInt)
                .contiguous();
  BlockLists& l = d.lists;
  l.count = d.count.data_ptr<int32_t>(), l.index = d.index.data_ptr<int32_t>();
  l.mask_batch = int(mask->size(0)), l.mask_heads = int(mask->size(1));
  l.q_blocks = int(mask->size(2)), l.k_blocks = int(mask->size(3));
  l.block_q = int(block_q), l.block_k = int(block_k);
  return d;
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

std::tuple<at::Tensor, at::Tensor, at::Tensor> fwd_cuda(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, bool causal,
    double scale, int64_t rung, double dropout_p, const std::optional<at::Tensor>& seed,
    const std::optional<at::Tensor>& mask, int64_t mask_block_q, int64_t mask_block_k) {
  const Shape s = check_qkv(q_in, k_in, v_in);
  check_scale(scale);
  const uint64_t dropout_seed = check_dropout(dropout_p, seed);
  check_block_mask(mask, q_in, k_in, mask_block_q, mask_block_k);
  const RungKernels& kern = kernels_for(rung, q_in, false);
  const c10::cuda::CUDAGuard guard(q_in.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  check_features(kern, rung, dropout_p, mask, mask_block_q, mask_block_k, stream);
  const auto f32 = q_in.options().dtype(at::kFloat);
  const bool negate = kern.positive_scale && scale < 0;
  const Operand q = operand(q_in, kern, negate), k = operand(k_in, kern), v = operand(v_in, kern);
  at::Tensor o = new_out(q_in, kern);
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
  const DeviceLists lists = block_lists(mask, mask_block_q, mask_block_k, false);
  FwdArgs a{};
  a.q = q.t.data_ptr(), a.k = k.t.data_ptr(), a.v = v.t.data_ptr(), a.o = o.data_ptr();
  a.q_strides = q.strides, a.k_strides = k.strides, a.v_strides = v.strides;
  const std::optional<Strides> o_strides = strides_of(o, kern);  // new_out's layout: taken
  TORCH_INTERNAL_ASSERT(o_strides.has_value(), "ladder: O's layout");
  a.o_strides = *o_strides;
  a.lse = lse.data_ptr<float>(), a.lse_lo = f32_or_null(lse_lo);
  a.batch = s.batch, a.heads = s.heads, a.heads_kv = s.heads_kv;
  a.seq_q = s.seq_q, a.seq_k = s.seq_k, a.dim = s.dim;
  a.scale = float(negate ? -scale : scale), a.causal = causal;
  a.dropout_p = dropout_p, a.dropout_seed = dropout_seed, a.mask = lists.lists;
  run_rung(rung, "forward", [&] { return kern.forward(a, stream); });
  return {o, lse, lse_lo};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_cuda(
    const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in,
    const at::Tensor& v_in, const at::Tensor& o_in, const at::Tensor& lse_in,
    const at::Tensor& lse_lo_in, bool causal, double scale, int64_t rung, double dropout_p,
    const std::optional<at::Tensor>& seed, const std::optional<at::Tensor>& mask,
    int64_t mask_block_q, int64_t mask_block_k) {
  const Shape s = check_qkv(q_in, k_in, v_in);
  check_scale(scale);
  const uint64_t dropout_seed = check_dropout(dropout_p, seed);
  check_block_mask(mask, q_in, k_in, mask_block_q, mask_block_k);
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
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  check_features(kern, rung, dropout_p, mask, mask_block_q, mask_block_k, stream);
  const auto f32 = q_in.options().dtype(at::kFloat);
  const bool negate = kern.positive_scale && scale < 0;  // the Q the forward used
  const Operand q = operand(q_in, kern, negate), k = operand(k_in, kern), v = operand(v_in, kern);
  const Operand o = operand(o_in, kern), dout = operand(dout_in, kern);
  const at::Tensor lse = dense(lse_in);
  const at::Tensor lse_lo = kern.lse_lo ? dense(lse_lo_in) : lse_lo_in;
  at::Tensor dq = at::empty(q_in.sizes(), q_in.options());
  at::Tensor dk = at::empty(k_in.sizes(), k_in.options());
  at::Tensor dv = at::empty(v_in.sizes(), v_in.options());
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
  at::Tensor dq_acc = at::empty(q_in.sizes(), f32);
  const DeviceLists lists = block_lists(mask, mask_block_q, mask_block_k, true);
  BwdArgs a{};
  a.q = q.t.data_ptr(), a.k = k.t.data_ptr(), a.v = v.t.data_ptr(), a.o = o.t.data_ptr();
  a.dout = dout.t.data_ptr(), a.lse = lse.data_ptr<float>();
  a.q_strides = q.strides, a.k_strides = k.strides, a.v_strides = v.strides;
  a.o_strides = o.strides, a.dout_strides = dout.strides;
  a.lse_lo = kern.lse_lo ? lse_lo.data_ptr<float>() : nullptr;
  a.lse2 = lse2.data_ptr<float>(), a.dsum = dsum.data_ptr<float>();
  a.dq_acc = dq_acc.data_ptr<float>();
  a.dq = dq.data_ptr(), a.dk = dk.data_ptr(), a.dv = dv.data_ptr();
  a.batch = s.batch, a.heads = s.heads, a.heads_kv = s.heads_kv;
  a.seq_q = s.seq_q, a.seq_k = s.seq_k, a.dim = s.dim;
  a.scale = float(negate ? -scale : scale), a.scale_dq = float(scale), a.causal = causal;
  a.dropout_p = dropout_p, a.dropout_seed = dropout_seed, a.mask = lists.lists;
  run_rung(rung, "backward", [&] { return kern.backward(a, stream); });
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
