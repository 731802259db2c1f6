// Host side of step 07, shared by the forward and the backward: the device check, the kernel's
// shared-memory limit, and the TMA tensor maps of [planes, rows, dim] tensors. CUDA errors go
// through the ladder's CUDA_CHECK (common/).
#pragma once
#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes through the runtime
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "cuda_util.cuh"

namespace ladder::fa3 {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's cuTensorMapEncodeTiled, found through the runtime (no -lcuda at link time).
inline EncodeTiled tensor_map_encoder() {
  static EncodeTiled fn = nullptr;
  if (!fn) {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !f)
      throw std::runtime_error("step 07: the driver has no cuTensorMapEncodeTiled");
    fn = reinterpret_cast<EncodeTiled>(f);
  }
  return fn;
}

// The current device's properties; throws (naming `who`) unless it is an sm_90 GPU.
inline cudaDeviceProp require_sm90(const char* who) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  if (prop.major != 9 || prop.minor != 0)
    throw std::runtime_error(std::string(who) + ": needs an sm_90 GPU (H100/H200); this is sm_" +
                             std::to_string(prop.major) + std::to_string(prop.minor));
  return prop;
}

// Lets kernel `fn` have `smem` bytes of dynamic shared memory; returns its registers per thread.
inline int set_smem_limit(const void* fn, int smem) {
  CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaFuncAttributes attr{};
  CUDA_CHECK(cudaFuncGetAttributes(&attr, fn));
  return attr.numRegs;
}

// A [planes, rows, dim] tensor as a 3-D map {dim, rows, planes} (innermost first), boxes of
// box_cols x box_rows x 1 (box_cols x element size = 128 bytes), 128-byte swizzle; loads past
// `rows` read zeros, stores and reduce-adds past it are dropped. A box never crosses a plane
// (head).
inline void encode_3d(void* map, const void* base, CUtensorMapDataType type, int elem_bytes,
                      int dim, int rows, int planes, int box_cols, int box_rows) {
  const cuuint64_t gdim[3] = {cuuint64_t(dim), cuuint64_t(rows), cuuint64_t(planes)};
  const cuuint64_t gstride[2] = {cuuint64_t(dim) * elem_bytes,
                                 cuuint64_t(rows) * dim * elem_bytes};  // bytes
  const cuuint32_t box[3] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1};
  const cuuint32_t estride[3] = {1, 1, 1};
  const CUresult r = tensor_map_encoder()(
      static_cast<CUtensorMap*>(map), type, 3, const_cast<void*>(base), gdim, gstride, box, estride,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("step 07: cuTensorMapEncodeTiled failed with CUresult " +
                             std::to_string(int(r)));
}

}  // namespace ladder::fa3
