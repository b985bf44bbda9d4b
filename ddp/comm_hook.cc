#include "ddp/comm_hook.h"

#include <ATen/ATen.h>

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

namespace {

// Average on a `wire` dtype wire. The bucket arrives divided by the world
// size (prescale_by_world, done in the bucket's own dtype), so the sum of
// the compressed values is the average and stays within `wire`'s range
// whenever the average does; summing first and dividing after could
// overflow float16 (max 65504) for a world of ranks with large gradients.
// The compressed copy is a fresh tensor each step (a hook holds no state:
// one CommHook value may serve several DDP objects at once).
CommHook CompressHook(const char* name, at::ScalarType wire) {
  CommHook hook;
  hook.name = name;
  hook.prescale_by_world = true;
  hook.run = [wire](GradBucket& bucket, Communicator& comm) -> std::shared_ptr<BucketWork> {
    at::Tensor buffer = bucket.buffer;
    if (buffer.scalar_type() == wire) {
      return BucketWork::Of(comm.AllReduce(buffer, ReduceOp::kSum), buffer,
                            static_cast<int64_t>(buffer.nbytes()));
    }
    at::Tensor compressed = buffer.to(wire);
    auto work = comm.AllReduce(compressed, ReduceOp::kSum);
    return BucketWork::Then(
        std::move(work),
        [buffer, compressed]() -> StatusOr<at::Tensor> {
          buffer.copy_(compressed);
          return buffer;
        },
        static_cast<int64_t>(compressed.nbytes()));
  };
  return hook;
}

}  // namespace

CommHook Fp16CompressHook() { return CompressHook("fp16", at::kHalf); }
CommHook Bf16CompressHook() { return CompressHook("bf16", at::kBFloat16); }

StatusOr<CommHook> CommHookFromName(const std::string& name) {
  if (name == "allreduce") return AllreduceHook();
  if (name == "fp16") return Fp16CompressHook();
  if (name == "bf16") return Bf16CompressHook();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown comm hook '", name, "' (choices: allreduce, fp16, bf16)"));
}

}  // namespace ddp
}  // namespace lockstep
