#include "cases.hpp"

#include <stdexcept>

#include "cli.hpp"

namespace ladder {

namespace {
Case mk(std::string name, int64_t b, int64_t h, int64_t hkv, int64_t m, int64_t n, int64_t d,
        bool causal, InputKind kind = InputKind::normal, double scale = 0) {
  Case c;
  c.name = std::move(name);
  c.p.batch = b;
  c.p.heads = h;
  c.p.heads_kv = hkv;
  c.p.seq_q = m;
  c.p.seq_k = n;
  c.p.dim = d;
  c.p.causal = causal;
  c.p.scale = scale;
  c.p.seed = 1000 + uint64_t(m * 31 + n * 7 + d + h);
  c.kind = kind;
  return c;
}
Case drop(Case c, double p) {
  c.p.dropout = p;
  c.p.dropout_seed = 4242;
  return c;
}
Case sparse(Case c, const std::string& spec) {
  parse_sparsity(spec, "", "", c.p.sparsity);
  return c;
}
Case rows(Case c, std::vector<std::string> mask) {
  c.p.sparsity.kind = BlockSparsity::Kind::file;
  c.p.sparsity.file = "(the case's own mask)";
  c.mask_rows = std::move(mask);
  return c;
}
}  // namespace

const std::vector<Case>& shared_cases() {
  using K = InputKind;
  static const std::vector<Case> cases = {
      // Degenerate lengths.
      mk("seq1", 1, 2, 2, 1, 1, 64, false),
      mk("seq1_causal", 1, 2, 2, 1, 1, 64, true),
      mk("q1_k113", 1, 2, 2, 1, 113, 64, false),
      mk("q1_k200_causal", 1, 2, 2, 1, 200, 64, true),  // the one query sees every key
      mk("q200_k1_causal", 1, 2, 2, 200, 1, 64, true),  // only the last query sees the key
      // Lengths that are not tile multiples, and ones that are.
      mk("odd17", 1, 2, 2, 17, 17, 64, false),
      mk("odd113_causal", 1, 2, 2, 113, 113, 64, true),
      mk("tiles64", 1, 2, 2, 64, 64, 64, false),
      mk("tiles128_causal", 1, 2, 2, 128, 128, 64, true),
      mk("long1023_causal", 1, 2, 2, 1023, 1023, 64, true),
      // seq_q != seq_k both ways; q > k with causal gives fully masked rows.
      mk("q17_k203", 1, 2, 2, 17, 203, 64, false),
      mk("q17_k203_causal", 1, 2, 2, 17, 203, 64, true),
      mk("q203_k17", 1, 2, 2, 203, 17, 64, false),
      mk("q203_k17_causal_masked_rows", 1, 2, 2, 203, 17, 64, true),
      // GQA / MQA and batches.
      mk("gqa4to2_q113_k203_causal", 1, 4, 2, 113, 203, 64, true),
      mk("mqa4to1_q64_k97", 1, 4, 1, 64, 97, 64, false),
      mk("batch2_gqa3to1_q77_k129_causal", 2, 3, 1, 77, 129, 64, true),
      // Logits large enough that exp without the max shift overflows.
      mk("large_logits", 1, 2, 2, 113, 113, 64, false, K::large),
      mk("large_logits_causal", 1, 2, 2, 113, 150, 64, true, K::large),
      mk("explicit_scale_0.3", 1, 2, 2, 33, 47, 64, false, K::normal, 0.3),
      // Every head dim a step may support.
      mk("dim16_q65_k130", 1, 2, 2, 65, 130, 16, false),
      mk("dim32_q65_k130_causal", 1, 2, 2, 65, 130, 32, true),
      mk("dim96_q65_k130", 1, 2, 2, 65, 130, 96, false),
      mk("dim128_q65_k130_causal", 1, 2, 2, 65, 130, 128, true),
      mk("dim128_q300_k300", 1, 2, 1, 300, 300, 128, false),
      mk("dim256_q65_k130_causal", 1, 2, 2, 65, 130, 256, true),
      // Dropout (the same Z in every rung: docs/CONTRACT.md), with masks, GQA and odd lengths.
      drop(mk("dropout0.1_q113_k203", 1, 2, 2, 113, 203, 64, false), 0.1),
      drop(mk("dropout0.5_causal_q203_k117_masked_rows", 1, 2, 2, 203, 117, 64, true), 0.5),
      drop(mk("dropout0.1_gqa4to2_q77_k129_causal", 1, 4, 2, 77, 129, 64, true), 0.1),
      drop(mk("dropout0.1_dim128_q65_k300", 1, 2, 1, 65, 300, 128, false), 0.1),
      // Block-sparse masks of 128 x 128 blocks: generated, with empty rows and columns, causal.
      sparse(mk("sparse_random0.5_q300_k520", 1, 2, 2, 300, 520, 64, false), "random:0.5"),
      sparse(mk("sparse_local2_causal_q520_k520", 1, 2, 2, 520, 520, 64, true), "local:2"),
      rows(mk("sparse_empty_rows_and_columns_q300_k400", 1, 2, 2, 300, 400, 64, false),
           {"0000", "1010", "1010"}),
      rows(mk("sparse_causal_q400_k300_dim128", 2, 2, 1, 400, 300, 128, true),
           {"101", "011", "110", "111"}),
      drop(sparse(mk("sparse_random0.6_dropout0.2_gqa_causal", 1, 4, 2, 300, 300, 128, true),
                  "random:0.6"),
           0.2),
  };
  return cases;
}

Inputs case_inputs(const Case& c, const Problem& p) {
  Inputs in = make_inputs(p, c.kind);
  if (!c.mask_rows.empty()) {
    BlockMask& m = in.mask;
    m.batch = m.heads = 1;
    m.block_q = p.sparsity.block_q, m.block_k = p.sparsity.block_k;
    m.q_blocks = p.q_blocks(), m.k_blocks = p.k_blocks();
    for (const std::string& row : c.mask_rows)
      for (char x : row) m.keep.push_back(x == '1');
    if (int64_t(c.mask_rows.size()) != m.q_blocks ||
        int64_t(m.keep.size()) != m.q_blocks * m.k_blocks)
      throw std::logic_error("case " + c.name + ": its mask rows do not fit the problem");
  }
  return in;
}

}  // namespace ladder
