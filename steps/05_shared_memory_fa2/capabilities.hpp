// What step 05's kernels are built for, written once: the step's descriptor (host.cu) and the
// PyTorch adaptor (python/csrc/rung05.cu) both read it.
#pragma once
#include "dims.hpp"
#include "dtype.hpp"

namespace ladder::step05 {

inline constexpr DType kDTypes[] = {DType::f32};
// The kernels are templates on d, so that the micro-tile loops unroll and O_i lives in
// registers: one instantiation per head dim.
using HeadDims = Dims<32, 64, 96, 128>;

// Br cap for the forward's default (the rule gives 32, 64, 96, 112 for d = 32, 64, 96, 128 on
// an H100). The H100 sweep (notes/05) measured Br = 64 and 128 equal at d = 64 and 128, and
// 48, 96 slower: 64 keeps the rule's value at d = 64 with half the block of 128.
constexpr int kBrCap = 64;

}  // namespace ladder::step05
