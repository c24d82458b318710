// The production CPU runner's FP8 kernels (kernels.h): products on e4m3 weights (gemm_fp8) and
// attention's reads of an e4m3 cache (scores_fp8, weighted_sum_fp8): values read as stored,
// times their scales, float32 arithmetic. Decode rows take each weight row once,
// straight from memory, its blocks' dot products scaled once each; more rows convert 4 weight
// rows at a time to float32 and share them (kernels.h: gemm_converted).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/fp8.h"
#include "models/cpu_fast/kernels.h"
#include "models/cpu_fast/x86_target.h"

namespace asynct::cpu_fast {
namespace {

// Weight row r's scales.
const float* scale_row(const float* scales, int block_rows, int block_cols, int in, int r) {
  const int scale_cols = (in + block_cols - 1) / block_cols;
  return scales + std::int64_t(r / block_rows) * scale_cols;
}

void row_to_float_generic(const std::uint8_t* w, const float* scales, int block_cols, int in, float* out) {
  for (int k = 0; k < in; ++k) out[k] = fp8_e4m3_to_float(w[k]) * scales[k / block_cols];
}

float dot_generic(const float* x, const std::uint8_t* w, const float* scales, int block_cols, int in) {
  float sum = 0.0f;
  for (int k = 0; k < in; ++k) sum += x[k] * (fp8_e4m3_to_float(w[k]) * scales[k / block_cols]);
  return sum;
}

#ifdef ASYNCT_X86
// e4m3 is half precision with 3 of its 5 exponent bits and 3 of its 10 mantissa bits: the bits
// s eeee mmm placed at half's 15, 13..10 and 9..7 make a half of the value times 2^-8, exactly,
// subnormals included (half's own subnormals hold them). So 16 values are a sign extension, a
// shift and a mask, then F16C's exact conversion; the 2^8 goes into the block's scale.
constexpr float kHalfBias = 256.0f;

AVX2 inline void load_fp8x16(const std::uint8_t* p, __m256& lo, __m256& hi) {
  const __m256i wide = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i half = _mm256_and_si256(_mm256_slli_epi16(wide, 7), _mm256_set1_epi16(std::int16_t(0xBF80)));
  lo = _mm256_cvtph_ps(_mm256_castsi256_si128(half));
  hi = _mm256_cvtph_ps(_mm256_extracti128_si256(half, 1));
}

AVX2 void row_to_float_avx2(const std::uint8_t* w, const float* scales, int block_cols, int in, float* out) {
  for (int k0 = 0; k0 < in; k0 += block_cols) {
    const int k1 = std::min(in, k0 + block_cols);
    const float s = scales[k0 / block_cols];
    const __m256 scale = _mm256_set1_ps(s * kHalfBias);
    int k = k0;
    for (; k + 16 <= k1; k += 16) {
      __m256 lo, hi;
      load_fp8x16(w + k, lo, hi);
      _mm256_storeu_ps(out + k, _mm256_mul_ps(lo, scale));
      _mm256_storeu_ps(out + k + 8, _mm256_mul_ps(hi, scale));
    }
    for (; k < k1; ++k) out[k] = fp8_e4m3_to_float(w[k]) * s;
  }
}

// R rows of x (ldx apart) against one e4m3 weight row: each row's block dot products in two
// accumulators, added into its total times the block's scale; the rows share each conversion.
// A row's sums are the same for any R, so a product gives a row the result it gets alone [C6].
template <int R>
AVX2 void dot_rows_avx2(const float* x, std::int64_t ldx, const std::uint8_t* w, const float* scales, int block_cols, int in,
                        float* out, std::int64_t ldy) {
  __m256 total[R];
  float tail[R];
  for (int r = 0; r < R; ++r) total[r] = _mm256_setzero_ps(), tail[r] = 0.0f;
  for (int k0 = 0; k0 < in; k0 += block_cols) {
    const int k1 = std::min(in, k0 + block_cols);
    __m256 a[R][2];
    for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = _mm256_setzero_ps();
    int k = k0;
    for (; k + 16 <= k1; k += 16) {
      __m256 lo, hi;
      load_fp8x16(w + k, lo, hi);
      for (int r = 0; r < R; ++r) {
        a[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * ldx + k), lo, a[r][0]);
        a[r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * ldx + k + 8), hi, a[r][1]);
      }
    }
    const float s = scales[k0 / block_cols];
    for (int r = 0; r < R; ++r) {
      total[r] = _mm256_fmadd_ps(_mm256_add_ps(a[r][0], a[r][1]), _mm256_set1_ps(s * kHalfBias), total[r]);
      for (int t = k; t < k1; ++t) tail[r] += x[r * ldx + t] * (fp8_e4m3_to_float(w[t]) * s);
    }
  }
  for (int r = 0; r < R; ++r) out[r * ldy] = hsum(total[r]) + tail[r];
}

