// LlamaForCausalLM: its config.json (what is read, HF's defaults, and what is refused with an
// error naming it), its checkpoints (no q/k norm tensors), and the CPU runner on the tiny Llama
// (3 query heads per KV head) against a plain transcription of HF's Llama forward in double,
// through prefill, chunked prefill and decode steps.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "io/safetensors.h"
#include "models/architecture.h"
#include "models/cpu/cpu_model_runner.h"
#include "models/weights.h"
#include "support/compare.h"
#include "support/expect_error.h"
#include "support/temp_dir.h"

namespace asynct {
namespace {

using testing::close_to;
using testing::expect_error;
using testing::TempDir;

// SmolLM2-135M-Instruct's config.json as published (HuggingFaceTB), transformers.js's entry left out.
constexpr const char* kSmolLm2Config = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 1, "eos_token_id": 2, "head_dim": 64, "hidden_act": "silu", "hidden_size": 576,
  "initializer_range": 0.041666666666666664, "intermediate_size": 1536, "is_llama_config": true,
  "max_position_embeddings": 8192, "mlp_bias": false, "model_type": "llama", "num_attention_heads": 9,
  "num_hidden_layers": 30, "num_key_value_heads": 3, "pad_token_id": 2, "pretraining_tp": 1,
  "rms_norm_eps": 1e-05, "rope_interleaved": false, "rope_scaling": null, "rope_theta": 100000,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.42.3",
  "use_cache": true, "vocab_size": 49152})";

// A config.json of `text` with `change` applied, loaded.
ModelConfig load_edited(const TempDir& dir, const std::string& text, const std::function<void(nlohmann::json&)>& change) {
  nlohmann::json j = nlohmann::json::parse(text);
  change(j);
  std::ofstream(dir.file("config.json")) << j.dump(1);
  return load_config(dir.file("config.json"));
}

TEST(LlamaConfig, SmolLm2ConfigLoads) {
  TempDir dir;
  const ModelConfig c = load_edited(dir, kSmolLm2Config, [](nlohmann::json&) {});
  EXPECT_EQ(c.architecture, Architecture::Llama);
  EXPECT_EQ(c.architecture_name(), "LlamaForCausalLM");
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_hidden_layers, 30);
  EXPECT_EQ(c.num_attention_heads, 9);
  EXPECT_EQ(c.num_key_value_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.rope_theta, 100000.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, std::vector<std::int32_t>({2}));
  EXPECT_EQ(c.parameter_count(), 134515008);  // HF's count for SmolLM2-135M
  const ArchitectureRecipe r = recipe_of(c);
  EXPECT_FALSE(r.qk_norm);
  EXPECT_EQ(r.gate, GateKind::Softmax);
  EXPECT_EQ(r.norm, NormKind::Rms);
  EXPECT_FALSE(r.peri_ln);
}

// A key the file leaves out takes HF LlamaConfig's default; model_type alone names the
// architecture when `architectures` is absent.
TEST(LlamaConfig, DefaultsAndModelType) {
  TempDir dir;
  const ModelConfig c = load_edited(dir, kSmolLm2Config, [](nlohmann::json& j) {
    for (const char* key : {"rope_theta", "max_position_embeddings", "tie_word_embeddings", "head_dim", "architectures",
                            "rope_scaling", "attention_bias", "mlp_bias", "hidden_act"})
      j.erase(key);
  });
  EXPECT_EQ(c.architecture, Architecture::Llama);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.head_dim, 576 / 9);
  expect_error([&] { load_edited(dir, kSmolLm2Config, [](nlohmann::json& j) { j.erase("architectures"); j["model_type"] = "mistral"; }); },
               "model_type 'mistral' is not supported (qwen3, asynct, llama)");
  expect_error([&] { load_edited(dir, kSmolLm2Config, [](nlohmann::json& j) { j.erase("architectures"); j.erase("model_type"); }); },
               "names no architecture");
  expect_error([&] { load_edited(dir, kSmolLm2Config, [](nlohmann::json& j) { j["architectures"] = {"MistralForCausalLM"}; }); },
               "architecture 'MistralForCausalLM' is not supported (Qwen3ForCausalLM, AsyncTForCausalLM, LlamaForCausalLM)");
}

