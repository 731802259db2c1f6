// The Hopper vocabulary of step 07 (sm_90a): small named wrappers around the PTX instructions
// the kernels use (mbarriers and the rings over them, cp.async, TMA and bulk copies, wgmma and
// its descriptors, setmaxnreg, named barriers), each with what it does and the way it goes
// wrong. Everything here runs on sm_90a only (wgmma and setmaxnreg do not exist on plain sm_90).
//
// Fragment layouts (PTX ISA, "Register Fragments" of wgmma.mma_async.m64nNk16; the same
// table that CUTLASS encodes as CLayout_64xN): warp w (0..3) of the warpgroup owns rows
// 16w .. 16w+15 of the 64-row tile; lane l has g = l / 4, t = l % 4.
//   D (64 x N fp32), N/2 floats:  d[4c + 2r + i] = D[16w + g + 8r][8c + 2t + i]
//       (c = 0..N/8-1 the n8 column block, r = 0/1 the row half, i = 0/1 the column pair):
//       per n8 block exactly the mma.sync m16n8 C fragment of step 06.
//   A (64 x 16, 16-bit) from registers, 4 x .b32, each two consecutive columns (lower low):
//       a[0] = A[16w + g][2t, 2t+1]   a[1] = A[16w + g + 8][2t, 2t+1]
//       a[2] = A[16w + g][2t+8, +9]   a[3] = A[16w + g + 8][2t+8, +9]
//   so the accumulators d[8k .. 8k+7] of S (columns 16k .. 16k+15), packed pairwise to 16 bits,
//   are exactly the A fragment of P for the k16 step k: the FA2 register trick carries over.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "exercise.hpp"
#include "fault.hpp"

namespace ladder::hopper {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier ----------------------------------------------------------------------------
// A 64-bit shared-memory object with a phase bit. A phase completes when its pending arrivals
// reach 0 AND its transaction count (bytes announced by expect_tx, counted down by the copies'
// writes) reaches 0; then the phase bit flips.

// One thread initialises; `count` = arrivals that complete a phase. Pitfall: the TMA unit and
// other threads may only use it after the init is made visible (mbarrier_init_fence + a block
// barrier).
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
}

// Makes this thread's prior mbarrier.init visible to the other threads and to the async proxy
// (the TMA unit). Pitfall: without it the first complete_tx may hit an uninitialised object.
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Arrive (count 1), release semantics: this thread's earlier memory accesses are visible to a
// thread whose wait sees the phase complete. Predicated in PTX (no branch), so a warp can call
// it with only lane 0 enabled and stay converged for the next .aligned instruction.
__device__ __forceinline__ void mbar_arrive_if(uint64_t* bar, bool pred) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::
          "r"(smem_u32(bar)),
      "r"(int(pred))
      : "memory");
}

// Announce `bytes` of incoming TMA data, then arrive. Pitfall: the byte count must equal the
// full box sizes, out-of-bounds (zero-filled) parts included, or the phase never completes.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}

// Spin until the phase with parity `parity` has completed (acquire: the TMA data, or the
// arriving threads' writes, are visible afterwards). The parity of a phase is its index mod 2.
// Pitfall: on a fresh barrier, parity 1 counts as "the preceding phase" and passes at once.
// A learner's exercise build (LADDER_EXERCISE_BUILD) gives up after 2^24 polls, seconds where a
// real wait takes microseconds: a wrong byte count or parity then fails the run with a trap
// instead of hanging it.
#if defined(LADDER_EXERCISE_BUILD)
inline constexpr bool kWaitGivesUp = true;
#else
inline constexpr bool kWaitGivesUp = false;
#endif
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_u32(bar);
  uint32_t done, polls = 0;
  do {
    if constexpr (kWaitGivesUp) {
      if (++polls == (1u << 24)) __trap();
    }
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (!done);
}

// A ring of kStages buffers between a producer and its consumers (CUTLASS's PipelineTmaAsync):
// stage s has a full barrier (the producer's arrive or expect_tx, then the copy's bytes) and an
// empty barrier (the consumers' releases). Both sides count the uses of the ring, 0, 1, 2, ...:
// use `count` fills stage count % kStages for the (count / kStages)-th time, and completes one
// phase of each of the stage's two barriers. Each role keeps its own count. The ring only
// points at the barriers, which live where the kernel puts them (static shared memory, so the
// pointers are constants once inlined).
template <int kStages>
struct Pipeline {
  uint64_t* full;   // [kStages]
  uint64_t* empty;  // [kStages]

