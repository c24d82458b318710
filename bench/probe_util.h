// What the stand-alone probes in bench/ (single .cu files built by nvcc, no library) share:
// CHECK(call), which prints where and why a CUDA runtime call failed and ends the program; a
// launch that may be dependent (programmatic dependent launch, as the engine's); and the timing
// of a sequence of launches replayed from a CUDA graph.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#define CHECK(x)                                                                       \
  do {                                                                                 \
    cudaError_t e = (x);                                                               \
    if (e != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

// kernel<<<ctas, threads, smem, stream>>>(args...), as a dependent launch when `dependent` (the
// engine's launch_dependent in src/kernels/common/dependent_launch.cuh, without its library parts).
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

// The times (ms, sorted) of `runs` runs of what `issue` launches on `stream`, after one untimed
// run: replayed from a CUDA graph captured once, or (in_graph false, e.g. for a cooperative
// launch, which a graph may not hold) issued anew each time.
template <typename Issue>
std::vector<float> run_times_ms(cudaStream_t stream, bool in_graph, int runs, Issue issue) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (in_graph) {
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    issue();
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
  }
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int run = 0; run <= runs; ++run) {
    CHECK(cudaEventRecord(start, stream));
    if (in_graph)
      CHECK(cudaGraphLaunch(exec, stream));
    else
      issue();
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (run > 0) times.push_back(ms);
  }
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  if (in_graph) {
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
  }
  std::sort(times.begin(), times.end());
  return times;
}
