// The steps of a runner that computes a step inside submit() (both CPU runners): each checked
// and run as it is submitted, its output queued until collect() (at most two: a step and the
// one chained behind it), a chained step's input tokens read from the summaries of the step
// submitted before it.
#pragma once

#include <deque>
#include <utility>
#include <vector>

#include "core/error.h"
#include "engine/model_runner.h"
#include "engine/step_batch.h"
#include "models/step_sampling.h"

namespace asynct {

// Result holds `StepOutput output` and whatever its logits point into.
template <typename Result>
class HostStepQueue {
 public:
  // Checks `batch` against `bounds` (previous_rows filled in here), then queues run(tokens).
  template <typename Run>
  void submit(const StepBatch& batch, StepBounds bounds, Run&& run) {
    check(queued_.size() < 2, "submit: two steps are queued already; collect one first");
    bounds.previous_rows = int(last_summaries_.size());
    check_step_batch(batch, bounds);
    queued_.push_back(run(step_input_tokens(batch, last_summaries_)));
    last_summaries_ = queued_.back().output.summaries;
  }

  // The oldest queued step's output, valid until the next collect().
  const StepOutput& collect() {
    check(!queued_.empty(), "collect: no step was submitted");
    collected_ = std::move(queued_.front());
    queued_.pop_front();
    return collected_.output;
  }

 private:
  std::deque<Result> queued_;  // submitted, not collected
  Result collected_;           // what the last collect() handed out
  std::vector<LogitSummary> last_summaries_;  // of the last step submitted
};

}  // namespace asynct