// Rows of x against one weight row, 4 at a time.
AVX2 void dot_rows_avx2(const float* x, std::int64_t ldx, int rows, const std::uint8_t* w, const float* scales, int block_cols,
                        int in, float* out, std::int64_t ldy) {
  int r = 0;
  for (; r + 4 <= rows; r += 4) dot_rows_avx2<4>(x + r * ldx, ldx, w, scales, block_cols, in, out + r * ldy, ldy);
  switch (rows - r) {
    case 3: return dot_rows_avx2<3>(x + r * ldx, ldx, w, scales, block_cols, in, out + r * ldy, ldy);
    case 2: return dot_rows_avx2<2>(x + r * ldx, ldx, w, scales, block_cols, in, out + r * ldy, ldy);
    case 1: return dot_rows_avx2<1>(x + r * ldx, ldx, w, scales, block_cols, in, out + r * ldy, ldy);
    default: return;
  }
}

// 8 values: e4m3 bytes to the halves of their values times 2^-8 (load_fp8x16), then floats.
AVX2 inline __m256 load_fp8x8(const std::uint8_t* p) {
  const __m128i wide = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(wide, 7), _mm_set1_epi16(std::int16_t(0xBF80))));
}

struct Fp8Loads {
  AVX2 __m256 operator()(const std::uint8_t* p) const { return load_fp8x8(p); }
};
#endif

void scores_generic(const float* q, int heads, const std::uint8_t* keys, const std::int64_t* rows, int n, int d,
                    float scale, float* out) {
  for (int h = 0; h < heads; ++h)
    for (int j = 0; j < n; ++j) {
      float sum = 0.0f;
      for (int i = 0; i < d; ++i) sum += q[h * d + i] * fp8_e4m3_to_float(keys[rows[j] + i]);
      out[h * n + j] = scale * sum;
    }
}

void weighted_sum_generic(const float* p, int heads, const std::uint8_t* values, const std::int64_t* rows, int n, int d,
                          float* out) {
  for (int h = 0; h < heads; ++h)
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < d; ++i) out[h * d + i] += p[h * n + j] * fp8_e4m3_to_float(values[rows[j] + i]);
}

}  // namespace

void scores_fp8(const float* q, int heads, const std::uint8_t* keys, const std::int64_t* rows, int n, int d, float scale,
                float* out) {
  check(heads >= 1 && heads <= kMaxHeadPack, "scores_fp8: a pack of ", heads, " heads");
#ifdef ASYNCT_X86
  if (vector_kernels() && d % 8 == 0) return scores_heads(heads, q, d, scale, kHalfBias, keys, rows, n, out, Fp8Loads{});
#endif
  scores_generic(q, heads, keys, rows, n, d, scale, out);
}

void weighted_sum_fp8(const float* p, int heads, const std::uint8_t* values, const std::int64_t* rows, int n, int d,
                      float* out) {
  check(heads >= 1 && heads <= kMaxHeadPack, "weighted_sum_fp8: a pack of ", heads, " heads");
#ifdef ASYNCT_X86
  if (vector_kernels() && d % 8 == 0) return weighted_sum_heads(heads, p, n, kHalfBias, values, rows, d, out, Fp8Loads{});
#endif
  weighted_sum_generic(p, heads, values, rows, n, d, out);
}

void float_to_fp8_row(const float* in, float scale, std::uint8_t* out, int n) {
  for (int i = 0; i < n; ++i) out[i] = float_to_fp8_e4m3(in[i] / scale);  // as the reference rounds (kv_cache_format.h)
}

void gemm_fp8(const float* x, std::int64_t ldx, int rows, const std::uint8_t* w, const float* scales, int block_rows,
              int block_cols, int first, int nw, int in, float* y, std::int64_t ldy) {
#ifdef ASYNCT_X86
  const bool vector = vector_kernels();
#else
  const bool vector = false;
#endif
  if (rows <= kBatchInvariantRows) {  // decode rows: each weight row read once, straight from memory
    for (int o = 0; o < nw; ++o) {
      const std::uint8_t* row = w + std::int64_t(o) * in;
      const float* s = scale_row(scales, block_rows, block_cols, in, first + o);
#ifdef ASYNCT_X86
      if (vector) {
        dot_rows_avx2(x, ldx, rows, row, s, block_cols, in, y + o, ldy);
        continue;
      }
#endif
      for (int r = 0; r < rows; ++r) y[r * ldy + o] = dot_generic(x + r * ldx, row, s, block_cols, in);
    }
    return;
  }
  gemm_converted(x, ldx, rows, nw, in, [&](int o, float* out) {
    const std::uint8_t* row = w + std::int64_t(o) * in;
    const float* s = scale_row(scales, block_rows, block_cols, in, first + o);
#ifdef ASYNCT_X86
    if (vector) return row_to_float_avx2(row, s, block_cols, in, out);
#endif
    row_to_float_generic(row, s, block_cols, in, out);
  }, y, ldy);
}

}  // namespace asynct::cpu_fast
