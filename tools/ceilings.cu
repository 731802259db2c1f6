// ceilings: the hardware ceilings that the ladder's notes compare each rung with, measured on the
// machine it runs on rather than taken from a datasheet.
//   ceilings [--csv FILE] [--commit C]
// Build (sm_90a so that the wgmma row is measured; every other row runs from the same binary):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -Wall,-Wextra
//        -o build/ceilings tools/ceilings.cu
// Built for plain sm_90 (or anything else) the wgmma row says "not built for sm_90a".
//
// Each ceiling is printed with one line saying how it was measured; --csv appends the same as rows
// gpu,cuda,commit,ceiling,value,unit,method (a new file gets that header; an existing file must
// already have it). Timing: CUDA events around each launch, 2 warm-up launches, the median of
// 15. Every kernel writes a per-thread checksum that the host compares with the value its
// arithmetic must give, so that work optimised away (or skipped) fails loudly instead of
// inflating a ceiling. Exit status: 0 ok, 1 a check or CUDA call failed, 2 bad arguments,
// 3 no CUDA device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "csv_append.hpp"
#include "error.hpp"

namespace {

constexpr int kWarmup = 2;
constexpr int kRepeats = 15;

void check(cudaError_t e, const char* what, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "ceilings: line %d: %s: %s\n", line, what, cudaGetErrorString(e));
  std::exit(1);
}
#define CHECK(expr) check((expr), #expr, __LINE__)

// The median time of one launch, in ms.
template <class Launch>
double median_ms(Launch launch) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < kWarmup; ++i) launch();
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<float> ms(kRepeats);
  for (float& t : ms) {
    CHECK(cudaEventRecord(start));
    launch();
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    CHECK(cudaEventElapsedTime(&t, start, stop));
  }
  CHECK(cudaGetLastError());
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Every thread's checksum must equal `want` (to a relative 1e-6: tensor-core sums may be
// rounded differently, but work that was skipped is off by far more).
template <class T>
bool checksums_ok(const char* what, const T* d_out, size_t n, double want) {
  std::vector<T> h(n);
  CHECK(cudaMemcpy(h.data(), d_out, n * sizeof(T), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i) {
    if (std::fabs(double(h[i]) - want) > 1e-6 * std::fabs(want)) {
      std::fprintf(stderr, "ceilings: %s: thread %zu checksum %.9g, expected %.9g\n", what, i,
                   double(h[i]), want);
      return false;
    }
  }
  return true;
}

// Blocks for a full GPU: as many per SM as fit at once, on every SM.
template <class Kernel>
int full_grid(Kernel kernel, int threads, size_t smem, int sms) {
  int per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  return std::max(1, per_sm) * sms;
}

// ---------------------------------------------------------------------------------------------
// Shared memory: 16-byte loads, no bank conflicts.

constexpr int kSmemWords = 2048;  // uint4 words: 32 KiB per block
constexpr int kSmemThreads = 1024;
constexpr int kSmemUnroll = 8;

__global__ void __launch_bounds__(kSmemThreads) smem_stream(uint32_t v, int iters, uint32_t* out) {
  __shared__ uint4 buf[kSmemWords];
  for (int e = threadIdx.x; e < kSmemWords; e += blockDim.x) buf[e] = make_uint4(v, v, v, v);
  __syncthreads();
  uint32_t sum = 0;
  // A warp's 32 lanes read 32 consecutive 16-byte words (512 aligned bytes): 4 wavefronts of
  // 128 bytes, each touching all 32 banks once. The offset moves with every load, so no two
  // loads share an address the compiler could reuse.
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int k = 0; k < kSmemUnroll; ++k) {
      const uint4 x = buf[(threadIdx.x + (i * kSmemUnroll + k) * 32) & (kSmemWords - 1)];
      sum += x.x + x.y + x.z + x.w;
    }
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

// ---------------------------------------------------------------------------------------------
// fp32 FFMA: independent chains c = c * x + y (x = 1 at run time, unknown to the compiler).

constexpr int kChains = 8;  // > FFMA latency (4 cycles) / issue interval: the pipe never waits
constexpr int kFfmaThreads = 256;

__global__ void __launch_bounds__(kFfmaThreads)
    ffma_chains(float x, float y, int iters, float* out) {
  float c[kChains];
  // Different starting values: otherwise the chains would be one computation, merged into one.
#pragma unroll
  for (int j = 0; j < kChains; ++j) c[j] = float(j);
#pragma unroll 16
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < kChains; ++j) c[j] = fmaf(c[j], x, y);
  }
  float sum = 0;
