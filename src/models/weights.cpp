#include "models/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <vector>

#include "core/parallel.h"
#include "io/safetensors.h"
#include "models/architecture.h"

namespace asynct {
namespace {

std::string layer_prefix(int i) { return "model.layers." + std::to_string(i) + "."; }

// Visits each (name, tensor slot) of the model, in a fixed order.
void for_each_tensor(ModelWeights& w, const std::function<void(const std::string&, Tensor&)>& f) {
  const ModelConfig& c = w.config;
  const bool qk_norm = recipe_of(c).qk_norm;  // Llama has none
  f("model.embed_tokens.weight", w.embed_tokens);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights& l = w.layers[std::size_t(i)];
    const std::string p = layer_prefix(i);
    f(p + "input_layernorm.weight", l.input_layernorm);
    f(p + "self_attn.q_proj.weight", l.q_proj);
    f(p + "self_attn.k_proj.weight", l.k_proj);
    f(p + "self_attn.v_proj.weight", l.v_proj);
    f(p + "self_attn.o_proj.weight", l.o_proj);
    if (qk_norm) {
      f(p + "self_attn.q_norm.weight", l.q_norm);
      f(p + "self_attn.k_norm.weight", l.k_norm);
    }
    f(p + "post_attention_layernorm.weight", l.post_attention_layernorm);
    f(p + "mlp.gate_proj.weight", l.gate_proj);
    f(p + "mlp.up_proj.weight", l.up_proj);
    f(p + "mlp.down_proj.weight", l.down_proj);
    if (c.is_async()) {
      f(p + "self_attn.gate_alpha", l.gate_alpha);
      f(p + "self_attn.gate_sigma", l.gate_sigma);
      f(p + "self_attn.gate_gamma", l.gate_gamma);
      f(p + "attn_output_layernorm.weight", l.attn_output_layernorm);
      f(p + "mlp_output_layernorm.weight", l.mlp_output_layernorm);
    }
  }
  f("model.norm.weight", w.norm);
  if (!c.tie_word_embeddings) f("lm_head.weight", w.lm_head);
}

ModelWeights empty_model(const ModelConfig& config) {
  config.validate();
  ModelWeights w;
  w.config = config;
  w.layers.resize(std::size_t(config.num_hidden_layers));
  return w;
}

bool is_gate_param(const std::string& name) { return name.find(".self_attn.gate_") != std::string::npos; }

// Whether a bf16 bit pattern is a NaN or an infinity (all exponent bits set).
bool bf16_is_finite(std::uint16_t bits) { return (bits & 0x7f80u) != 0x7f80u; }

// The index of the first value of t (float32 or bf16) that is not finite as bf16, the
// precision the GPU computes in (a float32 value beyond bf16's range rounds to infinity), or
// -1; on the host's threads.
std::int64_t first_non_finite(const Tensor& t) {
  const bool bf16 = t.dtype() == DType::BF16;
  const auto* halves = bf16 ? t.data_as<bf16_bits>() : nullptr;
  const float* floats = bf16 ? nullptr : t.data_as<float>();
  constexpr std::int64_t kPiece = std::int64_t(1) << 22;
  const std::int64_t count = t.numel();
  std::vector<std::int64_t> first(std::size_t((count + kPiece - 1) / kPiece), -1);
  parallel_pieces(count, kPiece, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i)
      if (!bf16_is_finite(bf16 ? halves[i].bits : float_to_bf16(floats[i]))) {
        first[std::size_t(begin / kPiece)] = i;
        return;
      }
  });
  for (std::int64_t i : first)
    if (i >= 0) return i;
  return -1;
}

// The dtype a weight is made and saved in: see weights.h.
DType held_dtype(const std::string& name) { return is_gate_param(name) ? DType::F32 : DType::BF16; }

// The dtype a loaded weight is held in: bf16 as stored (a view of the mapped file), any other
// float type as float32 (exact for float16 and float32); the gate parameters as float32.
DType loaded_dtype(const std::string& name, DType stored) {
  return held_dtype(name) == DType::BF16 && stored == DType::BF16 ? DType::BF16 : DType::F32;
}

}  // namespace

std::map<std::string, Shape> expected_tensors(const ModelConfig& c) {
  const std::int64_t h = c.hidden_size, q = std::int64_t(c.num_attention_heads) * c.head_dim,
                     kv = std::int64_t(c.num_key_value_heads) * c.head_dim, in = c.intermediate_size;
  std::map<std::string, Shape> shapes;
  ModelWeights scratch = empty_model(c);
  for_each_tensor(scratch, [&](const std::string& name, Tensor&) {
    Shape s;
    auto ends = [&](const char* suffix) { return name.size() >= std::strlen(suffix) &&
                                                 name.compare(name.size() - std::strlen(suffix), std::string::npos, suffix) == 0; };
    if (ends("embed_tokens.weight") || ends("lm_head.weight")) s = {c.vocab_size, h};
    else if (ends("q_proj.weight")) s = {q, h};
    else if (ends("k_proj.weight") || ends("v_proj.weight")) s = {kv, h};
    else if (ends("o_proj.weight")) s = {h, q};
    else if (ends("q_norm.weight") || ends("k_norm.weight")) s = {c.head_dim};
    else if (ends("gate_proj.weight") || ends("up_proj.weight")) s = {in, h};
    else if (ends("down_proj.weight")) s = {h, in};
    else if (is_gate_param(name)) s = {c.num_attention_heads};
    else s = {h};  // the norms
    shapes[name] = s;
  });
  return shapes;
}

