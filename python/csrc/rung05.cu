// Rung 05 (shared-memory FlashAttention-2 in fp32) behind the rung_api.h seam, at every head
// dim of the step's capability table (steps/05_shared_memory_fa2/capabilities.hpp): fills the
// kernels' parameter blocks as steps/05_shared_memory_fa2/host.cu does and enqueues them on
// PyTorch's stream through the rung's launch_forward / launch_backward.
#include <cuda_runtime.h>

#include <algorithm>
#include <iterator>

#include "05_shared_memory_fa2/capabilities.hpp"
#include "rung_api.h"
#include "shared_memory_fa2_backward.cuh"

namespace ladder_torch::rung05 {
namespace {

namespace s05 = ladder::step05;

// Br query rows per forward block: what the ladder's tile rule picks on an H100 (host.cu,
// choose_tiles), where shared memory does not bind at these dims: d, capped at kBrCap.
template <int D>
constexpr int kBr = std::min(D, s05::kBrCap);

// The device's opt-in shared memory per block, granted to the kernel `kFn` (once per device).
// The launch asks for what it needs; this only lifts the 48 KiB default ceiling.
template <auto kFn>
cudaError_t allow_opt_in() {
  static std::atomic<unsigned long long> ready{0};
  return once_per_device(ready, [] {
    int dev = 0, bytes = 0;
    if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
    if (cudaError_t e =
            cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        e != cudaSuccess)
      return e;
    return cudaFuncSetAttribute(reinterpret_cast<const void*>(kFn),
                                cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  });
}

template <int D>
cudaError_t forward(const FwdArgs& a, cudaStream_t stream) {
  if (cudaError_t e = allow_opt_in<&s05::forward_kernel<D>>(); e != cudaSuccess) return e;
  s05::FwdParams p{};  // zero: dropout and block masks off
  p.q = static_cast<const float*>(a.q), p.k = static_cast<const float*>(a.k);
  p.v = static_cast<const float*>(a.v), p.o = static_cast<float*>(a.o);
  p.lse = a.lse, p.lse_lo = a.lse_lo;
  p.batch = a.batch, p.heads = a.heads, p.heads_kv = a.heads_kv, p.group = a.heads / a.heads_kv;
  p.seq_q = a.seq_q, p.seq_k = a.seq_k, p.Br = kBr<D>;
  p.scale = a.scale;  // signed: this rung multiplies by it as it is
  p.causal = a.causal;
  s05::launch_forward<D>(p, stream);
  return cudaGetLastError();
}

template <int D>
cudaError_t backward(const BwdArgs& a, cudaStream_t stream) {
  if (cudaError_t e = allow_opt_in<&s05::backward_kernel<D>>(); e != cudaSuccess) return e;
  s05::BwdParams p{};
  p.q = static_cast<const float*>(a.q), p.k = static_cast<const float*>(a.k);
  p.v = static_cast<const float*>(a.v), p.o = static_cast<const float*>(a.o);
  p.dout = static_cast<const float*>(a.dout);
  p.lse = a.lse, p.lse_lo = a.lse_lo, p.dsum = a.dsum, p.dq_acc = a.dq_acc;
  p.dq = static_cast<float*>(a.dq), p.dk = static_cast<float*>(a.dk);
  p.dv = static_cast<float*>(a.dv);
  p.batch = a.batch, p.heads = a.heads, p.heads_kv = a.heads_kv, p.group = a.heads / a.heads_kv;
  p.seq_q = a.seq_q, p.seq_k = a.seq_k;
  p.scale = a.scale, p.causal = a.causal;
  s05::launch_backward<D>(p, stream);  // D pre-pass, the K/V-tile kernel, dQ = scale dQ_acc
  return cudaGetLastError();
}

static_assert(std::size(s05::kDTypes) == 1 && s05::kDTypes[0] == DType::f32,
              "the adaptor passes float tensors");

// One entry per head dim of the step's table, registered when the library loads.
const bool kRegistered = [] {
  s05::HeadDims::for_each([](auto dim) {
    constexpr int D = decltype(dim)::value;
    register_kernels(RungKernels{5, DType::f32, D, false, true, 1, &forward<D>, &backward<D>});
  });
  return true;
}();

}  // namespace
}  // namespace ladder_torch::rung05
