// GPU tests of the norms kernels against the CPU reference. Past 500 lines in one file: the row
// norms and the q/k norm share its case builders, and a second file needs a line in
// tests/CMakeLists.txt.
//
// Inputs are bf16-exact floats, so kernel and reference see the same values; the reference
// works in float64. Outputs are bf16, whose rounding alone gives a relative Frobenius error
// of ~2e-3 (up to ~4e-3 with the residual's own rounding); the bound is kTolerance = 1e-2. An fp32
// residual stream is the fp32 sum of the same values (~1e-7 from float64): kFp32Tolerance = 1e-5.
// Every output buffer is poisoned (NaN) first, so an element the kernel skips fails.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "core/fp8.h"
#include "gpu/device_buffer.h"
#include "kernels/norms/norms.h"
#include "reference/norms.h"
#include "reference/rope.h"
#include "support/compare.h"
#include "support/expect_error.h"
#include "support/fp8_cache.h"
#include "support/random.h"

namespace asynct {
namespace {

using kernels::bf16;
using testing::close_to;
using testing::DeviceBuffer;
using testing::e4m3_at;
using testing::expect_error;
using testing::Random;

constexpr double kTolerance = 1e-2;
constexpr double kFp32Tolerance = 1e-5;
constexpr float kEps = 1e-6f;
// Inputs have stddev 3 and normalised values ~N(0, 1), so a clip of 1 clips about a third of
// them: the UClip cases really exercise the clamp.
constexpr float kClip = 1.0f;
constexpr float kInputStddev = 3.0f;

NormConfig config_for(bool uclip) {
  return uclip ? NormConfig::uclip(kEps, kClip) : NormConfig::rms(kEps);
}
kernels::NormArgs device_args(const NormConfig& c) { return {c.eps, c.clip}; }

DeviceBuffer to_device(const Tensor& host) { return DeviceBuffer::upload(host, DType::BF16); }
// The residual stream in either of its types, and the bound its result is held to.
double residual_tolerance(DType type) { return type == DType::F32 ? kFp32Tolerance : kTolerance; }
const char* type_name(DType type) { return type == DType::F32 ? ", fp32 residual" : ", bf16 residual"; }

// The fused norms' entry points for a residual stream of either type.
void fused_add_norm_on_device(const kernels::LinearOutput& x, const DeviceBuffer& residual, const DeviceBuffer& w,
                              const DeviceBuffer& out, int rows, int hidden, kernels::NormArgs args) {
  if (residual.dtype() == DType::F32)
    kernels::launch_fused_add_norm(x, residual.as<float>(), w.as<bf16>(), out.as<bf16>(), rows, hidden, args, nullptr);
  else
    kernels::launch_fused_add_norm(x, residual.as<bf16>(), w.as<bf16>(), out.as<bf16>(), rows, hidden, args, nullptr);
  testing::check_launch("launch_fused_add_norm");
}
void post_attn_pre_mlp_on_device(const kernels::LinearOutput& x, const DeviceBuffer& residual,
                                 const DeviceBuffer& w_out, const DeviceBuffer& w_next, const DeviceBuffer& out,
                                 int rows, int hidden, kernels::NormArgs args) {
  if (residual.dtype() == DType::F32)
    kernels::launch_post_attn_pre_mlp(x, residual.as<float>(), w_out.as<bf16>(), w_next.as<bf16>(), out.as<bf16>(),
                                      rows, hidden, args, nullptr);
  else
    kernels::launch_post_attn_pre_mlp(x, residual.as<bf16>(), w_out.as<bf16>(), w_next.as<bf16>(), out.as<bf16>(),
                                      rows, hidden, args, nullptr);
  testing::check_launch("launch_post_attn_pre_mlp");
}

// q [T, Hq, D], k and v [T, Hkv, D] as one GEMM over the concatenated projections writes them:
// [T, (Hq + 2 Hkv) D], each token's q heads, then its k heads, then its v heads.
Tensor concat_heads(const Tensor& q, const Tensor& k, const Tensor& v) {
  const std::int64_t T = q.size(0), nq = q.numel() / T, nk = k.numel() / T;
  Tensor out = Tensor::empty(DType::F32, {T, nq + 2 * nk});
  float* o = out.data_as<float>();
  for (std::int64_t t = 0; t < T; ++t) {
    o = std::copy_n(q.data_as<float>() + t * nq, nq, o);
    o = std::copy_n(k.data_as<float>() + t * nk, nk, o);
    o = std::copy_n(v.data_as<float>() + t * nk, nk, o);
  }
  return out;
}

DeviceBuffer poisoned(const Shape& shape) {
  DeviceBuffer b(DType::BF16, shape);
  b.poison();
  return b;
}

// ---- launch_norm --------------------------------------------------------------------------

void check_norm(int rows, int hidden, bool uclip, std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "rows " << rows << ", hidden " << hidden
                                    << (uclip ? ", UClip" : ", RMS"));
  Random rng(seed);
  Tensor x = rng.normal({rows, hidden}, kInputStddev, /*bf16_exact=*/true);
  Tensor w = rng.normal({hidden}, 1.0f, true);
  const NormConfig config = config_for(uclip);
  Tensor ref = norm(x, w, config);

  DeviceBuffer dx = to_device(x), dw = to_device(w), dout = poisoned({rows, hidden});
  kernels::launch_norm(dx.as<bf16>(), dw.as<bf16>(), dout.as<bf16>(), rows, hidden,
                       device_args(config), nullptr);
  testing::check_launch("launch_norm");
  EXPECT_TRUE(close_to(dout.download_float(), ref, kTolerance));
  // The input is read-only.
  EXPECT_TRUE(close_to(dx.download_float(), x, 0.0));

