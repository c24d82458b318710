#include "models/cpu_fast/cpu_fast_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/parallel.h"
#include "models/cpu_fast/attention.h"
#include "models/cpu_fast/kernels.h"
#include "models/cpu_fast/linear.h"
#include "models/step_sampling.h"

namespace asynct {

using cpu_fast::LinearPart;

namespace {

int checked_num_blocks(int num_blocks, int block_size) {
  check_block_size(block_size, Backend::Cpu);
  check(num_blocks >= 1, "CpuFastModelRunner: need at least one block");
  return num_blocks;
}

// A projection or embedding as bf16: a view of the tensor as loaded, or its values rounded once.
const std::uint16_t* bf16_data(Tensor& t, const char* name) {
  check(t.dtype() == DType::BF16 || t.dtype() == DType::F32, "CpuFastModelRunner: ", name, " is ",
        dtype_name(t.dtype()), "; the production CPU backend reads bf16 or float32");
  if (t.dtype() == DType::F32) t = t.to(DType::BF16);
  return reinterpret_cast<const std::uint16_t*>(t.data());
}

// A projection as the products read it: bf16 (bf16_data), or e4m3 with its block scales.
cpu_fast::Projection projection(Tensor& weight, const Tensor& scale, const ModelConfig& c, const char* name) {
  cpu_fast::Projection p;
  if (!c.fp8_weights()) {
    p.bf16 = bf16_data(weight, name);
    return p;
  }
  check(weight.dtype() == DType::F8E4M3 && scale.defined() && scale.dtype() == DType::F32, "CpuFastModelRunner: ", name,
        " is not FP8 with float32 scales");
  p.fp8 = reinterpret_cast<const std::uint8_t*>(weight.data());
  p.scales = scale.data_as<float>();
  p.block_rows = c.fp8_block_rows;
  p.block_cols = c.fp8_block_cols;
  return p;
}

std::vector<float> floats(const Tensor& t) { return t.defined() && t.numel() > 0 ? t.to_float_vector() : std::vector<float>(); }

}  // namespace

CpuFastModelRunner::CpuFastModelRunner(ModelWeights weights, int num_blocks, int block_size, KvCacheDtype kv_dtype,
                                       bool int8_weights)
    : num_blocks_(checked_num_blocks(num_blocks, block_size)), block_size_(block_size),
      weights_(std::move(weights)), recipe_(recipe_of(weights_.config)),
      // The cache's scales from the weights as given (before any is rounded to bf16 below), as
      // the reference takes them.
      kv_cache_(weights_.config, num_blocks_, block_size, kv_dtype, kv_cache_scales(weights_, kv_dtype)) {
  const ModelConfig& c = weights_.config;
  norm_clip_ = recipe_.norm == NormKind::UClip ? recipe_.norm_clip : std::numeric_limits<float>::infinity();
  check(!int8_weights || !c.fp8_weights(), "--quantization int8 quantizes bf16 weights; these are FP8");
  const bool tied = weights_.lm_head.data() == weights_.embed_tokens.data();
  bf16_data(weights_.embed_tokens, "embed_tokens");
  if (tied) weights_.lm_head = weights_.embed_tokens;
  else bf16_data(weights_.lm_head, "lm_head");
  lm_head_.bf16 = reinterpret_cast<const std::uint16_t*>(weights_.lm_head.data());
  final_norm_ = floats(weights_.norm);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights& w = weights_.layers[std::size_t(l)];
    Layer layer;
    layer.q = projection(w.q_proj, w.q_proj_scale, c, "q_proj");
    layer.k = projection(w.k_proj, w.k_proj_scale, c, "k_proj");
    layer.v = projection(w.v_proj, w.v_proj_scale, c, "v_proj");
    layer.o = projection(w.o_proj, w.o_proj_scale, c, "o_proj");
    layer.gate = projection(w.gate_proj, w.gate_proj_scale, c, "gate_proj");
    layer.up = projection(w.up_proj, w.up_proj_scale, c, "up_proj");
    layer.down = projection(w.down_proj, w.down_proj_scale, c, "down_proj");
    layer.input_norm = floats(w.input_layernorm);
    layer.post_attention_norm = floats(w.post_attention_layernorm);
    if (recipe_.qk_norm) {
      layer.q_norm = floats(w.q_norm);
      layer.k_norm = floats(w.k_norm);
    }
    if (recipe_.peri_ln) {
      layer.attn_output_norm = floats(w.attn_output_layernorm);
      layer.mlp_output_norm = floats(w.mlp_output_layernorm);
    }
    if (recipe_.gate == GateKind::Async) {
      layer.attention_gate = Gate::make_async(c.num_attention_heads, recipe_.pool_window);
      layer.attention_gate.async.alpha = w.gate_alpha.to_float_vector();
      layer.attention_gate.async.sigma = w.gate_sigma.to_float_vector();
      layer.attention_gate.async.gamma = w.gate_gamma.to_float_vector();
    } else {
      layer.attention_gate = Gate::make_softmax();
    }
    layers_.push_back(std::move(layer));
  }
  if (int8_weights) quantize_int8_weights();
  for (int i = 0; i < c.head_dim / 2; ++i)
    inv_freq_.push_back(std::pow(double(c.rope_theta), -2.0 * double(i) / double(c.head_dim)));
}

