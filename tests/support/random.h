// Seeded random inputs for tests: standard-normal float tensors (optionally rounded through
// bf16, the precision GPU inputs have), random lengths and shuffled block tables.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "core/tensor.h"

namespace asynct::testing {

class Random {
 public:
  explicit Random(std::uint64_t seed) : engine_(seed) {}

  Tensor normal(Shape shape, float stddev = 1.0f, bool bf16_exact = false) {
    Tensor t = Tensor::empty(DType::F32, std::move(shape));
    std::normal_distribution<float> dist(0.0f, stddev);
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      float v = dist(engine_);
      t.data_as<float>()[i] = bf16_exact ? round_to_bf16(v) : v;
    }
    return t;
  }
  Tensor uniform(Shape shape, float lo, float hi) {
    Tensor t = Tensor::empty(DType::F32, std::move(shape));
    std::uniform_real_distribution<float> dist(lo, hi);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = dist(engine_);
    return t;
  }
  int integer(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(engine_); }

  // A permutation of 0..n-1.
  std::vector<int> permutation(int n) {
    std::vector<int> p(static_cast<std::size_t>(n));
    std::iota(p.begin(), p.end(), 0);
    std::shuffle(p.begin(), p.end(), engine_);
    return p;
  }
  std::mt19937_64& engine() { return engine_; }

 private:
  std::mt19937_64 engine_;
};

}  // namespace asynct::testing
