#include "problem.hpp"

#include <sstream>

namespace ladder {

std::string Problem::validate() const {
  std::ostringstream e;
  if (batch < 1) e << "--batch must be >= 1 (got " << batch << "). ";
  if (heads < 1) e << "--heads must be >= 1 (got " << heads << "). ";
  if (heads_kv < 1) e << "--heads-kv must be >= 1 (got " << heads_kv << "). ";
  if (heads >= 1 && heads_kv >= 1 && heads % heads_kv != 0)
    e << "--heads (" << heads << ") must be a multiple of --heads-kv (" << heads_kv
      << ") for GQA/MQA. ";
  if (seq_q < 1) e << "--seq-q must be >= 1 (got " << seq_q << "). ";
  if (seq_k < 1) e << "--seq-k must be >= 1 (got " << seq_k << "). ";
  if (dim < 1) e << "--dim must be >= 1 (got " << dim << "). ";
  if (!std::isfinite(scale)) e << "--scale must be finite. ";
  std::string s = e.str();
  if (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

double Problem::fwd_flops() const {
  const double f =
      4.0 * double(batch) * double(heads) * double(seq_q) * double(seq_k) * double(dim);
  return causal ? f / 2 : f;
}

double Problem::fwd_bytes(int elem_bytes) const {
  return double(elem_bytes) * (2.0 * double(q_numel()) + 2.0 * double(kv_numel()));
}

double Problem::bwd_bytes(int elem_bytes) const {
  return double(elem_bytes) * (4.0 * double(q_numel()) + 4.0 * double(kv_numel()));
}

std::string Problem::describe() const {
  std::ostringstream s;
  s << "batch " << batch << ", heads " << heads << "/" << heads_kv << " (q/kv), seq " << seq_q
    << "x" << seq_k << ", dim " << dim << (causal ? ", causal" : "") << ", " << dtype_name(dtype)
    << ", scale " << softmax_scale() << (backward ? ", backward" : "");
  return s.str();
}

}  // namespace ladder