void CpuFastModelRunner::quantize_int8_weights() {
  const ModelConfig& c = weights_.config;
  const int h = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim,
            inter = c.intermediate_size;
  struct Matrix {
    cpu_fast::Projection* projection;
    int rows, in;
  };
  std::vector<Matrix> matrices;
  for (Layer& l : layers_)
    for (const Matrix& m : {Matrix{&l.q, q, h}, Matrix{&l.k, kv, h}, Matrix{&l.v, kv, h}, Matrix{&l.o, h, q},
                            Matrix{&l.gate, inter, h}, Matrix{&l.up, inter, h}, Matrix{&l.down, h, inter}})
      matrices.push_back(m);
  matrices.push_back({&lm_head_, c.vocab_size, h});
  int8_.resize(matrices.size());
  pool_.run(matrices.size(), [&](std::size_t i) {
    const Matrix& m = matrices[i];
    int8_[i] = std::make_unique<cpu_fast::Int8Matrix>(cpu_fast::quantize_int8(m.projection->bf16, m.rows, m.in));
    *m.projection = cpu_fast::Projection{.int8 = int8_[i].get()};
  });
}

template <typename Fn>
void CpuFastModelRunner::for_rows(std::int64_t rows, const Fn& fn) {
  constexpr std::int64_t kPiece = 16;
  if (rows <= kPiece) return fn(std::int64_t(0), rows);
  pool_.run(std::size_t((rows + kPiece - 1) / kPiece), [&](std::size_t p) {
    const std::int64_t first = std::int64_t(p) * kPiece;
    fn(first, std::min(rows, first + kPiece));
  });
}

void CpuFastModelRunner::attention_block(int index, const StepBatch& batch) {
  const Layer& layer = layers_[std::size_t(index)];
  const ModelConfig& c = weights_.config;
  const std::int64_t t = batch.num_tokens(), h = c.hidden_size;
  const int hq = c.num_attention_heads, hkv = c.num_key_value_heads, d = c.head_dim, half = d / 2;
  const std::int64_t width = std::int64_t(hq + 2 * hkv) * d;
  qkv_.resize(std::size_t(t * width));
  cpu_fast::linear(pool_, x_norm_.data(), t, h, int(h),
                        {{layer.q, hq * d, 0}, {layer.k, hkv * d, std::int64_t(hq) * d},
                         {layer.v, hkv * d, std::int64_t(hq + hkv) * d}},
                        qkv_.data(), width);
  // Per token: the q/k norm per head (Qwen3, AsyncT), RoPE, and the cache write (bf16, or e4m3 at
  // each KV head's scale).
  const float eps = recipe_.norm_eps;
  for_rows(t, [&](std::int64_t first, std::int64_t last) {
    float normed[512];  // head_dim <= 512 (checked by the config)
    for (std::int64_t i = first; i < last; ++i) {
      float* row = qkv_.data() + i * width;
      const float* cs = cos_.data() + i * half;
      const float* sn = sin_.data() + i * half;
      for (int head = 0; head < hq + hkv; ++head) {
        float* x = row + std::int64_t(head) * d;
        if (recipe_.qk_norm) {
          cpu_fast::norm_row(x, d, head < hq ? layer.q_norm.data() : layer.k_norm.data(), eps, norm_clip_, normed);
          std::memcpy(x, normed, sizeof(float) * std::size_t(d));
        }
        for (int k = 0; k < half; ++k) {
          const float a = x[k], b = x[k + half];
          x[k] = a * cs[k] - b * sn[k];
          x[k + half] = b * cs[k] + a * sn[k];
        }
      }
      const std::int64_t slot = batch.slot_mapping[std::size_t(i)];
      if (slot >= 0) kv_cache_.write(index, slot, row + std::int64_t(hq) * d, row + std::int64_t(hq + hkv) * d);
    }
  });
  q_.resize(std::size_t(t) * std::size_t(hq) * std::size_t(d));
  for (std::int64_t i = 0; i < t; ++i) std::memcpy(q_.data() + i * hq * d, qkv_.data() + i * width, sizeof(float) * std::size_t(hq * d));
  attn_.resize(q_.size());
  cpu_fast::paged_attention(pool_, q_.data(), hq, batch, kv_cache_.paged(index), layer.attention_gate, float(1.0 / std::sqrt(double(d))),
                            attn_.data());
  proj_.resize(std::size_t(t * h));
  cpu_fast::linear(pool_, attn_.data(), t, std::int64_t(hq) * d, hq * d, {{layer.o, int(h), 0}}, proj_.data(), h);
}