  // The same norm, keeping its input as an fp32 residual stream: exactly x.
  DeviceBuffer kept(DType::F32, {rows, hidden}), dout_kept = poisoned({rows, hidden});
  kept.poison();
  kernels::launch_norm_keeping_input(dx.as<bf16>(), kept.as<float>(), dw.as<bf16>(), dout_kept.as<bf16>(), rows,
                                     hidden, device_args(config), nullptr);
  testing::check_launch("launch_norm_keeping_input");
  EXPECT_TRUE(close_to(dout_kept.download_float(), ref, kTolerance)) << "keeping input: out";
  EXPECT_TRUE(close_to(kept.download_float(), x, 0.0)) << "keeping input: residual";
}

TEST(NormKernel, SmallRowsMatchReference) {
  testing::require_gpu();
  for (int rows : {1, 3})
    for (int hidden : {8, 64, 2048})
      for (bool uclip : {true, false}) check_norm(rows, hidden, uclip, 1);
}

// Covers every launch configuration: warp per row (8, 64, 1000), block per row (2048: one
// vector per thread; 5120: four; 12288: eight) and the multi-pass path past 16384 (20000).
// 1000 rows (a many-block grid) for a subset only: the host-side tensor helpers are slow.
TEST(NormKernel, MatchesReference) {
  testing::require_gpu();
  for (int hidden : {8, 64, 1000, 2048, 5120, 12288, 20000}) {
    for (int rows : {1, 3, 17})
      for (bool uclip : {true, false}) check_norm(rows, hidden, uclip, 2);
    if (hidden <= 2048) check_norm(1000, hidden, /*uclip=*/true, 2);
  }
}

// ---- launch_fused_add_norm ----------------------------------------------------------------

void check_fused_add_norm(int rows, int hidden, bool uclip, std::uint64_t seed, DType residual_type) {
  SCOPED_TRACE(::testing::Message() << "rows " << rows << ", hidden " << hidden
                                    << (uclip ? ", UClip" : ", RMS") << type_name(residual_type));
  Random rng(seed);
  Tensor x = rng.normal({rows, hidden}, kInputStddev, true);
  Tensor residual = rng.normal({rows, hidden}, kInputStddev, true);
  Tensor w = rng.normal({hidden}, 1.0f, true);
  const NormConfig config = config_for(uclip);
  NormAndResidual ref = fused_add_norm(x, residual, w, config);

  DeviceBuffer dx = to_device(x), dres = DeviceBuffer::upload(residual, residual_type), dw = to_device(w);
  DeviceBuffer dout = poisoned({rows, hidden});
  fused_add_norm_on_device(kernels::LinearOutput::of(dx.as<bf16>()), dres, dw, dout, rows, hidden,
                           device_args(config));
  EXPECT_TRUE(close_to(dout.download_float(), ref.out, kTolerance)) << "out";
  // The in-place residual is the sum in fp32, rounded when it is bf16; the reference's is float64.
  EXPECT_TRUE(close_to(dres.download_float(), ref.residual, residual_tolerance(residual_type))) << "residual";
}

TEST(FusedAddNormKernel, SmallMatchesReference) {
  testing::require_gpu();
  for (bool uclip : {true, false}) {
    for (DType type : {DType::BF16, DType::F32}) {
      check_fused_add_norm(1, 64, uclip, 3, type);
      check_fused_add_norm(3, 2048, uclip, 3, type);
    }
  }
}

TEST(FusedAddNormKernel, MatchesReference) {
  testing::require_gpu();
  for (int hidden : {1000, 2048, 5120, 20000})
    for (int rows : {1, 3, 17})
      for (bool uclip : {true, false})
        for (DType type : {DType::BF16, DType::F32}) check_fused_add_norm(rows, hidden, uclip, 4, type);
  for (DType type : {DType::BF16, DType::F32}) check_fused_add_norm(1000, 2048, /*uclip=*/true, 4, type);
}

// ---- launch_post_attn_pre_mlp -------------------------------------------------------------

void check_post_attn_pre_mlp(int rows, int hidden, bool uclip, std::uint64_t seed, DType residual_type) {
  SCOPED_TRACE(::testing::Message() << "rows " << rows << ", hidden " << hidden
                                    << (uclip ? ", UClip" : ", RMS") << type_name(residual_type));
  Random rng(seed);
  Tensor attn_out = rng.normal({rows, hidden}, kInputStddev, true);
  Tensor residual = rng.normal({rows, hidden}, kInputStddev, true);
  Tensor w_out = rng.normal({hidden}, 1.0f, true);
  Tensor w_next = rng.normal({hidden}, 1.0f, true);
  const NormConfig config = config_for(uclip);
  NormAndResidual ref = post_attn_pre_mlp(attn_out, residual, w_out, w_next, config);

  DeviceBuffer dattn = to_device(attn_out), dres = DeviceBuffer::upload(residual, residual_type);
  DeviceBuffer dw_out = to_device(w_out), dw_next = to_device(w_next);
  DeviceBuffer dmlp_in = poisoned({rows, hidden});
  post_attn_pre_mlp_on_device(kernels::LinearOutput::of(dattn.as<bf16>()), dres, dw_out, dw_next, dmlp_in, rows,
                              hidden, device_args(config));
  EXPECT_TRUE(close_to(dmlp_in.download_float(), ref.out, kTolerance)) << "mlp_in";
  EXPECT_TRUE(close_to(dres.download_float(), ref.residual, residual_tolerance(residual_type))) << "residual";
}

TEST(PostAttnPreMlpKernel, SmallMatchesReference) {
  testing::require_gpu();
  for (bool uclip : {true, false}) {
    for (DType type : {DType::BF16, DType::F32}) {
      check_post_attn_pre_mlp(1, 64, uclip, 5, type);
      check_post_attn_pre_mlp(3, 2048, uclip, 5, type);
    }
  }
}

TEST(PostAttnPreMlpKernel, MatchesReference) {
  testing::require_gpu();
  for (int hidden : {1000, 2048, 5120, 20000})
    for (int rows : {1, 3, 17})
      for (bool uclip : {true, false})
        for (DType type : {DType::BF16, DType::F32}) check_post_attn_pre_mlp(rows, hidden, uclip, 6, type);
  for (DType type : {DType::BF16, DType::F32}) check_post_attn_pre_mlp(1000, 2048, /*uclip=*/true, 6, type);
}

// ---- x as a GEMM's split partial sums (linear_output.h) ------------------------------------

// x arrives as `splits` fp32 matrices whose sum (in split order, in fp32: what the kernel
// adds) is the x of the reference. The partials are not bf16-exact: they are what a GEMM's
// splits write. The split stride is padded past rows x hidden, as a caller's buffer may be.
struct SplitX {
  Tensor total;        // [rows, hidden] fp32, the sum the kernel should see
  DeviceBuffer parts;  // [splits, stride] fp32
  kernels::LinearOutput view;
};
SplitX split_x(Random& rng, int rows, int hidden, int splits) {
  const std::int64_t stride = std::int64_t(rows) * hidden + 8;
  Tensor parts = rng.normal({splits, stride}, kInputStddev / std::sqrt(float(splits)));
  Tensor total = Tensor::empty(DType::F32, {rows, hidden});
  std::fill_n(total.data_as<float>(), total.numel(), 0.0f);
  for (int s = 0; s < splits; ++s)
    for (std::int64_t i = 0; i < std::int64_t(rows) * hidden; ++i)
      total.data_as<float>()[i] += parts.data_as<float>()[s * stride + i];
  SplitX x{total, DeviceBuffer::upload(parts, DType::F32), {}};
  x.view = kernels::LinearOutput{nullptr, x.parts.as<float>(), splits, stride};
  return x;
}

void check_norms_from_splits(int rows, int hidden, int splits, bool uclip, std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "rows " << rows << ", hidden " << hidden << ", splits " << splits
                                    << (uclip ? ", UClip" : ", RMS"));
  Random rng(seed);
  const SplitX x = split_x(rng, rows, hidden, splits);
  Tensor residual = rng.normal({rows, hidden}, kInputStddev, true);
  Tensor w_out = rng.normal({hidden}, 1.0f, true), w_next = rng.normal({hidden}, 1.0f, true);
  const NormConfig config = config_for(uclip);
  DeviceBuffer dw_out = to_device(w_out), dw_next = to_device(w_next);
  for (DType type : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(type_name(type));
    {
      NormAndResidual ref = fused_add_norm(x.total, residual, w_next, config);
      DeviceBuffer dres = DeviceBuffer::upload(residual, type), dout = poisoned({rows, hidden});
      fused_add_norm_on_device(x.view, dres, dw_next, dout, rows, hidden, device_args(config));
      EXPECT_TRUE(close_to(dout.download_float(), ref.out, kTolerance)) << "fused_add_norm out";
      EXPECT_TRUE(close_to(dres.download_float(), ref.residual, residual_tolerance(type))) << "fused_add_norm residual";
    }
    {
      NormAndResidual ref = post_attn_pre_mlp(x.total, residual, w_out, w_next, config);
      DeviceBuffer dres = DeviceBuffer::upload(residual, type), dout = poisoned({rows, hidden});
      post_attn_pre_mlp_on_device(x.view, dres, dw_out, dw_next, dout, rows, hidden, device_args(config));
      EXPECT_TRUE(close_to(dout.download_float(), ref.out, kTolerance)) << "post_attn_pre_mlp mlp_in";
      EXPECT_TRUE(close_to(dres.download_float(), ref.residual, residual_tolerance(type)))
          << "post_attn_pre_mlp residual";
    }
  }
}

