// The two attention gates, per score, in the plainest form. The CPU reference uses these
// directly; the GPU kernels implement the same formulas and are tested against them. The
// parameter structs (Gate, GateKind) are in core/gate.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/gate.h"

namespace asynct {

// P from a score S and its pooled ReLU A.
inline double async_gate_value(double score, double pooled, double alpha, double sigma,
                               double gamma) {
  return gamma * std::clamp(alpha * (score - sigma * pooled), 0.0, 1.0);
}

// A[j] for j = first + index, from the scores of keys (j - W + 1) .. j. `scores[k]` is the score
// of key `first_scored + k`; keys left of 0 count as R = 0.
inline double async_pooled_relu(const std::vector<double>& scores, int first_scored, int key,
                                int pool_window) {
  double sum = 0.0;
  for (int t = 0; t < pool_window; ++t) {
    int j = key - t;
    if (j < 0) break;
    sum += std::max(scores[std::size_t(j - first_scored)], 0.0);
  }
  return sum / pool_window;
}

inline double softcapped(double score, double softcap) {
  return softcap > 0 ? softcap * std::tanh(score / softcap) : score;
}

}  // namespace asynct
