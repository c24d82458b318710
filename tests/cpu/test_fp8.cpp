// FP8 on the CPU: e4m3 rounding (tests/cpu/check_fp8.py also compares it with ml_dtypes), FP8
// weights (quantized on load, saved and loaded as FP8 checkpoints are published, every malformed
// part named), and the FP8 KV cache of the CPU runner (the scale rule holds, the logits stay
// close to a float32 cache's).
#include <cmath>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/fp8.h"
#include "engine/engine.h"
#include "io/safetensors.h"
#include "models/cpu/cpu_model_runner.h"
#include "models/kv_cache_format.h"
#include "models/weights.h"
#include "support/expect_error.h"
#include "support/random.h"
#include "support/temp_dir.h"

namespace asynct {
namespace {

using testing::expect_error;
using testing::TempDir;

TEST(Fp8E4M3, DecodesEveryPattern) {
  EXPECT_EQ(fp8_e4m3_to_float(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(fp8_e4m3_to_float(0x80)));
  EXPECT_EQ(fp8_e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_float(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_e4m3_to_float(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(fp8_e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x39), 1.125f);
  EXPECT_EQ(fp8_e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0xff)));
  // Every finite pattern encodes back to itself, and the values increase with the pattern.
  for (int b = 0; b < 0x7f; ++b) {
    EXPECT_EQ(float_to_fp8_e4m3(fp8_e4m3_to_float(std::uint8_t(b))), b) << b;
    EXPECT_EQ(float_to_fp8_e4m3(fp8_e4m3_to_float(std::uint8_t(b | 0x80))), b | 0x80) << b;
    if (b > 0) {
      EXPECT_LT(fp8_e4m3_to_float(std::uint8_t(b - 1)), fp8_e4m3_to_float(std::uint8_t(b))) << b;
    }
  }
}

TEST(Fp8E4M3, RoundsToNearestEvenAndSaturates) {
  for (int b = 0; b < 0x7e; ++b) {
    const float lo = fp8_e4m3_to_float(std::uint8_t(b)), hi = fp8_e4m3_to_float(std::uint8_t(b + 1));
    const float mid = (lo + hi) / 2;  // exact in float32
    EXPECT_EQ(float_to_fp8_e4m3(mid), (b % 2 == 0) ? b : b + 1) << "midpoint above " << b;
    EXPECT_EQ(float_to_fp8_e4m3(std::nextafter(mid, 0.0f)), b) << b;
    EXPECT_EQ(float_to_fp8_e4m3(std::nextafter(mid, 1e9f)), b + 1) << b;
    EXPECT_EQ(float_to_fp8_e4m3(-mid), ((b % 2 == 0) ? b : b + 1) | 0x80) << b;
  }
  EXPECT_EQ(float_to_fp8_e4m3(460.0f), 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3(1e30f), 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(1.0f, -11)), 0x00);  // a quarter of the smallest subnormal
  EXPECT_TRUE(std::isnan(round_to_fp8_e4m3(NAN)));
  // Tensors convert through it.
  const Tensor t = Tensor::from_vector<float>({1.0f, 1.0625f, -500.0f, 0.3f}, {4}).to(DType::F8E4M3);
  EXPECT_EQ(t.to_float_vector(), (std::vector<float>{1.0f, 1.0f, -448.0f, round_to_fp8_e4m3(0.3f)}));
}

// Every projection quantized in 128 x 128 blocks (as checkpoints are published) or the default
// 1 x 128: each value within e4m3's half step of its block's scale-relative grid; every other
// weight untouched.
TEST(Fp8Weights, QuantizedOnLoadWithinHalfAStep) {
  ModelConfig config = tiny_config(Architecture::Qwen3);
  config.intermediate_size = 320;  // blocks that do not divide the rows: 3 row blocks of 128, 128, 64
  const ModelWeights w = random_weights(config, 3);
  const ModelWeights fine = quantize_fp8(w);
  EXPECT_EQ(fine.config.fp8_block_rows, 1);
  EXPECT_EQ(fine.config.fp8_block_cols, 128);
  EXPECT_EQ(fine.layers[0].gate_proj_scale.shape(), (Shape{320, 1}));
  EXPECT_EQ(fine.layers[0].down_proj_scale.shape(), (Shape{128, 3}));
  const ModelWeights q = quantize_fp8(w, 128, 128);
  ASSERT_TRUE(q.config.fp8_weights());
  EXPECT_EQ(q.layers[0].gate_proj.dtype(), DType::F8E4M3);
  EXPECT_EQ(q.layers[0].gate_proj_scale.shape(), (Shape{3, 1}));
  EXPECT_EQ(q.layers[0].down_proj_scale.shape(), (Shape{1, 3}));
  EXPECT_EQ(q.layers[0].input_layernorm.dtype(), DType::BF16);
  EXPECT_EQ(q.embed_tokens.dtype(), DType::BF16);
  const ModelWeights exact = to_float32(w), dequantized = to_float32(q);
  EXPECT_FALSE(dequantized.config.fp8_weights());
  const std::vector<float> a = exact.layers[1].gate_proj.to_float_vector(), b = dequantized.layers[1].gate_proj.to_float_vector();
  const std::vector<float> scales = q.layers[1].gate_proj_scale.to_float_vector();
  for (std::size_t i = 0; i < a.size(); ++i) {
    const float scale = scales[(i / 128) / 128];  // one column block: [3, 1]
    ASSERT_LE(std::fabs(a[i] - b[i]), std::max(std::fabs(a[i]) / 16, scale * std::ldexp(1.0f, -10))) << i;
  }
  EXPECT_EQ(exact.layers[1].input_layernorm.to_float_vector(), dequantized.layers[1].input_layernorm.to_float_vector());
  const std::vector<float> f = to_float32(fine).layers[1].gate_proj.to_float_vector();
  const std::vector<float> fine_scales = fine.layers[1].gate_proj_scale.to_float_vector();
  for (std::size_t i = 0; i < a.size(); ++i)
    ASSERT_LE(std::fabs(a[i] - f[i]), std::max(std::fabs(a[i]) / 16, fine_scales[i / 128] * std::ldexp(1.0f, -10))) << i;
}

// An FP8 checkpoint as Qwen publishes them: F8_E4M3 projections with float32 weight_scale_inv
// and config.json's quantization_config; it loads back bit for bit and runs as the weights it holds.
TEST(Fp8Weights, CheckpointRoundTripsAndRuns) {
  TempDir dir;
  const ModelWeights q = quantize_fp8(random_weights(tiny_config(Architecture::AsyncT), 4), 128, 128);
  save_checkpoint(q, dir.path().string());
  const nlohmann::json config = nlohmann::json::parse(std::ifstream(dir.file("config.json")));
  EXPECT_EQ(config["quantization_config"]["quant_method"], "fp8");
  EXPECT_EQ(config["quantization_config"]["weight_block_size"], nlohmann::json({128, 128}));
  auto file = SafetensorsFile::open(dir.file("model.safetensors"));
  EXPECT_EQ(file->info("model.layers.0.self_attn.q_proj.weight").dtype, DType::F8E4M3);
  EXPECT_EQ(file->info("model.layers.0.self_attn.q_proj.weight_scale_inv").dtype, DType::F32);
  file.reset();
  const ModelWeights loaded = load_weights(dir.path().string());
  EXPECT_EQ(loaded.config.fp8_block_rows, 128);
  EXPECT_EQ(loaded.layers[1].down_proj.dtype(), DType::F8E4M3);
  EXPECT_EQ(std::memcmp(loaded.layers[1].down_proj.data(), q.layers[1].down_proj.data(), std::size_t(q.layers[1].down_proj.numel())), 0);
  EXPECT_EQ(loaded.layers[1].down_proj_scale.to_float_vector(), q.layers[1].down_proj_scale.to_float_vector());

  // The same tokens from the loaded checkpoint as from the weights it was saved from.
  const auto generate = [](ModelWeights w) {
    Engine engine(std::make_unique<CpuModelRunner>(std::move(w), 8, 16), 256);
    Request r;
    r.prompt = {5, 17, 99, 3};
    r.max_tokens = 6;
    engine.add_request(r);
    return engine.run_to_completion()[0].tokens;
  };
  EXPECT_EQ(generate(loaded), generate(q));
}

TEST(Fp8Weights, MalformedCheckpointsAreNamed) {
  TempDir dir;
  save_checkpoint(quantize_fp8(random_weights(tiny_config(Architecture::Qwen3), 6), 128, 128), dir.path().string());
  auto original = SafetensorsFile::open(dir.file("model.safetensors"));
  std::map<std::string, Tensor> tensors;
  for (const std::string& name : original->names()) tensors[name] = original->tensor(name).to(original->info(name).dtype);
  original.reset();
  const std::string config_text = [&] {
    std::ifstream in(dir.file("config.json"));
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  const auto rewrite = [&](const std::map<std::string, Tensor>& t) { write_safetensors(dir.file("model.safetensors"), t); };
  const auto with_config = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(config_text);
    edit(j);
    std::ofstream(dir.file("config.json")) << j.dump();
  };
  const std::string scale = "model.layers.1.mlp.up_proj.weight_scale_inv";

  auto missing = tensors;
  missing.erase(scale);
  rewrite(missing);
  expect_error([&] { load_weights(dir.path().string()); }, "missing tensor '" + scale + "'");

  auto misshapen = tensors;
  misshapen[scale] = Tensor::from_vector<float>({1, 1}, {1, 2});
  rewrite(misshapen);
  expect_error([&] { load_weights(dir.path().string()); }, "'" + scale + "' has shape [1, 2], the config implies [2, 1]");

  auto not_finite = tensors;
  not_finite[scale] = Tensor::from_vector<float>({0.01f, INFINITY}, {2, 1});
  rewrite(not_finite);
  expect_error([&] { load_weights(dir.path().string()); }, "'" + scale + "' holds a non-finite value at element 1");

  auto negative = tensors;
  negative[scale] = Tensor::from_vector<float>({0.01f, -1.0f}, {2, 1});
  rewrite(negative);
  expect_error([&] { load_weights(dir.path().string()); }, "'" + scale + "' holds the scale -1");

  auto nan_weight = tensors;
  Tensor bad = Tensor::empty(DType::F8E4M3, tensors["model.layers.0.self_attn.o_proj.weight"].shape());
  std::memset(bad.data(), 0, std::size_t(bad.numel()));
  bad.data_as<fp8_e4m3_bits>()[5].bits = 0x7f;
  nan_weight["model.layers.0.self_attn.o_proj.weight"] = bad;
  rewrite(nan_weight);
  expect_error([&] { load_weights(dir.path().string()); }, "'model.layers.0.self_attn.o_proj.weight' holds a non-finite value at element 5");

  auto bf16_projection = tensors;
  bf16_projection["model.layers.0.self_attn.o_proj.weight"] = Tensor::empty(DType::BF16, bad.shape());
  rewrite(bf16_projection);
  expect_error([&] { load_weights(dir.path().string()); }, "is stored as bfloat16; the config's quantization_config (fp8)");

  rewrite(tensors);
  EXPECT_NO_THROW(load_weights(dir.path().string()));
  with_config([](nlohmann::json& j) { j["quantization_config"]["quant_method"] = "gptq"; });
  expect_error([&] { load_weights(dir.path().string()); }, "quant_method 'gptq' is not supported (fp8)");
  with_config([](nlohmann::json& j) { j["quantization_config"]["fmt"] = "e5m2"; });
  expect_error([&] { load_weights(dir.path().string()); }, "fmt 'e5m2' is not supported");
  with_config([](nlohmann::json& j) { j["quantization_config"]["activation_scheme"] = "static"; });
  expect_error([&] { load_weights(dir.path().string()); }, "activation_scheme 'static' is not supported");
  with_config([](nlohmann::json& j) { j["quantization_config"].erase("weight_block_size"); });
  expect_error([&] { load_weights(dir.path().string()); }, "per-tensor FP8 scales are not supported");
  with_config([](nlohmann::json& j) { j["quantization_config"]["modules_to_not_convert"] = {"model.layers.0.mlp.down_proj"}; });
  expect_error([&] { load_weights(dir.path().string()); }, "modules_to_not_convert");
  // Scales without the config that gives them a meaning.
  with_config([](nlohmann::json& j) { j.erase("quantization_config"); });
  expect_error([&] { load_weights(dir.path().string()); }, "an FP8 weight's scales, but config.json has no fp8 quantization_config");
}

// The FP8 KV-cache scales: a checkpoint's k_scale / v_scale (one value or one a KV head, for
// every layer), else the bound from the weights.
TEST(Fp8KvCache, CheckpointScalesAreReadAndChecked) {
  TempDir dir;
  const ModelConfig config = tiny_config(Architecture::Qwen3);  // 2 layers, 2 KV heads
  save_checkpoint(random_weights(config, 7), dir.path().string());
  auto original = SafetensorsFile::open(dir.file("model.safetensors"));
  std::map<std::string, Tensor> tensors;
  for (const std::string& name : original->names()) tensors[name] = original->tensor(name).to(original->info(name).dtype);
  original.reset();
  const auto rewrite = [&](const std::map<std::string, Tensor>& t) { write_safetensors(dir.file("model.safetensors"), t); };

  auto with = tensors;
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    with[p + "k_scale"] = Tensor::from_vector<float>({0.5f + float(l)}, {});
    with[p + "v_scale"] = Tensor::from_vector<float>({0.25f, 0.125f}, {2});
  }
  rewrite(with);
  const ModelWeights w = load_weights(dir.path().string());
  const KvCacheScales s = kv_cache_scales(w, KvCacheDtype::Fp8E4M3);
  EXPECT_EQ(s.key, (std::vector<float>{0.5f, 0.5f, 1.5f, 1.5f}));
  EXPECT_EQ(s.value, (std::vector<float>{0.25f, 0.125f, 0.25f, 0.125f}));
  EXPECT_EQ(kv_cache_scales(w, KvCacheDtype::BF16).key, (std::vector<float>(4, 1.0f)));

