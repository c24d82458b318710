// Where a CUDA step's time goes: the GPU phases, timed with events on the step's stream
// (PhaseTimer), and the host's wall-clock parts of submit() and collect() (HostTimes, Lap).
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

namespace asynct {

// Times the phases of a step with events on the step's stream: mark("gemm") closes the phase
// that began at the previous mark and names it. With pipelined steps two steps are timed at once:
// begin() opens the newest step's record, mark() adds to it, and collect() reads the oldest, after
// its events have completed.
class PhaseTimer {
 public:
  PhaseTimer() = default;
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;
  ~PhaseTimer();

  bool enabled = false;
  void begin(cudaStream_t stream);
  void mark(const char* phase);
  void collect();  // the oldest step's events have completed
  std::map<std::string, double> totals;

 private:
  struct Record {
    std::vector<cudaEvent_t> events;
    std::vector<const char*> names;  // names[i]: the phase from events[i] to events[i + 1]
    std::size_t used = 0;
  };
  void record(Record& r);
  cudaStream_t stream_ = nullptr;
  Record records_[2];
  int first_ = 0, pending_ = 0;  // the oldest record being timed, and how many are
};

// Host wall-clock time of submit()'s and collect()'s parts, in milliseconds (what the GPU phases
// cannot see: a step whose GPU work is short may still be slow to prepare or to launch).
struct HostTimes {
  double prepare = 0;  // validation, writing the step metadata, buffers grown
  double launch = 0;   // enqueueing the upload, the step (eager launches or one graph
                       // launch; a graph capture when there is one) and the copies back
  double wait = 0;     // blocked in the stream synchronisation, waiting for the GPU
  double finish = 0;   // reading event timings (profiling), unpacking the results
};

// Adds the time since the last call (or the lap's creation) to `total`.
struct Lap {
  using Clock = std::chrono::steady_clock;
  Clock::time_point last = Clock::now();
  void operator()(double& total) {
    const auto now = Clock::now();
    total += std::chrono::duration<double, std::milli>(now - last).count();
    last = now;
  }
};

}  // namespace asynct
