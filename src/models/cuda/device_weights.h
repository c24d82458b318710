// The model's weights on the device as the CUDA runner's kernels read them (bf16, q/k/v and
// gate/up merged), each layer's paged KV cache, and their upload from host weights.
#pragma once

#include <vector>

#include <cuda_runtime_api.h>

#include "kernels/attention/attention_args.h"  // kernels::bf16
#include "kernels/common/cuda_array.h"
#include "models/architecture.h"
#include "models/weights.h"

namespace asynct {

struct DeviceLayer {
  using bf16 = kernels::bf16;
  // qkv_proj: q_proj, k_proj and v_proj stacked by rows, so that one GEMM makes all three (at
  // decode sizes a GEMM costs ~6 us however small it is: three cost 18, one 7).
  kernels::DeviceArray<bf16> input_layernorm, qkv_proj, o_proj, q_norm, k_norm;
  // gate_up_proj: [2 I, H] in the device's block order (linear_output.h).
  kernels::DeviceArray<bf16> post_attention_layernorm, gate_up_proj, down_proj;
  kernels::DeviceArray<bf16> attn_output_layernorm, mlp_output_layernorm;  // Peri-LN
  kernels::DeviceArray<float> gate_alpha, gate_sigma, gate_gamma;          // the async gate
  kernels::DeviceArray<bf16> key_cache, value_cache;  // [num_blocks, block_size, Hkv, D]
};

struct DeviceWeights {
  std::vector<DeviceLayer> layers;
  kernels::DeviceArray<kernels::bf16> embed_tokens, final_norm, lm_head_untied;
  const kernels::bf16* lm_head = nullptr;  // embed_tokens when the embeddings are tied
};

// Uploads the weights the recipe uses (bf16 or float32 on the host) on `stream`, and allocates
// each layer's KV cache of cache_elements values; returns when every copy has landed.
DeviceWeights upload_weights(const ModelWeights& weights, const ArchitectureRecipe& recipe,
                             std::size_t cache_elements, cudaStream_t stream);

}  // namespace asynct
