#include "models/cpu/cpu_model_runner.h"

#include <algorithm>

#include "core/parallel.h"
#include "reference/attention.h"
#include "reference/layers.h"
#include "reference/rope.h"
#include "models/step_sampling.h"

namespace asynct {

namespace {
// The cache geometry, checked before anything is allocated.
int checked_num_blocks(int num_blocks, int block_size) {
  check_block_size(block_size, Backend::Cpu);
  check(num_blocks >= 1, "CpuModelRunner: need at least one block");
  return num_blocks;
}
}  // namespace

CpuModelRunner::CpuModelRunner(ModelWeights weights, int num_blocks, int block_size, KvCacheDtype kv_dtype)
    : num_blocks_(checked_num_blocks(num_blocks, block_size)), block_size_(block_size), kv_dtype_(kv_dtype),
      kv_scales_(kv_cache_scales(weights, kv_dtype)), weights_(to_float32(std::move(weights))),
      recipe_(recipe_of(weights_.config)) {
  const ModelConfig& c = weights_.config;
  // Qwen3 normalises with RMSNorm; AsyncT's every norm is a UClipNorm (docs/DESIGN.md §5).
  norm_ = recipe_.norm == NormKind::UClip ? NormConfig::uclip(recipe_.norm_eps, recipe_.norm_clip)
                                          : NormConfig::rms(recipe_.norm_eps);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& w = weights_.layers[std::size_t(l)];
    if (recipe_.gate == GateKind::Async) {
      Gate g = Gate::make_async(c.num_attention_heads, recipe_.pool_window);
      g.async.alpha = w.gate_alpha.to_float_vector();
      g.async.sigma = w.gate_sigma.to_float_vector();
      g.async.gamma = w.gate_gamma.to_float_vector();
      gates_.push_back(g);
    } else {
      gates_.push_back(Gate::make_softmax());
    }
    key_cache_.push_back(Tensor::empty(DType::F32, {num_blocks, block_size, c.num_key_value_heads, c.head_dim}));
    value_cache_.push_back(Tensor::empty(DType::F32, {num_blocks, block_size, c.num_key_value_heads, c.head_dim}));
  }
}

Tensor CpuModelRunner::attention_block(int layer, const Tensor& x, const StepBatch& batch,
                                       const Tensor& table) {
  const ModelConfig& c = weights_.config;
  const LayerWeights& w = weights_.layers[std::size_t(layer)];
  const std::int64_t t = x.size(0);
  Tensor q = linear(x, w.q_proj).reshape({t, c.num_attention_heads, c.head_dim});
  Tensor k = linear(x, w.k_proj).reshape({t, c.num_key_value_heads, c.head_dim});
  Tensor v = linear(x, w.v_proj).reshape({t, c.num_key_value_heads, c.head_dim});
  Tensor& key_cache = key_cache_[std::size_t(layer)];
  Tensor& value_cache = value_cache_[std::size_t(layer)];
  // RoPE and the cache write, after the per-head q/k norm when the model has one (not Llama).
  QkNormRopeOutput qk =
      recipe_.qk_norm ? qk_norm_rope_cache_write(q, k, v, w.q_norm, w.k_norm, norm_, batch.positions, c.rope_theta,
                                                 key_cache, value_cache, batch.slot_mapping)
                      : rope_cache_write(q, k, v, batch.positions, c.rope_theta, key_cache, value_cache,
                                         batch.slot_mapping);
  round_written_rows(layer, batch.slot_mapping);
  KvCache cache = KvCache::paged(key_cache, value_cache, table);
  AttentionBatch ab{qk.q, batch.cu_seqlens_q, batch.kv_lens, &cache, 0.0f};
  Tensor o = attention(ab, gates_[std::size_t(layer)]);
  return linear(o.reshape({t, std::int64_t(c.num_attention_heads) * c.head_dim}), w.o_proj);
}

void CpuModelRunner::round_written_rows(int layer, const std::vector<std::int64_t>& slots) {
  if (kv_dtype_ == KvCacheDtype::Float32) return;
  const int heads = weights_.config.num_key_value_heads, d = weights_.config.head_dim;
  float* keys = key_cache_[std::size_t(layer)].data_as<float>();
  float* values = value_cache_[std::size_t(layer)].data_as<float>();
  for (const std::int64_t slot : slots)
    for (int h = 0; h < heads; ++h) {
      const std::int64_t at = (slot * heads + h) * d;
      const float k_scale = kv_scales_.key_scale(layer, h), v_scale = kv_scales_.value_scale(layer, h);
      for (int i = 0; i < d; ++i) {
        keys[at + i] = round_to_kv_cache(keys[at + i], kv_dtype_, k_scale);
        values[at + i] = round_to_kv_cache(values[at + i], kv_dtype_, v_scale);
      }
    }
}

