// The production CPU runner's 8-bit integer products (kernels.h: Int8Matrix, gemm_int8): weights
// in blocks of 32 inputs, each block int8 values times one float scale (llama.cpp's Q8_0 layout,
// a row at a time). Decode rows are quantized the same way and multiplied in integers (32
// products in a few instructions, exact), each block's sum scaled once; more rows convert 4
// weight rows at a time to float32 and share them (gemm_f32).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "models/cpu_fast/kernels.h"
#include "models/cpu_fast/x86_target.h"

namespace asynct::cpu_fast {
namespace {

// One block of n <= kInt8Block values (the rest of the block zero): values and their scale.
float quantize_block(const float* x, int n, std::int8_t* q) {
  float largest = 0.0f;
  for (int k = 0; k < n; ++k) largest = std::max(largest, std::fabs(x[k]));
  const float scale = largest > 0.0f ? largest / 127.0f : 1.0f;
  for (int k = 0; k < n; ++k) q[k] = std::int8_t(std::lround(x[k] / scale));
  std::fill(q + n, q + kInt8Block, std::int8_t(0));
  return scale;
}

float dot_generic(const std::int8_t* w, const float* w_scales, const std::int8_t* x, const float* x_scales, int blocks) {
  float sum = 0.0f;
  for (int b = 0; b < blocks; ++b) {
    std::int32_t block = 0;
    for (int k = 0; k < kInt8Block; ++k) block += std::int32_t(w[b * kInt8Block + k]) * x[b * kInt8Block + k];
    sum += float(block) * (w_scales[b] * x_scales[b]);
  }
  return sum;
}

void row_to_float_generic(const std::int8_t* w, const float* scales, int in, float* out) {
  for (int k = 0; k < in; ++k) out[k] = float(w[k]) * scales[k / kInt8Block];
}

#ifdef ASYNCT_X86
// A block's 32 products as 8 lanes of int32 sums, converted to float: |w| (unsigned) times x with
// w's sign (the values are in [-127, 127], so no pair of products saturates 16 bits).
AVX2 inline __m256 block_products(const std::int8_t* w, const std::int8_t* x) {
  const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

AVX2 float dot_avx2(const std::int8_t* w, const float* w_scales, const std::int8_t* x, const float* x_scales, int blocks) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int b = 0;
  for (; b + 2 <= blocks; b += 2) {
    a0 = _mm256_fmadd_ps(block_products(w + b * kInt8Block, x + b * kInt8Block), _mm256_set1_ps(w_scales[b] * x_scales[b]), a0);
    a1 = _mm256_fmadd_ps(block_products(w + (b + 1) * kInt8Block, x + (b + 1) * kInt8Block),
                         _mm256_set1_ps(w_scales[b + 1] * x_scales[b + 1]), a1);
  }
  if (b < blocks)
    a0 = _mm256_fmadd_ps(block_products(w + b * kInt8Block, x + b * kInt8Block), _mm256_set1_ps(w_scales[b] * x_scales[b]), a0);
  const __m256 a = _mm256_add_ps(a0, a1);
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

AVX2 void row_to_float_avx2(const std::int8_t* w, const float* scales, int in, float* out) {
  int k = 0;
  for (; k + 8 <= in; k += 8) {
    const __m256i wide = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + k)));
    _mm256_storeu_ps(out + k, _mm256_mul_ps(_mm256_cvtepi32_ps(wide), _mm256_set1_ps(scales[k / kInt8Block])));
  }
  for (; k < in; ++k) out[k] = float(w[k]) * scales[k / kInt8Block];
}
#endif

}  // namespace

Int8Matrix quantize_int8(const std::uint16_t* bf16, int rows, int in) {
  Int8Matrix m;
  m.rows = rows;
  m.in = in;
  m.blocks = (in + kInt8Block - 1) / kInt8Block;
  m.values.resize(std::size_t(rows) * std::size_t(m.blocks) * kInt8Block);
  m.scales.resize(std::size_t(rows) * std::size_t(m.blocks));
  std::vector<float> row(static_cast<std::size_t>(in));
  for (int r = 0; r < rows; ++r) {
    bf16_to_float_row(bf16 + std::int64_t(r) * in, row.data(), in);
    for (int b = 0; b < m.blocks; ++b)
      m.scales[std::size_t(r) * std::size_t(m.blocks) + std::size_t(b)] =
          quantize_block(row.data() + b * kInt8Block, std::min(kInt8Block, in - b * kInt8Block),
                         m.values.data() + (std::size_t(r) * std::size_t(m.blocks) + std::size_t(b)) * kInt8Block);
  }
  return m;
}

void quantize_rows_int8(const float* x, std::int64_t ldx, int rows, int in, Int8Rows& out) {
  out.blocks = (in + kInt8Block - 1) / kInt8Block;
  out.values.resize(std::size_t(rows) * std::size_t(out.blocks) * kInt8Block);
  out.scales.resize(std::size_t(rows) * std::size_t(out.blocks));
  for (int r = 0; r < rows; ++r)
    for (int b = 0; b < out.blocks; ++b)
      out.scales[std::size_t(r) * std::size_t(out.blocks) + std::size_t(b)] =
          quantize_block(x + r * ldx + b * kInt8Block, std::min(kInt8Block, in - b * kInt8Block),
                         out.values.data() + (std::size_t(r) * std::size_t(out.blocks) + std::size_t(b)) * kInt8Block);
}

void gemm_int8(const Int8Rows* xq, const float* x, std::int64_t ldx, int rows, const Int8Matrix& w, int first, int nw,
               float* y, std::int64_t ldy) {
#ifdef ASYNCT_X86
  const bool vector = vector_kernels();
#else
  const bool vector = false;
#endif
  if (xq) {  // decode rows, quantized: each weight row read once, straight from memory
    for (int o = 0; o < nw; ++o) {
      const std::int8_t* row = w.row(first + o);
      const float* ws = w.row_scales(first + o);
      for (int r = 0; r < rows; ++r) {
        const std::int8_t* xr = xq->values.data() + std::size_t(r) * std::size_t(xq->blocks) * kInt8Block;
        const float* xs = xq->scales.data() + std::size_t(r) * std::size_t(xq->blocks);
#ifdef ASYNCT_X86
        if (vector) {
          y[r * ldy + o] = dot_avx2(row, ws, xr, xs, w.blocks);
          continue;
        }
#endif
        y[r * ldy + o] = dot_generic(row, ws, xr, xs, w.blocks);
      }
    }
    return;
  }
  // More rows: 4 weight rows at a time as float32, shared by every row of x.
  thread_local std::vector<float> tile;
  tile.resize(std::size_t(4) * std::size_t(w.in));
  for (int o = 0; o < nw; o += 4) {
    const int n = std::min(4, nw - o);
    for (int i = 0; i < n; ++i) {
      float* out = tile.data() + std::size_t(i) * std::size_t(w.in);
#ifdef ASYNCT_X86
      if (vector) {
        row_to_float_avx2(w.row(first + o + i), w.row_scales(first + o + i), w.in, out);
        continue;
      }
#endif
      row_to_float_generic(w.row(first + o + i), w.row_scales(first + o + i), w.in, out);
    }
    gemm_f32(x, ldx, rows, tile.data(), n, w.in, y + o, ldy);
  }
}

}  // namespace asynct::cpu_fast
