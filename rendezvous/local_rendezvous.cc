#include "rendezvous/local_rendezvous.h"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace rendezvous {

StatusOr<RendezvousResult> LocalRendezvous::Join(const JoinRequest& request, Duration timeout) {
  struct Slot {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<StatusOr<RendezvousResult>> result;
  };
  auto slot = std::make_shared<Slot>();
  // The core's own deadline is set a little later than ours so that, on a
  // real clock, this thread's timeout (with its withdrawal) comes first.
  MonoTime deadline = core_->clock()->Now() + timeout + std::chrono::seconds(1);
  RendezvousCore::JoinId id =
      core_->Join(request, deadline, [slot](StatusOr<RendezvousResult> result) {
        std::lock_guard<std::mutex> lock(slot->mu);
        slot->result = std::move(result);
        slot->cv.notify_all();
      });
  std::unique_lock<std::mutex> lock(slot->mu);
  if (!slot->cv.wait_for(lock, timeout, [&] { return slot->result.has_value(); })) {
    lock.unlock();
    if (core_->CancelJoin(id)) {
      return absl::DeadlineExceededError(
          absl::StrCat("node ", request.node_id.value(), ": rendezvous of job ",
                       request.job_id.value(), " did not close within ", ToSeconds(timeout),
                       " s"));
    }
    lock.lock();  // the callback is running: take its result
    slot->cv.wait(lock, [&] { return slot->result.has_value(); });
  }
  return std::move(*slot->result);
}

Status LocalRendezvous::Leave(const JobId& job_id, const NodeId& node_id, int round,
                              Duration timeout) {
  return core_->Leave(job_id, node_id, round);
}

StatusOr<RendezvousState> LocalRendezvous::GetState(const JobId& job_id, Duration timeout) {
  return core_->GetState(job_id);
}

}  // namespace rendezvous
}  // namespace lockstep