// What the engine does not compute is refused with the key and its value named.
TEST(LlamaConfig, UnsupportedFeaturesAreNamed) {
  TempDir dir;
  const struct {
    std::function<void(nlohmann::json&)> change;
    std::string message;
  } cases[] = {
      {[](nlohmann::json& j) { j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}}; },
       R"(rope_scaling {"factor":8.0,"rope_type":"llama3"} is not supported (only unscaled RoPE))"},
      {[](nlohmann::json& j) { j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; }, "rope_scaling {\"factor\":2.0,\"type\":\"linear\"}"},
      {[](nlohmann::json& j) { j["attention_bias"] = true; }, "attention_bias true is not supported"},
      {[](nlohmann::json& j) { j["mlp_bias"] = true; }, "mlp_bias true is not supported"},
      {[](nlohmann::json& j) { j["attention_bias"] = "no"; }, "'attention_bias' has the wrong type"},
      {[](nlohmann::json& j) { j["hidden_act"] = "gelu"; }, "hidden_act 'gelu' is not supported (silu)"},
      {[](nlohmann::json& j) { j["hidden_act"] = 3; }, "'hidden_act' has the wrong type"},
      {[](nlohmann::json& j) { j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e4}}; },
       "rope_parameters {\"rope_theta\":10000.0,\"rope_type\":\"yarn\"} is not supported (only rope_type 'default')"},
      {[](nlohmann::json& j) { j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", "big"}}; },
       "'rope_theta' has the wrong type"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.message);
    expect_error([&] { load_edited(dir, kSmolLm2Config, c.change); }, c.message);
    expect_error([&] { load_edited(dir, kSmolLm2Config, c.change); }, "config.json");
  }
  expect_error([&] { load_edited(dir, kSmolLm2Config, [](nlohmann::json& j) { j["num_key_value_heads"] = 4; }); },
               "LlamaForCausalLM config: num_attention_heads (9) must be a multiple of num_key_value_heads (4)");
  // Null and false are what HF writes for "none"; transformers 5's rope_parameters carry rope_theta.
  EXPECT_NO_THROW(load_edited(dir, kSmolLm2Config, [](nlohmann::json& j) { j["rope_scaling"] = nullptr; j["mlp_bias"] = false; }));
  const ModelConfig v5 = load_edited(dir, kSmolLm2Config, [](nlohmann::json& j) {
    j.erase("rope_theta");
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 50000.0}};
  });
  EXPECT_EQ(v5.rope_theta, 50000.0);
}

// Qwen3 and AsyncT configs are held to the same rules.
TEST(LlamaConfig, OtherArchitecturesRefuseTheSameFeatures) {
  for (Architecture arch : {Architecture::Qwen3, Architecture::AsyncT}) {
    TempDir dir;
    const std::string text = config_to_json(tiny_config(arch));
    EXPECT_NO_THROW(load_edited(dir, text, [](nlohmann::json&) {}));
    expect_error([&] { load_edited(dir, text, [](nlohmann::json& j) { j["attention_bias"] = true; }); },
                 "attention_bias true is not supported");
    expect_error([&] { load_edited(dir, text, [](nlohmann::json& j) { j["hidden_act"] = "relu"; }); },
                 "hidden_act 'relu' is not supported");
  }
}

TEST(LlamaConfig, BuiltInTinyLlamaHasAGroupOfThree) {
  const ModelConfig c = tiny_config(Architecture::Llama);
  EXPECT_EQ(c.num_attention_heads / c.num_key_value_heads, 3);
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(architecture_from_name("llama"), Architecture::Llama);
  expect_error([] { architecture_from_name("mistral"); }, "architecture 'mistral' is not one of qwen3, asynct, llama");
  EXPECT_EQ(builtin_config(Architecture::Llama, "1.7b").architecture, Architecture::Llama);
  // Every tensor the model has is counted once.
  std::int64_t tensors = 0;
  for (const auto& [name, shape] : expected_tensors(c)) {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    tensors += n;
  }
  EXPECT_EQ(tensors, c.parameter_count());
}

