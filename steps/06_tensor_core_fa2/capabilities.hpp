// What step 06's kernels are built for, written once: the step's descriptor (host.cu) and the
// PyTorch adaptor (python/csrc/rung06.cuh) both read it. Every instantiation is compiled, so
// each head dim listed here is a set of kernels in the binary (notes/06_tensor_core_fa2.md).
#pragma once
#include "dims.hpp"
#include "dtype.hpp"

namespace ladder::step06 {

inline constexpr DType kDTypes[] = {DType::bf16, DType::f16};  // bf16: the default
using HeadDims = Dims<32, 64, 96, 128, 256>;                   // the full kernel's forward
using BackwardHeadDims = Dims<32, 64, 96, 128>;                // the backward, every variant's
// The teaching variants (every one but the full kernel): bf16 at these dims only, as their
// instantiations would otherwise multiply the compile time for what a technique measures the
// same at any dim.
inline constexpr DType kTeachingDType = DType::bf16;
using TeachingHeadDims = Dims<64, 128>;

}  // namespace ladder::step06
