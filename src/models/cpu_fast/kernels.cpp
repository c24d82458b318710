#include "models/cpu_fast/kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "models/cpu_fast/x86_target.h"

namespace asynct::cpu_fast {

namespace {

std::atomic<bool> force_generic{false};

bool cpu_has_avx2_fma() {
#ifdef ASYNCT_X86
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

// ---- plain C++ forms ----

void gemm_generic(const float* x, std::int64_t ldx, int rows, const std::uint16_t* w, int nw, int in, float* y,
                  std::int64_t ldy) {
  for (int o = 0; o < nw; ++o)
    for (int r = 0; r < rows; ++r) {
      float sum = 0.0f;
      for (int i = 0; i < in; ++i) sum += x[r * ldx + i] * bf16_to_float(w[std::int64_t(o) * in + i]);
      y[r * ldy + o] = sum;
    }
}

float dot_generic(const float* a, const std::uint16_t* b, int n) {
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum += a[i] * bf16_to_float(b[i]);
  return sum;
}

void axpy_generic(float* out, float weight, const std::uint16_t* v, int n) {
  for (int i = 0; i < n; ++i) out[i] += weight * bf16_to_float(v[i]);
}

void scores_generic(const float* q, int heads, const std::uint16_t* keys, const std::int64_t* rows, int n, int d,
                    float scale, float* out) {
  for (int h = 0; h < heads; ++h)
    for (int j = 0; j < n; ++j) out[h * n + j] = scale * dot_generic(q + h * d, keys + rows[j], d);
}

void weighted_sum_generic(const float* p, int heads, const std::uint16_t* values, const std::int64_t* rows, int n, int d,
                          float* out) {
  for (int h = 0; h < heads; ++h)
    for (int j = 0; j < n; ++j) axpy_generic(out + h * d, p[h * n + j], values + rows[j], d);
}

float sum_squares_generic(const float* x, int n) {
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum += x[i] * x[i];
  return sum;
}

float exp_shifted_generic(float* x, int n, float shift) {
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] - shift));
  return sum;
}

