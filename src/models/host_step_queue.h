// The steps of a runner that computes a step inside submit() (both CPU runners): each checked
// and run as it is submitted, its output queued until collect() (at most two: a step and the
// one chained behind it), a chained step's input tokens read from the summaries of the step
// submitted before it. A step whose masks come later runs when they come (supply_masks).
#pragma once

#include <cstdint>
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
  // Checks `batch` against `bounds` (previous_rows filled in here), then queues run(batch,
  // tokens), or keeps its tokens for supply_masks() when its masks come later.
  template <typename Run>
  void submit(const StepBatch& batch, StepBounds bounds, Run&& run) {
    check(queued_.size() < 2, "submit: two steps are queued already; collect one first");
    check(!waiting_for_masks_, "submit: the step before waits for its token masks (supply_masks)");
    bounds.previous_rows = int(last_summaries_.size());
    check_step_batch(batch, bounds);
    std::vector<std::int32_t> tokens = step_input_tokens(batch, last_summaries_);
    if (batch.masks_later) {
      waiting_tokens_ = std::move(tokens);
      waiting_for_masks_ = true;
      queued_.emplace_back();
      return;
    }
    queued_.push_back(run(batch, tokens));
    last_summaries_ = queued_.back().output.summaries;
  }

  // Runs the step submitted last, which waited for its masks (now in `batch`, the same batch).
  template <typename Run>
  void supply_masks(const StepBatch& batch, Run&& run) {
    check(waiting_for_masks_, "supply_masks: no step waits for its token masks");
    queued_.back() = run(batch, waiting_tokens_);
    last_summaries_ = queued_.back().output.summaries;
    waiting_for_masks_ = false;
  }

  // The oldest queued step's output, valid until the next collect().
  const StepOutput& collect() {
    check(!queued_.empty(), "collect: no step was submitted");
    check(!waiting_for_masks_ || queued_.size() > 1, "collect: the step waits for its token masks (supply_masks)");
    collected_ = std::move(queued_.front());
    queued_.pop_front();
    return collected_.output;
  }

 private:
  std::deque<Result> queued_;  // submitted, not collected
  Result collected_;           // what the last collect() handed out
  std::vector<LogitSummary> last_summaries_;  // of the last step submitted
  bool waiting_for_masks_ = false;            // the last step queued runs at supply_masks()
  std::vector<std::int32_t> waiting_tokens_;  // its input tokens
};

}  // namespace asynct
