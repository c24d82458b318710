// The server's engine thread (serve/engine_worker.h) when the engine fails: the step's error
// ends every request in flight, and afterwards the worker takes none and says why (failure():
// the server's 503 and /health), instead of looking busy.
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>

#include "engine/engine.h"
#include "serve/engine_worker.h"

namespace asynct::serve {
namespace {

// A runner whose every step throws, as a device error or a failed check would.
class FailingRunner : public ModelRunner {
 public:
  void submit(const StepBatch&) override { throw std::runtime_error("the device is gone"); }
  void supply_masks(const StepBatch&) override {}
  const StepOutput& collect() override { return out_; }
  void copy_blocks(const std::vector<BlockCopy>&) override {}
  int num_blocks() const override { return 8; }
  int block_size() const override { return 16; }

 private:
  StepOutput out_;
};

// Output text that is the token ids, to satisfy the worker.
class IdText : public OutputText {
 public:
  std::string push(std::int32_t id) override { return std::to_string(id); }
  std::string finish() override { return ""; }
  bool stopped() const override { return false; }
  const std::string& stop_string() const override { return none_; }

 private:
  std::string none_;
};

TEST(EngineWorker, AFailedEngineEndsItsRequestsAndTakesNoMore) {
  ServerMetrics metrics;
  EngineWorker worker(std::make_unique<Engine>(std::make_unique<FailingRunner>(), 100), 4, metrics);
  EXPECT_EQ(worker.failure(), "");
  Request r;
  r.prompt = {1, 2, 3};
  r.max_tokens = 4;
  std::shared_ptr<RequestStream> stream = worker.submit(r, std::make_unique<IdText>());
  ASSERT_NE(stream, nullptr);
  StreamEvent event;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!event.done && std::chrono::steady_clock::now() < deadline) stream->next(event, std::chrono::milliseconds(100));
  ASSERT_TRUE(event.done);
  EXPECT_TRUE(event.engine_failed);
  EXPECT_NE(event.error.find("the device is gone"), std::string::npos) << event.error;
  EXPECT_EQ(worker.failure(), "the device is gone");
  EXPECT_EQ(worker.submit(r, std::make_unique<IdText>()), nullptr);
  EXPECT_FALSE(worker.draining());
}

}  // namespace
}  // namespace asynct::serve
