// The production CPU runner's vector kernels over one row or one tile: bf16 weights and cache
// read as stored, float32 arithmetic. Each has an AVX2/FMA form, chosen at run time when the CPU
// has both, and a plain C++ form for every other CPU; tests check both against the reference.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace asynct::cpu_fast {

// Whether the AVX2/FMA forms run: the CPU has AVX2 and FMA, and use_generic_kernels(true) was
// not called.
bool vector_kernels();
// Makes every kernel take its plain C++ form (true) or the best the CPU has (false): tests.
void use_generic_kernels(bool generic);

// Products of up to this many rows give each row the float32 result it gets alone, whatever rows
// are beside it (every weight format takes one row's path for each): a decode batch of up to 11
// sequences, or the verification of up to 10 drafts at batch 1 (speculative decoding), yields the
// tokens the rows would alone [C6]. More rows take the prefill forms (packed panels, converted
// tiles), whose sums are ordered otherwise.
inline constexpr int kBatchInvariantRows = 11;

// y[r * ldy + o] = sum_i x[r * ldx + i] * w[o * in + i] for r < rows, o < nw: a tile of x W^T
// with W bf16 [nw, in] (PyTorch's layout).
void gemm_bf16(const float* x, std::int64_t ldx, int rows, const std::uint16_t* w, int nw, int in, float* y,
               std::int64_t ldy);

// The same tile with W float32 [nw, in] (weights converted from another format).
void gemm_f32(const float* x, std::int64_t ldx, int rows, const float* w, int nw, int in, float* y, std::int64_t ldy);

// The same tile for weights held in another format (FP8, int8) and more than decode rows: W's
// rows converted to float32 4 at a time (convert(o, out) writes row o < nw as `in` floats), each
// group shared by every row of x (gemm_f32).
template <typename Convert>
void gemm_converted(const float* x, std::int64_t ldx, int rows, int nw, int in, const Convert& convert, float* y,
                    std::int64_t ldy) {
  thread_local std::vector<float> tile;
  tile.resize(std::size_t(4) * std::size_t(in));
  for (int o = 0; o < nw; o += 4) {
    const int n = std::min(4, nw - o);
    for (int i = 0; i < n; ++i) convert(o + i, tile.data() + std::size_t(i) * std::size_t(in));
    gemm_f32(x, ldx, rows, tile.data(), n, in, y + o, ldy);
  }
}

// The same tile with W e4m3 (fp8_kernels.cpp): rows [first, first + nw) of a matrix whose row r
// starts at w + r * in, weight (r, k) its value times scales[(r / block_rows) * scale_cols + k /
// block_cols] (scale_cols = ceil(in / block_cols)); `w` points at row `first`.
void gemm_fp8(const float* x, std::int64_t ldx, int rows, const std::uint8_t* w, const float* scales, int block_rows,
              int block_cols, int first, int nw, int in, float* y, std::int64_t ldy);

