// Step 06 — tensor-core FlashAttention-2 (CUDA, bf16 and fp16 with fp32 accumulation).
// Adds: mma.sync m16n8k16 with fp32 accumulation; ldmatrix (.trans for V); XOR-swizzled shared
// memory; cp.async double buffering of K_j and V_j; P kept in registers as the A operand; exp2
// with log2(e) folded into the scale; O staged through shared memory for 16-byte stores;
// backward with a D = rowsum(dO o O) pre-pass and P recomputed from LSE; K/V-outer backward
// loop with dK_j and dV_j in registers; S^T and dP^T so that P^T and dS^T are A operands in
// registers; dQ accumulated by fp32 atomics.
//
// Where it sits: the top of the ladder. Step 05 has FlashAttention-2's loop order and
// tiling in fp32 on the CUDA cores, whose FFMA ceiling (~51 TFLOP/s measured) it cannot
// pass. This step keeps that algorithm and moves both matrix products onto the tensor
// cores (mma.sync, bf16/fp16 inputs, fp32 accumulation: ~626 TFLOP/s measured), then
// removes, one technique at a time, everything that would keep them waiting.
//
// The algorithm (FlashAttention-2, Dao 2023), for a query tile Q_i of Br rows, in a block:
//   Tr = ceil(M / Br) blocks per head, Tc = ceil(N / Bc) K/V tiles (fewer under causal)
//   m_i = -inf, l_i = 0, O_i = 0
//   for j < Tc:  S_ij = scale Q_i K_j^T                           (tensor cores)
//                m_new = max(m_i, rowmax S_ij),  P_ij = exp(S_ij - m_new)
//                l_i = exp(m_i - m_new) l_i + rowsum P_ij
//                O_i = diag(exp(m_i - m_new)) O_i + P_ij V_j       (tensor cores)
//                m_i = m_new
//   O_i = diag(l_i)^-1 O_i,  LSE_i = m_i + log l_i
// The backward (FlashAttention-2, Algorithm 2), with D_i = rowsum(dO_i o O_i) from a pre-pass:
//   for each K/V tile j (a block; dK_j = dV_j = 0 in registers):
//     for each query head of the GQA group, each Q tile i that sees a key of K_j:
//       P_ij = exp(scale S_ij - LSE_i)    recomputed: only LSE was saved, not P
//       dV_j += P_ij^T dO_i,  dP_ij = dO_i V_j^T,  dS_ij = P_ij o (dP_ij - D_i)
//       dK_j += dS_ij^T Q_i,  dQ_i += dS_ij K_j   (fp32 atomics: every K/V tile adds to it)
//   dK_j *= scale, dQ = scale dQ_acc
// forward.cuh and backward.cuh hold the kernels (fragment layouts in mma.cuh); this file is
// the host side: the variants, the checks, uploads, the timed launches.
// notes/06_tensor_core_fa2.md has the fragment drawings, the shared-memory and register
// budgets and the cost models of both passes.
// What comes next: no rung. On an H100, what mma.sync leaves on the table is taken by
// Hopper-only instructions: wgmma (warpgroup MMA reading B from shared memory, asynchronous)
// and TMA copies with warp specialisation (FlashAttention-3); the note says how much.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "backward.cuh"
#include "cuda_util.cuh"
#include "forward.cuh"
#include "step.hpp"

