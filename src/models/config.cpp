#include "models/config.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"
#include "models/architecture.h"

namespace asynct {

using nlohmann::json;

namespace {

// Each architecture by its HuggingFace class name (config.json's architectures[0]), its
// model_type, and the name the command line uses.
struct KnownArchitecture {
  Architecture architecture;
  const char* class_name;
  const char* model_type;
};
constexpr KnownArchitecture kArchitectures[] = {{Architecture::Qwen3, "Qwen3ForCausalLM", "qwen3"},
                                                {Architecture::AsyncT, "AsyncTForCausalLM", "asynct"},
                                                {Architecture::Llama, "LlamaForCausalLM", "llama"}};

const KnownArchitecture& known(Architecture a) {
  for (const KnownArchitecture& k : kArchitectures)
    if (k.architecture == a) return k;
  throw Error("unknown architecture value " + std::to_string(int(a)));
}

std::string known_list(const char* KnownArchitecture::*field) {
  std::string s;
  for (const KnownArchitecture& k : kArchitectures) s += (s.empty() ? "" : ", ") + std::string(k.*field);
  return s;
}

}  // namespace

std::string ModelConfig::architecture_name() const { return known(architecture).class_name; }

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
  for (const std::int32_t eos : eos_token_ids)
    check(eos >= 0 && eos < vocab_size, who, "eos_token_id ", eos, " is outside the vocabulary [0, ", vocab_size, ")");
  if (is_async()) {
    check(attn_pool_window >= 1 && attn_pool_window <= 8, who, "attn_pool_window must be in 1..8, got ", attn_pool_window);
    check(uclip_value > 0 && std::isfinite(uclip_value), who, "uclip_value must be positive, got ", uclip_value);
  }
  check((fp8_block_rows == 0) == (fp8_block_cols == 0) && fp8_block_rows >= 0 && fp8_block_cols >= 0, who,
        "FP8 weight blocks must be both positive or both 0, got ", fp8_block_rows, " x ", fp8_block_cols);
}

std::int64_t ModelConfig::parameter_count() const {
  const std::int64_t h = hidden_size, q = std::int64_t(num_attention_heads) * head_dim,
                     kv = std::int64_t(num_key_value_heads) * head_dim;
  std::int64_t layer = h * (q + 2 * kv) + q * h + 3 * h * intermediate_size + 2 * h;
  if (recipe_of(*this).qk_norm) layer += 2 * head_dim;
  if (is_async()) layer += 2 * h + 3 * num_attention_heads;
  return std::int64_t(vocab_size) * h * (tie_word_embeddings ? 1 : 2) + num_hidden_layers * layer + h;
}

namespace {

// Records the text of each top-level number written with a fraction or an exponent, as it is
// in the file: the parsed document keeps only the double, and an error should quote "1e12" or
// "128.7" as the user wrote it.
class FloatTexts : public nlohmann::json_sax<json> {
 public:
  std::map<std::string, std::string> texts;

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t& s) override {
    if (depth_ == 1) texts[key_] = s;
    return true;
  }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return ++depth_, true; }
  bool key(string_t& k) override {
    if (depth_ == 1) key_ = k;
    return true;
  }
  bool end_object() override { return --depth_, true; }
  bool start_array(std::size_t) override { return ++depth_, true; }
  bool end_array() override { return --depth_, true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  int depth_ = 0;
  std::string key_;
};

class ConfigReader {
 public:
  ConfigReader(const json& j, const std::string& path, std::map<std::string, std::string> float_texts)
      : j_(j), path_(path), float_texts_(std::move(float_texts)) {}

  // Whether the key holds a value; a missing required key is an Error.
  bool present(const char* key, bool required) const {
    if (!j_.contains(key) || j_[key].is_null()) {
      check(!required, path_, ": missing '", key, "'");
      return false;
    }
    return true;
  }

  // The value as written in the file.
  std::string written(const char* key) const {
    auto it = float_texts_.find(key);
    return it != float_texts_.end() ? it->second : j_[key].dump();
  }