// 8-bit integer weights (int8_kernels.cpp; --quantization int8): each row in blocks of
// kInt8Block inputs, a block's values int8 in [-127, 127] times its scale (its largest magnitude
// / 127, rounded to fp16), the last block padded with zeros: llama.cpp's Q8_0, 34 bytes a block.
// A row is one run of bytes, its fp16 scales then its values: a decode product reads the
// weights as one stream (with the scales apart, their loads stalled it), and nothing pads it
// (float scales padded to 32 bytes took 10% more bytes a SmolLM2 row [C16]).
inline constexpr int kInt8Block = 32;
struct Int8Matrix {
  int rows = 0, in = 0, blocks = 0;  // blocks = ceil(in / kInt8Block)
  std::size_t row_bytes = 0;         // blocks * (2 + kInt8Block)
  std::vector<std::uint8_t> data;    // [rows, row_bytes]
  const std::uint16_t* row_scales(int r) const { return reinterpret_cast<const std::uint16_t*>(data.data() + std::size_t(r) * row_bytes); }
  const std::int8_t* row(int r) const { return reinterpret_cast<const std::int8_t*>(row_scales(r) + blocks); }
  std::uint16_t* row_scales(int r) { return reinterpret_cast<std::uint16_t*>(data.data() + std::size_t(r) * row_bytes); }
  std::int8_t* row(int r) { return reinterpret_cast<std::int8_t*>(row_scales(r) + blocks); }
  float scale(int r, int block) const;  // block's scale as a float
};
// A bf16 matrix [rows, in] quantized (round to nearest).
Int8Matrix quantize_int8(const std::uint16_t* bf16, int rows, int in);
// Rows of x quantized the same way, for the integer products.
struct Int8Rows {
  int blocks = 0;
  std::vector<std::int8_t> values;  // [rows, blocks * kInt8Block]
  std::vector<float> scales;        // [rows, blocks], then 8 spare (read by the vector product, unused)
  const std::int8_t* row(int r) const { return values.data() + std::size_t(r) * std::size_t(blocks) * kInt8Block; }
  const float* row_scales(int r) const { return scales.data() + std::size_t(r) * std::size_t(blocks); }
};
void quantize_rows_int8(const float* x, std::int64_t ldx, int rows, int in, Int8Rows& out);
// Rows [first, first + nw) of W times x's rows, into y's first nw columns: with xq (x's rows
// quantized; decode) in integers, each block's sum times both scales; without, x in float32
// against W's values times their scales.
void gemm_int8(const Int8Rows* xq, const float* x, std::int64_t ldx, int rows, const Int8Matrix& w, int first, int nw,
               float* y, std::int64_t ldy);

// An e4m3 cache's reads (fp8_kernels.cpp): scores_bf16 and weighted_sum_bf16 over e4m3 rows, each
// value as stored (the caller applies its scale: into `scale`, and to the weighted sum's result).
void scores_fp8(const float* q, int heads, const std::uint8_t* keys, const std::int64_t* rows, int n, int d, float scale,
                float* out);
void weighted_sum_fp8(const float* p, int heads, const std::uint8_t* values, const std::int64_t* rows, int n, int d,
                      float* out);
// out[i] = e4m3(in[i] / scale), rounded to nearest even, saturating at +-448.
void float_to_fp8_row(const float* in, float scale, std::uint8_t* out, int n);

// sum_i a[i] * b[i], b bf16.
float dot_bf16(const float* a, const std::uint16_t* b, int n);
// out[i] += weight * v[i], v bf16.
void axpy_bf16(float* out, float weight, const std::uint16_t* v, int n);

// The most query heads of one KV head that attention reads the KV head's rows for at once.
constexpr int kMaxHeadPack = 4;
// In steps of up to kBatchInvariantRows rows, attention splits a row's keys into chunks of this
// many, a task each (attention.cpp).
constexpr int kKeyChunk = 256;
// out[h * n + j] = scale * sum_i q[h * d + i] * keys[rows[j] + i] for j < n and h < heads (1 to
// kMaxHeadPack): the scores of a pack of query heads (their rows d apart) against n bf16 key
// rows (a paged cache's rows, by their offsets from `keys`), each key row read once for the pack.
void scores_bf16(const float* q, int heads, const std::uint16_t* keys, const std::int64_t* rows, int n, int d, float scale,
                 float* out);
// out[h * d + i] += sum_j p[h * n + j] * values[rows[j] + i] for i < d and h < heads: the pack's
// weighted sums of n bf16 value rows, each read once for the pack.
void weighted_sum_bf16(const float* p, int heads, const std::uint16_t* values, const std::int64_t* rows, int n, int d,
                       float* out);

// y = w * clamp(x / sqrt(mean(x^2) + eps), -clip, clip); clip may be infinite (RMSNorm).
void norm_row(const float* x, int n, const float* w, float eps, float clip, float* y);

// x[i] = exp(x[i] - shift); returns the sum of the new values.
float exp_shifted(float* x, int n, float shift);

// out[i] = silu(gate[i]) * up[i].
void swiglu_row(const float* gate, const float* up, int n, float* out);

// x[i] += y[i].
void add_row(float* x, const float* y, int n);

// Conversions: bf16 to float exactly; float to bf16 rounding to nearest even.
void bf16_to_float_row(const std::uint16_t* in, float* out, int n);
void float_to_bf16_row(const float* in, std::uint16_t* out, int n);

}  // namespace asynct::cpu_fast
