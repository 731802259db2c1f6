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

#include "block_mask.hpp"
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

  // The run's tensors into a kernel's parameter block (the field names the kernels of steps 05
  // to 07 share): Q, K, V, O, LSE for the forward; with dO, dQ, dK, dV for the backward.
  template <class Params>
  void forward_tensors(Params& k) const {
    k.q = q.get(), k.k = this->k.get(), k.v = v.get(), k.o = o.get(), k.lse = lse.get();
  }
  template <class Params>
  void backward_tensors(Params& k) const {
    forward_tensors(k);
    k.dout = dout.get(), k.dq = dq.get(), k.dk = dk.get(), k.dv = dv.get();
  }

  DeviceBuffer<T> q, k, v, o, dout, dq, dk, dv;
  DeviceBuffer<float> lse;
  RunResult result;

 private:
  const Problem& p_;
  const RunOptions& opt_;
};

// Calls f(T()) with T the device type of a 16-bit dtype, __nv_bfloat16 for bf16 and __half for
// fp16: how the tensor-core steps pick their run_typed<T>.
template <class F>
auto with_16bit_type(DType t, F&& f) {
  return t == DType::bf16 ? f(__nv_bfloat16()) : f(__half());
}

// A block mask's CSR lists (common/block_mask.hpp) on the device, built and uploaded once,
// outside the timed region, as FlexAttention builds its BlockMask once. Empty without a mask.
struct DeviceBlockLists {
  DeviceBuffer<int32_t> count, index;
  DeviceBlockLists() = default;
  explicit DeviceBlockLists(const BlockLists& l) : count(l.count.size()), index(l.index.size()) {
    count.upload(l.count);
    index.upload(l.index);
  }
  double bytes() const { return double(count.bytes() + index.bytes()); }
};

// The fields the kernel parameters of steps 05 and 06 share (FwdParams and BwdParams): the
// problem's shape, causal mask and dropout, and a block mask's lists when there is one.
template <class Params>
void set_problem(Params& k, const Problem& p) {
  k.batch = int(p.batch), k.heads = int(p.heads), k.heads_kv = int(p.heads_kv);
  k.group = int(p.group()), k.seq_q = int(p.seq_q), k.seq_k = int(p.seq_k);
  k.causal = p.causal;
  k.dropout_p = p.dropout, k.dropout_seed = p.dropout_seed;
}
template <class Params>
void set_block_mask(Params& k, const DeviceBlockLists& l, const BlockMask& m) {
  k.blk_count = l.count.get(), k.blk_index = l.index.get();
  k.mask_batch = int(m.batch), k.mask_heads = int(m.heads);
  k.mask_q_blocks = int(m.q_blocks), k.mask_k_blocks = int(m.k_blocks);
  k.mask_block_q = int(m.block_q), k.mask_block_k = int(m.block_k);
}

}  // namespace ladder
