#include "models/architecture.h"

namespace asynct {

ArchitectureRecipe recipe_of(const ModelConfig& c) {
  ArchitectureRecipe r;
  r.norm_eps = c.rms_norm_eps;
  switch (c.architecture) {
    case Architecture::Qwen3:
      r.gate = GateKind::Softmax;
      r.norm = NormKind::Rms;
      r.peri_ln = false;
      r.qk_norm = true;
      break;
    case Architecture::Llama:
      r.gate = GateKind::Softmax;
      r.norm = NormKind::Rms;
      r.peri_ln = false;
      r.qk_norm = false;
      break;
    case Architecture::AsyncT:
      r.gate = GateKind::Async;
      r.pool_window = c.attn_pool_window;
      r.norm = NormKind::UClip;
      r.norm_clip = c.uclip_value;
      r.peri_ln = true;
      r.qk_norm = true;
      break;
  }
  return r;
}

}  // namespace asynct
