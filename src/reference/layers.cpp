#include "reference/layers.h"

#include <algorithm>
#include <cmath>

#include "core/parallel.h"

namespace asynct {

Tensor embedding(const Tensor& table, const std::vector<std::int32_t>& tokens) {
  expect_dtype(table, DType::F32, "embedding: table");
  expect_shape(table, {any, any}, "embedding: table");
  const std::int64_t vocab = table.size(0), hidden = table.size(1);
  Tensor out = Tensor::empty(DType::F32, {std::int64_t(tokens.size()), hidden});
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    check(tokens[t] >= 0 && tokens[t] < vocab, "embedding: token id ", tokens[t], " at position ",
          t, " is outside the vocabulary [0, ", vocab, ")");
    for (std::int64_t i = 0; i < hidden; ++i)
      out.data_as<float>()[std::int64_t(t) * hidden + i] =
          table.data_as<float>()[std::int64_t(tokens[t]) * hidden + i];
  }
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) {
  expect_dtype(a, DType::F32, "add: a");
  expect_dtype(b, DType::F32, "add: b");
  expect_shape(b, a.shape(), "add: b");
  Tensor sum = Tensor::empty(DType::F32, a.shape());
  for (std::int64_t i = 0; i < a.numel(); ++i) sum.data_as<float>()[i] = a.data_as<float>()[i] + b.data_as<float>()[i];
  return sum;
}

Tensor linear(const Tensor& x, const Tensor& weight) {
  expect_dtype(x, DType::F32, "linear: x");
  expect_dtype(weight, DType::F32, "linear: weight");
  expect_shape(x, {any, any}, "linear: x");
  expect_shape(weight, {any, x.size(1)}, "linear: weight");
  const std::int64_t rows = x.size(0), in = x.size(1), out_features = weight.size(0);
  Tensor y = Tensor::empty(DType::F32, {rows, out_features});
  // Each output is the same float64 dot product whichever thread computes it; the CPU engine
  // spends most of its time here, so blocks of output features go to the machine's threads
  // when the product is big enough to pay for starting them (~2M multiply-adds per thread).
  constexpr std::int64_t kFeaturesPerTask = 64, kWorkPerThread = std::int64_t(1) << 21;
  const std::int64_t tasks = (out_features + kFeaturesPerTask - 1) / kFeaturesPerTask;
  const std::int64_t useful_threads = std::max<std::int64_t>(1, rows * in * out_features / kWorkPerThread);
  parallel_for(
      std::size_t(tasks),
      [&](std::size_t task) {
        const std::int64_t first = std::int64_t(task) * kFeaturesPerTask;
        const std::int64_t last = std::min(out_features, first + kFeaturesPerTask);
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t o = first; o < last; ++o) {
            double sum = 0.0;
            for (std::int64_t i = 0; i < in; ++i)
              sum += double(x.data_as<float>()[r * in + i]) * double(weight.data_as<float>()[o * in + i]);
            y.data_as<float>()[r * out_features + o] = float(sum);
          }
      },
      unsigned(std::min<std::int64_t>(useful_threads, 1 << 16)));
  return y;
}

Tensor swiglu(const Tensor& gate_up) {
  expect_dtype(gate_up, DType::F32, "swiglu: gate_up");
  expect_shape(gate_up, {any, any}, "swiglu: gate_up");
  check(gate_up.size(1) % 2 == 0, "swiglu: gate_up width ", gate_up.size(1), " is odd");
  const std::int64_t rows = gate_up.size(0), inter = gate_up.size(1) / 2;
  Tensor y = Tensor::empty(DType::F32, {rows, inter});
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < inter; ++i) {
      const double g = gate_up.data_as<float>()[r * 2 * inter + i];
      const double u = gate_up.data_as<float>()[r * 2 * inter + inter + i];
      y.data_as<float>()[r * inter + i] = float(g / (1.0 + std::exp(-g)) * u);
    }
  return y;
}

}  // namespace asynct