void swiglu_generic(const float* gate, const float* up, int n, float* out) {
  for (int i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

#ifdef ASYNCT_X86
// ---- AVX2/FMA forms ----

AVX2 inline __m256 load_bf16(const std::uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// exp(x) to ~2 ulp over the float range (Cephes' polynomial); 0 below -88.
AVX2 inline __m256 exp256(__m256 x) {
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f));
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// R rows of x (ldx apart) against one bf16 weight row b: each row's sum in 4 accumulators over
// 32-input chunks, the 8-input rest into the first, their sum, then the last inputs in order.
// Both rows of a pair share each weight load; a row's sum is the same for R = 1 as for R = 2, so
// a product gives a row the result it gets alone [C6].
template <int R>
AVX2 inline void dot_rows_avx2(const float* a, std::int64_t ldx, const std::uint16_t* b, int n, float* out, std::int64_t ldy) {
  __m256 s[R][4];
  for (int r = 0; r < R; ++r) s[r][0] = s[r][1] = s[r][2] = s[r][3] = _mm256_setzero_ps();
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256 w0 = load_bf16(b + i), w1 = load_bf16(b + i + 8), w2 = load_bf16(b + i + 16), w3 = load_bf16(b + i + 24);
    for (int r = 0; r < R; ++r) {
      const float* x = a + r * ldx + i;
      s[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(x), w0, s[r][0]);
      s[r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(x + 8), w1, s[r][1]);
      s[r][2] = _mm256_fmadd_ps(_mm256_loadu_ps(x + 16), w2, s[r][2]);
      s[r][3] = _mm256_fmadd_ps(_mm256_loadu_ps(x + 24), w3, s[r][3]);
    }
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 w = load_bf16(b + i);
    for (int r = 0; r < R; ++r) s[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(a + r * ldx + i), w, s[r][0]);
  }
  for (int r = 0; r < R; ++r) {
    float sum = hsum(_mm256_add_ps(_mm256_add_ps(s[r][0], s[r][1]), _mm256_add_ps(s[r][2], s[r][3])));
    for (int k = i; k < n; ++k) sum += a[r * ldx + k] * bf16_to_float(b[k]);
    out[r * ldy] = sum;
  }
}

AVX2 float dot_avx2(const float* a, const std::uint16_t* b, int n) {
  float sum;
  dot_rows_avx2<1>(a, 0, b, n, &sum, 0);
  return sum;
}

// Rows of x against 4 float32 weight rows w (in floats apart): 3 rows of x at a time share
// each weight load, 12 accumulators.
AVX2 void gemm_tile4_avx2(const float* x, std::int64_t ldx, int rows, const float* w, int nw, int in, float* y,
                          std::int64_t ldy) {
  const int in8 = in & ~7;
  const float *w0 = w, *w1 = w + in, *w2 = w + 2 * in, *w3 = w + 3 * in;
  int r = 0;
  for (; r + 3 <= rows; r += 3) {
    const float *x0 = x + r * ldx, *x1 = x0 + ldx, *x2 = x1 + ldx;
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c03 = c00;
    __m256 c10 = c00, c11 = c00, c12 = c00, c13 = c00;
    __m256 c20 = c00, c21 = c00, c22 = c00, c23 = c00;
    for (int i = 0; i < in8; i += 8) {
      const __m256 a0 = _mm256_loadu_ps(x0 + i), a1 = _mm256_loadu_ps(x1 + i), a2 = _mm256_loadu_ps(x2 + i);
      __m256 b = _mm256_loadu_ps(w0 + i);
      c00 = _mm256_fmadd_ps(a0, b, c00), c10 = _mm256_fmadd_ps(a1, b, c10), c20 = _mm256_fmadd_ps(a2, b, c20);
      b = _mm256_loadu_ps(w1 + i);
      c01 = _mm256_fmadd_ps(a0, b, c01), c11 = _mm256_fmadd_ps(a1, b, c11), c21 = _mm256_fmadd_ps(a2, b, c21);
      b = _mm256_loadu_ps(w2 + i);
      c02 = _mm256_fmadd_ps(a0, b, c02), c12 = _mm256_fmadd_ps(a1, b, c12), c22 = _mm256_fmadd_ps(a2, b, c22);
      b = _mm256_loadu_ps(w3 + i);
      c03 = _mm256_fmadd_ps(a0, b, c03), c13 = _mm256_fmadd_ps(a1, b, c13), c23 = _mm256_fmadd_ps(a2, b, c23);
    }
    const __m256 c[3][4] = {{c00, c01, c02, c03}, {c10, c11, c12, c13}, {c20, c21, c22, c23}};
    const float* xs[3] = {x0, x1, x2};
    for (int rr = 0; rr < 3; ++rr)
      for (int o = 0; o < nw; ++o) {
        float sum = hsum(c[rr][o]);
        for (int i = in8; i < in; ++i) sum += xs[rr][i] * w[o * in + i];
        y[(r + rr) * ldy + o] = sum;
      }
  }
  for (; r < rows; ++r) {
    const float* x0 = x + r * ldx;
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    for (int i = 0; i < in8; i += 8) {
      const __m256 a = _mm256_loadu_ps(x0 + i);
      c0 = _mm256_fmadd_ps(a, _mm256_loadu_ps(w0 + i), c0);
      c1 = _mm256_fmadd_ps(a, _mm256_loadu_ps(w1 + i), c1);
      c2 = _mm256_fmadd_ps(a, _mm256_loadu_ps(w2 + i), c2);
      c3 = _mm256_fmadd_ps(a, _mm256_loadu_ps(w3 + i), c3);
    }
    const __m256 c[4] = {c0, c1, c2, c3};
    for (int o = 0; o < nw; ++o) {
      float sum = hsum(c[o]);
      for (int i = in8; i < in; ++i) sum += x0[i] * w[o * in + i];
      y[r * ldy + o] = sum;
    }
  }
}

// Prefill products in the outer-product form: a panel of 16 weight rows over kKc inputs, packed
// as float32 [k][16], against 6 rows of x at a time (12 accumulators, each x value broadcast).
constexpr int kKc = 256;  // a panel is 16 KiB: it stays in L1 while every row of x passes

// Rows [0, rows) of w (zeros past them), inputs [k0, k0 + kc), as float32 [kc][16]: 8 rows by 8
// inputs at a time converted and transposed in registers.
AVX2 void pack_panel(const std::uint16_t* w, int in, int rows, int k0, int kc, float* panel) {
  const int kc8 = kc & ~7;
  for (int half = 0; half < 2; ++half) {
    const std::uint16_t* src[8];
    for (int r = 0; r < 8; ++r) src[r] = half * 8 + r < rows ? w + std::int64_t(half * 8 + r) * in + k0 : nullptr;
    for (int k = 0; k < kc8; k += 8) {
      __m256 v[8];
      for (int r = 0; r < 8; ++r) v[r] = src[r] ? load_bf16(src[r] + k) : _mm256_setzero_ps();
      const __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
      const __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
      const __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
      const __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
      const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
      const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
      const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
      const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
      float* out = panel + std::int64_t(k) * 16 + half * 8;
      _mm256_storeu_ps(out + 0 * 16, _mm256_permute2f128_ps(u0, u4, 0x20));
      _mm256_storeu_ps(out + 1 * 16, _mm256_permute2f128_ps(u1, u5, 0x20));
      _mm256_storeu_ps(out + 2 * 16, _mm256_permute2f128_ps(u2, u6, 0x20));
      _mm256_storeu_ps(out + 3 * 16, _mm256_permute2f128_ps(u3, u7, 0x20));
      _mm256_storeu_ps(out + 4 * 16, _mm256_permute2f128_ps(u0, u4, 0x31));
      _mm256_storeu_ps(out + 5 * 16, _mm256_permute2f128_ps(u1, u5, 0x31));
      _mm256_storeu_ps(out + 6 * 16, _mm256_permute2f128_ps(u2, u6, 0x31));
      _mm256_storeu_ps(out + 7 * 16, _mm256_permute2f128_ps(u3, u7, 0x31));
    }
    for (int k = kc8; k < kc; ++k)
      for (int r = 0; r < 8; ++r) panel[k * 16 + half * 8 + r] = src[r] ? bf16_to_float(src[r][k]) : 0.0f;
  }
}

// y[r][0..16) (+)= x[r][0..kc) . panel for r < nr (<= 6); the first nc (<= 16) columns stored.
AVX2 void micro_6x16(const float* x, std::int64_t ldx, int nr, int kc, const float* panel, float* y, std::int64_t ldy,
                     int nc, bool accumulate) {
  const float* xr[6];
  for (int r = 0; r < 6; ++r) xr[r] = x + (r < nr ? r : 0) * ldx;  // rows past nr repeat row 0, unstored
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_loadu_ps(panel + k * 16), b1 = _mm256_loadu_ps(panel + k * 16 + 8);
    __m256 a = _mm256_broadcast_ss(xr[0] + k);
    c00 = _mm256_fmadd_ps(a, b0, c00), c01 = _mm256_fmadd_ps(a, b1, c01);
    a = _mm256_broadcast_ss(xr[1] + k);
    c10 = _mm256_fmadd_ps(a, b0, c10), c11 = _mm256_fmadd_ps(a, b1, c11);
    a = _mm256_broadcast_ss(xr[2] + k);
    c20 = _mm256_fmadd_ps(a, b0, c20), c21 = _mm256_fmadd_ps(a, b1, c21);
    a = _mm256_broadcast_ss(xr[3] + k);
    c30 = _mm256_fmadd_ps(a, b0, c30), c31 = _mm256_fmadd_ps(a, b1, c31);
    a = _mm256_broadcast_ss(xr[4] + k);
    c40 = _mm256_fmadd_ps(a, b0, c40), c41 = _mm256_fmadd_ps(a, b1, c41);
    a = _mm256_broadcast_ss(xr[5] + k);
    c50 = _mm256_fmadd_ps(a, b0, c50), c51 = _mm256_fmadd_ps(a, b1, c51);
  }
  alignas(32) float out[6][16];
  _mm256_store_ps(out[0], c00), _mm256_store_ps(out[0] + 8, c01);
  _mm256_store_ps(out[1], c10), _mm256_store_ps(out[1] + 8, c11);
  _mm256_store_ps(out[2], c20), _mm256_store_ps(out[2] + 8, c21);
  _mm256_store_ps(out[3], c30), _mm256_store_ps(out[3] + 8, c31);
  _mm256_store_ps(out[4], c40), _mm256_store_ps(out[4] + 8, c41);
  _mm256_store_ps(out[5], c50), _mm256_store_ps(out[5] + 8, c51);
  for (int r = 0; r < nr; ++r) {
    float* yr = y + r * ldy;
    if (accumulate)
      for (int c = 0; c < nc; ++c) yr[c] += out[r][c];
    else
      for (int c = 0; c < nc; ++c) yr[c] = out[r][c];
  }
}

