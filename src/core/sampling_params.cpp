#include "core/sampling_params.h"

#include <cmath>

#include "core/error.h"

namespace asynct {

void validate_sampling(const SamplingParams& p) {
  check(std::isfinite(p.temperature) && p.temperature >= 0.0f,
        "sampling: temperature must be finite and >= 0, got ", p.temperature);
  check(p.top_k >= 0, "sampling: top_k must be >= 0, got ", p.top_k);
  check(p.top_p > 0.0f && p.top_p <= 1.0f, "sampling: top_p must be in (0, 1], got ", p.top_p);
}

}  // namespace asynct
