#include "ddp/communicator.h"

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace ddp {

Status Work::Wait(Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [this] { return done_; })) {
    return absl::DeadlineExceededError(
        absl::StrCat("collective still running after waiting ", ToSeconds(timeout), " s"));
  }
  return status_;
}

Status Work::WaitStream(Duration timeout) {
  if (stream_waiter_) return stream_waiter_();
  return Wait(timeout);
}

bool Work::IsCompleted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

Status Work::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

MonoTime Work::started_at() const {
  std::lock_guard<std::mutex> lock(mu_);
  return started_at_;
}

MonoTime Work::finished_at() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_at_;
}

void Work::MarkStarted() {
  std::lock_guard<std::mutex> lock(mu_);
  started_at_ = RealClock()->Now();
}

void Work::Finish(Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    status_ = std::move(status);
    finished_at_ = RealClock()->Now();
    if (started_at_ == MonoTime{}) started_at_ = finished_at_;
  }
  cv_.notify_all();
}

std::shared_ptr<Work> Work::Failed(Status status) {
  auto work = std::make_shared<Work>();
  work->Finish(std::move(status));
  return work;
}

Status CheckCollectiveTensor(const at::Tensor& t, const char* what, c10::Device device) {
  if (!t.defined()) return absl::InvalidArgumentError(absl::StrCat(what, " tensor is undefined"));
  if (t.device() != device) {
    return absl::InvalidArgumentError(absl::StrCat(what, " tensor is on ", t.device().str(),
                                                   ", expected ", device.str()));
  }
  if (t.is_sparse() || !t.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " tensor must be dense and contiguous"));
  }
  return absl::OkStatus();
}

}  // namespace ddp
}  // namespace lockstep
