// Rung 07 (Hopper FlashAttention: TMA, wgmma, warp specialisation; bf16/fp16, d = 64 and 128)
// behind the rung_api.h seam, through the step's own host API (wgmma_tma_fa3.hpp): fill its
// parameters as steps/07_wgmma_tma_fa3/host.cu does, make a plan, launch it on PyTorch's
// stream. Host code only (the kernels are the step's .cu files, compiled into the same
// library), so g++ compiles this file.
//
// A plan holds the TMA tensor maps, which encode the tensors' addresses and shapes. Making one
// is host work (cudaGetDeviceProperties, tensor-map encoding, kernel attributes) and, for the
// persistent kernels, a memset of the work counter and a device-wide synchronisation: far too
// much for every call, and impossible during a CUDA graph capture. So the adaptor makes one
// plan per *shape* (device, extents, strides, dtype, scale, causal, direction, and whether
// dropout or a block mask runs) and, for each call, copies it and points it at the call's
// buffers and features: the pointers, dropout seed and mask lists in its parameters, and the
// address field of each tensor map by the driver's cuTensorMapReplaceAddress (a host-side edit
// of the 128-byte map; shape, strides and box stay what make_plan encoded). The maps' order is
// the header's: forward Q, K, V; backward Q, K, V, dO, dQ_acc. A call needs no synchronisation
// once its shape has been seen, whatever its addresses, so a training loop or a graph capture
// whose buffers move never stalls; only a shape seen first during a capture raises (run it
// once before).
#include <cuda.h>
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include "07_wgmma_tma_fa3/capabilities.hpp"
#include "rung_api.h"
#include "wgmma_tma_fa3.hpp"

namespace ladder_torch::rung07 {
namespace {

namespace fa3 = ladder::fa3;

// The rung's default kernels: the forward's three-consumer variant (Br = 192 at d = 64 where
// seq_q pads well to 192, else the persistent two-consumer kernel) and the backward's dQ by TMA
// reduce-add.
constexpr fa3::Variant kVariant = fa3::Variant::three_consumers;
constexpr fa3::BwdVariant kBwdVariant = fa3::BwdVariant::tma_reduce;

// What the plans cost, for the profiling script (torch.ops.ladder.cuda_counters): plans made by
// make_plan / make_bwd_plan (each a device query, and for the forward a synchronisation), and
// calls (each a copy of a cached plan, re-pointed where its addresses differ).
std::atomic<int64_t> g_made{0}, g_calls{0};
const CounterRegistrar kCounters{{"rung7.plans_made", &g_made}, {"rung7.calls", &g_calls}};

uint64_t word(float x) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

void check_cu(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS)
    throw std::runtime_error(std::string(what) + " failed with CUresult " + std::to_string(int(r)));
}

// The driver's cuTensorMapReplaceAddress, found through the runtime as step 07 finds
// cuTensorMapEncodeTiled (no -lcuda at link time).
using ReplaceAddress = CUresult (*)(CUtensorMap*, void*);
ReplaceAddress replace_address() {
  static const ReplaceAddress fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapReplaceAddress", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || f == nullptr)
      throw std::runtime_error("the driver has no cuTensorMapReplaceAddress");
    return reinterpret_cast<ReplaceAddress>(f);
  }();
  return fn;
}

void repoint(unsigned char (&map)[128], const void* address) {
  check_cu(replace_address()(reinterpret_cast<CUtensorMap*>(map), const_cast<void*>(address)),
           "cuTensorMapReplaceAddress");
}

// One plan per key, made once (without the lock held, so that make_plan's synchronisation never
// waits on another thread); a model has a handful of shapes, so the map stays small.
template <class Key, class Plan>
class PlanCache {
 public:
  template <class Make>
  Plan get(const Key& key, Make&& make) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      auto it = plans_.find(key);
      if (it != plans_.end()) return it->second;
    }
    Plan plan = make();
    g_made.fetch_add(1, std::memory_order_relaxed);
    const std::lock_guard<std::mutex> lock(mutex_);
    return plans_.emplace(key, plan).first->second;
  }

 private:
  std::mutex mutex_;
  std::map<Key, Plan> plans_;
};

// Whether `stream` is being captured into a CUDA graph.
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaError_t e = cudaStreamIsCapturing(stream, &capture); e != cudaSuccess)
    throw std::runtime_error(std::string("cudaStreamIsCapturing: ") + cudaGetErrorString(e));
  return capture != cudaStreamCaptureStatusNone;
}