namespace ladder {
namespace {

using bf16 = __nv_bfloat16;
using fp16 = __half;
using tc::BwdKernel;
using tc::BwdParams;
using tc::FwdKernel;
using tc::FwdParams;

// The variants: the full kernel with techniques switched off, so that each one's worth
// can be measured (notes/06_tensor_core_fa2.md, "What each technique buys").
constexpr int kAll = tc::kFwdAll;
constexpr int kNoSwizzle = kAll & ~tc::kSwizzle;
constexpr int kNoCpAsync = kAll & ~tc::kCpAsync;
constexpr int kNoLdmatrix = kAll & ~tc::kLdmatrix;
constexpr int kPViaSmem = kAll & ~tc::kPInRegisters;
constexpr int kDirectStore = kAll & ~tc::kStagedStore;
constexpr int kBaseline = 0;

struct FwdVariant {
  const char* name;
  int flags;
  const char* summary;
};
const FwdVariant kVariants[] = {
    {"full", kAll, "every technique on"},
    {"no-swizzle", kNoSwizzle,
     "plain row-major shared tiles: ldmatrix hits 8-way bank conflicts (d >= 64)"},
    {"no-cp-async", kNoCpAsync,
     "synchronous loads into one K/V stage: loads no longer overlap the tensor cores"},
    {"no-ldmatrix", kNoLdmatrix,
     "fragments by 32-bit shared loads, V's by 16-bit loads: 4x and 8x the instructions"},
    {"p-via-smem", kPViaSmem, "P written to shared memory and read back as the A operand"},
    {"direct-store", kDirectStore, "O stored straight from the fragments, 4 bytes per lane"},
    {"baseline", kBaseline, "all five techniques off: a first mma.sync kernel"},
};

// Which instantiations exist (compile time, see the note): the full kernel for each dtype
// and head dim, the other variants for bf16 and d = 64, 128 only.
template <class T>
FwdKernel full_kernel(int64_t d) {
  switch (d) {
    case 32:
      return tc::fwd_kernel<T, 32, kAll>();
    case 64:
      return tc::fwd_kernel<T, 64, kAll>();
    case 96:
      return tc::fwd_kernel<T, 96, kAll>();
    case 128:
      return tc::fwd_kernel<T, 128, kAll>();
    case 256:
      return tc::fwd_kernel<T, 256, kAll>();
    default:
      return {};
  }
}

template <int kFlags>
FwdKernel variant_kernel(int64_t d) {
  if (d == 64) return tc::fwd_kernel<bf16, 64, kFlags>();
  if (d == 128) return tc::fwd_kernel<bf16, 128, kFlags>();
  return {};
}

FwdKernel select_kernel(DType t, int64_t d, int flags) {
  if (flags == kAll) return t == DType::bf16 ? full_kernel<bf16>(d) : full_kernel<fp16>(d);
  if (t != DType::bf16) return {};
  switch (flags) {
    case kNoSwizzle:
      return variant_kernel<kNoSwizzle>(d);
    case kNoCpAsync:
      return variant_kernel<kNoCpAsync>(d);
    case kNoLdmatrix:
      return variant_kernel<kNoLdmatrix>(d);
    case kPViaSmem:
      return variant_kernel<kPViaSmem>(d);
    case kDirectStore:
      return variant_kernel<kDirectStore>(d);
    case kBaseline:
      return variant_kernel<kBaseline>(d);
    default:
      return {};
  }
}

// The backward: one instantiation per dtype and d in {32, 64, 96, 128}, used by every
// variant (it reads O and LSE, however the forward produced them).
template <class T>
BwdKernel bwd_kernel_for(int64_t d) {
  switch (d) {
    case 32:
      return tc::bwd_kernel<T, 32>();
    case 64:
      return tc::bwd_kernel<T, 64>();
    case 96:
      return tc::bwd_kernel<T, 96>();
    case 128:
      return tc::bwd_kernel<T, 128>();
    default:
      return {};
  }
}

BwdKernel select_bwd_kernel(DType t, int64_t d) {
  return t == DType::bf16 ? bwd_kernel_for<bf16>(d) : bwd_kernel_for<fp16>(d);
}

template <class T>
std::vector<T> to_device_type(const Tensor& t);
template <>
std::vector<bf16> to_device_type<bf16>(const Tensor& t) {
  return host_bf16(t);  // the values are already bf16: exact
}
template <>
std::vector<fp16> to_device_type<fp16>(const Tensor& t) {
  return host_f16(t);
}

// The problem's tensors on the device, in T (LSE in fp32).
template <class T>
struct DeviceTensors {
  DeviceBuffer<T> q, k, v, o;
  DeviceBuffer<float> lse;
};

template <class T>
DeviceTensors<T> upload(const Problem& p, const Inputs& in) {
  DeviceTensors<T> t{DeviceBuffer<T>(size_t(p.q_numel())), DeviceBuffer<T>(size_t(p.kv_numel())),
                     DeviceBuffer<T>(size_t(p.kv_numel())), DeviceBuffer<T>(size_t(p.q_numel())),
                     DeviceBuffer<float>(size_t(p.rows()))};
  // The kernel tracks the row max of the raw scores Q K^T and applies the scale inside
  // exp2, which needs scale > 0. A negative --scale is applied as (-Q) K^T |scale|:
  // negating a bf16/fp16 value is exact. The backward uses the same (-Q) and |scale|: its dK
  // is then right as it is, and dQ for the real Q is (-1) x (-Q)'s, the signed scale x dS K.
  if (p.softmax_scale() < 0) {
    Tensor neg_q = in.q;
    for (double& x : neg_q.data) x = -x;
    t.q.upload(to_device_type<T>(neg_q));
  } else {
    t.q.upload(to_device_type<T>(in.q));
  }
  t.k.upload(to_device_type<T>(in.k));
  t.v.upload(to_device_type<T>(in.v));
  t.o.poison();  // NaN: an element the kernel forgets to write fails the check
  t.lse.poison();
  return t;
}

// Launches the forward: O and LSE from Q, K, V. Returns the median time in ms.
double forward(const FwdKernel& k, const FwdParams& fp, const RunOptions& opt) {
  CUDA_CHECK(cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem_bytes));
  // Two blocks of up to 112 KiB per SM need the largest shared-memory carve-out of L1.
  CUDA_CHECK(cudaFuncSetAttribute(k.fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  int(cudaSharedmemCarveoutMaxShared)));
  return time_gpu_ms(
      [&] {
        k.launch(fp);
        CUDA_CHECK_LAUNCH();
      },
      opt.repeats, opt.warmup);
}

// The backward: dQ, dK, dV from Q, K, V, dO and the forward's O and LSE (in d). Times its
// three kernels together (pre-pass, main, dQ conversion) and returns the median in ms.
template <class T>
double backward(const Problem& p, const Inputs& in, Outputs& out, const RunOptions& opt,
                const BwdKernel& k, const DeviceTensors<T>& d) {
  DeviceBuffer<T> dout(size_t(p.q_numel()));
  dout.upload(to_device_type<T>(in.dout));
  DeviceBuffer<T> dq(size_t(p.q_numel())), dk(size_t(p.kv_numel())), dv(size_t(p.kv_numel()));
  DeviceBuffer<float> dq_acc(size_t(p.q_numel())), lse2(size_t(p.rows())), dsum(size_t(p.rows()));
  for (DeviceBuffer<T>* b : {&dq, &dk, &dv}) b->poison();  // unwritten elements fail the check
  for (DeviceBuffer<float>* b : {&dq_acc, &lse2, &dsum}) b->poison();  // the pre-pass writes them
  BwdParams bp{};
  bp.q = d.q.get(), bp.k = d.k.get(), bp.v = d.v.get(), bp.o = d.o.get(), bp.dout = dout.get();
  bp.lse = d.lse.get(), bp.lse2 = lse2.get(), bp.dsum = dsum.get(), bp.dq_acc = dq_acc.get();
  bp.dq = dq.get(), bp.dk = dk.get(), bp.dv = dv.get();
  bp.batch = int(p.batch), bp.heads = int(p.heads), bp.heads_kv = int(p.heads_kv);
  bp.group = int(p.group());
  bp.seq_q = int(p.seq_q), bp.seq_k = int(p.seq_k);
  bp.scale = float(std::fabs(p.softmax_scale()));
  bp.scale_log2 = float(std::fabs(p.softmax_scale()) * 1.4426950408889634);  // log2(e)
  bp.scale_dq = float(p.softmax_scale());  // signed: Q was uploaded as -Q when scale < 0
  bp.causal = p.causal;

  CUDA_CHECK(cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem_bytes));
  CUDA_CHECK(cudaFuncSetAttribute(k.fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  int(cudaSharedmemCarveoutMaxShared)));
  const double ms = time_gpu_ms(
      [&] {
        k.prepass(bp);  // D, LSE log2(e), dQ_acc = 0
        CUDA_CHECK_LAUNCH();
        k.main(bp);  // dK, dV; dQ_acc by atomics
        CUDA_CHECK_LAUNCH();
        k.finish(bp);  // dQ = scale dQ_acc
        CUDA_CHECK_LAUNCH();
      },
      opt.repeats, opt.warmup);
  to_tensor(dq.download(), out.dq);
  to_tensor(dk.download(), out.dk);
  to_tensor(dv.download(), out.dv);
  return ms;
}

