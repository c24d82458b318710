// Decode kernel against the CPU reference: one query token per sequence over a paged cache
// with shuffled blocks, 1 to 8 query heads per KV head; and the same from the qkv projection (the
// kernel norms and rotates q and the newest key and writes the newest K/V into the cache); both
// over a bf16 cache and an FP8 (e4m3) one, the reference reading the values the e4m3 bytes hold.
// Tolerance: relative Frobenius error 2e-2 (bf16 inputs and outputs land near 4e-3; an e4m3
// newest key or value may round to the neighbouring value: 3e-2 for those rows); outputs
// poisoned before every launch; NaN never passes.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "core/fp8.h"
#include "gpu/device_buffer.h"
#include "kernels/attention/decode/decode.h"
#include "reference/rope.h"
#include "support/attention_case.h"
#include "support/compare.h"
#include "support/fp8_cache.h"
#include "support/expect_error.h"

namespace asynct {
namespace {

using testing::AttentionCase;
using testing::close_to;
using testing::decode_fp8;
using testing::e4m3_at;
using testing::Fp8Cache;
using testing::to_fp8;
using testing::DeviceBuffer;
using testing::Random;
using testing::random_async_gate;

constexpr double kTolerance = 2e-2;
constexpr double kFp8RowTolerance = 3e-2;

struct DecodeRun {
  Tensor out;
  unsigned long long nonzero = 0, rows_loaded = 0;
  Tensor key_cache, value_cache;  // after the launch
};

// Runs the kernel on the case (all sequences decoding, q_len 1) and returns its output. With a
// projection (its device pointers set up by the caller) the kernel reads that instead of q.
DecodeRun run_decode(const AttentionCase& c, const AttentionCase::Paged& paged, const Gate& gate,
                     int num_splits, const kernels::DecodeProjection* projection = nullptr,
                     const Fp8Cache* fp8 = nullptr) {
  const int num_seqs = int(c.seqs.size());
  DeviceBuffer query = DeviceBuffer::upload(c.query, DType::BF16);
  DeviceBuffer out(DType::BF16, c.query.shape());
  DeviceBuffer key_cache = fp8 ? DeviceBuffer::upload(fp8->key_bytes, DType::U8) : DeviceBuffer::upload(paged.key_cache, DType::BF16);
  DeviceBuffer value_cache =
      fp8 ? DeviceBuffer::upload(fp8->value_bytes, DType::U8) : DeviceBuffer::upload(paged.value_cache, DType::BF16);
  const auto scales_of = [&](const std::vector<float>* v) {
    const std::vector<float> values = v ? *v : std::vector<float>{1.0f};
    return DeviceBuffer::upload(Tensor::from_vector(values, {std::int64_t(values.size())}), DType::F32);
  };
  DeviceBuffer key_scales = scales_of(fp8 ? &fp8->key_scales : nullptr);
  DeviceBuffer value_scales = scales_of(fp8 ? &fp8->value_scales : nullptr);
  DeviceBuffer table = DeviceBuffer::upload(paged.block_table, DType::I32);
  DeviceBuffer kv_lens = DeviceBuffer::upload(Tensor::from_vector(c.kv_lens, {num_seqs}), DType::I32);
  DeviceBuffer counters(DType::I64, {2});
  ASYNCT_CUDA_CHECK(cudaMemset(counters.data(), 0, 16));
  std::vector<float> ones(std::size_t(c.num_q_heads), 1.0f);
  auto params_of = [&](const std::vector<float>& v) {
    return DeviceBuffer::upload(Tensor::from_vector(v.empty() ? ones : v, {c.num_q_heads}), DType::F32);
  };
  DeviceBuffer alpha = params_of(gate.async.alpha), sigma = params_of(gate.async.sigma),
               gamma = params_of(gate.async.gamma);

  kernels::DecodeParams p;
  p.query = query.as<kernels::bf16>();
  p.out = out.as<kernels::bf16>();
  p.kv_lens = kv_lens.as<std::int32_t>();
  p.num_seqs = num_seqs;
  p.num_q_heads = c.num_q_heads;
  p.max_kv_len = *std::max_element(c.kv_lens.begin(), c.kv_lens.end());
  p.kv.key_cache = key_cache.as<kernels::bf16>();
  p.kv.value_cache = value_cache.as<kernels::bf16>();
  p.kv.block_table = table.as<std::int32_t>();
  p.kv.max_blocks_per_seq = int(paged.block_table.size(1));
  p.kv.num_blocks = int(paged.key_cache.size(0));
  p.kv.block_size = int(paged.key_cache.size(1));
  p.kv.num_kv_heads = c.num_kv_heads;
  p.kv.head_dim = c.head_dim;
  if (fp8) {
    p.kv.element = kernels::KvElement::Fp8E4M3;
    p.kv.key_scales = key_scales.as<float>();
    p.kv.value_scales = value_scales.as<float>();
  }
  p.gate.kind = gate.kind;
  p.gate.pool_window = gate.async.pool_window;
  p.gate.alpha = alpha.as<float>();
  p.gate.sigma = sigma.as<float>();
  p.gate.gamma = gamma.as<float>();
  p.gate.softcap = gate.softmax.softcap;
  p.num_splits = num_splits;
  p.counters = counters.as<unsigned long long>();
  if (projection) {
    p.projection = *projection;
    p.query = nullptr;
  }
  int splits = num_splits;
  if (splits <= 0) {
    int sms = 0;
    ASYNCT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    splits = kernels::decode_num_splits(num_seqs, c.num_kv_heads, p.max_kv_len, sms);
  }
  DeviceBuffer workspace(DType::U8, {std::int64_t(std::max<std::size_t>(1, kernels::decode_workspace_bytes(p, splits)))});
  workspace.poison();
  p.workspace = workspace.data();

  out.poison();
  kernels::launch_decode(p, nullptr);
  testing::check_launch("decode");
  DecodeRun run;
  run.out = out.download_float();
  Tensor counts = counters.download();
  run.nonzero = std::uint64_t(counts.at<std::int64_t>(0));
  run.rows_loaded = std::uint64_t(counts.at<std::int64_t>(1));
  run.key_cache = fp8 ? decode_fp8(key_cache.download(), fp8->key_scales, c.head_dim) : key_cache.download_float();
  run.value_cache = fp8 ? decode_fp8(value_cache.download(), fp8->value_scales, c.head_dim) : value_cache.download_float();
  return run;
}

struct DecodeShape {
  std::vector<int> kv_lens;
  int hq, hkv, head_dim, block_size;
};

void check_decode(const DecodeShape& shape, std::uint64_t seed, bool fp8 = false) {
  testing::require_gpu();
  Random rng(seed);
  std::vector<testing::SequenceLengths> seqs;
  for (int len : shape.kv_lens) seqs.push_back({1, len});
  AttentionCase c(rng, seqs, shape.hq, shape.hkv, shape.head_dim, /*bf16_exact=*/true);
  auto paged = c.paged(rng, shape.block_size);
  std::optional<Fp8Cache> fp8_cache;
  if (fp8) fp8_cache = to_fp8(paged, shape.hkv, shape.head_dim);
  std::vector<Gate> gates = {random_async_gate(rng, shape.hq, 3), random_async_gate(rng, shape.hq, 1),
                             random_async_gate(rng, shape.hq, 8),
                             random_async_gate(rng, shape.hq, 2), Gate::make_async(shape.hq, 3),
                             Gate::make_softmax(), Gate::make_softmax(10.0f)};
  for (const Gate& gate : gates) {
    AttentionStats stats;
    Tensor expected = attention(c.batch(paged.cache), gate, &stats);
    for (int splits : {1, 0, 7}) {
      DecodeRun run = run_decode(c, paged, gate, splits, nullptr, fp8_cache ? &*fp8_cache : nullptr);
      EXPECT_TRUE(close_to(run.out, expected, kTolerance))
          << (gate.kind == GateKind::Async ? "async W=" : "softmax, W=") << gate.async.pool_window
          << " splits " << splits << " head_dim " << shape.head_dim << " block " << shape.block_size
          << (fp8 ? " fp8 cache" : "");
      if (gate.kind == GateKind::Async) {
        // fp32 scores put a few entries on the other side of the clamp than float64 does.
        EXPECT_NEAR(double(run.nonzero), double(stats.nonzero_entries), 0.01 * double(stats.gate_entries) + 2);
        EXPECT_LE(run.rows_loaded, std::uint64_t(stats.gate_entries));
      }
    }
  }
}

// ---- From the qkv projection ----------------------------------------------------------------

// The newest token of every sequence comes as the qkv projection's row (dense bf16, or `splits`
// fp32 partial sums); the cache holds NaN where its K/V go, so a read before the kernel's own
// write fails. Expected: the reference's q/k norm + RoPE + cache write, then the reference
// attention over that cache; and the newest cache rows equal to the reference's.
void check_decode_from_projection(const DecodeShape& shape, int splits, std::uint64_t seed, bool fp8 = false) {
  testing::require_gpu();
  SCOPED_TRACE(::testing::Message() << "head_dim " << shape.head_dim << " block " << shape.block_size
                                    << " projection splits " << splits << (fp8 ? " fp8 cache" : ""));
  Random rng(seed);
  std::vector<testing::SequenceLengths> seqs;
  for (int len : shape.kv_lens) seqs.push_back({1, len});
  AttentionCase c(rng, seqs, shape.hq, shape.hkv, shape.head_dim, /*bf16_exact=*/true);
  AttentionCase::Paged paged = c.paged(rng, shape.block_size);
  const int S = int(seqs.size()), D = shape.head_dim, Hq = shape.hq, Hkv = shape.hkv;
  Tensor q_in = rng.normal({S, Hq, D}, 3.0f, true), k_in = rng.normal({S, Hkv, D}, 3.0f, true);
  Tensor v_in = rng.normal({S, Hkv, D}, 1.0f, true);
  Tensor q_weight = rng.normal({D}, 1.0f, true), k_weight = rng.normal({D}, 1.0f, true);
  std::vector<std::int64_t> positions, slots;
  const std::int64_t width = paged.block_table.size(1), row = std::int64_t(Hkv) * D;
  for (int s = 0; s < S; ++s) {
    const int pos = shape.kv_lens[std::size_t(s)] - 1;
    const std::int64_t block = paged.block_table.at<std::int32_t>(s * width + pos / shape.block_size);
    positions.push_back(pos);
    slots.push_back(block * shape.block_size + pos % shape.block_size);
    for (std::int64_t i = 0; i < row; ++i) {  // poison the newest rows of the uploaded cache
      paged.key_cache.at<float>(slots.back() * row + i) = std::nanf("");
      paged.value_cache.at<float>(slots.back() * row + i) = std::nanf("");
    }
  }
  std::optional<Fp8Cache> fp8_cache;
  if (fp8) fp8_cache = to_fp8(paged, Hkv, D);

  // The projection on the device, laid out as the GEMM writes it: [S, (Hq + 2 Hkv) D].
  const std::int64_t cols = std::int64_t(Hq + 2 * Hkv) * D;
  Tensor qkv = Tensor::empty(DType::F32, {S, cols});
  for (int s = 0; s < S; ++s) {
    float* out = qkv.data_as<float>() + s * cols;
    out = std::copy_n(q_in.data_as<float>() + s * Hq * D, Hq * D, out);
    out = std::copy_n(k_in.data_as<float>() + s * row, row, out);
    std::copy_n(v_in.data_as<float>() + s * row, row, out);
  }
  DeviceBuffer dense = DeviceBuffer::upload(qkv, DType::BF16);
  // Split form: split 0 holds x minus the others, which hold multiples of 1/16, so the sum in
  // split order is x exactly.
  const std::int64_t stride = S * cols + 4;
  Tensor parts = Tensor::empty(DType::F32, {std::max(splits, 1), stride});
  for (std::int64_t i = 0; i < S * cols; ++i) {
    float rest = qkv.data_as<float>()[i];
    for (int sp = 1; sp < splits; ++sp) {
      const float a = float(rng.integer(-64, 64)) / 16.0f;
      parts.data_as<float>()[sp * stride + i] = a;
      rest -= a;
    }
    parts.data_as<float>()[i] = rest;
  }
  DeviceBuffer partials = DeviceBuffer::upload(parts, DType::F32);
  DeviceBuffer dqw = DeviceBuffer::upload(q_weight, DType::BF16), dkw = DeviceBuffer::upload(k_weight, DType::BF16);
  DeviceBuffer dpos = DeviceBuffer::upload(Tensor::from_vector(positions, {S}), DType::I64);
  DeviceBuffer dslots = DeviceBuffer::upload(Tensor::from_vector(slots, {S}), DType::I64);
  const NormConfig config = NormConfig::uclip(1e-6f, 1.0f);
  const float theta = 1e6f;
  kernels::DecodeProjection projection;
  projection.qkv = splits > 0 ? kernels::LinearOutput{nullptr, partials.as<float>(), splits, stride}
                              : kernels::LinearOutput::of(dense.as<kernels::bf16>());
  projection.q_weight = dqw.as<kernels::bf16>();
  projection.k_weight = dkw.as<kernels::bf16>();
  projection.positions = dpos.as<std::int64_t>();
  projection.slot_mapping = dslots.as<std::int64_t>();
  projection.rope_theta = theta;
  projection.norm = {config.eps, config.clip};

  // The reference: q and the newest K/V into a copy of the cache, then attention over it.
  AttentionCase::Paged expected_cache = paged;
  expected_cache.key_cache = paged.key_cache.to(DType::F32);
  expected_cache.value_cache = paged.value_cache.to(DType::F32);
  QkNormRopeOutput ref = qk_norm_rope_cache_write(q_in, k_in, v_in, q_weight, k_weight, config, positions, theta,
                                                  expected_cache.key_cache, expected_cache.value_cache, slots);
  expected_cache.cache = KvCache::paged(expected_cache.key_cache, expected_cache.value_cache, paged.block_table);
  AttentionCase projected = c;
  projected.query = ref.q;
  std::vector<float> newest_k, newest_v;
  for (std::int64_t slot : slots)
    for (std::int64_t i = 0; i < row; ++i) {
      float& k = expected_cache.key_cache.at<float>(slot * row + i);
      float& v = expected_cache.value_cache.at<float>(slot * row + i);
      if (fp8_cache) {  // stored as e4m3 at the head's scales (the value rounded to bf16 first)
        const std::size_t head = std::size_t(i / D);
        k = e4m3_at(k, fp8_cache->key_scales[head]);
        v = e4m3_at(round_to_bf16(v), fp8_cache->value_scales[head]);
      }
      newest_k.push_back(k);
      newest_v.push_back(v);
    }

  for (const Gate& gate : {random_async_gate(rng, Hq, 3), Gate::make_softmax()}) {
    const Tensor expected = attention(projected.batch(expected_cache.cache), gate);
    for (int num_splits : {1, 0, 7}) {
      DecodeRun run = run_decode(c, paged, gate, num_splits, &projection, fp8_cache ? &*fp8_cache : nullptr);
      EXPECT_TRUE(close_to(run.out, expected, kTolerance))
          << (gate.kind == GateKind::Async ? "async" : "softmax") << ", decode splits " << num_splits;
      std::vector<float> got_k, got_v;
      for (std::int64_t slot : slots)
        for (std::int64_t i = 0; i < row; ++i) {
          got_k.push_back(run.key_cache.at<float>(slot * row + i));
          got_v.push_back(run.value_cache.at<float>(slot * row + i));
        }
      EXPECT_TRUE(close_to(got_k, newest_k, fp8 ? kFp8RowTolerance : kTolerance)) << "the newest keys in the cache";
      EXPECT_TRUE(close_to(got_v, newest_v, fp8 ? kFp8RowTolerance : 0.0)) << "the newest values in the cache (copied)";
    }
  }
}

TEST(DecodeSmall, FromProjectionHeadDim128) { check_decode_from_projection({{3, 40}, 4, 2, 128, 16}, 0, 21); }
TEST(Decode, FromProjectionAwkwardLengthsGqa) {
  check_decode_from_projection({{1, 17, 300, 1000, 4097}, 16, 8, 128, 16}, 3, 22);
  check_decode_from_projection({{255, 256, 257, 2049}, 8, 2, 128, 256}, 0, 23);
  check_decode_from_projection({{100, 1500}, 8, 8, 64, 64}, 8, 24);
  check_decode_from_projection({{77, 600}, 8, 1, 256, 32}, 1, 25);
}

TEST(Decode, SmallBatchAllGates) { check_decode({{1, 5, 17, 33}, 4, 2, 64, 16}, 1); }
TEST(Decode, SmallHeadDim128) { check_decode({{3, 40}, 2, 1, 128, 16}, 2); }
TEST(Decode, AwkwardLengthsGqaBlock16) { check_decode({{1, 17, 300, 1000, 4097}, 8, 2, 128, 16}, 3); }
TEST(Decode, AwkwardLengthsBlock256) { check_decode({{255, 256, 257, 2049}, 16, 8, 128, 256}, 4); }
TEST(Decode, HeadDim64Block64) { check_decode({{100, 1500}, 8, 8, 64, 64}, 5); }
TEST(Decode, HeadDim256Block32) { check_decode({{77, 600}, 8, 1, 256, 32}, 6); }
TEST(Decode, LongContextFewSequences) { check_decode({{20000}, 16, 8, 128, 128}, 7); }

// Groups that are not a power of two run padded (3 as 4, 5 to 7 as 8): every gate, split count
// and head size, from q and from the projection.
TEST(Decode, GroupOfThree) {
  check_decode({{1, 17, 300, 1000}, 9, 3, 64, 16}, 8);  // SmolLM2-135M's heads
  check_decode({{3, 40, 2049}, 6, 2, 128, 32}, 9);
}
TEST(Decode, GroupsOfFiveSixAndSeven) {
  check_decode({{5, 333}, 10, 2, 128, 16}, 10);
  check_decode({{77, 600}, 12, 2, 64, 32}, 11);
  check_decode({{40, 1200}, 7, 1, 256, 64}, 12);
}
TEST(Decode, FromProjectionGroupsOfThreeAndSix) {
  check_decode_from_projection({{1, 17, 300}, 9, 3, 64, 16}, 0, 26);
  check_decode_from_projection({{100, 1500}, 6, 2, 128, 64}, 3, 27);
  check_decode_from_projection({{77, 600}, 12, 2, 64, 32}, 2, 28);
}

// An FP8 (e4m3) cache: both gates, splits 1 / chosen / 7, GQA groups 1-8 (3 and 6 padded),
// head sizes 64 and 128, blocks of 16-256; read, and written from the projection.
TEST(Decode, Fp8CacheAllGates) {
  check_decode({{1, 5, 17, 33}, 4, 2, 64, 16}, 31, true);
  check_decode({{1, 17, 300, 1000, 4097}, 8, 2, 128, 16}, 32, true);
  check_decode({{255, 256, 257, 2049}, 16, 8, 128, 256}, 33, true);
  check_decode({{1, 17, 300, 1000}, 9, 3, 64, 16}, 34, true);
  check_decode({{77, 600}, 12, 2, 64, 32}, 35, true);
  check_decode({{100, 1500}, 8, 8, 64, 64}, 36, true);
}
TEST(Decode, Fp8CacheFromProjection) {
  check_decode_from_projection({{3, 40}, 4, 2, 128, 16}, 0, 37, true);
  check_decode_from_projection({{1, 17, 300, 1000, 4097}, 16, 8, 128, 16}, 3, 38, true);
  check_decode_from_projection({{100, 1500}, 6, 2, 128, 64}, 8, 39, true);
  check_decode_from_projection({{1, 17, 300}, 9, 3, 64, 16}, 0, 40, true);
}

TEST(Decode, RejectsBadArguments) {
  kernels::DecodeParams p;
  p.kv.block_size = 24;
  EXPECT_THROW(kernels::launch_decode(p, nullptr), Error);
}

TEST(Decode, RejectsAnFp8CacheWithoutScalesOrAtHeadDim256) {
  testing::require_gpu();
  Random rng(5);
  AttentionCase c(rng, {{1, 20}}, 4, 2, 256, true);
  AttentionCase::Paged paged = c.paged(rng, 16);
  Fp8Cache fp8 = to_fp8(paged, 2, 256);
  testing::expect_error([&] { run_decode(c, paged, Gate::make_softmax(), 1, nullptr, &fp8); },
                        "head_dim 256 with an FP8 cache not supported");
  kernels::DecodeParams p;
  int dummy[4];
  p.kv.key_cache = p.kv.value_cache = reinterpret_cast<kernels::bf16*>(dummy);
  p.kv.block_table = dummy;
  p.kv.block_size = 16;
  p.kv.head_dim = 64;
  p.kv.num_kv_heads = p.kv.max_blocks_per_seq = p.kv.num_blocks = 1;
  p.kv.element = kernels::KvElement::Fp8E4M3;
  testing::expect_error([&] { kernels::launch_decode(p, nullptr); }, "needs its key and value scales");
}

TEST(Decode, RejectsGroupsAboveEight) {
  testing::require_gpu();
  Random rng(4);
  AttentionCase c(rng, {{1, 20}}, 16, 1, 64, true);
  AttentionCase::Paged paged = c.paged(rng, 16);
  testing::expect_error([&] { run_decode(c, paged, Gate::make_softmax(), 1); },
                        "decode: 16 query heads per KV head; supported: 1 to 8");
}

TEST(Decode, RejectsABadProjection) {
  testing::require_gpu();
  Random rng(3);
  AttentionCase c(rng, {{1, 20}}, 4, 2, 128, true);
  AttentionCase::Paged paged = c.paged(rng, 16);
  DeviceBuffer parts(DType::F32, {4096});
  kernels::DecodeProjection projection;
  projection.qkv = kernels::LinearOutput{nullptr, parts.as<float>(), 9, 1000};  // 1024 values
  EXPECT_THROW(run_decode(c, paged, Gate::make_softmax(), 1, &projection), Error) << "missing weights";
  DeviceBuffer weights(DType::BF16, {128});
  DeviceBuffer indices(DType::I64, {1});
  projection.q_weight = projection.k_weight = weights.as<kernels::bf16>();
  projection.positions = projection.slot_mapping = indices.as<std::int64_t>();
  testing::expect_error([&] { run_decode(c, paged, Gate::make_softmax(), 1, &projection); }, "splits");
  projection.qkv.splits = 2;
  testing::expect_error([&] { run_decode(c, paged, Gate::make_softmax(), 1, &projection); }, "split stride");
}

}  // namespace
}  // namespace asynct
