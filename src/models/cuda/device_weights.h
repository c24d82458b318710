// The model's weights on the device as the CUDA runner's kernels read them (bf16, or the seven
// projections in FP8 with their scales; q/k/v and gate/up merged), and their upload from host
// weights. (The KV cache is device_kv_cache.h.)
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "kernels/attention/attention_args.h"  // kernels::bf16
#include "kernels/common/cuda_array.h"
#include "kernels/gemm/fp8_linear.h"
#include "models/architecture.h"
#include "models/weights.h"

namespace asynct {

// A projection [out, in] as the products read it: bf16, or (FP8 weights) e4m3 values with one
// scale per row and block of inputs in the device order (kernels/gemm/fp8_linear.h; a
// checkpoint's blocks of several rows are expanded to one scale per weight row, which lets the
// merged projections reorder rows).
struct DeviceProjection {
  kernels::DeviceArray<kernels::bf16> bf16_values;
  kernels::DeviceArray<std::uint8_t> fp8_values;
  kernels::DeviceArray<float> fp8_scales;
  int out = 0, in = 0, block_cols = 0;

  bool is_fp8() const { return fp8_values.get() != nullptr; }
  kernels::Fp8Matrix fp8() const {
    kernels::Fp8Matrix m;
    m.values = fp8_values.get();
    m.scales = fp8_scales.get();
    m.out = out;
    m.in = in;
    m.block_cols = block_cols;
    return m;
  }
};

struct DeviceLayer {
  using bf16 = kernels::bf16;
  kernels::DeviceArray<bf16> input_layernorm, q_norm, k_norm, post_attention_layernorm;
  // qkv_proj: q_proj, k_proj and v_proj stacked by rows, so that one GEMM makes all three (at
  // decode sizes a GEMM costs ~6 us however small it is: three cost 18, one 7).
  // gate_up_proj: [2 I, H] in the device's block order (linear_output.h).
  DeviceProjection qkv_proj, o_proj, gate_up_proj, down_proj;
  kernels::DeviceArray<bf16> attn_output_layernorm, mlp_output_layernorm;  // Peri-LN
  kernels::DeviceArray<float> gate_alpha, gate_sigma, gate_gamma;          // the async gate
};

struct DeviceWeights {
  std::vector<DeviceLayer> layers;
  kernels::DeviceArray<kernels::bf16> embed_tokens, final_norm, lm_head_untied;
  const kernels::bf16* lm_head = nullptr;  // embed_tokens when the embeddings are tied
};

// Uploads the weights the recipe uses (bf16 or float32 on the host) on `stream`; returns when
// every copy has landed.
DeviceWeights upload_weights(const ModelWeights& weights, const ArchitectureRecipe& recipe, cudaStream_t stream);

}  // namespace asynct