// The occupancy and resource line of a kernel, e.g.
// "warps=4 threads=128 smem=96 KiB regs=255 local=0 B blocks/SM=2".
std::string resources(const void* fn, int warps, int smem_bytes) {
  cudaFuncAttributes a{};
  CUDA_CHECK(cudaFuncGetAttributes(&a, fn));
  int blocks = 0;
  CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, warps * 32, size_t(smem_bytes)));
  std::ostringstream s;
  s << "warps=" << warps << " threads=" << warps * 32 << " smem=" << smem_bytes / 1024
    << " KiB regs=" << a.numRegs << " local=" << a.localSizeBytes << " B blocks/SM=" << blocks;
  return s.str();
}

// e.g. "Br=128 Bc=64 warps=4 threads=128 smem=96 KiB regs=255 local=0 B blocks/SM=2"
std::string describe(const FwdKernel& k) {
  return "Br=" + std::to_string(k.br) + " Bc=" + std::to_string(k.bc) + " " +
         resources(k.fn, k.warps, k.smem_bytes);
}

// e.g. "bwd: Bc=128 Br=64 warps=8 threads=256 smem=161 KiB regs=255 local=0 B blocks/SM=1"
std::string describe(const BwdKernel& k) {
  return "bwd: Bc=" + std::to_string(k.bc) + " Br=" + std::to_string(k.br) + " " +
         resources(k.fn, k.warps, k.smem_bytes);
}

