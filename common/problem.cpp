#include "problem.hpp"

#include <initializer_list>
#include <limits>
#include <sstream>

namespace ladder {

int64_t checked_mul(int64_t a, int64_t b) {
  if (a < 0 || b < 0) return -1;
  if (a != 0 && b > std::numeric_limits<int64_t>::max() / a) return -1;
  return a * b;
}

namespace {
// The product of the extents, or -1 when it overflows.
int64_t product(std::initializer_list<int64_t> xs) {
  int64_t n = 1;
  for (int64_t x : xs) {
    n = checked_mul(n, x);
    if (n < 0) return -1;
  }
  return n;
}

std::string pow2(int64_t limit) {
  int e = 0;
  while ((int64_t(1) << e) < limit) ++e;
  return (int64_t(1) << e) == limit ? "2^" + std::to_string(e) : std::to_string(limit);
}
}  // namespace

std::string BlockSparsity::describe() const {
  std::ostringstream s;
  switch (kind) {
    case Kind::none:
      return "dense";
    case Kind::file:
      s << "mask " << file;
      break;
    case Kind::random:
      s << "random:" << density;
      break;
    case Kind::local:
      s << "local:" << width;
      break;
  }
  s << " (" << block_q << "x" << block_k << " blocks)";
  return s.str();
}

std::string Problem::validate() const {
  std::ostringstream e;
  auto extent = [&](const char* flag, int64_t v) {
    if (v < 1)
      e << flag << " must be >= 1 (got " << v << "). ";
    else if (v > kMaxExtent)
      e << flag << " must be at most 2^31 - 1 = " << kMaxExtent << " (got " << v << "). ";
  };
  extent("--batch", batch);
  extent("--heads", heads);
  extent("--heads-kv", heads_kv);
  extent("--seq-q", seq_q);
  extent("--seq-k", seq_k);
  extent("--dim", dim);
  if (heads >= 1 && heads_kv >= 1 && heads % heads_kv != 0)
    e << "--heads (" << heads << ") must be a multiple of --heads-kv (" << heads_kv
      << ") for GQA/MQA. ";
  if (!std::isfinite(scale)) e << "--scale must be finite. ";
  if (!(dropout >= 0.0 && dropout < 1.0))
    e << "--dropout must be in [0, 1) (got " << dropout << "). ";
  if (sparsity.active()) {
    if (sparsity.block_q < 1 || sparsity.block_k < 1 || sparsity.block_q > kMaxExtent ||
        sparsity.block_k > kMaxExtent)
      e << "--mask-block must be positive (got " << sparsity.block_q << "x" << sparsity.block_k
        << "). ";
    if (sparsity.kind == BlockSparsity::Kind::random &&
        !(sparsity.density >= 0.0 && sparsity.density <= 1.0))
      e << "--block-sparsity random:RHO needs RHO in [0, 1] (got " << sparsity.density << "). ";
    if (sparsity.kind == BlockSparsity::Kind::local && sparsity.width < 1)
      e << "--block-sparsity local:W needs W >= 1 (got " << sparsity.width << "). ";
  }
  if (!e.str().empty()) {
    std::string s = e.str();
    s.pop_back();
    return s;
  }
  // The extents are each < 2^31: check the products the steps index with.
  const int64_t q = product({batch, heads, seq_q, dim}),
                kv = product({batch, heads_kv, seq_k, dim});
  const int64_t scores = product({batch, heads, seq_q, seq_k});
  auto too_big = [&](const char* what, int64_t n, int64_t limit) {
    if (n >= 0 && n <= limit) return;
    e << what << " would have " << (n < 0 ? std::string("more than 2^63") : std::to_string(n))
      << " elements; the ladder's limit is " << pow2(limit) << ". ";
  };
  too_big("Q (batch*heads*seq_q*dim)", q, kMaxTensorElems);
  too_big("K and V (batch*heads_kv*seq_k*dim)", kv, kMaxTensorElems);
  too_big("the score matrix (batch*heads*seq_q*seq_k)", scores, kMaxScoreElems);
  std::string s = e.str();
  if (!s.empty()) s.pop_back();
  return s;
}

double Problem::fwd_flops(double density) const {
  const double f =
      4.0 * double(batch) * double(heads) * double(seq_q) * double(seq_k) * double(dim);
  return (causal ? f / 2 : f) * density;
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
    << ", scale " << softmax_scale();
  if (dropout > 0) s << ", dropout " << dropout << " (seed " << dropout_seed << ")";
  if (sparsity.active()) s << ", block-sparse " << sparsity.describe();
  if (backward) s << ", backward";
  return s.str();
}

}  // namespace ladder
