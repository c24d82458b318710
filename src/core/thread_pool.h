// A persistent pool of host threads for many short parallel regions: the production CPU
// runner's (a decode step runs ~5 per layer, each tens of microseconds) and the engine's mask
// fills (one region a constrained step); starting threads per region, as core/parallel.h does,
// would cost more than the work. Workers spin briefly between regions, then sleep.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace asynct {

class ThreadPool {
 public:
  // `threads` counts the caller's; 0 means thread_limit() (core/parallel.h: ASYNCT_THREADS caps it).
  explicit ThreadPool(unsigned threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  unsigned size() const { return unsigned(workers_.size()) + 1; }
  // Runs work(i) for every i in [0, count) on the pool and the caller; returns when all are
  // done, rethrowing the first exception any threw. Not reentrant.
  void run(std::size_t count, const std::function<void(std::size_t)>& work);

 private:
  void worker_loop();
  void claim_and_run(std::uint32_t generation);

  std::vector<std::thread> workers_;
  // High 32 bits: the generation of the region; low 32: the next unclaimed index. A worker late
  // from an earlier region cannot claim from a later one.
  std::atomic<std::uint64_t> next_{0};
  // High 32 bits: the generation of the region; low 32: its count. An index is checked against
  // its own region's count: a worker late from a finished region, reading the next region's larger
  // count before next_ is reset, would claim a stale index, run the next region's work with it and
  // count it done there: run() would return while that task still ran.
  std::atomic<std::uint64_t> extent_{0};
  std::atomic<std::uint32_t> generation_{0};
  std::atomic<std::size_t> done_{0};
  const std::function<void(std::size_t)>* work_ = nullptr;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<int> sleeping_{0};
  bool stop_ = false;
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

}  // namespace asynct