Tensor CpuModelRunner::mlp_block(int layer, const Tensor& x) {
  const LayerWeights& w = weights_.layers[std::size_t(layer)];
  Tensor gate = linear(x, w.gate_proj), up = linear(x, w.up_proj);
  const std::int64_t t = x.size(0), inter = gate.size(1);
  Tensor gate_up = Tensor::empty(DType::F32, {t, 2 * inter});
  for (std::int64_t r = 0; r < t; ++r) {
    std::copy_n(gate.data_as<float>() + r * inter, inter, gate_up.data_as<float>() + r * 2 * inter);
    std::copy_n(up.data_as<float>() + r * inter, inter, gate_up.data_as<float>() + r * 2 * inter + inter);
  }
  return linear(swiglu(gate_up), w.down_proj);
}

void CpuModelRunner::submit(const StepBatch& batch) {
  const ModelConfig& c = weights_.config;
  steps_.submit(batch, {num_blocks_, block_size_, c.vocab_size, c.max_position_embeddings},
                [&](const StepBatch& b, const std::vector<std::int32_t>& tokens) { return run(b, tokens); });
}

void CpuModelRunner::supply_masks(const StepBatch& batch) {
  steps_.supply_masks(batch, [&](const StepBatch& b, const std::vector<std::int32_t>& tokens) { return run(b, tokens); });
}

void CpuModelRunner::copy_blocks(const std::vector<BlockCopy>& copies) {
  const ModelConfig& c = weights_.config;
  const std::size_t per_block = std::size_t(block_size_) * std::size_t(c.num_key_value_heads) * std::size_t(c.head_dim);
  for (const BlockCopy& copy : copies) {
    check(copy.from >= 0 && copy.from < num_blocks_ && copy.to >= 0 && copy.to < num_blocks_ && copy.from != copy.to,
          "copy_blocks: block ", copy.from, " to ", copy.to, " (the cache has ", num_blocks_, ")");
    for (std::vector<Tensor>* cache : {&key_cache_, &value_cache_})
      for (Tensor& layer : *cache) {
        float* base = layer.data_as<float>();
        std::copy_n(base + std::size_t(copy.from) * per_block, per_block, base + std::size_t(copy.to) * per_block);
      }
  }
}

CpuModelRunner::Result CpuModelRunner::run(const StepBatch& batch, const std::vector<std::int32_t>& tokens) {
  const ModelConfig& c = weights_.config;  // the batch is checked (submit)
  std::size_t max_blocks = 1;
  for (const auto& t : batch.block_tables) max_blocks = std::max(max_blocks, t.size());
  Tensor table = Tensor::empty(DType::I32, {batch.num_seqs(), std::int64_t(max_blocks)});
  for (int s = 0; s < batch.num_seqs(); ++s)
    for (std::size_t b = 0; b < batch.block_tables[std::size_t(s)].size(); ++b) {
      table.data_as<std::int32_t>()[std::int64_t(s) * std::int64_t(max_blocks) + std::int64_t(b)] =
          batch.block_tables[std::size_t(s)][b];
    }

  Tensor x = embedding(weights_.embed_tokens, tokens);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& w = weights_.layers[std::size_t(l)];
    Tensor attn = attention_block(l, norm(x, w.input_layernorm, norm_), batch, table);
    if (recipe_.peri_ln) attn = norm(attn, w.attn_output_layernorm, norm_);
    Tensor h = add(x, attn);
    Tensor mlp = mlp_block(l, norm(h, w.post_attention_layernorm, norm_));
    if (recipe_.peri_ln) mlp = norm(mlp, w.mlp_output_layernorm, norm_);
    x = add(h, mlp);
  }
  // Only the rows that sample need the final norm and the LM head.
  Tensor last = Tensor::empty(DType::F32, {std::int64_t(batch.logit_rows.size()), c.hidden_size});
  for (std::size_t i = 0; i < batch.logit_rows.size(); ++i) {
    const int row = batch.logit_rows[i];
    std::copy_n(x.data_as<float>() + std::int64_t(row) * c.hidden_size, c.hidden_size,
                last.data_as<float>() + std::int64_t(i) * c.hidden_size);
  }
  Result r;
  r.logits = linear(norm(last, weights_.norm, norm_), weights_.lm_head);

  // Every row is on the host already. A row is ~0.1-1 ms at a 152K vocabulary when it does more
  // than take the argmax: those run on the host's threads.
  const bool cheap = only_argmax_rows(batch);
  sample_step_rows(batch, tokens, r.logits.data_as<float>(), std::size_t(c.vocab_size), &r.output,
                   [cheap](std::size_t rows, const std::function<void(std::size_t)>& f) { parallel_for(rows, f, cheap ? 1 : 0); });
  return r;
}

}  // namespace asynct
