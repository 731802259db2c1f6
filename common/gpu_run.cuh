// The one host path of a CUDA step: the inputs uploaded in the step's element type, the
// outputs poisoned, the passes timed, the outputs downloaded. The runner has already checked
// the problem against the step's descriptor, found the device and checked its free memory, so
// a step's host code is only its launch configuration and its kernel calls:
//
//   GpuRun<float> g(p, in, opt);   // Q, K, V (and dO) on the device; O, LSE (dQ, dK, dV) NaN
//   g.forward([&] { my_kernel<<<grid, threads>>>(g.q.get(), ...); CUDA_CHECK_LAUNCH(); });
//   if (p.backward) g.backward([&] { ... });   // reads the forward's g.o and g.lse
//   return g.finish(out);          // downloads; result.fwd_ms, bwd_ms filled in
#pragma once
#include <cstddef>
#include <utility>

#include "cuda_util.cuh"

namespace ladder {

template <class T>  // float, __half or __nv_bfloat16: Q, K, V, O, dO, dQ, dK, dV on the device
class GpuRun {
 public:
  // negate_q: upload -Q instead of Q (exact in every dtype), for kernels that apply a negative
  // --scale as (-Q) K^T |scale| because their running max assumes scale > 0.
  GpuRun(const Problem& p, const Inputs& in, const RunOptions& opt, bool negate_q = false)
      : p_(p), opt_(opt) {
    q = DeviceBuffer<T>(size_t(p.q_numel()));
    k = DeviceBuffer<T>(size_t(p.kv_numel()));
    v = DeviceBuffer<T>(size_t(p.kv_numel()));
    o = DeviceBuffer<T>(size_t(p.q_numel()));
    lse = DeviceBuffer<float>(size_t(p.rows()));
    if (negate_q) {
      Tensor neg = in.q;
      for (double& x : neg.data) x = -x;
      q.upload(to_device<T>(neg));
    } else {
      q.upload(to_device<T>(in.q));
    }
    k.upload(to_device<T>(in.k));
    v.upload(to_device<T>(in.v));
    o.poison();  // NaN: an element the kernel forgets to write fails the check
    lse.poison();
    if (p.backward) {
      dout = DeviceBuffer<T>(size_t(p.q_numel()));
      dout.upload(to_device<T>(in.dout));
      dq = DeviceBuffer<T>(size_t(p.q_numel()));
      dk = DeviceBuffer<T>(size_t(p.kv_numel()));
      dv = DeviceBuffer<T>(size_t(p.kv_numel()));
      dq.poison(), dk.poison(), dv.poison();
    }
  }

  // Times `launches` (which enqueues the forward's kernels on the default stream): warm-up,
  // then the median of the timed repetitions, each after an L2 flush.
  template <class Fn>
  void forward(Fn&& launches) {
    result.fwd_ms = time_gpu_ms(std::forward<Fn>(launches), opt_.repeats, opt_.warmup);
  }
  // The same for the backward, which reads the forward's O and LSE.
  template <class Fn>
  void backward(Fn&& launches) {
    result.bwd_ms = time_gpu_ms(std::forward<Fn>(launches), opt_.repeats, opt_.warmup);
  }

  // Downloads O, LSE (and dQ, dK, dV) into `out`; returns the timings and what the step set
  // in `result` (config, workspace).
  RunResult finish(Outputs& out) {
    to_tensor(o.download(), out.o);
    to_tensor(lse.download(), out.lse);
    if (p_.backward) {
      to_tensor(dq.download(), out.dq);
      to_tensor(dk.download(), out.dk);
      to_tensor(dv.download(), out.dv);
    }
    return result;
  }

  DeviceBuffer<T> q, k, v, o, dout, dq, dk, dv;
  DeviceBuffer<float> lse;
  RunResult result;

 private:
  const Problem& p_;
  const RunOptions& opt_;
};

}  // namespace ladder
