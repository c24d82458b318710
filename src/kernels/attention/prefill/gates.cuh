// The prefill kernels' gate policies, shared by both kernels: they implement the contract of
// attention/gate_policy.cuh on the m16n8 accumulator fragments (traits.cuh). The members below
// it (apply, finish) are prefill's own.
//
// The async halo: P of key j needs the ReLU'd scores of keys j-1 .. j-W+1. Within a tile they
// come from the neighbouring lanes of the quad that holds the row by shuffles; across the tile
// boundary each thread carries the ReLU'd scores of its columns of the previous tile's last
// 8-column block (key tiles are visited in ascending order from key 0, so the carry is always
// the previous tile's; before key 0 it is zero, as the definition wants).
#pragma once

#include <cmath>

#include "kernels/attention/gate_policy.cuh"
#include "kernels/attention/prefill/prefill.h"
#include "kernels/attention/prefill/traits.cuh"

namespace asynct::kernels::prefill {

// Both gates keep per-row state for each of the warp's MB 16-row blocks; apply(), rescale() and
// finish() take the block index mb (a compile-time constant after unrolling). apply() turns a
// tile's scores into P and leaves O alone, so it may run while a product still adds into O;
// rescale() then brings O to the base of that P (softmax, when the row max moved; async: nothing)
// and must wait for the product.
template <int MB>
struct SoftmaxGate : SoftmaxGatePolicy {
  static constexpr float kRescaleLog2 = 8.0f;  // see apply()
  float scale_log2;       // scale * log2(e)
  float scale_cap;        // scale / softcap
  float softcap;          // 0: none
  float row_max[MB][2];   // running max of the (log2-scaled) scores, rows g and g+8
  float row_sum[MB][2];   // running sum of this thread's P (reduced over the quad in finish())
  float correction[MB][2];  // what O's rows g and g+8 are to be multiplied by (rescale())
  bool rescale_due[MB];     // some row of the warp's block has a correction other than 1

  __device__ SoftmaxGate(const PrefillParams& p, int /*head*/, float s) {
    scale_log2 = s * 1.4426950408889634f;
    softcap = params_of(p.gate).softcap;
    scale_cap = softcap > 0.0f ? s / softcap : 0.0f;
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) {
      row_max[mb][0] = row_max[mb][1] = -INFINITY;
      row_sum[mb][0] = row_sum[mb][1] = 0.0f;
      correction[mb][0] = correction[mb][1] = 1.0f;
      rescale_due[mb] = false;
    }
  }

  template <bool kMask, int NB>
  __device__ __forceinline__ void apply(int mb, float (&s)[NB][4], int key0, int pos0) {
    const int quad = threadIdx.x & 3;
    // The scores stay unscaled where possible: exp2(s * to_log2 - max) is one FFMA per score,
    // and the max of the unscaled scores times to_log2 (> 0) is the max of the scaled ones.
    float to_log2 = scale_log2;
    if (softcap > 0.0f) {
      const float cap_log2 = softcap * 1.4426950408889634f;
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nb][e] = cap_log2 * tanhf(s[nb][e] * scale_cap);
      to_log2 = 1.0f;
    }
    if constexpr (kMask) {
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (is_masked<NB>(key0, pos0, nb, e, quad)) s[nb][e] = -INFINITY;
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float mx = -INFINITY;
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) mx = fmaxf(mx, fmaxf(s[nb][2 * hh], s[nb][2 * hh + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(row_max[mb][hh], mx * to_log2);  // (-inf * to_log2 stays -inf)
      // Lazy rescaling: the row keeps its old max (the base of its P, l and O alike, so O / l
      // is unchanged) until the new one exceeds it by more than kRescaleLog2; P stays <= 2^8
      // then, exact enough in fp32 and within bf16's range. After the first tiles the max
      // rarely jumps that far, so the warp usually skips the rescale of O; rescaling on every
      // rise of the max measured slower behind the same vote (it was nearly always taken).
      const bool rescale = mx > row_max[mb][hh] + kRescaleLog2;  // also: first keys of the row
      correction[mb][hh] = rescale ? fast_exp2(row_max[mb][hh] - mx) : 1.0f;
      if (rescale) row_max[mb][hh] = mx;
      const float base = row_max[mb][hh] == -INFINITY ? 0.0f : row_max[mb][hh];
      float sum = 0.0f;
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        s[nb][2 * hh] = fast_exp2(fmaf(s[nb][2 * hh], to_log2, -base));
        s[nb][2 * hh + 1] = fast_exp2(fmaf(s[nb][2 * hh + 1], to_log2, -base));
        sum += s[nb][2 * hh] + s[nb][2 * hh + 1];
      }
      row_sum[mb][hh] = row_sum[mb][hh] * correction[mb][hh] + sum;
    }
    rescale_due[mb] = __any_sync(0xffffffffu, correction[mb][0] != 1.0f || correction[mb][1] != 1.0f);
  }

