#include "block_mask.hpp"

#include <cmath>
#include <sstream>

#include "error.hpp"

namespace ladder {

uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double BlockMask::density() const {
  if (keep.empty()) return 1.0;
  int64_t n = 0;
  for (uint8_t k : keep) n += k != 0;
  return double(n) / double(keep.size());
}

std::string BlockMask::shape_str() const {
  std::ostringstream s;
  s << "[" << batch << ", " << heads << ", " << q_blocks << ", " << k_blocks << "]";
  return s.str();
}

namespace {
BlockMask shaped(const Problem& p, int64_t batch, int64_t heads) {
  BlockMask m;
  m.batch = batch, m.heads = heads;
  m.block_q = p.sparsity.block_q, m.block_k = p.sparsity.block_k;
  m.q_blocks = p.q_blocks(), m.k_blocks = p.k_blocks();
  m.keep.assign(size_t(batch * heads * m.q_blocks * m.k_blocks), 0);
  return m;
}
}  // namespace

BlockMask make_block_mask(const Problem& p) {
  using Kind = BlockSparsity::Kind;
  if (p.sparsity.kind == Kind::random) {
    // The (idx + 1)-th output of SplitMix64 seeded with --seed decides block idx.
    BlockMask m = shaped(p, p.batch, p.heads);
    const uint64_t cut = uint64_t(std::llround(p.sparsity.density * double(1 << 24)));
    for (size_t idx = 0; idx < m.keep.size(); ++idx) {
      const uint64_t u = splitmix64_mix(p.seed + (uint64_t(idx) + 1) * 0x9e3779b97f4a7c15ull);
      m.keep[idx] = (u >> 40) < cut;
    }
    return m;
  }
  if (p.sparsity.kind == Kind::local) {
    // A band of W key blocks ending at the diagonal block, bottom-right aligned as the causal
    // mask is: query block I's diagonal key block is I + (k_blocks - q_blocks).
    BlockMask m = shaped(p, 1, 1);
    for (int64_t I = 0; I < m.q_blocks; ++I) {
      const int64_t diag = I + m.k_blocks - m.q_blocks;
      for (int64_t J = 0; J < m.k_blocks; ++J)
        m.keep[size_t(I * m.k_blocks + J)] = J <= diag && J > diag - p.sparsity.width;
    }
    return m;
  }
  return BlockMask{};
}

BlockMask block_mask_from(const Tensor& t, const Problem& p, const std::string& path) {
  const int64_t nI = p.q_blocks(), nJ = p.k_blocks();
  const bool ok = t.shape.size() == 4 && (t.shape[0] == 1 || t.shape[0] == p.batch) &&
                  (t.shape[1] == 1 || t.shape[1] == p.heads) && t.shape[2] == nI &&
                  t.shape[3] == nJ;
  if (!ok) {
    std::ostringstream e;
    e << "--block-mask " << path << ": shape " << t.shape_str() << "; expected [" << p.batch
      << " or 1, " << p.heads << " or 1, " << nI << ", " << nJ << "] (ceil(seq_q / "
      << p.sparsity.block_q << "), ceil(seq_k / " << p.sparsity.block_k << "))";
    throw BadInput(e.str());
  }
  BlockMask m = shaped(p, t.shape[0], t.shape[1]);
  for (size_t i = 0; i < m.keep.size(); ++i) m.keep[i] = t.data[i] != 0;
  return m;
}

namespace {
// CSR lists over rows (bh, outer block o) of the mask seen as [batch * heads, outer, inner]:
// count[r] kept inner blocks, ascending, at index[r * inner ...]; kept(bh, o, i) reads the mask.
template <class Kept>
BlockLists csr_lists(int64_t bh, int64_t outer, int64_t inner, Kept kept) {
  BlockLists l;
  const int64_t rows = bh * outer;
  l.count.assign(size_t(rows), 0);
  l.index.assign(size_t(rows * inner), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < inner; ++i)
      if (kept(r / outer, r % outer, i))
        l.index[size_t(r * inner + l.count[size_t(r)]++)] = int32_t(i);
  return l;
}
}  // namespace

BlockLists kv_block_lists(const BlockMask& m) {
  return csr_lists(m.batch * m.heads, m.q_blocks, m.k_blocks,
                   [&](int64_t bh, int64_t I, int64_t J) {
                     return m.keep[size_t((bh * m.q_blocks + I) * m.k_blocks + J)] != 0;
                   });
}

BlockLists q_block_lists(const BlockMask& m) {
  return csr_lists(m.batch * m.heads, m.k_blocks, m.q_blocks,
                   [&](int64_t bh, int64_t J, int64_t I) {
                     return m.keep[size_t((bh * m.q_blocks + I) * m.k_blocks + J)] != 0;
                   });
}

double block_list_bytes(const Problem& p) {
  if (!p.sparsity.active()) return 0.0;
  const double rows = double(p.batch) * double(p.heads), qb = double(p.q_blocks()),
               kb = double(p.k_blocks());
  return 4.0 * rows * (qb * (1.0 + kb) + (p.backward ? kb * (1.0 + qb) : 0.0));
}

}  // namespace ladder