  auto one_layer = with;
  one_layer.erase("model.layers.1.self_attn.v_scale");
  rewrite(one_layer);
  expect_error([&] { load_weights(dir.path().string()); }, "missing tensor 'model.layers.1.self_attn.v_scale'");
  auto misshapen = with;
  misshapen["model.layers.1.self_attn.k_scale"] = Tensor::from_vector<float>({1, 1, 1}, {3});
  rewrite(misshapen);
  expect_error([&] { load_weights(dir.path().string()); }, "'model.layers.1.self_attn.k_scale' has shape [3]");
  auto zero = with;
  zero["model.layers.0.self_attn.k_scale"] = Tensor::from_vector<float>({0.0f}, {1});
  rewrite(zero);
  expect_error([&] { load_weights(dir.path().string()); }, "holds the scale 0");
}

// The CPU runner's cache keys and values, float32 [blocks, block_size, Hkv, D] per layer.
struct CachedKv {
  std::vector<std::vector<float>> keys, values;
};

// The bound rule holds: after a prompt of many tokens (the inputs' norms vary most), no cached
// key or value needs more than 448 of its scale, and each is e4m3 times the scale; the logits
// stay within a few percent of a float32 cache's, for every architecture.
TEST(Fp8KvCache, TheBoundHoldsAndLogitsStayClose) {
  for (const Architecture arch : {Architecture::Qwen3, Architecture::AsyncT, Architecture::Llama}) {
    SCOPED_TRACE(tiny_config(arch).architecture_name());
    const ModelWeights weights = random_weights(tiny_config(arch), 11);
    const KvCacheScales scales = kv_cache_scales(weights, KvCacheDtype::Fp8E4M3);
    StepBatch batch;
    batch.reset(1);
    for (int t = 0; t < 96; ++t) {
      batch.tokens.push_back((t * 37) % 256);
      batch.positions.push_back(t);
      batch.slot_mapping.push_back(t);
    }
    batch.cu_seqlens_q = {0, 96};
    batch.kv_lens = {96};
    batch.block_tables[0] = {0, 1, 2, 3, 4, 5};
    for (int t = 0; t < 96; t += 19) {
      batch.logit_rows.push_back(t);
      batch.sampling.push_back({});
      batch.full_logits.push_back(1);
    }
    CpuModelRunner fp8(weights, 6, 16, KvCacheDtype::Fp8E4M3), exact(weights, 6, 16);
    const StepOutput& a = fp8.forward(batch);
    std::vector<std::vector<float>> fp8_logits;
    for (const float* row : a.logits) fp8_logits.emplace_back(row, row + 256);
    const StepOutput& b = exact.forward(batch);
    double err = 0, norm = 0;
    for (std::size_t r = 0; r < b.logits.size(); ++r)
      for (int v = 0; v < 256; ++v) {
        err += std::pow(double(fp8_logits[r][std::size_t(v)]) - b.logits[r][v], 2);
        norm += std::pow(double(b.logits[r][v]), 2);
      }
    EXPECT_LT(std::sqrt(err / norm), 0.05);
    const ModelConfig& c = weights.config;
    for (int l = 0; l < c.num_hidden_layers; ++l)
      for (const bool key : {true, false}) {
        const float* cache = (key ? fp8.key_cache(l) : fp8.value_cache(l)).data_as<float>();
        for (int slot = 0; slot < 96; ++slot)
          for (int h = 0; h < c.num_key_value_heads; ++h) {
            const float scale = key ? scales.key_scale(l, h) : scales.value_scale(l, h);
            for (int i = 0; i < c.head_dim; ++i) {
              const float x = cache[(std::int64_t(slot) * c.num_key_value_heads + h) * c.head_dim + i];
              ASSERT_LE(std::fabs(x / scale), 448.0f) << "layer " << l << (key ? " key" : " value") << " head " << h;
              ASSERT_EQ(round_to_fp8_e4m3(x / scale) * scale, x);
            }
          }
      }
  }
}

TEST(Fp8KvCache, OptionsAreChecked) {
  expect_error([] { resolve_kv_cache_dtype("int8", "cpu"); }, "--kv-cache-dtype must be auto, bf16 or fp8, got 'int8'");
  EXPECT_EQ(resolve_kv_cache_dtype("fp8", "cuda"), KvCacheDtype::Fp8E4M3);
  EXPECT_EQ(resolve_kv_cache_dtype("fp8", "cpu"), KvCacheDtype::Fp8E4M3);
  EXPECT_EQ(resolve_kv_cache_dtype("auto", "cpu-reference"), KvCacheDtype::Float32);
  EXPECT_EQ(resolve_kv_cache_dtype("auto", "cpu"), KvCacheDtype::BF16);
  EXPECT_EQ(resolve_kv_cache_dtype("auto", "cuda"), KvCacheDtype::BF16);
  const ModelConfig c = tiny_config(Architecture::Qwen3);
  EXPECT_EQ(kv_cache_bytes_per_token(c, KvCacheDtype::Fp8E4M3, "cuda") * 2, kv_cache_bytes_per_token(c, KvCacheDtype::BF16, "cuda"));
  EXPECT_EQ(kv_cache_bytes_per_token(c, KvCacheDtype::Fp8E4M3, "cpu-reference"),
            kv_cache_bytes_per_token(c, KvCacheDtype::Float32, "cpu-reference"));
  EXPECT_EQ(kv_cache_bytes_per_token(c, KvCacheDtype::BF16, "cpu"), kv_cache_bytes_per_token(c, KvCacheDtype::BF16, "cuda"));
}

}  // namespace
}  // namespace asynct
