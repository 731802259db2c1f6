// The checks of q, k, v and the scale that the operators make on every device (ops_cpu.cpp,
// ops_cuda.cpp), each raising the Python exception that names what is accepted.
#pragma once
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>

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

}  // namespace ladder_torch