TEST(FusedNormsFromSplits, SmallMatchReference) {
  testing::require_gpu();
  check_norms_from_splits(1, 64, 1, true, 7);
  check_norms_from_splits(3, 2048, 3, false, 7);
}

// Every configuration the split reader has: warp per row (64, 256 values... up to 512), block
// per row with one (2048), two (4096) and four (5120) vectors per thread; 1..8 splits; decode
// batch sizes.
TEST(FusedNormsFromSplits, MatchReference) {
  testing::require_gpu();
  for (int hidden : {64, 512, 1000, 2048, 4096, 5120})
    for (int splits : {1, 2, 5, 8})
      for (int rows : {1, 17}) check_norms_from_splits(rows, hidden, splits, splits % 2 == 0, 8);
  check_norms_from_splits(64, 2048, 8, true, 8);
  check_norms_from_splits(32, 2048, 4, false, 8);
}

TEST(FusedNormsFromSplits, SmallBadSplitsThrow) {
  testing::require_gpu();
  const int rows = 2, hidden = 64;
  DeviceBuffer parts(DType::F32, {9, rows * hidden}), w(DType::BF16, {hidden});
  DeviceBuffer out(DType::BF16, {rows, hidden}), res(DType::BF16, {rows, hidden});
  const kernels::NormArgs args;
  auto run = [&](kernels::LinearOutput x) {
    kernels::launch_fused_add_norm(x, res.as<bf16>(), w.as<bf16>(), out.as<bf16>(), rows, hidden, args, nullptr);
  };
  const float* p = parts.as<float>();
  expect_error([&] { run({nullptr, p, 0, rows * hidden}); }, "splits");
  expect_error([&] { run({nullptr, p, 9, rows * hidden}); }, "splits");
  expect_error([&] { run({nullptr, p, 2, rows * hidden - 4}); }, "split stride");
  expect_error([&] { run({nullptr, p, 2, rows * hidden + 2}); }, "split stride");
  expect_error([&] { run({nullptr, p + 1, 2, rows * hidden}); }, "aligned");
  expect_error([&] { run(kernels::LinearOutput{}); }, "x is null");
  expect_error(
      [&] {
        kernels::launch_fused_add_norm({nullptr, p, 1, 8 * 20000}, res.as<bf16>(), w.as<bf16>(), out.as<bf16>(), 1,
                                       20000, args, nullptr);
      },
      "not supported");
}