  // An int: a JSON integer, or a number with a zero fraction, in int's range. Anything else is
  // an Error quoting the value (a plain conversion wraps 4294967424 to 128 and cuts 128.7 to 128).
  void integer(const char* key, int* value, bool required) const {
    if (!present(key, required)) return;
    const json& v = j_[key];
    check(v.is_number(), path_, ": '", key, "' has the wrong type (", v.type_name(), ", not an integer)");
    constexpr auto lo = std::numeric_limits<int>::min(), hi = std::numeric_limits<int>::max();
    bool fits = false;
    if (v.is_number_unsigned()) fits = v.get<std::uint64_t>() <= std::uint64_t(hi);
    else if (v.is_number_integer()) fits = v.get<std::int64_t>() >= lo && v.get<std::int64_t>() <= hi;
    else {
      const double d = v.get<double>();
      fits = std::isfinite(d) && d == std::trunc(d) && d >= lo && d <= hi;
    }
    check(fits, path_, ": '", key, "' must be an integer in ", lo, "..", hi, ", got ", written(key));
    *value = v.is_number_float() ? int(v.get<double>()) : int(v.get<std::int64_t>());
  }

  // A floating-point value (float or double), finite and within T's range.
  template <typename T>
  void real(const char* key, T* value, bool required) const {
    if (!present(key, required)) return;
    const json& v = j_[key];
    check(v.is_number(), path_, ": '", key, "' has the wrong type (", v.type_name(), ", not a number)");
    const double d = v.get<double>();
    check(std::isfinite(d) && std::fabs(d) <= double(std::numeric_limits<T>::max()), path_, ": '", key,
          "' is out of range, got ", written(key));
    *value = T(d);
  }

  void boolean(const char* key, bool* value, bool required) const {
    if (!present(key, required)) return;
    check(j_[key].is_boolean(), path_, ": '", key, "' has the wrong type (", j_[key].type_name(), ", not a boolean)");
    *value = j_[key].get<bool>();
  }

  // Token ids: an integer or a list of integers (null or absent: leaves *ids as it is), each
  // in [0, vocab_size).
  void token_ids(const char* key, int vocab_size, std::vector<std::int32_t>* ids) const {
    if (!present(key, false)) return;
    const json& v = j_[key];
    std::vector<std::int32_t> out;
    for (const json& e : v.is_array() ? v : json::array({v})) {
      check(e.is_number_integer(), path_, ": '", key, "' must be a token id or a list of token ids, got ", v.dump());
      const bool in_vocab = e.is_number_unsigned() ? e.get<std::uint64_t>() < std::uint64_t(vocab_size)
                                                   : e.get<std::int64_t>() >= 0 && e.get<std::int64_t>() < vocab_size;
      check(in_vocab, path_, ": '", key, "' token ", e.dump(), " is outside the vocabulary [0, ", vocab_size, ")");
      out.push_back(std::int32_t(e.get<std::int64_t>()));
    }
    *ids = std::move(out);
  }

 private:
  const json& j_;
  const std::string& path_;
  std::map<std::string, std::string> float_texts_;
};

// What the engine does not implement is an error naming the key and its value, never a model
// that runs and computes something else: scaled RoPE, biases on the projections, an activation
// other than SiLU. transformers 5 writes RoPE's settings as rope_parameters (rope_type,
// rope_theta): only the default type is supported, and its rope_theta is the model's.
void check_supported_features(const json& j, const ConfigReader& r, const std::string& path, ModelConfig* c) {
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    throw Error(path + ": rope_scaling " + j["rope_scaling"].dump() + " is not supported (only unscaled RoPE)");
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    const json& rope = j["rope_parameters"];
    check(rope.is_object(), path, ": 'rope_parameters' must be an object, got ", rope.dump());
    const std::string type = rope.contains("rope_type") && rope["rope_type"].is_string() ? rope["rope_type"].get<std::string>() : "";
    check(type == "default", path, ": rope_parameters ", rope.dump(), " is not supported (only rope_type 'default')");
    if (rope.contains("rope_theta")) {
      const std::string where = path + ": rope_parameters";
      ConfigReader(rope, where, {}).real("rope_theta", &c->rope_theta, true);
    }
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    bool bias = false;
    r.boolean(key, &bias, false);
    check(!bias, path, ": ", key, " true is not supported (the engine's projections have no bias)");
  }
  if (r.present("hidden_act", false)) {
    check(j["hidden_act"].is_string(), path, ": 'hidden_act' has the wrong type (", j["hidden_act"].type_name(),
          ", not a string)");
    const std::string act = j["hidden_act"].get<std::string>();
    check(act == "silu", path, ": hidden_act '", act, "' is not supported (silu)");
  }
}

