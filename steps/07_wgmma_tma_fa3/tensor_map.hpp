// Host side of step 07, shared by the forward and the backward: the parameter checks, the
// device check, the choice of an instantiation by dtype and head dim, the kernel's shared-memory
// limit, and the TMA tensor maps. CUDA errors go through the ladder's CUDA_CHECK (common/).
#pragma once
#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes through the runtime
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "capabilities.hpp"
#include "cuda_util.cuh"
#include "wgmma_tma_fa3.hpp"

namespace ladder::fa3 {

// The driver's cuTensorMapEncodeTiled, found through the runtime (no -lcuda at link time).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  if (!fn) {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !f)
      throw std::runtime_error("step 07: the driver has no cuTensorMapEncodeTiled");
    fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }
  return fn;
}

// Throws std::invalid_argument("who: what") unless ok.
inline void require(bool ok, const char* who, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string(who) + ": " + what);
}

// The checks the forward's and the backward's parameters share (P: FwdParams or BwdParams):
// the shapes, the scale, LSE and the 16-byte aligned `tensors`, the strides, dropout, and the
// block mask's geometry when `sparse`.
template <class P>
void check_params(const P& f, const char* who, std::initializer_list<const void*> tensors,
                  bool sparse) {
  require(step07::HeadDims::has(f.dim), who,
          "head dims " + step07::HeadDims::str() +
              " (bf16 and fp16); 256 is not built: its O alone is 128 fp32 registers per "
              "consumer thread, which with S needs smaller key tiles");
  require(f.batch >= 1 && f.heads >= 1 && f.heads_kv >= 1 && f.seq_q >= 1 && f.seq_k >= 1, who,
          "batch, heads, heads_kv, seq_q, seq_k must be >= 1");
  require(f.heads % f.heads_kv == 0, who, "heads must be a multiple of heads_kv");
  require(f.batch <= 65535 && f.heads <= 65535 && f.seq_q <= (1 << 30) && f.seq_k <= (1 << 30), who,
          "batch and heads are grid dimensions (<= 65535), seq_q and seq_k <= 2^30");
  require(std::isfinite(f.scale) && f.scale > 0.f, who,
          "scale must be finite and > 0 (negate Q for a negative scale)");
  require(f.lse != nullptr, who, "null LSE");
  for (const void* t : tensors) {
    require(t != nullptr, who, "null tensor pointer");
    require(reinterpret_cast<uintptr_t>(t) % 16 == 0, who,
            "every tensor and the workspace must be 16-byte aligned");
  }
  const Strides strides[] = {f.q_strides, f.k_strides, f.v_strides, f.o_strides};
  for (const Strides& s : strides)
    require(strides_ok(s), who,
            "every stride of Q, K, V, O and dO must be a multiple of 8 elements (16 bytes), "
            "the head dim contiguous");
  require(f.dropout_p >= 0.f && f.dropout_p < 1.f, who, "dropout_p must be in [0, 1)");
  if (!sparse) return;
  constexpr int kB = step07::kMaskBlock;
  require(f.block_m > 0 && f.block_m % kB == 0 && f.block_n > 0 && f.block_n % kB == 0, who,
          "mask blocks must be multiples of " + std::to_string(kB) + " x " + std::to_string(kB));
  require(f.mask_batch == 1 || f.mask_batch == f.batch, who, "mask_batch must be 1 or batch");
  require(f.mask_heads == 1 || f.mask_heads == f.heads, who, "mask_heads must be 1 or heads");
}

// f(T(), std::integral_constant<int, D>()) for the run's 16-bit type T and head dim D (64 or
// 128, as check_params allows): how both passes pick their instantiation.
template <class F>
auto with_type_and_dim(bool bf16, int dim, F&& f) {
  auto by_dim = [&](auto t) {
    return dim == 64 ? f(t, std::integral_constant<int, 64>())
                     : f(t, std::integral_constant<int, 128>());
  };
  return bf16 ? by_dim(__nv_bfloat16()) : by_dim(__half());
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

// The backward's fp32 dQ accumulator, a dense [planes, rows, dim] tensor, as a 3-D map {dim,
// rows, planes}, boxes of 32 columns (128 bytes) x 64 rows: what its TMA reduce-adds address.
inline void encode_dq_acc(void* map, const float* base, int dim, int rows, int planes) {
  const cuuint64_t gdim[3] = {cuuint64_t(dim), cuuint64_t(rows), cuuint64_t(planes)};
  const cuuint64_t gstride[2] = {cuuint64_t(dim) * 4, cuuint64_t(rows) * dim * 4};
  const cuuint32_t box[3] = {32, 64, 1};
  encode(map, base, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, gdim, gstride, box);
}

// A 16-bit [batch, heads, rows, dim] tensor (dtype, dim and batch those of `f`) with strides
// `st` as a 4-D map {dim, rows, heads, batch}, boxes of 64 columns (128 bytes) x box_rows rows:
// the kernels address a tile by (column, row, head, batch).
inline void encode_4d(void* map, const Attention& f, const void* base, int heads, int rows,
                      Strides st, int box_rows) {
  st = resolved(st, heads, rows, f.dim);
  const cuuint64_t gdim[4] = {cuuint64_t(f.dim), cuuint64_t(rows), cuuint64_t(heads),
                              cuuint64_t(f.batch)};
  const cuuint64_t gstride[3] = {cuuint64_t(st.row) * 2, cuuint64_t(st.head) * 2,
                                 cuuint64_t(st.batch) * 2};
  const cuuint32_t box[4] = {64, cuuint32_t(box_rows), 1, 1};
  encode(map, base, f.bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
         gdim, gstride, box);
}

}  // namespace ladder::fa3