// ---- launch_qk_norm_rope_cache_write ------------------------------------------------------

struct QkCase {
  int tokens = 17;
  int num_q_heads = 8, num_kv_heads = 2;  // GQA
  int head_dim = 128;
  bool uclip = true;
  float rope_theta = 1e6f;
  std::vector<std::int64_t> positions;
  std::vector<std::int64_t> slots;  // one per token; -1 skips the cache write
  int num_blocks = 4, block_size = 16;
  int first_token = 0;  // tokens before it are left alone
  bool qk_norm = true;  // false: RoPE alone (Llama), the weights not given
  bool fp8_cache = false;  // an e4m3 cache at per-KV-head scales (kFp8KeyScales, kFp8ValueScales)
};

// An e4m3 cache's scales, one per KV head (two heads; distinct, so a head's bytes read at another
// head's scale show): k's largest values saturate at the first, v's fit.
const std::vector<float> kFp8KeyScales = {0.02f, 0.05f}, kFp8ValueScales = {0.01f, 0.03f};

// Flat float copies (element access through Tensor::at is slow on large tensors).
struct QkResult {
  std::vector<float> q, ref_q;                // [tokens, Hq, D]
  std::vector<float> key_cache, value_cache;  // downloaded, [num_blocks, block_size, Hkv, D]
  std::vector<float> ref_k, v;                // [tokens, Hkv, D]
  std::vector<float> k;                       // k after the kernel (rewritten in place)
  std::vector<float> v_out;                   // fused input only: the dense copy of v
};

// The fused input as `splits` fp32 partial sums: split 0 holds x - (a_1 + ... ), the others small
// multiples of 1/16 (a_s), so that the sum in split order is x exactly (x is bf16-exact and
// every partial sum fits fp32's 24 bits): the result must match the dense input's, and v,
// copied, must come out exact. The split stride is padded past the product.
DeviceBuffer fused_splits(const Tensor& fused, int splits, Random& rng, std::int64_t& stride) {
  const std::int64_t n = fused.numel();
  stride = n + 4;
  Tensor parts = Tensor::empty(DType::F32, {splits, stride});
  float* p = parts.data_as<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    float rest = fused.data_as<float>()[i];
    for (int s = 1; s < splits; ++s) {
      const float a = float(rng.integer(-64, 64)) / 16.0f;
      p[s * stride + i] = a;
      rest -= a;
    }
    p[i] = rest;
  }
  for (int s = 0; s < splits; ++s) std::fill_n(p + s * stride + n, stride - n, 0.0f);
  return DeviceBuffer::upload(parts, DType::F32);
}