#pragma unroll
  for (int j = 0; j < kChains; ++j) sum += c[j];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

// ---------------------------------------------------------------------------------------------
// mma.sync m16n8k16 with fp32 accumulate: registers only, independent accumulators per warp.

constexpr int kMmaAccs = 8;  // independent accumulators per warp: hides the mma latency
constexpr int kMmaThreads = 128;

// d += A(16x16) B(16x8) with every element of A equal to the half pair in `a` and of B to `b`.
template <bool kBf16>
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a, uint32_t b) {
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%4,%4,%4}, "
        "{%5,%5}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a), "r"(b));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%4,%4,%4}, "
        "{%5,%5}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a), "r"(b));
  }
}

template <bool kBf16>
__global__ void __launch_bounds__(kMmaThreads)
    mma_sync_peak(uint32_t a, uint32_t b, int iters, float* out) {
  float d[kMmaAccs][4];
#pragma unroll
  for (int k = 0; k < kMmaAccs; ++k) d[k][0] = d[k][1] = d[k][2] = d[k][3] = float(k);
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int k = 0; k < kMmaAccs; ++k) mma_16816<kBf16>(d[k], a, b);
  }
  float sum = 0;
#pragma unroll
  for (int k = 0; k < kMmaAccs; ++k) sum += d[k][0] + d[k][1] + d[k][2] + d[k][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

// ---------------------------------------------------------------------------------------------
// wgmma m64n256k16 bf16 (sm_90a only): A 64x16 and B 16x256 from shared memory, fp32
// accumulators in registers (128 per thread), issued asynchronously by a warpgroup.

// Accumulators in flight per SM: one 64x256 per warpgroup, 128 registers per thread, so 3
// warpgroups (384 threads of at most 168 registers) are what one SM's 64K registers hold.
constexpr int kWarpgroups = 3;
constexpr int kKSteps = 4;  // wgmma k16 steps per commit group: one 64-wide K tile
constexpr int kTileA = 64 * 64 * 2, kTileB = 256 * 64 * 2;  // bytes, bf16, K-major
constexpr int kWgmmaSmem = kTileA + kTileB + 1024;          // + room to align to 1024 bytes

__global__ void wgmma_built(int* flag) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *flag = 1;
#else
  *flag = 0;
#endif
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The shared-memory matrix descriptor of the PTX ISA: start address >> 4 in bits 0-13; leading
// byte offset >> 4 in 16-29 (not used by swizzled K-major layouts, 1 by convention); stride byte
// offset >> 4 in 32-45 (1024: from one group of 8 rows of 128 bytes to the next); swizzle mode
// in 62-63 (1 = 128-byte swizzle, whose 1024-byte atoms need 1024-byte alignment).
__device__ uint64_t smem_desc(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t a, uint64_t b) {
#define D8(i)                                                                                 \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, "
      "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, "
      "%125, %126, %127}, %128, %129, 1, 1, 1, 0, 0;\n"  // scale-d 1: D += A B; no transposes
      : D8(0), D8(8), D8(16), D8(24), D8(32), D8(40), D8(48), D8(56), D8(64), D8(72), D8(80),
        D8(88), D8(96), D8(104), D8(112), D8(120)
      : "l"(a), "l"(b));
#undef D8
}
#endif

__global__ void __launch_bounds__(kWarpgroups * 128, 1)
    wgmma_peak(uint32_t v_pair, int iters, float* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = uint32_t(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw + 1023) & ~1023u;
  uint32_t* words = reinterpret_cast<uint32_t*>(smem_raw + (base - raw));
  // Every element of A and B is the same bf16 value, so the result does not depend on how the
  // swizzle places them: the kernel measures the rate, the checksum proves the work was done.
  for (int e = threadIdx.x; e < (kTileA + kTileB) / 4; e += blockDim.x) words[e] = v_pair;
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // visible to wgmma's reads
  __syncthreads();
  const uint64_t desc_a = smem_desc(base), desc_b = smem_desc(base + kTileA);
  float d[128];
#pragma unroll
  for (int j = 0; j < 128; ++j) d[j] = 0.f;
  for (int i = 0; i < iters; ++i) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int k = 0; k < kKSteps; ++k)  // the next 16 K columns are 32 bytes on: +2 in addr >> 4
      wgmma_m64n256k16(d, desc_a + 2 * k, desc_b + 2 * k);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    // One group may stay in flight while the next one issues (the same accumulator is allowed:
    // wgmmas of one shape are ordered on it).
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  // The accumulators are ready only now: keep the compiler from reading them any earlier.
  // (Index loops: a range-for over 128 elements is not unrolled, and d would go to local memory.)
