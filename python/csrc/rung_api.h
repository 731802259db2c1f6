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

// Where element (b, h, r, x) of a [B, H, rows, d] tensor sits: at b * batch + h * head + r * row
// + x elements from its pointer, the head dim contiguous. All three 0: the dense row-major
// layout, the only one a rung without RungKernels::takes_strides is given.
struct Strides {
  int64_t batch = 0, head = 0, row = 0;
};

// A block mask as the kernels read it (docs/CONTRACT.md, "Block-sparse masks"; the lists of
// common/block_mask.hpp): mask row r keeps count[r] blocks, ascending, at index[r * entries ...].
// The forward's rows are (mask batch, mask head, query block) and list key blocks (entries =
// k_blocks); the backward's are (mask batch, mask head, key block) and list query blocks
// (entries = q_blocks). count null: no block mask.
struct BlockLists {
  const int32_t* count = nullptr;
  const int32_t* index = nullptr;
  int mask_batch = 1, mask_heads = 1;  // 1: one mask row shared by every batch / query head
  int q_blocks = 0, k_blocks = 0;      // ceil(M / block_q), ceil(N / block_k)
  int block_q = 128, block_k = 128;    // the mask block: block_q queries x block_k keys
};

// One forward call. q, o [B, H, M, d]; k, v [B, Hkv, N, d] with the strides given (all dense for
// a rung without RungKernels::takes_strides); lse, lse_lo dense [B, H, M] fp32.
struct FwdArgs {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  float* lse_lo;  // the LSE's rounding residual, for rungs that keep one (else null)
  Strides q_strides, k_strides, v_strides, o_strides;
  int batch, heads, heads_kv, seq_q, seq_k, dim;
  float scale;  // what the kernel multiplies Q K^T by: |scale| when the rung needs scale > 0
  bool causal;
  // Dropout at rate dropout_p (0: none), Z from Philox4x32-10 keyed by the seed and (b, h, i, j),
  // as docs/CONTRACT.md maps it: the same Z on every rung.
  double dropout_p;
  uint64_t dropout_seed;
  BlockLists mask;  // the forward's lists (per query block, the kept key blocks)
};

// One backward call: the forward's q (negated when it was), k, v, o, lse, lse_lo, and dO in,
// with their strides; dq, dk, dv out (dense); fp32 workspaces lse2, dsum [B, H, M'] and dq_acc
// [B, H, M, d], which the caller allocates and the kernels initialise themselves (M' = M rounded
// up to the rung's bwd_row_pad). Dropout's rate and seed are the forward's.
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
  Strides q_strides, k_strides, v_strides, o_strides, dout_strides;
  int batch, heads, heads_kv, seq_q, seq_k, dim;
  float scale;     // as in FwdArgs
  float scale_dq;  // the caller's signed scale: dQ = scale_dq dS K for the caller's Q
  bool causal;
  double dropout_p;
  uint64_t dropout_seed;
  BlockLists mask;  // the backward's lists (per key block, the kept query blocks)
};

// One compiled instantiation of a rung, and what it takes beyond the dtype and head dim (filled
// by the adaptor from the step's own tables and kernel constants; the Python checks read these).
// Both functions enqueue on `stream` and return the first CUDA error (a refused attribute or
// launch), cudaSuccess otherwise; a rung whose host API reports errors by exception (rung 07)
// may throw std::exception, which the operator turns into a Python error with its message.
struct RungKernels {
  int rung = 0;
  DType dtype = DType::f32;
  int dim = 0;
  bool positive_scale =
      false;            // the kernel needs scale > 0: the caller negates Q for a negative one
  bool lse_lo = false;  // the forward writes lse_lo and the backward reads it
  int bwd_row_pad = 1;  // lse2 and dsum rows: seq_q rounded up to a multiple of this
  // Whether the rung reads (q, k, v, dO) and writes (o) a tensor with these strides in place;
  // null: it reads dense tensors only (the operator copies).
  bool (*takes_strides)(const Strides&) = nullptr;
  bool dropout = false;  // FwdArgs::dropout_p > 0 runs (forward and backward)
  // Block masks whose blocks are multiples of mask_block_q x mask_block_k (the tiles of both
  // passes must each lie inside one mask block); 0: no block masks.
  int mask_block_q = 0, mask_block_k = 0;
  cudaError_t (*forward)(const FwdArgs&, cudaStream_t) = nullptr;
  cudaError_t (*backward)(const BwdArgs&, cudaStream_t) = nullptr;  // null: forward only
};

// The features' fields of the parameter blocks of rungs 05 and 06, which name them alike (and as
// common/gpu_run.cuh's set_problem and set_block_mask fill them in the steps' own hosts).
template <class Params>
void set_features(Params& p, double dropout_p, uint64_t dropout_seed, const BlockLists& m) {
  p.dropout_p = dropout_p, p.dropout_seed = dropout_seed;
  if (m.count == nullptr) return;
  p.blk_count = m.count, p.blk_index = m.index;
  p.mask_batch = m.mask_batch, p.mask_heads = m.mask_heads;
  p.mask_q_blocks = m.q_blocks, p.mask_k_blocks = m.k_blocks;
  p.mask_block_q = m.block_q, p.mask_block_k = m.block_k;
}

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