// with_cache false: the kernel gets no cache and must only rewrite q and k. fused: q, k and v
// go in as one [T, (Hq + 2 Hkv) D] buffer and q, k, v_out start poisoned; splits > 0: that
// buffer as split partial sums.
QkResult run_qk(const QkCase& c, std::uint64_t seed, bool with_cache = true, bool fused = false, int splits = 0) {
  Random rng(seed);
  const int T = c.tokens, Hq = c.num_q_heads, Hkv = c.num_kv_heads, D = c.head_dim;
  Tensor q = rng.normal({T, Hq, D}, kInputStddev, true);
  Tensor k = rng.normal({T, Hkv, D}, kInputStddev, true);
  Tensor v = rng.normal({T, Hkv, D}, 1.0f, true);
  Tensor q_weight = rng.normal({D}, 1.0f, true);
  Tensor k_weight = rng.normal({D}, 1.0f, true);
  const NormConfig config = config_for(c.uclip);

  Tensor ref_key_cache = Tensor::empty(DType::F32, {c.num_blocks, c.block_size, Hkv, D});
  Tensor ref_value_cache = Tensor::empty(DType::F32, ref_key_cache.shape());
  QkNormRopeOutput ref =
      c.qk_norm ? qk_norm_rope_cache_write(q, k, v, q_weight, k_weight, config, c.positions, c.rope_theta,
                                           ref_key_cache, ref_value_cache, c.slots)
                : rope_cache_write(q, k, v, c.positions, c.rope_theta, ref_key_cache, ref_value_cache, c.slots);

  DeviceBuffer dq = to_device(q), dk = to_device(k), dv = to_device(v);
  DeviceBuffer dqkv = fused && splits == 0 ? to_device(concat_heads(q, k, v)) : DeviceBuffer(DType::BF16, {1});
  std::int64_t split_stride = 0;
  DeviceBuffer dparts = splits > 0 ? fused_splits(concat_heads(q, k, v), splits, rng, split_stride)
                                   : DeviceBuffer(DType::F32, {1});
  if (fused) {
    dq.poison();
    dk.poison();
    dv.poison();
  }
  DeviceBuffer dqw = to_device(q_weight), dkw = to_device(k_weight);
  DeviceBuffer dpos = DeviceBuffer::upload(Tensor::from_vector(c.positions, {T}), DType::I64);
  DeviceBuffer dslots = DeviceBuffer::upload(Tensor::from_vector(c.slots, {T}), DType::I64);
  DeviceBuffer dkc = poisoned(ref_key_cache.shape()), dvc = poisoned(ref_key_cache.shape());
  if (c.fp8_cache) {  // 0xFF, e4m3's NaN, until written
    dkc = DeviceBuffer(DType::U8, ref_key_cache.shape());
    dvc = DeviceBuffer(DType::U8, ref_key_cache.shape());
    dkc.poison();
    dvc.poison();
  }
  DeviceBuffer dks = DeviceBuffer::upload(Tensor::from_vector(kFp8KeyScales, {2}), DType::F32);
  DeviceBuffer dvs = DeviceBuffer::upload(Tensor::from_vector(kFp8ValueScales, {2}), DType::F32);

  kernels::QkNormRopeArgs args;
  args.q = dq.as<bf16>();
  args.k = dk.as<bf16>();
  args.v = fused ? nullptr : dv.as<bf16>();
  if (fused)
    args.qkv = splits > 0 ? kernels::LinearOutput{nullptr, dparts.as<float>(), splits, split_stride}
                          : kernels::LinearOutput::of(dqkv.as<bf16>());
  args.v_out = fused ? dv.as<bf16>() : nullptr;
  args.qk_norm = c.qk_norm;
  args.q_weight = c.qk_norm ? dqw.as<bf16>() : nullptr;
  args.k_weight = c.qk_norm ? dkw.as<bf16>() : nullptr;
  args.positions = dpos.as<std::int64_t>();
  args.slot_mapping = dslots.as<std::int64_t>();
  args.key_cache = with_cache ? dkc.as<bf16>() : nullptr;
  args.value_cache = with_cache ? dvc.as<bf16>() : nullptr;
  if (c.fp8_cache) {
    args.kv_element = kernels::KvElement::Fp8E4M3;
    args.key_scales = dks.as<float>();
    args.value_scales = dvs.as<float>();
  }
  args.tokens = T;
  args.first_token = c.first_token;
  args.num_q_heads = Hq;
  args.num_kv_heads = Hkv;
  args.head_dim = D;
  args.rope_theta = c.rope_theta;
  args.norm = device_args(config);
  kernels::launch_qk_norm_rope_cache_write(args, nullptr);
  testing::check_launch("launch_qk_norm_rope_cache_write");

  // An e4m3 cache read back as what its bytes hold, times the KV head's scale.
  const auto cache_values = [&](const DeviceBuffer& cache, const std::vector<float>& scales) {
    if (!c.fp8_cache) return cache.download_float().to_float_vector();
    const Tensor bytes = cache.download();
    std::vector<float> out(std::size_t(bytes.numel()));
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] = fp8_e4m3_to_float(bytes.data_as<std::uint8_t>()[i]) * scales[i / std::size_t(D) % scales.size()];
    return out;
  };
  return {dq.download_float().to_float_vector(), ref.q.to_float_vector(),
          cache_values(dkc, kFp8KeyScales), cache_values(dvc, kFp8ValueScales),
          ref.k.to_float_vector(), v.to_float_vector(), dk.download_float().to_float_vector(),
          fused ? dv.download_float().to_float_vector() : std::vector<float>{}};
}

// Shuffled distinct slots out of num_blocks * block_size, with token `skipped` set to -1.
std::vector<std::int64_t> shuffled_slots(Random& rng, const QkCase& c, int skipped) {
  std::vector<int> perm = rng.permutation(c.num_blocks * c.block_size);
  std::vector<std::int64_t> slots(perm.begin(), perm.begin() + c.tokens);
  slots[std::size_t(skipped)] = -1;
  return slots;
}

// q against the reference; the cache rows of written slots against rope(norm(k)) and v (v is
// copied, so exactly); every other cache row still the NaN poison. With the fused input, the
// dense v of the written tokens too.
void check_qk(const QkCase& c, std::uint64_t seed, bool fused = false, int splits = 0) {
  SCOPED_TRACE(::testing::Message() << "tokens " << c.tokens << ", head_dim " << c.head_dim
                                    << (c.qk_norm ? (c.uclip ? ", UClip" : ", RMS") : ", no norm")
                                    << (fused ? ", fused qkv" : "") << ", splits " << splits << ", heads "
                                    << c.num_q_heads << "/" << c.num_kv_heads);
  QkResult r = run_qk(c, seed, /*with_cache=*/true, fused, splits);
  EXPECT_TRUE(close_to(r.q, r.ref_q, kTolerance)) << "q";

  const std::int64_t row = std::int64_t(c.num_kv_heads) * c.head_dim;  // one slot
  const std::int64_t slots = std::int64_t(c.num_blocks) * c.block_size;
  std::vector<int> token_of_slot(std::size_t(slots), -1);
  for (int t = 0; t < c.tokens; ++t)
    if (c.slots[std::size_t(t)] >= 0) token_of_slot[std::size_t(c.slots[std::size_t(t)])] = t;

  std::vector<float> k_out, k_ref, v_out, v_ref;
  std::int64_t untouched_written = 0;
  for (std::int64_t s = 0; s < slots; ++s) {
    const int t = token_of_slot[std::size_t(s)];
    for (std::int64_t i = 0; i < row; ++i) {
      const float kc = r.key_cache[std::size_t(s * row + i)];
      const float vc = r.value_cache[std::size_t(s * row + i)];
      if (t < 0) {
        untouched_written += !std::isnan(kc) + !std::isnan(vc);
        continue;
      }
      k_out.push_back(kc);
      v_out.push_back(vc);
      const float k = r.ref_k[std::size_t(t * row + i)], v = r.v[std::size_t(t * row + i)];
      if (c.fp8_cache) {  // as e4m3 stores them at the head's scales (k from its float value)
        const std::size_t head = std::size_t(i / c.head_dim);
        k_ref.push_back(e4m3_at(k, kFp8KeyScales[head]));
        v_ref.push_back(e4m3_at(v, kFp8ValueScales[head]));
      } else {
        k_ref.push_back(k);
        v_ref.push_back(v);
      }
    }
  }
  EXPECT_EQ(untouched_written, 0) << "cache entries written outside the mapped slots";
  // k in place: the written tokens hold rope(norm(k)), the skipped token its input. With an e4m3
  // cache the dense k and v are what the cache holds (e4m3 times the scale, rounded to bf16).
  std::vector<float> k_in_place, k_expected, v_dense, v_expected;
  for (int t = 0; t < c.tokens; ++t) {
    if (c.slots[std::size_t(t)] < 0) continue;
    for (std::int64_t i = 0; i < row; ++i) {
      const std::size_t head = std::size_t(i / c.head_dim);
      const float k = r.ref_k[std::size_t(t * row + i)], v = r.v[std::size_t(t * row + i)];
      k_in_place.push_back(r.k[std::size_t(t * row + i)]);
      k_expected.push_back(c.fp8_cache ? round_to_bf16(e4m3_at(k, kFp8KeyScales[head])) : k);
      if (fused) {
        v_dense.push_back(r.v_out[std::size_t(t * row + i)]);
        v_expected.push_back(c.fp8_cache ? round_to_bf16(e4m3_at(v, kFp8ValueScales[head])) : v);
      }
    }
  }
  EXPECT_TRUE(close_to(k_in_place, k_expected, c.fp8_cache ? 3e-2 : kTolerance)) << "k rewritten in place";
  if (fused) EXPECT_TRUE(close_to(v_dense, v_expected, 0.0)) << "v copied out of the fused input";
  // An e4m3 key may round to the neighbouring value where the kernel's float32 k and the
  // reference's differ in the last bits: 3e-2 (a value's step is up to 1/8 of it).
  EXPECT_TRUE(close_to(k_out, k_ref, c.fp8_cache ? 3e-2 : kTolerance)) << "key_cache";
  EXPECT_TRUE(close_to(v_out, v_ref, 0.0)) << "value_cache";
}

