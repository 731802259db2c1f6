// Step 06's host side: the descriptor (what it supports), the variants (which kernel
// instantiation each one runs) and the launches. The algorithm is tensor_core_fa2.cuh
// (forward) and tensor_core_fa2_backward.cuh (backward).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "fault.hpp"
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
const FwdVariant kVariants[] = {
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
    case kPlusLdmatrix:
      return variant_kernel<kPlusLdmatrix>(d);
    case kPlusSwizzle:
      return variant_kernel<kPlusSwizzle>(d);
    case kPlusCpAsync:
      return variant_kernel<kPlusCpAsync>(d);
    case kNoSwizzle:
      return variant_kernel<kNoSwizzle>(d);
    case kNoCpAsync:
      return variant_kernel<kNoCpAsync>(d);
    case kNoLdmatrix:
      return variant_kernel<kNoLdmatrix>(d);
    case kPViaSmem:
      return variant_kernel<kPViaSmem>(d);
    case kDirectStore:  // = kPlusPRegisters
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

// The descriptor's tiles(): fixed per head dim at compile time (FwdTiles); --tile-q and
// --tile-k may only name them. Also where the features' limits are enforced (exit 2):
//  - dropout and block masks are template flags of the full kernel only: instantiating them
//    for every teaching variant too would triple their instantiations and the compile time,
//    and what a variant measures is a technique, the same with or without the features;
//  - the backward's tiles (Bc = 128 keys, Br = 64 or 128 queries) must divide the mask block
//    too, which the runner checks only against the forward's.
Tiles fixed_tiles(const Problem& p, const RunOptions& opt, const DeviceInfo&) {
  const FwdKernel k = select_kernel(p.dtype, p.dim, kAll);
  if ((opt.tile_q != 0 && opt.tile_q != k.br) || (opt.tile_k != 0 && opt.tile_k != k.bc))
    throw BadInput("step 06 fixes its tiles at compile time: for --dim " + std::to_string(p.dim) +
                   " Br = " + std::to_string(k.br) +
                   " (--tile-q) and Bc = " + std::to_string(k.bc) + " (--tile-k)");
  const bool features = p.dropout > 0 || p.sparsity.active();
  if (features && variant_named(opt.variant).flags != kAll)
    throw BadInput("variant '" + opt.variant +
                   "' of step 06 is built without dropout and block-sparse masks; the default "
                   "variant '" +
                   std::string(kVariants[0].name) + "' has them");
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

// The block lists' bytes (int32 counts and indices), at most: the forward's per (b, h, query
// block), the backward's per (b, h, key block); a mask shared by every batch or head (first
// dimensions of 1) needs fewer.
double mask_list_bytes(const Problem& p) {
  if (!p.sparsity.active()) return 0.0;
  const double rows = double(p.batch) * double(p.heads), qb = double(p.q_blocks()),
               kb = double(p.k_blocks());
  return 4.0 * rows * (qb * (1.0 + kb) + (p.backward ? kb * (1.0 + qb) : 0.0));
}

// Device memory beyond inputs and outputs: the backward's fp32 dQ accumulator, and L = LSE
// log2(e) and D per query row; the block lists of a block-sparse run.
double workspace_bytes(const Problem& p, const RunOptions&) {
  return (p.backward ? 4.0 * double(p.q_numel()) + 8.0 * double(p.rows()) : 0.0) +
         mask_list_bytes(p);
}

// A block mask's CSR lists on the device (common/block_mask.hpp).
struct DeviceLists {
  DeviceBuffer<int32_t> count, index;
  explicit DeviceLists(const BlockLists& l) : count(l.count.size()), index(l.index.size()) {
    count.upload(l.count);
    index.upload(l.index);
  }
  double bytes() const { return double(count.bytes() + index.bytes()); }
};

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
  if (kFault && p.dtype == DType::bf16) fp.scale_log2 *= 1.005f;  // the fault build's defect
  fp.causal = p.causal;
  // Block-sparse: the lists of kept key blocks (and, for the backward, of kept query blocks),
  // built and uploaded once, outside the timed region, as FlexAttention builds its BlockMask.
  const BlockMask& m = in.mask;
  std::optional<DeviceLists> kv_lists, q_lists;
  if (!m.empty()) {
    kv_lists.emplace(kv_block_lists(m));
    fp.blk_count = kv_lists->count.get(), fp.blk_index = kv_lists->index.get();
    fp.mask_batch = int(m.batch), fp.mask_heads = int(m.heads);
    fp.mask_q_blocks = int(m.q_blocks), fp.mask_k_blocks = int(m.k_blocks);
    fp.mask_block_q = int(m.block_q), fp.mask_block_k = int(m.block_k);
  }
  fp.dropout_p = p.dropout, fp.dropout_seed = p.dropout_seed;

  CUDA_CHECK(k.configure());  // shared-memory limits of every instantiation launch() may run
  g.forward([&] {
    k.launch(fp, 0);
    CUDA_CHECK_LAUNCH();
  });
  // O(1) extra memory (the whole of S and P lives on chip), and a mask's block lists.
  g.result.workspace_bytes = kv_lists ? kv_lists->bytes() : 0.0;
  g.result.config = describe(k, fp);

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
    if (!m.empty()) {
      q_lists.emplace(q_block_lists(m));  // outside the timed region, as the forward's
      bp.blk_count = q_lists->count.get(), bp.blk_index = q_lists->index.get();
      bp.mask_batch = fp.mask_batch, bp.mask_heads = fp.mask_heads;
      bp.mask_q_blocks = fp.mask_q_blocks, bp.mask_k_blocks = fp.mask_k_blocks;
      bp.mask_block_q = fp.mask_block_q, bp.mask_block_k = fp.mask_block_k;
    }
    bp.dropout_p = p.dropout, bp.dropout_seed = p.dropout_seed;
    CUDA_CHECK(bk.configure());
    g.backward([&] {
      bk.prepass(bp, 0);  // D, LSE log2(e), dQ_acc = 0
      CUDA_CHECK_LAUNCH();
      bk.main(bp, 0);  // dK, dV; dQ_acc by atomics
      CUDA_CHECK_LAUNCH();
      bk.finish(bp, 0);  // dQ = scale dQ_acc
      CUDA_CHECK_LAUNCH();
    });
    g.result.workspace_bytes = 4.0 * double(p.q_numel()) + 8.0 * double(p.rows()) +
                               (kv_lists ? kv_lists->bytes() + q_lists->bytes() : 0.0);
    g.result.config += "; " + describe(bk, bp);
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
              "dQ accumulated by fp32 atomics",
              "block-sparse masks: masked tiles skipped, K/V never loaded",
              "dropout regenerated in registers (Philox), never stored"};
    s.device = Device::cuda;
    s.caps.dtypes = {DType::bf16, DType::f16};
    s.caps.head_dims = {32, 64, 96, 128, 256};
    s.caps.causal = true, s.caps.gqa = true, s.caps.backward = true;
    s.caps.backward_head_dims = {32, 64, 96, 128};
    // Dropout and block masks: the full variant (fixed_tiles refuses the others with them).
    s.caps.dropout = true, s.caps.block_sparse = true;
    s.caps.max_batch = s.caps.max_heads = 65535;  // grid.z and grid.y
    s.caps.max_seq = int64_t(1) << 30;            // 32-bit row indices
    s.caps.limits =
        "tiles fixed per head dim (Br x Bc: 128 x 128 for d <= 64, 128 x 64 above); variants "
        "other than 'full' are built for bf16 with d 64 and 128 only; the backward runs d 32, "
        "64, 96 and 128 (Bc = 128 keys x Br = 64 queries, 128 at d = 64) and, by its fp32 "
        "atomics, is not bitwise reproducible in dQ; dropout and block-sparse masks in the "
        "'full' variant only, mask blocks multiples of the forward's tiles (and with "
        "--backward of the backward's)";
    for (const FwdVariant& v : kVariants) {
      Variant x{v.name, v.summary};
      if (v.flags != kAll) {  // the teaching variants: bf16, d 64 and 128, dense, no dropout
        x.dtypes = {DType::bf16}, x.head_dims = {64, 128};
        x.dropout = x.block_sparse = false;  // (their backward is the shared one: they have it)
      }
      s.variants.push_back(x);
    }
    s.tiles = fixed_tiles;
    s.workspace = workspace_bytes;
    s.run = run;
    return s;
  }();
  return s;
}

}  // namespace ladder
