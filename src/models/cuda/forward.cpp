#include "models/cuda/forward.h"

#include <algorithm>
#include <cmath>

#include "kernels/common/cuda_check.h"
#include "kernels/common/device_info.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/attention/prefill/prefill.h"
#include "kernels/sampling/sample_rows.h"
#include "kernels/sampling/sampling.h"
#include "kernels/gemm/fp8_linear.h"
#include "kernels/gemm/skinny_gemm.h"

namespace asynct {

using kernels::bf16;

void Activations::reserve(std::size_t t, const ModelConfig& c) {
  if (t <= capacity) return;
  const std::size_t h = std::size_t(c.hidden_size), qd = std::size_t(c.num_attention_heads) * c.head_dim,
                    kvd = std::size_t(c.num_key_value_heads) * c.head_dim, in = std::size_t(c.intermediate_size);
  residual.resize(t * h);
  hidden.resize(t * h);
  qkv.resize(t * (qd + 2 * kvd));
  q.resize(t * qd);
  k.resize(t * kvd);
  v.resize(t * kvd);
  attn.resize(t * qd);
  attn_out.resize(t * h);
  gate_up.resize(t * 2 * in);
  act.resize(t * in);
  mlp_out.resize(t * h);
  last.resize(t * h);
  linear_partials.reserve(std::size_t(kernels::kMaxLinearSplits) * kernels::kSkinnyMaxRows * std::max(h, qd + 2 * kvd));
  capacity = t;
}

std::array<const void*, 14> Activations::addresses() const {
  return {residual.get(), hidden.get(), qkv.get(), q.get(),       k.get(),    v.get(),      attn.get(),
          attn_out.get(), gate_up.get(), act.get(), mlp_out.get(), last.get(), logits.get(), linear_partials.get()};
}

ModelForward::ModelForward(const ModelWeights& w, const ArchitectureRecipe& recipe, int num_blocks, int block_size,
                           KvCacheDtype kv_dtype, cudaStream_t stream)
    : c_(w.config), recipe_(recipe), sm_count_(kernels::current_device_info().sm_count), weights_(upload_weights(w, recipe_, stream)),
      cache_(c_, kv_dtype, kv_cache_scales(w, kv_dtype), num_blocks, block_size, stream) {
  norm_.eps = recipe_.norm_eps;
  norm_.clip = recipe_.norm == NormKind::UClip ? recipe_.norm_clip : INFINITY;
  // FP8 products the FP8 kernel does not take (more rows, or scale blocks of other widths) run on
  // a bf16 copy of one matrix at a time (fp8_linear.h): room for the largest, allocated now (a
  // graph capture cannot).
  std::size_t largest = 0;
  for (const DeviceLayer& l : weights_.layers)
    for (const DeviceProjection* p : {&l.qkv_proj, &l.o_proj, &l.gate_up_proj, &l.down_proj})
      if (p->is_fp8()) largest = std::max(largest, std::size_t(p->out) * p->in);
  if (largest) fp8_scratch_.resize(largest);
}

void ModelForward::run_model(const StepShape& shape, const StepPointers& step, int rows, PhaseTimer& timer,
                             cudaStream_t stream) {
  const int t = shape.tokens;
  const int h = c_.hidden_size;
  std::vector<DeviceLayer>& layers = weights_.layers;
  if (step.tokens_from_rows)  // a chained step: its token ids are the step before's greedy tokens
    kernels::launch_greedy_tokens(step.previous_summaries, step.previous_rows, step.tokens_from_rows, t, c_.vocab_size,
                                  const_cast<std::int32_t*>(step.tokens), stream);
  kernels::launch_gather_rows(weights_.embed_tokens.get(), step.tokens, act.attn_out.get(), t, c_.vocab_size, h, stream);
  kernels::launch_norm_keeping_input(act.attn_out.get(), act.residual.get(), layers[0].input_layernorm.get(),
                                     act.hidden.get(), t, h, norm_, stream);
  timer.mark("other");

  for (std::size_t l = 0; l < layers.size(); ++l) {
    DeviceLayer& layer = layers[l];
    const kernels::LinearOutput qkv_proj = product_for_reader(layer.qkv_proj, act.hidden.get(), act.qkv.get(), t, stream);
    timer.mark("gemm");
    // With a q/k norm, the decode tokens' norm, RoPE and cache write happen in the decode kernel
    // (it reads the projection); the prefill tokens' here, into dense q, k, v (the prefill kernel
    // writes the cache itself). Without one (Llama) this kernel rotates every token and writes
    // the cache for the decode kernel, which reads q (the prefill tokens' K/V are written again
    // by the prefill kernel, the same values).
    const bool decode_reads_projection = recipe_.qk_norm;
    if (shape.decodes < t || !decode_reads_projection) {
      kernels::QkNormRopeArgs qk;
      qk.qkv = qkv_proj;
      qk.q = act.q.get();
      qk.k = act.k.get();
      qk.v_out = act.v.get();
      qk.qk_norm = recipe_.qk_norm;
      qk.q_weight = layer.q_norm.get();
      qk.k_weight = layer.k_norm.get();
      qk.positions = step.positions;
      qk.tokens = t;
      qk.first_token = decode_reads_projection ? shape.decodes : 0;
      // (An FP8 cache's scales also round the dense K/V as the cache holds them: norms.h.)
      const kernels::PagedKv kv = cache_.paged(int(l), step.block_table, shape.max_blocks);
      qk.kv_element = kv.element;
      qk.key_scales = kv.key_scales;
      qk.value_scales = kv.value_scales;
      if (!decode_reads_projection && shape.decodes > 0) {
        qk.slot_mapping = step.slots;
        qk.key_cache = kv.key_cache;
        qk.value_cache = kv.value_cache;
      }
      qk.num_q_heads = c_.num_attention_heads;
      qk.num_kv_heads = c_.num_key_value_heads;
      qk.head_dim = c_.head_dim;
      qk.rope_theta = float(c_.rope_theta);
      qk.norm = norm_;
      kernels::launch_qk_norm_rope_cache_write(qk, stream);
      timer.mark("norms");
    }
    attention(int(l), shape, step, qkv_proj, stream);
    timer.mark("attention");
    const kernels::LinearOutput attn_proj = product_for_reader(layer.o_proj, act.attn.get(), act.attn_out.get(), t, stream);
    timer.mark("gemm");
    // residual += attn (Peri-LN: residual += norm(attn)). Then the MLP's norm.
    if (recipe_.peri_ln)
      kernels::launch_post_attn_pre_mlp(attn_proj, act.residual.get(), layer.attn_output_layernorm.get(),
                                        layer.post_attention_layernorm.get(), act.hidden.get(), t, h, norm_, stream);
    else
      kernels::launch_fused_add_norm(attn_proj, act.residual.get(), layer.post_attention_layernorm.get(),
                                     act.hidden.get(), t, h, norm_, stream);
    timer.mark("norms");
    gated_product(layer.gate_up_proj, act.hidden.get(), t, stream);
    timer.mark("gemm");
    const kernels::LinearOutput mlp_proj = product_for_reader(layer.down_proj, act.act.get(), act.mlp_out.get(), t, stream);
    timer.mark("gemm");
    // The same step closes the MLP and opens the next layer (or the final norm).
    const bf16* next = l + 1 < layers.size() ? layers[l + 1].input_layernorm.get() : weights_.final_norm.get();
    if (recipe_.peri_ln)
      kernels::launch_post_attn_pre_mlp(mlp_proj, act.residual.get(), layer.mlp_output_layernorm.get(), next,
                                        act.hidden.get(), t, h, norm_, stream);
    else
      kernels::launch_fused_add_norm(mlp_proj, act.residual.get(), next, act.hidden.get(), t, h, norm_, stream);
    timer.mark("norms");
  }

  if (rows > 0) {
    kernels::launch_gather_rows(act.hidden.get(), step.logit_rows, act.last.get(), rows, t, h, stream);
    gemm_.linear(act.last.get(), weights_.lm_head, act.logits.get(), rows, h, c_.vocab_size, true, stream);
    timer.mark("lm_head");
  }
}

void ModelForward::sample(const StepPointers& step, int rows, const Sampling& out, PhaseTimer& timer,
                          cudaStream_t stream) {
  if (rows > 0) {
    if (out.device_draws) {
      kernels::SampleRowsArgs s;
      s.logits = act.logits.get();
      s.rows = rows;
      s.vocab = c_.vocab_size;
      s.sampling = step.sampling;
      s.penalty_tokens = step.penalty_tokens;
      s.logit_bias = step.logit_bias;
      s.token_masks = step.token_masks;
      s.tokens = step.tokens;
      s.logit_rows = step.logit_rows;
      s.summaries = out.summaries;
      s.top_logprobs = out.top_logprobs;
      kernels::launch_sample_rows(s, stream);
    } else {
      kernels::launch_summarize_logits(act.logits.get(), rows, c_.vocab_size, out.summaries, stream);
    }
    timer.mark("sample");
  }
}

kernels::LinearOutput ModelForward::product_for_reader(const DeviceProjection& w, const bf16* x, bf16* y, int rows,
                                                      cudaStream_t stream) {
  if (!w.is_fp8())
    return gemm_.linear_for_reader(x, w.bf16_values.get(), y, act.linear_partials.get(), act.linear_partials.size(),
                                   rows, w.in, w.out, stream);
  if (kernels::fp8_linear_supports(x, w.fp8(), rows))
    return kernels::launch_fp8_linear_partials(x, w.fp8(), act.linear_partials.get(), act.linear_partials.size(), rows,
                                               stream);
  gemm_.linear(x, dequantized(w, stream), y, rows, w.in, w.out, false, stream);
  return kernels::LinearOutput::of(y);
}

void ModelForward::gated_product(const DeviceProjection& w, const bf16* x, int rows, cudaStream_t stream) {
  const int inter = w.out / 2;
  if (!w.is_fp8()) return gemm_.gated_linear(x, w.bf16_values.get(), act.gate_up.get(), act.act.get(), rows, w.in, inter, stream);
  if (kernels::fp8_linear_supports(x, w.fp8(), rows)) return kernels::launch_fp8_linear_glu(x, w.fp8(), act.act.get(), rows, stream);
  gemm_.gated_linear(x, dequantized(w, stream), act.gate_up.get(), act.act.get(), rows, w.in, inter, stream);
}

const bf16* ModelForward::dequantized(const DeviceProjection& w, cudaStream_t stream) {
  kernels::launch_fp8_dequantize(w.fp8(), fp8_scratch_.get(), stream);
  return fp8_scratch_.get();
}

void ModelForward::copy_blocks(const std::vector<BlockCopy>& copies, cudaStream_t stream) {
  cache_.copy_blocks(copies, stream);
}

void ModelForward::reserve_decode_workspace(const StepShape& shape, const StepPointers& step) {
  if (shape.decodes == 0) return;
  const kernels::DecodeParams probe = decode_params(0, step, shape.decodes, shape.max_blocks, shape.decode_kv_len);
  act.decode_workspace.reserve(std::max<std::size_t>(1, kernels::decode_workspace_bytes(probe, probe.num_splits)));
}

kernels::GateArgs ModelForward::gate(const DeviceLayer& l) const {
  kernels::GateArgs g;
  g.kind = recipe_.gate;
  if (recipe_.gate == GateKind::Async) {
    g.pool_window = recipe_.pool_window;
    g.alpha = l.gate_alpha.get();
    g.sigma = l.gate_sigma.get();
    g.gamma = l.gate_gamma.get();
  }
  return g;
}

kernels::DecodeParams ModelForward::decode_params(int layer, const StepPointers& step, int s, int max_blocks,
                                                  int max_kv_len) const {
  kernels::DecodeParams p;
  p.out = act.attn.get();
  p.kv_lens = step.kv_lens;
  p.num_seqs = s;
  p.num_q_heads = c_.num_attention_heads;
  p.max_kv_len = max_kv_len;
  p.kv = cache_.paged(layer, step.block_table, max_blocks);
  p.gate = gate(weights_.layers[std::size_t(layer)]);
  p.num_splits = kernels::decode_num_splits(s, c_.num_key_value_heads, max_kv_len, sm_count_);
  p.workspace = act.decode_workspace.get();
  return p;
}

void ModelForward::attention(int layer, const StepShape& shape, const StepPointers& step,
                             const kernels::LinearOutput& qkv_proj, cudaStream_t stream) {
  const DeviceLayer& l = weights_.layers[std::size_t(layer)];
  if (shape.decodes > 0) {
    kernels::DecodeParams p = decode_params(layer, step, shape.decodes, shape.max_blocks, shape.decode_kv_len);
    if (recipe_.qk_norm) {
      kernels::DecodeProjection& pr = p.projection;  // the decode rows lead the projection
      pr.qkv = qkv_proj;
      pr.q_weight = l.q_norm.get();
      pr.k_weight = l.k_norm.get();
      pr.positions = step.positions;
      pr.slot_mapping = step.slots;
      pr.rope_theta = float(c_.rope_theta);
      pr.norm = norm_;
    } else {
      p.query = act.q.get();  // rotated, and the newest K/V cached, by the qk kernel (run)
    }
    act.decode_workspace.reserve(std::max<std::size_t>(1, kernels::decode_workspace_bytes(p, p.num_splits)));
    p.workspace = act.decode_workspace.get();
    kernels::launch_decode(p, stream);
  }
  if (shape.decodes == shape.seqs) return;
  const std::size_t d = std::size_t(shape.decodes);  // the prefill part starts after them
  const std::size_t qd = std::size_t(c_.num_attention_heads) * c_.head_dim,
                    kvd = std::size_t(c_.num_key_value_heads) * c_.head_dim;
  kernels::PrefillParams p;
  p.query = act.q.get() + d * qd;
  p.key = act.k.get() + d * kvd;  // normalised and rotated in place by the qk-norm kernel
  p.value = act.v.get() + d * kvd;
  p.out = act.attn.get() + d * qd;
  p.cu_seqlens_q = step.prefill_cu_seqlens;
  p.kv_lens = step.kv_lens + d;
  p.num_seqs = shape.seqs - shape.decodes;
  p.total_q = shape.tokens - shape.decodes;
  p.max_q_len = shape.prefill_q_len;
  p.max_kv_len = shape.prefill_kv_len;
  p.num_q_heads = c_.num_attention_heads;
  p.kv = cache_.paged(layer, step.block_table + d * std::size_t(shape.max_blocks), shape.max_blocks);
  p.gate = gate(l);
  // A short prompt after a long cached prefix splits its keys over CTAs (prefill.h); the decode
  // part of the step is done with the workspace by then (one stream).
  if (const std::size_t bytes = kernels::prefill_workspace_bytes(p)) {
    act.decode_workspace.reserve(bytes);
    p.workspace = act.decode_workspace.get();
    p.workspace_bytes = act.decode_workspace.size();
  }
  kernels::launch_prefill(p, stream);
}

}  // namespace asynct