QkCase make_qk_case(Random& rng, int tokens, int head_dim, bool uclip) {
  QkCase c;
  c.tokens = tokens;
  c.head_dim = head_dim;
  c.uclip = uclip;
  c.num_blocks = (tokens + 2 * 16 - 1) / 16;  // room to spare, so some slots stay unwritten
  // Short and long positions alike: 0, 1, then up to ~131k, where the angle is ~1e5 rad.
  const std::int64_t fixed[] = {0, 1, 100000, 131071, 4095};
  for (int t = 0; t < tokens; ++t)
    c.positions.push_back(t < 5 ? fixed[t] : rng.integer(0, 131071));
  c.slots = shuffled_slots(rng, c, tokens / 2);
  return c;
}

TEST(QkNormRopeKernel, SmallMatchesReference) {
  testing::require_gpu();
  Random rng(7);
  check_qk(make_qk_case(rng, 3, 128, true), 7);
  check_qk(make_qk_case(rng, 3, 64, false), 8);
}

TEST(QkNormRopeKernel, SmallFusedQkvInput) {
  testing::require_gpu();
  Random rng(9);
  check_qk(make_qk_case(rng, 3, 128, true), 9, /*fused=*/true);
  check_qk(make_qk_case(rng, 4, 64, false), 10, /*fused=*/true);
}

TEST(QkNormRopeKernel, SmallSplitQkvInput) {
  testing::require_gpu();
  Random rng(13);
  check_qk(make_qk_case(rng, 3, 128, true), 13, /*fused=*/true, /*splits=*/3);
  check_qk(make_qk_case(rng, 2, 64, false), 14, /*fused=*/true, /*splits=*/1);
}

// Models without a q/k norm (Llama): RoPE and the cache write alone, the weights never read
// (null), in every input form; SmolLM2-135M's 9 query and 3 KV heads of 64, and others.
TEST(QkNormRopeKernel, RopeWithoutNormMatchesReference) {
  testing::require_gpu();
  Random rng(41);
  for (int head_dim : {64, 128, 256}) {
    for (int form = 0; form < 3; ++form) {  // separate q, k, v; fused dense; fused split
      QkCase c = make_qk_case(rng, form == 2 ? 5 : 1100, head_dim, false);  // 1100: several tokens per block
      c.qk_norm = false;
      c.num_q_heads = head_dim == 64 ? 9 : 6;
      c.num_kv_heads = head_dim == 64 ? 3 : 2;
      c.rope_theta = head_dim == 64 ? 1e5f : 1e4f;
      check_qk(c, 42 + std::uint64_t(form), /*fused=*/form > 0, /*splits=*/form == 2 ? 3 : 0);
    }
  }
}

TEST(QkNormRopeKernel, SmallWithoutCacheRewritesQAndKOnly) {
  testing::require_gpu();
  Random rng(31);
  QkCase c = make_qk_case(rng, 5, 128, true);
  QkResult r = run_qk(c, 12, /*with_cache=*/false);
  EXPECT_TRUE(close_to(r.q, r.ref_q, kTolerance)) << "q";
  EXPECT_TRUE(close_to(r.k, r.ref_k, kTolerance)) << "k, every token (slots are not used)";
  for (float x : r.key_cache) ASSERT_TRUE(std::isnan(x)) << "the cache must stay untouched";
}