  // O's rows to the base of the last apply()'s P: skipped by the whole warp when no row of its
  // block moved its max (after the first tiles, nearly always).
  template <int DB>
  __device__ __forceinline__ void rescale(int mb, float (&o)[DB][4]) {
    if (!rescale_due[mb]) return;
#pragma unroll
    for (int db = 0; db < DB; ++db)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[db][e] *= correction[mb][e / 2];
    rescale_due[mb] = false;
  }

  // Row g (hh 0) or g+8's log2 of the sum of exp2 of its scaled scores: the weight of this
  // part of the keys when a tile's keys are split over CTAs; -inf when the row saw no key.
  // Every lane of the quad calls it.
  __device__ __forceinline__ float log2_sum(int mb, int hh) const {
    float l = row_sum[mb][hh];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    return l > 0.0f ? row_max[mb][hh] + __log2f(l) : -INFINITY;
  }

  template <int DB>
  __device__ __forceinline__ void finish(int mb, float (&o)[DB][4]) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float l = row_sum[mb][hh];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
      for (int db = 0; db < DB; ++db) {
        o[db][2 * hh] *= inv;
        o[db][2 * hh + 1] *= inv;
      }
    }
  }
};

// The async gate for pool windows W <= kMaxW; kExact: W == kMaxW (the window is compile-time).
// (kRowStatistics is false: O never needs a rescale.)
template <int MB, int kMaxW, bool kExact>
struct AsyncGate : AsyncGatePolicy<kMaxW> {
  static_assert(kMaxW >= 1 && kMaxW <= 8, "pool window 1..8");
  static constexpr int kHalo = kMaxW - 1 > 0 ? kMaxW - 1 : 1;  // keys left of a run (1 if none)
  // The scores stay unscaled: the scale and 1/W live in the constants (async_gate_unscaled),
  // and gamma multiplies O once in finish().
  float alpha_scale, sigma_over_w, gamma;
  int window;
  // For quad lane 0: R of the previous tile's last kMaxW-1 keys (k = 1: its last), the keys
  // left of its run; rows g and g+8.
  float carry[MB][2][kHalo];

