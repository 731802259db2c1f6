// Step 07 — FlashAttention on Hopper: TMA, wgmma, warp specialisation (CUDA sm_90a, bf16/fp16).
// Adds: TMA tile loads completing on mbarriers; wgmma with B from swizzled shared memory and P
// from registers; a producer warpgroup and setmaxnreg; ping-pong scheduling of the consumer
// warpgroups; softmax overlapped with the next tile's GEMMs inside a warpgroup; a persistent
// kernel fed by a tile scheduler, heaviest work first; three consumer warpgroups at d = 64;
// dropout and block-sparse masks in the persistent kernels; the backward on wgmma: a producer
// streams Q and dO tiles to two consumer warpgroups that keep dK and dV in registers, dQ added
// by the copy engine.
//
// This file: the forward kernel, its roles by warpgroup, and its host side (README.md: the
// reading order).
//
// SPDX-License-Identifier: MIT (LICENSE). Follows the published structure of FlashAttention-3
// (Shah, Bikshandi, Zhang, Thakkar, Ramani, Dao, 2024, arXiv:2407.08608).
//
// Step 06 runs FlashAttention-2 on mma.sync: every warp loads its own operand fragments
// (ldmatrix), issues 16 x 8 x 16 products one by one and waits for each; cp.async moves
// K_j, V_j and every thread computes addresses for it. On an H100 that tops out near
// 320 TFLOP/s. This step keeps the algorithm (online softmax over K/V tiles, P reused from
// registers) and changes the machinery, one idea per variant (kVariants in the .hpp says each
// in a line, the note at length): TMA and wgmma, then a producer warpgroup with setmaxnreg,
// ping-pong between the consumer warpgroups, softmax under the next tile's GEMMs inside one,
// a persistent kernel fed by tile_scheduler.cuh, and three consumers at d = 64 (the default;
// at d = 128, with dropout or a block mask, or where seq_q pads badly to 192 rows, query_tile()
// in the .hpp, it runs the persistent kernel).
//
// A CTA works on (query tile of Br = 64 x consumers rows, head, batch); consumer warpgroup c
// owns rows 64c .. 64c+63 and keeps their S, m, l and O in registers. Per K/V tile j (Bc = 128
// keys):
//   S = Q K_j^T                      wgmma SS: A = Q (smem), B = K_j (smem, K-major)
//   mask (tiles past the causal diagonal's start or the end of the keys only)
//   m, l and P by the online softmax, in base 2 (softmax_tile)
//   O = alpha O + P V_j              wgmma RS: A = P (registers), B = V_j (smem, N-major)
// and at the end O /= l, LSE = tau m + ln l, O through shared memory to 16-byte stores.
//
// Shared memory (d = 128, Br = 128): Q 32 KiB + 2 stages x (K 32 + V 32) KiB = 160 KiB, and a
// 32 KiB O buffer in the persistent kernels. Each tile is stored as d / 64 "column halves" of
// [rows][64] elements, rows of 128 bytes in the TMA's 128-byte swizzle (16-byte chunk c of row
// r at chunk c ^ (r mod 8)), every half on a 1024-byte boundary: the layout the wgmma
// descriptors with swizzle mode 128B read (hopper.cuh).
#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes through the runtime
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>

#include "fwd_consumer.cuh"
#include "tensor_map.hpp"

