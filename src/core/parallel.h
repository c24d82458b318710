// A parallel loop for the host's independent pieces of work (drawing random weights, sampling
// the rows of a step): plain threads, no pool, since each use runs at most once per step or
// per model and the pieces are far longer than starting a thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace asynct {

// The most threads the host's parallel work uses: one per hardware thread, lowered by
// ASYNCT_THREADS in the environment (an Error when it is not a whole number >= 1).
unsigned thread_limit();

// Runs work(i) for every i in [0, count), on up to max_threads threads (0, or more than the
// hardware has: one per hardware thread; ASYNCT_THREADS in the environment lowers that cap)
// including the caller's, each taking the next unclaimed i. Returns when all are done;
// the first exception thrown by any work(i) is then rethrown (the others are dropped).
void parallel_for(std::size_t count, const std::function<void(std::size_t)>& work, unsigned max_threads = 0);

// Runs work(begin, end) over [0, count) in pieces of `piece` elements (a model's weights are
// ~2e9 elements: seconds on one core). One piece or less stays on the caller's thread, where
// starting threads would cost more than they save.
template <typename Work>
void parallel_pieces(std::int64_t count, std::int64_t piece, const Work& work) {
  const std::int64_t pieces = (count + piece - 1) / piece;
  if (pieces <= 1) {
    work(std::int64_t(0), count);
    return;
  }
  parallel_for(std::size_t(pieces), [&](std::size_t p) {
    const std::int64_t begin = std::int64_t(p) * piece;
    work(begin, count - begin < piece ? count : begin + piece);
  });
}

}  // namespace asynct
