// Checkpoints: a saved model loads back to the same weights (and the same generations), and
// every kind of malformed file or config is a clear error naming the file and the tensor.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "io/safetensors.h"
#include "models/cpu/cpu_model_runner.h"
#include "models/weights.h"
#include "support/expect_error.h"
#include "support/temp_dir.h"

namespace asynct {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

using testing::TempDir;

// A safetensors file from a raw header and data.
void write_raw(const std::string& path, const std::string& header, const std::string& data,
               std::uint64_t claimed_len = 0) {
  std::ofstream out(path, std::ios::binary);
  std::uint64_t len = claimed_len ? claimed_len : header.size();
  for (int i = 0; i < 8; ++i) out.put(char((len >> (8 * i)) & 0xff));
  out << header << data;
}

TEST(Safetensors, RoundTripsTensorsOfEveryDtype) {
  TempDir dir;
  std::map<std::string, Tensor> tensors = {
      {"a", Tensor::from_vector<float>({1.5f, -2, 3}, {3})},
      {"b", Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2}).to(DType::BF16)},
      {"c", Tensor::from_vector<std::int32_t>({7, -8}, {2})},
      {"empty", Tensor::empty(DType::F32, {0, 4})}};
  write_safetensors(dir.file("t.safetensors"), tensors);
  auto f = SafetensorsFile::open(dir.file("t.safetensors"));
  EXPECT_EQ(f->names().size(), 4u);
  EXPECT_EQ(f->tensor("a").to_float_vector(), (std::vector<float>{1.5f, -2, 3}));
  EXPECT_EQ(f->tensor("b").to_float_vector(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(f->tensor("b").shape(), (Shape{2, 2}));
  EXPECT_EQ(f->tensor("c").at<std::int32_t>(1), -8);
  EXPECT_EQ(f->tensor("empty").numel(), 0);
}

TEST(Safetensors, MalformedFilesGiveClearErrors) {
  TempDir dir;
  const std::string p = dir.file("bad.safetensors");
  const std::string ok_entry = R"("x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string data(8, '\0');

  write_raw(p, "{}", "");
  EXPECT_NO_THROW(SafetensorsFile::open(p));
  { std::ofstream(p, std::ios::binary) << "abc"; }
  expect_error([&] { SafetensorsFile::open(p); }, "too short for a header length");
  write_raw(p, "{" + ok_entry + "}", data, 1000);
  expect_error([&] { SafetensorsFile::open(p); }, "header length 1000 runs past the end");
  write_raw(p, "{" + ok_entry + "}", data, 1ull << 40);
  expect_error([&] { SafetensorsFile::open(p); }, "over the format's limit");
  write_raw(p, "{\"x\": [", data);
  expect_error([&] { SafetensorsFile::open(p); }, "not valid JSON");
  write_raw(p, R"({"x":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", data);
  expect_error([&] { SafetensorsFile::open(p); }, "tensor 'x': unsupported dtype Q4");
  write_raw(p, R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data);
  expect_error([&] { SafetensorsFile::open(p); }, "F32[3] needs 12 bytes but data_offsets hold 8");
  write_raw(p, R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", data);
  expect_error([&] { SafetensorsFile::open(p); }, "data_offsets end 16 is past the 8-byte data section");
  write_raw(p, R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", data);
  expect_error([&] { SafetensorsFile::open(p); }, "run backwards");
  write_raw(p, R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data);
  expect_error([&] { SafetensorsFile::open(p); }, "non-negative integers");
  write_raw(p, R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data);
  expect_error([&] { SafetensorsFile::open(p); }, "tensors 'x' and 'y' overlap");
  write_raw(p, R"({"x":{"dtype":"F32","shape":[2]}})", data);
  expect_error([&] { SafetensorsFile::open(p); }, "data_offsets must be [begin, end]");
  expect_error([&] { SafetensorsFile::open(dir.file("missing.safetensors")); }, "cannot open");
}

TEST(Checkpoint, SavedModelLoadsBackAndGeneratesTheSame) {
  for (auto [arch, tied] : {std::pair{Architecture::AsyncT, false}, std::pair{Architecture::Qwen3, false},
                             std::pair{Architecture::AsyncT, true}}) {
    TempDir dir;
    ModelConfig config = tiny_config(arch);
    config.tie_word_embeddings = tied;
    ModelWeights w = random_weights(config, 3);
    save_checkpoint(w, dir.path().string());
    ModelWeights loaded = load_weights(dir.path().string());
    EXPECT_EQ(loaded.config.architecture, arch);
    EXPECT_EQ(loaded.layers[1].down_proj.to_float_vector(), w.layers[1].down_proj.to_float_vector());
    if (arch == Architecture::AsyncT) {
      EXPECT_EQ(loaded.layers[0].gate_sigma.to_float_vector(), w.layers[0].gate_sigma.to_float_vector());
    }
    auto run = [](ModelWeights weights) {
      const int vocab = weights.config.vocab_size;
      Engine e(std::make_unique<CpuModelRunner>(std::move(weights), 8, 16), vocab);
      Request r;
      r.prompt = {3, 1, 4, 1, 5};
      r.max_tokens = 8;
      e.add_request(r);
      return e.run_to_completion()[0].tokens;
    };
    EXPECT_EQ(run(loaded), run(w));
  }
}

TEST(Checkpoint, ShardedCheckpointLoads) {
  TempDir dir;
  ModelWeights w = random_weights(tiny_config(Architecture::AsyncT), 4);
  save_checkpoint(w, dir.path().string());
  // Split model.safetensors into two shards with an index.
  auto whole = SafetensorsFile::open(dir.file("model.safetensors"));
  std::map<std::string, Tensor> first, second;
  nlohmann::json index;
  int i = 0;
  for (const std::string& name : whole->names()) {
    Tensor t = whole->tensor(name).to(whole->info(name).dtype);  // an owned copy
    (i++ % 2 ? second : first)[name] = t;
    index["weight_map"][name] = i % 2 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  whole.reset();
  fs::remove(dir.file("model.safetensors"));
  write_safetensors(dir.file("model-00001-of-00002.safetensors"), first);
  write_safetensors(dir.file("model-00002-of-00002.safetensors"), second);
  std::ofstream(dir.file("model.safetensors.index.json")) << index.dump();
  ModelWeights loaded = load_weights(dir.path().string());
  EXPECT_EQ(loaded.layers[1].q_proj.to_float_vector(), w.layers[1].q_proj.to_float_vector());

  // An index entry that points at the wrong shard.
  const std::string name = first.begin()->first;
  index["weight_map"][name] = "model-00002-of-00002.safetensors";
  std::ofstream(dir.file("model.safetensors.index.json")) << index.dump();
  expect_error([&] { load_weights(dir.path().string()); }, "which does not hold it");
}

TEST(Checkpoint, MissingUnexpectedAndMisshapenTensorsAreNamed) {
  TempDir dir;
  ModelWeights w = random_weights(tiny_config(Architecture::AsyncT), 5);
  save_checkpoint(w, dir.path().string());
  auto original = SafetensorsFile::open(dir.file("model.safetensors"));
  std::map<std::string, Tensor> tensors;
  for (const std::string& name : original->names()) tensors[name] = original->tensor(name).to(original->info(name).dtype);
  original.reset();

  auto rewrite = [&](std::map<std::string, Tensor> t) { write_safetensors(dir.file("model.safetensors"), t); };
  auto missing = tensors;
  missing.erase("model.layers.1.self_attn.gate_gamma");
  rewrite(missing);
  expect_error([&] { load_weights(dir.path().string()); }, "missing tensor 'model.layers.1.self_attn.gate_gamma'");

  auto extra = tensors;
  extra["model.layers.9.mlp.up_proj.weight"] = Tensor::empty(DType::BF16, {2});
  rewrite(extra);
  expect_error([&] { load_weights(dir.path().string()); }, "unexpected tensor 'model.layers.9.mlp.up_proj.weight'");

  auto misshapen = tensors;
  misshapen["model.norm.weight"] = Tensor::empty(DType::BF16, {127});
  rewrite(misshapen);
  expect_error([&] { load_weights(dir.path().string()); }, "'model.norm.weight' has shape [127], the config implies [128]");

  auto non_finite = tensors;
  std::vector<float> norm_values(128, 1.0f);
  norm_values[77] = NAN;
  norm_values[100] = INFINITY;
  non_finite["model.norm.weight"] = Tensor::from_vector<float>(norm_values, {128});
  rewrite(non_finite);
  expect_error([&] { load_weights(dir.path().string()); }, "non-finite value at element 77");

  // Finite in float32, infinite once rounded to the bf16 the engine holds.
  auto overflowing = tensors;
  std::vector<float> large(128, 1.0f);
  large[9] = 3.4e38f;
  overflowing["model.norm.weight"] = Tensor::from_vector<float>(large, {128});
  rewrite(overflowing);
  expect_error([&] { load_weights(dir.path().string()); }, "non-finite value at element 9 (as bfloat16");
}

// Weights are held as bf16 (the gate parameters as float32): a bf16 checkpoint's tensors are
// views of the mapped file, a float32 one's stay float32, exact; the CPU backend's float32 copy
// keeps the tie between embeddings and LM head.
TEST(Checkpoint, WeightsAreHeldInBf16AndFloat32CheckpointsStayExact) {
  TempDir dir;
  ModelWeights w = random_weights(tiny_config(Architecture::AsyncT), 8);
  EXPECT_EQ(w.layers[0].q_proj.dtype(), DType::BF16);
  EXPECT_EQ(w.layers[0].gate_alpha.dtype(), DType::F32);
  save_checkpoint(w, dir.path().string());
  ModelWeights loaded = load_weights(dir.path().string());
  EXPECT_EQ(loaded.layers[0].q_proj.dtype(), DType::BF16);
  EXPECT_EQ(loaded.layers[0].gate_alpha.dtype(), DType::F32);

  auto original = SafetensorsFile::open(dir.file("model.safetensors"));
  std::map<std::string, Tensor> tensors;
  for (const std::string& name : original->names()) tensors[name] = original->tensor(name).to(original->info(name).dtype);
  original.reset();
  std::vector<float> norm_values(128);
  for (int i = 0; i < 128; ++i) norm_values[std::size_t(i)] = 1.0f + float(i) / 1024.0f + 1e-6f;  // not bf16-exact
  tensors["model.norm.weight"] = Tensor::from_vector<float>(norm_values, {128});
  write_safetensors(dir.file("model.safetensors"), tensors);
  loaded = load_weights(dir.path().string());
  EXPECT_EQ(loaded.norm.dtype(), DType::F32);
  EXPECT_EQ(loaded.norm.to_float_vector(), norm_values);
  EXPECT_EQ(loaded.layers[0].q_proj.dtype(), DType::BF16);  // the other tensors are still bf16

  ModelConfig tied_config = tiny_config(Architecture::Qwen3);
  tied_config.tie_word_embeddings = true;
  ModelWeights tied = random_weights(tied_config, 9);
  ModelWeights f32 = to_float32(tied);
  EXPECT_EQ(f32.layers[1].down_proj.dtype(), DType::F32);
  EXPECT_EQ(f32.layers[1].down_proj.to_float_vector(), tied.layers[1].down_proj.to_float_vector());
  EXPECT_EQ(f32.lm_head.data(), f32.embed_tokens.data());
}

TEST(Checkpoint, BadConfigsAreNamed) {
  TempDir dir;
  save_checkpoint(random_weights(tiny_config(Architecture::AsyncT), 6), dir.path().string());
  auto edit = [&](const std::function<void(nlohmann::json&)>& change) {
    std::ifstream in(dir.file("config.json"));
    nlohmann::json j = nlohmann::json::parse(in);
    change(j);
    std::ofstream(dir.file("config.json")) << j.dump();
  };
  edit([](nlohmann::json& j) { j["num_key_value_heads"] = 3; });
  expect_error([&] { load_weights(dir.path().string()); }, "must be a multiple of num_key_value_heads (3)");
  edit([](nlohmann::json& j) { j["num_key_value_heads"] = 2; j["attn_pool_window"] = 0; });
  expect_error([&] { load_weights(dir.path().string()); }, "attn_pool_window must be in 1..8");
  edit([](nlohmann::json& j) { j["attn_pool_window"] = 3; j.erase("uclip_value"); });
  expect_error([&] { load_weights(dir.path().string()); }, "missing 'uclip_value'");
  edit([](nlohmann::json& j) { j["uclip_value"] = 4.0; j["architectures"] = {"MistralForCausalLM"}; });
  expect_error([&] { load_weights(dir.path().string()); }, "architecture 'MistralForCausalLM' is not supported");
  edit([](nlohmann::json& j) { j["architectures"] = {"AsyncTForCausalLM"}; j["hidden_size"] = "big"; });
  expect_error([&] { load_weights(dir.path().string()); }, "'hidden_size' has the wrong type");
  { std::ofstream(dir.file("config.json")) << "{ not json"; }
  expect_error([&] { load_weights(dir.path().string()); }, "not a JSON object");
  expect_error([&] { load_weights(dir.file("nowhere")); }, "cannot open");
}

TEST(RandomWeights, TheSameSeedGivesTheSameWeightsAndAnotherSeedOthers) {
  // Drawn in parallel chunks, each from its own seeded generator: the values must not depend on
  // which thread drew which chunk.
  const ModelConfig config = tiny_config(Architecture::AsyncT);
  const ModelWeights a = random_weights(config, 11), b = random_weights(config, 11), c = random_weights(config, 12);
  EXPECT_EQ(a.embed_tokens.to_float_vector(), b.embed_tokens.to_float_vector());
  EXPECT_EQ(a.layers[1].gate_proj.to_float_vector(), b.layers[1].gate_proj.to_float_vector());
  EXPECT_EQ(a.layers[0].gate_alpha.to_float_vector(), b.layers[0].gate_alpha.to_float_vector());
  EXPECT_NE(a.layers[1].gate_proj.to_float_vector(), c.layers[1].gate_proj.to_float_vector());
  // Different tensors of one model are not copies of each other.
  EXPECT_NE(a.layers[0].q_proj.to_float_vector(), a.layers[1].q_proj.to_float_vector());
}

}  // namespace
}  // namespace asynct
