#include "core/parallel.h"

#include "core/error.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace asynct {

unsigned thread_limit() {
  unsigned limit = std::max(1u, std::thread::hardware_concurrency());
  if (const char* env = std::getenv("ASYNCT_THREADS"); env && *env) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    check(*end == '\0' && n >= 1 && n <= 65536, "ASYNCT_THREADS must be a whole number of threads >= 1, got '", env,
          "'");
    limit = std::min(limit, unsigned(n));
  }
  return limit;
}

void parallel_for(std::size_t count, const std::function<void(std::size_t)>& work, unsigned max_threads) {
  if (count == 0) return;
  const unsigned limit = thread_limit();
  max_threads = max_threads == 0 ? limit : std::min(max_threads, limit);
  const std::size_t threads = std::min<std::size_t>(max_threads, count);
  if (threads == 1) {
    for (std::size_t i = 0; i < count; ++i) work(i);
    return;
  }
  std::atomic<std::size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto run = [&] {
    for (std::size_t i = next++; i < count; i = next++) {
      try {
        work(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(run);
  run();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace asynct
