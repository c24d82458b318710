#include "models/step_budget.h"

#include <algorithm>

#include "core/parallel.h"

namespace asynct {

int default_step_tokens(const ModelConfig& c, const std::string& backend) {
  if (backend == "cuda") return 2048;
  constexpr double kStepSeconds = 0.25;
  const double flops_per_thread = backend == "cpu-reference" ? 2e9 : 55e9;
  const double h = c.hidden_size, qd = double(c.num_attention_heads) * c.head_dim,
               kvd = double(c.num_key_value_heads) * c.head_dim, inter = c.intermediate_size;
  const double flops_per_token = 2.0 * c.num_hidden_layers * (h * (qd + 2 * kvd) + qd * h + 3 * h * inter);
  const double tokens = kStepSeconds * flops_per_thread * thread_limit() / std::max(1.0, flops_per_token);
  return std::clamp(int(tokens) / 8 * 8, 8, 2048);
}

}  // namespace asynct
