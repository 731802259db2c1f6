// One attention problem: the shapes, mask and precision every step agrees on
// (docs/CONTRACT.md, "Semantics").
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

#include "dtype.hpp"

namespace ladder {

// The contract's size limits: every extent fits in 31 bits, every tensor (Q, K, V, their
// gradients) has at most 2^48 elements, and the score matrix B*H*M*N at most 2^62, so that
// 64-bit index arithmetic never wraps. Steps with 32-bit indices state smaller limits in their
// descriptors; memory is checked separately (runner/program.cpp).
constexpr int64_t kMaxExtent = (int64_t(1) << 31) - 1;
constexpr int64_t kMaxTensorElems = int64_t(1) << 48;
constexpr int64_t kMaxScoreElems = int64_t(1) << 62;

// Which (query block, key block) pairs are computed (docs/CONTRACT.md, "Block-sparse masks").
struct BlockSparsity {
  enum class Kind { none, file, random, local };
  Kind kind = Kind::none;
  double density = 1;                    // random: the probability that a block is kept
  int64_t width = 0;                     // local: key blocks per band
  std::string file;                      // file: the .npy holding the mask
  int64_t block_q = 128, block_k = 128;  // Bm x Bn, the mask's block
  bool active() const { return kind != Kind::none; }
  std::string describe() const;  // "random:0.25 (128x128)"
};

struct Problem {
  int64_t batch = 1, heads = 8, heads_kv = 8, seq_q = 512, seq_k = 512, dim = 64;
  bool causal = false;
  double scale = 0.0;  // 0 means 1/sqrt(dim)
  DType dtype = DType::f32;
  uint64_t seed = 0;
  bool backward = false;
  double dropout = 0.0;       // rate p in [0, 1): a kept P_ij is scaled by 1 / (1 - p)
  uint64_t dropout_seed = 0;  // the key of the dropout generator
  BlockSparsity sparsity;

  double softmax_scale() const { return scale != 0.0 ? scale : 1.0 / std::sqrt(double(dim)); }
  // Bottom-right causal mask: key j is visible to query i iff j <= i + seq_k - seq_q.
  // Returns how many keys row i sees (0 for a fully masked row), before any block mask.
  int64_t visible_keys(int64_t i) const {
    if (!causal) return seq_k;
    const int64_t last = i + seq_k - seq_q;  // last visible key index
    return last < 0 ? 0 : (last + 1 < seq_k ? last + 1 : seq_k);
  }
  int64_t group() const { return heads / heads_kv; }  // query heads per K/V head
  int64_t q_numel() const { return batch * heads * seq_q * dim; }
  int64_t kv_numel() const { return batch * heads_kv * seq_k * dim; }
  int64_t rows() const { return batch * heads * seq_q; }
  int64_t q_blocks() const { return (seq_q + sparsity.block_q - 1) / sparsity.block_q; }
  int64_t k_blocks() const { return (seq_k + sparsity.block_k - 1) / sparsity.block_k; }

  // Empty if the problem is well formed and within the contract's limits, else what is
  // accepted (naming the size and the limit). Products are checked without overflow.
  std::string validate() const;
  // FLOPs by the field's convention: forward 4*B*H*M*N*d, halved when causal; backward 2.5x
  // forward. A block-sparse problem counts the dense FLOPs times the mask's density, which the
  // caller passes (1 for dense).
  double fwd_flops(double density = 1.0) const;
  double bwd_flops(double density = 1.0) const { return 2.5 * fwd_flops(density); }
  // Compulsory traffic in bytes at `elem_bytes` per element: forward reads Q, K, V and
  // writes O; backward reads Q, K, V, O, dO and writes dQ, dK, dV.
  double fwd_bytes(int elem_bytes) const;
  double bwd_bytes(int elem_bytes) const;
  std::string describe() const;
};

// a * b, or -1 if it overflows int64 (a, b >= 0).
int64_t checked_mul(int64_t a, int64_t b);

}  // namespace ladder
