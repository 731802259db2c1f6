// What step 07's kernels are built for, written once: the step's descriptor (host.cu) and the
// PyTorch adaptor (python/csrc/rung07.cpp) both read it. The kernels' own table of
// instantiations (wgmma_tma_fa3.cu, wgmma_tma_fa3_backward.cu) holds exactly these.
#pragma once
#include "dims.hpp"
#include "dtype.hpp"

namespace ladder::step07 {

inline constexpr DType kDTypes[] = {DType::bf16, DType::f16};  // bf16: the default
using HeadDims = Dims<64, 128>;                                // forward and backward
// Dropout and block masks are built into the persistent kernels (two consumers: Br = Bc = 128,
// and the backward's 128 keys), so a mask block is a multiple of 128 x 128.
constexpr int kMaskBlock = 128;

}  // namespace ladder::step07
