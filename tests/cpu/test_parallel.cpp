// parallel_for: every index exactly once, on any thread count; an exception from any piece of
// work reaches the caller after all threads are done.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"

namespace asynct {
namespace {

TEST(ParallelFor, RunsEveryIndexExactlyOnce) {
  for (unsigned threads : {0u, 1u, 3u, 64u}) {
    for (std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(1000)}) {
      std::vector<std::atomic<int>> hits(count);
      parallel_for(count, [&](std::size_t i) { hits[i]++; }, threads);
      for (std::size_t i = 0; i < count; ++i) EXPECT_EQ(hits[i].load(), 1) << "index " << i << ", threads " << threads;
    }
  }
}

TEST(ParallelFor, RethrowsAnExceptionAfterTheOtherWorkFinishes) {
  std::atomic<int> done{0};
  EXPECT_THROW(parallel_for(
                   100,
                   [&](std::size_t i) {
                     if (i == 17) throw std::runtime_error("piece 17 failed");
                     done++;
                   },
                   4),
               std::runtime_error);
  EXPECT_EQ(done.load(), 99);  // the failure does not stop the remaining pieces
}

TEST(ParallelFor, AsynctThreadsCapsTheThreadsAndMustBeACount) {
  setenv("ASYNCT_THREADS", "1", 1);
  std::vector<int> order;
  parallel_for(50, [&](std::size_t i) { order.push_back(int(i)); });  // one thread: in order, no race
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[std::size_t(i)], i);
  for (const char* bad : {"0", "-2", "many", "3x"}) {
    setenv("ASYNCT_THREADS", bad, 1);
    EXPECT_THROW(parallel_for(4, [](std::size_t) {}), Error) << bad;
  }
  unsetenv("ASYNCT_THREADS");
}

}  // namespace
}  // namespace asynct
