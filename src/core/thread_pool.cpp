#include "core/thread_pool.h"

#include <algorithm>

#include "core/error.h"
#include "core/parallel.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ASYNCT_PAUSE() _mm_pause()
#else
#define ASYNCT_PAUSE() std::this_thread::yield()
#endif

namespace asynct {

namespace {
// A worker spins ~50 us for the next region before it sleeps: a decode step's regions come
// microseconds apart. The caller, waiting for the others' tasks, yields its core sooner: on a
// loaded machine the thread it waits for may need it.
constexpr int kWorkerSpins = 2000, kCallerSpins = 500;
}

ThreadPool::ThreadPool(unsigned threads) {
  const unsigned n = threads == 0 ? thread_limit() : std::min(threads, thread_limit());
  for (unsigned t = 1; t < n; ++t) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::claim_and_run(std::uint32_t generation) {
  std::uint64_t v = next_.load(std::memory_order_acquire);
  for (;;) {
    const std::uint64_t extent = extent_.load(std::memory_order_acquire);
    if (std::uint32_t(v >> 32) != generation || std::uint32_t(extent >> 32) != generation ||
        (v & 0xffffffffu) >= (extent & 0xffffffffu))
      return;
    if (!next_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) continue;
    try {
      (*work_)(std::size_t(v & 0xffffffffu));
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    done_.fetch_add(1, std::memory_order_acq_rel);
    v = next_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_loop() {
  std::uint32_t seen = 0;
  for (;;) {
    std::uint32_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < kWorkerSpins; ++spin) {
      ASYNCT_PAUSE();
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      sleeping_.fetch_add(1);
      wake_.wait(lock, [&] { return generation_.load() != seen || stop_; });
      sleeping_.fetch_sub(1);
      g = generation_.load();
    }
    if (stop_) return;
    seen = g;
    claim_and_run(g);
  }
}

void ThreadPool::run(std::size_t count, const std::function<void(std::size_t)>& work) {
  if (count == 0) return;
  if (workers_.empty() || count == 1) {
    for (std::size_t i = 0; i < count; ++i) work(i);
    return;
  }
  check(count <= 0xffffffffu, "ThreadPool::run: ", count, " tasks are more than a region counts (2^32 - 1)");
  const std::uint32_t g = generation_.load() + 1;
  work_ = &work;
  error_ = nullptr;
  done_.store(0, std::memory_order_relaxed);
  extent_.store(std::uint64_t(g) << 32 | count, std::memory_order_relaxed);
  next_.store(std::uint64_t(g) << 32, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mutex_);  // a worker between its check and its wait sees this
    generation_.store(g, std::memory_order_release);
  }
  if (sleeping_.load() > 0) wake_.notify_all();
  claim_and_run(g);
  for (int spin = 0; done_.load(std::memory_order_acquire) < count; ++spin) {
    if (spin < kCallerSpins) ASYNCT_PAUSE();
    else std::this_thread::yield();
  }
  if (error_) std::rethrow_exception(error_);
}

}  // namespace asynct
