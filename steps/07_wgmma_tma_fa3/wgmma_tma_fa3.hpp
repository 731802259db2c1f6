// Step 07's forward pass, host side: FlashAttention on Hopper (TMA, wgmma, warp
// specialisation), bf16 or fp16 in, fp32 accumulation, head dims 64 and 128, sm_90a only.
//
// Use:
//   ladder::fa3::FwdParams p;  // device pointers, shapes, scale > 0, causal, ...
//   const ladder::fa3::FwdPlan plan = ladder::fa3::make_plan(p, variant);  // host work, once
//   ladder::fa3::launch(plan, stream);                                     // the timed part
//
// Layouts (row-major, 16-byte aligned device pointers): Q, O [batch, heads, seq_q, dim];
// K, V [batch, heads_kv, seq_k, dim]; LSE [batch, heads, seq_q] fp32, natural log. Query head h
// reads K/V head h / (heads / heads_kv). Causal is bottom-right aligned (key j visible to query
// i iff j <= i + seq_k - seq_q); a row with no visible key gets O = 0 and LSE = -inf.
// A negative softmax scale is the caller's: negate Q (exact in bf16/fp16) and pass |scale|.
//
// The plan holds the encoded tensor maps, so it is tied to the pointers and shapes it was made
// for; make a new one when they change. Nothing here includes device code.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace ladder::fa3 {

// The kernels, one idea each on top of the previous one (fwd_consumer.cuh has a main loop per
// schedule). kVariants names and describes each once: the step's descriptor (--help,
// `ladder list`), variant_name() and the self-tests read it. Ladder order, baseline first.
enum class Variant {
  wgmma,
  tma_wgmma,
  warp_specialized,
  pingpong,
  intra_overlap,
  persistent,
  three_consumers,
};
struct VariantInfo {
  Variant id;
  const char* name;  // the --variant name
  const char* idea;  // what it adds, in one line
};
inline constexpr VariantInfo kVariants[] = {
    {Variant::wgmma, "wgmma",
     "wgmma from 128-byte swizzled shared memory, P from registers; K_j, V_j staged by cp.async "
     "from every thread, no roles (the baseline)"},
    {Variant::tma_wgmma, "tma-wgmma",
     "+ TMA: one thread issues whole-tile copies that complete on mbarriers, which every "
     "thread waits on"},
    {Variant::warp_specialized, "warp-specialized",
     "+ a producer warpgroup issuing TMA, full/empty mbarriers, setmaxnreg 24/240"},
    {Variant::pingpong, "pingpong",
     "+ ping-pong: named barriers put one warpgroup's softmax under the other's GEMMs"},
    {Variant::intra_overlap, "intra-overlap",
     "+ intra-warpgroup overlap: the next tile's S GEMM issued before this tile's softmax"},
    {Variant::persistent, "persistent",
     "+ persistent: one CTA per SM takes work items from a tile scheduler, heaviest first, and "
     "loads the next item under this one's epilogue"},
    {Variant::three_consumers, "three-consumers",
     "+ d = 64: three consumer warpgroups (Br = 192, setmaxnreg 24/160); d = 128 and dropout or "
     "masks run 'persistent'"},
};
const char* variant_name(Variant v);  // kVariants' name of v

// The persistent variants need FwdParams::tile_counter; they (and only they) run dropout and
// block masks.
constexpr bool is_persistent(Variant v) {
  return v == Variant::persistent || v == Variant::three_consumers;
}

// The query tile Br a run uses. three_consumers at d = 64 without a block mask (whose 128-row
// blocks a 192-row tile would straddle) runs 192-row tiles, with dropout or without, unless
// rounding seq_q up to a multiple of 192 computes more than 1/32 more rows than rounding it up
// to 128 (seq 1024: 1152 rows against 1024, so it stays at 128; seq 2048 ... 16384 take 192).
// Everything else: 128. Bc is 128 everywhere.
constexpr int query_tile(Variant v, int dim, bool block_mask, int seq_q) {
  if (v != Variant::three_consumers || dim != 64 || block_mask) return 128;
  const long long rows192 = (seq_q + 191LL) / 192 * 192, rows128 = (seq_q + 127LL) / 128 * 128;
  return rows192 * 32 <= rows128 * 33 ? 192 : 128;
}

