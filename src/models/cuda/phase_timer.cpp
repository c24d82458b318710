#include "models/cuda/phase_timer.h"

#include "core/error.h"
#include "kernels/common/cuda_check.h"

namespace asynct {

PhaseTimer::~PhaseTimer() {
  for (Record& r : records_)
    for (cudaEvent_t e : r.events) cudaEventDestroy(e);
}

void PhaseTimer::begin(cudaStream_t stream) {
  check(pending_ < 2, "PhaseTimer: two steps are timed already");
  stream_ = stream;
  Record& r = records_[(first_ + pending_++) % 2];
  r.used = 0;
  r.names.clear();
  record(r);
}

void PhaseTimer::mark(const char* phase) {
  if (!enabled || pending_ == 0) return;
  Record& r = records_[(first_ + pending_ - 1) % 2];
  r.names.push_back(phase);
  record(r);
}

void PhaseTimer::collect() {
  if (pending_ == 0) return;
  Record& r = records_[first_];
  first_ = (first_ + 1) % 2;
  --pending_;
  for (std::size_t i = 0; i + 1 < r.used; ++i) {
    float ms = 0.0f;
    ASYNCT_CUDA_CHECK(cudaEventElapsedTime(&ms, r.events[i], r.events[i + 1]));
    totals[r.names[i]] += ms;
  }
}

void PhaseTimer::record(Record& r) {
  if (!enabled) return;
  if (r.used == r.events.size()) {
    cudaEvent_t e;
    ASYNCT_CUDA_CHECK(cudaEventCreate(&e));
    r.events.push_back(e);
  }
  ASYNCT_CUDA_CHECK(cudaEventRecord(r.events[r.used++], stream_));
}

}  // namespace asynct
