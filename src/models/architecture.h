// What sets the architectures apart, as one recipe both runners read (docs/DESIGN.md §5): the
// attention gate, the norm (Qwen3's RMSNorm or AsyncT's UClipNorm with its clip), whether the
// attention and MLP outputs are normalised before the residual add (Peri-LN), and whether q
// and k are normalised per head before RoPE.
#pragma once

#include "core/gate.h"
#include "models/config.h"

namespace asynct {

enum class NormKind { Rms, UClip };

struct ArchitectureRecipe {
  GateKind gate = GateKind::Softmax;
  int pool_window = 3;  // the async gate's W
  NormKind norm = NormKind::Rms;
  float norm_eps = 1e-6f;
  float norm_clip = 0.0f;  // UClipNorm's clip; unused by RMSNorm
  bool peri_ln = false;    // residual += norm(attn); residual += norm(mlp)
  bool qk_norm = true;     // per-head norm of q and k before RoPE
};

// Qwen3: softmax gate, RMSNorm, no Peri-LN, q/k norm. Llama: Qwen3 without the q/k norm. AsyncT:
// async gate with the config's pool window, UClipNorm with the config's clip, Peri-LN, q/k norm.
ArchitectureRecipe recipe_of(const ModelConfig& config);

}  // namespace asynct