#pragma unroll
  for (int j = 0; j < 128; ++j) asm volatile("" : "+f"(d[j])::"memory");
  float sum = 0;
#pragma unroll
  for (int j = 0; j < 128; ++j) sum += d[j];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
#else
  (void)v_pair, (void)iters, (void)out;
#endif
}

// ---------------------------------------------------------------------------------------------
// Host side.

struct Ceiling {
  std::string name, value, unit, method;
};

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string timing_note() {
  return "; CUDA events, median of " + std::to_string(kRepeats) + " after " +
         std::to_string(kWarmup) + " warm-up";
}

uint32_t pair(uint16_t h) {
  return uint32_t(h) | uint32_t(h) << 16;
}

Ceiling hbm_copy(const cudaDeviceProp& prop) {
  // Both buffers 16x the L2 (at least 256 MiB): nearly every byte goes to and from HBM.
  size_t free_b = 0, total_b = 0;
  CHECK(cudaMemGetInfo(&free_b, &total_b));
  size_t bytes = std::max<size_t>(16 * size_t(prop.l2CacheSize), size_t(256) << 20);
  bytes = std::min(bytes, free_b / 4) & ~size_t(0xFFFFF);
  unsigned char *src = nullptr, *dst = nullptr;
  CHECK(cudaMalloc(&src, bytes));
  CHECK(cudaMalloc(&dst, bytes));
  CHECK(cudaMemset(src, 0x5A, bytes));
  const double ms =
      median_ms([&] { CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); });
  unsigned char tail[256];
  CHECK(cudaMemcpy(tail, dst + bytes - sizeof tail, sizeof tail, cudaMemcpyDeviceToHost));
  const bool ok = std::all_of(tail, tail + sizeof tail, [](unsigned char c) { return c == 0x5A; });
  CHECK(cudaFree(src));
  CHECK(cudaFree(dst));
  if (!ok) {
    std::fprintf(stderr, "ceilings: hbm_copy: the destination does not hold the source\n");
    std::exit(1);
  }
  return {"hbm_copy", fmt(2.0 * double(bytes) / (ms * 1e-3) / 1e12), "TB/s",
          "cudaMemcpyAsync device to device of " + std::to_string(bytes >> 20) + " MiB (" +
              fmt(double(bytes) / prop.l2CacheSize) + "x L2); (bytes read + bytes written) / time" +
              timing_note()};
}

Ceiling smem(int sms) {
  const int grid = full_grid(smem_stream, kSmemThreads, 0, sms);
  const int iters = 8192;
  const size_t threads = size_t(grid) * kSmemThreads;
  uint32_t* out = nullptr;
  CHECK(cudaMalloc(&out, threads * sizeof(uint32_t)));
  const double ms = median_ms([&] { smem_stream<<<grid, kSmemThreads>>>(1u, iters, out); });
  const bool ok = checksums_ok("smem", out, threads, 4.0 * kSmemUnroll * iters);
  CHECK(cudaFree(out));
  if (!ok) std::exit(1);
  const double bytes = double(threads) * iters * kSmemUnroll * 16;
  return {"smem", fmt(bytes / (ms * 1e-3) / 1e12), "TB/s",
          std::to_string(grid / sms) + " blocks x " + std::to_string(kSmemThreads) +
              " threads per SM, each thread streaming 16-byte shared loads, a warp reading 512 "
              "contiguous bytes (no bank conflicts); bytes loaded / time" +
              timing_note()};
}

