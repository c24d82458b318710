// How close to its memory floor can a decode step get, built as the engine builds it? A probe
// for the engine's design: the 1.7B decode step at 32 sequences of 512 keys reads 5.32 GB (per
// layer the qkv, o, gate/up and down weights and the layer's K and V; then the LM head), and
// every kernel below reads exactly those bytes and does no math, so the time is the step's
// structure alone:
//   one_stream   a single kernel streams all 5.32 GB: the floor this machinery reaches;
//   chain        the engine's form: per layer qkv -> attention -> o -> norm -> gate/up -> down
//                -> norm, then the LM head, 197 kernels in a CUDA graph, launched normally;
//   chain_pdl    the same as dependent launches, each streaming kernel requesting its first ring
//                of bytes before its wait (weights and old keys do not depend on the kernel
//                before it), as the engine's products and decode stage 1 do;
//   persistent   one kernel (cooperative launch, one CTA per SM) whose producer warp streams
//                every op's bytes back to back, while its consumer warp meets the other CTAs at a
//                grid barrier wherever the step has a dependency (7 per layer): the ring keeps
//                filling across the barriers, as a persistent decode-step kernel's would.
// Streaming CTAs: a producer warp issuing 16 KB bulk copies into a 12-stage ring (192 KB, so two
// of them never share an SM, like the engine's products and stage 1), a consumer warp reading a
// word of each stage. A norm: 32 CTAs of 256 threads reading a 4-split fp32 32 x 2048 partial sum
// and a residual (L2), two block-wide sums of squares, a row stored (bench/boundary_probe.cu).
// Build and run (sm_90a): nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Isrc
//   bench/step_probe.cu -o step_probe && ./step_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "kernels/bulk_copy.cuh"
#include "probe_check.h"

using asynct::kernels::bulk_copy_to_shared;
using asynct::kernels::SharedBarrier;

constexpr int kLayers = 28;
// The step's reads, bytes (1.7B config; 32 x 512 keys x 8 KV heads x 128 x bf16, K and V).
constexpr long long kQkv = 2048LL * 4096 * 2, kKv = 32LL * 512 * 8 * 128 * 2 * 2, kO = 2048LL * 2048 * 2,
                    kGateUp = 2048LL * 12288 * 2, kDown = 6144LL * 2048 * 2, kLmHead = 151936LL * 2048 * 2;
constexpr int kChunk = 16 * 1024, kStages = 12, kRing = kChunk * kStages;

struct Op {
  long long offset = 0, bytes = 0;  // bytes == 0: a norm
};

// The step's ops in order; every streaming op reads its own bytes of one big buffer.
std::vector<Op> step_ops() {
  std::vector<Op> ops;
  long long at = 0;
  auto stream = [&](long long bytes) {
    ops.push_back({at, bytes});
    at += bytes;
  };
  for (int l = 0; l < kLayers; ++l) {
    stream(kQkv);
    stream(kKv);
    stream(kO);
    ops.push_back({});
    stream(kGateUp);
    stream(kDown);
    ops.push_back({});
  }
  stream(kLmHead);
  return ops;
}

// ---- Pieces shared by the kernels ----------------------------------------------------------

struct Ring {
  SharedBarrier full[kStages], empty[kStages];
  __device__ void init() {
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) full[s].init(1), empty[s].init(1);
      SharedBarrier::fence_init();
    }
    __syncthreads();
  }
  // Producer (one lane): the i-th chunk of this CTA into stage i % kStages.
  __device__ void produce(unsigned char* stages, long long i, const unsigned char* src, unsigned bytes,
                          std::uint64_t policy) {
    const int s = int(i % kStages);
    if (i >= kStages) empty[s].wait(unsigned((i / kStages - 1) & 1));
    bulk_copy_to_shared(stages + s * kChunk, src, bytes, full[s], policy);
    full[s].arrive_expecting(bytes);
  }
  // Consumer warp: waits for the i-th chunk, reads a word per lane, frees the stage.
  __device__ unsigned consume(const unsigned char* stages, long long i) {
    const int s = int(i % kStages);
    full[s].wait(unsigned((i / kStages) & 1));
    const unsigned v = reinterpret_cast<const unsigned*>(stages + s * kChunk)[threadIdx.x & 31];
    __syncwarp();
    if ((threadIdx.x & 31) == 0) empty[s].arrive();
    return v;
  }
};

__device__ __forceinline__ void wait_prior() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void allow_next() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// The norm's data: partial sums [4][32][2048] fp32, a residual and an output [32][2048].
constexpr int kRows = 32, kHidden = 2048, kSplits = 4, kNormThreads = 256;
struct NormData {
  const float* partials;
  const float* residual;
  float* out;
};

