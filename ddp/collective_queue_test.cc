// CollectiveQueue (collective_queue.h): call order, sequence numbers, the
// first failure breaking the queue, and the destructor letting what was
// queued run.
#include "ddp/collective_queue.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace lockstep {
namespace ddp {
namespace {

using std::chrono::milliseconds;

TEST(CollectiveQueueTest, RunsInCallOrderWithTheNextSequenceNumber) {
  CollectiveQueue queue("test");
  std::mutex mu;
  std::vector<uint64_t> seen;
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 5; ++i) {
    works.push_back(queue.Enqueue("op", [&](uint64_t seq) {
      std::this_thread::sleep_for(milliseconds(2));
      std::lock_guard<std::mutex> lock(mu);
      seen.push_back(seq);
      return absl::OkStatus();
    }));
  }
  for (auto& w : works) EXPECT_TRUE(w->Wait(std::chrono::seconds(10)).ok());
  EXPECT_EQ(seen, (std::vector<uint64_t>{0, 1, 2, 3, 4}));
}

// The first failure is the failed collective's error; the ones queued
// behind it and every later call are refused quoting it, without running.
TEST(CollectiveQueueTest, TheFirstFailureBreaksTheQueue) {
  CollectiveQueue queue("test");
  std::atomic<int> ran{0};
  auto first = queue.Enqueue("allreduce", [&](uint64_t) {
    std::this_thread::sleep_for(milliseconds(50));
    ++ran;
    return absl::DeadlineExceededError("ranks [1] did not arrive");
  });
  auto queued = queue.Enqueue("broadcast", [&](uint64_t) {
    ++ran;
    return absl::OkStatus();
  });
  const Status s = first->Wait(std::chrono::seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  const Status q = queued->Wait(std::chrono::seconds(10));
  EXPECT_EQ(q.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(q.message().find("test broadcast #1 refused: communicator failed earlier (ranks [1] "
                             "did not arrive)"),
            std::string::npos)
      << q.message();
  const Status later = queue.Enqueue("barrier", [&](uint64_t) {
                              ++ran;
                              return absl::OkStatus();
                            })->Wait(std::chrono::seconds(10));
  EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(later.message().find("test barrier refused"), std::string::npos) << later.message();
  EXPECT_EQ(ran.load(), 1);
}

// Destroyed with collectives queued: each runs and finishes (the ranks
// must not fall out of step because one of them tore its communicator down
// early), and the destructor returns once they have.
TEST(CollectiveQueueTest, TheDestructorLetsQueuedCollectivesFinish) {
  std::vector<std::shared_ptr<Work>> works;
  std::atomic<int> ran{0};
  {
    CollectiveQueue queue("test");
    for (int i = 0; i < 3; ++i) {
      works.push_back(queue.Enqueue("op", [&](uint64_t) {
        std::this_thread::sleep_for(milliseconds(30));
        ++ran;
        return absl::OkStatus();
      }));
    }
  }
  EXPECT_EQ(ran.load(), 3);
  for (auto& w : works) EXPECT_TRUE(w->Wait(milliseconds(0)).ok());
}

}  // namespace
}  // namespace ddp
}  // namespace lockstep
