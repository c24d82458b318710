// The FP8-weight product (kernels/gemm/fp8_linear.h) at the decode shapes of the 1.7B models
// (qkv, o, gate/up, down), beside the bf16 product the engine runs today (Gemm::linear's
// default path) and the copy ceiling measured in the same run (a 512 MiB device-to-device copy:
// bytes read + written over its time). Each launch reads weights no launch before it touched
// recently (copies rotated past the L2's 50 MB), as a decode step does.
// Prints per shape and rows: microseconds per launch (median of 7 timings of 48 launches
// replayed from a CUDA graph) and the weight bytes' rate.
// Run: build/<dir>/bench/asynct_bench_fp8_linear [rows...]   (default 1 4 8 32)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/common/cuda_array.h"
#include "kernels/common/cuda_check.h"
#include "kernels/gemm/fp8_linear.h"
#include "kernels/gemm/gemm.h"

using namespace asynct;
using kernels::bf16;

namespace {

constexpr int kPerGraph = 48;

template <typename Issue>
float median_us(cudaStream_t stream, Issue issue) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  for (int i = 0; i < kPerGraph; ++i) issue(i);  // eager first: plans, tuning, attributes
  ASYNCT_CUDA_CHECK(cudaStreamSynchronize(stream));
  ASYNCT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < kPerGraph; ++i) issue(i);
  ASYNCT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  ASYNCT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  ASYNCT_CUDA_CHECK(cudaEventCreate(&start));
  ASYNCT_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int run = 0; run < 7; ++run) {
    ASYNCT_CUDA_CHECK(cudaEventRecord(start, stream));
    ASYNCT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    ASYNCT_CUDA_CHECK(cudaEventRecord(stop, stream));
    ASYNCT_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    ASYNCT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1000.0f / kPerGraph);
  }
  std::sort(times.begin(), times.end());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return times[times.size() / 2];
}

struct Shape {
  const char* name;
  int in, out;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> row_counts;
  for (int i = 1; i < argc; ++i) row_counts.push_back(std::atoi(argv[i]));
  if (row_counts.empty()) row_counts = {1, 4, 8, 32};
  cudaStream_t stream;
  ASYNCT_CUDA_CHECK(cudaStreamCreate(&stream));

  // The copy ceiling.
  const std::size_t copy_bytes = std::size_t(512) << 20;
  kernels::DeviceArray<std::uint8_t> from(copy_bytes), to(copy_bytes);
  ASYNCT_CUDA_CHECK(cudaMemset(from.get(), 1, copy_bytes));
  const float copy_us = median_us(stream, [&](int) {
    ASYNCT_CUDA_CHECK(cudaMemcpyAsync(to.get(), from.get(), copy_bytes, cudaMemcpyDeviceToDevice, stream));
  });
  const double ceiling = 2.0 * copy_bytes / (copy_us * 1e-6) / 1e9;
  std::printf("copy ceiling: %.0f GB/s (512 MiB device to device, read + written)\n", ceiling);

  // Qwen3-1.7B and AsyncT-1.7B: hidden 2048, 16 query and 8 KV heads of 128, intermediate 6144.
  const Shape shapes[] = {{"qkv", 2048, 4096}, {"o", 2048, 2048}, {"gate_up", 2048, 12288}, {"down", 6144, 2048}};
  kernels::Gemm gemm;
  std::printf("%-8s %4s  %9s %8s %6s  %9s %8s %6s  %6s\n", "product", "rows", "fp8 us", "GB/s", "of ceil", "bf16 us",
              "GB/s", "of ceil", "bf16/fp8");
  for (const Shape& s : shapes) {
    const std::size_t values = std::size_t(s.in) * s.out, scale_cols = (s.in + 127) / 128;
    const std::size_t fp8_bytes = values + std::size_t(s.out) * scale_cols * sizeof(float);
    const int copies = int(std::max<std::size_t>(2, (std::size_t(384) << 20) / (2 * values)));
    kernels::DeviceArray<std::uint8_t> fp8(values * copies);
    kernels::DeviceArray<float> scales(std::size_t(s.out) * scale_cols * copies);
    kernels::DeviceArray<bf16> wbf16(values * copies);
    ASYNCT_CUDA_CHECK(cudaMemset(fp8.get(), 0x30, values * copies));  // 0.75 in e4m3
    ASYNCT_CUDA_CHECK(cudaMemset(scales.get(), 0, scales.size() * sizeof(float)));
    ASYNCT_CUDA_CHECK(cudaMemset(wbf16.get(), 0, values * copies * sizeof(bf16)));
    for (int rows : row_counts) {
      kernels::DeviceArray<bf16> x(std::size_t(rows) * s.in), y(std::size_t(rows) * s.out);
      ASYNCT_CUDA_CHECK(cudaMemset(x.get(), 0, x.size() * sizeof(bf16)));
      const float fp8_us = median_us(stream, [&](int i) {
        kernels::Fp8Matrix m;
        m.values = fp8.get() + (i % copies) * values;
        m.scales = scales.get() + (i % copies) * std::size_t(s.out) * scale_cols;
        m.out = s.out;
        m.in = s.in;
        m.block_cols = 128;
        kernels::launch_fp8_linear(x.get(), m, y.get(), rows, false, stream);
      });
      const float bf16_us = median_us(stream, [&](int i) {
        gemm.linear(x.get(), wbf16.get() + (i % copies) * values, y.get(), rows, s.in, s.out, false, stream);
      });
      const double fp8_rate = fp8_bytes / (fp8_us * 1e-6) / 1e9, bf16_rate = 2.0 * values / (bf16_us * 1e-6) / 1e9;
      std::printf("%-8s %4d  %9.2f %8.0f %6.2f  %9.2f %8.0f %6.2f  %6.2f\n", s.name, rows, fp8_us, fp8_rate,
                  fp8_rate / ceiling, bf16_us, bf16_rate, bf16_rate / ceiling, bf16_us / fp8_us);
    }
  }
  return 0;
}
