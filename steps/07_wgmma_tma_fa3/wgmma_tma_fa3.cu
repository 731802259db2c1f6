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
// K_j, V_j and every thread computes addresses for it. This step keeps the algorithm and
// changes the machinery, one idea per variant (kVariants in the .hpp says each in a line).
//
// A CTA works on (query tile of Br = 64 x consumers rows, head, batch); consumer warpgroup c
// owns rows 64c .. 64c+63 and keeps their S, m, l and O in registers. Per K/V tile j (Bc = 128
// keys):
//   S = Q K_j^T                      wgmma SS: A = Q (smem), B = K_j (smem, K-major)
//   mask (tiles past the causal diagonal's start or the end of the keys only)
//   m, l and P by the online softmax, in base 2 (softmax_tile)
//   O = alpha O + P V_j              wgmma RS: A = P (registers), B = V_j (smem, N-major)
// and at the end O /= l, LSE = tau m + ln l, O through shared memory to 16-byte stores.
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
    // EXERCISE BEGIN producer-split [medium]
    // Concept: warp specialisation: one warpgroup produces (TMA copies into the ring), the
    // others consume (wgmma and softmax), and setmaxnreg moves registers from the producer,
    // which needs few, to the consumers, which need many.
    //
    // Warpgroup wg of this CTA takes one role: warpgroup 0 the producer, warpgroup wg > 0 the
    // consumer numbered wg - 1 (persistent_producer, persistent_consumer). fa3.cuh gives the
    // register counts of each role (kProducerRegs, consumer_regs(kConsumers)); hopper.cuh has
    // setmaxnreg_dec and setmaxnreg_inc. Traps: setmaxnreg is .sync.aligned, so every thread
    // of a warpgroup must execute the same one, before its role's work; and the copies are
    // issued by a single thread (elect_one() picks one lane of a warp), not by 128.
    if (wg == 0) {
      setmaxnreg_dec<kProducerRegs>();
      if (threadIdx.x / 32 == 0 && elect_one())
        persistent_producer<S, kStages, kExtras, kTrace>(p, smem, bars, &tm_q, &tm_k, &tm_v, tr);
    } else {
      setmaxnreg_inc<consumer_regs(kConsumers)>();
      persistent_consumer<T, D, kFlags, kConsumers, kStages, kExtras, kTrace>(wg - 1, p, smem, bars,
                                                                              tr);
    }
    // EXERCISE END
  } else {
    const Item c = cta_item<S::kBr, kExtras>(p);  // one item per CTA
    RingPos pos;
    if constexpr (kFlags & kWarpSpec) {
      // Roles: warpgroup 0 produces, the others consume. Each role is one branch, with its
      // setmaxnreg first, executed by whole warpgroups.
      const int wg = threadIdx.x / kWGThreads;
      // EXERCISE BEGIN producer-split-item [easy]
      // Concept: the same split in the one-item kernels (warp-specialized, pingpong,
      // intra-overlap): producer() and consume_item() instead of the persistent pair.
      //
      // As in producer-split above; consume_item also takes the item c, the ring position pos
      // and the K/V tensor maps.
      if (wg == 0) {
        setmaxnreg_dec<kProducerRegs>();
        if (threadIdx.x / 32 == 0 && elect_one())
          producer<S, kStages, kTrace>(c, smem, bars, &tm_q, &tm_k, &tm_v, tr);
      } else {
        setmaxnreg_inc<consumer_regs(kConsumers)>();
        consume_item<T, D, kFlags, kConsumers, kStages, kExtras, kTrace>(c, wg - 1, p, smem, bars,
                                                                         pos, &tm_k, &tm_v, tr);
      }
      // EXERCISE END
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
void launch_as(const FwdPlan& plan, cudaStream_t stream) {
  CUtensorMap maps[3];
  std::memcpy(maps, plan.tensor_maps, sizeof(maps));
  fa3_fwd_kernel<T, D, kFlags, kConsumers, kStages, kExtras, kTrace>
      <<<plan.grid, plan.block, plan.smem_bytes, stream>>>(maps[0], maps[1], maps[2],
                                                           kernel_params(plan));
}

// One instantiation, as make_plan sees it.
struct Entry {
  const void* fn;
  void (*launch)(const FwdPlan&, cudaStream_t);
  int threads, smem, br, stages;
};

// The kernel of schedule kFlags for (T, D). The persistent kernels' stages: three at d = 64
// (the tiles are half as long to compute, so the ring must run further ahead; 144 KiB with
// three consumers), two at d = 128 (192 KiB).
template <class T, int D, int kFlags, int kConsumers, bool kExtras = false, bool kTrace = false>
Entry entry_of() {
  constexpr bool kPers = (kFlags & kPersist) != 0;
  constexpr int kStages = kPers && D == 64 ? 3 : 2;
  using S = Smem<D, kConsumers, kStages, kPers>;
  return {reinterpret_cast<const void*>(
              &fa3_fwd_kernel<T, D, kFlags, kConsumers, kStages, kExtras, kTrace>),
          &launch_as<T, D, kFlags, kConsumers, kStages, kExtras, kTrace>,
          threads_of(kFlags, kConsumers),
          S::kDynamic,
          S::kBr,
          kStages};
}

// Variant V's kernel (V names the schedule; three-consumers is the persistent kernel with
// kConsumers = 3).
template <class T, int D, Variant V, int kConsumers = 2, bool kExtras = false, bool kTrace = false>
Entry entry() {
  return entry_of<T, D, flags_of(V), kConsumers, kExtras, kTrace>();
}

// Three consumers with dropout: ping-pong without the intra-warpgroup overlap. With it, S, P
// and O (128 of a consumer's 160 registers) stay live across the wgmma beside the keep flags,
// and ptxas serialises the wgmma (warning C7512); without it they fit.
constexpr int kThreeWithDropout = kWarpSpec | kPingPong | kPersist;

// The instantiations for (T, D): every variant; three-consumers' Br = 192 kernel (d = 64), and
// its dropout build; dropout and block-sparse compiled into the two-consumer persistent kernel
// (`extras`); the trace builds of tma-wgmma, intra-overlap and the persistent kernel (bf16,
// d = 128).
template <class T, int D>
Entry select_as(Variant v, bool extras, bool block_mask, bool trace, int seq_q) {
  using V = Variant;
  if constexpr (kIsBf16<T> && D == 128) {
    if (trace && v == V::tma_wgmma) return entry<T, D, V::tma_wgmma, 2, false, true>();
    if (trace && v == V::intra_overlap) return entry<T, D, V::intra_overlap, 2, false, true>();
    if (trace) return entry<T, D, V::persistent, 2, false, true>();
  }
  if constexpr (D == 64) {
    if (query_tile(v, D, block_mask, seq_q) == 192)
      return extras ? entry_of<T, D, kThreeWithDropout, 3, true>()
                    : entry<T, D, V::three_consumers, 3>();
  }
  if (extras) return entry<T, D, V::persistent, 2, true>();
  if (v == V::wgmma) return entry<T, D, V::wgmma>();
  if (v == V::tma_wgmma) return entry<T, D, V::tma_wgmma>();
  if (v == V::warp_specialized) return entry<T, D, V::warp_specialized>();
  if (v == V::pingpong) return entry<T, D, V::pingpong>();
  if (v == V::intra_overlap) return entry<T, D, V::intra_overlap>();
  return entry<T, D, V::persistent>();  // persistent, and three-consumers at Br = 128
}

bool has_extras(const FwdParams& f) {
  return f.kv_count != nullptr || f.dropout_p > 0.f;
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

FwdPlan make_plan(const FwdParams& f, Variant v) {
  const char* who = "step 07";
  check_params(f, who, {f.q, f.k, f.v, f.o}, f.kv_count != nullptr);
  require(f.kv_count == nullptr || f.kv_index != nullptr, who, "kv_count without kv_index");
  const bool extras = has_extras(f), trace = f.trace != nullptr;
  require(!extras || is_persistent(v), who,
          "dropout and block-sparse are built into the persistent variants only "
          "('persistent', 'three-consumers')");
  require(!trace || ((v == Variant::tma_wgmma || v == Variant::intra_overlap || is_persistent(v)) &&
                     f.bf16 && f.dim == 128 && !extras),
          who,
          "the trace build exists for tma-wgmma, intra-overlap and the persistent variants, "
          "bf16, d = 128, no extras");
  require(!is_persistent(v) || f.tile_counter != nullptr, who,
          "the persistent variants need tile_counter (4 bytes of device memory)");

  const cudaDeviceProp prop = require_sm90(who);

  FwdPlan plan{};
  plan.params = f;
  plan.variant = v;
  const Entry e = with_type_and_dim(f.bf16, f.dim, [&](auto t, auto d) {
    return select_as<decltype(t), decltype(d)::value>(v, extras, f.kv_count != nullptr, trace,
                                                      f.seq_q);
  });
  plan.launcher = e.launch;
  plan.block = dim3(unsigned(e.threads));
  plan.smem_bytes = e.smem;
  plan.br = e.br, plan.bc = kBc, plan.stages = e.stages, plan.consumers = e.br / 64;
  const int n_mt = (f.seq_q + e.br - 1) / e.br;
  encode_4d(plan.tensor_maps[0], f, f.q, f.heads, f.seq_q, f.q_strides, e.br);
  encode_4d(plan.tensor_maps[1], f, f.k, f.heads_kv, f.seq_k, f.k_strides, kBc);
  encode_4d(plan.tensor_maps[2], f, f.v, f.heads_kv, f.seq_k, f.v_strides, kBc);
  plan.regs = set_smem_limit(e.fn, e.smem);
  if (!is_persistent(v)) {
    plan.grid = dim3(unsigned(n_mt), unsigned(f.heads), unsigned(f.batch));
    return plan;
  }
  // Persistent: as many CTAs as fit at once (one per SM), never more than there are items.
  const long long items = (long long)n_mt * f.batch * f.heads;
  require(items <= INT_MAX / 2, who, "too many work items (query tiles x heads x batch)");
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, e.fn, e.threads, e.smem));
  require(per_sm >= 1, who, "the persistent kernel does not fit on an SM");
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
  if (!plan.launcher) throw std::invalid_argument("step 07: launch of an empty plan");
  plan.launcher(plan, stream);
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
  if (has_extras(plan.params)) s << " extras=dropout+block-sparse";
  if (has_extras(plan.params) && plan.consumers == 3) s << " (ping-pong without intra-overlap)";
  if (plan.params.trace) s << " trace";
  if (flags_of(plan.variant) & kCpAsync) s << " loads=cp.async";
  if (kFaultSkipKWait) s << " FAULT=skip_k_wait";
  return s.str();
}

}  // namespace ladder::fa3
