// The CPU implementations of ladder::fwd and ladder::bwd: rung 0, the ladder's float64 oracle
// (reference/oracle.cpp), on CPU tensors of float64 or float32 (computed in float64). It is
// what torch.autograd.gradcheck runs against, since no GPU rung computes in float64. Built
// without CUDA, so it also builds and tests on a machine with no GPU.
//
// And the operator's autograd formula, for every device: this library is always built and
// loaded, and a C++ autograd function costs a few microseconds per call where the Python one
// of torch.library.register_autograd costs a hundred or more (its wrapper fills defaults and
// builds a Function on every call), host time that a small model's training step pays a dozen
// times.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

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
                    "ladder: rung 0 needs q, k, v on the CPU");
  TORCH_CHECK_TYPE((q.scalar_type() == at::kDouble || q.scalar_type() == at::kFloat) &&
                       k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
                   "ladder: rung 0 takes float64 or float32 q, k, v of one dtype; got ",
                   q.scalar_type(), ", ", k.scalar_type(), ", ", v.scalar_type());
  ladder_torch::check_kv_shapes(q, k, v);
  ladder_torch::check_scale(scale);
}

ladder::Problem problem_of(const at::Tensor& q, const at::Tensor& k, bool causal, double scale,
                           bool backward) {
  ladder::Problem p;
  p.batch = q.size(0), p.heads = q.size(1), p.heads_kv = k.size(1);
  p.seq_q = q.size(2), p.seq_k = k.size(2), p.dim = q.size(3);
  p.causal = causal, p.scale = scale;  // non-zero (checked): 0 would mean 1/sqrt(d) there
  p.dtype = ladder::DType::f64, p.backward = backward;
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

// Runs the oracle; with dout, the backward too (it recomputes the forward: the oracle is one
// call).
ladder::Outputs oracle(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor* dout, bool causal, double scale) {
  const ladder::Problem p = problem_of(q, k, causal, scale, dout != nullptr);
  ladder::Inputs in;
  in.q = to_host(q), in.k = to_host(k), in.v = to_host(v);
  if (dout) in.dout = to_host(*dout);
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

std::tuple<at::Tensor, at::Tensor, at::Tensor> fwd_cpu(const at::Tensor& q, const at::Tensor& k,
                                                       const at::Tensor& v, bool causal,
                                                       double scale, int64_t rung) {
  check_cpu(q, k, v, scale, rung);
  const ladder::Outputs out = oracle(q, k, v, nullptr, causal, scale);
  // LSE in float64 for float64 inputs (gradcheck's precision), else float32 as on the GPU.
  const at::ScalarType lse_type = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return {from_host(out.o, q.scalar_type()), from_host(out.lse, lse_type),
          at::empty({0}, q.options().dtype(at::kFloat))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_cpu(const at::Tensor& dout, const at::Tensor& q,
                                                       const at::Tensor& k, const at::Tensor& v,
                                                       const at::Tensor&, const at::Tensor&,
                                                       const at::Tensor&, bool causal, double scale,
                                                       int64_t rung) {
  check_cpu(q, k, v, scale, rung);
  TORCH_CHECK_VALUE(dout.sizes() == q.sizes() && dout.device().is_cpu(),
                    "ladder: dout must be a CPU tensor shaped like q ", q.sizes(), "; got ",
                    dout.sizes());
  const ladder::Outputs out = oracle(q, k, v, &dout, causal, scale);
  return {from_host(out.dq, q.scalar_type()), from_host(out.dk, q.scalar_type()),
          from_host(out.dv, q.scalar_type())};
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using Outs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// ladder::fwd and ladder::bwd below the autograd key: the device's kernel (this library's or the
// CUDA library's), found once.
Outs call_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
              double scale, int64_t rung) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ladder::fwd", "")
                             .typed<Outs(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         bool, double, int64_t)>();
  return op.call(q, k, v, causal, scale, rung);
}

Outs call_bwd(const at::Tensor& dout, const variable_list& saved, bool causal, double scale,
              int64_t rung) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ladder::bwd", "")
                             .typed<Outs(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, bool, double, int64_t)>();
  return op.call(dout, saved[0], saved[1], saved[2], saved[3], saved[4], saved[5], causal, scale,
                 rung);
}

// out = attention(q, k, v); its backward is the rung's own (ladder::bwd), from the saved q, k, v,
// out, LSE and lse_lo. LSE and lse_lo carry no gradient: the kernels' backward takes dO only,
// and a loss through LSE would need dS += P o dLSE.
class Attention : public torch::autograd::Function<Attention> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, bool causal, double scale, int64_t rung) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [out, lse, lse_lo] = call_fwd(q, k, v, causal, scale, rung);
    ctx->save_for_backward({q, k, v, out, lse, lse_lo});
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["rung"] = rung;
    ctx->mark_non_differentiable({lse, lse_lo});
    return {out, lse, lse_lo};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    // an output that no loss used arrives undefined: its gradient is zero
    const at::Tensor dout = grads[0].defined() ? grads[0] : at::zeros_like(saved[3]);
    auto [dq, dk, dv] =
        call_bwd(dout, saved, ctx->saved_data["causal"].toBool(),
                 ctx->saved_data["scale"].toDouble(), ctx->saved_data["rung"].toInt());
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

Outs fwd_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                  double scale, int64_t rung) {
  const variable_list r = Attention::apply(q, k, v, causal, scale, rung);
  return {r[0], r[1], r[2]};
}

// What check_cpu accepts, in the format of the CUDA library's registry ("rung dtype dim
// backward lse_lo", dim 0: any), so that ladder_torch reads both the same way.
std::string capabilities() {
  return "0 float64 0 1 0\n0 float32 0 1 0\n";
}

}  // namespace

TORCH_LIBRARY_IMPL(ladder, CPU, m) {
  m.impl("fwd", &fwd_cpu);
  m.impl("bwd", &bwd_cpu);
}

TORCH_LIBRARY_IMPL(ladder, Autograd, m) {
  m.impl("fwd", &fwd_autograd);
}

TORCH_LIBRARY_FRAGMENT(ladder, m) {
  m.def("cpu_capabilities() -> str", &capabilities);
}