  static __device__ __forceinline__ uint32_t stage(uint32_t count) { return count % kStages; }
  // One thread, before the init fence: the arrivals that complete a phase of each barrier.
  __device__ __forceinline__ void init(uint32_t full_arrivals, uint32_t empty_arrivals) const {
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      mbar_init(&full[st], full_arrivals);
      mbar_init(&empty[st], empty_arrivals);
    }
  }
  // The parity of the phase that a wait for use `count` must see complete: on `full` (the
  // consumers), the phase of this use; on `empty` (the producer), the consumers' release of
  // the stage's previous use.
  static __device__ __forceinline__ uint32_t parity(uint32_t count, bool on_empty) {
    // EXERCISE BEGIN ring-parity [hard]
    // Concept: an mbarrier ring: the phase parity of the k-th use of a stage, and why the
    // producer's first wait on an empty slot must pass at once.
    //
    // Use `count` is use number count / kStages of stage count % kStages, and each use
    // completes one phase of both of the stage's barriers. The parity of a phase is its index
    // mod 2. Trap: on use 0 nothing has been released yet, and the producer's wait on `empty`
    // must still pass: on a fresh barrier, parity 1 counts as the phase before the first.
    return ((count / kStages) & 1) ^ uint32_t(on_empty);
    // EXERCISE END
  }
  // Producer: wait until stage(count) is free; then fill it, counting on full_bar(count).
  __device__ __forceinline__ void acquire(uint32_t count) const {
    mbar_wait(&empty[stage(count)], parity(count, true));
  }
  __device__ __forceinline__ uint64_t* full_bar(uint32_t count) const {
    return &full[stage(count)];
  }
  // Producer without a copy: the data is written, the arrive publishes it (release).
  __device__ __forceinline__ void commit(uint32_t count) const {
    mbar_arrive_if(&full[stage(count)], true);
  }
  // Consumers: wait until use `count` has landed; release it (one arrive per `pred` thread).
  __device__ __forceinline__ void wait(uint32_t count) const {
    mbar_wait(&full[stage(count)], parity(count, false));
  }
  __device__ __forceinline__ void release(uint32_t count, bool pred) const {
    mbar_arrive_if(&empty[stage(count)], pred);
  }
};

// ---- cp.async (step 06's copies), for the one variant that loads without the TMA unit ----

// 16 bytes from global to shared memory, asynchronously, by this thread; `valid` = false
// fills the 16 bytes with zeros instead (src-size 0: nothing is read, `src` must still be a
// valid address). Pitfall: what cp.async writes is generic-proxy data, so a wgmma (async proxy)
// may read it only after cp_async_wait, fence_proxy_async_shared and a barrier.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
               "l"(__cvta_generic_to_global(src)), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- TMA and bulk copies: one thread asks the copy engine for a whole tile ---------------

// Copies the box at coordinates (x, y, z, w) (innermost first, in elements: the kernels' column,
// row, head, batch) of the tensor that `tmap` describes into shared memory at `dst`, and counts
// its bytes on `bar`. `tmap` must be the address of a `const __grid_constant__ CUtensorMap`
// kernel parameter (or of one in global/const memory after a tensormap fence). Out-of-bounds
// elements arrive as zeros. Pitfalls: dst must be aligned to the swizzle pattern (1024 B for
// SWIZZLE_128B); the shared::cluster destination form is used with the CTA's own address (valid for
// a 1-CTA cluster, which every non-cluster launch is).
__device__ __forceinline__ void tma_load_4d(void* dst, const void* tmap, uint64_t* bar, int x,
                                            int y, int z, int w) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(smem_u32(bar)), "r"(x), "r"(y), "r"(z), "r"(w)
      : "memory");
}

// Bring a tensor map into the cache ahead of its first use (optional, a latency hint).
__device__ __forceinline__ void tma_prefetch_descriptor(const void* tmap) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
}

// Orders this thread's earlier generic-proxy shared-memory writes before later async-proxy
// accesses (a TMA store or a wgmma reading what st.shared / stmatrix wrote). Pitfall: every
// writing thread needs it, before the barrier that hands the data over; __syncthreads alone is
// not enough.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// A 1-D bulk copy (cp.async.bulk, no tensor map) of `bytes` from global memory to shared
// memory, counted on `bar` like a TMA box. Pitfalls: both addresses 16-byte aligned and `bytes`
// a multiple of 16, and every byte must exist (no out-of-bounds fill, unlike a tensor map).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(smem_u32(dst)),
      "l"(static_cast<uint64_t>(__cvta_generic_to_global(src))), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

