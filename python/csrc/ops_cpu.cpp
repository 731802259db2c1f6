// The CPU implementations of ladder::fwd and ladder::bwd: rung 0, the ladder's float64 oracle
// (reference/oracle.cpp), on CPU tensors of float64 or float32 (computed in float64). It is
// what torch.autograd.gradcheck runs against, since no GPU rung computes in float64. Built
// without CUDA, so it also builds and tests on a machine with no GPU.
//
// And the operator's autograd formula, for every device: this library is always built and
// loaded, and a C++ autograd function costs a few microseconds per call where the Python one
// of torch.library.register_autograd costs a hundred or more (its wrapper fills defaults and
// builds a Function on every call), host time that a small model's training step pays a dozen
// times. The backward is once differentiable: a second derivative raises (AttentionBackward).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "block_mask.hpp"
#include "checks.h"
#include "inputs.hpp"
#include "oracle.hpp"
#include "problem.hpp"

namespace {

void check_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
               int64_t rung) {
  TORCH_CHECK_NOT_IMPLEMENTED(rung == 0, "ladder: rung ", rung,
                              " runs on CUDA tensors; on CPU tensors only rung 0 (the float64 "
                              "oracle) runs");
  ladder_torch::check_4d(q, k, v);
  TORCH_CHECK_VALUE(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
                    "ladder: rung 0 needs q, k, v on the CPU; got ", q.device(), ", ", k.device(),
                    ", ", v.device());
  TORCH_CHECK_TYPE((q.scalar_type() == at::kDouble || q.scalar_type() == at::kFloat) &&
                       k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
                   "ladder: rung 0 takes float64 or float32 q, k, v of one dtype; got ",
                   q.scalar_type(), ", ", k.scalar_type(), ", ", v.scalar_type());
  ladder_torch::check_kv_shapes(q, k, v);
  ladder_torch::check_scale(scale);
}

// Dropout and a block mask, as the operator's arguments give them (checked by checks.h).
struct Features {
  double dropout_p = 0;
  uint64_t dropout_seed = 0;
  const std::optional<at::Tensor>* mask = nullptr;
  int64_t block_q = 128, block_k = 128;
};

ladder::Problem problem_of(const at::Tensor& q, const at::Tensor& k, bool causal, double scale,
                           bool backward, const Features& f) {
  ladder::Problem p;
  p.batch = q.size(0), p.heads = q.size(1), p.heads_kv = k.size(1);
  p.seq_q = q.size(2), p.seq_k = k.size(2), p.dim = q.size(3);
  p.causal = causal, p.scale = scale;  // non-zero (checked): 0 would mean 1/sqrt(d) there
  p.dtype = ladder::DType::f64, p.backward = backward;
  p.dropout = f.dropout_p, p.dropout_seed = f.dropout_seed;
  return p;
}

ladder::Tensor to_host(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kDouble).contiguous();
  ladder::Tensor h(std::vector<int64_t>(c.sizes().begin(), c.sizes().end()));
  std::copy_n(c.const_data_ptr<double>(), h.data.size(), h.data.begin());
  return h;
}

at::Tensor from_host(const ladder::Tensor& h, at::ScalarType dtype) {
  at::Tensor t = at::empty(h.shape, at::kDouble);
  std::copy(h.data.begin(), h.data.end(), t.mutable_data_ptr<double>());
  return t.to(dtype);
}

// The oracle's block mask (common/block_mask.hpp) from the operator's bool tensor; empty: none.
ladder::BlockMask block_mask_of(const Features& f) {
  ladder::BlockMask m;
  if (!*f.mask) return m;
  const at::Tensor keep = (*f.mask)->to(at::kByte).contiguous();
  m.batch = keep.size(0), m.heads = keep.size(1);
  m.q_blocks = keep.size(2), m.k_blocks = keep.size(3);
  m.block_q = f.block_q, m.block_k = f.block_k;
  m.keep.assign(keep.const_data_ptr<uint8_t>(), keep.const_data_ptr<uint8_t>() + keep.numel());
  return m;
}

// Runs the oracle; with dout, the backward too (it recomputes the forward: the oracle is one
// call).
ladder::Outputs oracle(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor* dout, bool causal, double scale, const Features& f) {
  const ladder::Problem p = problem_of(q, k, causal, scale, dout != nullptr, f);
  ladder::Inputs in;
  in.q = to_host(q), in.k = to_host(k), in.v = to_host(v);
  if (dout) in.dout = to_host(*dout);
  in.mask = block_mask_of(f);
  ladder::Outputs out;
  out.o = ladder::Tensor({p.batch, p.heads, p.seq_q, p.dim});
  out.lse = ladder::Tensor({p.batch, p.heads, p.seq_q}, -std::numeric_limits<double>::infinity());
  if (dout) {
    out.dq = ladder::Tensor({p.batch, p.heads, p.seq_q, p.dim});
    out.dk = ladder::Tensor({p.batch, p.heads_kv, p.seq_k, p.dim});
    out.dv = ladder::Tensor({p.batch, p.heads_kv, p.seq_k, p.dim});
  }
  // Empty problems keep the zeros and -inf above (the contract's "no visible key").
  if (p.rows() > 0 && p.seq_k > 0) ladder::reference::attention(p, in, out);
  return out;
}

