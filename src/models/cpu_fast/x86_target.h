// The vector kernels' target: on x86-64, the intrinsics and AVX2, a function attribute compiling
// one function for AVX2 + FMA + F16C (chosen at run time: kernels.h, vector_kernels()), and
// ASYNCT_X86 to guard them, and the small AVX2 pieces several kernel files share; elsewhere none
// is defined and the plain C++ forms run.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

#define ASYNCT_X86 1
#define AVX2 __attribute__((target("avx2,fma,f16c")))

namespace asynct::cpu_fast {

// The sum of a vector's 8 lanes.
AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The sums of a's and b's lanes, in lanes 0 and 1.
AVX2 inline __m128 hsum2(__m256 a, __m256 b) {
  const __m256 pairs = _mm256_hadd_ps(a, b);  // a01 a23 b01 b23 | a45 a67 b45 b67
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(pairs), _mm256_extractf128_ps(pairs, 1));
  return _mm_hadd_ps(s, s);
}

// Attention's reads of a cache's rows, whatever its element type, for a pack of S query heads of
// one KV head: each key and value row is loaded and converted once for all of them. load(ptr)
// gives 8 values of a row times 1 / unit (bf16: exactly; e4m3: times 2^-8); d is a multiple of 8.
// Each (key, head) sum is formed the same way whatever S is, so a row's result does not depend
// on how heads are packed.
//
// Scores: out[h * n + j] = scale * unit * sum_i q[h * d + i] * row_j[i], keys in pairs.
template <int S, typename T, typename Load>
AVX2 inline void scores_pack(const float* q, int d, float scale, float unit, const T* keys, const std::int64_t* rows,
                             int n, float* out, Load load) {
  const __m128 factor = _mm_set1_ps(scale * unit);
  int j = 0;
  for (; j + 2 <= n; j += 2) {
    const T *k0 = keys + rows[j], *k1 = keys + rows[j + 1];
    __m256 a[S][2];
    for (int h = 0; h < S; ++h) a[h][0] = a[h][1] = _mm256_setzero_ps();
    for (int i = 0; i < d; i += 8) {
      const __m256 x0 = load(k0 + i), x1 = load(k1 + i);
      for (int h = 0; h < S; ++h) {
        const __m256 qv = _mm256_loadu_ps(q + h * d + i);
        a[h][0] = _mm256_fmadd_ps(qv, x0, a[h][0]);
        a[h][1] = _mm256_fmadd_ps(qv, x1, a[h][1]);
      }
    }
    for (int h = 0; h < S; ++h) _mm_storel_pi(reinterpret_cast<__m64*>(out + h * n + j), _mm_mul_ps(hsum2(a[h][0], a[h][1]), factor));
  }
  if (j < n) {  // the last key, alone: summed as its pair's first would be
    const T* k0 = keys + rows[j];
    __m256 a[S];
    for (int h = 0; h < S; ++h) a[h] = _mm256_setzero_ps();
    for (int i = 0; i < d; i += 8) {
      const __m256 x0 = load(k0 + i);
      for (int h = 0; h < S; ++h) a[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * d + i), x0, a[h]);
    }
    for (int h = 0; h < S; ++h) out[h * n + j] = _mm_cvtss_f32(_mm_mul_ps(hsum2(a[h], _mm256_setzero_ps()), factor));
  }
}

// Weighted sums: out[h * d + c] += unit * sum_j p[h * n + j] * row_j[c], W groups of 8 columns
// from column c in registers for every head. A key whose weight is 0 for every head of the pack
// (the async gate's zeros) is skipped.
template <int S, int W, typename T, typename Load>
AVX2 inline void weighted_sum_columns(const float* p, int n, float unit, const T* values, const std::int64_t* rows, int d,
                                      int c, float* out, Load load) {
  __m256 o[S][W];
  for (int h = 0; h < S; ++h)
    for (int w = 0; w < W; ++w) o[h][w] = _mm256_loadu_ps(out + h * d + c + 8 * w);
  for (int j = 0; j < n; ++j) {
    bool any = false;
    for (int h = 0; h < S; ++h) any |= p[h * n + j] != 0.0f;
    if (!any) continue;
    const T* v = values + rows[j] + c;
    __m256 x[W];
    for (int w = 0; w < W; ++w) x[w] = load(v + 8 * w);
    for (int h = 0; h < S; ++h) {
      const __m256 weight = _mm256_set1_ps(p[h * n + j] * unit);
      for (int w = 0; w < W; ++w) o[h][w] = _mm256_fmadd_ps(weight, x[w], o[h][w]);
    }
  }
  for (int h = 0; h < S; ++h)
    for (int w = 0; w < W; ++w) _mm256_storeu_ps(out + h * d + c + 8 * w, o[h][w]);
}

// All d columns: 4 groups of 8 at a time while S <= 3 (2 for 4 heads), then single groups.
template <int S, typename T, typename Load>
AVX2 inline void weighted_sum_pack(const float* p, int n, float unit, const T* values, const std::int64_t* rows, int d,
                                   float* out, Load load) {
  constexpr int W = S <= 3 ? 4 : 2;
  int c = 0;
  for (; c + 8 * W <= d; c += 8 * W) weighted_sum_columns<S, W>(p, n, unit, values, rows, d, c, out, load);
  for (; c < d; c += 8) weighted_sum_columns<S, 1>(p, n, unit, values, rows, d, c, out, load);
}

// The two for a pack of 1 to 4 heads (kernels.h: kMaxHeadPack), by its run-time size.
template <typename T, typename Load>
AVX2 inline void scores_heads(int heads, const float* q, int d, float scale, float unit, const T* keys,
                              const std::int64_t* rows, int n, float* out, Load load) {
  switch (heads) {
    case 1: return scores_pack<1>(q, d, scale, unit, keys, rows, n, out, load);
    case 2: return scores_pack<2>(q, d, scale, unit, keys, rows, n, out, load);
    case 3: return scores_pack<3>(q, d, scale, unit, keys, rows, n, out, load);
    default: return scores_pack<4>(q, d, scale, unit, keys, rows, n, out, load);
  }
}

template <typename T, typename Load>
AVX2 inline void weighted_sum_heads(int heads, const float* p, int n, float unit, const T* values, const std::int64_t* rows,
                                    int d, float* out, Load load) {
  switch (heads) {
    case 1: return weighted_sum_pack<1>(p, n, unit, values, rows, d, out, load);
    case 2: return weighted_sum_pack<2>(p, n, unit, values, rows, d, out, load);
    case 3: return weighted_sum_pack<3>(p, n, unit, values, rows, d, out, load);
    default: return weighted_sum_pack<4>(p, n, unit, values, rows, d, out, load);
  }
}

}  // namespace asynct::cpu_fast
#endif