// From first_token on (the decode kernel does the leading decode tokens itself): the later
// tokens as the reference has them, the earlier ones' q, dense k and v and cache slots untouched.
void check_from_first_token(int tokens, int first_token, int splits, std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "tokens " << tokens << " from " << first_token << ", splits " << splits);
  Random rng(seed);
  QkCase c = make_qk_case(rng, tokens, 128, true);
  c.slots = shuffled_slots(rng, c, std::max(1, tokens * 2 / 3));
  c.first_token = first_token;
  QkResult r = run_qk(c, seed + 1, /*with_cache=*/true, /*fused=*/true, splits);
  const std::int64_t q_row = std::int64_t(c.num_q_heads) * c.head_dim, kv_row = std::int64_t(c.num_kv_heads) * c.head_dim;
  std::vector<float> q_got(r.q.begin() + c.first_token * q_row, r.q.end());
  std::vector<float> q_ref(r.ref_q.begin() + c.first_token * q_row, r.ref_q.end());
  EXPECT_TRUE(close_to(q_got, q_ref, kTolerance)) << "q of the processed tokens";
  for (std::int64_t i = 0; i < c.first_token * q_row; ++i) ASSERT_TRUE(std::isnan(r.q[std::size_t(i)])) << "q " << i;
  for (std::int64_t i = 0; i < c.first_token * kv_row; ++i) {
    ASSERT_TRUE(std::isnan(r.k[std::size_t(i)])) << "k " << i;
    ASSERT_TRUE(std::isnan(r.v_out[std::size_t(i)])) << "v " << i;
  }
  const std::int64_t slot_row = kv_row;
  for (int t = 0; t < c.tokens; ++t) {
    const std::int64_t slot = c.slots[std::size_t(t)];
    if (slot < 0) continue;
    for (std::int64_t i = 0; i < slot_row; ++i) {
      const float got = r.key_cache[std::size_t(slot * slot_row + i)];
      if (t < c.first_token) ASSERT_TRUE(std::isnan(got)) << "token " << t << " written to the cache";
      else ASSERT_NEAR(got, r.ref_k[std::size_t(t * kv_row + i)], 0.05f + 0.02f * std::fabs(got)) << "token " << t;
    }
  }
}

TEST(QkNormRopeKernel, SmallFromFirstTokenLeavesEarlierTokens) {
  testing::require_gpu();
  check_from_first_token(6, 2, /*splits=*/2, 17);
}

// From 1024 tokens on, a block takes several (kQkTokens) and the last block fewer: token counts
// that leave 1, 2 and 3 in the last block, dense inputs and a fused dense qkv, skipped slots, and
// a first token that shifts every block's tokens.
TEST(QkNormRopeKernel, SeveralTokensPerBlock) {
  testing::require_gpu();
  Random rng(41);
  check_qk(make_qk_case(rng, 1025, 128, true), 41);
  check_qk(make_qk_case(rng, 1030, 128, false), 42, /*fused=*/true);
  check_qk(make_qk_case(rng, 1027, 64, true), 43, /*fused=*/true);
  check_from_first_token(1031, 5, /*splits=*/0, 44);
}

TEST(QkNormRopeKernel, MatchesReference) {
  testing::require_gpu();
  Random rng(9);
  for (int head_dim : {64, 128, 256})
    for (int tokens : {1, 3, 17, 1000})
      for (bool uclip : {true, false}) {
        if (tokens == 1000 && (head_dim != 128 || !uclip)) continue;  // slow host helpers
        if (tokens == 1) {
          // A single token has nothing to skip: check a plain write and then a skipped one.
          QkCase c = make_qk_case(rng, 3, head_dim, uclip);
          c.tokens = 1;
          c.positions = {100000};
          c.slots = {5};
          check_qk(c, 10);
          c.slots = {-1};
          check_qk(c, 10);
          continue;
        }
        check_qk(make_qk_case(rng, tokens, head_dim, uclip), 10);
        if (tokens == 17) check_qk(make_qk_case(rng, tokens, head_dim, uclip), 11, /*fused=*/true);
        if (tokens == 17) check_qk(make_qk_case(rng, tokens, head_dim, uclip), 12, /*fused=*/true, /*splits=*/8);
      }
}

// An e4m3 cache: each written slot holds e4m3(k / key scale) and e4m3(v / value scale) of its KV
// head (v exactly: the same division and rounding), the others stay poisoned; the dense k and v
// hold the same values, rounded to bf16.
TEST(QkNormRopeKernel, Fp8CacheMatchesReference) {
  testing::require_gpu();
  Random rng(13);
  for (int head_dim : {64, 128, 256})
    for (bool fused : {false, true}) {
      QkCase c = make_qk_case(rng, 17, head_dim, true);
      c.fp8_cache = true;
      check_qk(c, 14, fused);
    }
  QkCase c = make_qk_case(rng, 17, 128, true);
  c.fp8_cache = true;
  c.qk_norm = false;
  check_qk(c, 15, /*fused=*/true, /*splits=*/8);
}

// Without a cache to write (the prefill path: the prefill kernel writes it), an e4m3 cache's
// scales still round every token's dense k and v as the cache will hold them.
TEST(QkNormRopeKernel, Fp8ScalesRoundTheDenseKeysAndValuesWithoutACache) {
  testing::require_gpu();
  Random rng(17);
  QkCase c = make_qk_case(rng, 17, 128, true);
  c.fp8_cache = true;
  const QkResult r = run_qk(c, 16, /*with_cache=*/false, /*fused=*/true);
  EXPECT_TRUE(close_to(r.q, r.ref_q, kTolerance)) << "q";
  std::vector<float> k_expected, v_expected;
  for (std::size_t i = 0; i < r.ref_k.size(); ++i) {
    const std::size_t head = i / std::size_t(c.head_dim) % kFp8KeyScales.size();
    k_expected.push_back(round_to_bf16(e4m3_at(r.ref_k[i], kFp8KeyScales[head])));
    v_expected.push_back(round_to_bf16(e4m3_at(r.v[i], kFp8ValueScales[head])));
  }
  // (a key may round to the neighbouring e4m3 value: the kernel's float32 k differs from the
  // reference's in the last bits; v is exact)
  EXPECT_TRUE(close_to(r.k, k_expected, 3e-2)) << "k";
  EXPECT_TRUE(close_to(r.v_out, v_expected, 0.0)) << "v";
}