Features features(const at::Tensor& q, const at::Tensor& k, double dropout_p,
                  const std::optional<at::Tensor>& seed, const std::optional<at::Tensor>& mask,
                  int64_t block_q, int64_t block_k) {
  Features f;
  f.dropout_p = dropout_p, f.dropout_seed = ladder_torch::check_dropout(dropout_p, seed);
  ladder_torch::check_block_mask(mask, q, k, block_q, block_k);
  f.mask = &mask, f.block_q = block_q, f.block_k = block_k;
  return f;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fwd_cpu(const at::Tensor& q, const at::Tensor& k,
                                                       const at::Tensor& v, bool causal,
                                                       double scale, int64_t rung, double dropout_p,
                                                       const std::optional<at::Tensor>& seed,
                                                       const std::optional<at::Tensor>& mask,
                                                       int64_t block_q, int64_t block_k) {
  check_cpu(q, k, v, scale, rung);
  const Features f = features(q, k, dropout_p, seed, mask, block_q, block_k);
  const ladder::Outputs out = oracle(q, k, v, nullptr, causal, scale, f);
  // LSE in float64 for float64 inputs (gradcheck's precision), else float32 as on the GPU.
  const at::ScalarType lse_type = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return {from_host(out.o, q.scalar_type()), from_host(out.lse, lse_type),
          at::empty({0}, q.options().dtype(at::kFloat))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_cpu(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor&, const at::Tensor&, const at::Tensor&, bool causal, double scale,
    int64_t rung, double dropout_p, const std::optional<at::Tensor>& seed,
    const std::optional<at::Tensor>& mask, int64_t block_q, int64_t block_k) {
  check_cpu(q, k, v, scale, rung);
  TORCH_CHECK_VALUE(dout.sizes() == q.sizes() && dout.device().is_cpu(),
                    "ladder: dout must be a CPU tensor shaped like q ", q.sizes(), "; got ",
                    dout.sizes());
  const Features f = features(q, k, dropout_p, seed, mask, block_q, block_k);
  const ladder::Outputs out = oracle(q, k, v, &dout, causal, scale, f);
  return {from_host(out.dq, q.scalar_type()), from_host(out.dk, q.scalar_type()),
          from_host(out.dv, q.scalar_type())};
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using Outs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using OptTensor = std::optional<at::Tensor>;

// ladder::fwd and ladder::bwd below the autograd key: the device's kernel (this library's or the
// CUDA library's), found once.
Outs call_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
              double scale, int64_t rung, double dropout_p, const OptTensor& seed,
              const OptTensor& mask, int64_t block_q, int64_t block_k) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("ladder::fwd", "")
          .typed<Outs(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, double,
                      int64_t, double, const OptTensor&, const OptTensor&, int64_t, int64_t)>();
  return op.call(q, k, v, causal, scale, rung, dropout_p, seed, mask, block_q, block_k);
}

Outs call_bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
              const at::Tensor& out, const at::Tensor& lse, const at::Tensor& lse_lo, bool causal,
              double scale, int64_t rung, double dropout_p, const OptTensor& seed,
              const OptTensor& mask, int64_t block_q, int64_t block_k) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("ladder::bwd", "")
          .typed<Outs(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, double,
                      int64_t, double, const OptTensor&, const OptTensor&, int64_t, int64_t)>();
  return op.call(dout, q, k, v, out, lse, lse_lo, causal, scale, rung, dropout_p, seed, mask,
                 block_q, block_k);
}

// An optional tensor from a saved one (saved undefined where it was absent).
OptTensor optional(const at::Tensor& t) {
  return t.defined() ? OptTensor(t) : std::nullopt;
}

