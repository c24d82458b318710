// What does one dependency between two steps of a decode step cost? A probe for the engine's
// design: every kernel below does almost nothing (each CTA reads one value the step before it
// wrote and writes one), so the time per step is the dependency's alone.
//   plain          a chain of kernels in a CUDA graph, each launched when the one before ends;
//   pdl            the same chain as dependent launches (griddepcontrol): each kernel's CTAs
//                  start early and wait; the next may launch once they have all passed the wait;
//   pdl_early      the same, with the next launch allowed before the wait;
//   grid_barrier   one kernel whose CTAs meet at a counter in global memory between steps
//                  (all CTAs resident: 128 of 128 threads on 132 SMs).
// Then the decode step's norm stage, as dependent launches: a "product" kernel (128 CTAs) writes
// 4 split partial sums of a 32 x 2048 fp32 output (1 MB) and a norm kernel (a CTA of 256 threads
// per row) reads them back, in four forms: it only waits (the pair's dependencies alone); it
// loads its row's partials and residual and stores a row; and it adds one or two block-wide
// sums of squares between the loads and the store (fused add + norm; Peri-LN's two norms).
// Build and run (sm_90a): nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a
//   bench/boundary_probe.cu -o boundary_probe && ./boundary_probe
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "probe_util.h"

constexpr int kCtas = 128, kThreads = 128, kSteps = 512;

// One step: CTA b reads what CTA (b + 1) % kCtas wrote in the step before (another SM's write,
// through L2) and writes its own.
__device__ void step_work(float* values, int step) {
  if (threadIdx.x == 0) {
    const float in = __ldcg(&values[(step & 1) * kCtas + (blockIdx.x + 1) % kCtas]);
    __stcg(&values[((step + 1) & 1) * kCtas + blockIdx.x], in + 1.0f);
  }
}

template <bool kEarly>
__global__ void chain_kernel(float* values, int step) {
  if (kEarly) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (!kEarly) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  step_work(values, step);
}

__global__ void barrier_kernel(float* values, unsigned* counter, int steps) {
  for (int step = 0; step < steps; ++step) {
    step_work(values, step);
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(counter, 1u);
      const unsigned target = unsigned(step + 1) * kCtas;
      unsigned seen;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
      } while (seen < target);
    }
    __syncthreads();
  }
}

// The norm stage: the product's partials [split][row][col], written by 128 CTAs of 8 KB each.
constexpr int kRows = 32, kHidden = 2048, kSplits = 4, kNormThreads = kHidden / 8;

__global__ void product_kernel(float* partials, int step) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  constexpr int kPerCta = kSplits * kRows * kHidden / kCtas;  // 2048 floats
  float4* out = reinterpret_cast<float4*>(partials + blockIdx.x * kPerCta);
  for (int i = threadIdx.x; i < kPerCta / 4; i += kThreads) out[i] = make_float4(step, 1.0f, 2.0f, 3.0f);
}

__device__ float block_sum(float v, float* partial) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  v = threadIdx.x % 32 < kNormThreads / 32 ? partial[threadIdx.x % 32] : 0.0f;
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// kReductions < 0: wait only. Otherwise thread t of row r handles columns 8t..8t+7.
template <int kReductions>
__global__ void norm_kernel(const float* partials, float* residual, float* out) {
  __shared__ float partial[2][kNormThreads / 32];
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if constexpr (kReductions >= 0) {
    const int row = blockIdx.x, col = threadIdx.x * 8;
    float x[8] = {};
    float4 loaded[kSplits][2];
#pragma unroll
    for (int s = 0; s < kSplits; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        loaded[s][h] = __ldcg(reinterpret_cast<const float4*>(partials + (s * kRows + row) * kHidden + col) + h);
    float4 r4[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) r4[h] = __ldcg(reinterpret_cast<const float4*>(residual + row * kHidden + col) + h);
    const float r[8] = {r4[0].x, r4[0].y, r4[0].z, r4[0].w, r4[1].x, r4[1].y, r4[1].z, r4[1].w};
#pragma unroll
    for (int s = 0; s < kSplits; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        x[4 * h] += loaded[s][h].x, x[4 * h + 1] += loaded[s][h].y;
        x[4 * h + 2] += loaded[s][h].z, x[4 * h + 3] += loaded[s][h].w;
      }
    float scale = 1.0f;
#pragma unroll
    for (int k = 0; k < kReductions; ++k) {
      float squares = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) squares += x[e] * x[e];
      scale = rsqrtf(block_sum(squares, partial[k]) / kHidden + 1e-6f);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = x[e] * scale + (k == 0 ? r[e] : 0.0f);
    }
    float4* dst = reinterpret_cast<float4*>(out + row * kHidden + col);
    dst[0] = make_float4(x[0], x[1], x[2], x[3]);
    dst[1] = make_float4(x[4], x[5], x[6], x[7]);
  }
}

