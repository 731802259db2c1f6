// What step 06's kernels take, and their shapes: the arguments of the forward and of the
// backward (the dense kernels' structs, the caller's params with the features, the structs of
// the kernels with the features), the forward's technique flags, and the tiles of both passes
// per head dim.
#pragma once
#include <cstdint>
#include <type_traits>

#include "dropout.hpp"
#include "mma.cuh"

namespace ladder::step06 {

// The forward's arguments, as its dense kernel takes them: exactly the fields it always took.
// nvcc treats a kernel parameter struct of over 128 bytes as memory, reading each field where
// it is used (ld.param inside the loop) instead of once at the top; at 255 registers the code
// that results spills (ptxas -v, d = 64: 32 bytes with a 136-byte struct, none at 128 bytes).
struct FwdArgs {
  const void* q;                      // [B, H, M, d] in T
  const void* k;                      // [B, Hkv, N, d]
  const void* v;                      // [B, Hkv, N, d]
  void* o;                            // [B, H, M, d]
  float* lse;                         // [B, H, M], natural log
  int batch, heads, heads_kv, group;  // group = heads / heads_kv query heads per K/V head
  int seq_q, seq_k;
  float scale;       // > 0: the host folds a negative scale into Q (exact)
  float scale_log2;  // scale * log2(e)
  bool causal;
};

// The features a caller may ask of either pass, zero-initialised off. Block-sparse mask
// (blk_count null: dense), as the host's CSR block lists (common/block_mask.hpp): for the
// forward kv_block_lists, whose row r = (mask batch * mask_heads + mask head) * mask_q_blocks +
// query block keeps blk_count[r] key blocks, ascending, at blk_index[r * mask_k_blocks ...]; for
// the backward q_block_lists, the transpose (row (mask batch * mask_heads + mask head) *
// mask_k_blocks + key block keeps query blocks, at blk_index[r * mask_q_blocks ...]).
// mask_batch, mask_heads: 1 shares a row with every batch / query head. The tiles must divide
// the mask block: Br | mask_block_q, Bc | mask_block_k. Dropout (dropout_p = 0: none): the rate
// in [0, 1) and the Philox key, the forward's in the backward.
struct FeatureParams {
  const int32_t* blk_count;
  const int32_t* blk_index;
  int mask_batch, mask_heads, mask_q_blocks, mask_k_blocks, mask_block_q, mask_block_k;
  double dropout_p;
  uint64_t dropout_seed;
};

// What a caller fills in to run the forward (FwdKernel::launch, tensor_core_fa2.cuh): the
// arguments above and the features. Zero-initialised (FwdParams fp{}), there is neither block
// mask nor dropout and the dense kernel runs.
struct FwdParams : FwdArgs, FeatureParams {};

// The kernels with a block mask or dropout: FwdArgs' fields and the features' in the form the
// kernel uses, ordered to fit in 128 bytes (after FwdArgs' own padding they would not).
struct FwdFeatureArgs {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  const int32_t* blk_count;  // the CSR lists, as in FwdParams
  const int32_t* blk_index;
  int batch, heads, heads_kv, group;
  int seq_q, seq_k;
  // This Q tile's mask row: b * mask_bstride + h * mask_hstride + (Q tile) / mask_q_tiles
  // (0 strides where the mask is shared); mask_k_tiles K/V tiles per mask key block.
  int mask_bstride, mask_hstride, mask_q_tiles, mask_k_tiles, mask_k_blocks;
  float scale, scale_log2;
  // Dropout's Philox key (the seed's two words) and keep threshold dropout::threshold(p);
  // drop_scale = 1 / (1 - p). Kernel parameters: uniform, so the key schedule stays in the
  // uniform datapath.
  uint32_t seed_lo, seed_hi, drop_thresh;
  float drop_scale;
  bool causal;
};
static_assert(sizeof(FwdArgs) <= 128 && sizeof(FwdFeatureArgs) <= 128, "see FwdArgs");
template <bool kDropout, bool kSparse>
using FwdArgsFor = std::conditional_t<kDropout || kSparse, FwdFeatureArgs, FwdArgs>;

// One bit per technique; a variant is the full kernel with some bits cleared.
enum FwdFlag : int {
  kSwizzle = 1,       // XOR-swizzled shared tiles (else plain row-major)
  kCpAsync = 2,       // cp.async into two K/V stages (else synchronous loads, one stage)
  kLdmatrix = 4,      // ldmatrix(.trans) fragments (else 32- and 16-bit shared loads)
  kPInRegisters = 8,  // P reused from the S registers (else written to and read from smem)
  kStagedStore = 16,  // O through shared memory, 16-byte stores (else 4-byte fragment stores)
  kFwdAll = 31,
};

// Tile shape per head dim. The constraints: 255 registers per thread hold the fp32 O_i
// (kSlices * d / 2 per thread) and S (kSlices * Bc / 2); shared memory holds Q_i and two
// stages of K_j, V_j. Two m16 slices per warp let every K/V fragment read from shared
// memory feed two mma instructions, which keeps ldmatrix traffic under the tensor cores'
// appetite; d = 256 has no registers for that and uses 8 warps of one slice.
// kQKUnroll: how many k16 steps of S = Q_i K_j^T are unrolled. Fully, except at d = 128,
// where ptxas, given all 8 steps or 4, hoists so many fragment loads that 255 registers spill
// (32 or 36 bytes, stored and reloaded on every tile). With 2 it spills nothing and still
// issues the second step's ldmatrix under the first step's mma; each pass recomputes the
// swizzled addresses, a few integer instructions per k-step (1270 instructions per tile, 1251
// fully rolled, which waits for every step's loads before its first mma).
template <int D>
struct FwdTiles {
  static_assert(D == 32 || D == 64 || D == 96 || D == 128 || D == 256,
                "the forward's head dims: 32, 64, 96, 128, 256");
  static constexpr int kWarps = D == 256 ? 8 : 4, kSlices = D == 256 ? 1 : 2;
  static constexpr int kBc = D <= 64 ? 128 : 64;
  static constexpr int kQKUnroll = D == 128 ? 2 : D / 16;
};

template <class T, int D, int kFlags>
struct FwdConfig {
  static constexpr int kD = D;
  static constexpr int kWarps = FwdTiles<D>::kWarps, kSlices = FwdTiles<D>::kSlices;
  static constexpr int kBr = kWarps * 16 * kSlices, kBc = FwdTiles<D>::kBc;
  static constexpr int kQKUnroll = FwdTiles<D>::kQKUnroll;
  static constexpr int kThreads = kWarps * 32;
  static constexpr bool kSwz = kFlags & kSwizzle, kAsync = kFlags & kCpAsync,
                        kLdsm = kFlags & kLdmatrix, kPRegs = kFlags & kPInRegisters,
                        kStage = kFlags & kStagedStore;
  static constexpr int kStages = kAsync ? 2 : 1;
  using QKV = SmemLayout<D, kSwz>;   // Q_i, K_j, V_j (and O_i on its way out): rows of d
  using PL = SmemLayout<kBc, kSwz>;  // P_ij, only without kPInRegisters: rows of Bc
  static constexpr int kSmemElems = kBr * D + 2 * kStages * kBc * D + (kPRegs ? 0 : kBr * kBc);
  static constexpr int kSmemBytes = kSmemElems * int(sizeof(T));
  static_assert(D % 16 == 0 && kBc % 16 == 0 && (D / 8) % 2 == 0, "mma k16 steps, n8 pairs");
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an H100 block can have");
};

// The backward's arguments, as its dense kernels take them: exactly the fields they always
// took (the parameter struct's layout shapes nvcc's code: see FwdArgs).
struct BwdArgs {
  const void* q;     // [B, H, M, d] in T (the forward's Q: negated when scale < 0)
  const void* k;     // [B, Hkv, N, d]
  const void* v;     // [B, Hkv, N, d]
  const void* o;     // [B, H, M, d], the forward's output
  const void* dout;  // [B, H, M, d]
  const float* lse;  // [B, H, M], the forward's, natural log
  float* lse2;       // [B, H, M] workspace: LSE * log2(e), +inf for rows with no visible key
  float* dsum;       // [B, H, M] workspace: D = rowsum(dO o O)
  float* dq_acc;     // [B, H, M, d] workspace: fp32 dQ / scale, summed over the K/V tiles
  void* dq;          // [B, H, M, d] in T
  void* dk;          // [B, Hkv, N, d]
  void* dv;          // [B, Hkv, N, d]
  int batch, heads, heads_kv, group, seq_q, seq_k;
  float scale;       // |scale|: S = scale Q K^T with the forward's Q
  float scale_log2;  // |scale| * log2(e)
  float scale_dq;    // the signed scale: dQ = scale dS K for the caller's Q
  bool causal;
};

// What a caller fills in to run the backward (BwdKernel, tensor_core_fa2_backward.cuh): the
// arguments above and the features (FeatureParams). Zero-initialised (BwdParams bp{}), the
// block mask and dropout are off.
struct BwdParams : BwdArgs, FeatureParams {};

// The main kernel with a block mask or dropout takes BwdFeatureArgs.
struct BwdFeatureArgs : BwdArgs {
  const int32_t* blk_count;  // the CSR lists, as in BwdParams
  const int32_t* blk_index;
  // The mask row of (b, query head h, K/V tile): b * mask_bstride + h * mask_hstride + (K/V
  // tile) / mask_k_tiles (0 strides where the mask is shared); mask_q_tiles Q tiles per mask
  // query block.
  int mask_bstride, mask_hstride, mask_q_tiles, mask_k_tiles, mask_q_blocks;
  // Dropout: the Philox key, the keep threshold dropout::threshold(p), 1 / (1 - p).
  uint32_t seed_lo, seed_hi, drop_thresh;
  float drop_scale;
};
template <bool kDropout, bool kSparse>
using BwdArgsFor = std::conditional_t<kDropout || kSparse, BwdFeatureArgs, BwdArgs>;

// On the host, the features of p in the form the kernels take them, into a (FwdFeatureArgs or
// BwdFeatureArgs): the block lists; the mask row strides, for rows_per_head mask rows per
// (batch, head) (0 where the mask is shared); the tiles per mask block; the Philox key, the keep
// threshold dropout::threshold(p) and 1 / (1 - p). The caller adds the length of a row.
template <class FeatureArgs>
void set_features(FeatureArgs& a, const FeatureParams& p, int rows_per_head, int br, int bc) {
  if (p.blk_count) {
    a.blk_count = p.blk_count, a.blk_index = p.blk_index;
    a.mask_hstride = p.mask_heads == 1 ? 0 : rows_per_head;
    a.mask_bstride = p.mask_batch == 1 ? 0 : p.mask_heads * rows_per_head;
    a.mask_q_tiles = p.mask_block_q / br, a.mask_k_tiles = p.mask_block_k / bc;
  }
  if (p.dropout_p > 0) {
    a.seed_lo = uint32_t(p.dropout_seed), a.seed_hi = uint32_t(p.dropout_seed >> 32);
    a.drop_thresh = dropout::threshold(p.dropout_p);
    a.drop_scale = float(1.0 / (1.0 - p.dropout_p));
  }
}

// The tiles. Bc = 128 keys (8 warps x 16): a larger Bc means fewer passes over Q_i, dO_i and
// fewer dQ atomics (both scale with Tc = N / Bc).
// Br queries per item, set by the registers: per thread, dK_j and dV_j take d fp32
// (2 x 16 x d / 32); S^T, then dP^T, take Br / 2 fp32 while P^T and dS^T wait packed in T
// (Br / 4 registers each); and ptxas keeps many swizzled fragment addresses. Br = 64 at
// d = 128 is 255 registers with no spill. At d = 64, Br = 128 (255 registers, 4 bytes
// spilled) is 3% faster than Br = 64: every K_j, V_j fragment and the dQ product's reads of
// K_j serve twice the queries, 11% less shared-memory traffic per query. d = 32 and 96 keep
// Br = 64 (Br = 128 spills more at d = 32 and was not measured).
// dQ_i (Br x d) is split over the 8 warps as 2 x 4 parts of 32 x 32 at d = 128 (each
// fragment read from shared memory feeds two mma), else as 4 x 2 parts of Br/4 x d/2.
template <class T, int D>
struct BwdConfig {
  static constexpr int kD = D;
  static constexpr int kWarps = 8, kThreads = kWarps * 32;
  static constexpr int kBc = kWarps * 16, kBr = D == 64 ? 128 : 64;
  static constexpr int kWarpsQ = D == 128 ? 2 : 4, kWarpsD = kWarps / kWarpsQ;
  static constexpr int kDQRows = kBr / kWarpsQ, kDQCols = D / kWarpsD;  // a warp's part of dQ_i
  static constexpr bool kAsync = true;                                  // load_tile: cp.async
  using QKV = SmemLayout<D, true>;    // K_j, V_j, Q_i, dO_i: rows of d
  using DSL = SmemLayout<kBr, true>;  // dS^T: Bc rows (keys) of Br (queries)
  // K_j, V_j; two stages of Q_i, dO_i; two buffers of dS^T (16-bit); two stages of L_i, D_i.
  static constexpr int kSmemBytes =
      int(sizeof(T)) * (2 * kBc * D + 2 * 2 * kBr * D + 2 * kBc * kBr) + 4 * 2 * 2 * kBr;
  static_assert(D % 16 == 0 && kBr % 16 == 0, "mma k16 steps");
  static_assert(kDQRows % 16 == 0 && kDQCols % 16 == 0, "dQ warp tiles of m16 x (n8 pairs)");
  static_assert(2 * kBr <= kThreads, "one thread per row copies L_i, one D_i");
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an H100 block can have");
};

}  // namespace ladder::step06
