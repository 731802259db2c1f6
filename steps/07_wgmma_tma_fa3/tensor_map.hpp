// Host side of step 07, shared by the forward and the backward: the device check, the kernel's
// shared-memory limit, and the TMA tensor maps of [planes, rows, dim] tensors. CUDA errors go
// through the ladder's CUDA_CHECK (common/).
#pragma once
#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes through the runtime
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "cuda_util.cuh"
#include "wgmma_tma_fa3.hpp"

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

// The rule a tensor's Strides must follow (the TMA unit's and the 16-byte accesses'): every
// stride a non-negative multiple of 8 elements (16 bytes) below 2^40 bytes.
inline bool strides_ok(const Strides& s) {
  for (int64_t x : {s.batch, s.head, s.row})
    if (x < 0 || x % 8 != 0 || x >= (int64_t(1) << 39)) return false;
  return true;
}
inline const char* strides_rule() {
  return "every stride of Q, K, V, O and dO must be a multiple of 8 elements (16 bytes), the "
         "head dim contiguous";
}

// A tensor map of `rank` dimensions (innermost first: dims[0] elements of elem_bytes, contiguous;
// strides[k] bytes from one index of dimension k + 1 to the next), boxes of box[] elements,
// box[0] x elem_bytes = 128 bytes in the 128-byte swizzle. Loads past a dimension's end read
// zeros, stores and reduce-adds past it are dropped; a box never crosses a head.
inline void encode(void* map, const void* base, CUtensorMapDataType type, int rank,
                   const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box) {
  const cuuint32_t estride[4] = {1, 1, 1, 1};
  const CUresult r = tensor_map_encoder()(
      static_cast<CUtensorMap*>(map), type, cuuint32_t(rank), const_cast<void*>(base), dims,
      strides, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("step 07: cuTensorMapEncodeTiled failed with CUresult " +
                             std::to_string(int(r)));
}

// A dense [planes, rows, dim] tensor as a 3-D map {dim, rows, planes} (the fp32 dQ workspace).
inline void encode_3d(void* map, const void* base, CUtensorMapDataType type, int elem_bytes,
                      int dim, int rows, int planes, int box_cols, int box_rows) {
  const cuuint64_t gdim[3] = {cuuint64_t(dim), cuuint64_t(rows), cuuint64_t(planes)};
  const cuuint64_t gstride[2] = {cuuint64_t(dim) * elem_bytes, cuuint64_t(rows) * dim * elem_bytes};
  const cuuint32_t box[3] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1};
  encode(map, base, type, 3, gdim, gstride, box);
}

// A 16-bit [batch, heads, rows, dim] tensor with strides `st` (elements; resolved(), so dense is
// spelled out) as a 4-D map {dim, rows, heads, batch}, boxes of 64 columns x box_rows rows:
// the kernels address a tile by (column, row, head, batch).
inline void encode_4d(void* map, const void* base, CUtensorMapDataType type, int dim, int rows,
                      int heads, int batch, Strides st, int box_rows) {
  const cuuint64_t gdim[4] = {cuuint64_t(dim), cuuint64_t(rows), cuuint64_t(heads),
                              cuuint64_t(batch)};
  const cuuint64_t gstride[3] = {cuuint64_t(st.row) * 2, cuuint64_t(st.head) * 2,
                                 cuuint64_t(st.batch) * 2};
  const cuuint32_t box[4] = {64, cuuint32_t(box_rows), 1, 1};
  encode(map, base, type, 4, gdim, gstride, box);
}

}  // namespace ladder::fa3