void CpuFastModelRunner::mlp_block(const Layer& layer) {
  const ModelConfig& c = weights_.config;
  const std::int64_t t = std::int64_t(x_.size()) / c.hidden_size, h = c.hidden_size, inter = c.intermediate_size;
  gate_up_.resize(std::size_t(t * 2 * inter));
  cpu_fast::linear(pool_, x_norm_.data(), t, h, int(h), {{layer.gate, int(inter), 0}, {layer.up, int(inter), inter}},
                        gate_up_.data(), 2 * inter);
  act_.resize(std::size_t(t * inter));
  for_rows(t, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t i = first; i < last; ++i)
      cpu_fast::swiglu_row(gate_up_.data() + i * 2 * inter, gate_up_.data() + i * 2 * inter + inter, int(inter),
                           act_.data() + i * inter);
  });
  proj_.resize(std::size_t(t * h));
  cpu_fast::linear(pool_, act_.data(), t, inter, int(inter), {{layer.down, int(h), 0}}, proj_.data(), h);
}

void CpuFastModelRunner::submit(const StepBatch& batch) {
  const ModelConfig& c = weights_.config;
  steps_.submit(batch, {num_blocks_, block_size_, c.vocab_size, c.max_position_embeddings},
                [&](const StepBatch& b, const std::vector<std::int32_t>& tokens) { return run(b, tokens); });
}

void CpuFastModelRunner::supply_masks(const StepBatch& batch) {
  steps_.supply_masks(batch, [&](const StepBatch& b, const std::vector<std::int32_t>& tokens) { return run(b, tokens); });
}

void CpuFastModelRunner::copy_blocks(const std::vector<BlockCopy>& copies) { kv_cache_.copy_blocks(copies); }

CpuFastModelRunner::Result CpuFastModelRunner::run(const StepBatch& batch, const std::vector<std::int32_t>& tokens) {
  const ModelConfig& c = weights_.config;  // the batch is checked (submit)
  const std::int64_t t = batch.num_tokens(), h = c.hidden_size;
  const int half = c.head_dim / 2;
  const float eps = recipe_.norm_eps;
  const auto* embed = reinterpret_cast<const std::uint16_t*>(weights_.embed_tokens.data());
  x_.resize(std::size_t(t * h));
  x_norm_.resize(x_.size());
  cos_.resize(std::size_t(t) * std::size_t(half));
  sin_.resize(cos_.size());
  for_rows(t, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t i = first; i < last; ++i) {
      cpu_fast::bf16_to_float_row(embed + std::int64_t(tokens[std::size_t(i)]) * h, x_.data() + i * h, int(h));
      for (int k = 0; k < half; ++k) {
        const double angle = double(batch.positions[std::size_t(i)]) * inv_freq_[std::size_t(k)];
        cos_[std::size_t(i * half + k)] = float(std::cos(angle));
        sin_[std::size_t(i * half + k)] = float(std::sin(angle));
      }
    }
  });
  // x_norm_ = norm(x_) with these weights; then `out` normed in place when given (Peri-LN) and added to x_.
  const auto norm_rows = [&](std::vector<float>& in, const std::vector<float>& w, std::vector<float>& out) {
    for_rows(t, [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t i = first; i < last; ++i) cpu_fast::norm_row(in.data() + i * h, int(h), w.data(), eps, norm_clip_, out.data() + i * h);
    });
  };
  const auto add_residual = [&](const std::vector<float>& out_norm) {
    for_rows(t, [&](std::int64_t first, std::int64_t last) {
      thread_local std::vector<float> normed;
      normed.resize(std::size_t(h));
      for (std::int64_t i = first; i < last; ++i) {
        const float* p = proj_.data() + i * h;
        if (!out_norm.empty()) {
          cpu_fast::norm_row(p, int(h), out_norm.data(), eps, norm_clip_, normed.data());
          p = normed.data();
        }
        cpu_fast::add_row(x_.data() + i * h, p, int(h));
      }
    });
  };
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
    norm_rows(x_, layer.input_norm, x_norm_);
    attention_block(int(l), batch);
    add_residual(layer.attn_output_norm);
    norm_rows(x_, layer.post_attention_norm, x_norm_);
    mlp_block(layer);
    add_residual(layer.mlp_output_norm);
  }
  // Only the rows that sample need the final norm and the LM head.
  const std::size_t rows = batch.logit_rows.size(), vocab = std::size_t(c.vocab_size);
  std::vector<float> last(rows * std::size_t(h));
  for (std::size_t i = 0; i < rows; ++i)
    cpu_fast::norm_row(x_.data() + std::int64_t(batch.logit_rows[i]) * h, int(h), final_norm_.data(), eps, norm_clip_,
                       last.data() + std::int64_t(i) * h);
  Result r;
  r.logits.resize(rows * vocab);
  cpu_fast::linear(pool_, last.data(), std::int64_t(rows), h, int(h), {{lm_head_, int(vocab), 0}}, r.logits.data(),
                   std::int64_t(vocab));

  // Sampling as the reference runner samples; rows with more than an argmax on the pool's threads.
  const bool cheap = only_argmax_rows(batch);
  sample_step_rows(batch, tokens, r.logits.data(), vocab, &r.output,
                   [this, cheap](std::size_t count, const std::function<void(std::size_t)>& f) {
                     if (cheap || count <= 1) {
                       for (std::size_t i = 0; i < count; ++i) f(i);
                     } else {
                       pool_.run(count, f);
                     }
                   });
  return r;
}

}  // namespace asynct