template <class T>
RunResult run_typed(const Problem& p, const Inputs& in, Outputs& out, const RunOptions& opt,
                    const FwdKernel& k, const BwdKernel& bk) {
  DeviceTensors<T> d = upload<T>(p, in);
  FwdParams fp{};
  fp.q = d.q.get(), fp.k = d.k.get(), fp.v = d.v.get(), fp.o = d.o.get(), fp.lse = d.lse.get();
  fp.batch = int(p.batch), fp.heads = int(p.heads), fp.heads_kv = int(p.heads_kv);
  fp.group = int(p.group());
  fp.seq_q = int(p.seq_q), fp.seq_k = int(p.seq_k);
  fp.scale = float(std::fabs(p.softmax_scale()));
  fp.scale_log2 = float(std::fabs(p.softmax_scale()) * 1.4426950408889634);  // log2(e)
  fp.causal = p.causal;

  RunResult r;
  r.fwd_ms = forward(k, fp, opt);
  r.workspace_bytes = 0;  // O(1) extra memory: the whole of S and P lives on chip
  r.config = describe(k);
  if (p.backward) {  // on the O and LSE the forward above has produced
    r.bwd_ms = backward<T>(p, in, out, opt, bk, d);
    // the fp32 dQ accumulator, and L = LSE log2(e) and D per query row
    r.workspace_bytes += 4.0 * double(p.q_numel()) + 8.0 * double(p.rows());
    r.config += "; " + describe(bk);
  }
  to_tensor(d.o.download(), out.o);
  to_tensor(d.lse.download(), out.lse);
  return r;
}