// One row's norm by kThreads threads (256: the chain's norm kernel; 32: the persistent kernel's
// consumer warp), each taking 8-column groups: sum the splits and the residual, two block-wide
// sums of squares (Peri-LN), store.
template <int kThreads>
__device__ void norm_row(const NormData& d, int row, float* scratch) {
  constexpr int kGroups = kHidden / 8 / kThreads;
  const int t = int(threadIdx.x) % kThreads;
  float x[kGroups][8];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const int col = (g * kThreads + t) * 8;
#pragma unroll
    for (int e = 0; e < 8; ++e) x[g][e] = __ldcg(d.residual + row * kHidden + col + e);
#pragma unroll
    for (int s = 0; s < kSplits; ++s)
#pragma unroll
      for (int e = 0; e < 8; ++e) x[g][e] += __ldcg(d.partials + (s * kRows + row) * kHidden + col + e);
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    float sum = 0.0f;
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
#pragma unroll
      for (int e = 0; e < 8; ++e) sum += x[g][e] * x[g][e];
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if constexpr (kThreads > 32) {
      if (t % 32 == 0) scratch[k * 8 + t / 32] = sum;
      __syncthreads();
      sum = 0.0f;
      for (int w = 0; w < kThreads / 32; ++w) sum += scratch[k * 8 + w];
    }
    const float scale = rsqrtf(sum / kHidden + 1e-6f);
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
#pragma unroll
      for (int e = 0; e < 8; ++e) x[g][e] *= scale;
  }
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const int col = (g * kThreads + t) * 8;
#pragma unroll
    for (int e = 0; e < 8; ++e) d.out[row * kHidden + col + e] = x[g][e];
  }
}

// ---- The chain's kernels -------------------------------------------------------------------

// One streaming op: chunk c of the op goes to CTA c % gridDim.x. With `dependent`, the producer
// requests its first ring of chunks before waiting for the kernel before.
__global__ void __launch_bounds__(64) stream_kernel(const unsigned char* src, long long bytes, bool dependent,
                                                    unsigned* sink) {
  extern __shared__ __align__(128) unsigned char stages[];
  __shared__ Ring ring;
  ring.init();
  const long long chunks = bytes / kChunk;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  if (warp == 0) {
    if (lane != 0) return;
    const std::uint64_t policy = asynct::kernels::l2_evict_first_policy();
    bool waited = !dependent;
    long long i = 0;
    for (long long c = blockIdx.x; c < chunks; c += gridDim.x, ++i) {
      if (!waited && i == kStages) {
        wait_prior();
        allow_next();
        waited = true;
      }
      ring.produce(stages, i, src + c * kChunk, kChunk, policy);
    }
    if (!waited) {
      wait_prior();
      allow_next();
    }
    return;
  }
  if (dependent) {  // the consumers need the kernel before's output (activations)
    wait_prior();
    allow_next();
  }
  unsigned acc = 0;
  long long i = 0;
  for (long long c = blockIdx.x; c < chunks; c += gridDim.x, ++i) acc ^= ring.consume(stages, i);
  if (acc == 0x9e3779b9u) *sink = acc;
}

__global__ void __launch_bounds__(kNormThreads) norm_kernel(NormData d, bool dependent) {
  __shared__ float scratch[16];
  if (dependent) {
    wait_prior();
    allow_next();
  }
  norm_row<kNormThreads>(d, blockIdx.x, scratch);
}

// ---- The persistent kernel -----------------------------------------------------------------

struct PersistentArgs {
  const unsigned char* base;
  const Op* ops;
  int num_ops;
  NormData norm;
  unsigned* barrier;  // zero at the start of each step
  unsigned* sink;
};

// The consumer warp's grid barrier: the `index`-th of the step.
__device__ void grid_barrier(unsigned* counter, unsigned index) {
  __syncwarp();
  if ((threadIdx.x & 31) == 0) {
    __threadfence();
    atomicAdd(counter, 1u);
    const unsigned target = (index + 1) * gridDim.x;
    unsigned seen;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    } while (seen < target);
  }
  __syncwarp();
}

__global__ void __launch_bounds__(64) persistent_kernel(PersistentArgs a) {
  extern __shared__ __align__(128) unsigned char stages[];
  __shared__ Ring ring;
  ring.init();
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  if (warp == 0) {  // the producer: every op's chunks, back to back, bounded by the ring only
    if (lane != 0) return;
    const std::uint64_t policy = asynct::kernels::l2_evict_first_policy();
    long long i = 0;
    for (int k = 0; k < a.num_ops; ++k) {
      const Op op = a.ops[k];
      for (long long c = blockIdx.x; c < op.bytes / kChunk; c += gridDim.x, ++i)
        ring.produce(stages, i, a.base + op.offset + c * kChunk, kChunk, policy);
    }
    return;
  }
  unsigned acc = 0, barriers = 0;
  long long i = 0;
  for (int k = 0; k < a.num_ops; ++k) {
    const Op op = a.ops[k];
    if (k > 0) grid_barrier(a.barrier, barriers++);  // this op needs the one before it
    if (op.bytes == 0) {
      if (blockIdx.x < kRows) norm_row<32>(a.norm, blockIdx.x, nullptr);
      continue;
    }
    for (long long c = blockIdx.x; c < op.bytes / kChunk; c += gridDim.x, ++i) acc ^= ring.consume(stages, i);
  }
  if (acc == 0x9e3779b9u) *a.sink = acc;
}