Ceiling ffma(int sms) {
  const int grid = full_grid(ffma_chains, kFfmaThreads, 0, sms);
  const int iters = 1 << 16;
  const float y = 1.0f / 4096;  // c stays an exact multiple of 2^-12: the checksum is exact
  const size_t threads = size_t(grid) * kFfmaThreads;
  float* out = nullptr;
  CHECK(cudaMalloc(&out, threads * sizeof(float)));
  const double ms = median_ms([&] { ffma_chains<<<grid, kFfmaThreads>>>(1.0f, y, iters, out); });
  const double want = kChains * (kChains - 1) / 2.0 + double(kChains) * iters * y;
  const bool ok = checksums_ok("fp32_ffma", out, threads, want);
  CHECK(cudaFree(out));
  if (!ok) std::exit(1);
  const double flops = 2.0 * double(threads) * iters * kChains;
  return {
      "fp32_ffma", fmt(flops / (ms * 1e-3) / 1e12), "TFLOP/s",
      std::to_string(grid / sms * kFfmaThreads) + " threads per SM, " + std::to_string(kChains) +
          " independent FFMA chains per thread, 2 FLOPs per FFMA; FLOPs / time" + timing_note()};
}

template <bool kBf16>
Ceiling mma_sync(int sms) {
  const auto kernel = mma_sync_peak<kBf16>;
  const int grid = full_grid(kernel, kMmaThreads, 0, sms);
  const int iters = 1 << 14;
  // Every A and B element is 2^-8 (0x1C00 in fp16, 0x3B80 in bf16): each mma adds
  // 16 * 2^-16 = 2^-12 to every accumulator, exactly.
  const uint32_t v = pair(kBf16 ? 0x3B80 : 0x1C00);
  const size_t threads = size_t(grid) * kMmaThreads;
  float* out = nullptr;
  CHECK(cudaMalloc(&out, threads * sizeof(float)));
  const double ms = median_ms([&] { kernel<<<grid, kMmaThreads>>>(v, v, iters, out); });
  const double want = 4.0 * kMmaAccs * (kMmaAccs - 1) / 2 + 4.0 * kMmaAccs * iters / 4096;
  const char* name = kBf16 ? "mma_sync_bf16" : "mma_sync_fp16";
  const bool ok = checksums_ok(name, out, threads, want);
  CHECK(cudaFree(out));
  if (!ok) std::exit(1);
  const double flops = 2.0 * 16 * 8 * 16 * double(threads / 32) * kMmaAccs * iters;
  return {name, fmt(flops / (ms * 1e-3) / 1e12), "TFLOP/s",
          std::string("mma.sync.m16n8k16 ") + (kBf16 ? "bf16" : "fp16") +
              " inputs, fp32 accumulate, registers only; " +
              std::to_string(grid / sms * kMmaThreads / 32) + " warps per SM, " +
              std::to_string(kMmaAccs) +
              " independent accumulators per warp; 4096 FLOPs per mma / time" + timing_note()};
}

Ceiling wgmma(const cudaDeviceProp& prop) {
  Ceiling c{"wgmma_bf16", "-", "TFLOP/s", ""};
  if (prop.major != 9 || prop.minor != 0) {
    c.method = "not measured: wgmma needs an sm_90 device";
    return c;
  }
  int* flag = nullptr;
  int built = 0;
  CHECK(cudaMalloc(&flag, sizeof(int)));
  wgmma_built<<<1, 1>>>(flag);
  CHECK(cudaMemcpy(&built, flag, sizeof(int), cudaMemcpyDeviceToHost));
  CHECK(cudaFree(flag));
  if (!built) {
    c.method = "not built for sm_90a (compile with -gencode=arch=compute_90a,code=sm_90a)";
    return c;
  }
  const int threads_per_block = kWarpgroups * 128;
  CHECK(cudaFuncSetAttribute(wgmma_peak, cudaFuncAttributeMaxDynamicSharedMemorySize, kWgmmaSmem));
  const int grid = full_grid(wgmma_peak, threads_per_block, kWgmmaSmem, prop.multiProcessorCount);
  const int iters = 1 << 14;
  const size_t threads = size_t(grid) * threads_per_block;
  float* out = nullptr;
  CHECK(cudaMalloc(&out, threads * sizeof(float)));
  const double ms = median_ms(
      [&] { wgmma_peak<<<grid, threads_per_block, kWgmmaSmem>>>(pair(0x3B80), iters, out); });
  // Each k16 step adds 16 * 2^-16 = 2^-12 to each of a thread's 128 accumulators.
  const bool ok = checksums_ok("wgmma_bf16", out, threads, 128.0 * kKSteps * iters / 4096);
  CHECK(cudaFree(out));
  if (!ok) std::exit(1);
  const double flops = 2.0 * 64 * 256 * 16 * double(threads / 128) * kKSteps * iters;
  c.value = fmt(flops / (ms * 1e-3) / 1e12);
  c.method =
      "wgmma.mma_async m64n256k16 bf16 inputs, fp32 accumulate, A and B from shared "
      "memory (128-byte swizzled descriptors); " +
      std::to_string(grid / prop.multiProcessorCount * kWarpgroups) +
      " warpgroups per SM, each with its own 64x256 accumulator, " + std::to_string(kKSteps) +
      " wgmmas per commit group, one group left in flight; FLOPs / time" + timing_note();
  return c;
}

