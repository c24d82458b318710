// The FP8-weight products (kernels/gemm/fp8_linear.h) at the decode shapes of the 1.7B models,
// in the forms the CUDA runner uses (models/cuda/forward.cpp): qkv, o and down left as split
// partials for their readers, gate/up with SiLU x up in its epilogue; beside the bf16 products the
// runner uses for the same rows (Gemm::linear_for_reader, Gemm::gated_linear). Each launch reads
// weights no launch before it touched recently (copies rotated past the L2's 50 MB), as a decode
// step does. The copy ceiling to compare the rates with is ceilings.py's.
// Prints per shape and rows: microseconds per launch (median of 7 timings of 48 launches
// replayed from a CUDA graph) and the rate of the weight bytes (FP8: values and scales).
// Run: build/<dir>/bench/asynct_bench_fp8_linear [product...] [rows...]   (default: all four, rows 1 4 8 32)
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/common/cuda_array.h"
#include "kernels/common/cuda_check.h"
#include "kernels/gemm/fp8_linear.h"
#include "kernels/gemm/gemm.h"
#include "probe_util.h"

using namespace asynct;
using kernels::bf16;

namespace {

constexpr int kPerGraph = 48;

// Microseconds a launch: the median of 7 timings of kPerGraph launches replayed from a graph,
// after an eager round (plans, tuning, attributes).
template <typename Issue>
float median_us(cudaStream_t stream, Issue issue) {
  for (int i = 0; i < kPerGraph; ++i) issue(i);
  ASYNCT_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<float> ms = run_times_ms(stream, true, 7, [&] {
    for (int i = 0; i < kPerGraph; ++i) issue(i);
  });
  return ms[ms.size() / 2] * 1000.0f / kPerGraph;
}

struct Shape {
  const char* name;
  int in, out;
  bool gated;  // the gate/up product: SiLU x up
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> row_counts;
  std::vector<std::string> products;
  for (int i = 1; i < argc; ++i) {
    if (std::isdigit(static_cast<unsigned char>(argv[i][0])))
      row_counts.push_back(std::atoi(argv[i]));
    else
      products.push_back(argv[i]);
  }
  if (row_counts.empty()) row_counts = {1, 4, 8, 32};
  cudaStream_t stream;
  ASYNCT_CUDA_CHECK(cudaStreamCreate(&stream));

  // Qwen3-1.7B and AsyncT-1.7B: hidden 2048, 16 query and 8 KV heads of 128, intermediate 6144.
  const Shape shapes[] = {{"qkv", 2048, 4096, false}, {"o", 2048, 2048, false}, {"gate_up", 2048, 12288, true}, {"down", 6144, 2048, false}};
  kernels::Gemm gemm;
  std::printf("%-8s %4s  %9s %8s  %9s %8s  %8s\n", "product", "rows", "fp8 us", "GB/s", "bf16 us", "GB/s", "bf16/fp8");
  for (const Shape& s : shapes) {
    if (!products.empty() && std::find(products.begin(), products.end(), s.name) == products.end()) continue;
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
      kernels::DeviceArray<bf16> x(std::size_t(rows) * s.in), y(std::size_t(rows) * s.out), act(std::size_t(rows) * s.out / 2);
      kernels::DeviceArray<float> partials(std::size_t(kernels::kMaxLinearSplits) * 64 * s.out);
      ASYNCT_CUDA_CHECK(cudaMemset(x.get(), 0, x.size() * sizeof(bf16)));
      const float fp8_us = median_us(stream, [&](int i) {
        kernels::Fp8Matrix m;
        m.values = fp8.get() + (i % copies) * values;
        m.scales = scales.get() + (i % copies) * std::size_t(s.out) * scale_cols;
        m.out = s.out;
        m.in = s.in;
        m.block_cols = 128;
        if (s.gated)
          kernels::launch_fp8_linear_glu(x.get(), m, act.get(), rows, stream);
        else
          kernels::launch_fp8_linear_partials(x.get(), m, partials.get(), partials.size(), rows, stream);
      });
      const float bf16_us = median_us(stream, [&](int i) {
        const bf16* w = wbf16.get() + (i % copies) * values;
        if (s.gated)
          gemm.gated_linear(x.get(), w, y.get(), act.get(), rows, s.in, s.out / 2, stream);
        else
          gemm.linear_for_reader(x.get(), w, y.get(), partials.get(), partials.size(), rows, s.in, s.out, stream);
      });
      const double fp8_rate = fp8_bytes / (fp8_us * 1e-6) / 1e9, bf16_rate = 2.0 * values / (bf16_us * 1e-6) / 1e9;
      std::printf("%-8s %4d  %9.2f %8.0f  %9.2f %8.0f  %8.2f\n", s.name, rows, fp8_us, fp8_rate, bf16_us, bf16_rate,
                  bf16_us / fp8_us);
    }
  }
  return 0;
}
