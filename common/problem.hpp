// One attention problem: the shapes, mask and precision every step agrees on
// (LADDER.md, "Semantics every step agrees on").
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

#include "dtype.hpp"

namespace ladder {

struct Problem {
  int64_t batch = 1, heads = 8, heads_kv = 8, seq_q = 512, seq_k = 512, dim = 64;
  bool causal = false;
  double scale = 0.0;  // 0 means 1/sqrt(dim)
  DType dtype = DType::f32;
  uint64_t seed = 0;
  bool backward = false;

  double softmax_scale() const { return scale != 0.0 ? scale : 1.0 / std::sqrt(double(dim)); }
  // Bottom-right causal mask: key j is visible to query i iff j <= i + seq_k - seq_q.
  // Returns how many keys row i sees (0 for a fully masked row).
  int64_t visible_keys(int64_t i) const {
    if (!causal) return seq_k;
    const int64_t last = i + seq_k - seq_q;  // last visible key index
    return last < 0 ? 0 : (last + 1 < seq_k ? last + 1 : seq_k);
  }
  int64_t group() const { return heads / heads_kv; }  // query heads per K/V head
  int64_t q_numel() const { return batch * heads * seq_q * dim; }
  int64_t kv_numel() const { return batch * heads_kv * seq_k * dim; }
  int64_t rows() const { return batch * heads * seq_q; }

  // Empty if the problem is well formed, else what is accepted.
  std::string validate() const;
  // FLOPs by the field's convention: forward 4*B*H*M*N*d, halved when causal;
  // backward 2.5x forward.
  double fwd_flops() const;
  double bwd_flops() const { return 2.5 * fwd_flops(); }
  // Compulsory traffic in bytes at `elem_bytes` per element: forward reads Q, K, V and
  // writes O; backward reads Q, K, V, O, dO and writes dQ, dK, dV.
  double fwd_bytes(int elem_bytes) const;
  double bwd_bytes(int elem_bytes) const;
  std::string describe() const;
};

}  // namespace ladder