AVX2 void gemm_panels_avx2(const float* x, std::int64_t ldx, int rows, const std::uint16_t* w, int nw, int in, float* y,
                           std::int64_t ldy) {
  thread_local std::vector<float> panel;
  panel.resize(std::size_t(16) * kKc);
  for (int o = 0; o < nw; o += 16) {
    const int nc = std::min(16, nw - o);
    for (int k0 = 0; k0 < in; k0 += kKc) {
      const int kc = std::min(kKc, in - k0);
      pack_panel(w + std::int64_t(o) * in, in, nc, k0, kc, panel.data());
      for (int r = 0; r < rows; r += 6)
        micro_6x16(x + r * ldx + k0, ldx, std::min(6, rows - r), kc, panel.data(), y + r * ldy + o, ldy, nc, k0 > 0);
    }
  }
}

AVX2 void bf16_to_float_avx2(const std::uint16_t* in, float* out, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, load_bf16(in + i));
  for (; i < n; ++i) out[i] = bf16_to_float(in[i]);
}

AVX2 void gemm_avx2(const float* x, std::int64_t ldx, int rows, const std::uint16_t* w, int nw, int in, float* y,
                    std::int64_t ldy) {
  if (rows <= kBatchInvariantRows) {  // decode rows: each weight row read once, straight from memory
    // Prefetching 4 rows ahead keeps more of the row's lines in flight than the hardware's
    // prefetcher alone does. Rows of x go in pairs (dot_rows_avx2), each row's sum as alone [C6].
    const char* end = reinterpret_cast<const char*>(w + std::int64_t(nw) * in);
    for (int o = 0; o < nw; ++o) {
      const char* ahead = reinterpret_cast<const char*>(w + std::int64_t(o + 4) * in);
      for (int b = 0; b < in * 2 && ahead + b < end; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
      const std::uint16_t* row = w + std::int64_t(o) * in;
      int r = 0;
      for (; r + 2 <= rows; r += 2) dot_rows_avx2<2>(x + r * ldx, ldx, row, in, y + r * ldy + o, ldy);
      if (r < rows) dot_rows_avx2<1>(x + r * ldx, ldx, row, in, y + r * ldy + o, ldy);
    }
    return;
  }
  gemm_panels_avx2(x, ldx, rows, w, nw, in, y, ldy);
}

struct Bf16Loads {
  AVX2 __m256 operator()(const std::uint16_t* p) const { return load_bf16(p); }
};

AVX2 void axpy_avx2(float* out, float weight, const std::uint16_t* v, int n) {
  const __m256 a = _mm256_set1_ps(weight);
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_fmadd_ps(a, load_bf16(v + i), _mm256_loadu_ps(out + i)));
  for (; i < n; ++i) out[i] += weight * bf16_to_float(v[i]);
}

