// The weights of a Qwen3, AsyncT or Llama model, by HuggingFace tensor name, on the host. The
// embeddings, projections and norms are bf16, the engine's precision, when made here or loaded
// from a bf16 checkpoint (then as views of the mapped files: the GPU backend uploads them with
// no host copy); loaded from a float32 or float16 checkpoint they are float32 (the GPU backend
// rounds them as it uploads). AsyncT's gate parameters are float32. The CPU backend computes on
// a float32 copy (to_float32). Loading checks every tensor's presence and shape against the
// config, and rejects unexpected tensors and values that are not finite as bf16.
//
// FP8 weights (ModelConfig::fp8_weights: an FP8 checkpoint, or quantize_fp8): the seven
// projections of every layer are e4m3 (DType::F8E4M3), each with its block scales; the
// embeddings, norms and LM head stay bf16.
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
  Tensor q_norm, k_norm;            // [D]; not defined() without a q/k norm (Llama)
  Tensor post_attention_layernorm;  // [H], the norm in front of the MLP
  Tensor gate_proj, up_proj;        // [I, H]
  Tensor down_proj;                 // [H, I]
  // AsyncT only.
  Tensor gate_alpha, gate_sigma, gate_gamma;  // [Hq], float32
  Tensor attn_output_layernorm;               // [H]
  Tensor mlp_output_layernorm;                // [H]
  // FP8 weights only: each projection's scales, float32 [ceil(rows / block_rows),
  // ceil(cols / block_cols)]; weight (r, c) is its e4m3 value times scale[r / block_rows][c /
  // block_cols] (HF's weight_scale_inv, which despite the name multiplies).
  Tensor q_proj_scale, k_proj_scale, v_proj_scale, o_proj_scale, gate_proj_scale, up_proj_scale, down_proj_scale;
  // A checkpoint's FP8 KV-cache scales (self_attn.k_scale / v_scale, as llm-compressor and
  // vLLM write them), float32 [Hkv] (one scale for all heads is repeated); undefined when the
  // checkpoint has none (models/kv_cache_format.h then derives them).
  Tensor k_scale, v_scale;
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

// Loads the configuration (load_checkpoint_config) and the safetensors weights of a checkpoint
// directory.
ModelWeights load_weights(const std::string& directory);

// The same weights with every tensor float32 (the CPU backend's precision); FP8 projections
// are dequantized with their scales.
ModelWeights to_float32(ModelWeights weights);

// A projection as float32: e4m3 values times their blocks' scales (FP8 weights), else its
// values converted.
Tensor dequantize_projection(const Tensor& weight, const Tensor& scale, int block_rows, int block_cols);

// --quantization fp8: bf16 or float32 weights with the seven projections of every layer
// quantized to e4m3 in blocks of block_rows x block_cols, each block's scale its largest
// magnitude / 448 (a block of zeros has scale 1). Weights already in FP8 come back unchanged.
// The default block is one output row by 128 inputs: on SmolLM2-135M it keeps perplexity within
// 1.0% of bf16 (1.3% with the FP8 cache too) where the 128 x 128 blocks FP8 checkpoints are
// published in lose 5% and 16 x 128 blocks 1.2% (4.2% with the FP8 cache) (bench/RESULTS [F1]);
// its scales add 3% to the weights' bytes, and a product applies a row's scale once per 128 of
// its inputs.
constexpr int kFp8WeightBlockRows = 1, kFp8WeightBlockCols = 128;
ModelWeights quantize_fp8(ModelWeights weights, int block_rows = kFp8WeightBlockRows, int block_cols = kFp8WeightBlockCols);

// Writes a checkpoint directory (config.json + model.safetensors, weights in bf16 or FP8 with
// their scales, as held; the gate parameters and scales in float32).
void save_checkpoint(const ModelWeights& weights, const std::string& directory);

// Writes a checkpoint of random_weights(config, seed) (`asynct init-checkpoint`).
void write_random_checkpoint(const ModelConfig& config, std::uint64_t seed, const std::string& directory);

}  // namespace asynct
