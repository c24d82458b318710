// How fast can a paged KV cache be read? A probe for the decode kernel's design: each kernel
// below reads the same K and V bytes (one sequence of 131072 tokens, 8 KV heads, head_dim 128,
// bf16, block_size 16, blocks in random order like bench_decode.py) and does no attention math,
// so the time is the memory pattern's alone.
//   contiguous     K then V as two flat arrays, 16-byte loads, 8 per lane in flight;
//   warp_per_head  the decode kernel's pattern: a warp walks one head's 256-byte rows (2 KB
//                  apart), 4 heads per CTA, 8 K + 8 V loads per lane in flight, 3 CTAs per SM;
//   cta_per_token  8 warps cover the 8 heads, so a CTA reads whole 2 KB token rows;
//   bulk           one CTA per SM; a thread issues cp.async.bulk copies of whole 32 KB blocks
//                  (K and V) into a ring of shared-memory stages, the warps read them there.
// Build and run (sm_90a): nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a
//   bench/kv_read_probe.cu -o kv_read_probe && ./kv_read_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "probe_util.h"

constexpr int kTokens = 131072, kHeads = 8, kDim = 128, kBlock = 16;
constexpr int kBlocks = kTokens / kBlock;
constexpr int kRowElems = kHeads * kDim;             // one token's K (or V) row, all heads
constexpr int kBlockBytes = kBlock * kRowElems * 2;  // 32 KB
using u16 = unsigned short;

__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ unsigned fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

__global__ void contiguous(const uint4* k, const uint4* v, long long n, unsigned* sink) {
  unsigned acc = 0;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += 8 * stride) {
    uint4 a[8], b[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) a[u] = i + u * stride < n ? ld_stream(k + i + u * stride) : uint4{};
#pragma unroll
    for (int u = 0; u < 8; ++u) b[u] = i + u * stride < n ? ld_stream(v + i + u * stride) : uint4{};
#pragma unroll
    for (int u = 0; u < 8; ++u) acc ^= fold(a[u]) ^ fold(b[u]);
  }
  if (acc == 0x12345678u) *sink = acc;
}

// Warps per CTA = heads covered per CTA; each warp one head; kUnroll loads of K and of V per lane.
template <int kWarps, int kUnroll>
__global__ void __launch_bounds__(kWarps * 32) paged(const u16* k, const u16* v, const int* table, int keys_per_split,
                                                     unsigned* sink) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int head = blockIdx.x * kWarps + warp;
  const int slice = lane % 16, key_lane = lane / 16;  // 16 lanes x 16 B = one 256 B head row
  const int begin = blockIdx.y * keys_per_split, end = min(kTokens, begin + keys_per_split);
  unsigned acc = 0;
  auto offset = [&](int pos) {
    return ((long long)table[pos / kBlock] * kBlock + pos % kBlock) * kRowElems + head * kDim + slice * 8;
  };
  for (int first = begin; first < end; first += 2 * kUnroll) {
    uint4 a[kUnroll], b[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int key = first + 2 * u + key_lane;
      a[u] = key < end ? ld_stream(k + offset(key)) : uint4{};
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int key = first + 2 * u + key_lane;
      b[u] = key < end ? ld_stream(v + offset(key)) : uint4{};
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= fold(a[u]) ^ fold(b[u]);
  }
  if (acc == 0x12345678u) *sink = acc;
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// One CTA per SM, kStages stages of (one K block, one V block) = 64 KB each.
template <int kStages>
__global__ void __launch_bounds__(256) bulk(const char* k, const char* v, const int* table, int blocks_per_cta,
                                            unsigned* sink) {
  extern __shared__ __align__(128) char smem[];
  __shared__ uint64_t full[kStages], empty[kStages];
  const int first_block = blockIdx.x * blocks_per_cta;
  const int count = max(0, min(kBlocks, first_block + blocks_per_cta) - first_block);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], blockDim.x / 32);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](int i) {
    const int s = i % kStages;
    const long long block = table[first_block + i];
    mbar_expect_tx(&full[s], 2 * kBlockBytes);
    bulk_load(smem + s * 2 * kBlockBytes, k + block * kBlockBytes, kBlockBytes, &full[s]);
    bulk_load(smem + s * 2 * kBlockBytes + kBlockBytes, v + block * kBlockBytes, kBlockBytes, &full[s]);
  };
  if (threadIdx.x == 0)
    for (int i = 0; i < min(kStages, count); ++i) issue(i);
  unsigned acc = 0;
  for (int i = 0; i < count; ++i) {
    const int s = i % kStages;
    mbar_wait(&full[s], (i / kStages) & 1);
    const uint4* stage = reinterpret_cast<const uint4*>(smem + s * 2 * kBlockBytes);
    for (int j = threadIdx.x; j < 2 * kBlockBytes / 16; j += blockDim.x) acc ^= fold(stage[j]);
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(&empty[s]);
    if (threadIdx.x == 0 && i + kStages < count) {
      mbar_wait(&empty[s], (i / kStages) & 1);
      issue(i + kStages);
    }
  }
  if (acc == 0x12345678u) *sink = acc;
}

