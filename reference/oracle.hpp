// The oracle: scaled dot-product attention, forward and backward, written as matrix algebra
// with Eigen in float64 (causal and block masks, dropout, GQA): the reference every step is
// checked against, and step 00's algorithm. Beside it, plain_attention(): the plain
// same-precision computation whose error sets the harness's tolerance (docs/CONTRACT.md,
// "The harness"). The layer above common/ and below the runner and the steps.
#pragma once
#include <cstdint>
#include <vector>

#include "inputs.hpp"
#include "problem.hpp"

namespace ladder::reference {

// The oracle: computes O, LSE (and dQ, dK, dV when p.backward) in float64 into `out`,
// which the caller allocated.
// rows: if given, only these query rows (the same indices in every batch and head) are
// computed: O, LSE and dQ for them, written compactly in the order given, so `out` then has
// seq_q = rows->size() ([B, H, R, d] and [B, H, R]); dK and dV (which need every row) are
// left untouched.
void attention(const Problem& p, const Inputs& in, Outputs& out,
               const std::vector<int64_t>* rows = nullptr);

// The column pass of a sampled backward check: the oracle's forward over every query row
// into `rows` (O and LSE, full shapes, allocated by the caller), then dK and dV for the key
// rows `keys` only (the same indices in every batch and K/V head), written compactly into
// out.dk and out.dv ([B, Hkv, R, d]). Costs one forward pass, not a backward one.
void key_columns(const Problem& p, const Inputs& in, const std::vector<int64_t>& keys,
                 Outputs& rows, Outputs& out);

// The yardstick's dK and dV on the key rows `keys` (as key_columns() lays them out), rebuilding
// P from the oracle's LSE rounded to fp32 and D from the oracle's O rounded to `precision` (as
// a kernel reads its own stored LSE and O): its own forward over every row would cost the full
// check. `rows`: key_columns()'s forward.
void plain_key_columns(const Problem& p, const Inputs& in, DType precision,
                       const std::vector<int64_t>& keys, const Outputs& rows, Outputs& out);

// The plain computation in `precision` (fp32, fp16 or bf16) whose error vs the oracle sets
// the harness's tolerance: left-to-right float32 sums, fp16/bf16 results rounded to that
// type (plain.cpp). Same arguments as attention().
void plain_attention(const Problem& p, const Inputs& in, DType precision, Outputs& out,
                     const std::vector<int64_t>* rows = nullptr);

}  // namespace ladder::reference