// ---- Timing ----------------------------------------------------------------------------------

// The median of 20 runs of the step, replayed from a CUDA graph (or, for one cooperative
// launch, which a graph may not hold, launched directly).
template <typename Launch>
float step_ms(cudaStream_t stream, bool in_graph, Launch launch) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (in_graph) {
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    launch();
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
  }
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int rep = 0; rep < 21; ++rep) {
    CHECK(cudaEventRecord(start, stream));
    if (in_graph)
      CHECK(cudaGraphLaunch(exec, stream));
    else
      launch();
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (rep > 0) times.push_back(ms);
  }
  if (in_graph) {
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), int ctas, int threads, int smem, cudaStream_t stream, bool dependent,
            Args... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(ctas);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute early{};
  early.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  early.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &early;
  config.numAttrs = dependent ? 1 : 0;
  CHECK(cudaLaunchKernelEx(&config, kernel, args...));
}

int main() {
  int device = 0, sms = 0;
  CHECK(cudaGetDevice(&device));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::vector<Op> ops = step_ops();
  const long long total = ops.back().offset + ops.back().bytes;
  unsigned char* base;
  CHECK(cudaMalloc(&base, total));
  CHECK(cudaMemset(base, 1, total));
  Op* device_ops;
  CHECK(cudaMalloc(&device_ops, ops.size() * sizeof(Op)));
  CHECK(cudaMemcpy(device_ops, ops.data(), ops.size() * sizeof(Op), cudaMemcpyHostToDevice));
  float *partials, *residual, *out;
  CHECK(cudaMalloc(&partials, sizeof(float) * kSplits * kRows * kHidden));
  CHECK(cudaMalloc(&residual, sizeof(float) * kRows * kHidden));
  CHECK(cudaMalloc(&out, sizeof(float) * kRows * kHidden));
  CHECK(cudaMemset(partials, 0, sizeof(float) * kSplits * kRows * kHidden));
  CHECK(cudaMemset(residual, 0, sizeof(float) * kRows * kHidden));
  const NormData norm{partials, residual, out};
  unsigned *sink, *barrier;
  CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  CHECK(cudaMalloc(&barrier, sizeof(unsigned)));
  const int smem = kRing;
  CHECK(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK(cudaFuncSetAttribute(persistent_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));

  int streaming = 0, norms = 0;
  for (const Op& op : ops) (op.bytes ? streaming : norms)++;
  std::printf("decode step model: %d layers, %.2f GB read by %d streaming ops, %d norms; %d SMs\n", kLayers,
              total / 1e9, streaming, norms, sms);
  std::printf("%-12s %9s %9s %12s\n", "form", "ms/step", "TB/s", "vs one_stream");
  float one = 0.0f;
  auto report = [&](const char* name, float ms) {
    if (one == 0.0f) one = ms;
    std::printf("%-12s %9.3f %9.2f %12.3f\n", name, ms, total / (ms * 1e-3) / 1e12, ms / one);
  };
  report("one_stream", step_ms(stream, true, [&] {
           launch(stream_kernel, sms, 64, smem, stream, false, (const unsigned char*)base, total, false, sink);
         }));
  for (bool dependent : {false, true}) {
    report(dependent ? "chain_pdl" : "chain", step_ms(stream, true, [&] {
             for (const Op& op : ops) {
               if (op.bytes)
                 launch(stream_kernel, sms, 64, smem, stream, dependent, (const unsigned char*)base + op.offset,
                        op.bytes, dependent, sink);
               else
                 launch(norm_kernel, kRows, kNormThreads, 0, stream, dependent, norm, dependent);
             }
           }));
  }
  int per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel, 64, smem));
  if (per_sm < 1) {
    std::printf("persistent: does not fit on an SM\n");
    return 1;
  }
  const PersistentArgs pa{base, device_ops, int(ops.size()), norm, barrier, sink};
  report("persistent", step_ms(stream, false, [&] {
           CHECK(cudaMemsetAsync(barrier, 0, sizeof(unsigned), stream));
           void* args[] = {(void*)&pa};
           CHECK(cudaLaunchCooperativeKernel((void*)persistent_kernel, dim3(sms), dim3(64), args, smem, stream));
         }));
  CHECK(cudaStreamSynchronize(stream));
  return 0;
}
