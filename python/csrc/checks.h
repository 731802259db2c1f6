// The checks of q, k, v and the scale that the operators make on every device (ops_cpu.cpp,
// ops_cuda.cpp), each raising the Python exception that names what is accepted.
#pragma once
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <optional>

namespace ladder_torch {

inline void check_4d(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK_VALUE(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
                    "ladder: q, k, v must be 4-D [batch, heads, seq, dim]; got ", q.sizes(), ", ",
                    k.sizes(), ", ", v.sizes());
}

// K and V [batch, heads_kv, seq_k, dim] with q's batch and dim, q's heads a multiple of heads_kv.
inline void check_kv_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK_VALUE(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(3) == q.size(3),
                    "ladder: k and v must be [batch, heads_kv, seq_k, dim] with q's batch and "
                    "dim; got q ",
                    q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  const int64_t h = q.size(1), hkv = k.size(1);
  TORCH_CHECK_VALUE(hkv > 0 ? h % hkv == 0 : h == 0, "ladder: q's heads (", h,
                    ") must be a multiple of k's and v's heads (", hkv, ")");
}

inline void check_scale(double scale) {
  TORCH_CHECK_VALUE(std::isfinite(scale) && scale != 0.0,
                    "ladder: scale must be finite and non-zero; got ", scale);
}

// Dropout's rate in [0, 1) and, when it is on, its seed: one int64 on the CPU, read on the host
// without waiting for any device. Returns the seed (0 without dropout).
inline uint64_t check_dropout(double p, const std::optional<at::Tensor>& seed) {
  TORCH_CHECK_VALUE(std::isfinite(p) && p >= 0 && p < 1,
                    "ladder: dropout_p must be in [0, 1); got ", p);
  if (p == 0) return 0;
  TORCH_CHECK_VALUE(
      seed && seed->numel() == 1 && seed->scalar_type() == at::kLong && seed->device().is_cpu(),
      "ladder: dropout needs its seed, one int64 in a CPU tensor (attention() draws "
      "it from torch's default generator)");
  return uint64_t(seed->item<int64_t>());
}

// A block mask: bool [Bm, Hm, ceil(M / block_q), ceil(N / block_k)] on q's device, Bm 1 or q's
// batch, Hm 1 or q's heads (1: one mask shared by every batch / query head).
inline void check_block_mask(const std::optional<at::Tensor>& mask, const at::Tensor& q,
                             const at::Tensor& k, int64_t block_q, int64_t block_k) {
  if (!mask) return;
  TORCH_CHECK_VALUE(block_q >= 1 && block_k >= 1,
                    "ladder: the mask block must be at least 1 x 1; got ", block_q, " x ", block_k);
  const int64_t b = q.size(0), h = q.size(1);
  const int64_t nq = (q.size(2) + block_q - 1) / block_q, nk = (k.size(2) + block_k - 1) / block_k;
  const at::Tensor& m = *mask;
  TORCH_CHECK_TYPE(m.scalar_type() == at::kBool, "ladder: block_mask must be a bool tensor; got ",
                   m.scalar_type());
  TORCH_CHECK_VALUE(m.dim() == 4 && (m.size(0) == 1 || m.size(0) == b) &&
                        (m.size(1) == 1 || m.size(1) == h) && m.size(2) == nq && m.size(3) == nk,
                    "ladder: block_mask must be [1 or batch, 1 or heads, ceil(seq_q / ", block_q,
                    "), ceil(seq_k / ", block_k, ")] = [1 or ", b, ", 1 or ", h, ", ", nq, ", ", nk,
                    "] for mask blocks of ", block_q, " x ", block_k, "; got ", m.sizes());
  TORCH_CHECK_VALUE(m.device() == q.device(), "ladder: block_mask must be on q's device (",
                    q.device(), "); got ", m.device());
}

}  // namespace ladder_torch