// The median of 25 runs (us), each launched anew on the default stream.
template <typename F>
float time_us(F launch) {
  const std::vector<float> ms = run_times_ms(nullptr, false, 25, launch);
  CHECK(cudaGetLastError());
  return ms[ms.size() / 2] * 1e3f;
}

int main() {
  const std::size_t bytes = std::size_t(kTokens) * kRowElems * 2;
  char *k, *v;
  int* table;
  unsigned* sink;
  CHECK(cudaMalloc(&k, bytes));
  CHECK(cudaMalloc(&v, bytes));
  CHECK(cudaMemset(k, 1, bytes));
  CHECK(cudaMemset(v, 2, bytes));
  CHECK(cudaMalloc(&table, kBlocks * sizeof(int)));
  CHECK(cudaMalloc(&sink, 4));
  std::vector<int> order(kBlocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(0));
  CHECK(cudaMemcpy(table, order.data(), kBlocks * sizeof(int), cudaMemcpyHostToDevice));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const double total = 2.0 * bytes;
  auto report = [&](const char* name, float us) {
    std::printf("%-34s %8.1f us  %5.2f TB/s\n", name, us, total / us * 1e-6);
  };

  const long long n16 = bytes / 16;
  report("contiguous (8 waves of 132x1024)", time_us([&] {
           contiguous<<<sms * 8, 256>>>(reinterpret_cast<uint4*>(k), reinterpret_cast<uint4*>(v), n16, sink);
         }));
  for (int ctas_per_sm : {3, 6}) {
    const int splits = ctas_per_sm * sms / 2;
    const int per_split = (kTokens + splits - 1) / splits;
    char name[64];
    std::snprintf(name, sizeof name, "warp_per_head x4 u8, %d CTA/SM", ctas_per_sm);
    report(name, time_us([&] {
             paged<4, 8><<<dim3(2, splits), 128>>>((u16*)k, (u16*)v, table, per_split, sink);
           }));
    std::snprintf(name, sizeof name, "warp_per_head x4 u16, %d CTA/SM", ctas_per_sm);
    report(name, time_us([&] {
             paged<4, 16><<<dim3(2, splits), 128>>>((u16*)k, (u16*)v, table, per_split, sink);
           }));
  }
  for (int ctas_per_sm : {2, 3}) {
    const int splits = ctas_per_sm * sms;
    const int per_split = (kTokens + splits - 1) / splits;
    char name[64];
    std::snprintf(name, sizeof name, "cta_per_token x8 u8, %d CTA/SM", ctas_per_sm);
    report(name, time_us([&] { paged<8, 8><<<dim3(1, splits), 256>>>((u16*)k, (u16*)v, table, per_split, sink); }));
  }
  {
    constexpr int kStages = 3;
    const int smem = kStages * 2 * kBlockBytes;
    CHECK(cudaFuncSetAttribute(bulk<kStages>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int per_cta = (kBlocks + sms - 1) / sms;
    report("bulk 3 stages x 64 KB, 1 CTA/SM", time_us([&] {
             bulk<kStages><<<sms, 256, smem>>>(k, v, table, per_cta, sink);
           }));
  }
  {
    constexpr int kStages = 1;
    const int smem = kStages * 2 * kBlockBytes;
    CHECK(cudaFuncSetAttribute(bulk<kStages>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int per_cta = (kBlocks + 3 * sms - 1) / (3 * sms);
    report("bulk 1 stage x 64 KB, 3 CTA/SM", time_us([&] {
             bulk<kStages><<<3 * sms, 256, smem>>>(k, v, table, per_cta, sink);
           }));
  }
  return 0;
}