std::string default_commit() {
  if (const char* c = std::getenv("LADDER_COMMIT"); c && *c) return c;
  std::string s;
  if (FILE* p = popen("git rev-parse --short HEAD 2>/dev/null", "r")) {
    char b[64];
    while (std::fgets(b, sizeof b, p)) s += b;
    if (pclose(p) != 0) s.clear();
  }
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s.empty() ? "-" : s;
}

const char* const kHeader = "gpu,cuda,commit,ceiling,value,unit,method";

int usage(FILE* f, int status) {
  std::fprintf(f,
               "usage: ceilings [--csv FILE] [--commit C]\n"
               "Measures HBM copy bandwidth, shared-memory bandwidth, the fp32 FFMA peak, the\n"
               "mma.sync fp16/bf16 peaks and (sm_90a builds on sm_90) the wgmma bf16 peak.\n"
               "  --csv FILE   append rows %s (header for a new file)\n"
               "  --commit C   the commit column (default $LADDER_COMMIT, else git rev-parse "
               "--short HEAD, else -)\n",
               kHeader);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  std::string csv, commit;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") return usage(stdout, 0);
    if ((a == "--csv" || a == "--commit") && i + 1 < argc) {
      (a == "--csv" ? csv : commit) = argv[++i];
    } else {
      std::fprintf(stderr, "ceilings: unknown or incomplete argument '%s'\n", a.c_str());
      return usage(stderr, 2);
    }
  }
  if (commit.empty()) commit = default_commit();
  // The CSV is checked before the device is asked for (bad input exits 2 on any machine), and
  // each row is appended as it is measured (a run cut short keeps what it measured), by the
  // ladder's one locked read-merge-write (common/csv_append.hpp).
  std::optional<ladder::CsvAppender> out;
  try {
    out.emplace(csv, kHeader, nullptr);
  } catch (const ladder::BadInput& e) {
    std::fprintf(stderr, "ceilings: %s\n", e.what());
    return 2;
  }

  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::fprintf(stderr, "ceilings: no CUDA device (%s)\n",
                 e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    return 3;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int rt = 0;
  CHECK(cudaRuntimeGetVersion(&rt));
  const std::string cuda = std::to_string(rt / 1000) + "." + std::to_string(rt % 1000 / 10);
  std::printf("%s (sm_%d%d, %d SMs, L2 %d MiB), CUDA %s\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, cuda.c_str());

  std::string appended;  // what the last append says (the rows this run added, in all)
  auto report = [&](const Ceiling& c) {
    std::printf("%-14s %8s %-8s %s\n", c.name.c_str(), c.value.c_str(), c.unit.c_str(),
                c.method.c_str());
    std::fflush(stdout);
    if (csv.empty()) return true;
    out->add(csv_field(prop.name) + "," + csv_field(cuda) + "," + csv_field(commit) + "," + c.name +
             "," + c.value + "," + c.unit + "," + csv_field(c.method));
    try {
      appended = out->append();
    } catch (const ladder::BadInput& e) {
      std::fprintf(stderr, "ceilings: %s\n", e.what());
      return false;
    }
    return true;
  };
  const int sms = prop.multiProcessorCount;
  const bool ok = report(hbm_copy(prop)) && report(smem(sms)) && report(ffma(sms)) &&
                  report(mma_sync<false>(sms)) && report(mma_sync<true>(sms)) &&
                  report(wgmma(prop));
  if (!ok) return 2;
  if (!appended.empty()) std::printf("%s\n", appended.c_str());
  return 0;
}
