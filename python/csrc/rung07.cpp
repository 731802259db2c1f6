// Rung 07 (Hopper FlashAttention: TMA, wgmma, warp specialisation; bf16/fp16, d = 64 and 128)
// behind the rung_api.h seam, through the step's own host API (wgmma_tma_fa3.hpp): fill its
// parameters as steps/07_wgmma_tma_fa3/host.cu does, make a plan, launch it on PyTorch's
// stream. Host code only (the kernels are the step's .cu files, compiled into the same
// library), so g++ compiles this file.
//
// A plan holds the TMA tensor maps, which encode the tensors' addresses and shapes, so a new
// pointer needs a new plan. Making one is host work (tensor-map encoding, device queries), and
// for the persistent kernels also a memset of the work counter and a device-wide
// synchronisation. The plans are therefore cached, keyed by everything they are made from
// (device, every pointer, every extent, dtype, scale, causal, the counter): a hit is the plan
// make_plan would return again, whatever memory was freed and reused in between. In a training
// loop PyTorch's caching allocator hands out the same addresses step after step, so after the
// first step every call is a hit and nothing synchronises.
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

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

// Enough for a model's layers, forward and backward, with its evaluation pass: every call of a
// training step hits once the allocator's addresses repeat.
constexpr size_t kCachedPlans = 64;

uint64_t word(const void* p) {
  return uint64_t(reinterpret_cast<uintptr_t>(p));
}

uint64_t word(float x) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

// The plans made for the last kCachedPlans keys; the least recently used one goes first.
template <class Key, class Plan>
class PlanCache {
 public:
  // The plan for `key`: the cached one, or make() (called without the lock held, so that a
  // plan's device synchronisation never waits on another thread).
  template <class Make>
  Plan get(const Key& key, Make&& make) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      auto it = entries_.find(key);
      if (it != entries_.end()) {
        it->second.used = ++clock_;
        return it->second.plan;
      }
    }
    Plan plan = make();
    const std::lock_guard<std::mutex> lock(mutex_);
    if (entries_.size() >= kCachedPlans) {
      auto oldest = entries_.begin();
      for (auto it = entries_.begin(); it != entries_.end(); ++it)
        if (it->second.used < oldest->second.used) oldest = it;
      entries_.erase(oldest);
    }
    entries_[key] = Entry{plan, ++clock_};
    return plan;
  }

 private:
  struct Entry {
    Plan plan;
    uint64_t used;
  };
  std::mutex mutex_;
  std::map<Key, Entry> entries_;
  uint64_t clock_ = 0;
};

// The persistent kernels' work counter: 4 bytes of device memory that every launch leaves at
// zero. Launches that share one must not overlap, so there is one per (device, stream), kept
// for the life of the process (a stream's launches run one after another).
unsigned int* tile_counter(int dev, cudaStream_t stream) {
  static std::mutex mutex;
  static std::map<std::pair<int, uintptr_t>, unsigned int*> counters;
  const std::lock_guard<std::mutex> lock(mutex);
  unsigned int*& c = counters[{dev, reinterpret_cast<uintptr_t>(stream)}];
  if (c == nullptr) {
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, sizeof(unsigned int)); e != cudaSuccess)
      throw std::runtime_error(std::string("cudaMalloc of the tile counter: ") +
                               cudaGetErrorString(e));
    c = static_cast<unsigned int*>(p);  // make_plan zeroes it
  }
  return c;
}

// Before a plan is made on `stream`: no launch that uses the stream's counter may still run
// (make_plan zeroes the counter with a memset that does not wait for a non-blocking stream),
// and no capture may be under way (make_plan synchronises the device).
void ready_to_plan(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaError_t e = cudaStreamIsCapturing(stream, &capture); e != cudaSuccess)
    throw std::runtime_error(std::string("cudaStreamIsCapturing: ") + cudaGetErrorString(e));
  if (capture != cudaStreamCaptureStatusNone)
    throw std::runtime_error(
        "a new shape or new buffers while a CUDA graph is being captured: making rung 7's plan "
        "synchronises the device. Run the same calls once before capturing (their plans are "
        "cached)");
  if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess)
    throw std::runtime_error(std::string("cudaStreamSynchronize: ") + cudaGetErrorString(e));
}

using FwdKey = std::array<uint64_t, 16>;
using BwdKey = std::array<uint64_t, 23>;

