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
//                every op's bytes back to back, while its consumer warps meet the other CTAs at a
//                grid barrier wherever the step has a dependency (7 per layer) and 32 of the CTAs
//                compute the norms: the ring keeps filling across the barriers, as a persistent
//                decode-step kernel's would.
// Streaming CTAs: a producer warp issuing 16 KB bulk copies into a 12-stage ring (192 KB, so two
// of them never share an SM, like the engine's products and stage 1), a consumer warp reading a
// word of each stage. A norm: a row per CTA (256 threads) reading a 4-split fp32 32 x 2048 partial
// sum and a residual (L2), two block-wide sums of squares, a row stored (the engine's Peri-LN
// norm stage, as bench/boundary_probe.cu models it).
// Build and run (sm_90a): nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Isrc
//   bench/step_probe.cu -o step_probe && ./step_probe
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "kernels/common/bulk_copy.cuh"
#include "probe_util.h"

using asynct::kernels::bulk_copy_to_shared;
using asynct::kernels::SharedBarrier;

constexpr int kLayers = 28;
// The step's reads, bytes (1.7B config; 32 x 512 keys x 8 KV heads x 128 x bf16, K and V).
constexpr long long kQkv = 2048LL * 4096 * 2, kKv = 32LL * 512 * 8 * 128 * 2 * 2, kO = 2048LL * 2048 * 2,
                    kGateUp = 2048LL * 12288 * 2, kDown = 6144LL * 2048 * 2, kLmHead = 151936LL * 2048 * 2;
constexpr int kChunk = 16 * 1024, kMaxStages = 12;

struct Op {
  long long offset = 0, bytes = 0;  // bytes == 0: a norm
  bool attention = false;           // decode stage 1's K and V
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
    ops.back().attention = true;
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
  SharedBarrier full[kMaxStages], empty[kMaxStages];
  int stages;
  __device__ void init(int n) {
    if (threadIdx.x == 0) {
      stages = n;
      for (int s = 0; s < n; ++s) full[s].init(1), empty[s].init(1);
      SharedBarrier::fence_init();
    }
    __syncthreads();
  }
  // Producer (one lane): the i-th chunk of this CTA into stage i % stages.
  __device__ void produce(unsigned char* ring, long long i, const unsigned char* src, unsigned bytes,
                          std::uint64_t policy) {
    const int s = int(i % stages);
    if (i >= stages) empty[s].wait(unsigned((i / stages - 1) & 1));
    bulk_copy_to_shared(ring + s * kChunk, src, bytes, full[s], policy);
    full[s].arrive_expecting(bytes);
  }
  // Consumer warp: waits for the i-th chunk, reads a word per lane, frees the stage.
  __device__ unsigned consume(const unsigned char* ring, long long i) {
    const int s = int(i % stages);
    full[s].wait(unsigned((i / stages) & 1));
    const unsigned v = reinterpret_cast<const unsigned*>(ring + s * kChunk)[threadIdx.x & 31];
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

// One row's norm by 256 threads (thread t: columns 8t..8t+7; `sync` makes them meet): sum the
// splits and the residual, two block-wide sums of squares (Peri-LN), store the row.
template <typename Sync>
__device__ void norm_row(const NormData& d, int row, int t, float (&scratch)[2][kNormThreads / 32], Sync sync) {
  const int col = t * 8;
  float4 v[2 * (kSplits + 1)];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    v[h] = __ldcg(reinterpret_cast<const float4*>(d.residual + row * kHidden + col) + h);
#pragma unroll
    for (int s = 0; s < kSplits; ++s)
      v[2 * (s + 1) + h] = __ldcg(reinterpret_cast<const float4*>(d.partials + (s * kRows + row) * kHidden + col) + h);
  }
  float x[8] = {};
#pragma unroll
  for (int i = 0; i < kSplits + 1; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float4 a = v[2 * i + h];
      x[4 * h] += a.x, x[4 * h + 1] += a.y, x[4 * h + 2] += a.z, x[4 * h + 3] += a.w;
    }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    float sum = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) sum += x[e] * x[e];
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (t % 32 == 0) scratch[k][t / 32] = sum;
    sync();
    sum = 0.0f;
    for (int w = 0; w < kNormThreads / 32; ++w) sum += scratch[k][w];
    const float scale = rsqrtf(sum / kHidden + 1e-6f);
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] *= scale;
  }
  float4* dst = reinterpret_cast<float4*>(d.out + row * kHidden + col);
  dst[0] = make_float4(x[0], x[1], x[2], x[3]);
  dst[1] = make_float4(x[4], x[5], x[6], x[7]);
}

// ---- The chain's kernels -------------------------------------------------------------------