ModelWeights random_weights(const ModelConfig& config, std::uint64_t seed) {
  ModelWeights w = empty_model(config);
  const std::map<std::string, Shape> shapes = expected_tensors(config);
  // Every tensor is cut into chunks, each drawn from its own generator seeded by (seed, tensor,
  // chunk), so the chunks can be drawn in parallel (a 1.7B model took ~1 min on one core) and
  // the values do not depend on the thread count.
  constexpr std::int64_t kChunk = 1 << 20;
  struct Job {
    Tensor* tensor;
    std::int64_t begin, count;
    std::uint64_t stream;
    float mean, scale;
  };
  std::vector<Job> jobs;
  std::uint64_t tensor_index = 0;
  for_each_tensor(w, [&](const std::string& name, Tensor& t) {
    t = Tensor::empty(held_dtype(name), shapes.at(name));
    // Gate parameters and norm weights near 1; embeddings of unit size; projections scaled by
    // 1/sqrt(fan_in) so that every layer changes the residual stream (with HF's 0.02 a random
    // model only echoes its input token, which makes generation tests see nothing).
    const bool near_one = name.find("norm") != std::string::npos || is_gate_param(name);
    const float scale = near_one ? 0.1f : t.dim() == 2 && name.find("embed") == std::string::npos &&
                                                  name.find("lm_head") == std::string::npos
                                              ? 1.0f / std::sqrt(float(t.size(1)))
                                              : 1.0f;
    ++tensor_index;
    for (std::int64_t begin = 0; begin < t.numel(); begin += kChunk)
      jobs.push_back({&t, begin, std::min(kChunk, t.numel() - begin), (tensor_index << 32) + std::uint64_t(begin / kChunk),
                      near_one ? 1.0f : 0.0f, scale});
  });
  parallel_for(jobs.size(), [&](std::size_t j) {
    const Job& job = jobs[j];
    // seed_seq keeps 32 bits of each value: give it the 64-bit numbers in halves.
    std::seed_seq seeds{std::uint32_t(seed), std::uint32_t(seed >> 32), std::uint32_t(job.stream),
                        std::uint32_t(job.stream >> 32)};
    std::mt19937_64 rng(seeds);
    std::normal_distribution<float> normal;
    // bf16 values, as a checkpoint holds them (the float32 gate parameters too are bf16-exact).
    if (job.tensor->dtype() == DType::BF16) {
      bf16_bits* values = job.tensor->data_as<bf16_bits>() + job.begin;
      for (std::int64_t i = 0; i < job.count; ++i) values[i].bits = float_to_bf16(job.mean + job.scale * normal(rng));
    } else {
      float* values = job.tensor->data_as<float>() + job.begin;
      for (std::int64_t i = 0; i < job.count; ++i) values[i] = round_to_bf16(job.mean + job.scale * normal(rng));
    }
  });
  if (config.tie_word_embeddings) w.lm_head = w.embed_tokens;
  return w;
}

ModelWeights load_weights(const std::string& directory) {
  ModelWeights w = empty_model(load_checkpoint_config(directory));
  const Checkpoint ckpt = Checkpoint::open(directory);
  const std::map<std::string, Shape> shapes = expected_tensors(w.config);
  for (const std::string& name : ckpt.names()) {
    if (w.config.tie_word_embeddings && name == "lm_head.weight") continue;  // redundant copy
    check(shapes.count(name) != 0, "checkpoint ", directory, ": unexpected tensor '", name, "' in ",
          ckpt.file_of(name), " (not part of ", w.config.architecture_name(), " with this config)");
  }
  for_each_tensor(w, [&](const std::string& name, Tensor& t) {
    t = ckpt.get(name, loaded_dtype(name, ckpt.stored_dtype(name)), shapes.at(name));
    const std::int64_t bad = first_non_finite(t);
    check(bad < 0, ckpt.file_of(name), ": tensor '", name, "' holds a non-finite value at element ", bad,
          " (as bfloat16, the precision the GPU computes in)");
  });
  if (w.config.tie_word_embeddings) w.lm_head = w.embed_tokens;
  return w;
}

ModelWeights to_float32(ModelWeights weights) {
  for_each_tensor(weights, [](const std::string&, Tensor& t) {
    if (t.dtype() != DType::F32) t = t.to(DType::F32);
  });
  if (weights.config.tie_word_embeddings) weights.lm_head = weights.embed_tokens;
  return weights;
}

void save_checkpoint(const ModelWeights& weights, const std::string& directory) {
  make_checkpoint_directory(directory);
  const std::string config_path = (std::filesystem::path(directory) / "config.json").string();
  check_writable_file_path(config_path);
  std::map<std::string, Tensor> tensors;
  ModelWeights copy = weights;
  for_each_tensor(copy, [&](const std::string& name, Tensor& t) {
    const DType stored = held_dtype(name);
    tensors[name] = t.dtype() == stored ? t : t.to(stored);  // no copy of what is already stored as is
  });
  write_safetensors((std::filesystem::path(directory) / "model.safetensors").string(), tensors);
  std::ofstream config(config_path);
  check(bool(config), "cannot write ", config_path);
  config << config_to_json(weights.config) << "\n";
}

void write_random_checkpoint(const ModelConfig& config, std::uint64_t seed, const std::string& directory) {
  // The directory first: a 1.7B model's weights take a while to draw.
  make_checkpoint_directory(directory);
  check_writable_file_path((std::filesystem::path(directory) / "config.json").string());
  check_writable_file_path((std::filesystem::path(directory) / "model.safetensors").string());
  save_checkpoint(random_weights(config, seed), directory);
}

}  // namespace asynct