// TMA reduce-add: global[box at (x, y, z)] += the box in shared memory at `src` (element type
// and swizzle from the tensor map; fp32 add here), done by the copy engine at the L2, atomic
// per element. Out-of-bounds parts of the box are not written. Asynchronous: bulk_commit closes
// a group; bulk_wait_read<N> waits until the shared-memory source of all but N groups has been
// read (the buffer may be rewritten), bulk_wait<N> until their writes are done. Pitfalls: the
// threads that wrote `src` need fence_proxy_async_shared and a barrier with the issuing thread
// first; only the issuing thread may commit and wait.
__device__ __forceinline__ void tma_reduce_add_3d(const void* tmap, const void* src, int x, int y,
                                                  int z) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group"
      " [%0, {%2, %3, %4}], [%1];\n" ::"l"(reinterpret_cast<uint64_t>(tmap)),
      "r"(smem_u32(src)), "r"(x), "r"(y), "r"(z)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- wgmma: the 4 warps of a warpgroup issue one 64 x N x 16 product together ------------

// Shared-memory matrix descriptor, 128-byte swizzle (PTX ISA "Matrix Descriptor Format"):
//   bits  0-13  start address >> 4        bits 16-29  leading-dimension byte offset >> 4
//   bits 32-45  stride-dimension byte offset >> 4   bits 49-51  base offset (0: the tile
//   starts on a 1024-byte boundary)   bits 62-63  swizzle mode (1 = 128 B).
// For a K-major operand (rows of 64 16-bit elements = 128 bytes, 8-row groups of 1024 bytes):
// SBO = 1024 (next 8 rows), LBO unused (1 by convention); a k16 step inside the 128-byte row
// advances the start address by 32 bytes (the hardware applies the XOR on the final address).
// For an MN-major operand (B = V, N contiguous): LBO = bytes to the next 64-element block along
// N, SBO = 1024 (next 8 rows along K). Pitfall: the swizzle must equal the tensor map's.
__device__ __forceinline__ uint64_t make_desc_sw128(uint32_t saddr, uint32_t lbo_bytes,
                                                    uint32_t sbo_bytes) {
  // EXERCISE BEGIN desc-sw128 [hard]
  // Concept: the wgmma shared-memory matrix descriptor: start address, leading and stride
  // byte offsets, 128-byte swizzle mode.
  //
  // Return the descriptor of the PTX ISA's Matrix Descriptor Format for a tile at shared
  // address saddr with these byte offsets (the table above: the fields and their bits).
  // Addresses and offsets go in 16-byte units, 14 bits each (shared addresses fit in 18
  // bits); swizzle mode 1 = 128 bytes in bits 62-63; base offset 0 (every tile starts on a
  // 1024-byte boundary). Trap: the fields above bit 31 are lost if shifted as 32-bit values.
  return uint64_t((saddr & 0x3FFFF) >> 4) | (uint64_t((lbo_bytes & 0x3FFFF) >> 4) << 16) |
         (uint64_t((sbo_bytes & 0x3FFFF) >> 4) << 32) | (uint64_t(1) << 62);
  // EXERCISE END
}

// The descriptor of the same tile off_bytes further on: make_desc_sw128(a + off, l, s) equals
// desc_advance(make_desc_sw128(a, l, s), off) for off a multiple of 16 while a + off stays
// below 256 KiB (shared memory is at most 228 KiB), since the 14-bit start-address field then
// cannot carry into the next one. A k-step's descriptor is then one 32-bit add; rebuilt from
// its address (mask, shift, OR per field) it took up to six uniform-datapath instructions, and
// a kernel issues dozens per item.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t off_bytes) {
  return (desc & 0xffffffff00000000ull) | uint32_t(uint32_t(desc) + (off_bytes >> 4));
}

// Orders earlier register accesses (of accumulators, and of A fragments) before the next
// wgmma.mma_async reads them. Needed before the first wgmma of a batch whenever ordinary code
// wrote those registers (zeroing, rescaling O, converting P). Pitfall: forgetting it is
// undefined behaviour that usually works, until it does not.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