// The persistent kernels' work counter (forward and backward): 4 bytes of device memory that
// every launch leaves at zero. Launches that share one must not overlap, so there is one per
// (device, stream), kept for the life of the process (a stream's launches run one after
// another). A new counter is zeroed on its own stream, before the launch that will use it
// (captured into the graph when the stream is capturing); its allocation is made in relaxed
// capture mode, as PyTorch's allocator makes its own.
unsigned int* tile_counter(int dev, cudaStream_t stream) {
  static std::mutex mutex;
  static std::map<std::pair<int, uintptr_t>, unsigned int*> counters;
  const std::lock_guard<std::mutex> lock(mutex);
  unsigned int*& c = counters[{dev, reinterpret_cast<uintptr_t>(stream)}];
  if (c == nullptr) {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, sizeof(unsigned int));
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (e != cudaSuccess)
      throw std::runtime_error(std::string("cudaMalloc of the tile counter: ") +
                               cudaGetErrorString(e));
    if (cudaError_t z = cudaMemsetAsync(p, 0, sizeof(unsigned int), stream); z != cudaSuccess)
      throw std::runtime_error(std::string("zeroing the tile counter: ") + cudaGetErrorString(z));
    c = static_cast<unsigned int*>(p);
  }
  return c;
}

// Before make_plan on `stream`: no capture may be under way (make_plan synchronises the device),
// and no launch that uses the counter may still run (make_plan zeroes it with a memset that
// does not wait for a non-blocking stream).
void ready_to_plan(cudaStream_t stream) {
  if (capturing(stream))
    throw std::runtime_error(
        "a new shape while a CUDA graph is being captured: making rung 7's plan synchronises "
        "the device. Run the same shapes once before capturing (their plans are cached)");
  if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess)
    throw std::runtime_error(std::string("cudaStreamSynchronize: ") + cudaGetErrorString(e));
}

// The shape part of a plan: everything make_plan encodes or checks but the addresses. The
// strides are in it (a tensor map encodes them), and so are the features' shape (dropout or a
// block mask runs other kernels, with other tiles; the mask's block and sharing are checked
// there); the dropout rate and seed and the mask's lists are the call's, like its pointers.
using ShapeKey = std::array<int64_t, 32>;

struct KeyBuilder {
  ShapeKey key{};
  size_t n = 0;
  KeyBuilder& operator<<(int64_t x) {
    if (n == key.size()) throw std::logic_error("rung 7's plan key is too short");
    key[n++] = x;
    return *this;
  }
  KeyBuilder& operator<<(const fa3::Strides& s) { return *this << s.batch << s.head << s.row; }
};

template <class Params>
KeyBuilder shape_key(int dev, const Params& p, float scale, bool extras) {
  KeyBuilder k;
  k << dev << p.batch << p.heads << p.heads_kv << p.seq_q << p.seq_k << p.dim << p.bf16
    << int64_t(word(scale)) << p.causal << extras << p.block_m << p.block_n << p.mask_batch
    << p.mask_heads;
  return k;
}

fa3::Strides strides(const Strides& s) {
  fa3::Strides t;
  t.batch = s.batch, t.head = s.head, t.row = s.row;
  return t;
}

// The fields the step's FwdParams and BwdParams share, from the seam's FwdArgs or BwdArgs: Q, K,
// V and their strides, the shape, dtype, scale, causal mask, dropout (float rate, as step 07's
// host.cu passes it) and the block mask's block and sharing.
template <class Params, class Args>
void set_common(Params& p, const Args& a, bool bf16) {
  p.q = a.q, p.k = a.k, p.v = a.v;
  p.q_strides = strides(a.q_strides), p.k_strides = strides(a.k_strides);
  p.v_strides = strides(a.v_strides), p.o_strides = strides(a.o_strides);
  p.batch = a.batch, p.heads = a.heads, p.heads_kv = a.heads_kv;
  p.seq_q = a.seq_q, p.seq_k = a.seq_k, p.dim = a.dim;
  p.bf16 = bf16;
  p.scale = a.scale;  // > 0: the caller negated Q for a negative scale (positive_scale below)
  p.causal = a.causal;
  p.dropout_p = float(a.dropout_p), p.dropout_seed = a.dropout_seed;
  if (a.mask.count != nullptr) {
    p.block_m = a.mask.block_q, p.block_n = a.mask.block_k;
    p.mask_batch = a.mask.mask_batch, p.mask_heads = a.mask.mask_heads;
  }
}

cudaError_t forward(const FwdArgs& a, cudaStream_t stream, bool bf16) {
  static PlanCache<ShapeKey, fa3::FwdPlan> cache;
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  fa3::FwdParams f;
  set_common(f, a, bf16);
  f.o = a.o, f.lse = a.lse;
  f.kv_count = a.mask.count, f.kv_index = a.mask.index;  // null: no block mask
  f.tile_counter = tile_counter(dev, stream);
  const bool extras = f.dropout_p > 0.f || f.kv_count != nullptr;
  KeyBuilder key = shape_key(dev, f, f.scale, extras);
  key << f.q_strides << f.k_strides << f.v_strides << f.o_strides;
  fa3::FwdPlan plan = cache.get(key.key, [&] {
    ready_to_plan(stream);
    return fa3::make_plan(f, kVariant);
  });
  if (plan.params.q != f.q || plan.params.k != f.k || plan.params.v != f.v) {
    repoint(plan.tensor_maps[0], f.q);
    repoint(plan.tensor_maps[1], f.k);
    repoint(plan.tensor_maps[2], f.v);
  }
  g_calls.fetch_add(1, std::memory_order_relaxed);
  plan.params = f;            // the call's buffers, features and counter; the shape is the key's
  fa3::launch(plan, stream);  // throws on a refused launch
  return cudaSuccess;
}

