// Rung 05 (shared-memory FlashAttention-2 in fp32) behind the rung_api.h seam, at every head
// dim of the step's capability table (steps/05_shared_memory_fa2/capabilities.hpp): fills the
// kernels' parameter blocks as steps/05_shared_memory_fa2/host.cu does and enqueues them on
// PyTorch's stream through the rung's launch_forward / launch_backward: the 'fa2' variant, the
// one with dropout and block masks.
#include <cuda_runtime.h>

#include <algorithm>
#include <iterator>
#include <numeric>

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
  s05::FwdParams p{};
  p.q = static_cast<const float*>(a.q), p.k = static_cast<const float*>(a.k);
  p.v = static_cast<const float*>(a.v), p.o = static_cast<float*>(a.o);
  p.lse = a.lse, p.lse_lo = a.lse_lo;
  p.batch = a.batch, p.heads = a.heads, p.heads_kv = a.heads_kv, p.group = a.heads / a.heads_kv;
  p.seq_q = a.seq_q, p.seq_k = a.seq_k, p.Br = kBr<D>;
  p.scale = a.scale;  // signed: this rung multiplies by it as it is
  p.causal = a.causal;
  set_features(p, a.dropout_p, a.dropout_seed, a.mask);
  s05::launch_forward<D>(p, stream);  // the instantiation with the features the params ask for
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
  set_features(p, a.dropout_p, a.dropout_seed, a.mask);
  s05::launch_backward<D>(p, stream);  // D pre-pass, the K/V-tile kernel, dQ = scale dQ_acc
  return cudaGetLastError();
}

static_assert(std::size(s05::kDTypes) == 1 && s05::kDTypes[0] == DType::f32,
              "the adaptor passes float tensors");

// One entry per head dim of the step's table, registered when the library loads. The kernels
// read dense rows; dropout and block masks are built into 'fa2', whose tiles (forward Br x Bc =
// kBr<D> x kBc, backward kBrBwd x kBc) must each lie inside one mask block.
const bool kRegistered = [] {
  s05::HeadDims::for_each([](auto dim) {
    constexpr int D = decltype(dim)::value;
    RungKernels k;
    k.rung = 5, k.dtype = DType::f32, k.dim = D;
    k.lse_lo = true;  // its backward reads LSE's rounding residual
    k.dropout = true;
    k.mask_block_q = std::lcm(kBr<D>, s05::kBrBwd), k.mask_block_k = s05::kBc;
    k.forward = &forward<D>, k.backward = &backward<D>;
    register_kernels(k);
  });
  return true;
}();

}  // namespace
}  // namespace ladder_torch::rung05
