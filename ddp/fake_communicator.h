// FakeCommunicator: a test-only Communicator for one process that records
// every collective it is asked for and completes it at once (a world of
// `world_size` identical ranks: sums multiply by world_size, averages and
// broadcasts leave data unchanged). Failure switch: fail_after(n) makes the
// n-th and later collectives fail with Unavailable. Thread-safe.
#ifndef LOCKSTEP_DDP_FAKE_COMMUNICATOR_H_
#define LOCKSTEP_DDP_FAKE_COMMUNICATOR_H_

#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ddp/communicator.h"

namespace lockstep {
namespace ddp {

class FakeCommunicator : public Communicator {
 public:
  struct Call {
    std::string op;
    const void* data;  // The tensor's data pointer, to identify buckets.
    int64_t numel;
  };

  // `device`: where the tensors it is given live (a CUDA device stands in
  // for a device communicator; its arithmetic then runs on the caller's
  // current stream).
  explicit FakeCommunicator(int world_size = 1,
                            c10::Device device = c10::Device(c10::DeviceType::CPU))
      : world_size_(world_size), device_(device) {}

  int rank() const override { return 0; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "fake"; }
  c10::Device device() const override { return device_; }

  std::shared_ptr<Work> AllReduce(at::Tensor tensor, ReduceOp op) override {
    auto w = Record("allreduce", tensor);
    if (w) return w;
    if (op == ReduceOp::kSum) tensor.mul_(world_size_);
    return Work::Failed(absl::OkStatus());
  }
  std::shared_ptr<Work> Broadcast(at::Tensor tensor, int root) override {
    auto w = Record("broadcast", tensor);
    return w ? w : Work::Failed(absl::OkStatus());
  }
  std::shared_ptr<Work> AllGather(at::Tensor input, at::Tensor output) override {
    auto w = Record("allgather", input);
    if (w) return w;
    for (int r = 0; r < world_size_; ++r) output.narrow(0, r * input.numel(), input.numel()).copy_(input.reshape(-1));
    return Work::Failed(absl::OkStatus());
  }
  std::shared_ptr<Work> Barrier() override {
    auto w = Record("barrier", at::Tensor());
    return w ? w : Work::Failed(absl::OkStatus());
  }

  void fail_after(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_after_ = n;
  }
  std::vector<Call> calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.clear();
  }

 private:
  // Returns a failed Work when the failure switch is on, else null.
  std::shared_ptr<Work> Record(const char* op, const at::Tensor& t) {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(Call{op, t.defined() ? t.data_ptr() : nullptr, t.defined() ? t.numel() : 0});
    if (fail_after_ >= 0 && static_cast<int>(calls_.size()) > fail_after_) {
      return Work::Failed(absl::UnavailableError(absl::StrCat("fake ", op, " failed (injected)")));
    }
    return nullptr;
  }

  const int world_size_;
  const c10::Device device_;
  mutable std::mutex mu_;
  std::vector<Call> calls_;  // GUARDED_BY(mu_)
  int fail_after_ = -1;      // GUARDED_BY(mu_)
};

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_FAKE_COMMUNICATOR_H_
