// Rung 07's kernel pieces that the forward and the backward share: the tile and warpgroup
// constants, the register split, the named-barrier ids, the softmax and dropout parameters both
// kernels read, and the two GEMM issue loops over 128-byte swizzled tiles. Included by
// fwd_params.cuh and bwd_params.cuh (device code in an unnamed namespace).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "dropout.hpp"
#include "hopper.cuh"

namespace ladder::fa3 {
namespace {

using namespace ladder::hopper;

constexpr int kBc = 128;  // keys per K/V tile
constexpr int kWGThreads = 128;
// A tile in shared memory is d / 64 "column halves" of [rows][64] 16-bit elements, each on a
// 1024-byte boundary, its rows of 128 bytes in the TMA's 128-byte swizzle (16-byte chunk c of
// row r at chunk c ^ (r mod 8)): what the TMA writes and the wgmma descriptors read (hopper.cuh).
constexpr int kRowBytes = 128;  // one swizzled row: 64 16-bit elements (or 32 floats)

// Register split of the warp-specialised kernels (setmaxnreg): the producer keeps 24, the
// consumers take the rest. Two consumers: 128 x 24 + 256 x 240 = 64512; three: 128 x 24 +
// 384 x 160 = 64512; both <= 65536. At launch __launch_bounds__(threads, 1) gives every thread
// 65536 / threads (168 for 384 threads, 128 for 512).
constexpr int kProducerRegs = 24;
constexpr int consumer_regs(int consumers) {
  return consumers == 2 ? 240 : 160;
}
static_assert(kWGThreads * (kProducerRegs + 2 * consumer_regs(2)) <= 65536, "register file");
static_assert(kWGThreads * (kProducerRegs + 3 * consumer_regs(3)) <= 65536, "register file");

// Named barrier ids (0 is __syncthreads), one list for both kernels. Forward: the ping-pong turn
// of consumer c waits on kBarSched + c, the epilogue of consumer c syncs its 128 threads on
// kBarEpilogue + c (c < 3). Backward: kBarDS, both consumers wrote their dS^T.
enum NamedBarrier : int { kBarSched = 1, kBarEpilogue = kBarSched + 3, kBarDS = 1 };

// The softmax scale, the causal flag and dropout, as both kernels read them (parameter space).
struct ScoreParams {
  float scale, scale_log2;  // tau and tau log2(e), tau > 0
  int causal;
  // dropout (kExtras kernels): keep iff the 8-bit uniform >= threshold; rescale = 1 / (1 - p)
  int dropout;
  uint32_t drop_threshold, seed_lo, seed_hi;
  float drop_rescale;
};
inline ScoreParams score_params(float scale, bool causal, float dropout_p, uint64_t seed) {
  ScoreParams s;
  s.scale = scale;
  s.scale_log2 = float(double(scale) * 1.4426950408889634);
  s.causal = causal ? 1 : 0;
  s.dropout = dropout_p > 0.f ? 1 : 0;
  s.drop_threshold = dropout::threshold(dropout_p);
  s.drop_rescale = float(1.0 / (1.0 - double(dropout_p)));
  s.seed_lo = uint32_t(seed & 0xffffffffu), s.seed_hi = uint32_t(seed >> 32);
  return s;
}

// The dynamic shared memory's base, rounded up to 1024 bytes (kDynamic has the slack).
__device__ __forceinline__ unsigned char* align_1024(unsigned char* raw) {
  return raw + ((1024 - (smem_u32(raw) & 1023)) & 1023);
}

// acc (64 x kN) = A B^T, committed: A = 64 rows of a [kARows][D] tile, B = a [kN][D] tile, both
// K-major as stored: d / 16 k-steps of 32 bytes inside a 128-byte row, the next 64 dims one
// column half (kARows or kN rows) further. The forward's S = Q K^T, the backward's S^T = K Q^T
// and dP^T = V dO^T.
template <class T, int D, int kARows, int kN>
__device__ __forceinline__ void issue_abt(float (&acc)[kN / 2], uint32_t a_rows, uint32_t b_tile) {
  reg_fence(acc);
  wgmma_fence();
  const uint64_t a0 = make_desc_sw128(a_rows, 16, 1024), b0 = make_desc_sw128(b_tile, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t col = (kk % 4) * 32;
    const uint64_t da = desc_advance(a0, (kk / 4) * (kARows * kRowBytes) + col);
    const uint64_t db = desc_advance(b0, (kk / 4) * (kN * kRowBytes) + col);
    wgmma_ss<T, kN, 0, 0>(acc, da, db, kk > 0);
  }
  wgmma_commit();
}

// acc (64 x D) += A B: A (64 x kK) from registers, B = a [kK][D] tile read N-major (the
// transpose bit): k-step kk = rows 16kk.. (2048 bytes further), the next 64 columns one column
// half (kK rows) away. No fence, no commit (the caller's). The forward's O += P V, the
// backward's dV += P^T dO and dK += dS^T Q.
template <class T, int D, int kK>
__device__ __forceinline__ void issue_rs(float (&acc)[D / 2], const uint32_t (&a)[kK / 16][4],
                                         uint32_t b_tile) {
  const uint64_t b0 = make_desc_sw128(b_tile, kK * kRowBytes, 1024);
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk)
    wgmma_rs<T, D, 1>(acc, a[kk], desc_advance(b0, kk * 16 * kRowBytes), true);
}

}  // namespace
}  // namespace ladder::fa3
