// The production CPU runner's 8-bit integer products (kernels.h: Int8Matrix, gemm_int8): weights
// in blocks of 32 inputs, each block int8 values times one fp16 scale (llama.cpp's Q8_0, a row's
// scales ahead of its values). Decode rows are quantized the same way (with float scales) and
// multiplied in integers (32 products in a few instructions, exact), each block's sum scaled
// once; more rows convert 4 weight rows at a time to float32 and share them (kernels.h:
// gemm_converted).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "models/cpu_fast/kernels.h"
#include "models/cpu_fast/x86_target.h"

namespace asynct::cpu_fast {
namespace {

// The scale of a block whose largest magnitude is `largest`: largest / 127, rounded to fp16 for
// weights (within fp16's range, never zero), as is for decode rows; 1 for an all-zero block.
float block_scale(float largest, bool fp16) {
  if (!(largest > 0.0f)) return 1.0f;
  const float scale = largest / 127.0f;
  if (!fp16) return scale;
  const float rounded = f16_to_float(float_to_f16(std::min(scale, 65504.0f)));
  return rounded > 0.0f ? rounded : f16_to_float(1);  // 2^-24, fp16's smallest
}

// One block of n <= kInt8Block values (the rest of the block zero): values and their scale,
// each value x / scale rounded to nearest, halves to even (as the vector form's conversion does),
// within [-127, 127] (a scale rounded down may put a value a hair past 127).
float quantize_block_generic(const float* x, int n, std::int8_t* q, bool fp16) {
  float largest = 0.0f;
  for (int k = 0; k < n; ++k) largest = std::max(largest, std::fabs(x[k]));
  const float scale = block_scale(largest, fp16);
  for (int k = 0; k < n; ++k) q[k] = std::int8_t(std::clamp(std::nearbyint(x[k] / scale), -127.0f, 127.0f));
  std::fill(q + n, q + kInt8Block, std::int8_t(0));
  return scale;
}

float dot_generic(const std::int8_t* w, const std::uint16_t* w_scales, const std::int8_t* x, const float* x_scales,
                  int blocks) {
  float sum = 0.0f;
  for (int b = 0; b < blocks; ++b) {
    std::int32_t block = 0;
    for (int k = 0; k < kInt8Block; ++k) block += std::int32_t(w[b * kInt8Block + k]) * x[b * kInt8Block + k];
    sum += float(block) * (f16_to_float(w_scales[b]) * x_scales[b]);
  }
  return sum;
}

void row_to_float_generic(const std::int8_t* w, const std::uint16_t* scales, int in, float* out) {
  for (int k = 0; k < in; ++k) out[k] = float(w[k]) * f16_to_float(scales[k / kInt8Block]);
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

// Four accumulators: a block's products take ~15 cycles to reach the sum, so four blocks are in
// flight at once. The blocks' combined scales are formed 8 at a time (x_scales has 8 spare
// floats past its last row; w's 8 fp16 scales past its last block read into its values).
AVX2 float dot_avx2(const std::int8_t* w, const std::uint16_t* w_scales, const std::int8_t* x, const float* x_scales,
                    int blocks) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  alignas(32) float scales[8];
  for (int g = 0; g < blocks; g += 8) {
    const __m256 ws = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w_scales + g)));
    _mm256_store_ps(scales, _mm256_mul_ps(ws, _mm256_loadu_ps(x_scales + g)));
    const int n = std::min(8, blocks - g);
    const std::int8_t *wg = w + g * kInt8Block, *xg = x + g * kInt8Block;
    int u = 0;
    for (; u + 4 <= n; u += 4)
      for (int k = 0; k < 4; ++k)
        acc[k] = _mm256_fmadd_ps(block_products(wg + (u + k) * kInt8Block, xg + (u + k) * kInt8Block),
                                 _mm256_broadcast_ss(scales + u + k), acc[k]);
    for (; u < n; ++u)
      acc[u & 3] = _mm256_fmadd_ps(block_products(wg + u * kInt8Block, xg + u * kInt8Block), _mm256_broadcast_ss(scales + u),
                                   acc[u & 3]);
  }
  return hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}

// A full block of 32 values quantized as quantize_block_generic does, to the same values.
AVX2 float quantize_block_avx2(const float* x, std::int8_t* q, bool fp16) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 v[4], largest = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    largest = _mm256_max_ps(largest, _mm256_and_ps(v[i], magnitude));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(largest), _mm256_extractf128_ps(largest, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float scale = block_scale(_mm_cvtss_f32(m), fp16);
  const __m256 divisor = _mm256_set1_ps(scale);
  __m256i n[4];
  for (int i = 0; i < 4; ++i) n[i] = _mm256_cvtps_epi32(_mm256_div_ps(v[i], divisor));
  // int32 -> int16 -> int8 (saturating at 127), -128 raised to -127, then the lanes put back in
  // order (the packs work within 128-bit halves).
  const __m256i pack = _mm256_max_epi8(_mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3])),
                                       _mm256_set1_epi8(-127));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(pack, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  return scale;
}