cudaError_t forward(const FwdArgs& a, cudaStream_t stream, bool bf16) {
  static PlanCache<FwdKey, fa3::FwdPlan> cache;
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  fa3::FwdParams f;  // dropout and block masks stay off (their defaults)
  f.q = a.q, f.k = a.k, f.v = a.v, f.o = a.o, f.lse = a.lse;
  f.batch = a.batch, f.heads = a.heads, f.heads_kv = a.heads_kv;
  f.seq_q = a.seq_q, f.seq_k = a.seq_k, f.dim = a.dim;
  f.bf16 = bf16;
  f.scale = a.scale;  // > 0: the caller negated Q for a negative scale (positive_scale below)
  f.causal = a.causal;
  f.tile_counter = tile_counter(dev, stream);
  const FwdKey key{uint64_t(dev),
                   word(f.q),
                   word(f.k),
                   word(f.v),
                   word(f.o),
                   word(f.lse),
                   word(f.tile_counter),
                   uint64_t(f.batch),
                   uint64_t(f.heads),
                   uint64_t(f.heads_kv),
                   uint64_t(f.seq_q),
                   uint64_t(f.seq_k),
                   uint64_t(f.dim),
                   uint64_t(f.bf16),
                   word(f.scale),
                   uint64_t(f.causal)};
  const fa3::FwdPlan plan = cache.get(key, [&] {
    ready_to_plan(stream);
    return fa3::make_plan(f, kVariant);
  });
  fa3::launch(plan, stream);  // throws on a refused launch
  return cudaSuccess;
}

cudaError_t backward(const BwdArgs& a, cudaStream_t stream, bool bf16) {
  static PlanCache<BwdKey, fa3::BwdPlan> cache;
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  fa3::BwdParams b;
  b.q = a.q, b.k = a.k, b.v = a.v, b.o = a.o, b.dout = a.dout, b.lse = a.lse;
  b.dq = a.dq, b.dk = a.dk, b.dv = a.dv;
  b.dq_acc = a.dq_acc, b.lse2 = a.lse2, b.dsum = a.dsum;
  b.batch = a.batch, b.heads = a.heads, b.heads_kv = a.heads_kv;
  b.seq_q = a.seq_q, b.seq_k = a.seq_k, b.dim = a.dim;
  b.bf16 = bf16;
  b.scale = a.scale;  // the forward's (positive, with the Q it was given)
  b.causal = a.causal;
  b.negate_dq = a.scale_dq < 0;  // Q arrives negated: dQ for the caller's Q is the negation
  const BwdKey key{uint64_t(dev),
                   word(b.q),
                   word(b.k),
                   word(b.v),
                   word(b.o),
                   word(b.dout),
                   word(b.lse),
                   word(b.dq),
                   word(b.dk),
                   word(b.dv),
                   word(b.dq_acc),
                   word(b.lse2),
                   word(b.dsum),
                   uint64_t(b.batch),
                   uint64_t(b.heads),
                   uint64_t(b.heads_kv),
                   uint64_t(b.seq_q),
                   uint64_t(b.seq_k),
                   uint64_t(b.dim),
                   uint64_t(b.bf16),
                   word(b.scale),
                   uint64_t(b.causal),
                   uint64_t(b.negate_dq)};
  const fa3::BwdPlan plan = cache.get(key, [&] {
    // The caller sized lse2 and dsum by bwd_row_pad (below); the step says what it reads.
    const int rows = (b.seq_q + fa3::kBwdRowPad - 1) / fa3::kBwdRowPad * fa3::kBwdRowPad;
    if (fa3::bwd_workspace(b).rows_padded != rows)
      throw std::logic_error("the backward's padded rows differ from the workspace's");
    return fa3::make_bwd_plan(b, kBwdVariant);  // no synchronisation: no counter
  });
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

// One entry per (dtype, d): the step picks the instantiation from the parameters at run time.
RungKernels entry(bool bf16, int dim) {
  return RungKernels{7,
                     bf16 ? DType::bf16 : DType::f16,
                     dim,
                     true,  // the kernels track the row max of the raw scores: scale > 0
                     false,
                     fa3::kBwdRowPad,
                     bf16 ? &forward_as<true> : &forward_as<false>,
                     bf16 ? &backward_as<true> : &backward_as<false>};
}

const Registrar kRung07{entry(true, 64), entry(true, 128), entry(false, 64), entry(false, 128)};

}  // namespace
}  // namespace ladder_torch::rung07