  __device__ AsyncGate(const PrefillParams& p, int head, float s) {
    const AsyncGateDeviceParams g = AsyncGate::params_of(p.gate);
    window = kExact ? kMaxW : g.window;
    alpha_scale = g.alpha[head] * s;
    sigma_over_w = g.sigma[head] / float(window);
    gamma = g.gamma[head];
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int k = 0; k < kHalo; ++k) carry[mb][hh][k] = 0.0f;  // R = 0 left of key 0
  }

  template <bool kMask, int NB>
  __device__ __forceinline__ void apply(int mb, float (&s)[NB][4], int key0, int pos0) {
    constexpr int kRun = 2 * NB;  // this thread's consecutive keys (see key_of_column)
    const int lane = threadIdx.x & 31, quad = lane & 3;
    const int from = (lane & ~3) | ((quad - 1) & 3);  // the lane holding the run to the left
    const auto relu = [&](int i, int hh) { return fmaxf(s[i / 2][2 * hh + (i & 1)], 0.0f); };  // key i of the run
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      // left[k] = R of the key k places left of the key pair in hand: first the left lane's
      // last keys, or, for quad lane 0, the previous tile's (quad lane 3's, received one tile
      // ago); then this run's, rolled along pair by pair (the scores are overwritten by P).
      float left[kHalo + 1];
#pragma unroll
      for (int k = 1; k < kMaxW; ++k) {
        const float got = __shfl_sync(0xffffffffu, relu(kRun - k, hh), from);
        left[k] = quad == 0 ? carry[mb][hh][k - 1] : got;
        carry[mb][hh][k - 1] = got;
      }
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        const float s0 = s[nb][2 * hh], s1 = s[nb][2 * hh + 1];
        const float r0 = fmaxf(s0, 0.0f), r1 = fmaxf(s1, 0.0f);
        // sum0: R over keys i-W+1 .. i; sum1: over i-W+2 .. i+1 (i = 2 nb). With the window
        // known they share R over i-W+2 .. i.
        float sum0, sum1;
        if constexpr (kExact) {
          float shared = r0;
#pragma unroll
          for (int k = 1; k + 1 < kMaxW; ++k) shared += left[k];
          sum0 = kMaxW > 1 ? shared + left[kMaxW - 1] : shared;
          sum1 = kMaxW > 1 ? shared + r1 : r1;
        } else {
          sum0 = r0;
          sum1 = r1;
          if (window >= 2) sum1 += r0;
#pragma unroll
          for (int k = 1; k < kMaxW; ++k)
            if (k < window) sum0 += left[k];
#pragma unroll
          for (int k = 1; k + 1 < kMaxW; ++k)
            if (k + 1 < window) sum1 += left[k];
        }
        float g0 = async_gate_unscaled(s0, sum0, alpha_scale, sigma_over_w);
        float g1 = async_gate_unscaled(s1, sum1, alpha_scale, sigma_over_w);
        if constexpr (kMask) {
          if (is_masked<NB>(key0, pos0, nb, 2 * hh, quad)) g0 = 0.0f;
          if (is_masked<NB>(key0, pos0, nb, 2 * hh + 1, quad)) g1 = 0.0f;
        }
        s[nb][2 * hh] = g0;
        s[nb][2 * hh + 1] = g1;
        // Roll: the next pair's left keys are this pair and the ones before it.
#pragma unroll
        for (int k = kMaxW - 1; k >= 3; --k) left[k] = left[k - 2];
        if (kMaxW >= 3) left[2] = r0;
        if (kMaxW >= 2) left[1] = r1;
      }
    }
  }

  template <int DB>
  __device__ __forceinline__ void rescale(int, float (&)[DB][4]) {}  // P is final: O stays

  template <int DB>
  __device__ __forceinline__ void finish(int, float (&o)[DB][4]) {  // no normalisation
#pragma unroll
    for (int db = 0; db < DB; ++db)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[db][e] *= gamma;
  }
};

// Calls visit.template operator()<Gate>() with the gate policy for `gate` (MB row blocks per
// warp): softmax, or async with the pool window compile-time for W <= 3.
template <int MB, class Visit>
void with_gate(const GateArgs& gate, Visit&& visit) {
  if (gate.kind == GateKind::Softmax) return visit.template operator()<SoftmaxGate<MB>>();
  switch (gate.pool_window) {
    case 1: return visit.template operator()<AsyncGate<MB, 1, true>>();
    case 2: return visit.template operator()<AsyncGate<MB, 2, true>>();
    case 3: return visit.template operator()<AsyncGate<MB, 3, true>>();
    default: return visit.template operator()<AsyncGate<MB, 8, false>>();  // 4..8
  }
}

static_assert(GatePolicy<SoftmaxGate<1>> && GatePolicy<AsyncGate<1, 3, true>> && GatePolicy<AsyncGate<1, 8, false>>,
              "prefill's gates keep the contract of gate_policy.cuh");
}  // namespace asynct::kernels::prefill
