// The attention gates' parameters (docs/DESIGN.md §2), shared by the CPU reference, the kernels and the
// models. The gate math is in reference/gate.h (host) and kernels/gate.cuh (device).
#pragma once

#include <cstddef>
#include <vector>

namespace asynct {

enum class GateKind { Async, Softmax };

// AsyncT's gate (docs/DESIGN.md §2). Per query head h:
//   R[j] = max(S[j], 0);   A[j] = (1/W) * sum_{t<W} R[j-t]   (R = 0 left of key 0)
//   P[j] = gamma_h * clamp(alpha_h * (S[j] - sigma_h * A[j]), 0, 1)
struct AsyncGateParams {
  int pool_window = 3;       // W >= 1
  std::vector<float> alpha;  // one per query head
  std::vector<float> sigma;
  std::vector<float> gamma;
};

// Softmax attention with an optional logit softcap S = c * tanh(S / c) (c = 0: none).
struct SoftmaxGateParams {
  float softcap = 0.0f;
};

struct Gate {
  GateKind kind = GateKind::Softmax;
  AsyncGateParams async;
  SoftmaxGateParams softmax;

  static Gate make_async(int num_q_heads, int pool_window = 3, float alpha = 1.0f,
                         float sigma = 1.0f, float gamma = 1.0f) {
    Gate g;
    g.kind = GateKind::Async;
    g.async.pool_window = pool_window;
    g.async.alpha.assign(std::size_t(num_q_heads), alpha);
    g.async.sigma.assign(std::size_t(num_q_heads), sigma);
    g.async.gamma.assign(std::size_t(num_q_heads), gamma);
    return g;
  }
  static Gate make_softmax(float softcap = 0.0f) {
    Gate g;
    g.kind = GateKind::Softmax;
    g.softmax.softcap = softcap;
    return g;
  }
};

}  // namespace asynct