// Where element (b, h, r, x) of a [batch, heads, rows, dim] tensor sits: at b * batch + h * head
// + r * row + x elements from its base (dim contiguous), so that a view such as
// nn.Linear(...).view(B, T, H, d).transpose(1, 2) is read in place. All three 0 (the default):
// the dense row-major layout of the contract. Each stride a multiple of 8 elements (16 bytes,
// as the TMA unit and 16-byte accesses need).
struct Strides {
  int64_t batch = 0, head = 0, row = 0;
  bool dense() const { return batch == 0 && head == 0 && row == 0; }
};
// The rule Strides must follow (the TMA unit's and the 16-byte accesses'): every stride a
// non-negative multiple of 8 elements (16 bytes) below 2^40 bytes.
inline bool strides_ok(const Strides& s) {
  for (int64_t x : {s.batch, s.head, s.row})
    if (x < 0 || x % 8 != 0 || x >= (int64_t(1) << 39)) return false;
  return true;
}
// The strides a tensor has: `s` itself, or, where it is all 0, the dense layout's.
inline Strides resolved(Strides s, int heads, int rows, int dim) {
  return s.dense() ? Strides{int64_t(heads) * rows * dim, int64_t(rows) * dim, dim} : s;
}

// What the forward and the backward both take: the shapes, the dtype, the softmax, dropout, the
// strides of Q, K, V, O and the geometry of a block mask.
struct Attention {
  Strides q_strides, k_strides, v_strides, o_strides;  // default: dense
  int batch = 0, heads = 0, heads_kv = 0, seq_q = 0, seq_k = 0, dim = 0;
  bool bf16 = true;
  float scale = 0.f;  // > 0 (see above)
  bool causal = false;

  // Dropout (the forward's persistent variants only): O = (P o Z / (1 - p)) V, Z from
  // Philox4x32-10 keyed by the seed (the mapping of docs/CONTRACT.md); 0 = off. LSE is that of
  // P, undropped. The backward takes the forward's rate and seed.
  float dropout_p = 0.f;
  uint64_t dropout_seed = 0;

  // A block mask's geometry (its lists: FwdParams::kv_count, BwdParams::q_count): blocks of
  // block_m query rows x block_n keys (multiples of 128); mask_batch is 1 or batch, mask_heads 1
  // or heads; mask row (b', h', I) has b' = 0 if mask_batch == 1 else b, h' likewise; nI =
  // ceil(seq_q / block_m), nJ = ceil(seq_k / block_n). Causal still applies inside.
  int block_m = 128, block_n = 128;
  int mask_batch = 1, mask_heads = 1;
};

struct FwdParams : Attention {
  const void* q = nullptr;  // [batch, heads, seq_q, dim], bf16 or fp16
  const void* k = nullptr;  // [batch, heads_kv, seq_k, dim]
  const void* v = nullptr;  // [batch, heads_kv, seq_k, dim]
  void* o = nullptr;        // [batch, heads, seq_q, dim]
  float* lse = nullptr;     // [batch, heads, seq_q] (dense)

  // Block-sparse (persistent variants only; off when kv_count is null), for mask row (b', h', I):
  //   n = kv_count[(b' * mask_heads + h') * nI + I]                       visible key blocks
  //   kv_index[((b' * mask_heads + h') * nI + I) * nJ + t], t < n, ascending: their indices
  const int* kv_count = nullptr;
  const int* kv_index = nullptr;

  // The persistent variants' work counter: 4 bytes of device memory that make_plan zeroes and
  // every launch leaves zero (the CTA that takes the last item resets it). Launches that share
  // one counter must not run at the same time (one stream, or one counter per stream).
  unsigned int* tile_counter = nullptr;

  // Trace build (tma_wgmma, intra_overlap and the persistent variants, bf16, dim 128): when
  // non-null, the first block records %globaltimer stamps here, kTraceWarps x kTraceSlots
  // records {phase (TracePhase, 0 = unused slot), tile, t0_ns, t1_ns}; zero it first.
  unsigned long long* trace = nullptr;
};