namespace ladder::fa3 {
namespace {

// ---- the kernel -------------------------------------------------------------------------
template <class T, int D, int kFlags, int kConsumers, int kStages, bool kExtras, bool kTrace>
__global__ void __launch_bounds__(threads_of(kFlags, kConsumers), 1)
    fa3_fwd_kernel(const __grid_constant__ CUtensorMap tm_q,
                   const __grid_constant__ CUtensorMap tm_k,
                   const __grid_constant__ CUtensorMap tm_v, const KParams p) {
  constexpr bool kPers = kFlags & kPersist;
  using S = Smem<D, kConsumers, kStages, kPers>;
  extern __shared__ unsigned char smem_raw[];
  __shared__ Bars<kStages> bars;
  unsigned char* smem = align_1024(smem_raw);
  if (threadIdx.x == 0) {
    bars.init(kConsumers * 4);
    mbarrier_init_fence();
  }
  __syncthreads();

  Trace<kTrace> tr;
  tr.init(p.trace, threadIdx.x / 32);

  if constexpr (kPers) {
    // Roles as in the warp-specialised kernels, each looping over the CTA's items.
    const int wg = threadIdx.x / kWGThreads;
    if (wg == 0) {
      setmaxnreg_dec<kProducerRegs>();
      if (threadIdx.x / 32 == 0 && elect_one())
        persistent_producer<S, kStages, kExtras, kTrace>(p, smem, bars, &tm_q, &tm_k, &tm_v, tr);
    } else {
      setmaxnreg_inc<consumer_regs(kConsumers)>();
      persistent_consumer<T, D, kFlags, kConsumers, kStages, kExtras, kTrace>(wg - 1, p, smem, bars,
                                                                              tr);
    }
  } else {
    const Item c = cta_item<S::kBr, kExtras>(p);  // one item per CTA
    RingPos pos;
    if constexpr (kFlags & kWarpSpec) {
      // Roles: warpgroup 0 produces, the others consume. Each role is one branch, with its
      // setmaxnreg first, executed by whole warpgroups.
      const int wg = threadIdx.x / kWGThreads;
      if (wg == 0) {
        setmaxnreg_dec<kProducerRegs>();
        if (threadIdx.x / 32 == 0 && elect_one())
          producer<S, kStages, kTrace>(c, smem, bars, &tm_q, &tm_k, &tm_v, tr);
      } else {
        setmaxnreg_inc<consumer_regs(kConsumers)>();
        consume_item<T, D, kFlags, kConsumers, kStages, kExtras, kTrace>(c, wg - 1, p, smem, bars,
                                                                         pos, &tm_k, &tm_v, tr);
      }
    } else if constexpr (kFlags & kCpAsync) {
      // wgmma: every thread copies its share of Q and of the first two K/V tiles (a group per
      // tile, Q's with the first; empty groups keep the count where there are fewer tiles).
      constexpr int kThreads = kConsumers * kWGThreads;
      const uint32_t base = smem_u32(smem);
      if (c.walk.n_iter > 0) cp_async_q<S, D, kThreads>(c, p, base);
      for (int it = 0; it < kStages; ++it) {
        if (it < c.walk.n_iter) cp_async_kv<S, D, kThreads>(c, p, base, it, c.walk.tile(it));
        cp_async_commit();
      }
      consume_item<T, D, kFlags, kConsumers, kStages, kExtras, kTrace>(
          c, threadIdx.x / kWGThreads, p, smem, bars, pos, &tm_k, &tm_v, tr);
    } else {
      // No roles: thread 0 starts Q and the first two K/V tiles, then computes like the others.
      if (threadIdx.x == 0 && c.walk.n_iter > 0) {
        load_q<S>(c, smem, bars.q().full_bar(0), &tm_q);
        const KVCopies<S, kStages, kTrace> copy{c, smem, bars, &tm_k, &tm_v, tr};
        for (int it = 0; it < kStages && it < c.walk.n_iter; ++it) copy.both(it, c.walk.tile(it));
      }
      __syncwarp();
      consume_item<T, D, kFlags, kConsumers, kStages, kExtras, kTrace>(
          c, threadIdx.x / kWGThreads, p, smem, bars, pos, &tm_k, &tm_v, tr);
    }
  }
}
// ---- host side ---------------------------------------------------------------------------

KParams kernel_params(const FwdPlan& plan) {
  const FwdParams& f = plan.params;
  KParams k{};
  k.o = f.o, k.lse = f.lse;
  k.heads = f.heads, k.group = f.heads / f.heads_kv, k.seq_q = f.seq_q, k.seq_k = f.seq_k;
  k.score = score_params(f.scale, f.causal, f.dropout_p, f.dropout_seed);
  k.kv_count = f.kv_count, k.kv_index = f.kv_index;
  k.block_m = f.block_m > 0 ? f.block_m : plan.br;
  k.bn_tiles = f.block_n > 0 ? f.block_n / kBc : 1;
  k.mask_nI = (f.seq_q + k.block_m - 1) / k.block_m;
  k.mask_nJ = f.block_n > 0 ? (f.seq_k + f.block_n - 1) / f.block_n : 1;
  k.mask_batch = f.mask_batch, k.mask_heads = f.mask_heads;
  k.n_mt = (f.seq_q + plan.br - 1) / plan.br;
  k.n_bh = f.batch * f.heads;
  k.sec_heads = std::max(1, plan.section_heads);
  k.items = plan.items;
  k.counter = f.tile_counter;
  k.trace = f.trace;
  k.q = f.q, k.k = f.k, k.v = f.v;
  k.q_strides = resolved(f.q_strides, f.heads, f.seq_q, f.dim);
  k.k_strides = resolved(f.k_strides, f.heads_kv, f.seq_k, f.dim);
  k.v_strides = resolved(f.v_strides, f.heads_kv, f.seq_k, f.dim);
  k.o_strides = resolved(f.o_strides, f.heads, f.seq_q, f.dim);
  return k;
}

template <class T, int D, int kFlags, int kConsumers, int kStages, bool kExtras, bool kTrace>
void launch_one(const FwdPlan& plan, cudaStream_t stream) {
  CUtensorMap maps[3];
  std::memcpy(maps, plan.tensor_maps, sizeof(maps));
  fa3_fwd_kernel<T, D, kFlags, kConsumers, kStages, kExtras, kTrace>
      <<<plan.grid, plan.block, plan.smem_bytes, stream>>>(maps[0], maps[1], maps[2],
                                                           kernel_params(plan));
}

struct Entry {
  const void* fn = nullptr;
  void (*launch)(const FwdPlan&, cudaStream_t) = nullptr;
  int threads = 0, smem = 0, br = 0, stages = 0, consumers = 0;
  bool persistent = false;
};

template <class T, int D, int kFlags, int kConsumers, int kStages, bool kExtras, bool kTrace>
Entry entry() {
  constexpr bool kPers = (kFlags & kPersist) != 0;
  using S = Smem<D, kConsumers, kStages, kPers>;
  return {reinterpret_cast<const void*>(
              &fa3_fwd_kernel<T, D, kFlags, kConsumers, kStages, kExtras, kTrace>),
          &launch_one<T, D, kFlags, kConsumers, kStages, kExtras, kTrace>,
          threads_of(kFlags, kConsumers),
          S::kDynamic,
          S::kBr,
          kStages,
          kConsumers,
          kPers};
}

constexpr int kCp = kCpAsync, kBase = 0, kWS = kWarpSpec, kPP = kWarpSpec | kPingPong,
              kFull = kWarpSpec | kPingPong | kIntraOverlap, kPers = kFull | kPersist;
// The persistent kernels' stages: three at d = 64 (the tiles are half as long to compute, so
// the ring must run further ahead; 144 KiB with three consumers), two at d = 128 (192 KiB).
template <int D>
inline constexpr int kPersStages = D == 64 ? 3 : 2;

// Instantiation ids: 0..15 = (variant - tma-wgmma) * 4 + (fp16 ? 2 : 0) + (d == 128) for the
// TMA one-item kernels; 16..19 = persistent (two consumers), same order; 20, 21 = three
// consumers, d = 64, bf16 / fp16; 22..25 = persistent with dropout / block-sparse compiled in;
// 26, 27, 28 = the trace builds of tma-wgmma, intra-overlap and persistent (bf16, d = 128);
// 29..32 = wgmma (cp.async), in the first order.
int instantiation_id(Variant v, bool is_bf16, int dim, int seq_q, bool extras, bool trace) {
  const int dt = (is_bf16 ? 0 : 2) + (dim == 128 ? 1 : 0);
  if (trace) return v == Variant::tma_wgmma ? 26 : v == Variant::intra_overlap ? 27 : 28;
  if (extras) return 22 + dt;
  if (query_tile(v, dim, extras, seq_q) == 192) return is_bf16 ? 20 : 21;
  if (is_persistent(v)) return 16 + dt;
  if (v == Variant::wgmma) return 29 + dt;
  return (int(v) - int(Variant::tma_wgmma)) * 4 + dt;
}

// The one table that picks the instantiation, indexed by instantiation_id().
constexpr Entry (*kEntries[])() = {
    &entry<bf16, 64, kBase, 2, 2, false, false>,                  // 0
    &entry<bf16, 128, kBase, 2, 2, false, false>,                 // 1
    &entry<fp16, 64, kBase, 2, 2, false, false>,                  // 2
    &entry<fp16, 128, kBase, 2, 2, false, false>,                 // 3
    &entry<bf16, 64, kWS, 2, 2, false, false>,                    // 4
    &entry<bf16, 128, kWS, 2, 2, false, false>,                   // 5
    &entry<fp16, 64, kWS, 2, 2, false, false>,                    // 6
    &entry<fp16, 128, kWS, 2, 2, false, false>,                   // 7
    &entry<bf16, 64, kPP, 2, 2, false, false>,                    // 8
    &entry<bf16, 128, kPP, 2, 2, false, false>,                   // 9
    &entry<fp16, 64, kPP, 2, 2, false, false>,                    // 10
    &entry<fp16, 128, kPP, 2, 2, false, false>,                   // 11
    &entry<bf16, 64, kFull, 2, 2, false, false>,                  // 12
    &entry<bf16, 128, kFull, 2, 2, false, false>,                 // 13
    &entry<fp16, 64, kFull, 2, 2, false, false>,                  // 14
    &entry<fp16, 128, kFull, 2, 2, false, false>,                 // 15
    &entry<bf16, 64, kPers, 2, kPersStages<64>, false, false>,    // 16
    &entry<bf16, 128, kPers, 2, kPersStages<128>, false, false>,  // 17
    &entry<fp16, 64, kPers, 2, kPersStages<64>, false, false>,    // 18
    &entry<fp16, 128, kPers, 2, kPersStages<128>, false, false>,  // 19
    &entry<bf16, 64, kPers, 3, kPersStages<64>, false, false>,    // 20
    &entry<fp16, 64, kPers, 3, kPersStages<64>, false, false>,    // 21
    &entry<bf16, 64, kPers, 2, kPersStages<64>, true, false>,     // 22
    &entry<bf16, 128, kPers, 2, kPersStages<128>, true, false>,   // 23
    &entry<fp16, 64, kPers, 2, kPersStages<64>, true, false>,     // 24
    &entry<fp16, 128, kPers, 2, kPersStages<128>, true, false>,   // 25
    &entry<bf16, 128, kBase, 2, 2, false, true>,                  // 26
    &entry<bf16, 128, kFull, 2, 2, false, true>,                  // 27
    &entry<bf16, 128, kPers, 2, kPersStages<128>, false, true>,   // 28
    &entry<bf16, 64, kCp, 2, 2, false, false>,                    // 29
    &entry<bf16, 128, kCp, 2, 2, false, false>,                   // 30
    &entry<fp16, 64, kCp, 2, 2, false, false>,                    // 31
    &entry<fp16, 128, kCp, 2, 2, false, false>,                   // 32
};
Entry select(int id) {
  return id >= 0 && id < int(sizeof(kEntries) / sizeof(kEntries[0])) ? kEntries[id]() : Entry{};
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("step 07: " + what);
}

}  // namespace

const char* variant_name(Variant v) {
  for (const VariantInfo& x : kVariants)
    if (x.id == v) return x.name;
  return "?";
}

const char* trace_phase_name(int phase) {
  static const char* const names[] = {"unused", "tma_issue_k", "tma_issue_v", "wait_k",
                                      "wait_v", "wgmma_s",     "wgmma_pv",    "softmax"};
  return phase > kTraceUnused && phase <= kTraceSoftmax ? names[phase] : names[0];
}

const char* trace_role_name(int phase) {
  return phase == kTraceTmaIssueK || phase == kTraceTmaIssueV ? "producer" : "consumer";
}

bool supported(Variant, bool, int dim, std::string* why) {
  if (dim == 64 || dim == 128) return true;
  if (why)
    *why =
        "head dims 64 and 128 (bf16 and fp16, every variant); 256 is not built: its O alone "
        "is 128 fp32 registers per consumer thread, which with S needs smaller key tiles";
  return false;
}

FwdPlan make_plan(const FwdParams& f, Variant v) {
  std::string why;
  require(supported(v, f.bf16, f.dim, &why), why);
  require(f.batch >= 1 && f.heads >= 1 && f.heads_kv >= 1 && f.seq_q >= 1 && f.seq_k >= 1,
          "batch, heads, heads_kv, seq_q, seq_k must be >= 1");
  require(f.heads % f.heads_kv == 0, "heads must be a multiple of heads_kv");
  require(f.batch <= 65535 && f.heads <= 65535, "batch and heads are grid dimensions (<= 65535)");
  require(std::isfinite(f.scale) && f.scale > 0.f,
          "scale must be finite and > 0 (negate Q for a negative scale)");
  require(f.q && f.k && f.v && f.o && f.lse, "null tensor pointer");
  for (const void* ptr : {f.q, f.k, f.v, static_cast<const void*>(f.o)})
    require(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, "Q, K, V, O must be 16-byte aligned");
  for (const Strides& s : {f.q_strides, f.k_strides, f.v_strides, f.o_strides})
    require(strides_ok(s), strides_rule());
  require(f.dropout_p >= 0.f && f.dropout_p < 1.f, "dropout_p must be in [0, 1)");
  const bool sparse = f.kv_count != nullptr;
  const bool extras = sparse || f.dropout_p > 0.f;
  require(!extras || is_persistent(v),
          "dropout and block-sparse are built into the persistent variants only "
          "('persistent', 'three-consumers')");
  if (sparse) {
    require(f.kv_index != nullptr, "kv_count without kv_index");
    // The dropout / block-sparse kernels have two consumers: Br = Bc = 128.
    require(f.block_m > 0 && f.block_m % 128 == 0 && f.block_n > 0 && f.block_n % kBc == 0,
            "mask blocks must be multiples of 128 x 128");
    require(f.mask_batch == 1 || f.mask_batch == f.batch, "mask_batch must be 1 or batch");
    require(f.mask_heads == 1 || f.mask_heads == f.heads, "mask_heads must be 1 or heads");
  }
  const bool trace = f.trace != nullptr;
  require(!trace || ((v == Variant::tma_wgmma || v == Variant::intra_overlap || is_persistent(v)) &&
                     f.bf16 && f.dim == 128 && !extras),
          "the trace build exists for tma-wgmma, intra-overlap and the persistent variants, "
          "bf16, d = 128, no extras");
  require(!is_persistent(v) || f.tile_counter != nullptr,
          "the persistent variants need tile_counter (4 bytes of device memory)");

  const cudaDeviceProp prop = require_sm90("step 07");

  FwdPlan plan{};
  plan.params = f;
  plan.variant = v;
  plan.instantiation = instantiation_id(v, f.bf16, f.dim, f.seq_q, extras, trace);
  const Entry e = select(plan.instantiation);
  require(e.fn != nullptr, "no instantiation");
  plan.kernel = e.fn;
  plan.block = dim3(unsigned(e.threads));
  plan.smem_bytes = e.smem;
  plan.br = e.br, plan.bc = kBc, plan.stages = e.stages, plan.consumers = e.consumers;
  const int n_mt = (f.seq_q + e.br - 1) / e.br;
  const CUtensorMapDataType t16 =
      f.bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  // Boxes of 64 columns (128 bytes) x the tile's rows.
  encode_4d(plan.tensor_maps[0], f.q, t16, f.dim, f.seq_q, f.heads, f.batch,
            resolved(f.q_strides, f.heads, f.seq_q, f.dim), e.br);
  encode_4d(plan.tensor_maps[1], f.k, t16, f.dim, f.seq_k, f.heads_kv, f.batch,
            resolved(f.k_strides, f.heads_kv, f.seq_k, f.dim), kBc);
  encode_4d(plan.tensor_maps[2], f.v, t16, f.dim, f.seq_k, f.heads_kv, f.batch,
            resolved(f.v_strides, f.heads_kv, f.seq_k, f.dim), kBc);
  plan.regs = set_smem_limit(e.fn, e.smem);
  if (!e.persistent) {
    plan.grid = dim3(unsigned(n_mt), unsigned(f.heads), unsigned(f.batch));
    return plan;
  }
  // Persistent: as many CTAs as fit at once (one per SM), never more than there are items.
  const long long items = (long long)n_mt * f.batch * f.heads;
  require(items <= INT_MAX / 2, "too many work items (query tiles x heads x batch)");
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, e.fn, e.threads, e.smem));
  require(per_sm >= 1, "the persistent kernel does not fit on an SM");
  plan.items = int(items);
  plan.grid =
      dim3(unsigned(std::min<long long>(items, (long long)prop.multiProcessorCount * per_sm)));
  // Heads per L2 section: as many as have their K and V (seq_k x d x 2 bytes each, shared by
  // `group` query heads) in half of the L2, so that the section's K/V tiles are read from
  // memory about once while every query tile of those heads runs.
  const double kv_bytes = 4.0 * f.seq_k * f.dim / double(f.heads / f.heads_kv);
  const double fit = 0.5 * double(prop.l2CacheSize) / kv_bytes;
  plan.section_heads = int(std::max(1.0, std::min(double(f.batch) * f.heads, std::floor(fit))));
  // The counter starts at zero (each launch leaves it so); make sure before the first one.
  CUDA_CHECK(cudaMemset(f.tile_counter, 0, sizeof(unsigned int)));
  CUDA_CHECK(cudaDeviceSynchronize());
  return plan;
}

