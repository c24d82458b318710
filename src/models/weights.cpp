#include "models/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <vector>

#include "core/fp8.h"
#include "core/parallel.h"
#include "io/safetensors.h"
#include "models/architecture.h"

namespace asynct {
namespace {

std::string layer_prefix(int i) { return "model.layers." + std::to_string(i) + "."; }

// Visits each (name, tensor slot) of the model, in a fixed order; with FP8 weights each
// projection's scales right after it.
void for_each_tensor(ModelWeights& w, const std::function<void(const std::string&, Tensor&)>& f) {
  const ModelConfig& c = w.config;
  const bool qk_norm = recipe_of(c).qk_norm;  // Llama has none
  const auto projection = [&](const std::string& name, Tensor& weight, Tensor& scale) {
    f(name + ".weight", weight);
    if (c.fp8_weights()) f(name + ".weight_scale_inv", scale);
  };
  f("model.embed_tokens.weight", w.embed_tokens);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights& l = w.layers[std::size_t(i)];
    const std::string p = layer_prefix(i);
    f(p + "input_layernorm.weight", l.input_layernorm);
    projection(p + "self_attn.q_proj", l.q_proj, l.q_proj_scale);
    projection(p + "self_attn.k_proj", l.k_proj, l.k_proj_scale);
    projection(p + "self_attn.v_proj", l.v_proj, l.v_proj_scale);
    projection(p + "self_attn.o_proj", l.o_proj, l.o_proj_scale);
    if (qk_norm) {
      f(p + "self_attn.q_norm.weight", l.q_norm);
      f(p + "self_attn.k_norm.weight", l.k_norm);
    }
    f(p + "post_attention_layernorm.weight", l.post_attention_layernorm);
    projection(p + "mlp.gate_proj", l.gate_proj, l.gate_proj_scale);
    projection(p + "mlp.up_proj", l.up_proj, l.up_proj_scale);
    projection(p + "mlp.down_proj", l.down_proj, l.down_proj_scale);
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

// Visits each projection with its scales (FP8 or not).
void for_each_projection(ModelWeights& w, const std::function<void(Tensor& weight, Tensor& scale)>& f) {
  for (LayerWeights& l : w.layers)
    for (auto [weight, scale] : {std::pair{&l.q_proj, &l.q_proj_scale}, {&l.k_proj, &l.k_proj_scale}, {&l.v_proj, &l.v_proj_scale},
                                 {&l.o_proj, &l.o_proj_scale}, {&l.gate_proj, &l.gate_proj_scale},
                                 {&l.up_proj, &l.up_proj_scale}, {&l.down_proj, &l.down_proj_scale}})
      f(*weight, *scale);
}

bool ends_with(const std::string& name, const char* suffix) {
  const std::size_t n = std::strlen(suffix);
  return name.size() >= n && name.compare(name.size() - n, n, suffix) == 0;
}
bool is_scale(const std::string& name) { return ends_with(name, ".weight_scale_inv"); }
bool is_projection(const std::string& name) { return ends_with(name, "_proj.weight"); }

// The KV-cache scale tensors a checkpoint may hold for layer i.
std::string k_scale_name(int i) { return layer_prefix(i) + "self_attn.k_scale"; }
std::string v_scale_name(int i) { return layer_prefix(i) + "self_attn.v_scale"; }
bool is_kv_scale(const std::string& name) {
  return name.rfind("model.layers.", 0) == 0 && (ends_with(name, ".self_attn.k_scale") || ends_with(name, ".self_attn.v_scale"));
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

// The index of the first value of t (float32, bf16 or e4m3) that is not finite as bf16, the
// precision the GPU computes in (a float32 value beyond bf16's range rounds to infinity), or as
// e4m3 (0x7f and 0xff are NaN); or -1. On the host's threads.
std::int64_t first_non_finite(const Tensor& t) {
  const DType dtype = t.dtype();
  const bf16_bits* bf16 = dtype == DType::BF16 ? t.data_as<bf16_bits>() : nullptr;
  const fp8_e4m3_bits* fp8 = dtype == DType::F8E4M3 ? t.data_as<fp8_e4m3_bits>() : nullptr;
  const float* f32 = !bf16 && !fp8 ? t.data_as<float>() : nullptr;
  const auto finite = [&](std::int64_t i) {
    if (bf16) return bf16_is_finite(bf16[i].bits);
    if (fp8) return (fp8[i].bits & 0x7fu) != 0x7fu;
    return bf16_is_finite(float_to_bf16(f32[i]));
  };
  constexpr std::int64_t kPiece = std::int64_t(1) << 22;
  const std::int64_t count = t.numel();
  std::vector<std::int64_t> first(std::size_t((count + kPiece - 1) / kPiece), -1);
  parallel_pieces(count, kPiece, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i)
      if (!finite(i)) {
        first[std::size_t(begin / kPiece)] = i;
        return;
      }
  });
  for (std::int64_t i : first)
    if (i >= 0) return i;
  return -1;
}

// The dtype a weight is made and saved in: see weights.h.
DType held_dtype(const std::string& name, bool fp8) {
  if (is_gate_param(name) || is_scale(name) || is_kv_scale(name)) return DType::F32;
  return fp8 && is_projection(name) ? DType::F8E4M3 : DType::BF16;
}

// The dtype a loaded weight is held in: bf16 and e4m3 as stored (views of the mapped file), any
// other float type as float32 (exact for float16 and float32); the gate parameters and scales as
// float32. An FP8 checkpoint's projections must be stored as e4m3.
DType loaded_dtype(const std::string& name, DType stored, bool fp8, const std::string& file) {
  const DType held = held_dtype(name, fp8);
  if (held == DType::F8E4M3) {
    check(stored == DType::F8E4M3, file, ": tensor '", name, "' is stored as ", dtype_name(stored),
          "; the config's quantization_config (fp8) makes the projections float8_e4m3fn (F8_E4M3)");
    return held;
  }
  return held == DType::BF16 && stored == DType::BF16 ? DType::BF16 : DType::F32;
}

}  // namespace

std::map<std::string, Shape> expected_tensors(const ModelConfig& c) {
  const std::int64_t h = c.hidden_size, q = std::int64_t(c.num_attention_heads) * c.head_dim,
                     kv = std::int64_t(c.num_key_value_heads) * c.head_dim, in = c.intermediate_size;
  std::map<std::string, Shape> shapes;
  ModelWeights scratch = empty_model(c);
  for_each_tensor(scratch, [&](const std::string& name, Tensor&) {
    Shape s;
    const auto ends = [&](const char* suffix) { return ends_with(name, suffix); };
    if (is_scale(name)) {  // after its weight: a scale a block of it
      const Shape& weight = shapes.at(name.substr(0, name.size() - std::strlen("_scale_inv")));
      s = {(weight[0] + c.fp8_block_rows - 1) / c.fp8_block_rows, (weight[1] + c.fp8_block_cols - 1) / c.fp8_block_cols};
    } else if (ends("embed_tokens.weight") || ends("lm_head.weight")) s = {c.vocab_size, h};
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
  check(!config.fp8_weights(), "random_weights: draws bf16 weights (quantize_fp8 makes FP8 ones)");
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
    t = Tensor::empty(held_dtype(name, false), shapes.at(name));
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
  const ModelConfig& c = w.config;
  const Checkpoint ckpt = Checkpoint::open(directory);
  const std::map<std::string, Shape> shapes = expected_tensors(c);
  for (const std::string& name : ckpt.names()) {
    if (c.tie_word_embeddings && name == "lm_head.weight") continue;  // redundant copy
    if (is_kv_scale(name)) continue;                                  // read below
    check(shapes.count(name) != 0, "checkpoint ", directory, ": unexpected tensor '", name, "' in ",
          ckpt.file_of(name), " (not part of ", c.architecture_name(), " with this config",
          is_scale(name) ? ": an FP8 weight's scales, but config.json has no fp8 quantization_config)" : ")");
  }
  for_each_tensor(w, [&](const std::string& name, Tensor& t) {
    t = ckpt.get(name, loaded_dtype(name, ckpt.stored_dtype(name), c.fp8_weights(), ckpt.file_of(name)), shapes.at(name));
    const std::int64_t bad = first_non_finite(t);
    check(bad < 0, ckpt.file_of(name), ": tensor '", name, "' holds a non-finite value at element ", bad,
          t.dtype() == DType::F8E4M3 ? "" : " (as bfloat16, the precision the GPU computes in)");
    if (is_scale(name)) {
      const float* scales = t.data_as<float>();
      for (std::int64_t i = 0; i < t.numel(); ++i)
        check(scales[i] >= 0.0f && std::isfinite(scales[i]), ckpt.file_of(name), ": tensor '", name, "' holds the scale ",
              scales[i], " at element ", i, " (scales are finite and >= 0)");
    }
  });
  // KV-cache scales: for every layer, or none.
  const bool kv_scales = ckpt.contains(k_scale_name(0)) || ckpt.contains(v_scale_name(0));
  for (int i = 0; i < c.num_hidden_layers; ++i)
    for (auto [name, slot] : {std::pair{k_scale_name(i), &w.layers[std::size_t(i)].k_scale},
                              std::pair{v_scale_name(i), &w.layers[std::size_t(i)].v_scale}}) {
      check(ckpt.contains(name) == kv_scales, "checkpoint ", directory, ": ",
            kv_scales ? "missing tensor '" + name + "' (the KV-cache scales are given for layer 0, so for every layer)"
                      : "tensor '" + name + "' without layer 0's k_scale and v_scale (KV-cache scales are for every layer or none)");
      if (!kv_scales) continue;
      const Shape stored = ckpt.stored_shape(name);
      const bool one = shape_numel(stored) == 1 && stored.size() <= 1;
      check(one || stored == Shape{c.num_key_value_heads}, ckpt.file_of(name), ": tensor '", name, "' has shape ",
            shape_string(stored), "; a KV-cache scale is one value ([] or [1]) or one a KV head ([", c.num_key_value_heads, "])");
      const Tensor t = ckpt.get(name, DType::F32, stored);
      std::vector<float> values = t.to_float_vector();
      for (const float v : values)
        check(v > 0.0f && std::isfinite(v), ckpt.file_of(name), ": tensor '", name, "' holds the scale ", v,
              " (KV-cache scales are finite and > 0)");
      if (one) values.assign(std::size_t(c.num_key_value_heads), values[0]);
      *slot = Tensor::empty(DType::F32, {c.num_key_value_heads});
      std::copy(values.begin(), values.end(), slot->data_as<float>());
    }
  if (c.tie_word_embeddings) w.lm_head = w.embed_tokens;
  return w;
}

Tensor dequantize_projection(const Tensor& weight, const Tensor& scale, int block_rows, int block_cols) {
  if (weight.dtype() != DType::F8E4M3) return weight.dtype() == DType::F32 ? weight : weight.to(DType::F32);
  check(block_rows >= 1 && block_cols >= 1 && scale.defined() && scale.dim() == 2, "dequantize_projection: ",
        weight.describe(), " needs its block scales");
  Tensor out = Tensor::empty(DType::F32, weight.shape());
  const std::int64_t rows = weight.size(0), cols = weight.size(1), scale_cols = scale.size(1);
  const auto* q = weight.data_as<fp8_e4m3_bits>();
  const float* s = scale.data_as<float>();
  float* o = out.data_as<float>();
  parallel_pieces(rows, 64, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t r = begin; r < end; ++r)
      for (std::int64_t col = 0; col < cols; ++col)
        o[r * cols + col] = fp8_e4m3_to_float(q[r * cols + col].bits) * s[(r / block_rows) * scale_cols + col / block_cols];
  });
  return out;
}

ModelWeights to_float32(ModelWeights weights) {
  // FP8 projections first: their values times their blocks' scales.
  if (weights.config.fp8_weights()) {
    for_each_projection(weights, [&](Tensor& weight, Tensor& scale) {
      weight = dequantize_projection(weight, scale, weights.config.fp8_block_rows, weights.config.fp8_block_cols);
      scale = Tensor();
    });
    weights.config.fp8_block_rows = weights.config.fp8_block_cols = 0;
  }
  for_each_tensor(weights, [](const std::string&, Tensor& t) {
    if (t.dtype() != DType::F32) t = t.to(DType::F32);
  });
  if (weights.config.tie_word_embeddings) weights.lm_head = weights.embed_tokens;
  return weights;
}

ModelWeights quantize_fp8(ModelWeights weights, int block_rows_size, int block_cols_size) {
  if (weights.config.fp8_weights()) return weights;
  check(block_rows_size >= 1 && block_cols_size >= 1, "quantize_fp8: blocks of ", block_rows_size, " x ", block_cols_size);
  const int br = block_rows_size, bc = block_cols_size;
  for_each_projection(weights, [&](Tensor& weight, Tensor& scale) {
    const Tensor values = weight.dtype() == DType::F32 ? weight : weight.to(DType::F32);
    const std::int64_t rows = values.size(0), cols = values.size(1);
    const std::int64_t block_rows = (rows + br - 1) / br, block_cols = (cols + bc - 1) / bc;
    Tensor q = Tensor::empty(DType::F8E4M3, values.shape());
    scale = Tensor::empty(DType::F32, {block_rows, block_cols});
    const float* in = values.data_as<float>();
    auto* out = q.data_as<fp8_e4m3_bits>();
    float* s = scale.data_as<float>();
    parallel_pieces(block_rows * block_cols, std::max<std::int64_t>(1, 4096 / (std::int64_t(br) * bc)), [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t blk = begin; blk < end; ++blk) {
        const std::int64_t r0 = (blk / block_cols) * br, c0 = (blk % block_cols) * bc;
        const std::int64_t r1 = std::min(rows, r0 + br), c1 = std::min(cols, c0 + bc);
        float amax = 0.0f;
        for (std::int64_t r = r0; r < r1; ++r)
          for (std::int64_t col = c0; col < c1; ++col) amax = std::max(amax, std::fabs(in[r * cols + col]));
        const float block_scale = amax > 0.0f ? amax / kFp8E4M3Max : 1.0f;
        s[blk] = block_scale;
        for (std::int64_t r = r0; r < r1; ++r)
          for (std::int64_t col = c0; col < c1; ++col) out[r * cols + col].bits = float_to_fp8_e4m3(in[r * cols + col] / block_scale);
      }
    });
    weight = std::move(q);
  });
  weights.config.fp8_block_rows = br;
  weights.config.fp8_block_cols = bc;
  return weights;
}

void save_checkpoint(const ModelWeights& weights, const std::string& directory) {
  make_checkpoint_directory(directory);
  const std::string config_path = (std::filesystem::path(directory) / "config.json").string();
  check_writable_file_path(config_path);
  std::map<std::string, Tensor> tensors;
  ModelWeights copy = weights;
  for_each_tensor(copy, [&](const std::string& name, Tensor& t) {
    const DType stored = held_dtype(name, weights.config.fp8_weights());
    tensors[name] = t.dtype() == stored ? t : t.to(stored);  // no copy of what is already stored as is
  });
  for (int i = 0; i < weights.config.num_hidden_layers; ++i) {
    const LayerWeights& l = weights.layers[std::size_t(i)];
    if (l.k_scale.defined()) tensors[k_scale_name(i)] = l.k_scale;
    if (l.v_scale.defined()) tensors[v_scale_name(i)] = l.v_scale;
  }
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