// Closes a group of the wgmma.mma_async issued so far (like cp.async.commit_group).
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until at most N committed groups are still running. Pitfall: touching an accumulator
// or an A-fragment register of a wgmma before a wait that covers it is undefined behaviour.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Tells the compiler that `r` may change here, so no read or write of it moves across this
// point: placed after wgmma_wait and before wgmma_fence on accumulators, it keeps the
// compiler's own code motion from touching registers the tensor cores still own.
__device__ __forceinline__ void reg_fence(float& r) {
  asm volatile("" : "+f"(r)::"memory");
}
__device__ __forceinline__ void reg_fence(uint32_t& r) {
  asm volatile("" : "+r"(r)::"memory");
}
template <class R, int N>
__device__ __forceinline__ void reg_fence(R (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) reg_fence(r[i]);
}

#define LADDER_WGMMA_D32                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"

#define LADDER_WGMMA_ACC32(d)                                                                     \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

#define LADDER_WGMMA_D64                                                             \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

#define LADDER_WGMMA_ACC64(d)                                                                    \
  LADDER_WGMMA_ACC32(d), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),        \
      "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
      "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), \
      "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), \
      "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

template <class T>
inline constexpr bool kIsBf16 = std::is_same_v<T, __nv_bfloat16>;

// One wgmma statement: the instruction's shape and types, the N / 2 accumulators, then the
// operands, numbered after them (asm strings are literals: one expansion per dtype and N).
#define LADDER_WGMMA_SS(shape_types, D_LIST, ACC, a, b, acc, ta, tb)                \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " acc                              \
               ", 0;\n"                                                             \
               "wgmma.mma_async.sync.aligned." shape_types " " D_LIST ", " a ", " b \
               ", p, 1, 1, " ta ", " tb ";\n}\n"                                    \
               : ACC(d)                                                             \
               : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(kTransA), "n"(kTransB))
#define LADDER_WGMMA_RS(shape_types, D_LIST, ACC, a0, a1, a2, a3, b, acc, tb)                   \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " acc                                          \
               ", 0;\n"                                                                         \
               "wgmma.mma_async.sync.aligned." shape_types " " D_LIST ", {" a0 ", " a1 ", " a2  \
               ", " a3 "}, " b ", p, 1, 1, " tb ";\n}\n"                                        \
               : ACC(d)                                                                         \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)), \
                 "n"(kTransB))

// D (64 x N, fp32) = A B + (accumulate ? D : 0) for the warpgroup, "SS": A (64 x 16) and
// B (16 x N) both from shared memory through descriptors, K-major unless the transpose bits
// (imm-trans-a, imm-trans-b; 16-bit types only) say MN-major. MN-major A is stored [K][M] (M
// contiguous, 64-element rows of 128 bytes, 8-row groups of 1024 bytes): the descriptor is the
// one of an MN-major B (above) with M in place of N; the backward reads dS from a tile stored as
// dS^T [key][query] this way. The instruction only starts the product: wgmma_commit and
// wgmma_wait<> end it. scale-d is a predicate: accumulate = false overwrites D (no zeroing).
template <class T, int N, int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                         bool accumulate) {
  static_assert(N == 64 || N == 128, "the shapes this step uses");
  if constexpr (N == 64 && kIsBf16<T>)
    LADDER_WGMMA_SS("m64n64k16.f32.bf16.bf16", LADDER_WGMMA_D32, LADDER_WGMMA_ACC32, "%32", "%33",
                    "%34", "%35", "%36");
  else if constexpr (N == 64)
    LADDER_WGMMA_SS("m64n64k16.f32.f16.f16", LADDER_WGMMA_D32, LADDER_WGMMA_ACC32, "%32", "%33",
                    "%34", "%35", "%36");
  else if constexpr (kIsBf16<T>)
    LADDER_WGMMA_SS("m64n128k16.f32.bf16.bf16", LADDER_WGMMA_D64, LADDER_WGMMA_ACC64, "%64", "%65",
                    "%66", "%67", "%68");
  else
    LADDER_WGMMA_SS("m64n128k16.f32.f16.f16", LADDER_WGMMA_D64, LADDER_WGMMA_ACC64, "%64", "%65",
                    "%66", "%67", "%68");
}

