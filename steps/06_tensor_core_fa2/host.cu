// Step 06's host side: the descriptor (what it supports), the variants (which kernel
// instantiation each one runs) and the launches. The algorithm is tensor_core_fa2.cuh
// (forward) and tensor_core_fa2_backward.cuh (backward).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "error.hpp"
#include "gpu_run.cuh"
#include "steps.hpp"
#include "tensor_core_fa2_backward.cuh"

namespace ladder {
namespace {

using bf16 = __nv_bfloat16;
using fp16 = __half;
using step06::BwdKernel;
using step06::BwdParams;
using step06::FwdKernel;
using step06::FwdParams;

// The variants: the full kernel with techniques switched off, so that each one's worth
// can be measured (notes/06_tensor_core_fa2.md, "What each technique buys").
constexpr int kAll = step06::kFwdAll;
constexpr int kNoSwizzle = kAll & ~step06::kSwizzle;
constexpr int kNoCpAsync = kAll & ~step06::kCpAsync;
constexpr int kNoLdmatrix = kAll & ~step06::kLdmatrix;
constexpr int kPViaSmem = kAll & ~step06::kPInRegisters;
constexpr int kDirectStore = kAll & ~step06::kStagedStore;
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
      return step06::fwd_kernel<T, 32, kAll>();
    case 64:
      return step06::fwd_kernel<T, 64, kAll>();
    case 96:
      return step06::fwd_kernel<T, 96, kAll>();
    case 128:
      return step06::fwd_kernel<T, 128, kAll>();
    case 256:
      return step06::fwd_kernel<T, 256, kAll>();
    default:
      return {};
  }
}

template <int kFlags>
FwdKernel variant_kernel(int64_t d) {
  if (d == 64) return step06::fwd_kernel<bf16, 64, kFlags>();
  if (d == 128) return step06::fwd_kernel<bf16, 128, kFlags>();
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
      return step06::bwd_kernel<T, 32>();
    case 64:
      return step06::bwd_kernel<T, 64>();
    case 96:
      return step06::bwd_kernel<T, 96>();
    case 128:
      return step06::bwd_kernel<T, 128>();
    default:
      return {};
  }
}

