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

// Attention's weighted sum over a cache's rows, whatever its element type: out[c] += sum_j p[j] *
// unit * row_j[c] for the columns of whole groups of 8, 32 at a time in registers while they last,
// where load(ptr) gives 8 values of a row times 1 / unit (bf16: exactly; e4m3: times 2^-8).
// Rows whose weight is 0 (the async gate's zeros) are skipped. Returns the first column left.
template <typename T, typename Load>
AVX2 inline int weighted_sum_columns(const float* p, float unit, const T* values, const std::int64_t* rows, int n, int d,
                                     float* out, Load load) {
  int c = 0;
  for (; c + 32 <= d; c += 32) {
    __m256 o0 = _mm256_loadu_ps(out + c), o1 = _mm256_loadu_ps(out + c + 8), o2 = _mm256_loadu_ps(out + c + 16),
           o3 = _mm256_loadu_ps(out + c + 24);
    for (int j = 0; j < n; ++j) {
      if (p[j] == 0.0f) continue;
      const __m256 w = _mm256_set1_ps(p[j] * unit);
      const T* v = values + rows[j] + c;
      o0 = _mm256_fmadd_ps(w, load(v), o0);
      o1 = _mm256_fmadd_ps(w, load(v + 8), o1);
      o2 = _mm256_fmadd_ps(w, load(v + 16), o2);
      o3 = _mm256_fmadd_ps(w, load(v + 24), o3);
    }
    _mm256_storeu_ps(out + c, o0), _mm256_storeu_ps(out + c + 8, o1);
    _mm256_storeu_ps(out + c + 16, o2), _mm256_storeu_ps(out + c + 24, o3);
  }
  for (; c + 8 <= d; c += 8) {
    __m256 o = _mm256_loadu_ps(out + c);
    for (int j = 0; j < n; ++j)
      if (p[j] != 0.0f) o = _mm256_fmadd_ps(_mm256_set1_ps(p[j] * unit), load(values + rows[j] + c), o);
    _mm256_storeu_ps(out + c, o);
  }
  return c;
}

}  // namespace asynct::cpu_fast
#endif