RunResult run(const Problem& p, const Inputs& in, Outputs& out, const RunOptions& opt) {
  const cudaDeviceProp prop = require_device();
  const FwdVariant* v = &kVariants[0];
  if (!opt.variant.empty()) {
    v = nullptr;
    for (const FwdVariant& x : kVariants)
      if (opt.variant == x.name) v = &x;
    if (!v) throw BadInput("step 06 has no variant '" + opt.variant + "'");
  }
  if (p.dtype != DType::bf16 && p.dtype != DType::f16)
    throw BadInput(std::string("step 06 supports --dtype bf16 and fp16, got ") +
                   dtype_name(p.dtype));
  const FwdKernel k = select_kernel(p.dtype, p.dim, v->flags);
  if (!k.fn) {
    if (v->flags == kAll)
      throw BadInput("step 06 supports --dim 32, 64, 96, 128 and 256, got " +
                     std::to_string(p.dim));
    throw BadInput(std::string("variant '") + v->name +
                   "' is built for bf16 with --dim 64 or 128 only (the default variant 'full' "
                   "covers bf16 and fp16 with --dim 32, 64, 96, 128, 256)");
  }
  BwdKernel bk;
  if (p.backward) {
    bk = select_bwd_kernel(p.dtype, p.dim);
    if (!bk.fn)
      throw BadInput("step 06's backward supports --dim 32, 64, 96 and 128, got " +
                     std::to_string(p.dim) + " (without --backward, --dim 256 runs too)");
  }
  if ((opt.tile_q != 0 && opt.tile_q != k.br) || (opt.tile_k != 0 && opt.tile_k != k.bc))
    throw BadInput("step 06 fixes its tiles at compile time: for --dim " + std::to_string(p.dim) +
                   " Br = " + std::to_string(k.br) +
                   " (--tile-q) and Bc = " + std::to_string(k.bc) + " (--tile-k)");
  if (p.heads > 65535 || p.batch > 65535)
    throw BadInput("step 06 supports --heads and --batch up to 65535 (grid dimensions)");
  if (p.seq_q > (int64_t(1) << 30) || p.seq_k > (int64_t(1) << 30))
    throw BadInput("step 06 supports --seq-q and --seq-k up to 2^30 (32-bit row indices)");
  double bytes = double(dtype_bytes(p.dtype)) * double(2 * p.q_numel() + 2 * p.kv_numel()) +
                 4.0 * double(p.rows()) + 2.0 * double(prop.l2CacheSize);  // + L2 flush
  if (p.backward)  // dO, dQ, dK, dV; the fp32 dQ accumulator, L and D
    bytes += double(dtype_bytes(p.dtype)) * double(2 * p.q_numel() + 2 * p.kv_numel()) +
             4.0 * double(p.q_numel()) + 8.0 * double(p.rows());
  require_free_memory(bytes, "step 06 on this problem");
  return p.dtype == DType::bf16 ? run_typed<bf16>(p, in, out, opt, k, bk)
                                : run_typed<fp16>(p, in, out, opt, k, bk);
}

}  // namespace

const Step& step_06() {
  static const Step s = [] {
    Step s;
    s.number = 6;
    s.name = "06_tensor_core_fa2";
    s.summary =
        "FA2 on tensor cores: mma.sync bf16/fp16 with fp32 accumulation, ldmatrix, swizzled "
        "shared memory, cp.async pipelining, P in registers, exp2; the FA2 backward on them";
    s.adds = {"mma.sync m16n8k16 with fp32 accumulation",
              "ldmatrix (.trans for V)",
              "XOR-swizzled shared memory",
              "cp.async double buffering of K_j and V_j",
              "P kept in registers as the A operand",
              "exp2 with log2(e) folded into the scale",
              "O staged through shared memory for 16-byte stores",
              "backward with a D = rowsum(dO o O) pre-pass and P recomputed from LSE",
              "K/V-outer backward loop with dK_j and dV_j in registers",
              "S^T and dP^T so that P^T and dS^T are A operands in registers",
              "dQ accumulated by fp32 atomics"};
    s.device = Device::cuda;
    s.caps.dtypes = {DType::bf16, DType::f16};
    s.caps.head_dims = {32, 64, 96, 128, 256};
    s.caps.causal = true;
    s.caps.gqa = true;
    s.caps.backward = true;
    s.caps.backward_head_dims = {32, 64, 96, 128};
    s.caps.limits =
        "tiles fixed per head dim (Br x Bc: 128 x 128 for d <= 64, 128 x 64 above); variants "
        "other than 'full' are built for bf16 with d 64 and 128 only; the backward runs d 32, "
        "64, 96 and 128 (Bc = 128 keys x Br = 64 queries, 128 at d = 64) and, by its fp32 atomics, "
        "is not "
        "bitwise reproducible in dQ";
    for (const FwdVariant& v : kVariants) {
      if (v.flags == kAll)
        s.variants.push_back({v.name, v.summary, true});
      else  // the teaching variants are instantiated for bf16, d 64 and 128 only
        s.variants.push_back({v.name, v.summary, true, {DType::bf16}, {64, 128}});
    }
    s.run = run;
    return s;
  }();
  return s;
}

}  // namespace ladder
