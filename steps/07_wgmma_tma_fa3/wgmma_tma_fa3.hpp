// Step 07's forward pass, host side: FlashAttention on Hopper (TMA, wgmma, warp
// specialisation), bf16 or fp16 in, fp32 accumulation, head dims 64 and 128, sm_90a only.
//
// Use:
//   ladder::fa3::FwdParams p;  // device pointers, shapes, scale > 0, causal, ...
//   std::string why;
//   if (!ladder::fa3::supported(variant, p.bf16, p.dim, &why)) ...;
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

// The four kernels, one idea each on top of the previous one (wgmma_tma_fa3.cu says how):
enum class Variant {
  tma_wgmma,         // TMA tile loads + wgmma; every thread waits on the barriers; no roles
  warp_specialized,  // + a producer warpgroup, full/empty barrier pairs, setmaxnreg
  pingpong,          // + named barriers: one warpgroup's softmax under the other's GEMMs
  intra_overlap,     // + S_{j+1} = Q K_{j+1}^T issued before softmax_j finishes (the default)
};
constexpr Variant kAllVariants[] = {Variant::tma_wgmma, Variant::warp_specialized,
                                    Variant::pingpong, Variant::intra_overlap};
const char* variant_name(Variant v);  // "tma-wgmma", "warp-specialized", "pingpong", ...

struct FwdParams {
  const void* q = nullptr;  // [batch, heads, seq_q, dim], bf16 or fp16
  const void* k = nullptr;  // [batch, heads_kv, seq_k, dim]
  const void* v = nullptr;  // [batch, heads_kv, seq_k, dim]
  void* o = nullptr;        // [batch, heads, seq_q, dim]
  float* lse = nullptr;     // [batch, heads, seq_q]
  int batch = 0, heads = 0, heads_kv = 0, seq_q = 0, seq_k = 0, dim = 0;
  bool bf16 = true;
  float scale = 0.f;  // > 0 (see above)
  bool causal = false;

  // Dropout (intra_overlap only): O = (P o Z / (1 - p)) V, Z from Philox4x32-10 keyed by the
  // seed (the mapping of docs/CONTRACT.md); 0 = off. LSE is that of P, undropped.
  float dropout_p = 0.f;
  uint64_t dropout_seed = 0;

  // Block-sparse (intra_overlap only; off when kv_count is null). Mask blocks of block_m query
  // rows x block_n keys (multiples of 128). For mask row (b', h', I), with b' = 0 if
  // mask_batch == 1 else b (mask_batch is 1 or batch; mask_heads likewise 1 or heads):
  //   n = kv_count[(b' * mask_heads + h') * nI + I]                       visible key blocks
  //   kv_index[((b' * mask_heads + h') * nI + I) * nJ + t], t < n, ascending: their indices
  // with nI = ceil(seq_q / block_m), nJ = ceil(seq_k / block_n). Causal still applies inside.
  const int* kv_count = nullptr;
  const int* kv_index = nullptr;
  int block_m = 128, block_n = 128;
  int mask_batch = 1, mask_heads = 1;

  // Trace build (tma_wgmma and intra_overlap, bf16, dim 128): when non-null, block (0, 0, 0)
  // records %globaltimer stamps here, kTraceWarps x kTraceSlots records of 4 words
  // {phase (TracePhase, 0 = unused slot), tile, t0_ns, t1_ns}; zero it before the launch.
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
  const void* kernel = nullptr;  // the instantiation
  int instantiation = -1;        // its index in the .cu's switch
  dim3 grid, block;
  int smem_bytes = 0, regs = 0, br = 0, bc = 0, stages = 0;
};

// Whether this variant has an instantiation for the dtype and head dim (64, 128); if not,
// *why (when non-null) says what exists.
bool supported(Variant v, bool bf16, int dim, std::string* why);

// Checks the parameters, encodes the tensor maps, sets the kernel's shared-memory limit.
// Throws std::invalid_argument for unsupported parameters, std::runtime_error on CUDA errors.
FwdPlan make_plan(const FwdParams& p, Variant v);

// Enqueues the kernel on `stream` and checks that the launch was accepted.
void launch(const FwdPlan& plan, cudaStream_t stream = 0);

// "tma-wgmma Br=128 Bc=128 threads=256 smem=164864 regs=... stages=2 ..."
std::string describe(const FwdPlan& plan);

}  // namespace ladder::fa3