// The best of 6 graph replays, per step (us).
template <typename Issue>
float time_graph(cudaStream_t stream, Issue issue) {
  return run_times_ms(stream, true, 6, issue).front() * 1e3f / kSteps;
}

// kSteps product + norm pairs; the time per pair.
template <int kReductions>
void launch_norm_pairs(cudaStream_t stream, float* partials, float* residual, float* out) {
  for (int step = 0; step < kSteps; ++step) {
    launch(product_kernel, kCtas, kThreads, 0, stream, true, partials, step);
    launch(norm_kernel<kReductions>, kRows, kNormThreads, 0, stream, true, (const float*)partials, residual, out);
  }
}

template <bool kEarly>
void launch_chain(cudaStream_t stream, float* values, bool pdl) {
  for (int step = 0; step < kSteps; ++step) launch(chain_kernel<kEarly>, kCtas, kThreads, 0, stream, pdl, values, step);
}

int main() {
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  float* values;
  unsigned* counter;
  CHECK(cudaMalloc(&values, 2 * kCtas * sizeof(float)));
  CHECK(cudaMalloc(&counter, sizeof(unsigned)));
  CHECK(cudaMemset(values, 0, 2 * kCtas * sizeof(float)));
  std::printf("us per dependent step, %d steps of %d CTAs x %d threads, best of 6 graph replays\n", kSteps, kCtas,
              kThreads);
  std::printf("  plain         %6.2f\n", time_graph(stream, [&] { launch_chain<false>(stream, values, false); }));
  std::printf("  pdl           %6.2f\n", time_graph(stream, [&] { launch_chain<false>(stream, values, true); }));
  std::printf("  pdl_early     %6.2f\n", time_graph(stream, [&] { launch_chain<true>(stream, values, true); }));
  std::printf("  grid_barrier  %6.2f\n", time_graph(stream, [&] {
                CHECK(cudaMemsetAsync(counter, 0, sizeof(unsigned), stream));
                barrier_kernel<<<kCtas, kThreads, 0, stream>>>(values, counter, kSteps);
              }));
  float *partials, *residual, *out;
  CHECK(cudaMalloc(&partials, sizeof(float) * kSplits * kRows * kHidden));
  CHECK(cudaMalloc(&residual, sizeof(float) * kRows * kHidden));
  CHECK(cudaMalloc(&out, sizeof(float) * kRows * kHidden));
  CHECK(cudaMemset(residual, 0, sizeof(float) * kRows * kHidden));
  std::printf("us per product + norm pair (%d x %d, %d splits), dependent launches\n", kRows, kHidden, kSplits);
  std::printf("  norm waits only        %6.2f\n",
              time_graph(stream, [&] { launch_norm_pairs<-1>(stream, partials, residual, out); }));
  std::printf("  loads, stores          %6.2f\n",
              time_graph(stream, [&] { launch_norm_pairs<0>(stream, partials, residual, out); }));
  std::printf("  + one reduction        %6.2f\n",
              time_graph(stream, [&] { launch_norm_pairs<1>(stream, partials, residual, out); }));
  std::printf("  + two reductions       %6.2f\n",
              time_graph(stream, [&] { launch_norm_pairs<2>(stream, partials, residual, out); }));
  CHECK(cudaStreamSynchronize(stream));
  return 0;
}