void launch(const FwdPlan& plan, cudaStream_t stream) {
  const Entry e = select(plan.instantiation);
  if (!e.launch) throw std::invalid_argument("step 07: launch of an empty plan");
  e.launch(plan, stream);
  CUDA_CHECK_LAUNCH();
}

std::string describe(const FwdPlan& plan) {
  std::ostringstream s;
  const bool ws = flags_of(plan.variant) & kWarpSpec;
  s << variant_name(plan.variant) << " " << (plan.params.bf16 ? "bf16" : "fp16")
    << " d=" << plan.params.dim << " Br=" << plan.br << " Bc=" << plan.bc
    << " threads=" << plan.block.x << " (" << (ws ? "1 producer + " : "") << plan.consumers
    << " consumer warpgroups)"
    << " smem=" << plan.smem_bytes << " regs=" << plan.regs << " stages=" << plan.stages;
  if (ws) s << " setmaxnreg=" << kProducerRegs << "/" << consumer_regs(plan.consumers);
  if (plan.items > 0)
    s << " persistent grid=" << plan.grid.x << " items=" << plan.items
      << " section=" << plan.section_heads << " heads";
  if (plan.instantiation >= 22 && plan.instantiation < 26) s << " extras=dropout+block-sparse";
  if (plan.instantiation >= 26 && plan.instantiation < 29) s << " trace";
  if (flags_of(plan.variant) & kCpAsync) s << " loads=cp.async";
  if (kFaultSkipKWait) s << " FAULT=skip_k_wait";
  return s.str();
}

}  // namespace ladder::fa3
