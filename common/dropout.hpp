// SPDX-License-Identifier: MIT (LICENSE). Implements the published Philox4x32-10 generator
// (Salmon, Moraes, Dror, Shaw, SC 2011) from its specification.
// Dropout's random mask Z, the same in every rung, tiling, loop order and pass
// (docs/CONTRACT.md, "Dropout"). Z is never stored: every pass that needs Z_ij regenerates it
// from (seed, b, h, i, j) with Philox4x32-10, a counter-based generator (Salmon, Moraes, Dror,
// Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011).
//
// The index-to-counter mapping follows the tensor-core accumulator layout (mma.sync m16n8
// C fragments, and wgmma's, which repeat them per warp): within each 16 x 16 block of S, lane
// (g, t) = (lane / 4, lane % 4) of a warp holds rows {g, g+8} x columns {2t, 2t+1, 2t+8, 2t+9},
// and one Philox call yields exactly those 8 elements as 16-bit uniforms. For (b, h, i, j):
//   I = i / 16, r = i % 16, J = j / 16, c = j % 16, lane = (r % 8) * 4 + (c % 8) / 2
//   (w0, w1, w2, w3) = Philox4x32-10(counter = (32 J + lane, I, h, b), key = (seed lo, seed hi))
//   k = (r / 8) * 4 + (c / 8) * 2 + c % 2,   u = 16-bit half k % 2 of word w[k / 2]
//   Z_ij = 1 (kept) iff u >= t, t = min(65535, round(p * 65536))
// Host and device code (CPU rungs, the oracle, the CUDA kernels) all include this header.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define LADDER_HD __host__ __device__ __forceinline__
#else
#define LADDER_HD inline
#endif

namespace ladder::dropout {

struct Philox4 {
  uint32_t w[4];
};

// Philox4x32-10: ten rounds of two 32x32 -> 64-bit multiplies, the key bumped by the Weyl
// constants between rounds.
LADDER_HD Philox4 philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                         uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(kM0) * c0, p1 = uint64_t(kM1) * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// The keep threshold: a 16-bit uniform u keeps its element iff u >= threshold(p).
LADDER_HD uint32_t threshold(double p) {
  const double t = p * 65536.0 + 0.5;
  return t >= 65535.0 ? 65535u : uint32_t(t);
}

// The Philox call that holds element (i, j) of head (b, h): its counter's first word and the
// 16-bit slot k in 0..7 of the result.
struct Slot {
  uint32_t c0, c1, k;
};
LADDER_HD Slot slot(int64_t i, int64_t j) {
  const uint32_t r = uint32_t(i & 15), c = uint32_t(j & 15);
  const uint32_t lane = (r & 7u) * 4u + ((c & 7u) >> 1);
  return Slot{uint32_t(j >> 4) * 32u + lane, uint32_t(i >> 4),
              (r >> 3) * 4u + (c >> 3) * 2u + (c & 1u)};
}

// The 16-bit uniform of slot k of a Philox result.
LADDER_HD uint32_t half(const Philox4& x, uint32_t k) {
  return (x.w[k >> 1] >> (16u * (k & 1u))) & 0xffffu;
}

// Z_ij for (b, h, i, j): one Philox call per element (the CPU rungs and the oracle; kernels
// call philox() once per 16 x 16 block and use all 8 halves).
LADDER_HD bool keep(uint64_t seed, uint32_t thresh, int64_t b, int64_t h, int64_t i, int64_t j) {
  const Slot s = slot(i, j);
  const Philox4 x =
      philox(s.c0, s.c1, uint32_t(h), uint32_t(b), uint32_t(seed), uint32_t(seed >> 32));
  return half(x, s.k) >= thresh;
}

}  // namespace ladder::dropout

namespace ladder::dropout {

// Z for keys [0, n) of row i of head (b, h) into keep[0, n): the four Philox calls that cover
// each 16 keys of the row (lanes (i % 8) * 4 + t, t = 0..3), each giving 4 of the row's keys.
inline void keep_row(uint64_t seed, uint32_t thresh, int64_t b, int64_t h, int64_t i, int64_t n,
                     unsigned char* keep) {
  const uint32_t r = uint32_t(i & 15);
  for (int64_t j0 = 0; j0 < n; j0 += 16)
    for (uint32_t t = 0; t < 4; ++t) {
      const Slot s = slot(i, j0 + 2 * t);
      const Philox4 x =
          philox(s.c0, s.c1, uint32_t(h), uint32_t(b), uint32_t(seed), uint32_t(seed >> 32));
      for (uint32_t c : {2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9}) {
        if (j0 + c >= n) continue;
        keep[j0 + c] = half(x, (r >> 3) * 4u + (c >> 3) * 2u + (c & 1u)) >= thresh;
      }
    }
}

}  // namespace ladder::dropout
