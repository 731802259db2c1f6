// Rung 06 (tensor-core FlashAttention-2, bf16/fp16) behind the rung_api.h seam: fills the
// kernels' parameter blocks the way the ladder's own host code (steps/06_tensor_core_fa2/
// host.cu, run_typed) does and enqueues them on PyTorch's stream. rung06_part0.cu ...
// part3.cu instantiate it for the head dims of the step's capability table
// (steps/06_tensor_core_fa2/capabilities.hpp).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <iterator>
#include <numeric>
#include <utility>

#include "06_tensor_core_fa2/capabilities.hpp"
#include "rung_api.h"
#include "tensor_core_fa2_backward.cuh"

namespace ladder_torch::rung06 {

namespace s06 = ladder::step06;

template <class T, int D>
cudaError_t forward(const FwdArgs& a, cudaStream_t stream) {
  static std::atomic<unsigned long long> ready{0};
  const s06::FwdKernel k = s06::fwd_kernel<T, D, s06::kFwdAll>();
  // The rung's own configure(): the shared-memory limit and the largest carve-out (two blocks
  // of up to 112 KiB per SM) for every instantiation launch() may pick, once per device.
  if (cudaError_t e = once_per_device(ready, k.configure); e != cudaSuccess) return e;
  s06::FwdParams p{};
  p.q = a.q, p.k = a.k, p.v = a.v, p.o = a.o, p.lse = a.lse;
  p.batch = a.batch, p.heads = a.heads, p.heads_kv = a.heads_kv, p.group = a.heads / a.heads_kv;
  p.seq_q = a.seq_q, p.seq_k = a.seq_k;
  p.scale = a.scale;  // > 0: the caller negated Q for a negative scale (positive_scale below)
  p.scale_log2 = float(double(a.scale) * 1.4426950408889634);  // log2(e)
  p.causal = a.causal;
  set_features(p, a.dropout_p, a.dropout_seed, a.mask);
  k.launch(p, stream);  // the instantiation with the features the params ask for
  return cudaGetLastError();
}

template <class T, int D>
cudaError_t backward(const BwdArgs& a, cudaStream_t stream) {
  static std::atomic<unsigned long long> ready{0};
  const s06::BwdKernel k = s06::bwd_kernel<T, D>();
  if (cudaError_t e = once_per_device(ready, k.configure); e != cudaSuccess) return e;
  s06::BwdParams p{};
  p.q = a.q, p.k = a.k, p.v = a.v, p.o = a.o, p.dout = a.dout;
  p.lse = a.lse, p.lse2 = a.lse2, p.dsum = a.dsum, p.dq_acc = a.dq_acc;
  p.dq = a.dq, p.dk = a.dk, p.dv = a.dv;
  p.batch = a.batch, p.heads = a.heads, p.heads_kv = a.heads_kv, p.group = a.heads / a.heads_kv;
  p.seq_q = a.seq_q, p.seq_k = a.seq_k;
  p.scale = a.scale, p.scale_log2 = float(double(a.scale) * 1.4426950408889634);
  p.scale_dq = a.scale_dq;  // signed: Q arrives negated when the caller's scale is negative
  p.causal = a.causal;
  set_features(p, a.dropout_p, a.dropout_seed, a.mask);
  k.prepass(p, stream);  // D, LSE log2(e), dQ_acc = 0
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  k.main(p, stream);  // dK, dV; dQ_acc by atomics
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  k.finish(p, stream);  // dQ = scale dQ_acc
  return cudaGetLastError();
}

// The device type of a dtype of the step's table.
template <DType>
struct Element;
template <>
struct Element<DType::bf16> {
  using type = __nv_bfloat16;
};
template <>
struct Element<DType::f16> {
  using type = __half;
};

// The entry of dtype T at head dim D: the full kernel (the step's default variant), whose tiles
// are compiled per head dim; with its features (dropout, block masks) the mask block must be a
// multiple of the forward's tiles and of the backward's.
template <class T, int D>
RungKernels entry(DType dtype) {
  const s06::FwdKernel f = s06::fwd_kernel<T, D, s06::kFwdAll>();
  const s06::BwdKernel b = s06::bwd_kernel<T, D>();
  RungKernels k;
  k.rung = 6, k.dtype = dtype, k.dim = D;
  k.positive_scale = true;  // the kernels track the row max of the raw scores
  k.dropout = f.features;
  if (f.features) k.mask_block_q = std::lcm(f.br, b.br), k.mask_block_k = std::lcm(f.bc, b.bc);
  k.forward = &forward<T, D>, k.backward = &backward<T, D>;
  return k;
}

// Every dtype of the step at head dim D.
template <int D, size_t... T>
void register_dim(std::index_sequence<T...>) {
  (register_kernels(entry<typename Element<s06::kDTypes[T]>::type, D>(s06::kDTypes[T])), ...);
}

// The head dims the extension holds are the backward's (d = 256, forward only in the rung, is
// left out), split into kParts parts that the build compiles in parallel, one file each
// (rung06_partN.cu): part N registers the dims at indices N, N + kParts, ... of the list.
constexpr size_t kParts = 4;
using Dims = s06::BackwardHeadDims;

template <size_t Part, size_t... I>
void register_dims(std::index_sequence<I...>) {
  (register_dim<Dims::values[Part + I * kParts]>(
       std::make_index_sequence<std::size(s06::kDTypes)>()),
   ...);
}

template <size_t Part>
bool register_part() {
  static_assert(Part < kParts, "rung06_part0.cu ... part3.cu: one file per part");
  constexpr size_t n = Dims::size > Part ? (Dims::size - Part + kParts - 1) / kParts : 0;
  register_dims<Part>(std::make_index_sequence<n>());
  return true;
}

}  // namespace ladder_torch::rung06
