// What does one dependency between two steps of a decode step cost? A probe for the engine's
// design: every kernel below does almost nothing (each CTA reads one value the step before it
// wrote and writes one), so the time per step is the dependency's alone.
//   plain          a chain of kernels in a CUDA graph, each launched when the one before ends;
//   pdl            the same chain as dependent launches (griddepcontrol): each kernel's CTAs
//                  start early and wait; the next may launch once they have all passed the wait;
//   pdl_early      the same, with the next launch allowed before the wait;
//   grid_barrier   one kernel whose CTAs meet at a counter in global memory between steps
//                  (all CTAs resident: 128 of 128 threads on 132 SMs).
// Build and run (sm_90a): nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a
//   bench/boundary_probe.cu -o boundary_probe && ./boundary_probe
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "probe_check.h"

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

template <typename Launch>
float time_graph(cudaStream_t stream, Launch launch) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  launch();
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  float best = 1e30f;
  for (int rep = 0; rep < 7; ++rep) {
    CHECK(cudaEventRecord(start, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (rep > 0 && ms < best) best = ms;
  }
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return best * 1e3f / kSteps;  // us per step
}

template <bool kEarly>
void launch_chain(cudaStream_t stream, float* values, bool pdl) {
  for (int step = 0; step < kSteps; ++step) {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(kCtas);
    config.blockDim = dim3(kThreads);
    config.stream = stream;
    cudaLaunchAttribute early{};
    early.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    early.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &early;
    config.numAttrs = pdl ? 1 : 0;
    CHECK(cudaLaunchKernelEx(&config, chain_kernel<kEarly>, values, step));
  }
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
  CHECK(cudaStreamSynchronize(stream));
  return 0;
}