// The same with A from registers ("RS"): a[0..3] in the A-fragment layout at the top of this
// file. Only B has a transpose bit in this form; kTransB = 1 reads B N-major (V as stored).
// Pitfall: the a[] registers stay owned by the tensor cores until a wait covers this wgmma.
template <class T, int N, int kTransB>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                         bool accumulate) {
  static_assert(N == 64 || N == 128, "the shapes this step uses");
  if constexpr (N == 64 && kIsBf16<T>)
    LADDER_WGMMA_RS("m64n64k16.f32.bf16.bf16", LADDER_WGMMA_D32, LADDER_WGMMA_ACC32, "%32", "%33",
                    "%34", "%35", "%36", "%37", "%38");
  else if constexpr (N == 64)
    LADDER_WGMMA_RS("m64n64k16.f32.f16.f16", LADDER_WGMMA_D32, LADDER_WGMMA_ACC32, "%32", "%33",
                    "%34", "%35", "%36", "%37", "%38");
  else if constexpr (kIsBf16<T>)
    LADDER_WGMMA_RS("m64n128k16.f32.bf16.bf16", LADDER_WGMMA_D64, LADDER_WGMMA_ACC64, "%64", "%65",
                    "%66", "%67", "%68", "%69", "%70");
  else
    LADDER_WGMMA_RS("m64n128k16.f32.f16.f16", LADDER_WGMMA_D64, LADDER_WGMMA_ACC64, "%64", "%65",
                    "%66", "%67", "%68", "%69", "%70");
}

// ---- registers, barriers, election -------------------------------------------------------

// setmaxnreg: the executing warpgroup's per-thread register limit becomes N (a multiple of 8 in
// 24..256). dec returns registers to the block's pool, inc waits until the pool can give them.
// Pitfalls: all 128 threads of the warpgroup must execute it; it only takes effect when the
// kernel has a register cap at launch (__launch_bounds__(threads, 1)), and ptxas says C7508
// when it ignores it; the sum over warpgroups must fit the 64K-register file.
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Named barrier `id` (1..15; 0 is __syncthreads) for `nthreads` threads (a multiple of 32):
// bar_sync waits for all of them, bar_arrive counts this warp in and goes on. Pitfalls: every
// thread of a warp must execute it; a warp must not arrive twice on the same barrier before
// that barrier completes.
__device__ __forceinline__ void bar_sync(int id, int nthreads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int nthreads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}

// True in exactly one lane of the (fully active) warp: the lane elect.sync picks.
__device__ __forceinline__ bool elect_one() {
  uint32_t pred;
  asm volatile("{\n.reg .pred p;\nelect.sync _|p, 0xffffffff;\nselp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(pred));
  return pred != 0;
}

// ---- arithmetic --------------------------------------------------------------------------

// 2^x on the special-function unit; ex2.approx(-inf) = +0, which the masking relies on.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The online softmax's rescale exp2((m_old - m_new) c) for running maxima of raw scores and
// c = scale log2(e) > 0. The difference is taken first, so alpha is exactly 1 when the max
// did not change: m_old c - fl(m_new c) contracts to an FMA that keeps fl's rounding error,
// and an alpha of 2^eps would scale l at every later tile, so LSE would drift with seq_k.
// A row with nothing visible yet (m_new = -inf) gets 0, not exp2(NaN).
__device__ __forceinline__ float rescale_factor(float m_old, float m_new, float c) {
  if constexpr (ladder::kFaultRescale)  // the fault build's defect (common/fault.hpp)
    return fast_exp2(fmaf(m_old, c, -(m_new == -INFINITY ? 0.f : __fmul_rn(m_new, c))));
  return m_new == -INFINITY ? 0.f : fast_exp2((m_old - m_new) * c);
}

// Two floats rounded to T and packed into one .b32 register, `lo` in the low half (the
// element with the lower column index, as the A fragment expects).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (kIsBf16<T>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// Two packed 16-bit values (pack2's layout) back to fp32, low half first.
template <class T>
__device__ __forceinline__ float2 unpack2(uint32_t v) {
  if constexpr (kIsBf16<T>)
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
  else
    return __half22float2(*reinterpret_cast<const __half2*>(&v));
}

// The transpose of an 8x8 matrix of 16-bit values held in the fragment layout (lane (g, t)
// holds row g, columns 2t and 2t + 1, the lower column in the low half): afterwards lane (g, t)
// holds (2t, g) in its low half and (2t + 1, g) in its high half (movmatrix, one instruction).
__device__ __forceinline__ uint32_t transpose_b16(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// Four 8x8 matrices of 16-bit values from the fragment layout to shared memory, one instruction
// (stmatrix): register m of lane (g, t) holds row g, columns 2t and 2t + 1 of matrix m; lane l
// gives the address of row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned).
__device__ __forceinline__ void stmatrix_x4(uint32_t row_addr, uint32_t m0, uint32_t m1,
                                            uint32_t m2, uint32_t m3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(row_addr),
               "r"(m0), "r"(m1), "r"(m2), "r"(m3)
               : "memory");
}

// Nanoseconds since an arbitrary epoch, one clock for the whole GPU (the trace build).
__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

}  // namespace ladder::hopper