BwdKernel select_bwd_kernel(DType t, int64_t d) {
  return t == DType::bf16 ? bwd_kernel_for<bf16>(d) : bwd_kernel_for<fp16>(d);
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

// The descriptor's tiles(): fixed per head dim at compile time (FwdTiles); --tile-q and
// --tile-k may only name them.
Tiles fixed_tiles(const Problem& p, const RunOptions& opt, const DeviceInfo&) {
  const FwdKernel k = select_kernel(p.dtype, p.dim, kAll);
  if ((opt.tile_q != 0 && opt.tile_q != k.br) || (opt.tile_k != 0 && opt.tile_k != k.bc))
    throw BadInput("step 06 fixes its tiles at compile time: for --dim " + std::to_string(p.dim) +
                   " Br = " + std::to_string(k.br) +
                   " (--tile-q) and Bc = " + std::to_string(k.bc) + " (--tile-k)");
  return Tiles{k.br, k.bc};
}

// Device memory beyond inputs and outputs: the backward's fp32 dQ accumulator, and L = LSE
// log2(e) and D per query row.
double workspace_bytes(const Problem& p, const RunOptions&) {
  return p.backward ? 4.0 * double(p.q_numel()) + 8.0 * double(p.rows()) : 0.0;
}

const FwdVariant& variant_named(const std::string& name) {
  for (const FwdVariant& v : kVariants)
    if (name == v.name) return v;
  return kVariants[0];  // the runner resolved the name against the descriptor
}

template <class T>
RunResult run_typed(const Problem& p, const Inputs& in, Outputs& out, const RunOptions& opt) {
  const FwdKernel k = select_kernel(p.dtype, p.dim, variant_named(opt.variant).flags);
  // The kernel tracks the row max of the raw scores Q K^T and applies the scale inside exp2,
  // which needs scale > 0. A negative --scale is applied as (-Q) K^T |scale|: negating a
  // bf16/fp16 value is exact. The backward uses the same (-Q) and |scale|: its dK is then right
  // as it is, and dQ for the real Q is (-1) x (-Q)'s, the signed scale x dS K.
  GpuRun<T> g(p, in, opt, p.softmax_scale() < 0);
  FwdParams fp{};
  fp.q = g.q.get(), fp.k = g.k.get(), fp.v = g.v.get(), fp.o = g.o.get(), fp.lse = g.lse.get();
  fp.batch = int(p.batch), fp.heads = int(p.heads), fp.heads_kv = int(p.heads_kv);
  fp.group = int(p.group());
  fp.seq_q = int(p.seq_q), fp.seq_k = int(p.seq_k);
  fp.scale = float(std::fabs(p.softmax_scale()));
  fp.scale_log2 = float(std::fabs(p.softmax_scale()) * 1.4426950408889634);  // log2(e)
  fp.causal = p.causal;

  CUDA_CHECK(cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem_bytes));
  // Two blocks of up to 112 KiB per SM need the largest shared-memory carve-out of L1.
  CUDA_CHECK(cudaFuncSetAttribute(k.fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  int(cudaSharedmemCarveoutMaxShared)));
  g.forward([&] {
    k.launch(fp);
    CUDA_CHECK_LAUNCH();
  });
  g.result.workspace_bytes = 0;  // O(1) extra memory: the whole of S and P lives on chip
  g.result.config = describe(k);

  if (p.backward) {  // on the O and LSE the forward above has produced
    const BwdKernel bk = select_bwd_kernel(p.dtype, p.dim);
    DeviceBuffer<float> dq_acc(size_t(p.q_numel())), lse2(size_t(p.rows())), dsum(size_t(p.rows()));
    for (DeviceBuffer<float>* b : {&dq_acc, &lse2, &dsum}) b->poison();  // the pre-pass writes them
    BwdParams bp{};
    bp.q = g.q.get(), bp.k = g.k.get(), bp.v = g.v.get(), bp.o = g.o.get(), bp.dout = g.dout.get();
    bp.lse = g.lse.get(), bp.lse2 = lse2.get(), bp.dsum = dsum.get(), bp.dq_acc = dq_acc.get();
    bp.dq = g.dq.get(), bp.dk = g.dk.get(), bp.dv = g.dv.get();
    bp.batch = int(p.batch), bp.heads = int(p.heads), bp.heads_kv = int(p.heads_kv);
    bp.group = int(p.group());
    bp.seq_q = int(p.seq_q), bp.seq_k = int(p.seq_k);
    bp.scale = fp.scale, bp.scale_log2 = fp.scale_log2;
    bp.scale_dq = float(p.softmax_scale());  // signed: Q was uploaded as -Q when scale < 0
    bp.causal = p.causal;
    CUDA_CHECK(
        cudaFuncSetAttribute(bk.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bk.smem_bytes));
    CUDA_CHECK(cudaFuncSetAttribute(bk.fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    int(cudaSharedmemCarveoutMaxShared)));
    g.backward([&] {
      bk.prepass(bp);  // D, LSE log2(e), dQ_acc = 0
      CUDA_CHECK_LAUNCH();
      bk.main(bp);  // dK, dV; dQ_acc by atomics
      CUDA_CHECK_LAUNCH();
      bk.finish(bp);  // dQ = scale dQ_acc
      CUDA_CHECK_LAUNCH();
    });
    g.result.workspace_bytes = workspace_bytes(p, opt);
    g.result.config += "; " + describe(bk);
  }
  return g.finish(out);
}

RunResult run(const Problem& p, const Inputs& in, Outputs& out, const RunOptions& opt) {
  return p.dtype == DType::bf16 ? run_typed<bf16>(p, in, out, opt)
                                : run_typed<fp16>(p, in, out, opt);
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
    s.caps.causal = true, s.caps.gqa = true, s.caps.backward = true;
    s.caps.backward_head_dims = {32, 64, 96, 128};
    s.caps.max_batch = s.caps.max_heads = 65535;  // grid.z and grid.y
    s.caps.max_seq = int64_t(1) << 30;            // 32-bit row indices
    s.caps.limits =
        "tiles fixed per head dim (Br x Bc: 128 x 128 for d <= 64, 128 x 64 above); variants "
        "other than 'full' are built for bf16 with d 64 and 128 only; the backward runs d 32, "
        "64, 96 and 128 (Bc = 128 keys x Br = 64 queries, 128 at d = 64) and, by its fp32 "
        "atomics, is not bitwise reproducible in dQ";
    for (const FwdVariant& v : kVariants) {
      if (v.flags == kAll)
        s.variants.push_back({v.name, v.summary, true});
      else  // the teaching variants are instantiated for bf16, d 64 and 128 only
        s.variants.push_back({v.name, v.summary, true, {DType::bf16}, {64, 128}});
    }
    s.tiles = fixed_tiles;
    s.workspace = workspace_bytes;
    s.run = run;
    return s;
  }();
  return s;
}

}  // namespace ladder