// HF's FP8 quantization_config: quant_method "fp8" with e4m3 weights in blocks
// (weight_block_size) and activations quantized dynamically (asynct computes them in bf16, which
// loses nothing against that). Any other method or form is an error naming it.
void read_quantization(const json& j, const std::string& path, ModelConfig* c) {
  if (!j.contains("quantization_config") || j["quantization_config"].is_null()) return;
  const json& q = j["quantization_config"];
  check(q.is_object(), path, ": 'quantization_config' must be an object, got ", q.dump());
  const std::string where = path + ": quantization_config";
  const auto text = [&](const char* key, const char* fallback) {
    if (!q.contains(key) || q[key].is_null()) return std::string(fallback);
    check(q[key].is_string(), where, ": '", key, "' must be a string, got ", q[key].dump());
    return q[key].get<std::string>();
  };
  const std::string method = text("quant_method", "");
  check(method == "fp8", where, ": quant_method '", method, "' is not supported (fp8)");
  const std::string format = text("fmt", "e4m3");
  check(format == "e4m3", where, ": fmt '", format, "' is not supported (e4m3)");
  const std::string activations = text("activation_scheme", "dynamic");
  check(activations == "dynamic", where, ": activation_scheme '", activations,
        "' is not supported (dynamic: activations are computed in bf16)");
  check(q.contains("weight_block_size") && q["weight_block_size"].is_array() && q["weight_block_size"].size() == 2, where,
        ": weight_block_size must be a list of two block sizes (per-tensor FP8 scales are not supported), got ",
        q.contains("weight_block_size") ? q["weight_block_size"].dump() : std::string("nothing"));
  const json& block = q["weight_block_size"];
  for (const json& b : block)
    check(b.is_number_integer() && b.get<std::int64_t>() >= 1 && b.get<std::int64_t>() <= 65536, where,
          ": weight_block_size must hold integers in 1..65536, got ", block.dump());
  c->fp8_block_rows = int(block[0].get<std::int64_t>());
  c->fp8_block_cols = int(block[1].get<std::int64_t>());
  if (q.contains("modules_to_not_convert") && !q["modules_to_not_convert"].is_null()) {
    const json& keep = q["modules_to_not_convert"];
    check(keep.is_array(), where, ": 'modules_to_not_convert' must be a list, got ", keep.dump());
    for (const json& m : keep) {
      // The embeddings, norms and LM head are never converted; a projection kept in bf16 is not supported.
      const bool projection = m.is_string() && m.get<std::string>().find("proj") != std::string::npos;
      check(m.is_string() && !projection, where, ": modules_to_not_convert ", m.dump(),
            " is not supported (every layer's projections in FP8, or none)");
    }
  }
}

}  // namespace

