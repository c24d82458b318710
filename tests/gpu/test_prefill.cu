// GPU tests of the prefill kernels against the CPU reference.
//
// Each case builds a random batch (bf16-exact inputs), a paged cache with shuffled blocks that
// holds each sequence's prefix, and the new tokens' K/V as separate arrays. The cache slots of
// the new tokens start as NaN: a kernel that reads them instead of the input arrays produces
// NaN, and after the launch the cache must hold exactly the new K/V (bf16). The output is
// poisoned (NaN) before the launch and compared with asynct::attention (float64 accumulate) by
// relative Frobenius error, tolerance kTolerance = 2e-2 (bf16 inputs, P rounded to bf16 and a
// bf16 output land near 1e-3..1e-2); a NaN never passes. Each kernel runs whole, as its rule
// splits the keys, and with each query tile's keys split over 2 and 5 CTAs
// (KernelTuning::prefill_kv_splits), the workspace poisoned too: a part never written makes the
// output NaN; and with its tiles taken in groups of one and two sequences and in the plain order
// (prefill_seq_group: a tile taken twice or never leaves NaN rows or a race). Over an FP8 (e4m3)
// cache too: the prefixes are e4m3 values at per-KV-head scales (the reference reads those), the
// new rows must land as e4m3 of their bf16 values (a byte may be its neighbour: division at a
// rounding tie), the prefix and unused slots untouched.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "core/dtype.h"
#include "gpu/device_buffer.h"
#include "kernels/attention/prefill/kernels.h"  // prefill_hopper_tensor_copies
#include "kernels/attention/prefill/prefill.h"
#include "kernels/attention/prefill/tile_order.cuh"
#include "kernels/common/tuning.h"
#include "reference/attention.h"
#include "support/attention_case.h"
#include "support/compare.h"
#include "support/expect_error.h"
#include "support/fp8_cache.h"
#include "support/random.h"

namespace asynct {
namespace {

using testing::AttentionCase;
using testing::close_to;
using testing::DeviceBuffer;
using testing::Random;
using testing::random_async_gate;
using testing::SequenceLengths;

constexpr double kTolerance = 2e-2;

// The awkward batch: odd lengths, a single query after 299 cached tokens, prefixes that cross
// 16- and 256-token block boundaries, and a sequence with no new tokens at all.
const std::vector<SequenceLengths> kAwkward = {{37, 37}, {1, 300}, {64, 129}, {200, 517}, {0, 5}};

// The rows of `kv` ([total_kv, Hkv, D], per-sequence contiguous) at the new tokens' positions,
// packed like the queries: [total_q, Hkv, D].
Tensor new_tokens(const AttentionCase& c, const Tensor& kv) {
  const std::int64_t row = std::int64_t(c.num_kv_heads) * c.head_dim;
  Tensor out = Tensor::empty(DType::F32, {c.cu_seqlens_q.back(), c.num_kv_heads, c.head_dim});
  for (std::size_t s = 0; s < c.seqs.size(); ++s) {
    const int prefix = c.seqs[s].kv_len - c.seqs[s].q_len;
    for (int r = 0; r < c.seqs[s].q_len; ++r)
      std::copy_n(kv.data_as<float>() + (c.cu_seqlens_k[s] + prefix + r) * row, row,
                  out.data_as<float>() + (c.cu_seqlens_q[s] + r) * row);
  }
  return out;
}

// Sets the cache rows of every new token (all KV heads) to NaN.
void garble_new_slots(const AttentionCase& c, const Tensor& block_table, int block_size,
                      Tensor& cache) {
  const std::int64_t row = std::int64_t(c.num_kv_heads) * c.head_dim;
  const std::int64_t max_blocks = block_table.size(1);
  for (std::size_t s = 0; s < c.seqs.size(); ++s) {
    for (int pos = c.seqs[s].kv_len - c.seqs[s].q_len; pos < c.seqs[s].kv_len; ++pos) {
      const int phys =
          block_table.data_as<std::int32_t>()[std::int64_t(s) * max_blocks + pos / block_size];
      std::fill_n(cache.data_as<float>() + (std::int64_t(phys) * block_size + pos % block_size) * row,
                  row, std::numeric_limits<float>::quiet_NaN());
    }
  }
}

// Fast float32 <-> bf16 conversions of whole tensors (Tensor::to goes element by element
// through double, which dominates these tests' run time on large caches).
Tensor to_bf16(const Tensor& f32) {
  Tensor out = Tensor::empty(DType::BF16, f32.shape());
  const float* src = f32.data_as<float>();
  auto* dst = static_cast<std::uint16_t*>(out.data());
  for (std::int64_t i = 0; i < f32.numel(); ++i) dst[i] = float_to_bf16(src[i]);
  return out;
}
std::vector<float> bf16_values(const Tensor& bf16) {
  std::vector<float> out(std::size_t(bf16.numel()));
  const auto* src = static_cast<const std::uint16_t*>(bf16.data());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_float(src[i]);
  return out;
}
std::vector<float> f32_values(const Tensor& f32) {
  const float* src = f32.data_as<float>();
  return std::vector<float>(src, src + f32.numel());
}

// Bit-exact equality of two bf16 tensors.
::testing::AssertionResult same_bits(const Tensor& got, const Tensor& want) {
  if (got.numel() != want.numel()) return ::testing::AssertionFailure() << "sizes differ";
  const auto* a = static_cast<const std::uint16_t*>(got.data());
  const auto* b = static_cast<const std::uint16_t*>(want.data());
  std::int64_t bad = 0, first = -1;
  for (std::int64_t i = 0; i < got.numel(); ++i)
    if (a[i] != b[i] && bad++ == 0) first = i;
  if (bad)
    return ::testing::AssertionFailure()
           << bad << " of " << got.numel() << " cache values differ, the first at " << first
           << " (got " << bf16_to_float(a[first]) << ", want " << bf16_to_float(b[first]) << ")";
  return ::testing::AssertionSuccess();
}

// The gate's device arrays and the GateArgs that point at them.
struct DeviceGate {
  std::vector<DeviceBuffer> buffers;
  kernels::GateArgs args;