// ---- Checkpoints ----------------------------------------------------------------------------

std::map<std::string, Tensor> tensors_of(const std::string& file) {
  auto f = SafetensorsFile::open(file);
  std::map<std::string, Tensor> out;
  for (const std::string& name : f->names()) out[name] = f->tensor(name).to(f->info(name).dtype);
  return out;
}

TEST(LlamaCheckpoint, SavedModelLoadsBackWithoutQkNorms) {
  for (bool tied : {false, true}) {
    TempDir dir;
    ModelConfig config = tiny_config(Architecture::Llama);
    config.tie_word_embeddings = tied;
    const ModelWeights w = random_weights(config, 3);
    EXPECT_FALSE(w.layers[0].q_norm.defined());
    write_random_checkpoint(config, 3, dir.dir());
    const std::map<std::string, Tensor> saved = tensors_of(dir.file("model.safetensors"));
    for (const auto& [name, t] : saved) EXPECT_EQ(name.find("_norm.weight") != std::string::npos &&
                                                      name.find("self_attn") != std::string::npos,
                                                  false)
        << name;
    EXPECT_EQ(saved.count("lm_head.weight"), tied ? 0u : 1u);
    const ModelWeights loaded = load_weights(dir.dir());
    EXPECT_EQ(loaded.config.architecture, Architecture::Llama);
    EXPECT_EQ(loaded.config.tie_word_embeddings, tied);
    EXPECT_EQ(loaded.layers[1].k_proj.to_float_vector(), w.layers[1].k_proj.to_float_vector());
    EXPECT_EQ(loaded.lm_head.to_float_vector(), w.lm_head.to_float_vector());
    std::ifstream in(dir.file("config.json"));
    const nlohmann::json j = nlohmann::json::parse(in);
    EXPECT_EQ(j["model_type"], "llama");
    EXPECT_TRUE(j["rope_scaling"].is_null());
  }
}

// A missing tensor and a tensor Llama does not have (a q/k norm) are both named.
TEST(LlamaCheckpoint, MissingAndUnexpectedTensorsAreNamed) {
  TempDir dir;
  write_random_checkpoint(tiny_config(Architecture::Llama), 4, dir.dir());
  const std::map<std::string, Tensor> tensors = tensors_of(dir.file("model.safetensors"));
  auto missing = tensors;
  missing.erase("model.layers.1.self_attn.v_proj.weight");
  write_safetensors(dir.file("model.safetensors"), missing);
  expect_error([&] { load_weights(dir.dir()); }, "missing tensor 'model.layers.1.self_attn.v_proj.weight'");
  auto extra = tensors;
  extra["model.layers.0.self_attn.q_norm.weight"] = Tensor::empty(DType::BF16, {64});
  write_safetensors(dir.file("model.safetensors"), extra);
  expect_error([&] { load_weights(dir.dir()); },
               "unexpected tensor 'model.layers.0.self_attn.q_norm.weight' in " + dir.file("model.safetensors") +
                   " (not part of LlamaForCausalLM with this config)");
}

// ---- The CPU runner against HF's Llama forward ----------------------------------------------

