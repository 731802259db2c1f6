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
Case about(Case c, std::string what) {
  c.exercises = std::move(what);
  return c;
}
Case at_scale(Case c, bool forward_only = false) {
  c.at_scale = true;
  c.forward_only = forward_only;
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
      about(mk("seq1", 1, 2, 2, 1, 1, 64, false),
            "one query, one key: P = 1 and O = V exactly, so dP - D must cancel to 0"),
      about(mk("seq1_causal", 1, 2, 2, 1, 1, 64, true),
            "one query, one key, causal: the diagonal alone is visible"),
      about(mk("q1_k113", 1, 2, 2, 1, 113, 64, false),
            "a single query row over 113 keys: a row longer than any tile, no tile multiple"),
      about(mk("q1_k200_causal", 1, 2, 2, 1, 200, 64, true),
            "one query sees all 200 keys (bottom-right causal, seq_q < seq_k)"),
      about(mk("q200_k1_causal", 1, 2, 2, 200, 1, 64, true),
            "seq_k = 1, causal: only the last query sees the key; every other row sees none (O = "
            "0, LSE = -inf)"),
      // Lengths that are not tile multiples, and ones that are.
      about(mk("odd17", 1, 2, 2, 17, 17, 64, false),
            "17 x 17: every tile is partial (lengths no tile multiple)"),
      about(mk("odd113_causal", 1, 2, 2, 113, 113, 64, true),
            "113 x 113 causal: partial tiles on the diagonal"),
      about(mk("tiles64", 1, 2, 2, 64, 64, 64, false),
            "64 x 64: exact tile multiples (no tail handling)"),
      about(mk("tiles128_causal", 1, 2, 2, 128, 128, 64, true),
            "128 x 128 causal: whole tiles skipped above the diagonal"),
      about(mk("long1023_causal", 1, 2, 2, 1023, 1023, 64, true),
            "1023 x 1023 causal: many key tiles, so the running max is rescaled often"),
      // seq_q != seq_k both ways; q > k with causal gives fully masked rows.
      about(mk("q17_k203", 1, 2, 2, 17, 203, 64, false),
            "seq_q < seq_k: few queries against a long key row"),
      about(mk("q17_k203_causal", 1, 2, 2, 17, 203, 64, true),
            "seq_q < seq_k causal: the bottom-right diagonal starts at key 186"),
      about(mk("q203_k17", 1, 2, 2, 203, 17, 64, false),
            "seq_q > seq_k: many queries, one short key tile"),
      about(mk("q203_k17_causal_masked_rows", 1, 2, 2, 203, 17, 64, true),
            "seq_q > seq_k causal: the first 186 rows see no key (O = 0, LSE = -inf, no NaN)"),
      // GQA / MQA and batches.
      about(mk("gqa4to2_q113_k203_causal", 1, 4, 2, 113, 203, 64, true),
            "GQA 4 -> 2 heads: query head h reads K/V head h / 2"),
      about(mk("mqa4to1_q64_k97", 1, 4, 1, 64, 97, 64, false),
            "MQA 4 -> 1: every query head reads the one K/V head; dK, dV sum the group"),
      about(mk("batch2_gqa3to1_q77_k129_causal", 2, 3, 1, 77, 129, 64, true),
            "batch 2 with GQA 3 -> 1: batch and head offsets"),
      // Logits large enough that exp without the max shift overflows.
      about(mk("large_logits", 1, 2, 2, 113, 113, 64, false, K::large),
            "logits in the hundreds: exp overflows without the max shift"),
      about(mk("large_logits_causal", 1, 2, 2, 113, 150, 64, true, K::large),
            "logits in the hundreds, causal, seq_q < seq_k: the shift and the mask together"),
      about(mk("explicit_scale_0.3", 1, 2, 2, 33, 47, 64, false, K::normal, 0.3),
            "--scale 0.3 instead of 1/sqrt(d): the scale is applied once, where S is formed"),
      // Every head dim a step may support.
      about(mk("dim16_q65_k130", 1, 2, 2, 65, 130, 16, false), "head dim 16"),
      about(mk("dim32_q65_k130_causal", 1, 2, 2, 65, 130, 32, true), "head dim 32, causal"),
      about(mk("dim96_q65_k130", 1, 2, 2, 65, 130, 96, false), "head dim 96 (not a power of two)"),
      about(mk("dim128_q65_k130_causal", 1, 2, 2, 65, 130, 128, true), "head dim 128, causal"),
      about(mk("dim128_q300_k300", 1, 2, 1, 300, 300, 128, false),
            "head dim 128 with GQA 2 -> 1, several tiles each way"),
      about(mk("dim256_q65_k130_causal", 1, 2, 2, 65, 130, 256, true), "head dim 256, causal"),
      // Dropout (the same Z in every rung: docs/CONTRACT.md), with masks, GQA and odd lengths.
      about(drop(mk("dropout0.1_q113_k203", 1, 2, 2, 113, 203, 64, false), 0.1),
            "dropout 0.1: Z regenerated, dropped keys still in l, O divided by 1 - p"),
      about(drop(mk("dropout0.5_causal_q203_k117_masked_rows", 1, 2, 2, 203, 117, 64, true), 0.5),
            "dropout 0.5 with causal rows that see no key"),
      about(drop(mk("dropout0.1_gqa4to2_q77_k129_causal", 1, 4, 2, 77, 129, 64, true), 0.1),
            "dropout with GQA: Z depends on the query head, not the K/V head"),
      about(drop(mk("dropout0.1_dim128_q65_k300", 1, 2, 1, 65, 300, 128, false), 0.1),
            "dropout at head dim 128 with MQA 2 -> 1"),
      // Block-sparse masks of 128 x 128 blocks: generated, with empty rows and columns, causal.
      about(sparse(mk("sparse_random0.5_q300_k520", 1, 2, 2, 300, 520, 64, false), "random:0.5"),
            "a random block mask (rho 0.5): masked 128 x 128 blocks skipped"),
      about(sparse(mk("sparse_local2_causal_q520_k520", 1, 2, 2, 520, 520, 64, true), "local:2"),
            "a local band of 2 key blocks, causal: the block mask and the causal mask together"),
      about(rows(mk("sparse_empty_rows_and_columns_q300_k400", 1, 2, 2, 300, 400, 64, false),
                 {"0000", "1010", "1010"}),
            "a block mask with an empty row of blocks (O = 0, LSE = -inf) and empty key columns"),
      about(rows(mk("sparse_causal_q400_k300_dim128", 2, 2, 1, 400, 300, 128, true),
                 {"101", "011", "110", "111"}),
            "an explicit block mask, causal with seq_q > seq_k, head dim 128, batch 2"),
      about(drop(sparse(mk("sparse_random0.6_dropout0.2_gqa_causal", 1, 4, 2, 300, 300, 128, true),
                        "random:0.6"),
                 0.2),
            "block mask, dropout, GQA and causal at once"),
      // At scale (GPU rungs only): the lengths models run at. A bias that grows with the number
      // of key tiles (an online-softmax rescale that is not exactly 1 when the max holds) is
      // invisible at 1k keys and fails here.
      about(at_scale(mk("decode_q1_k32768_gqa8to2_dim128", 1, 8, 2, 1, 32768, 128, false)),
            "decode: one query over 32768 keys, GQA 8 -> 2 (the running max fixed for 250+ tiles)"),
      about(at_scale(mk("decode_q16_k32767_causal_mqa4to1", 1, 4, 1, 16, 32767, 64, true)),
            "16 new tokens over a 32767-key cache, causal bottom-right, MQA"),
      about(at_scale(mk("prefill_q1025_k32768_dim64", 1, 2, 2, 1025, 32768, 64, false)),
            "1025 queries (one past a tile multiple) over 32768 keys"),
      about(at_scale(mk("prefill_q4097_causal_dim128", 1, 2, 1, 4097, 4097, 128, true)),
            "4097 x 4097 causal, one past a tile multiple, GQA 2 -> 1"),
      about(at_scale(mk("prefill_q16384_dim128", 1, 1, 1, 16384, 16384, 128, false), true),
            "16384 x 16384 at head dim 128: where a drifting LSE was first seen"),
      about(at_scale(mk("prefill_q32768_causal_dim64", 1, 1, 1, 32768, 32768, 64, true), true),
            "32768 x 32768 causal"),
      about(at_scale(mk("late_max_q1023_k16384_dim128", 1, 2, 2, 1023, 16384, 128, false, K::late)),
            "logits in the tens whose row max arrives late: the max grows tile after tile"),
      about(at_scale(mk("q1025_k4097_causal_dim256", 1, 1, 1, 1025, 4097, 256, true)),
            "head dim 256 at 4097 keys"),
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
