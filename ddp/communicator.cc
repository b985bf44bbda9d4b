#include "ddp/communicator.h"

#include <ATen/ATen.h>

#include <algorithm>

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

Status CheckRank(const char* backend, int rank, int world_size) {
  if (world_size >= 1 && rank >= 0 && rank < world_size) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(backend, ": rank ", rank, " is outside world of size ", world_size));
}

Status CheckBroadcastRoot(int root, int world_size) {
  if (root >= 0 && root < world_size) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("broadcast root ", root, " is outside world of size ", world_size));
}

Status CheckAllGather(const at::Tensor& input, const at::Tensor& output, int world_size,
                      c10::Device device) {
  RETURN_IF_ERROR(CheckCollectiveTensor(input, "allgather input", device));
  RETURN_IF_ERROR(CheckCollectiveTensor(output, "allgather output", device));
  if (input.scalar_type() == output.scalar_type() &&
      output.numel() == input.numel() * world_size) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "allgather output needs ", input.numel() * world_size, " elements of ",
      c10::toString(input.scalar_type()), ", got ", output.numel(), " of ",
      c10::toString(output.scalar_type())));
}

Status CheckCpuAllReduce(const at::Tensor& t, ReduceOp op) {
  RETURN_IF_ERROR(CheckCollectiveTensor(t, "allreduce"));
  const auto dtype = t.scalar_type();
  const bool floating = dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf ||
                        dtype == at::kBFloat16;
  if (!floating && dtype != at::kInt && dtype != at::kLong) {
    return absl::InvalidArgumentError(
        absl::StrCat("allreduce does not support dtype ", c10::toString(dtype)));
  }
  if (op == ReduceOp::kAvg && !floating) {
    return absl::InvalidArgumentError("allreduce average needs a floating dtype");
  }
  return absl::OkStatus();
}

Status CheckInputPieces(const at::Tensor& tensor, std::vector<InputPiece>& pieces) {
  for (size_t i = 0; i < pieces.size(); ++i) {
    const InputPiece& p = pieces[i];
    const std::string what = absl::StrCat("allreduce input piece ", i);
    if (!p.source.defined() || p.source.is_sparse() || !p.source.is_contiguous()) {
      return absl::InvalidArgumentError(what + ": its source is not a defined contiguous tensor");
    }
    if (p.source.scalar_type() != tensor.scalar_type() || p.source.device() != tensor.device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": its source is ", c10::toString(p.source.scalar_type()), " on ",
          p.source.device().str(), ", the tensor ", c10::toString(tensor.scalar_type()), " on ",
          tensor.device().str()));
    }
    if (p.offset < 0 || p.offset + p.source.numel() > tensor.numel()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": elements [", p.offset, ", ",
                                                     p.offset + p.source.numel(),
                                                     ") are outside the tensor's ", tensor.numel()));
    }
  }
  std::sort(pieces.begin(), pieces.end(),
            [](const InputPiece& a, const InputPiece& b) { return a.offset < b.offset; });
  for (size_t i = 1; i < pieces.size(); ++i) {
    const int64_t end = pieces[i - 1].offset + pieces[i - 1].source.numel();
    if (pieces[i].offset < end) {
      return absl::InvalidArgumentError(absl::StrCat("allreduce input pieces overlap: [",
                                                     pieces[i - 1].offset, ", ", end, ") and [",
                                                     pieces[i].offset, ", ...)"));
    }
  }
  return absl::OkStatus();
}

void CopyInputPieces(const at::Tensor& tensor, const std::vector<InputPiece>& pieces) {
  at::NoGradGuard no_grad;
  const at::Tensor flat = tensor.view(-1);
  for (const InputPiece& p : pieces) {
    flat.narrow(0, p.offset, p.source.numel()).copy_(p.source.view(-1));
  }
}

std::shared_ptr<Work> Communicator::AllReduceFrom(at::Tensor tensor, ReduceOp op,
                                                  std::vector<InputPiece> pieces) {
  if (Status s = CheckCollectiveTensor(tensor, "allreduce", device()); !s.ok()) {
    return Work::Failed(s);
  }
  if (Status s = CheckInputPieces(tensor, pieces); !s.ok()) return Work::Failed(s);
  CopyInputPieces(tensor, pieces);
  return AllReduce(std::move(tensor), op);
}

}  // namespace ddp
}  // namespace lockstep