// HF LlamaForCausalLM's forward written out for one sequence in double, no cache: RMSNorm,
// q/k/v, neox RoPE (rotate_half), causal softmax attention with query head h reading KV head
// h / (Hq / Hkv), o, SwiGLU MLP, final norm, LM head. Returns the logits of every position.
std::vector<std::vector<double>> llama_forward(const ModelWeights& w, const std::vector<std::int32_t>& tokens) {
  const ModelConfig& c = w.config;
  const std::size_t T = tokens.size(), H = std::size_t(c.hidden_size), Hq = std::size_t(c.num_attention_heads),
                    Hkv = std::size_t(c.num_key_value_heads), D = std::size_t(c.head_dim),
                    I = std::size_t(c.intermediate_size), group = Hq / Hkv;
  using Rows = std::vector<std::vector<double>>;
  auto values = [](const Tensor& t) {
    const std::vector<float> f = t.to_float_vector();
    return std::vector<double>(f.begin(), f.end());
  };
  auto rms_norm = [&](const std::vector<double>& x, const Tensor& weight) {
    const std::vector<double> g = values(weight);
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / double(x.size()) + double(c.rms_norm_eps));
    std::vector<double> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = g[i] * x[i] * inv;
    return y;
  };
  auto matvec = [](const Tensor& weight, const std::vector<double>& x) {  // weight [out, in]
    const std::vector<float> m = weight.to_float_vector();
    const std::size_t in = x.size(), out = m.size() / in;
    std::vector<double> y(out, 0.0);
    for (std::size_t o = 0; o < out; ++o)
      for (std::size_t i = 0; i < in; ++i) y[o] += double(m[o * in + i]) * x[i];
    return y;
  };
  auto rope = [&](std::vector<double>& x, std::size_t heads, std::size_t position) {
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t i = 0; i < D / 2; ++i) {
        const double angle = double(position) / std::pow(c.rope_theta, 2.0 * double(i) / double(D));
        const double a = x[h * D + i], b = x[h * D + i + D / 2];
        x[h * D + i] = a * std::cos(angle) - b * std::sin(angle);
        x[h * D + i + D / 2] = b * std::cos(angle) + a * std::sin(angle);
      }
  };
  const std::vector<double> embed = values(w.embed_tokens);
  Rows x;
  for (std::int32_t token : tokens)
    x.emplace_back(embed.begin() + std::ptrdiff_t(std::size_t(token) * H), embed.begin() + std::ptrdiff_t(std::size_t(token + 1) * H));
  for (const LayerWeights& l : w.layers) {
    Rows q, k, v;
    for (std::size_t t = 0; t < T; ++t) {
      const std::vector<double> h = rms_norm(x[t], l.input_layernorm);
      q.push_back(matvec(l.q_proj, h));
      k.push_back(matvec(l.k_proj, h));
      v.push_back(matvec(l.v_proj, h));
      rope(q[t], Hq, t);
      rope(k[t], Hkv, t);
    }
    for (std::size_t t = 0; t < T; ++t) {
      std::vector<double> attn(Hq * D, 0.0);
      for (std::size_t hq = 0; hq < Hq; ++hq) {
        const std::size_t hkv = hq / group;
        std::vector<double> p(t + 1);
        double top = -1e300;
        for (std::size_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (std::size_t d = 0; d < D; ++d) dot += q[t][hq * D + d] * k[j][hkv * D + d];
          p[j] = dot / std::sqrt(double(D));
          top = std::max(top, p[j]);
        }
        double sum = 0;
        for (double& e : p) sum += (e = std::exp(e - top));
        for (std::size_t j = 0; j <= t; ++j)
          for (std::size_t d = 0; d < D; ++d) attn[hq * D + d] += p[j] / sum * v[j][hkv * D + d];
      }
      const std::vector<double> o = matvec(l.o_proj, attn);
      for (std::size_t i = 0; i < H; ++i) x[t][i] += o[i];
      const std::vector<double> h = rms_norm(x[t], l.post_attention_layernorm);
      const std::vector<double> gate = matvec(l.gate_proj, h), up = matvec(l.up_proj, h);
      std::vector<double> act(I);
      for (std::size_t i = 0; i < I; ++i) act[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
      const std::vector<double> down = matvec(l.down_proj, act);
      for (std::size_t i = 0; i < H; ++i) x[t][i] += down[i];
    }
  }
  Rows logits;
  for (std::size_t t = 0; t < T; ++t) logits.push_back(matvec(w.lm_head, rms_norm(x[t], w.norm)));
  return logits;
}