AVX2 float sum_squares_avx2(const float* x, int n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    s0 = _mm256_fmadd_ps(a, a, s0);
    s1 = _mm256_fmadd_ps(b, b, s1);
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_loadu_ps(x + i);
    s0 = _mm256_fmadd_ps(a, a, s0);
  }
  float sum = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) sum += x[i] * x[i];
  return sum;
}

AVX2 float exp_shifted_avx2(float* x, int n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 total = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    _mm256_storeu_ps(x + i, e);
    total = _mm256_add_ps(total, e);
  }
  float sum = hsum(total);
  for (; i < n; ++i) sum += (x[i] = std::exp(x[i] - shift));
  return sum;
}

AVX2 void swiglu_avx2(const float* gate, const float* up, int n, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, exp256(_mm256_sub_ps(zero, g))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}
#endif

}  // namespace

bool vector_kernels() { return cpu_has_avx2_fma() && !force_generic.load(std::memory_order_relaxed); }
void use_generic_kernels(bool generic) { force_generic.store(generic); }

#ifdef ASYNCT_X86
#define DISPATCH(avx2_call, generic_call) \
  if (vector_kernels()) return avx2_call;  \
  return generic_call
#else
#define DISPATCH(avx2_call, generic_call) return generic_call
#endif

void gemm_bf16(const float* x, std::int64_t ldx, int rows, const std::uint16_t* w, int nw, int in, float* y,
               std::int64_t ldy) {
  DISPATCH(gemm_avx2(x, ldx, rows, w, nw, in, y, ldy), gemm_generic(x, ldx, rows, w, nw, in, y, ldy));
}

