// CollectiveQueue: the communicator thread shared by the CPU communicators
// that run their collectives one at a time, in call order (GlooCommunicator,
// ShmCommunicator, HierarchicalCommunicator). Each collective gets the next sequence number;
// its body runs on the queue's thread and returns a Status. The first
// failure breaks the queue: the failed Work carries the error, and every
// collective queued or issued after it fails with FailedPrecondition quoting
// it, because the ranks can no longer be trusted to be in step.
//
// Thread safety: Enqueue may be called from any thread. The destructor lets
// queued collectives finish (each bounded by its own timeout) and joins.
#ifndef LOCKSTEP_DDP_COLLECTIVE_QUEUE_H_
#define LOCKSTEP_DDP_COLLECTIVE_QUEUE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "ddp/communicator.h"

namespace lockstep {
namespace ddp {

class CollectiveQueue {
 public:
  // A collective's body; `seq` is its number on this rank (0, 1, ...).
  using Body = std::function<Status(uint64_t seq)>;

  // `backend` prefixes the refusal messages ("shm allreduce refused: ...").
  explicit CollectiveQueue(std::string backend) : backend_(std::move(backend)) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~CollectiveQueue() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  CollectiveQueue(const CollectiveQueue&) = delete;
  CollectiveQueue& operator=(const CollectiveQueue&) = delete;

  // `name` must be a string literal (it is kept).
  std::shared_ptr<Work> Enqueue(const char* name, Body body) {
    auto work = std::make_shared<Work>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!broken_.ok()) {
        work->Finish(absl::FailedPreconditionError(
            absl::StrCat(backend_, " ", name, " refused: communicator failed earlier and must be "
                         "rebuilt through rendezvous (", broken_.message(), ")")));
        return work;
      }
      queue_.push_back(Task{next_seq_++, name, work, std::move(body)});
    }
    cv_.notify_one();
    return work;
  }

 private:
  struct Task {
    uint64_t seq;
    const char* name;
    std::shared_ptr<Work> work;
    Body body;
  };

  void Loop() {
    while (true) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
        if (!broken_.ok()) {
          task.work->Finish(absl::FailedPreconditionError(
              absl::StrCat(backend_, " ", task.name, " #", task.seq,
                           " refused: communicator failed earlier (", broken_.message(), ")")));
          continue;
        }
      }
      task.work->MarkStarted();
      Status status = task.body(task.seq);
      if (!status.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        broken_ = status;
      }
      task.work->Finish(std::move(status));
    }
  }

  const std::string backend_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;  // GUARDED_BY(mu_)
  uint64_t next_seq_ = 0;   // GUARDED_BY(mu_)
  bool stopping_ = false;   // GUARDED_BY(mu_)
  Status broken_;           // GUARDED_BY(mu_)
  std::thread thread_;      // Started last, in the constructor.
};

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_COLLECTIVE_QUEUE_H_