// Long positions: at position ~1e5 the highest frequencies turn by ~1e5 rad, where an fp32
// angle (position * inv_freq in float) is off by up to ~5e-3 rad. Measured against the float64
// reference, restricted to the 8 highest-frequency pairs of every head (elements 0..7 and
// D/2..D/2+7), the bf16 output rounding alone gives ~1.7e-3 relative error; a CPU simulation
// of an fp32 angle gives ~2.8e-3 (head_dim 128) to ~3.3e-3 (256). The bound 2.2e-3 separates
// the two, so this fails if the angle loses precision.
TEST(QkNormRopeKernel, LongPositionsKeepAnglePrecision) {
  testing::require_gpu();
  Random rng(11);
  for (int head_dim : {128, 256}) {
    QkCase c = make_qk_case(rng, 256, head_dim, /*uclip=*/false);
    for (auto& p : c.positions) p = rng.integer(100000, 131071);
    SCOPED_TRACE(::testing::Message() << "head_dim " << head_dim);
    QkResult r = run_qk(c, 12);
    EXPECT_TRUE(close_to(r.q, r.ref_q, kTolerance));
    std::vector<float> out, ref;
    const int D = head_dim;
    for (std::size_t h = 0; h < r.q.size() / D; ++h)
      for (int i = 0; i < 8; ++i)
        for (int e : {i, i + D / 2}) {
          out.push_back(r.q[h * D + e]);
          ref.push_back(r.ref_q[h * D + e]);
        }
    EXPECT_TRUE(close_to(out, ref, 2.2e-3)) << "highest-frequency pairs";
  }
}

// ---- Bad arguments --------------------------------------------------------------------------

TEST(NormKernel, SmallBadArgumentsThrow) {
  testing::require_gpu();
  const int rows = 2, hidden = 64;
  DeviceBuffer x(DType::BF16, {rows, hidden + 8}), w(DType::BF16, {hidden + 8});
  DeviceBuffer out(DType::BF16, {rows, hidden + 8}), res(DType::BF16, {rows, hidden + 8});
  const kernels::NormArgs args;
  const bf16* px = x.as<bf16>();
  const bf16* pw = w.as<bf16>();
  bf16* po = out.as<bf16>();
  bf16* pr = res.as<bf16>();

  expect_error([&] { kernels::launch_norm(px, pw, po, rows, 60, args, nullptr); },
               "multiple of 8");
  expect_error([&] { kernels::launch_norm(px, pw, po, rows, 0, args, nullptr); },
               "multiple of 8");
  expect_error([&] { kernels::launch_norm(px, pw, po, 0, hidden, args, nullptr); }, "rows");
  expect_error([&] { kernels::launch_norm(px, pw, po, -1, hidden, args, nullptr); }, "rows");
  expect_error([&] { kernels::launch_norm(nullptr, pw, po, rows, hidden, args, nullptr); },
               "x is null");
  expect_error([&] { kernels::launch_norm(px + 1, pw, po, rows, hidden, args, nullptr); },
               "aligned");
  expect_error(
      [&] { kernels::launch_norm(px, pw, po, rows, hidden, {kEps, -1.0f}, nullptr); }, "clip");
  expect_error([&] { kernels::launch_fused_add_norm(px, pr, pw, po, rows, 12, args, nullptr); },
               "multiple of 8");
  expect_error(
      [&] { kernels::launch_fused_add_norm(px, nullptr, pw, po, rows, hidden, args, nullptr); },
      "residual is null");
  expect_error(
      [&] { kernels::launch_post_attn_pre_mlp(px, pr, pw, pw, po, rows, 100, args, nullptr); },
      "multiple of 8");
  expect_error(
      [&] {
        kernels::launch_post_attn_pre_mlp(px, pr, pw, nullptr, po, rows, hidden, args, nullptr);
      },
      "next_weight is null");

  kernels::QkNormRopeArgs qk;
  qk.q = po;
  qk.k = po;
  qk.v = px;
  qk.q_weight = pw;
  qk.k_weight = pw;
  DeviceBuffer index(DType::I64, {rows});
  qk.positions = index.as<std::int64_t>();
  qk.slot_mapping = index.as<std::int64_t>();
  qk.key_cache = pr;
  qk.value_cache = pr;
  qk.tokens = 1;
  qk.num_q_heads = 1;
  qk.num_kv_heads = 1;
  qk.head_dim = 64;
  qk.q_weight = nullptr;
  expect_error([&] { kernels::launch_qk_norm_rope_cache_write(qk, nullptr); }, "q_weight is null");
  qk.q_weight = pw;
  qk.head_dim = 96;
  expect_error([&] { kernels::launch_qk_norm_rope_cache_write(qk, nullptr); }, "head_dim");
  qk.head_dim = 64;
  qk.num_kv_heads = 0;
  expect_error([&] { kernels::launch_qk_norm_rope_cache_write(qk, nullptr); }, "head counts");
  qk.num_kv_heads = 1;
  qk.positions = nullptr;
  expect_error([&] { kernels::launch_qk_norm_rope_cache_write(qk, nullptr); },
               "positions is null");
  qk.positions = index.as<std::int64_t>();
  DeviceBuffer parts(DType::F32, {2 * 3 * 64});
  qk.v_out = po;
  qk.qkv = kernels::LinearOutput{nullptr, parts.as<float>(), 9, 3 * 64};
  expect_error([&] { kernels::launch_qk_norm_rope_cache_write(qk, nullptr); }, "splits");
  qk.qkv.splits = 2;
  qk.qkv.split_stride = 3 * 64 - 4;
  expect_error([&] { kernels::launch_qk_norm_rope_cache_write(qk, nullptr); }, "split stride");
  // Nothing above launched a kernel.
  testing::check_launch("bad arguments");
}

}  // namespace
}  // namespace asynct
