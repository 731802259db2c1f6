// Step 06's host side: the descriptor (what it supports; the head dims and dtypes are in
// capabilities.hpp), the variants (which kernel instantiation each one runs) and the launches.
// The algorithm is tensor_core_fa2.cuh (forward) and tensor_core_fa2_backward.cuh (backward).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <sstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "capabilities.hpp"
#include "error.hpp"
#include "fault.hpp"
#include "gpu_run.cuh"
#include "steps.hpp"
#include "tensor_core_fa2_backward.cuh"

namespace ladder {
namespace {

using bf16 = __nv_bfloat16;
using fp16 = __half;
using namespace step06;

// The variants, all instances of one kernel template whose flags switch its techniques on
// (notes/06_tensor_core_fa2.md, "What each technique buys"). The default is the full kernel.
// Then the learner's path up to it, baseline first, each row the previous one plus one
// technique ("+" reads "the previous row plus"); its last step, + O staged through shared
// memory, is 'full' itself. Then the ablations: the full kernel with one technique off, what
// each is worth once all the others are in. Full without the staged stores is '+p-registers'
// again, so 'direct-store' names that same kernel. exp2 with the folded scale, and the quad
// shuffles, are in every variant: they are not flags.
constexpr int kAll = step06::kFwdAll;
constexpr int kBaseline = 0;
constexpr int kPlusLdmatrix = kBaseline | step06::kLdmatrix;
constexpr int kPlusSwizzle = kPlusLdmatrix | step06::kSwizzle;
constexpr int kPlusCpAsync = kPlusSwizzle | step06::kCpAsync;
constexpr int kPlusPRegisters = kPlusCpAsync | step06::kPInRegisters;
constexpr int kNoSwizzle = kAll & ~step06::kSwizzle;
constexpr int kNoCpAsync = kAll & ~step06::kCpAsync;
constexpr int kNoLdmatrix = kAll & ~step06::kLdmatrix;
constexpr int kPViaSmem = kAll & ~step06::kPInRegisters;
constexpr int kDirectStore = kAll & ~step06::kStagedStore;
static_assert((kPlusPRegisters | step06::kStagedStore) == kAll && kDirectStore == kPlusPRegisters,
              "the path ends at the full kernel; direct-store is its last row but one");

struct FwdVariant {
  const char* name;
  int flags;
  const char* summary;
};
constexpr FwdVariant kVariants[] = {
    {"full", kAll,
     "every technique on: '+p-registers' plus O staged through shared memory for 16-byte "
     "stores"},
    // the path, one technique at a time
    {"baseline", kBaseline,
     "a first mma.sync kernel: fragments by 32- and 16-bit shared loads, plain row-major tiles, "
     "synchronous loads into one K/V stage, P through shared memory, 4-byte O stores"},
    {"+ldmatrix", kPlusLdmatrix,
     "+ ldmatrix.x4 (.trans for V): one instruction per fragment instead of 4 (8 for V); the "
     "row-major tiles still put each ldmatrix phase in 8 wavefronts (d >= 64)"},
    {"+swizzle", kPlusSwizzle,
     "+ XOR-swizzled shared tiles (Q, K, V and P): every ldmatrix phase in one wavefront"},
    {"+cp-async", kPlusCpAsync,
     "+ cp.async into two K/V stages: tile j + 1 loads while tile j computes"},
    {"+p-registers", kPlusPRegisters,
     "+ P kept in the S registers as the A operand of P V: no round trip through shared memory"},
    // the ablations
    {"no-swizzle", kNoSwizzle,
     "full without the swizzle: plain row-major shared tiles, ldmatrix hits 8-way bank "
     "conflicts (d >= 64)"},
    {"no-cp-async", kNoCpAsync,
     "full without cp.async: synchronous loads into one K/V stage, which no longer overlap the "
     "tensor cores"},
    {"no-ldmatrix", kNoLdmatrix,
     "full without ldmatrix: fragments by 32-bit shared loads, V's by 16-bit loads: 4x and 8x "
     "the instructions"},
    {"p-via-smem", kPViaSmem,
     "full with P written to shared memory and read back as the A operand"},
    {"direct-store", kDirectStore,
     "full with O stored straight from the fragments, 4 bytes per lane: the same kernel as "
     "'+p-registers'"},
};

// Which instantiations exist (compile time, see the note and capabilities.hpp): the full
// kernel for each dtype and head dim, the other variants for bf16 at TeachingHeadDims only.
template <class T>
FwdKernel full_kernel(int64_t d) {
  FwdKernel k{};
  HeadDims::dispatch(d, [&](auto dim) { k = fwd_kernel<T, decltype(dim)::value, kAll>(); });
  return k;
}

static_assert(kTeachingDType == DType::bf16, "variant_kernel instantiates bf16");
template <int kFlags>
FwdKernel variant_kernel(int64_t d) {
  FwdKernel k{};
  TeachingHeadDims::dispatch(
      d, [&](auto dim) { k = fwd_kernel<bf16, decltype(dim)::value, kFlags>(); });
  return k;
}

// The teaching variants' instantiation for `flags`: one per row of kVariants.
template <size_t... I>
FwdKernel teaching_kernel(int flags, int64_t d, std::index_sequence<I...>) {
  FwdKernel k{};
  ((flags == kVariants[I].flags && (k = variant_kernel<kVariants[I].flags>(d), true)) || ...);
  return k;
}

FwdKernel select_kernel(DType t, int64_t d, int flags) {
  if (flags == kAll) return t == DType::bf16 ? full_kernel<bf16>(d) : full_kernel<fp16>(d);
  if (t != kTeachingDType) return {};
  return teaching_kernel(flags, d, std::make_index_sequence<std::size(kVariants)>());
}

// The backward: one instantiation per dtype and d of BackwardHeadDims, used by every variant
// (it reads O and LSE, however the forward produced them).
template <class T>
BwdKernel bwd_kernel_for(int64_t d) {
  BwdKernel k{};
  BackwardHeadDims::dispatch(d, [&](auto dim) { k = bwd_kernel<T, decltype(dim)::value>(); });
  return k;
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

// e.g. "Br=128 Bc=64 warps=4 threads=128 smem=96 KiB regs=255 local=0 B blocks/SM=2", for the
// instantiation that runs p (dropout and block-sparse ones have their own registers).
std::string describe(const FwdKernel& k, const FwdParams& p) {
  return "Br=" + std::to_string(k.br) + " Bc=" + std::to_string(k.bc) + " " +
         resources(k.fn_for(p), k.warps, k.smem_bytes);
}

// e.g. "bwd: Bc=128 Br=64 warps=8 threads=256 smem=161 KiB regs=255 local=0 B blocks/SM=1"
std::string describe(const BwdKernel& k, const BwdParams& p) {
  return "bwd: Bc=" + std::to_string(k.bc) + " Br=" + std::to_string(k.br) + " " +
         resources(k.fn_for(p), k.warps, k.smem_bytes);
}

const FwdVariant& variant_named(const std::string& name) {
  for (const FwdVariant& v : kVariants)
    if (name == v.name) return v;
  return kVariants[0];  // the runner resolved the name against the descriptor
}

// The variants as the descriptor lists them: kVariants' rows; the teaching ones (all but the
// full kernel) in bf16 at TeachingHeadDims, without dropout and block masks, which are template
// flags of the full kernel only: instantiating them for every teaching variant too would
// triple their instantiations and the compile time, and what a variant measures is a
// technique, the same with or without the features. (Their backward is the shared one.)
std::vector<Variant> variants() {
  std::vector<Variant> vs;
  for (const FwdVariant& v : kVariants) {
    Variant x{v.name, v.summary};
    if (v.flags != kAll) {
      x.dtypes = {kTeachingDType}, x.head_dims = TeachingHeadDims::list();
      x.dropout = x.block_sparse = false;
    }
    vs.push_back(x);
  }
  return vs;
}

// The descriptor's tiles(): fixed per head dim at compile time (FwdTiles); --tile-q and
// --tile-k may only name them. Also where the backward's tiles (Bc = 128 keys, Br = 64 or 128
// queries) are checked against the mask block (exit 2): the runner checks only the forward's.
Tiles fixed_tiles(const Problem& p, const RunOptions& opt, const DeviceInfo&) {
  const FwdKernel k = select_kernel(p.dtype, p.dim, kAll);
  if ((opt.tile_q != 0 && opt.tile_q != k.br) || (opt.tile_k != 0 && opt.tile_k != k.bc))
    throw BadInput("step 06 fixes its tiles at compile time: for --dim " + std::to_string(p.dim) +
                   " Br = " + std::to_string(k.br) +
                   " (--tile-q) and Bc = " + std::to_string(k.bc) + " (--tile-k)");
  if (p.backward && p.sparsity.active()) {
    const BwdKernel bk = select_bwd_kernel(p.dtype, p.dim);
    if (bk.fn && (p.sparsity.block_q % bk.br != 0 || p.sparsity.block_k % bk.bc != 0))
      throw BadInput("step 06's backward runs Br x Bc = " + std::to_string(bk.br) + "x" +
                     std::to_string(bk.bc) + " tiles (queries x keys) at --dim " +
                     std::to_string(p.dim) + ", which must divide the mask block (--mask-block " +
                     std::to_string(p.sparsity.block_q) + "x" + std::to_string(p.sparsity.block_k) +
                     "): use a mask block that is a multiple of them");
  }
  return Tiles{k.br, k.bc};
}

// Device memory beyond inputs and outputs: the backward's fp32 dQ accumulator, and L = LSE
// log2(e) and D per query row; the block lists of a block-sparse run.
double workspace_bytes(const Problem& p, const RunOptions&) {
  return (p.backward ? 4.0 * double(p.q_numel()) + 8.0 * double(p.rows()) : 0.0) +
         block_list_bytes(p);
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
  g.forward_tensors(fp);
  set_problem(fp, p);
  fp.scale = float(std::fabs(p.softmax_scale()));
  fp.scale_log2 = float(std::fabs(p.softmax_scale()) * 1.4426950408889634);  // log2(e)
  if (kFault && p.dtype == DType::bf16) fp.scale_log2 *= 1.005f;  // the fault build's defect
  // Block-sparse: the lists of kept key blocks (and, for the backward, of kept query blocks).
  const BlockMask& m = in.mask;
  DeviceBlockLists kv_lists, q_lists;
  if (!m.empty()) {
    kv_lists = DeviceBlockLists(kv_block_lists(m));
    set_block_mask(fp, kv_lists, m);
  }

  CUDA_CHECK(k.configure());  // shared-memory limits of every instantiation launch() may run
  g.forward([&] {
    k.launch(fp, 0);
    CUDA_CHECK_LAUNCH();
  });
  // O(1) extra memory (the whole of S and P lives on chip), and a mask's block lists.
  g.result.workspace_bytes = kv_lists.bytes();
  g.result.config = describe(k, fp);

  if (p.backward) {  // on the O and LSE the forward above has produced
    const BwdKernel bk = select_bwd_kernel(p.dtype, p.dim);
    DeviceBuffer<float> dq_acc(size_t(p.q_numel())), lse2(size_t(p.rows())), dsum(size_t(p.rows()));
    for (DeviceBuffer<float>* b : {&dq_acc, &lse2, &dsum}) b->poison();  // the pre-pass writes them
    BwdParams bp{};
    g.backward_tensors(bp);
    bp.lse2 = lse2.get(), bp.dsum = dsum.get(), bp.dq_acc = dq_acc.get();
    set_problem(bp, p);
    bp.scale = fp.scale, bp.scale_log2 = fp.scale_log2;
    bp.scale_dq = float(p.softmax_scale());  // signed: Q was uploaded as -Q when scale < 0
    if (!m.empty()) {
      q_lists = DeviceBlockLists(q_block_lists(m));
      set_block_mask(bp, q_lists, m);
    }
    CUDA_CHECK(bk.configure());
    g.backward([&] {
      bk.prepass(bp, 0);  // D, LSE log2(e), dQ_acc = 0
      CUDA_CHECK_LAUNCH();
      bk.main(bp, 0);  // dK, dV; dQ_acc by atomics
      CUDA_CHECK_LAUNCH();
      bk.finish(bp, 0);  // dQ = scale dQ_acc
      CUDA_CHECK_LAUNCH();
    });
    g.result.workspace_bytes =
        4.0 * double(p.q_numel()) + 8.0 * double(p.rows()) + kv_lists.bytes() + q_lists.bytes();
    g.result.config += "; " + describe(bk, bp);
  }
  return g.finish(out);
}

RunResult run(const Problem& p, const Inputs& in, Outputs& out, const RunOptions& opt) {
  return with_16bit_type(p.dtype, [&](auto t) { return run_typed<decltype(t)>(p, in, out, opt); });
}

}  // namespace

const Step& step_06() {
  static const Step s =
      StepBuilder(6, "06_tensor_core_fa2", Device::cuda,
                  "FA2 on tensor cores: mma.sync bf16/fp16 with fp32 accumulation, ldmatrix, "
                  "swizzled shared memory, cp.async pipelining, P in registers, exp2; the FA2 "
                  "backward on them")
          .adds({"mma.sync m16n8k16 with fp32 accumulation", "ldmatrix (.trans for V)",
                 "XOR-swizzled shared memory", "cp.async double buffering of K_j and V_j",
                 "P kept in registers as the A operand", "exp2 with log2(e) folded into the scale",
                 "O staged through shared memory for 16-byte stores",
                 "backward with a D = rowsum(dO o O) pre-pass and P recomputed from LSE",
                 "K/V-outer backward loop with dK_j and dV_j in registers",
                 "S^T and dP^T so that P^T and dS^T are A operands in registers",
                 "dQ accumulated by fp32 atomics",
                 "block-sparse masks: masked tiles skipped, K/V never loaded",
                 "dropout regenerated in registers (Philox), never stored"})
          .dtypes(kDTypes)
          .head_dims(HeadDims())
          .backward(BackwardHeadDims())
          .dropout()  // dropout and block masks: the full variant (variants() above)
          .block_sparse()
          .max_sizes(kGridLimits)
          .limits(
              "tiles fixed per head dim (Br x Bc: 128 x 128 for d <= 64, 128 x 64 above); "
              "variants other than 'full' are built for " +
              std::string(dtype_name(kTeachingDType)) + " with d " + TeachingHeadDims::str() +
              " only; the backward (Bc = 128 keys x Br = 64 queries, 128 at d = 64) is, by "
              "its fp32 atomics, not bitwise reproducible in dQ; dropout and block-sparse "
              "masks in the 'full' variant only, mask blocks multiples of the forward's "
              "tiles (and with --backward of the backward's)")
          .variants(variants())
          .tiles(fixed_tiles)
          .workspace(workspace_bytes)
          .run(run);
  return s;
}

}  // namespace ladder