// Tokens [begin, end) of one sequence in block table {0, 1, ...}, every row's logits asked for.
StepBatch sequence_step(const std::vector<std::int32_t>& tokens, int begin, int end, int block_size) {
  StepBatch b;
  b.cu_seqlens_q = {0, end - begin};
  b.kv_lens = {end};
  std::vector<int> table;
  for (int i = 0; i * block_size < end; ++i) table.push_back(i);
  b.block_tables = {table};
  for (int pos = begin; pos < end; ++pos) {
    b.tokens.push_back(tokens[std::size_t(pos)]);
    b.positions.push_back(pos);
    b.slot_mapping.push_back(pos);
    b.logit_rows.push_back(pos - begin);
    b.full_logits.push_back(1);
    b.sampling.emplace_back();  // greedy
  }
  return b;
}

std::vector<float> as_floats(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

// One prompt of 23 tokens: a prefill of 9, a chunk of 10, then 4 decode steps, each row's
// logits against the transcription. Tied and untied embeddings; block size 4 crosses blocks.
TEST(LlamaCpuRunner, MatchesHfLlamaForwardThroughPrefillChunksAndDecode) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied embeddings" : "untied embeddings");
    ModelConfig config = tiny_config(Architecture::Llama);
    config.tie_word_embeddings = tied;
    config.rope_theta = 100000.0;
    const ModelWeights w = random_weights(config, 17);
    std::vector<std::int32_t> tokens;
    for (int t = 0; t < 23; ++t) tokens.push_back((t * 53 + 11) % config.vocab_size);
    const auto expected = llama_forward(w, tokens);
    CpuModelRunner runner(w, 8, 4);
    int position = 0;
    for (int end : {9, 19, 20, 21, 22, 23}) {
      const StepOutput& out = runner.forward(sequence_step(tokens, position, end, 4));
      for (int pos = position; pos < end; ++pos) {
        const float* row = out.logits[std::size_t(pos - position)];
        const std::vector<float> got(row, row + config.vocab_size);
        EXPECT_TRUE(close_to(got, as_floats(expected[std::size_t(pos)]), 1e-5)) << "position " << pos;
      }
      position = end;
    }
  }
}

// The engine on the tiny Llama: batching, chunked prefill and preemption change nothing.
TEST(LlamaEngine, BatchingChunkingAndPreemptionChangeNothing) {
  const ModelWeights w = random_weights(tiny_config(Architecture::Llama), 7);
  auto generate = [&](int num_blocks, int block_size, int budget, const std::vector<Request>& rs, EngineStats* stats) {
    EngineOptions o;
    o.max_num_batched_tokens = budget;
    o.max_model_len = 1024;
    Engine e(std::make_unique<CpuModelRunner>(w, num_blocks, block_size), w.config.vocab_size, o);
    for (const Request& r : rs) e.add_request(r);
    std::vector<std::vector<std::int32_t>> out;
    for (const RequestOutput& r : e.run_to_completion()) out.push_back(r.tokens);
    if (stats) *stats = e.stats();
    return out;
  };
  std::vector<Request> rs;
  for (const std::vector<std::int32_t>& prompt : std::vector<std::vector<std::int32_t>>{
           {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21}, {42}, {7, 7, 7, 250, 0}}) {
    Request r;
    r.prompt = prompt;
    r.max_tokens = 12;
    rs.push_back(r);
  }
  EngineStats stats;
  const auto batched = generate(64, 16, 2048, rs, nullptr);
  for (std::size_t i = 0; i < rs.size(); ++i) EXPECT_EQ(generate(64, 16, 2048, {rs[i]}, nullptr)[0], batched[i]) << i;
  EXPECT_EQ(generate(64, 16, 5, rs, &stats), batched);
  EXPECT_GT(stats.steps, 10);
  EXPECT_EQ(generate(5, 8, 2048, rs, &stats), batched);
  EXPECT_GT(stats.preemptions, 0);
}

}  // namespace
}  // namespace asynct
