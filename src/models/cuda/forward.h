// The CUDA runner's forward pass: everything a step does on the device, from the token ids to
// the logits and summaries of the sampling rows, as one stream of launches (the same for eager
// runs and graph capture): the layer loop, and each layer's attention dispatched to the decode
// kernel (leading one-token sequences) and the prefill kernel (the rest).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/logit_summary.h"
#include "engine/model_runner.h"
#include "kernels/common/cuda_array.h"
#include "kernels/attention/decode/decode.h"
#include "kernels/gemm/gemm.h"
#include "kernels/norms/norms.h"
#include "models/architecture.h"
#include "models/config.h"
#include "models/cuda/device_kv_cache.h"
#include "models/cuda/device_weights.h"
#include "models/cuda/phase_timer.h"
#include "models/cuda/step_metadata.h"

namespace asynct {

// A step's activations, sized for `capacity` tokens (they grow, never shrink).
struct Activations {
  using bf16 = kernels::bf16;
  std::size_t capacity = 0;
  // The residual stream is fp32 (norms.h says why); attn_out first holds the embedded tokens.
  kernels::DeviceArray<float> residual;
  kernels::DeviceArray<bf16> hidden, qkv, q, k, v, attn, attn_out, gate_up, act, mlp_out, last;
  // The qkv, o and down products of a decode-sized step, as split partial sums for the kernel
  // after them (linear_output.h): [splits][rows][cols], room for the most splits at the most
  // rows of the widest (each is read before the next is written).
  kernels::DeviceArray<float> linear_partials;
  kernels::DeviceArray<float> logits;  // [rows that sample, vocab]
  kernels::DeviceArray<std::uint8_t> decode_workspace;  // decode's split partials, and prefill's when it splits

  void reserve(std::size_t tokens, const ModelConfig& c);
  // The addresses a captured graph bakes in (GraphAddresses::activations), workspace aside.
  std::array<const void*, 14> addresses() const;
};

class ModelForward {
 public:
  // Uploads the weights (upload_weights) and allocates the cache, of `kv_dtype` (bf16 or fp8, its
  // scales by kv_cache_scales), on `stream`.
  ModelForward(const ModelWeights& weights, const ArchitectureRecipe& recipe, int num_blocks, int block_size,
               KvCacheDtype kv_dtype, cudaStream_t stream);

  // Where a step's rows go: each row's summary (its token, finiteness, logprob) and, with the
  // device sampler, the top logprobs ([rows, kMaxTopLogprobs]).
  struct Sampling {
    LogitSummary* summaries = nullptr;
    TopLogprob* top_logprobs = nullptr;
    bool device_draws = false;  // the device sampler draws every row (StepPointers::sampling);
                                // otherwise the rows are only summarised (their greedy tokens)
  };
  // A step whose metadata is at `step` (already uploaded, or to be by the time the stream gets
  // there) in two parts: the model up to its `rows` logit rows (run_model), then the sampler into
  // `out` (sample), which may be queued later (a step whose token masks come later:
  // StepBatch::masks_later).
  void run_model(const StepShape& shape, const StepPointers& step, int rows, PhaseTimer& timer, cudaStream_t stream);
  void sample(const StepPointers& step, int rows, const Sampling& out, PhaseTimer& timer, cudaStream_t stream);
  // Copies whole KV blocks in every layer's cache (ModelRunner::copy_blocks), queued on `stream`.
  void copy_blocks(const std::vector<BlockCopy>& copies, cudaStream_t stream);
  // Room for the decode kernel's split partials of an all-decode step of this shape (before a
  // graph capture, which must not allocate).
  void reserve_decode_workspace(const StepShape& shape, const StepPointers& step);

  Activations act;

 private:
  // The layers' products on bf16 or FP8 weights: y (or the split partials) for the kernel that
  // reads it (Gemm::linear_for_reader), and act.act = SiLU(gate) * up (Gemm::gated_linear).
  kernels::LinearOutput product_for_reader(const DeviceProjection& w, const kernels::bf16* x, kernels::bf16* y, int rows,
                                           cudaStream_t stream);
  void gated_product(const DeviceProjection& w, const kernels::bf16* x, int rows, cudaStream_t stream);
  // An FP8 projection dequantized into fp8_scratch_ (for products the FP8 kernel does not take).
  const kernels::bf16* dequantized(const DeviceProjection& w, cudaStream_t stream);
  kernels::GateArgs gate(const DeviceLayer& l) const;
  kernels::DecodeParams decode_params(int layer, const StepPointers& step, int s, int max_blocks, int max_kv_len) const;
  void attention(int layer, const StepShape& shape, const StepPointers& step, const kernels::LinearOutput& qkv_proj,
                 cudaStream_t stream);

  ModelConfig c_;
  ArchitectureRecipe recipe_;
  kernels::NormArgs norm_;
  int sm_count_;
  kernels::Gemm gemm_;
  DeviceWeights weights_;
  DeviceKvCache cache_;
  kernels::DeviceArray<kernels::bf16> fp8_scratch_;
};

}  // namespace asynct
