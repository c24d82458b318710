// The weights of a Qwen3 or AsyncT model, by HuggingFace tensor name, on the host in the
// engine's precision: bf16 for the embeddings, projections and norms (as checkpoints store
// them; a float32 or float16 checkpoint is rounded on load), float32 for AsyncT's gate
// parameters. Loaded from a bf16 checkpoint they are views of the mapped files, so the GPU
// backend uploads them with no host copy; the CPU backend computes on a float32 copy
// (to_float32). Loading checks every tensor's presence and shape against the config, rejects
// unexpected tensors and non-finite values.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/config.h"

namespace asynct {

struct LayerWeights {
  Tensor input_layernorm;           // [H]
  Tensor q_proj, k_proj, v_proj;    // [Hq*D, H], [Hkv*D, H], [Hkv*D, H]
  Tensor o_proj;                    // [H, Hq*D]
  Tensor q_norm, k_norm;            // [D]
  Tensor post_attention_layernorm;  // [H], the norm in front of the MLP
  Tensor gate_proj, up_proj;        // [I, H]
  Tensor down_proj;                 // [H, I]
  // AsyncT only.
  Tensor gate_alpha, gate_sigma, gate_gamma;  // [Hq], float32
  Tensor attn_output_layernorm;               // [H]
  Tensor mlp_output_layernorm;                // [H]
};

struct ModelWeights {
  ModelConfig config;
  Tensor embed_tokens;  // [V, H]
  std::vector<LayerWeights> layers;
  Tensor norm;          // [H]
  Tensor lm_head;       // [V, H]; the same tensor as embed_tokens when tied
};

// Every tensor a model of this config has: name -> shape.
std::map<std::string, Shape> expected_tensors(const ModelConfig& config);

// Deterministic random weights for any config (the same seed gives the same model).
ModelWeights random_weights(const ModelConfig& config, std::uint64_t seed);

// Loads config.json and the safetensors weights of a checkpoint directory.
ModelWeights load_weights(const std::string& directory);

// The same weights with every tensor float32 (the CPU backend's precision).
ModelWeights to_float32(ModelWeights weights);

// Writes a checkpoint directory (config.json + model.safetensors, weights in bf16; the gate
// parameters in float32).
void save_checkpoint(const ModelWeights& weights, const std::string& directory);

}  // namespace asynct
