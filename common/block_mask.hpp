// Block-sparse masks (docs/CONTRACT.md, "Block-sparse masks"): which (query block, key block)
// pairs of S are computed. A mask is [B or 1, H or 1, ceil(M / Bm), ceil(N / Bn)] bytes of 0/1
// (a dimension of 1 is shared by every batch or head); key j is visible to query i iff the
// causal rule allows it and the block of (i, j) is kept. Generated masks (random:RHO, local:W)
// come from a seeded SplitMix64, the same in C++ and in tools/peers.py.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "problem.hpp"
#include "tensor.hpp"

namespace ladder {

struct BlockMask {
  int64_t batch = 0, heads = 0;        // 1: shared by every batch / head
  int64_t q_blocks = 0, k_blocks = 0;  // ceil(M / Bm), ceil(N / Bn)
  int64_t block_q = 0, block_k = 0;    // Bm, Bn
  std::vector<uint8_t> keep;           // [batch, heads, q_blocks, k_blocks]

  bool empty() const { return keep.empty(); }
  bool at(int64_t b, int64_t h, int64_t I, int64_t J) const {
    return keep[size_t((((batch == 1 ? 0 : b) * heads + (heads == 1 ? 0 : h)) * q_blocks + I) *
                           k_blocks +
                       J)] != 0;
  }
  // Whether key j is visible to query i of head (b, h) by the mask alone (causal aside).
  bool visible(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return empty() || at(b, h, i / block_q, j / block_k);
  }
  // Kept blocks over all blocks (1 for an empty mask): the FLOP count's factor.
  double density() const;
  std::string shape_str() const;
};

// The SplitMix64 finaliser and the mask generators.
uint64_t splitmix64_mix(uint64_t z);
// The mask a problem asks for: random:RHO or local:W (generated, [B, H, ...] or [1, 1, ...]),
// or an empty mask when p.sparsity is none or file (a file is read by block_mask_from).
BlockMask make_block_mask(const Problem& p);
// A mask read from a .npy file (values already checked to be 0/1), checked against p's shape.
// Throws BadInput naming the expected shape.
BlockMask block_mask_from(const Tensor& t, const Problem& p, const std::string& path);

// Per (b, h, query block I) the kept key blocks in ascending order, as a CSR list over the
// mask's own [batch, heads, q_blocks] rows (count[r], then index[r * k_blocks + n] for n <
// count[r]); and per (b, h, key block J) the kept query blocks (for a backward that walks K/V
// tiles). Steps hand these to their kernels so that skipped blocks cost nothing.
struct BlockLists {
  std::vector<int32_t> count, index;
};
BlockLists kv_block_lists(const BlockMask& m);
BlockLists q_block_lists(const BlockMask& m);
// The lists' bytes (int32 counts and indices) for p's mask, at most: the kv lists, and with a
// backward the q lists too; a mask shared by every batch or head (first dimensions of 1) needs
// fewer. 0 for a dense problem. What a step that takes the lists counts as workspace.
double block_list_bytes(const Problem& p);

}  // namespace ladder