cudaError_t backward(const BwdArgs& a, cudaStream_t stream, bool bf16) {
  static PlanCache<ShapeKey, fa3::BwdPlan> cache;
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  fa3::BwdParams b;
  set_common(b, a, bf16);  // the forward's scale, with the Q it was given
  b.o = a.o, b.dout = a.dout, b.lse = a.lse;
  b.dout_strides = strides(a.dout_strides);
  b.dq = a.dq, b.dk = a.dk, b.dv = a.dv;
  b.dq_acc = a.dq_acc, b.lse2 = a.lse2, b.dsum = a.dsum;
  b.tile_counter = tile_counter(dev, stream);  // the forward's: one stream's launches are in order
  b.negate_dq = a.scale_dq < 0;  // Q arrives negated: dQ for the caller's Q is the negation
  b.q_count = a.mask.count, b.q_index = a.mask.index;  // null: no block mask
  const bool extras = b.dropout_p > 0.f || b.q_count != nullptr;
  KeyBuilder key = shape_key(dev, b, b.scale, extras);
  key << b.negate_dq << b.q_strides << b.k_strides << b.v_strides << b.o_strides << b.dout_strides;
  fa3::BwdPlan plan = cache.get(key.key, [&] {
    // The caller sized lse2 and dsum by bwd_row_pad (below); the step says what it reads.
    const int rows = (b.seq_q + fa3::kBwdRowPad - 1) / fa3::kBwdRowPad * fa3::kBwdRowPad;
    if (fa3::bwd_workspace(b).rows_padded != rows)
      throw std::logic_error("the backward's padded rows differ from the workspace's");
    if (capturing(stream))
      throw std::runtime_error(
          "a new shape while a CUDA graph is being captured: run the same shapes once before "
          "capturing (rung 7's plans are cached)");
    // No synchronisation: the backward's pre-pass zeroes the counter on the stream.
    return fa3::make_bwd_plan(b, kBwdVariant);
  });
  const void* const addresses[5] = {b.q, b.k, b.v, b.dout, b.dq_acc};
  const void* const planned[5] = {plan.params.q, plan.params.k, plan.params.v, plan.params.dout,
                                  plan.params.dq_acc};
  for (int i = 0; i < 5; ++i)
    if (addresses[i] != planned[i]) repoint(plan.tensor_maps[i], addresses[i]);
  g_calls.fetch_add(1, std::memory_order_relaxed);
  plan.params = b;
  fa3::launch_bwd(plan, stream);  // pre-pass, main kernel, post-pass; throws on a refused launch
  return cudaSuccess;
}

template <bool kBf16>
cudaError_t forward_as(const FwdArgs& a, cudaStream_t stream) {
  return forward(a, stream, kBf16);
}

template <bool kBf16>
cudaError_t backward_as(const BwdArgs& a, cudaStream_t stream) {
  return backward(a, stream, kBf16);
}

// One entry per (dtype, d) of the step's capability table: the step picks the instantiation
// from the parameters at run time.
RungKernels entry(DType dtype, int dim) {
  const bool bf16 = dtype == DType::bf16;
  RungKernels k;
  k.rung = 7, k.dtype = dtype, k.dim = dim;
  k.positive_scale = true;  // the kernels track the row max of the raw scores: scale > 0
  k.bwd_row_pad = fa3::kBwdRowPad;
  // 4-D tensor maps: Q, K, V, O and dO read and written through Strides, by the step's rule.
  k.takes_strides = [](const Strides& s) { return fa3::strides_ok(strides(s)); };
  k.dropout = fa3::is_persistent(kVariant);  // the persistent kernels have the features
  // Mask blocks: multiples of the step's kMaskBlock, make_plan's rule.
  if (k.dropout) k.mask_block_q = k.mask_block_k = ladder::step07::kMaskBlock;
  k.forward = bf16 ? &forward_as<true> : &forward_as<false>;
  k.backward = bf16 ? &backward_as<true> : &backward_as<false>;
  return k;
}

const bool kRegistered = [] {
  for (DType dtype : ladder::step07::kDTypes)
    for (int dim : ladder::step07::HeadDims::values) register_kernels(entry(dtype, dim));
  return true;
}();

}  // namespace
}  // namespace ladder_torch::rung07
