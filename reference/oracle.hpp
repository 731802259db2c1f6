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

// The plain computation in `precision` (fp32, fp16 or bf16) whose error vs the oracle sets
// the harness's tolerance: left-to-right float32 sums, fp16/bf16 results rounded to that
// type (plain.cpp). Same arguments as attention().
void plain_attention(const Problem& p, const Inputs& in, DType precision, Outputs& out,
                     const std::vector<int64_t>* rows = nullptr);

}  // namespace ladder::reference