constexpr int kTraceWarps = 12, kTraceSlots = 256, kTraceWords = 4;
constexpr size_t kTraceBufferWords = size_t(kTraceWarps) * kTraceSlots * kTraceWords;
enum TracePhase : int {
  kTraceUnused = 0,
  kTraceTmaIssueK,  // producer: K_j's copy started (t0 = t1)
  kTraceTmaIssueV,  // producer: V_j's copy started
  kTraceWaitK,      // consumer: waiting for K_j to land (t0 wait begins, t1 data seen)
  kTraceWaitV,      // consumer: waiting for V_j
  kTraceGemmS,      // consumer: S = Q K_j^T issued (t0) .. its wgmma wait returned (t1)
  kTraceGemmPV,     // consumer: O += P V_j issued .. waited
  kTraceSoftmax,    // consumer: mask + online softmax of tile j
};
const char* trace_phase_name(int phase);  // "tma_issue_k", ..., "softmax"
const char* trace_role_name(int phase);   // "producer" or "consumer"

// Encoded tensor maps + the chosen instantiation + launch shape. Plain data; cheap to copy.
struct FwdPlan {
  alignas(64) unsigned char tensor_maps[3][128];  // CUtensorMap for Q, K, V (opaque here)
  FwdParams params;
  Variant variant = Variant::intra_overlap;
  void (*launcher)(const FwdPlan&, cudaStream_t) = nullptr;  // the chosen instantiation's
  dim3 grid, block;
  int smem_bytes = 0, regs = 0, br = 0, bc = 0, stages = 0;
  int consumers = 2;      // consumer warpgroups (Br / 64)
  int items = 0;          // persistent: work items (query tiles x heads x batch); grid.x CTAs
  int section_heads = 0;  // persistent: heads per L2 section of the schedule
};

// Checks the parameters, encodes the tensor maps, sets the kernel's shared-memory limit, and
// zeroes tile_counter (persistent variants; this waits for the device).
// Throws std::invalid_argument for unsupported parameters, std::runtime_error on CUDA errors.
FwdPlan make_plan(const FwdParams& p, Variant v);

// Enqueues the kernel on `stream` and checks that the launch was accepted.
void launch(const FwdPlan& plan, cudaStream_t stream = 0);

// "tma-wgmma Br=128 Bc=128 threads=256 smem=164864 regs=... stages=2 ..."
std::string describe(const FwdPlan& plan);

// ---------------------------------------------------------------------------------------------
// The backward pass (wgmma_tma_fa3_backward.cu): dQ, dK, dV from Q, K, V, O, dO and the
// forward's LSE, in three launches on one stream (pre-pass, main kernel, post-pass).
//
// Use:
//   ladder::fa3::BwdParams b;  // device pointers (inputs, outputs, workspace), shapes, ...
//   const ladder::fa3::BwdWorkspace ws = ladder::fa3::bwd_workspace(b);  // allocate these
//   const ladder::fa3::BwdPlan plan = ladder::fa3::make_bwd_plan(b);     // host work, once
//   ladder::fa3::launch_bwd(plan, stream);                               // the timed part
//
// Layouts as the forward's; dQ, dO like Q, dK, dV like K. The workspace the caller provides
// (16-byte aligned, contents irrelevant: the pre-pass writes all of it):
//   dq_acc  [batch, heads, seq_q, dim] fp32     dQ / scale, summed over the K/V tiles
//   lse2    [batch, heads, rows_padded] fp32    LSE * log2(e), +inf for rows with no visible
//                                               key and for the padding rows
//   dsum    [batch, heads, rows_padded] fp32    D = rowsum(dO o O), 0 in the padding rows
// with rows_padded = seq_q rounded up to kBwdRowPad, so that every Q tile's LSE and D rows are
// one aligned 1-D bulk copy.
// ---------------------------------------------------------------------------------------------

constexpr int kBwdRowPad = 128;