  explicit DeviceGate(const Gate& gate) {
    args.kind = gate.kind;
    if (gate.kind == GateKind::Async) {
      const std::int64_t hq = std::int64_t(gate.async.alpha.size());
      for (const std::vector<float>* v : {&gate.async.alpha, &gate.async.sigma, &gate.async.gamma})
        buffers.push_back(DeviceBuffer::upload(Tensor::from_vector(*v, {hq}), DType::F32));
      args.alpha = buffers[0].as<float>();
      args.sigma = buffers[1].as<float>();
      args.gamma = buffers[2].as<float>();
      args.pool_window = gate.async.pool_window;
    } else {
      args.softcap = gate.softmax.softcap;
    }
  }
};

// An e4m3 cache's scales, [KV head].
struct Fp8Scales {
  std::vector<float> key, value;
};

// Makes `c`'s prefixes what an e4m3 cache holds (each KV head's scales from all its keys or
// values, their largest at 224; the new tokens stay bf16), and returns the scales.
Fp8Scales round_prefixes_to_e4m3(AttentionCase& c) {
  const Fp8Scales scales{testing::fp8_scales_at_224(c.key, c.num_kv_heads, c.head_dim),
                         testing::fp8_scales_at_224(c.value, c.num_kv_heads, c.head_dim)};
  const std::int64_t row = std::int64_t(c.num_kv_heads) * c.head_dim;
  for (std::size_t s = 0; s < c.seqs.size(); ++s)
    for (std::int64_t i = c.cu_seqlens_k[s] * row; i < (c.cu_seqlens_k[s] + c.seqs[s].kv_len - c.seqs[s].q_len) * row; ++i) {
      const std::size_t head = testing::head_of(i, c.num_kv_heads, c.head_dim);
      c.key.data_as<float>()[i] = testing::e4m3_at(c.key.data_as<float>()[i], scales.key[head]);
      c.value.data_as<float>()[i] = testing::e4m3_at(c.value.data_as<float>()[i], scales.value[head]);
    }
  return scales;
}

// Runs launch_prefill on `c` (prefixes in a paged cache of `block_size`, new tokens from the
// input arrays) and checks the output against `reference` and the cache's new K/V rows. With
// a workspace when the launch asks for one (prefill_workspace_bytes: the keys split).
// checked_rows: the output's first rows compared (-1: all). fp8: the cache is e4m3 at these
// scales (c's prefixes already e4m3 values: round_prefixes_to_e4m3).
void run_and_check_once(const AttentionCase& c, const Gate& gate, const Tensor& reference,
                        int block_size, Random& rng, float scale, int checked_rows = -1,
                        const Fp8Scales* fp8 = nullptr) {
  AttentionCase::Paged paged = c.paged(rng, block_size);
  Tensor start_k = Tensor::from_vector(f32_values(paged.key_cache), paged.key_cache.shape());
  Tensor start_v = Tensor::from_vector(f32_values(paged.value_cache), paged.value_cache.shape());
  garble_new_slots(c, paged.block_table, block_size, start_k);
  garble_new_slots(c, paged.block_table, block_size, start_v);

  const int num_seqs = int(c.seqs.size());
  DeviceBuffer query = DeviceBuffer::upload(to_bf16(c.query), DType::BF16);
  DeviceBuffer key = DeviceBuffer::upload(to_bf16(new_tokens(c, c.key)), DType::BF16);
  DeviceBuffer value = DeviceBuffer::upload(to_bf16(new_tokens(c, c.value)), DType::BF16);
  DeviceBuffer out(DType::BF16, c.query.shape());
  out.poison();
  const auto cache_of = [&](const Tensor& values, const std::vector<float>* scales) {
    return fp8 ? DeviceBuffer::upload(testing::e4m3_bytes(values, *scales, c.head_dim), DType::U8)
               : DeviceBuffer::upload(to_bf16(values), DType::BF16);
  };
  DeviceBuffer key_cache = cache_of(start_k, fp8 ? &fp8->key : nullptr);
  DeviceBuffer value_cache = cache_of(start_v, fp8 ? &fp8->value : nullptr);
  const auto scales_of = [&](const std::vector<float>* v) {
    const std::vector<float> values = v ? *v : std::vector<float>{1.0f};
    return DeviceBuffer::upload(Tensor::from_vector(values, {std::int64_t(values.size())}), DType::F32);
  };
  DeviceBuffer key_scales = scales_of(fp8 ? &fp8->key : nullptr), value_scales = scales_of(fp8 ? &fp8->value : nullptr);
  DeviceBuffer table = DeviceBuffer::upload(paged.block_table, DType::I32);
  DeviceBuffer cu_seqlens =
      DeviceBuffer::upload(Tensor::from_vector(c.cu_seqlens_q, {num_seqs + 1}), DType::I32);
  DeviceBuffer kv_lens = DeviceBuffer::upload(Tensor::from_vector(c.kv_lens, {num_seqs}), DType::I32);
  DeviceGate device_gate(gate);

  kernels::PrefillParams p;
  p.query = query.as<kernels::bf16>();
  p.key = key.as<kernels::bf16>();
  p.value = value.as<kernels::bf16>();
  p.out = out.as<kernels::bf16>();
  p.cu_seqlens_q = cu_seqlens.as<std::int32_t>();
  p.kv_lens = kv_lens.as<std::int32_t>();
  p.num_seqs = num_seqs;
  p.total_q = c.cu_seqlens_q.back();
  for (const SequenceLengths& s : c.seqs) {
    p.max_q_len = std::max(p.max_q_len, s.q_len);
    p.max_kv_len = std::max(p.max_kv_len, s.kv_len);
  }
  p.num_q_heads = c.num_q_heads;
  p.scale = scale;
  p.kv.key_cache = key_cache.as<kernels::bf16>();
  p.kv.value_cache = value_cache.as<kernels::bf16>();
  p.kv.block_table = table.as<std::int32_t>();
  p.kv.max_blocks_per_seq = int(paged.block_table.size(1));
  p.kv.num_blocks = int(paged.key_cache.size(0));
  p.kv.block_size = block_size;
  p.kv.num_kv_heads = c.num_kv_heads;
  p.kv.head_dim = c.head_dim;
  if (fp8) {
    p.kv.element = kernels::KvElement::Fp8E4M3;
    p.kv.key_scales = key_scales.as<float>();
    p.kv.value_scales = value_scales.as<float>();
  }
  p.gate = device_gate.args;
  DeviceBuffer workspace(DType::F32, {std::int64_t(kernels::prefill_workspace_bytes(p) / sizeof(float))});
  workspace.poison();
  if (workspace.numel()) p.workspace = workspace.data(), p.workspace_bytes = std::size_t(workspace.numel()) * sizeof(float);

  kernels::launch_prefill(p, nullptr);
  testing::check_launch("launch_prefill");

  std::vector<float> got = bf16_values(out.download()), want = f32_values(reference);
  if (checked_rows >= 0) {
    const std::size_t kept = std::size_t(checked_rows) * std::size_t(c.num_q_heads) * std::size_t(c.head_dim);
    got.resize(kept), want.resize(kept);
  }
  EXPECT_TRUE(close_to(got, want, kTolerance)) << "output";
  // Every slot of the cache: the prefix and unused slots untouched, the new tokens written.
  if (fp8) {
    EXPECT_TRUE(testing::same_e4m3_within_a_step(key_cache.download(), testing::e4m3_bytes(paged.key_cache, fp8->key, c.head_dim)))
        << "key cache";
    EXPECT_TRUE(
        testing::same_e4m3_within_a_step(value_cache.download(), testing::e4m3_bytes(paged.value_cache, fp8->value, c.head_dim)))
        << "value cache";
    return;
  }
  EXPECT_TRUE(same_bits(key_cache.download(), to_bf16(paged.key_cache))) << "key cache";
  EXPECT_TRUE(same_bits(value_cache.download(), to_bf16(paged.value_cache))) << "value cache";
}

// ... with each kernel that can run the case: the portable one, and on Hopper for head_dim 128
// the wgmma one, each whole and with its keys split, and the wgmma one also on 1, 3 and one
// persistent CTA a multiprocessor.
void run_and_check(const AttentionCase& c, const Gate& gate, const Tensor& reference,
                   int block_size, Random& rng, float scale = 0.0f, int checked_rows = -1,
                   const Fp8Scales* fp8 = nullptr) {
  SCOPED_TRACE("block_size " + std::to_string(block_size));
  const kernels::KernelTuning saved = kernels::kernel_tuning();
  struct Form {
    int splits, seq_group, ctas;  // 0: the kernel's own rule; 1000 sequences a group: the plain order
  };
  for (kernels::PrefillKernel kernel : {kernels::PrefillKernel::kPortable, kernels::PrefillKernel::kHopper}) {
    const bool hopper = kernel == kernels::PrefillKernel::kHopper;
    if (hopper && (c.head_dim != 128 || !kernels::prefill_hopper_available())) continue;
    for (const Form form : {Form{1, 0, 0}, {1, 1000, 0}, {0, 0, 0}, {2, 2, 0}, {5, 1, 0}, {1, 0, 1}, {1, 2, 3}, {1, 1000, 1000}}) {
      if (!hopper && form.ctas > 0) continue;  // (persistent CTAs are the wgmma kernel's)
      SCOPED_TRACE(std::string(hopper ? "Hopper" : "portable") + " kernel, keys split " + std::to_string(form.splits) +
                   " ways, sequences in groups of " + std::to_string(form.seq_group) + " (0: its rule), " +
                   (form.ctas > 0 ? "at most " + std::to_string(form.ctas) + " persistent CTAs" : "one CTA a tile"));
      kernels::KernelTuning forced = saved;
      forced.prefill = kernel;
      forced.prefill_kv_splits = form.splits;
      forced.prefill_seq_group = form.seq_group;
      forced.prefill_ctas = form.ctas;
      kernels::set_kernel_tuning(forced);
      run_and_check_once(c, gate, reference, block_size, rng, scale, checked_rows, fp8);
    }
  }
  kernels::set_kernel_tuning(saved);
}

Tensor reference_output(const AttentionCase& c, const Gate& gate, float scale = 0.0f) {
  AttentionBatch batch = c.batch();
  batch.scale = scale;
  return attention(batch, gate);
}

// ---- Small cases (run under compute-sanitizer) ---------------------------------------------

TEST(PrefillSmall, AsyncGqaPagedHeadDim64) {
  testing::require_gpu();
  Random rng(11);
  AttentionCase c(rng, {{5, 5}, {3, 20}, {1, 17}, {0, 3}}, 2, 1, 64, /*bf16_exact=*/true);
  Gate gate = random_async_gate(rng, 2, 3);
  run_and_check(c, gate, reference_output(c, gate), 16, rng);
}

// Two query heads a split CTA (every sequence's new tokens within 64), both gates.
TEST(PrefillSmall, ShortQueriesTwoHeadsACta) {
  testing::require_gpu();
  Random rng(13);
  AttentionCase c(rng, {{5, 300}, {1, 140}, {64, 400}}, 4, 2, 128, /*bf16_exact=*/true);
  for (const Gate& gate : {random_async_gate(rng, 4, 3), Gate::make_softmax()})
    run_and_check(c, gate, reference_output(c, gate), 16, rng);
}

TEST(PrefillSmall, SoftmaxPagedHeadDim128) {
  testing::require_gpu();
  Random rng(12);
  AttentionCase c(rng, {{7, 7}, {2, 33}, {17, 40}}, 2, 2, 128, /*bf16_exact=*/true);
  Gate gate = Gate::make_softmax();
  run_and_check(c, gate, reference_output(c, gate), 16, rng);
}

TEST(PrefillSmall, AsyncGqaPagedHeadDim128AcrossKeyTiles) {
  testing::require_gpu();
  Random rng(13);
  // Prefixes and new tokens that cross the 128-key tiles of the Hopper kernel.
  AttentionCase c(rng, {{3, 140}, {130, 130}, {1, 129}}, 4, 2, 128, /*bf16_exact=*/true);
  Gate gate = random_async_gate(rng, 4, 3);
  run_and_check(c, gate, reference_output(c, gate), 16, rng);
}

// ---- Async gate ----------------------------------------------------------------------------

TEST(Prefill, AsyncAwkwardLengthsGqaWindows1To3) {
  testing::require_gpu();
  Random rng(21);
  AttentionCase c(rng, kAwkward, 8, 2, 128, /*bf16_exact=*/true);
  for (int window : {1, 2, 3}) {
    SCOPED_TRACE("pool window " + std::to_string(window));
    Gate gate = random_async_gate(rng, 8, window);
    Tensor reference = reference_output(c, gate);
    run_and_check(c, gate, reference, 16, rng);
    if (window == 3)
      for (int block_size : {64, 256}) run_and_check(c, gate, reference, block_size, rng);
  }
}

TEST(Prefill, AsyncAwkwardLengthsMhaLargeWindows) {
  testing::require_gpu();
  Random rng(22);
  AttentionCase c(rng, kAwkward, 4, 4, 128, /*bf16_exact=*/true);
  for (int window : {3, 4, 5, 8}) {  // 4..8 take the kernel's runtime-window path
    SCOPED_TRACE("pool window " + std::to_string(window));
    Gate gate = random_async_gate(rng, 4, window);
    run_and_check(c, gate, reference_output(c, gate), 32, rng);
  }
}

TEST(Prefill, AsyncHeadDims64And256) {
  testing::require_gpu();
  for (int dim : {64, 256}) {
    SCOPED_TRACE("head_dim " + std::to_string(dim));
    Random rng(23 + dim);
    AttentionCase c(rng, kAwkward, 8, 2, dim, /*bf16_exact=*/true);
    Gate gate = random_async_gate(rng, 8, 3);
    run_and_check(c, gate, reference_output(c, gate), dim == 64 ? 16 : 256, rng);
  }
}

TEST(Prefill, AsyncLongSequencesWithExplicitScale) {
  testing::require_gpu();
  Random rng(24);
  AttentionCase c(rng, {{1000, 1000}, {300, 1333}, {129, 129}}, 4, 2, 128, /*bf16_exact=*/true);
  Gate gate = random_async_gate(rng, 4, 2);
  const float scale = 0.06f;
  run_and_check(c, gate, reference_output(c, gate, scale), 128, rng, scale);
}

// ---- Softmax gate --------------------------------------------------------------------------

TEST(Prefill, SoftmaxAwkwardLengthsGqaWithAndWithoutSoftcap) {
  testing::require_gpu();
  Random rng(31);
  AttentionCase c(rng, kAwkward, 8, 2, 128, /*bf16_exact=*/true);
  for (float softcap : {0.0f, 1.5f}) {
    SCOPED_TRACE("softcap " + std::to_string(softcap));
    Gate gate = Gate::make_softmax(softcap);
    Tensor reference = reference_output(c, gate);
    for (int block_size : {16, 256}) run_and_check(c, gate, reference, block_size, rng);
  }
}

TEST(Prefill, SoftmaxMhaAndHeadDims64And256) {
  testing::require_gpu();
  for (int dim : {64, 128, 256}) {
    SCOPED_TRACE("head_dim " + std::to_string(dim));
    Random rng(32 + dim);
    AttentionCase c(rng, kAwkward, 4, 4, dim, /*bf16_exact=*/true);
    Gate gate = Gate::make_softmax(dim == 256 ? 20.0f : 0.0f);
    run_and_check(c, gate, reference_output(c, gate), dim == 128 ? 32 : dim == 64 ? 256 : 16,
                  rng);
  }
}

TEST(Prefill, SoftmaxLongSequences) {
  testing::require_gpu();
  Random rng(33);
  AttentionCase c(rng, {{1000, 1000}, {300, 1333}, {129, 129}}, 4, 2, 128, /*bf16_exact=*/true);
  Gate gate = Gate::make_softmax();
  run_and_check(c, gate, reference_output(c, gate), 64, rng);
}

// A short prompt after a long cached prefix, the shape the rule splits (16 query tiles for 132
// multiprocessors at 1.7B's 16 heads): 64 new tokens after 4096, both gates.
TEST(Prefill, ShortPromptAfterALongPrefixBothGates) {
  testing::require_gpu();
  Random rng(34);
  AttentionCase c(rng, {{64, 4160}, {1, 700}}, 16, 8, 128, /*bf16_exact=*/true);
  for (const Gate& gate : {random_async_gate(rng, 16, 3), Gate::make_softmax()}) {
    SCOPED_TRACE(gate.kind == GateKind::Async ? "async" : "softmax");
    run_and_check(c, gate, reference_output(c, gate), 64, rng);
  }
}

// Every sequence with at most 64 new tokens: a split tile takes two query heads of one KV head
// when the groups are even (one a consumer), one head otherwise (groups of 1 and 3 here).
TEST(Prefill, ShortQueriesOverLongKeysEveryGroupBothGates) {
  testing::require_gpu();
  const struct {
    int hq, hkv;
  } shapes[] = {{16, 8}, {16, 4}, {32, 4}, {8, 1}, {6, 6}, {12, 4}};
  for (const auto& shape : shapes) {
    SCOPED_TRACE(::testing::Message() << shape.hq << " query heads over " << shape.hkv << " KV heads");
    Random rng(std::uint64_t(50 + shape.hq + shape.hkv));
    AttentionCase c(rng, {{64, 3000}, {17, 1500}, {1, 900}, {40, 40}, {0, 200}}, shape.hq, shape.hkv, 128,
                    /*bf16_exact=*/true);
    for (const Gate& gate : {random_async_gate(rng, shape.hq, 3), Gate::make_softmax()}) {
      SCOPED_TRACE(gate.kind == GateKind::Async ? "async" : "softmax");
      run_and_check(c, gate, reference_output(c, gate), 32, rng);
    }
  }
}

// The portable kernel's head sizes with their keys split: a short prompt after a long prefix at
// SmolLM2's 9 query heads over 3 KV heads of 64 (9 query tiles for the GPU's places), and at
// head_dim 256.
TEST(Prefill, ShortPromptAfterALongPrefixHeadDims64And256) {
  testing::require_gpu();
  const struct {
    int hq, hkv, dim;
  } shapes[] = {{9, 3, 64}, {4, 2, 256}};
  for (const auto& shape : shapes) {
    SCOPED_TRACE(::testing::Message() << shape.hq << " query heads, " << shape.hkv << " KV heads of " << shape.dim);
    Random rng(std::uint64_t(60 + shape.dim));
    AttentionCase c(rng, {{64, 2600}, {5, 900}, {1, 1}}, shape.hq, shape.hkv, shape.dim, /*bf16_exact=*/true);
    for (const Gate& gate : {random_async_gate(rng, shape.hq, 3), Gate::make_softmax()}) {
      SCOPED_TRACE(gate.kind == GateKind::Async ? "async" : "softmax");
      run_and_check(c, gate, reference_output(c, gate), 16, rng);
    }
  }
}

// A varlen batch of many query tiles, many of them past their sequence's end (lengths 1..1100
// with and without prefixes, 16 query heads), both gates, pages of 16 and 128 tokens.
TEST(Prefill, ManyTilesVarlenWithPrefixesBothGates) {
  testing::require_gpu();
  Random rng(71);
  AttentionCase c(rng, {{1100, 1100}, {500, 1600}, {1, 1}, {129, 129}, {0, 7}, {300, 300}, {64, 1000}}, 16, 4, 128,
                  /*bf16_exact=*/true);
  for (const Gate& gate : {random_async_gate(rng, 16, 3), Gate::make_softmax()}) {
    SCOPED_TRACE(gate.kind == GateKind::Async ? "async" : "softmax");
    const Tensor reference = reference_output(c, gate);
    for (int block_size : {16, 128}) run_and_check(c, gate, reference, block_size, rng);
  }
}

// One sequence's overflow stays in it: the second sequence's values are all infinite, and the
// first's output (200 tokens: its last key tile runs on into the second's tokens in the arrays)
// must not see them, though its masked keys' P is 0 (0 times infinity is NaN). Both gates.
TEST(Prefill, AnInfiniteValueStaysInItsSequence) {
  testing::require_gpu();
  Random rng(61);
  AttentionCase c(rng, {{200, 200}, {300, 300}}, 4, 2, 128, /*bf16_exact=*/true);
  const std::int64_t row = std::int64_t(c.num_kv_heads) * c.head_dim;
  std::fill_n(c.value.data_as<float>() + c.cu_seqlens_k[1] * row, c.seqs[1].kv_len * row,
              std::numeric_limits<float>::infinity());
  for (const Gate& gate : {random_async_gate(rng, 4, 3), Gate::make_softmax()}) {
    SCOPED_TRACE(gate.kind == GateKind::Async ? "async" : "softmax");
    run_and_check(c, gate, reference_output(c, gate), 16, rng, 0.0f, c.seqs[0].q_len);
  }
}

// ---- Query heads per KV head that are not a power of two -----------------------------------

// SmolLM2-135M's 9 query heads over 3 KV heads of 64, and groups of 3 and 5 at head_dim 128
// (both kernels): each query head reads its group's KV head, each group's first head writes it.
TEST(Prefill, GroupsOfThreeAndFiveBothGates) {
  testing::require_gpu();
  const struct {
    int hq, hkv, dim;
  } shapes[] = {{9, 3, 64}, {6, 2, 128}, {10, 2, 128}};
  for (const auto& shape : shapes) {
    SCOPED_TRACE(::testing::Message() << shape.hq << " query heads, " << shape.hkv << " KV heads of " << shape.dim);
    Random rng(std::uint64_t(40 + shape.hq + shape.dim));
    AttentionCase c(rng, kAwkward, shape.hq, shape.hkv, shape.dim, /*bf16_exact=*/true);
    for (const Gate& gate : {Gate::make_softmax(), random_async_gate(rng, shape.hq, 3)})
      run_and_check(c, gate, reference_output(c, gate), 16, rng);
  }
}

// An FP8 (e4m3) cache: prefixes read from it, new rows written to it; both gates, head sizes 64
// and 128 (both kernels), GQA groups of 4 and 3, blocks of 16 and 256, a short prompt after a long
// prefix (the keys split).
TEST(PrefillSmall, Fp8CacheHeadDim128) {
  testing::require_gpu();
  Random rng(61);
  AttentionCase c(rng, {{3, 140}, {130, 130}, {1, 129}, {0, 7}}, 4, 2, 128, /*bf16_exact=*/true);
  const Fp8Scales scales = round_prefixes_to_e4m3(c);
  for (const Gate& gate : {random_async_gate(rng, 4, 3), Gate::make_softmax()})
    run_and_check(c, gate, reference_output(c, gate), 16, rng, 0.0f, -1, &scales);
}
TEST(Prefill, Fp8CacheBothGatesHeadDims64And128) {
  testing::require_gpu();
  const struct {
    int hq, hkv, dim;
  } shapes[] = {{8, 2, 128}, {9, 3, 64}};
  for (const auto& shape : shapes) {
    SCOPED_TRACE(::testing::Message() << shape.hq << " query heads, " << shape.hkv << " KV heads of " << shape.dim);
    Random rng(std::uint64_t(62 + shape.dim));
    AttentionCase c(rng, kAwkward, shape.hq, shape.hkv, shape.dim, /*bf16_exact=*/true);
    const Fp8Scales scales = round_prefixes_to_e4m3(c);
    for (const Gate& gate : {random_async_gate(rng, shape.hq, 3), Gate::make_softmax()}) {
      const Tensor reference = reference_output(c, gate);
      for (int block_size : {16, 256}) run_and_check(c, gate, reference, block_size, rng, 0.0f, -1, &scales);
    }
  }
}
TEST(Prefill, Fp8CacheShortPromptAfterALongPrefix) {
  testing::require_gpu();
  Random rng(64);
  AttentionCase c(rng, {{17, 3000}, {64, 2100}}, 16, 8, 128, /*bf16_exact=*/true);
  const Fp8Scales scales = round_prefixes_to_e4m3(c);
  for (const Gate& gate : {random_async_gate(rng, 16, 3), Gate::make_softmax()})
    run_and_check(c, gate, reference_output(c, gate), 64, rng, 0.0f, -1, &scales);
}

// On a Hopper GPU the wgmma kernel must be there (a build without sm_90a code would quietly test
// the portable kernel twice).
// The tile order (tile_order.cuh): every CTA of a grid takes a distinct tile, every tile is taken,
// and a group's tiles come before the next group's, each group heaviest (z = 0) first.
TEST(PrefillTileOrder, EveryTileOnceGroupByGroup) {
  for (const auto [heads, seqs, zs] : {std::tuple{1, 1, 1}, {16, 16, 8}, {3, 5, 7}, {2, 7, 1}, {4, 1, 9}})
    for (int seq_group : {1, 2, 3, 4, seqs, seqs + 5}) {
      SCOPED_TRACE(std::to_string(heads) + " heads, " + std::to_string(seqs) + " sequences, " + std::to_string(zs) +
                   " z, groups of " + std::to_string(seq_group));
      std::vector<int> taken(std::size_t(heads) * seqs * zs, 0);
      int last_group = 0, last_z = 0;
      for (long long linear = 0; linear < (long long)taken.size(); ++linear) {
        const kernels::prefill::GridTile t = kernels::prefill::grid_tile(linear, heads, seqs, zs, seq_group);
        ASSERT_TRUE(t.head_index >= 0 && t.head_index < heads && t.seq >= 0 && t.seq < seqs && t.z >= 0 && t.z < zs)
            << "CTA " << linear;
        ++taken[(std::size_t(t.z) * seqs + t.seq) * heads + t.head_index];
        const int group = t.seq / seq_group;
        EXPECT_TRUE(group > last_group || (group == last_group && t.z >= last_z)) << "CTA " << linear;
        if (group > last_group) last_z = 0;
        last_group = group, last_z = t.z;
      }
      for (std::size_t i = 0; i < taken.size(); ++i) EXPECT_EQ(taken[i], 1) << "tile " << i;
    }
}

TEST(Prefill, HopperKernelRunsOnHopper) {
  testing::require_gpu();
  int device = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), cudaSuccess);
  if (major != 9) GTEST_SKIP() << "not a Hopper GPU";
  EXPECT_TRUE(kernels::prefill_hopper_available());
  // The new tokens' K/V tiles go by tensor copies: the driver takes the maps of the key order.
  DeviceBuffer key(DType::BF16, {1000, 8, 128}), value(DType::BF16, {1000, 8, 128});
  kernels::PrefillParams p;
  p.key = key.as<kernels::bf16>();
  p.value = value.as<kernels::bf16>();
  p.total_q = 1000;
  p.kv.num_kv_heads = 8;
  EXPECT_TRUE(kernels::prefill_hopper_tensor_copies(p));
}