// One streaming op: chunk c of the op goes to CTA c % gridDim.x. With `dependent`, the producer
// requests its first ring of chunks before waiting for the kernel before.
// Work that does not overlap the stream, as decode stage 1 has it (the q projection and halo
// between its wait and its first tile; the V tail, the split count and the combine after its last):
// the consumer spends `before` ns after its wait and `after` ns after its last chunk.
struct Ends {
  int before = 0, after = 0;
};

__device__ void busy_ns(int ns) {  // at the H200's 1.98 GHz
  const long long until = clock64() + (long long)ns * 198 / 100;
  while (clock64() < until) {
  }
}

__global__ void __launch_bounds__(64) stream_kernel(const unsigned char* src, long long bytes, bool dependent,
                                                    int stages, Ends ends, unsigned* sink) {
  extern __shared__ __align__(128) unsigned char buffer[];
  __shared__ Ring ring;
  ring.init(stages);
  const long long chunks = bytes / kChunk;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  if (warp == 0) {
    if (lane != 0) return;
    const std::uint64_t policy = asynct::kernels::l2_evict_first_policy();
    bool waited = !dependent;
    long long i = 0;
    for (long long c = blockIdx.x; c < chunks; c += gridDim.x, ++i) {
      if (!waited && i == stages) {
        wait_prior();
        allow_next();
        waited = true;
      }
      ring.produce(buffer, i, src + c * kChunk, kChunk, policy);
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
  busy_ns(ends.before);
  unsigned acc = 0;
  long long i = 0;
  for (long long c = blockIdx.x; c < chunks; c += gridDim.x, ++i) acc ^= ring.consume(buffer, i);
  busy_ns(ends.after);
  if (acc == 0x9e3779b9u) *sink = acc;
}

__global__ void __launch_bounds__(kNormThreads) norm_kernel(NormData d, bool dependent) {
  __shared__ float scratch[2][kNormThreads / 32];
  if (dependent) {
    wait_prior();
    allow_next();
  }
  norm_row(d, blockIdx.x, threadIdx.x, scratch, [] { __syncthreads(); });
}

// ---- The persistent kernel -----------------------------------------------------------------

struct PersistentArgs {
  const unsigned char* base;
  const Op* ops;
  int num_ops;
  NormData norm;
  unsigned* barrier;  // zero at the start of each step
  unsigned* sink;
  bool barriers, norms;  // (diagnostics: without the grid barriers, without the norms' work)
};

// The grid barrier, by one thread of the CTA: the `index`-th of the step.
__device__ void grid_barrier(unsigned* counter, unsigned index) {
  __threadfence();
  atomicAdd(counter, 1u);
  const unsigned target = (index + 1) * gridDim.x;
  unsigned seen;
  do {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
  } while (seen < target);
}

// The consumer warps (all but the producer) meet; the producer runs on.
__device__ __forceinline__ void consumers_meet() { asm volatile("bar.sync 1, %0;" ::"n"(kNormThreads) : "memory"); }

// A producer warp and 8 consumer warps: the first consumes the ring, all 8 compute the norms.
__global__ void __launch_bounds__(32 + kNormThreads) persistent_kernel(PersistentArgs a) {
  extern __shared__ __align__(128) unsigned char buffer[];
  __shared__ Ring ring;
  __shared__ float scratch[2][kNormThreads / 32];
  ring.init(kMaxStages);
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, t = int(threadIdx.x) - 32;
  if (warp == 0) {  // the producer: every op's chunks, back to back, bounded by the ring only
    if (lane != 0) return;
    const std::uint64_t policy = asynct::kernels::l2_evict_first_policy();
    long long i = 0;
    for (int k = 0; k < a.num_ops; ++k) {
      const Op op = a.ops[k];
      for (long long c = blockIdx.x; c < op.bytes / kChunk; c += gridDim.x, ++i)
        ring.produce(buffer, i, a.base + op.offset + c * kChunk, kChunk, policy);
    }
    return;
  }
  unsigned acc = 0, barriers = 0;
  long long i = 0;
  for (int k = 0; k < a.num_ops; ++k) {
    const Op op = a.ops[k];
    if (k > 0 && a.barriers) {  // this op needs the one before it
      if (t == 0) grid_barrier(a.barrier, barriers);
      ++barriers;
      consumers_meet();
    }
    if (op.bytes == 0) {
      if (blockIdx.x < kRows && a.norms) norm_row(a.norm, blockIdx.x, t, scratch, [] { consumers_meet(); });
    } else if (warp == 1) {
      for (long long c = blockIdx.x; c < op.bytes / kChunk; c += gridDim.x, ++i) acc ^= ring.consume(buffer, i);
    }
  }
  if (acc == 0x9e3779b9u) *a.sink = acc;
}

// ---- Timing ----------------------------------------------------------------------------------

// The median of 20 runs of the step.
template <typename Issue>
float step_ms(cudaStream_t stream, bool in_graph, Issue issue) {
  const std::vector<float> times = run_times_ms(stream, in_graph, 20, issue);
  return times[times.size() / 2];
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
  const int smem = kMaxStages * kChunk;
  CHECK(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK(cudaFuncSetAttribute(persistent_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));

  int streaming = 0, norms = 0;
  for (const Op& op : ops) (op.bytes ? streaming : norms)++;
  std::printf("decode step model: %d layers, %.2f GB read by %d streaming ops, %d norms; %d SMs\n", kLayers,
              total / 1e9, streaming, norms, sms);
  std::printf("%-34s %9s %9s %12s\n", "form", "ms/step", "TB/s", "vs one_stream");
  float one = 0.0f;
  auto report = [&](const char* name, float ms) {
    if (one == 0.0f) one = ms;
    std::printf("%-34s %9.3f %9.2f %12.3f\n", name, ms, total / (ms * 1e-3) / 1e12, ms / one);
  };
  report("one_stream", step_ms(stream, true, [&] {
           launch(stream_kernel, sms, 64, smem, stream, false, (const unsigned char*)base, total, false, kMaxStages,
                  Ends{}, sink);
         }));
  // The chain: `stages` deep rings (6: 96 KB, so that the next kernel's CTA fits beside a running
  // one and starts its stream before that one ends); `with_norms` false drops the norm kernels.
  // `beside` > 0: the attention op's ring is 10 stages (160 KB) and the o product's after it
  // `beside` stages, so that o's CTAs fit on the SMs beside attention's and start streaming while
  // attention finishes.
  auto chain = [&](const char* name, bool dependent, int stages, bool with_norms, Ends attention_ends = {},
                   int beside = 0) {
    report(name, step_ms(stream, true, [&] {
             bool after_attention = false;
             for (const Op& op : ops) {
               int n = stages;
               if (beside > 0 && op.attention) n = 10;
               if (beside > 0 && after_attention) n = beside;
               if (op.bytes)
                 launch(stream_kernel, sms, 64, n * kChunk, stream, dependent, (const unsigned char*)base + op.offset,
                        op.bytes, dependent, n, op.attention ? attention_ends : Ends{}, sink);
               else if (with_norms)
                 launch(norm_kernel, kRows, kNormThreads, 0, stream, dependent, norm, dependent);
               after_attention = op.attention;
             }
           }));
  };
  chain("chain", false, kMaxStages, true);
  chain("chain_pdl", true, kMaxStages, true);
  chain("chain_pdl, no norms", true, kMaxStages, false);
  chain("chain_pdl, 96 KB rings", true, 6, true);
  chain("chain_pdl, 96 KB rings, no norms", true, 6, false);
  // Decode stage 1's ends as measured in the engine (bench/RESULTS.md: 3.6 us of
  // projection and halo after the wait, 3.8 us of V tail, count and combine after the last tile).
  chain("chain_pdl, attention ends 3.6 + 3.8 us", true, kMaxStages, true, Ends{3600, 3800});
  chain("chain_pdl, attention start 3.6 us", true, kMaxStages, true, Ends{3600, 0});
  chain("chain_pdl, attention end 3.8 us", true, kMaxStages, true, Ends{0, 3800});
  chain("chain_pdl, attention end 3.8 us, o beside (3 stages)", true, kMaxStages, true, Ends{0, 3800}, 3);
  chain("chain_pdl, attention end 3.8 us, o beside (4 stages)", true, kMaxStages, true, Ends{0, 3800}, 4);
  int per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel, 32 + kNormThreads, smem));
  if (per_sm < 1) {
    std::printf("persistent: does not fit on an SM\n");
    return 1;
  }
  auto persistent = [&](const char* name, bool barriers, bool with_norms) {
    const PersistentArgs pa{base, device_ops, int(ops.size()), norm, barrier, sink, barriers, with_norms};
    report(name, step_ms(stream, false, [&] {
             CHECK(cudaMemsetAsync(barrier, 0, sizeof(unsigned), stream));
             void* args[] = {(void*)&pa};
             CHECK(cudaLaunchCooperativeKernel((void*)persistent_kernel, dim3(sms), dim3(32 + kNormThreads), args, smem,
                                               stream));
           }));
  };
  persistent("persistent", true, true);
  persistent("persistent, no norms", true, false);
  persistent("persistent, no barriers, no norms", false, false);
  CHECK(cudaStreamSynchronize(stream));
  return 0;
}