// Rows [first, first + nw) of W against the quantized decode rows, the weight rows prefetched 4
// ahead as the bf16 product does (kernels.cpp): int8 generation +15% [C13].
AVX2 void decode_rows_avx2(const Int8Rows& xq, int rows, const Int8Matrix& w, int first, int nw, float* y, std::int64_t ldy) {
  for (int o = 0; o < nw; ++o) {
    if (o + 4 < nw) {  // the cache lines the row touches (rows are not aligned to them)
      const std::uintptr_t start = reinterpret_cast<std::uintptr_t>(w.row_scales(first + o + 4));
      for (std::uintptr_t line = start & ~std::uintptr_t(63); line < start + w.row_bytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T0);
    }
    const std::int8_t* row = w.row(first + o);
    const std::uint16_t* ws = w.row_scales(first + o);
    for (int r = 0; r < rows; ++r) y[r * ldy + o] = dot_avx2(row, ws, xq.row(r), xq.row_scales(r), w.blocks);
  }
}

AVX2 void row_to_float_avx2(const std::int8_t* w, const std::uint16_t* scales, int in, float* out) {
  int k = 0;
  for (; k + 8 <= in; k += 8) {
    const __m256i wide = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + k)));
    _mm256_storeu_ps(out + k, _mm256_mul_ps(_mm256_cvtepi32_ps(wide), _mm256_set1_ps(_cvtsh_ss(scales[k / kInt8Block]))));
  }
  for (; k < in; ++k) out[k] = float(w[k]) * f16_to_float(scales[k / kInt8Block]);
}
#endif

float quantize_block(const float* x, int n, std::int8_t* q, bool fp16) {
#ifdef ASYNCT_X86
  if (n == kInt8Block && vector_kernels()) return quantize_block_avx2(x, q, fp16);
#endif
  return quantize_block_generic(x, n, q, fp16);
}

}  // namespace

float Int8Matrix::scale(int r, int block) const { return f16_to_float(row_scales(r)[block]); }

Int8Matrix quantize_int8(const std::uint16_t* bf16, int rows, int in) {
  Int8Matrix m;
  m.rows = rows;
  m.in = in;
  m.blocks = (in + kInt8Block - 1) / kInt8Block;
  m.row_bytes = std::size_t(m.blocks) * (sizeof(std::uint16_t) + kInt8Block);
  m.data.assign(std::size_t(rows) * m.row_bytes, 0);
  std::vector<float> row(static_cast<std::size_t>(in));
  for (int r = 0; r < rows; ++r) {
    bf16_to_float_row(bf16 + std::int64_t(r) * in, row.data(), in);
    for (int b = 0; b < m.blocks; ++b) {
      const float scale = quantize_block(row.data() + b * kInt8Block, std::min(kInt8Block, in - b * kInt8Block),
                                         m.row(r) + b * kInt8Block, /*fp16=*/true);
      m.row_scales(r)[b] = float_to_f16(scale);  // exact: the scale is an fp16 value
    }
  }
  return m;
}

void quantize_rows_int8(const float* x, std::int64_t ldx, int rows, int in, Int8Rows& out) {
  out.blocks = (in + kInt8Block - 1) / kInt8Block;
  out.values.resize(std::size_t(rows) * std::size_t(out.blocks) * kInt8Block);
  out.scales.assign(std::size_t(rows) * std::size_t(out.blocks) + 8, 0.0f);
  for (int r = 0; r < rows; ++r)
    for (int b = 0; b < out.blocks; ++b) {
      const float* block = x + r * ldx + b * kInt8Block;
      std::int8_t* q = out.values.data() + (std::size_t(r) * std::size_t(out.blocks) + std::size_t(b)) * kInt8Block;
      float& scale = out.scales[std::size_t(r) * std::size_t(out.blocks) + std::size_t(b)];
      scale = quantize_block(block, std::min(kInt8Block, in - b * kInt8Block), q, /*fp16=*/false);
    }
}

void gemm_int8(const Int8Rows* xq, const float* x, std::int64_t ldx, int rows, const Int8Matrix& w, int first, int nw,
               float* y, std::int64_t ldy) {
#ifdef ASYNCT_X86
  const bool vector = vector_kernels();
#else
  const bool vector = false;
#endif
  if (xq) {  // decode rows, quantized: each weight row read once, straight from memory
#ifdef ASYNCT_X86
    if (vector) return decode_rows_avx2(*xq, rows, w, first, nw, y, ldy);
#endif
    for (int o = 0; o < nw; ++o)
      for (int r = 0; r < rows; ++r)
        y[r * ldy + o] = dot_generic(w.row(first + o), w.row_scales(first + o), xq->row(r), xq->row_scales(r), w.blocks);
    return;
  }
  gemm_converted(x, ldx, rows, nw, w.in, [&](int o, float* out) {
#ifdef ASYNCT_X86
    if (vector) return row_to_float_avx2(w.row(first + o), w.row_scales(first + o), w.in, out);
#endif
    row_to_float_generic(w.row(first + o), w.row_scales(first + o), w.in, out);
  }, y, ldy);
}

}  // namespace asynct::cpu_fast