// ---- Bad arguments -------------------------------------------------------------------------

TEST(Prefill, RejectsBadArguments) {
  testing::require_gpu();
  DeviceBuffer dummy(DType::BF16, {1024});
  DeviceBuffer ints(DType::I32, {16});
  DeviceBuffer floats(DType::F32, {16});
  auto valid = [&] {
    kernels::PrefillParams p;
    p.query = p.key = p.value = p.out = dummy.as<kernels::bf16>();
    p.cu_seqlens_q = p.kv_lens = ints.as<std::int32_t>();
    p.num_seqs = 1;
    p.total_q = 4;
    p.max_q_len = 4;
    p.max_kv_len = 4;
    p.num_q_heads = 2;
    p.kv.key_cache = p.kv.value_cache = dummy.as<kernels::bf16>();
    p.kv.block_table = ints.as<std::int32_t>();
    p.kv.max_blocks_per_seq = 1;
    p.kv.num_blocks = 1;
    p.kv.block_size = 16;
    p.kv.num_kv_heads = 1;
    p.kv.head_dim = 64;
    p.gate.kind = GateKind::Async;
    p.gate.alpha = p.gate.sigma = p.gate.gamma = floats.as<float>();
    p.gate.pool_window = 3;
    return p;
  };
  kernels::PrefillParams p = valid();
  p.kv.block_size = 24;
  testing::expect_error([&] { kernels::launch_prefill(p, nullptr); }, "block_size");
  p = valid();
  p.kv.head_dim = 96;
  testing::expect_error([&] { kernels::launch_prefill(p, nullptr); }, "head_dim");
  p = valid();
  p.num_q_heads = 3;
  p.kv.num_kv_heads = 2;
  testing::expect_error([&] { kernels::launch_prefill(p, nullptr); }, "multiple");
  p = valid();
  p.gate.pool_window = 9;
  testing::expect_error([&] { kernels::launch_prefill(p, nullptr); }, "pool window");
  p = valid();
  p.scale = -0.125f;
  testing::expect_error([&] { kernels::launch_prefill(p, nullptr); }, "scale must be");
  p = valid();
  p.max_kv_len = 17;  // one block of 16 tokens
  testing::expect_error([&] { kernels::launch_prefill(p, nullptr); }, "max_kv_len");
  p = valid();
  p.kv.element = kernels::KvElement::Fp8E4M3;
  testing::expect_error([&] { kernels::launch_prefill(p, nullptr); }, "needs its key and value scales");
  p.kv.key_scales = p.kv.value_scales = floats.as<float>();
  p.kv.head_dim = 256;
  testing::expect_error([&] { kernels::launch_prefill(p, nullptr); }, "head_dim 64 and 128");
}

}  // namespace
}  // namespace asynct
