// SPDX-License-Identifier: MIT (LICENSE). Implements the published Philox4x32-10 generator
// (Salmon, Moraes, Dror, Shaw, SC 2011) from its specification.
// Dropout's random mask Z, the same in every rung, tiling, loop order and pass
// (docs/CONTRACT.md, "Dropout"). Z is never stored: every pass that needs Z_ij regenerates it
// from (seed, b, h, i, j) with Philox4x32-10, a counter-based generator (Salmon, Moraes, Dror,
// Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011).
//
// The index-to-counter mapping follows the tensor-core accumulator layout (mma.sync m16n8
// C fragments, and wgmma's, which repeat them per warp): within each 16 x 16 block of S, lane
// (g, t) = (lane / 4, lane % 4) of a warp holds rows {g, g+8} x columns {2t, 2t+1, 2t+8, 2t+9}.
// One Philox call (128 bits) yields 16 8-bit uniforms: that lane's 8 elements of two 16 x 16
// blocks side by side (keys 32 J .. 32 J + 31). For (b, h, i, j):
//   I = i / 16, r = i % 16, J = j / 32, e = (j / 16) % 2, c = j % 16
//   lane = (r % 8) * 4 + (c % 8) / 2
//   (w0, w1, w2, w3) = Philox4x32-10(counter = (32 J + lane, I, h, b), key = (seed lo, seed hi))
//   k = (r / 8) * 4 + (c / 8) * 2 + c % 2,   u = byte e of 16-bit half k % 2 of word w[k / 2]
//   Z_ij = 1 (kept) iff u >= t, t = min(255, round(p * 256))
// A 16-bit half thus holds one position of both blocks (byte e = block e), so a transpose of
// 16-bit halves (the backward's movmatrix) carries both blocks' uniforms together.
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

// The keep threshold: an 8-bit uniform u keeps its element iff u >= threshold(p).
LADDER_HD uint32_t threshold(double p) {
  const double t = p * 256.0 + 0.5;
  return t >= 255.0 ? 255u : uint32_t(t);
}

// The Philox call that holds element (i, j) of head (b, h): its counter's first two words, the
// 16-bit half k in 0..7 of the result and the byte e in 0..1 of that half.
struct Slot {
  uint32_t c0, c1, k, e;
};
LADDER_HD Slot slot(int64_t i, int64_t j) {
  const uint32_t r = uint32_t(i & 15), c = uint32_t(j & 15);
  const uint32_t lane = (r & 7u) * 4u + ((c & 7u) >> 1);
  return Slot{uint32_t(j >> 5) * 32u + lane, uint32_t(i >> 4),
              (r >> 3) * 4u + (c >> 3) * 2u + (c & 1u), uint32_t(j >> 4) & 1u};
}

// Block e's two 8-bit uniforms in a Philox word, each at the bottom of its 16-bit half (a half
// holds one position of both blocks, byte e for block e): for kernels that compare halves.
LADDER_HD uint32_t block_uniforms(uint32_t w, uint32_t e) {
  return (w >> (8u * e)) & 0x00ff00ffu;
}

// The 8-bit uniform of half k, byte e of a Philox result.
LADDER_HD uint32_t uniform(const Philox4& x, uint32_t k, uint32_t e) {
  return (x.w[k >> 1] >> (16u * (k & 1u) + 8u * e)) & 0xffu;
}

// Z_ij for (b, h, i, j): one Philox call per element (the CPU rungs and the oracle; kernels
// call philox() once per 16 x 32 block and use all 16 bytes).
LADDER_HD bool keep(uint64_t seed, uint32_t thresh, int64_t b, int64_t h, int64_t i, int64_t j) {
  const Slot s = slot(i, j);
  const Philox4 x =
      philox(s.c0, s.c1, uint32_t(h), uint32_t(b), uint32_t(seed), uint32_t(seed >> 32));
  return uniform(x, s.k, s.e) >= thresh;
}

// Four keep decisions at once, for kernels that hold a Philox word and want all of its bytes:
// the msb of byte n of the result is set iff byte n of w >= t (t4 = t in every byte; the other
// bits are meaningless). The borrow-free bytewise subtraction (w | 0x80..) - (t4 & 0x7f..)
// gives the low 7 bits' comparison in each msb; the msbs of w and t4 decide the rest.
LADDER_HD uint32_t kept_msb(uint32_t w, uint32_t t4) {
  const uint32_t low7 = (w | 0x80808080u) - (t4 & 0x7f7f7f7fu);
  return (w & ~t4) | (~(w ^ t4) & low7);
}

// The AND mask of a pair of 16-bit values from kept_msb's flags f: 0xffff in the low half iff
// byte lo's msb is set, in the high half iff byte hi's is (one prmt on the GPU: a selector
// nibble of 8 + n replicates the msb of byte n).
LADDER_HD uint32_t pair_mask(uint32_t f, uint32_t lo, uint32_t hi) {
#if defined(__CUDA_ARCH__)
  const uint32_t sel = (8u | lo) * 0x11u | (8u | hi) * 0x1100u;
  uint32_t m;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(m) : "r"(f), "r"(sel));
  return m;
#else
  const uint32_t l = (f >> (8 * lo + 7)) & 1u, h = (f >> (8 * hi + 7)) & 1u;
  return (l ? 0x0000ffffu : 0u) | (h ? 0xffff0000u : 0u);
#endif
}

}  // namespace ladder::dropout

namespace ladder::dropout {

// Z for keys [0, n) of row i of head (b, h) into keep[0, n): the four Philox calls that cover
// each 32 keys of the row (lanes (i % 8) * 4 + t, t = 0..3), each giving 8 of the row's keys.
inline void keep_row(uint64_t seed, uint32_t thresh, int64_t b, int64_t h, int64_t i, int64_t n,
                     unsigned char* keep) {
  const uint32_t r = uint32_t(i & 15);
  for (int64_t j0 = 0; j0 < n; j0 += 32)
    for (uint32_t t = 0; t < 4; ++t) {
      const Slot s = slot(i, j0 + 2 * t);
      const Philox4 x =
          philox(s.c0, s.c1, uint32_t(h), uint32_t(b), uint32_t(seed), uint32_t(seed >> 32));
      for (uint32_t e = 0; e < 2; ++e)
        for (uint32_t c : {2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9}) {
          if (j0 + 16 * e + c >= n) continue;
          keep[j0 + 16 * e + c] = uniform(x, (r >> 3) * 4u + (c >> 3) * 2u + (c & 1u), e) >= thresh;
        }
    }
}

}  // namespace ladder::dropout
