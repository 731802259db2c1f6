// The seam between PyTorch and the ladder's CUDA kernels: plain C++ and CUDA runtime types
// only, no torch headers. The adaptors (rung05.cu, rung06_*.cu, rung07.cpp) include this and
// the rung's own host API or kernel headers, so nvcc never parses torch; ops_cuda.cpp includes
// this and torch, so g++ never parses the kernels. Each adaptor registers the (rung, dtype,
// head dim) instantiations it compiled, at load time, in the registry that ops_cuda.cpp owns.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "dtype.hpp"

namespace ladder_torch {

// The ladder's element types (common/dtype.hpp): a rung registers f32, f16 or bf16.
using DType = ladder::DType;

// One forward call. Pointers are to contiguous tensors in the contract's layout:
// q, o [B, H, M, d]; k, v [B, Hkv, N, d]; lse, lse_lo [B, H, M] fp32.
struct FwdArgs {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  float* lse_lo;  // the LSE's rounding residual, for rungs that keep one (else null)
  int batch, heads, heads_kv, seq_q, seq_k, dim;
  float scale;  // what the kernel multiplies Q K^T by: |scale| when the rung needs scale > 0
  bool causal;
};

// One backward call: the forward's q (negated when it was), k, v, o, lse, lse_lo, and dO in;
// dq, dk, dv out; fp32 workspaces lse2, dsum [B, H, M'] and dq_acc [B, H, M, d], which the
// caller allocates and the kernels initialise themselves (M' = M rounded up to the rung's
// bwd_row_pad).
struct BwdArgs {
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const void* dout;
  const float* lse;
  const float* lse_lo;
  float* lse2;
  float* dsum;
  float* dq_acc;
  void* dq;
  void* dk;
  void* dv;
  int batch, heads, heads_kv, seq_q, seq_k, dim;
  float scale;     // as in FwdArgs
  float scale_dq;  // the caller's signed scale: dQ = scale_dq dS K for the caller's Q
  bool causal;
};

// One compiled instantiation of a rung. Both functions enqueue on `stream` and return the
// first CUDA error (a refused attribute or launch), cudaSuccess otherwise; a rung whose host
// API reports errors by exception (rung 07) may throw std::exception, which the operator turns
// into a Python error with its message.
struct RungKernels {
  int rung;
  DType dtype;
  int dim;
  bool positive_scale;  // the kernel needs scale > 0: the caller negates Q for a negative one
  bool lse_lo;          // the forward writes lse_lo and the backward reads it
  int bwd_row_pad;      // lse2 and dsum rows: seq_q rounded up to a multiple of this (1: none)
  cudaError_t (*forward)(const FwdArgs&, cudaStream_t);
  cudaError_t (*backward)(const BwdArgs&, cudaStream_t);  // null: forward only
};

// The registry (ops_cuda.cpp). Adaptors fill it from static initialisers, one Registrar per
// file; find_kernels returns null for an instantiation that was not built.
void register_kernels(const RungKernels& k);
const RungKernels* find_kernels(int rung, DType dtype, int dim);
std::string built_kernels();  // e.g. "rung 6: bf16 d=32 64 96 128; fp16 d=32 64 96 128"

struct Registrar {
  Registrar(std::initializer_list<RungKernels> ks) {
    for (const RungKernels& k : ks) register_kernels(k);
  }
};

// Named event counters an adaptor keeps (e.g. rung 07's plans made and calls), read by
// torch.ops.ladder.cuda_counters() for the profiling script. Registered like the kernels.
void register_counter(const char* name, const std::atomic<int64_t>* value);

struct CounterRegistrar {
  CounterRegistrar(std::initializer_list<std::pair<const char*, const std::atomic<int64_t>*>> cs) {
    for (const auto& [name, value] : cs) register_counter(name, value);
  }
};

// Runs `configure` (cudaFuncSetAttribute calls: a kernel's shared-memory limit and carve-out,
// which are per device) the first time it is asked for on the current device; `done` (one per
// instantiation) remembers the devices where it succeeded, so a launch pays for it once per
// device, not every time. Returns configure's error (and tries again on the next call).
template <class Configure>
cudaError_t once_per_device(std::atomic<unsigned long long>& done, Configure&& configure) {
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  const unsigned long long bit = dev < 64 ? 1ull << dev : 0ull;  // past 64 devices: every time
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  const cudaError_t e = configure();
  if (e == cudaSuccess) done.fetch_or(bit, std::memory_order_release);
  return e;
}

}  // namespace ladder_torch
