// Inputs and outputs of a run, and seeded input generation.
#pragma once
#include <string>

#include "block_mask.hpp"
#include "problem.hpp"
#include "tensor.hpp"

namespace ladder {

struct Inputs {
  Tensor q, k, v;  // [B, H, M, d], [B, Hkv, N, d], [B, Hkv, N, d]
  Tensor dout;     // [B, H, M, d]; only with backward
  BlockMask mask;  // empty unless the problem is block-sparse
};

struct Outputs {
  Tensor o, lse;      // [B, H, M, d], [B, H, M]
  Tensor dq, dk, dv;  // only with backward
  // Every element NaN, so anything a step does not write fails the check.
  static Outputs poisoned(const Problem& p);
  // The same in place: p's shapes, every element NaN, keeping each tensor's storage when it
  // already holds that many elements (ladder bench reuses one Outputs from point to point).
  void poison(const Problem& p);
};

// How the inputs are drawn (all seeded, never all zeros):
//  normal: N(0,1) with a mean shift (so QK^T has a non-zero mean) and a few keys
//          scaled up, so some logits are large and softmax is not flat;
//  large:  Q and K scaled so logits reach the hundreds: exp without the max
//          shift overflows even in float64 (exp(710) = inf).
//  late:   normal, with key j scaled by 1 + 3 j / seq_k: logits grow along the keys to the
//          tens, so a row's running max keeps growing and peaks in the last tiles.
enum class InputKind { normal, large, late };
bool parse_input_kind(const std::string& s, InputKind& out);

// Draws Q, K, V (and dO when p.backward), rounds them to p.dtype, and makes the block mask
// of a random:RHO or local:W problem.
Inputs make_inputs(const Problem& p, InputKind kind = InputKind::normal);

// Rounds every input value to `t` in place (what a step of that dtype will see).
void round_inputs(Inputs& in, DType t);

// Empty if every input value is finite, else which tensor holds the first value that is not
// (after rounding: 1e300 is finite in float64 and inf in fp32).
std::string non_finite_input(const Inputs& in);

}  // namespace ladder
