// The gate-policy contract shared by the decode and prefill kernels.
//
// Both attention families are templates over a gate policy: the one thing that differs between
// softmax and the AsyncT gate. Each family has its own policies, because what a policy does
// with a tile of scores depends on how the family holds them (decode: one score per lane after a
// reduce-scatter, or a warp's score rows in shared memory; prefill: the m16n8 accumulator
// fragments of mma.sync / wgmma). What every policy of either family declares is the same, and
// comes from one of the two bases below:
//
//   static constexpr GateKind kKind;        which gate it computes. Kernels branch on this, never
//                                           on a memory or layout trait of the policy;
//   static constexpr bool kRowStatistics;   whether it keeps a running max and sum per query row
//                                           and rescales/normalises the output by them (softmax),
//                                           or computes each P once, final (AsyncT);
//   static constexpr int kMaxHalo;          the most keys left of a key whose scores its P needs:
//                                           W-1 for the pool window W, 0 for softmax;
//   using Params;                           its parameters, taken from GateArgs by params_of().
//
// The per-score math is gate.cuh's (async_gate, async_gate_unscaled, softcap_score); a policy
// adds only where the scores are and how they are walked.
#pragma once

#include <concepts>

#include "kernels/attention/attention_args.h"
#include "kernels/attention/gate.cuh"

namespace asynct::kernels {

// Softmax's parameter as the kernels hold it: the optional logit softcap (0 = none). (The host
// side's parameter structs, with per-head vectors, are core/gate.h's.)
struct SoftmaxGateDeviceParams {
  float softcap;
};

// The AsyncT gate's parameters: the pool window W and, per query head, alpha, sigma and gamma
// (device arrays).
struct AsyncGateDeviceParams {
  int window;
  const float *alpha, *sigma, *gamma;
};

struct SoftmaxGatePolicy {
  static constexpr GateKind kKind = GateKind::Softmax;
  static constexpr bool kRowStatistics = true;
  static constexpr int kMaxHalo = 0;
  using Params = SoftmaxGateDeviceParams;
  __host__ __device__ static Params params_of(const GateArgs& gate) { return {gate.softcap}; }
};

// kMaxWindow: the largest pool window the policy handles (its halo is kMaxWindow - 1 keys).
template <int kMaxWindow>
struct AsyncGatePolicy {
  static_assert(kMaxWindow >= 1, "pool window >= 1");
  static constexpr GateKind kKind = GateKind::Async;
  static constexpr bool kRowStatistics = false;
  static constexpr int kMaxHalo = kMaxWindow - 1;
  using Params = AsyncGateDeviceParams;
  __host__ __device__ static Params params_of(const GateArgs& gate) {
    return {gate.pool_window, gate.alpha, gate.sigma, gate.gamma};
  }
};

template <class Gate>
concept GatePolicy = requires(const GateArgs& args) {
  { Gate::kKind } -> std::convertible_to<GateKind>;
  { Gate::kRowStatistics } -> std::convertible_to<bool>;
  { Gate::kMaxHalo } -> std::convertible_to<int>;
  { Gate::params_of(args) } -> std::same_as<typename Gate::Params>;
} && (Gate::kKind == GateKind::Softmax) == Gate::kRowStatistics && (Gate::kMaxHalo == 0 || Gate::kKind == GateKind::Async);

template <class Gate>
inline constexpr bool is_softmax_gate = Gate::kKind == GateKind::Softmax;

}  // namespace asynct::kernels
