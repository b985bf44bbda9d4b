#include "ddp/comm_hook.h"

#include <exception>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace ddp {

std::shared_ptr<BucketWork> BucketWork::Of(std::shared_ptr<Work> work, at::Tensor result,
                                           int64_t wire_bytes) {
  return std::shared_ptr<BucketWork>(
      new BucketWork(std::move(work), std::move(result), nullptr, wire_bytes));
}

std::shared_ptr<BucketWork> BucketWork::Then(std::shared_ptr<Work> work, Continuation then,
                                             int64_t wire_bytes) {
  return std::shared_ptr<BucketWork>(
      new BucketWork(std::move(work), at::Tensor(), std::move(then), wire_bytes));
}

std::shared_ptr<BucketWork> BucketWork::Failed(Status status) {
  return Of(Work::Failed(std::move(status)), at::Tensor(), 0);
}

StatusOr<at::Tensor> BucketWork::Wait(Duration timeout) {
  if (!waited_) {
    waited_ = true;
    status_ = work_->WaitStream(timeout);
    if (status_.ok() && then_) {
      try {
        StatusOr<at::Tensor> r = then_();
        if (r.ok()) {
          result_ = *std::move(r);
        } else {
          status_ = r.status();
        }
      } catch (const std::exception& e) {
        status_ = absl::InternalError(absl::StrCat("comm hook continuation threw: ", e.what()));
      }
    }
  }
  if (!status_.ok()) return status_;
  return result_;
}

CommHook AllreduceHook() {
  CommHook hook;
  hook.name = "allreduce";
  // The 1/world of the average rides on the copy into the bucket (one pass
  // over the gradients instead of two), and the wire carries a plain sum.
  hook.prescale_by_world = true;
  hook.run = [](GradBucket& bucket, Communicator& comm) {
    return BucketWork::Of(comm.AllReduce(bucket.buffer, ReduceOp::kSum), bucket.buffer,
                          static_cast<int64_t>(bucket.buffer.nbytes()));
  };
  return hook;
}

StatusOr<CommHook> CommHookFromName(const std::string& name) {
  if (name == "allreduce") return AllreduceHook();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown comm hook '", name, "' (choices: allreduce)"));
}

}  // namespace ddp
}  // namespace lockstep
