// The tensor-core vocabulary of step 06, shared by its forward and backward kernels:
// mma.sync m16n8k16, ldmatrix, movmatrix, cp.async, ex2, and the XOR-swizzled shared-memory
// layout.
//
// clang-format off
// Fragment layouts of mma.sync.m16n8k16 (PTX ISA, "Matrix fragments for mma.m16n8k16").
// A warp's lane l is split as g = l / 4 (groupID, 0..7) and t = l % 4 (thread in group):
//   A (16x16, row-major), 4 x .b32, each two consecutive 16-bit elements (lower column low):
//     a[0] = A[g][2t, 2t+1]      a[1] = A[g+8][2t, 2t+1]
//     a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]
//   B (16x8, "col"), 2 x .b32:   b[0] = B[2t, 2t+1][g]   b[1] = B[2t+8, 2t+9][g]
//   C/D (16x8, fp32), 4 floats:  c[0], c[1] = C[g][2t, 2t+1]   c[2], c[3] = C[g+8][2t, 2t+1]
// clang-format on
// ldmatrix.x4 loads four 8x8 matrices of 16-bit elements: lanes 8m..8m+7 give the addresses of
// the 8 rows of matrix m (16 bytes each), and register m of lane l receives row l/4, columns
// 2(l%4), 2(l%4)+1 of matrix m; with .trans it receives column l/4, rows 2(l%4), 2(l%4)+1.
// So a row-major 8x8 block lands exactly as an A (or, for [n][k] storage, a B) fragment needs,
// and .trans turns a [k][n] (row-major V) block into a B fragment without a transpose in memory.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "exercise.hpp"
#include "fault.hpp"

namespace ladder::step06 {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The "memory" clobbers keep the compiler from moving these past ordinary shared-memory
// accesses and barriers; ptxas still schedules the instructions themselves.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row_addr))
               : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row_addr))
               : "memory");
}

// D = A B + D on the tensor cores, fp32 accumulation; T is bf16 or fp16 (the PTX type name).
#define LADDER_MMA_16816(type)                                                          \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." type "." type                   \
               ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                         \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "bf16 or fp16");
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    LADDER_MMA_16816("bf16");
  else
    LADDER_MMA_16816("f16");
}
#undef LADDER_MMA_16816

// Two floats rounded to T and packed into one .b32 register, `lo` in the low half (the
// element with the lower column index, as the A fragment and ldmatrix both expect).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 16-byte global -> shared copy that bypasses L1 (.cg) and the register file. With
// `valid` false nothing is read and the 16 bytes are zero-filled (src-size 0), so rows
// past the end of a sequence arrive as zeros; `src` must still be a mapped address.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem_dst)),
               "l"(gmem_src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits for every cp.async group this thread committed (other threads' copies become
// visible only after a __syncthreads that follows their own wait).
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// 4-byte copy for the backward's per-row LSE and D (fp32 rows need not be 16-byte aligned).
// .ca: the 16-byte-only .cg form does not exist at this size. `valid` false: zero-fill.
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(smem_dst)),
               "l"(gmem_src), "r"(valid ? 4 : 0)
               : "memory");
}

// The inverse of pack2: the two T values of a .b32 register as floats (exact).
template <class T>
__device__ __forceinline__ float2 unpack2(uint32_t v);

template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t v) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
}

template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t v) {
  return __half22float2(*reinterpret_cast<const __half2*>(&v));
}

// The transpose of an 8x8 matrix of 16-bit values held in the fragment layout above (lane (g, t)
// holds row g, columns 2t and 2t + 1, the lower column in the low half): the result is the
// transposed matrix in the same layout, so lane (g, t) receives (2t, g) in its low half and
// (2t + 1, g) in its high half. One instruction (movmatrix, sm_75+) instead of two shuffles
// and a byte permute.
__device__ __forceinline__ uint32_t transpose_b16(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

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

// A tile of rows of kCols 16-bit elements in shared memory, row-major in 16-byte chunks
// (8 elements). Shared memory has 32 banks of 4 bytes: 8 chunks of 16 bytes per 128-byte
// wavefront. ldmatrix reads 8 rows at the same column chunk; with rows of 128 bytes or a
// multiple (d >= 64) those 8 chunks all sit in the same 4 banks: an 8-way conflict.
// The swizzle stores chunk c of row r at chunk c ^ chunk_xor(r), so that the 8 rows of any
// 8-row group (rows 8q..8q+7) fall in 8 different bank groups, and a chunk never leaves its
// row. Rows of 8k chunks (d = 64, 128, 256; Bc = 64, 128) and of 8k + 4 chunks (d = 32, 96)
// need different XORs.
template <int kCols, bool kSwizzle>
struct SmemLayout {
  static constexpr int kChunks = kCols / 8;
  static_assert(kCols % 8 == 0 && kChunks % 4 == 0, "rows must be a multiple of 4 chunks");
  __device__ __forceinline__ static int chunk_xor(int row) {
    if constexpr (!kSwizzle) return 0;
    // EXERCISE BEGIN swizzle [hard]
    // Concept: the XOR swizzle: a bijection on a row's 16-byte chunks that puts the 8 rows an
    // ldmatrix phase reads in 8 different bank groups.
    //
    // Return the XOR applied to the chunk index of row `row` (rows of kChunks 16-byte chunks,
    // kChunks a multiple of 4). An ldmatrix phase reads one chunk from each of 8 consecutive
    // rows; a 128-byte wavefront holds 8 chunks. Without the XOR, rows of 128 bytes or a
    // multiple put the same column chunk of all 8 rows in the same 4 banks. The XOR must keep
    // the chunk inside its row (result < kChunks) and spread the 8 rows over 8 bank groups.
    // Trap: rows of 8k + 4 chunks already alternate halves of a wavefront: what is left to
    // spread? The grade catches only a chunk that leaves its row: a conflicted XOR passes it
    // and shows in ncu's bank conflicts instead (notes/06_tensor_core_fa2.md, Exercise 3).
    return kChunks % 8 == 0 ? (row & 7) : ((row >> 1) & 3);
    // EXERCISE END
  }
  // Element offset of (row, col).
  __device__ __forceinline__ static int at(int row, int col) {
    return row * kCols + (((col >> 3) ^ chunk_xor(row)) << 3) + (col & 7);
  }
};

}  // namespace ladder::step06