ModelConfig load_config(const std::string& path) {
  const std::string text = read_checkpoint_text(path);
  json j = json::parse(text, nullptr, false);
  check(!j.is_discarded() && j.is_object(), path, ": not a JSON object");
  FloatTexts float_texts;
  json::sax_parse(text, &float_texts);
  const ConfigReader r(j, path, std::move(float_texts.texts));
  ModelConfig c;
  // The architecture: architectures[0] as HF writes it, else the model_type.
  const KnownArchitecture* arch = nullptr;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string()) {
    const std::string name = j["architectures"][0].get<std::string>();
    for (const KnownArchitecture& k : kArchitectures)
      if (name == k.class_name) arch = &k;
    check(arch != nullptr, path, ": architecture '", name, "' is not supported (", known_list(&KnownArchitecture::class_name),
          ")");
  } else {
    check(j.contains("model_type") && j["model_type"].is_string(), path,
          ": names no architecture (neither 'architectures' nor 'model_type')");
    const std::string type = j["model_type"].get<std::string>();
    for (const KnownArchitecture& k : kArchitectures)
      if (type == k.model_type) arch = &k;
    check(arch != nullptr, path, ": model_type '", type, "' is not supported (", known_list(&KnownArchitecture::model_type),
          ")");
  }
  c.architecture = arch->architecture;
  if (c.architecture == Architecture::Llama) {  // HF LlamaConfig's defaults for the keys a file may leave out
    c.rope_theta = 10000.0;
    c.max_position_embeddings = 2048;
    c.tie_word_embeddings = false;
  }
  r.integer("vocab_size", &c.vocab_size, true);
  r.integer("hidden_size", &c.hidden_size, true);
  r.integer("intermediate_size", &c.intermediate_size, true);
  r.integer("num_hidden_layers", &c.num_hidden_layers, true);
  r.integer("num_attention_heads", &c.num_attention_heads, true);
  c.num_key_value_heads = c.num_attention_heads;
  r.integer("num_key_value_heads", &c.num_key_value_heads, false);
  c.head_dim = c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0;
  r.integer("head_dim", &c.head_dim, false);
  r.real("rope_theta", &c.rope_theta, false);
  r.real("rms_norm_eps", &c.rms_norm_eps, false);
  r.integer("max_position_embeddings", &c.max_position_embeddings, false);
  r.boolean("tie_word_embeddings", &c.tie_word_embeddings, false);
  r.integer("attn_pool_window", &c.attn_pool_window, false);
  r.real("uclip_value", &c.uclip_value, c.is_async());
  check_supported_features(j, r, path, &c);
  read_quantization(j, path, &c);
  if (c.vocab_size >= 1) r.token_ids("eos_token_id", c.vocab_size, &c.eos_token_ids);
  c.validate();
  return c;
}

ModelConfig load_checkpoint_config(const std::string& directory) {
  namespace fs = std::filesystem;
  ModelConfig c = load_config((fs::path(directory) / "config.json").string());
  const std::string path = (fs::path(directory) / "generation_config.json").string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return c;
  const std::string text = read_checkpoint_text(path);
  const json j = json::parse(text, nullptr, false);
  check(!j.is_discarded() && j.is_object(), path, ": not a JSON object");
  const ConfigReader r(j, path, {});
  r.token_ids("eos_token_id", c.vocab_size, &c.eos_token_ids);
  return c;
}

std::string config_to_json(const ModelConfig& c) {
  json j = {{"architectures", {c.architecture_name()}},
            {"model_type", known(c.architecture).model_type},
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
  if (c.architecture == Architecture::Llama) {  // as HF's LlamaConfig writes them
    j["rope_scaling"] = nullptr;
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
  }
  if (c.is_async()) {
    j["attn_pool_window"] = c.attn_pool_window;
    j["uclip_value"] = c.uclip_value;
  }
  if (c.fp8_weights())
    j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                {"weight_block_size", {c.fp8_block_rows, c.fp8_block_cols}}};
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  if (c.eos_token_ids.size() > 1) j["eos_token_id"] = c.eos_token_ids;
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
  if (architecture == Architecture::Llama) {
    // 3 query heads per KV head, as SmolLM2-135M has (9 / 3): a group that is not a power of
    // two, and a q width (384) other than the hidden size (192: transformers' LlamaConfig
    // wants it a multiple of the head count).
    c.hidden_size = 192;
    c.num_attention_heads = 6;
    c.num_key_value_heads = 2;
  }
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
  for (const KnownArchitecture& k : kArchitectures)
    if (name == k.model_type) return k.architecture;
  throw Error("architecture '" + name + "' is not one of " + known_list(&KnownArchitecture::model_type));
}

ModelConfig builtin_config(Architecture architecture, const std::string& size) {
  check(size == "tiny" || size == "1.7b", "model size '", size, "' is not one of tiny, 1.7b");
  return size == "1.7b" ? reference_1p7b_config(architecture) : tiny_config(architecture);
}

}  // namespace asynct
