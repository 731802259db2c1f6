// Dropout's generator (common/dropout.hpp) against the contract, independently:
//  - Philox4x32-10's known answers (Random123's kat_vectors);
//  - the index-to-counter mapping, written here again from docs/CONTRACT.md's formulas;
//  - keep_row (four calls per 32 keys) equals keep (one call per element);
//  - statistics: the kept fraction within 4 sigma of the contract's 1 - t / 256; two seeds draw
//    different masks; p = 0 keeps everything; the fragment property (one call = one lane's 16
//    elements of a 16 x 32 block);
//  - the kernels' four-at-a-time decisions (kept_msb, pair_mask) equal the bytewise compare.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "dropout.hpp"

using namespace ladder;

namespace {
// The contract's mapping, from the text: counter (32 J + lane, I, h, b), key (seed lo, hi).
bool contract_keep(uint64_t seed, double p, int64_t b, int64_t h, int64_t i, int64_t j) {
  const int64_t I = i / 16, r = i % 16, J = j / 32, e = (j / 16) % 2, c = j % 16;
  const uint32_t lane = uint32_t((r % 8) * 4 + (c % 8) / 2);
  const dropout::Philox4 w =
      dropout::philox(uint32_t(32 * J) + lane, uint32_t(I), uint32_t(h), uint32_t(b),
                      uint32_t(seed & 0xffffffffu), uint32_t(seed >> 32));
  const int k = int((r / 8) * 4 + (c / 8) * 2 + c % 2);
  const uint32_t u = (w.w[k / 2] >> (16 * (k % 2) + 8 * e)) & 0xffu;
  const double t = std::floor(p * 256 + 0.5);
  return double(u) >= (t > 255 ? 255 : t);
}
}  // namespace

TEST_CASE("dropout: Philox4x32-10 known answers", "[dropout]") {
  struct Kat {
    uint32_t c[4], k[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& k : kats) {
    const dropout::Philox4 x = dropout::philox(k.c[0], k.c[1], k.c[2], k.c[3], k.k[0], k.k[1]);
    for (int i = 0; i < 4; ++i) CHECK(x.w[i] == k.out[i]);
  }
}

TEST_CASE("dropout: keep, keep_row and the contract's formula agree", "[dropout]") {
  const uint64_t seed = 0x123456789abcdef0ull;
  for (double p : {0.0, 0.1, 0.5, 0.9}) {
    const uint32_t t = dropout::threshold(p);
    for (int64_t b : {0, 3})
      for (int64_t h : {0, 5})
        for (int64_t i : {0, 7, 8, 15, 16, 33, 1000}) {
          std::vector<unsigned char> row(77);
          dropout::keep_row(seed, t, b, h, i, 77, row.data());
          for (int64_t j = 0; j < 77; ++j) {
            INFO("p " << p << " b " << b << " h " << h << " i " << i << " j " << j);
            const bool k = dropout::keep(seed, t, b, h, i, j);
            REQUIRE(k == contract_keep(seed, p, b, h, i, j));
            REQUIRE(bool(row[size_t(j)]) == k);
          }
        }
  }
}

TEST_CASE("dropout: one Philox call covers one lane's 16 elements of a 16x32 block", "[dropout]") {
  // Lane (g, t) of an mma C fragment holds rows {g, g+8} x cols {2t, 2t+1, 2t+8, 2t+9} of
  // each 16 x 16 block; keys 32 * 5 .. 32 * 5 + 31 are two such blocks.
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    std::set<uint32_t> slots;
    for (int e : {0, 1})
      for (int r : {g, g + 8})
        for (int c : {2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9}) {
          const dropout::Slot s = dropout::slot(16 * 3 + r, 32 * 5 + 16 * e + c);
          CHECK(s.c0 == uint32_t(5 * 32 + lane));  // the same counter for all 16 ...
          CHECK(s.c1 == 3u);
          CHECK(s.e == uint32_t(e));
          slots.insert(s.k * 2 + s.e);
        }
    CHECK(slots.size() == 16);  // ... and 16 different bytes of it
  }
}

TEST_CASE("dropout: kept_msb and pair_mask decide as the bytewise compare", "[dropout]") {
  uint32_t x = 0x9e3779b9u;  // xorshift words, plus the edge bytes 0, t - 1, t, 255
  for (uint32_t t = 0; t < 256; ++t) {
    const uint32_t t4 = t * 0x01010101u;
    for (int n = 0; n < 64; ++n) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      const uint32_t edge[4] = {0u, t ? t - 1 : 0u, t, 255u};
      const uint32_t w = n < 16 ? edge[n % 4] | edge[(n / 4) % 4] << 8 | edge[n % 3] << 16 |
                                      edge[(n + 1) % 4] << 24
                                : x;
      const uint32_t f = dropout::kept_msb(w, t4);
      for (uint32_t lo = 0; lo < 4; ++lo)
        for (uint32_t hi = 0; hi < 4; ++hi) {
          INFO("t " << t << " w " << std::hex << w << " bytes " << lo << ", " << hi);
          const bool kl = ((w >> (8 * lo)) & 0xffu) >= t, kh = ((w >> (8 * hi)) & 0xffu) >= t;
          REQUIRE(dropout::pair_mask(f, lo, hi) ==
                  ((kl ? 0x0000ffffu : 0u) | (kh ? 0xffff0000u : 0u)));
        }
    }
  }
}

TEST_CASE("dropout: kept fraction, seeds and p = 0", "[dropout]") {
  for (double p : {0.1, 0.5}) {
    const uint32_t t = dropout::threshold(p);
    int64_t kept = 0, differ = 0, n = 0;
    std::vector<unsigned char> a(4096), b(4096);
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t i = 0; i < 512; ++i) {
        dropout::keep_row(1, t, 0, h, i, 4096, a.data());
        dropout::keep_row(2, t, 0, h, i, 4096, b.data());
        for (int64_t j = 0; j < 4096; ++j) {
          kept += a[size_t(j)];
          differ += a[size_t(j)] != b[size_t(j)];
        }
        n += 4096;
      }
    // The contract's keep probability: 1 - t / 256 (within 2^-9 of 1 - p).
    const double keep = 1 - t / 256.0, sigma = std::sqrt(keep * (1 - keep) / double(n));
    const double frac = double(kept) / double(n);
    INFO("p " << p << ": kept " << frac << " of " << n << ", sigma " << sigma);
    CHECK(std::fabs(frac - keep) < 4 * sigma);
    CHECK(std::fabs(keep - (1 - p)) <= 1.0 / 512);
    // Two seeds: the masks differ where independent draws would, 2 p (1 - p) of the time.
    const double want = 2 * keep * (1 - keep), got = double(differ) / double(n);
    CHECK(std::fabs(got - want) < 4 * std::sqrt(want * (1 - want) / double(n)));
  }
  std::vector<unsigned char> row(300);
  dropout::keep_row(9, dropout::threshold(0.0), 1, 2, 3, 300, row.data());
  for (unsigned char k : row) CHECK(k == 1);
}