void gemm_f32(const float* x, std::int64_t ldx, int rows, const float* w, int nw, int in, float* y, std::int64_t ldy) {
#ifdef ASYNCT_X86
  if (vector_kernels()) {  // 4 weight rows a tile; the tile kernel reads all 4, so a last short one is copied
    const int full = nw / 4 * 4;
    for (int o = 0; o < full; o += 4) gemm_tile4_avx2(x, ldx, rows, w + std::int64_t(o) * in, 4, in, y + o, ldy);
    if (full < nw) {
      thread_local std::vector<float> tile;
      tile.assign(std::size_t(4) * std::size_t(in), 0.0f);
      std::copy_n(w + std::int64_t(full) * in, std::size_t(nw - full) * std::size_t(in), tile.data());
      gemm_tile4_avx2(x, ldx, rows, tile.data(), nw - full, in, y + full, ldy);
    }
    return;
  }
#endif
  for (int o = 0; o < nw; ++o)
    for (int r = 0; r < rows; ++r) {
      float sum = 0.0f;
      for (int i = 0; i < in; ++i) sum += x[r * ldx + i] * w[std::int64_t(o) * in + i];
      y[r * ldy + o] = sum;
    }
}

float dot_bf16(const float* a, const std::uint16_t* b, int n) { DISPATCH(dot_avx2(a, b, n), dot_generic(a, b, n)); }

void axpy_bf16(float* out, float weight, const std::uint16_t* v, int n) {
  DISPATCH(axpy_avx2(out, weight, v, n), axpy_generic(out, weight, v, n));
}

void scores_bf16(const float* q, int heads, const std::uint16_t* keys, const std::int64_t* rows, int n, int d, float scale,
                 float* out) {
  check(heads >= 1 && heads <= kMaxHeadPack, "scores_bf16: a pack of ", heads, " heads");
#ifdef ASYNCT_X86
  if (vector_kernels() && d % 8 == 0) return scores_heads(heads, q, d, scale, 1.0f, keys, rows, n, out, Bf16Loads{});
#endif
  scores_generic(q, heads, keys, rows, n, d, scale, out);
}

void weighted_sum_bf16(const float* p, int heads, const std::uint16_t* values, const std::int64_t* rows, int n, int d,
                       float* out) {
  check(heads >= 1 && heads <= kMaxHeadPack, "weighted_sum_bf16: a pack of ", heads, " heads");
#ifdef ASYNCT_X86
  if (vector_kernels() && d % 8 == 0) return weighted_sum_heads(heads, p, n, 1.0f, values, rows, d, out, Bf16Loads{});
#endif
  weighted_sum_generic(p, heads, values, rows, n, d, out);
}

void norm_row(const float* x, int n, const float* w, float eps, float clip, float* y) {
  float sum_sq;
#ifdef ASYNCT_X86
  sum_sq = vector_kernels() ? sum_squares_avx2(x, n) : sum_squares_generic(x, n);
#else
  sum_sq = sum_squares_generic(x, n);
#endif
  const float inv_rms = float(1.0 / std::sqrt(double(sum_sq) / double(n) + double(eps)));
  for (int i = 0; i < n; ++i) y[i] = w[i] * std::clamp(x[i] * inv_rms, -clip, clip);
}

float exp_shifted(float* x, int n, float shift) {
  DISPATCH(exp_shifted_avx2(x, n, shift), exp_shifted_generic(x, n, shift));
}

void swiglu_row(const float* gate, const float* up, int n, float* out) {
  DISPATCH(swiglu_avx2(gate, up, n, out), swiglu_generic(gate, up, n, out));
}

void add_row(float* x, const float* y, int n) {
  for (int i = 0; i < n; ++i) x[i] += y[i];  // the compiler vectorises this at SSE2; it is never the bound
}

void bf16_to_float_row(const std::uint16_t* in, float* out, int n) {
#ifdef ASYNCT_X86
  if (vector_kernels()) return bf16_to_float_avx2(in, out, n);
#endif
  for (int i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
}

void float_to_bf16_row(const float* in, std::uint16_t* out, int n) {
  for (int i = 0; i < n; ++i) out[i] = float_to_bf16(in[i]);
}

}  // namespace asynct::cpu_fast
