// Model configurations: HuggingFace config.json for Qwen3ForCausalLM, AsyncTForCausalLM and
// LlamaForCausalLM (docs/DESIGN.md §5), validated, plus the built-in tiny configurations and the
// 1.7B reference size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace asynct {

enum class Architecture { Qwen3, AsyncT, Llama };

struct ModelConfig {
  Architecture architecture = Architecture::Qwen3;
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;
  double rope_theta = 1e6;
  float rms_norm_eps = 1e-6f;
  int max_position_embeddings = 40960;
  bool tie_word_embeddings = true;
  // AsyncT only.
  int attn_pool_window = 3;
  float uclip_value = 0.0f;
  // The tokens that end a generation by default (HF's eos_token_id, an int or a list): from
  // the checkpoint's generation_config.json when it names them, else from config.json; each
  // in [0, vocab_size). Empty: none (the built-in random models).
  std::vector<std::int32_t> eos_token_ids;
  // FP8 weights (config.json's quantization_config, quant_method "fp8", fmt "e4m3", as Qwen
  // publishes them; or --quantization fp8): every layer's seven projections in e4m3, with one
  // float32 scale for each block of fp8_block_rows x fp8_block_cols weights. 0: none.
  int fp8_block_rows = 0, fp8_block_cols = 0;

  bool fp8_weights() const { return fp8_block_rows > 0; }
  bool is_async() const { return architecture == Architecture::AsyncT; }
  std::string architecture_name() const;
  // Throws Error naming the first value out of range.
  void validate() const;
  // Parameters (weights) in the model, counting a tied LM head once.
  std::int64_t parameter_count() const;
};

ModelConfig load_config(const std::string& config_json_path);
// A checkpoint directory's config.json, with eos_token_ids from its generation_config.json when
// that file is there and has eos_token_id (a missing file is fine; one that is not valid JSON,
// or whose eos_token_id is not an int or a list of ints in the vocabulary, is an Error naming it).
ModelConfig load_checkpoint_config(const std::string& directory);
std::string config_to_json(const ModelConfig& config);

// Small configurations for tests and the default run; same shape rules as the real ones. The
// tiny Llama has 3 query heads per KV head (a group size that is not a power of two).
ModelConfig tiny_config(Architecture architecture);
// The Qwen3-1.7B size (hidden 2048, 28 layers, 16/8 heads, head_dim 128, vocab 151936).
ModelConfig reference_1p7b_config(Architecture architecture);

// The names the command line uses: "asynct", "qwen3" or "llama"; an Error otherwise.
Architecture architecture_from_name(const std::string& name);
// A built-in size by name: "tiny" (tiny_config) or "1.7b" (reference_1p7b_config); an Error
// otherwise.
ModelConfig builtin_config(Architecture architecture, const std::string& size);

}  // namespace asynct
