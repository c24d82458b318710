#include "models/config.h"

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace asynct {

using nlohmann::json;

std::string ModelConfig::architecture_name() const {
  return is_async() ? "AsyncTForCausalLM" : "Qwen3ForCausalLM";
}

void ModelConfig::validate() const {
  const std::string who = architecture_name() + " config: ";
  check(vocab_size >= 1, who, "vocab_size must be >= 1, got ", vocab_size);
  check(hidden_size >= 8 && hidden_size % 8 == 0, who, "hidden_size must be a positive multiple of 8, got ", hidden_size);
  check(intermediate_size >= 8 && intermediate_size % 8 == 0, who,
        "intermediate_size must be a positive multiple of 8, got ", intermediate_size);
  check(num_hidden_layers >= 1 && num_hidden_layers <= 1024, who, "num_hidden_layers out of range: ", num_hidden_layers);
  check(num_attention_heads >= 1, who, "num_attention_heads must be >= 1");
  check(num_key_value_heads >= 1 && num_attention_heads % num_key_value_heads == 0, who,
        "num_attention_heads (", num_attention_heads, ") must be a multiple of num_key_value_heads (",
        num_key_value_heads, ")");
  check(head_dim >= 2 && head_dim % 2 == 0 && head_dim <= 512, who, "head_dim must be even and in 2..512, got ", head_dim);
  check(rope_theta > 0 && std::isfinite(rope_theta), who, "rope_theta must be positive");
  check(rms_norm_eps > 0 && std::isfinite(rms_norm_eps), who, "rms_norm_eps must be positive");
  check(max_position_embeddings >= 1, who, "max_position_embeddings must be >= 1");
  if (is_async()) {
    check(attn_pool_window >= 1 && attn_pool_window <= 8, who, "attn_pool_window must be in 1..8, got ", attn_pool_window);
    check(uclip_value > 0 && std::isfinite(uclip_value), who, "uclip_value must be positive, got ", uclip_value);
  }
}

std::int64_t ModelConfig::parameter_count() const {
  const std::int64_t h = hidden_size, q = std::int64_t(num_attention_heads) * head_dim,
                     kv = std::int64_t(num_key_value_heads) * head_dim;
  std::int64_t layer = h * (q + 2 * kv) + q * h + 3 * h * intermediate_size + 2 * h + 2 * head_dim;
  if (is_async()) layer += 2 * h + 3 * num_attention_heads;
  return std::int64_t(vocab_size) * h * (tie_word_embeddings ? 1 : 2) + num_hidden_layers * layer + h;
}

namespace {
template <typename T>
void read(const json& j, const char* key, T* value, const std::string& path, bool required) {
  if (!j.contains(key) || j[key].is_null()) {
    check(!required, path, ": missing '", key, "'");
    return;
  }
  try {
    *value = j[key].get<T>();
  } catch (const json::exception&) {
    throw Error(path + ": '" + key + "' has the wrong type");
  }
}
}  // namespace

ModelConfig load_config(const std::string& path) {
  std::ifstream in(path);
  check(bool(in), "cannot open ", path);
  json j = json::parse(in, nullptr, false);
  check(!j.is_discarded() && j.is_object(), path, ": not a JSON object");
  ModelConfig c;
  std::string arch;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    arch = j["architectures"][0].get<std::string>();
  else if (j.contains("model_type") && j["model_type"].is_string())
    arch = j["model_type"].get<std::string>() == "asynct" ? "AsyncTForCausalLM" : "Qwen3ForCausalLM";
  check(arch == "Qwen3ForCausalLM" || arch == "AsyncTForCausalLM", path, ": architecture '", arch,
        "' is not supported (Qwen3ForCausalLM, AsyncTForCausalLM)");
  c.architecture = arch == "AsyncTForCausalLM" ? Architecture::AsyncT : Architecture::Qwen3;
  read(j, "vocab_size", &c.vocab_size, path, true);
  read(j, "hidden_size", &c.hidden_size, path, true);
  read(j, "intermediate_size", &c.intermediate_size, path, true);
  read(j, "num_hidden_layers", &c.num_hidden_layers, path, true);
  read(j, "num_attention_heads", &c.num_attention_heads, path, true);
  c.num_key_value_heads = c.num_attention_heads;
  read(j, "num_key_value_heads", &c.num_key_value_heads, path, false);
  c.head_dim = c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0;
  read(j, "head_dim", &c.head_dim, path, false);
  read(j, "rope_theta", &c.rope_theta, path, false);
  read(j, "rms_norm_eps", &c.rms_norm_eps, path, false);
  read(j, "max_position_embeddings", &c.max_position_embeddings, path, false);
  read(j, "tie_word_embeddings", &c.tie_word_embeddings, path, false);
  read(j, "attn_pool_window", &c.attn_pool_window, path, false);
  read(j, "uclip_value", &c.uclip_value, path, c.is_async());
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    throw Error(path + ": rope_scaling is not supported");
  c.validate();
  return c;
}

std::string config_to_json(const ModelConfig& c) {
  json j = {{"architectures", {c.architecture_name()}},
            {"model_type", c.is_async() ? "asynct" : "qwen3"},
            {"vocab_size", c.vocab_size},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.intermediate_size},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.num_key_value_heads},
            {"head_dim", c.head_dim},
            {"rope_theta", c.rope_theta},
            {"rms_norm_eps", c.rms_norm_eps},
            {"max_position_embeddings", c.max_position_embeddings},
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"torch_dtype", "bfloat16"},
            {"hidden_act", "silu"}};
  if (c.is_async()) {
    j["attn_pool_window"] = c.attn_pool_window;
    j["uclip_value"] = c.uclip_value;
  }
  return j.dump(2);
}

ModelConfig tiny_config(Architecture architecture) {
  ModelConfig c;
  c.architecture = architecture;
  c.vocab_size = 256;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;  // the smallest head_dim the GPU kernels take
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 4096;
  // Untied: a small random model with a tied head mostly echoes its last input token.
  c.tie_word_embeddings = false;
  c.uclip_value = architecture == Architecture::AsyncT ? 4.0f : 0.0f;
  return c;
}

ModelConfig reference_1p7b_config(Architecture architecture) {
  ModelConfig c;
  c.architecture = architecture;
  c.vocab_size = 151936;
  c.hidden_size = 2048;
  c.intermediate_size = 6144;
  c.num_hidden_layers = 28;
  c.num_attention_heads = 16;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 40960;
  c.tie_word_embeddings = true;
  c.uclip_value = architecture == Architecture::AsyncT ? 4.0f : 0.0f;
  return c;
}

Architecture architecture_from_name(const std::string& name) {
  check(name == "asynct" || name == "qwen3", "architecture '", name, "' is not one of asynct, qwen3");
  return name == "qwen3" ? Architecture::Qwen3 : Architecture::AsyncT;
}

ModelConfig builtin_config(Architecture architecture, const std::string& size) {
  check(size == "tiny" || size == "1.7b", "model size '", size, "' is not one of tiny, 1.7b");
  return size == "1.7b" ? reference_1p7b_config(architecture) : tiny_config(architecture);
}

}  // namespace asynct