// out = attention(q, k, v); its backward is the rung's own (ladder::bwd), from the saved q, k, v,
// out, LSE and lse_lo, and dropout's seed and the block mask, so that it regenerates the
// forward's Z and skips its blocks. LSE and lse_lo carry no gradient: the kernels' backward
// takes dO only, and a loss through LSE would need dS += P o dLSE.
class Attention : public torch::autograd::Function<Attention> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, bool causal, double scale, int64_t rung,
                               double dropout_p, const OptTensor& seed, const OptTensor& mask,
                               int64_t block_q, int64_t block_k) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [out, lse, lse_lo] =
        call_fwd(q, k, v, causal, scale, rung, dropout_p, seed, mask, block_q, block_k);
    ctx->save_for_backward(
        {q, k, v, out, lse, lse_lo, seed.value_or(at::Tensor()), mask.value_or(at::Tensor())});
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["rung"] = rung;
    ctx->saved_data["dropout_p"] = dropout_p;
    ctx->saved_data["block_q"] = block_q;
    ctx->saved_data["block_k"] = block_k;
    ctx->mark_non_differentiable({lse, lse_lo});
    return {out, lse, lse_lo};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    // an output that no loss used arrives undefined: its gradient is zero
    const at::Tensor dout = grads[0].defined() ? grads[0] : at::zeros_like(saved[3]);
    const auto& d = ctx->saved_data;
    // through ladder::bwd's autograd kernel (bwd_autograd): under create_graph=True, dq, dk, dv
    // then carry the node that refuses a second derivative
    auto [dq, dk, dv] = call_bwd(
        dout, saved[0], saved[1], saved[2], saved[3], saved[4], saved[5], d.at("causal").toBool(),
        d.at("scale").toDouble(), d.at("rung").toInt(), d.at("dropout_p").toDouble(),
        optional(saved[6]), optional(saved[7]), d.at("block_q").toInt(), d.at("block_k").toInt());
    return {dq,           dk,           dv,           at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// What a second derivative raises: the rungs' backward kernels have no derivative of their own.
constexpr const char* kNoDoubleBackward =
    "ladder_torch: double backward is not supported: ladder_torch.attention's backward (the "
    "ladder::bwd operator, the rung's own backward kernels) is once differentiable, so a second "
    "derivative (torch.autograd.grad(..., create_graph=True) or .backward(create_graph=True), "
    "then a gradient of those gradients, as torch.autograd.gradgradcheck or a gradient penalty "
    "takes) cannot be computed. For second derivatives use "
    "torch.nn.functional.scaled_dot_product_attention under "
    "torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH)";

// (dq, dk, dv) = ladder::bwd(dout, q, k, v, out, ...), once differentiable: its autograd kernel,
// as torch.autograd.function.once_differentiable makes a Python one. Under create_graph=True the
// gradients it returns carry this node, whose own backward raises kNoDoubleBackward, rather than
// no history (which autograd would read as a second derivative of zero, with only a warning).
// Its tensor arguments are its inputs (dout, q, k, v and out may carry gradients), so that a
// second derivative with respect to any of them reaches it.
class AttentionBackward : public torch::autograd::Function<AttentionBackward> {
 public:
  static variable_list forward(AutogradContext*, const at::Tensor& dout, const at::Tensor& q,
                               const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                               const at::Tensor& lse, const at::Tensor& lse_lo, bool causal,
                               double scale, int64_t rung, double dropout_p, const OptTensor& seed,
                               const OptTensor& mask, int64_t block_q, int64_t block_k) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [dq, dk, dv] = call_bwd(dout, q, k, v, out, lse, lse_lo, causal, scale, rung, dropout_p,
                                 seed, mask, block_q, block_k);
    return {dq, dk, dv};
  }

  static variable_list backward(AutogradContext*, variable_list) {
    TORCH_CHECK(false, kNoDoubleBackward);
  }
};

Outs bwd_autograd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                  const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                  const at::Tensor& lse_lo, bool causal, double scale, int64_t rung,
                  double dropout_p, const OptTensor& seed, const OptTensor& mask, int64_t block_q,
                  int64_t block_k) {
  const variable_list r = AttentionBackward::apply(dout, q, k, v, out, lse, lse_lo, causal, scale,
                                                   rung, dropout_p, seed, mask, block_q, block_k);
  return {r[0], r[1], r[2]};
}

Outs fwd_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                  double scale, int64_t rung, double dropout_p, const OptTensor& seed,
                  const OptTensor& mask, int64_t block_q, int64_t block_k) {
  const variable_list r =
      Attention::apply(q, k, v, causal, scale, rung, dropout_p, seed, mask, block_q, block_k);
  return {r[0], r[1], r[2]};
}

// What check_cpu accepts, in the format of the CUDA library's registry ("rung dtype dim
// backward lse_lo strides dropout mask_block_q mask_block_k"; dim 0: any), so that ladder_torch
// reads both the same way: the oracle copies every input into its own float64 tensors (no
// strides), and takes dropout and block masks of any block.
std::string capabilities() {
  return "0 float64 0 1 0 0 1 1 1\n0 float32 0 1 0 0 1 1 1\n";
}

}  // namespace

TORCH_LIBRARY_IMPL(ladder, CPU, m) {
  m.impl("fwd", &fwd_cpu);
  m.impl("bwd", &bwd_cpu);
}

TORCH_LIBRARY_IMPL(ladder, Autograd, m) {
  m.impl("fwd", &fwd_autograd);
  m.impl("bwd", &bwd_autograd);
}

TORCH_LIBRARY_FRAGMENT(ladder, m) {
  m.def("cpu_capabilities() -> str", &capabilities);
}