// How dQ's partial sums reach the fp32 accumulator (both give the same result up to the order
// of fp32 additions).
enum class BwdVariant {
  tma_reduce,  // staged in shared memory, added by the copy engine (cp.reduce.async.bulk.tensor)
  atomic,      // red.global.add.v4.f32 from registers
};
const char* bwd_variant_name(BwdVariant v);  // "tma-reduce", "atomic"

struct BwdParams : Attention {  // Attention: the forward's
  const void* q = nullptr;      // [batch, heads, seq_q, dim], bf16 or fp16: the forward's Q
  const void* k = nullptr;      // [batch, heads_kv, seq_k, dim]
  const void* v = nullptr;      // [batch, heads_kv, seq_k, dim]
  const void* o = nullptr;      // [batch, heads, seq_q, dim]: the forward's output
  const void* dout = nullptr;   // [batch, heads, seq_q, dim]
  const float* lse = nullptr;   // [batch, heads, seq_q]: the forward's, natural log (dense)
  void* dq = nullptr;           // [batch, heads, seq_q, dim]
  void* dk = nullptr;           // [batch, heads_kv, seq_k, dim]
  void* dv = nullptr;           // [batch, heads_kv, seq_k, dim]
  float* dq_acc = nullptr;      // workspace (above)
  float* lse2 = nullptr;
  float* dsum = nullptr;
  // dO may be a strided view too; dQ, dK, dV and the workspace are dense.
  Strides dout_strides;
  // A caller with a negative softmax scale ran the forward on -Q with |scale|: passing that
  // -Q here and negate_dq = true gives dQ for the original Q (dK, dV need nothing).
  bool negate_dq = false;

  // Block-sparse (off when q_count is null), for mask row (b', h', J), r = (b' mask_heads + h')
  // nJ + J: n = q_count[r] kept query blocks of key block J, q_index[r * nI + t] (t < n,
  // ascending) their indices.
  const int* q_count = nullptr;
  const int* q_index = nullptr;

  // With tile_counter and no block mask the main kernel is persistent: as many CTAs as fit at
  // once, each taking the next K/V tile from the counter as it finishes one (4 bytes of device
  // memory; the pre-pass zeroes it and the main kernel leaves it zero, so it may be the
  // forward's: one stream's launches never overlap). Without it, one CTA per K/V tile; a
  // persistent plan refuses to launch without it. max_ctas > 0 caps the persistent CTAs (the
  // self-test gives CTAs several tiles at small shapes this way).
  unsigned int* tile_counter = nullptr;
  int max_ctas = 0;
};

struct BwdWorkspace {
  size_t dq_acc_bytes = 0, lse2_bytes = 0, dsum_bytes = 0;
  int rows_padded = 0;
};
BwdWorkspace bwd_workspace(const BwdParams& p);

struct BwdPlan {
  alignas(64) unsigned char tensor_maps[5][128];  // CUtensorMap for Q, K, V, dO, dQ_acc
  BwdParams params;
  BwdVariant variant = BwdVariant::tma_reduce;
  void (*launcher)(const BwdPlan&, cudaStream_t) = nullptr;  // the chosen instantiation's
  dim3 grid, block;
  int smem_bytes = 0, regs = 0, br = 0, bc = 0, stages = 0;
  int units = 0;  // K/V tiles x K/V heads x batch
  // Fewer CTAs than units: they take units from params.tile_counter (persistent).
  bool persistent() const { return grid.x < unsigned(units); }
};

// Checks the parameters, encodes the tensor maps, sets the main kernel's shared-memory limit.
// Throws std::invalid_argument for unsupported parameters, std::runtime_error on CUDA errors.
BwdPlan make_bwd_plan(const BwdParams& p, BwdVariant v = BwdVariant::tma_reduce);

// Enqueues pre-pass, main kernel and post-pass on `stream`, checking each launch.
void launch_bwd(const BwdPlan& plan, cudaStream_t stream = 0);

// "bwd tma-reduce bf16 d=128 Bc=128 Br=64 threads=384 ..."
std::string describe(const BwdPlan& plan);

}  // namespace ladder::fa3
