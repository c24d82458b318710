// How many new tokens a step takes when the user does not say (--max-batched-tokens 0).
#pragma once

#include <string>

#include "models/config.h"

namespace asynct {

// The new tokens of one server step when --max-batched-tokens is not given: 2048 on the GPU; on
// the CPU as many as the backend prefills in about a quarter of a second at the rate measured
// on the development machine a thread ([C1]: the production backend ~55 GFLOP/s, the reference
// ~2), 8 to 2048, so that a step, and with it a client's disconnect or SIGTERM, takes effect
// within well under a second.
int default_step_tokens(const ModelConfig& config, const std::string& backend);

}  // namespace asynct
