// A check of the Adasum hook that comm_hook_test runs on the CPU and
// ddp_cuda_test on the GPU: the hook over a fake world whose allgather gives
// each rank a row of its own equals the pairwise tree of those rows, per
// parameter, computed here on the CPU. (The engine-level tests on the GPU
// train identical ranks, where Adasum of equal gradients is that gradient,
// so a wrong row order, coefficient or remainder fold would still pass.)
#ifndef LOCKSTEP_DDP_ADASUM_HOOK_CHECK_H_
#define LOCKSTEP_DDP_ADASUM_HOOK_CHECK_H_

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <vector>

#include "ddp/comm_hook.h"
#include "ddp/fake_communicator.h"

namespace lockstep {
namespace ddp {
namespace adasum_check {

// Rank r's row: the bucket rolled by r and scaled by 1 + r / 2, neither
// parallel to nor orthogonal with the others'; computed where it lives.
inline at::Tensor DistinctRow(const at::Tensor& bucket, int r) {
  return bucket.reshape(-1).roll(r) * (1.0 + 0.5 * r);
}

class DistinctRowsCommunicator : public FakeCommunicator {
 public:
  DistinctRowsCommunicator(int world_size, c10::Device device)
      : FakeCommunicator(world_size, device) {}
  std::shared_ptr<Work> AllGather(at::Tensor input, at::Tensor output) override {
    const int64_t n = input.numel();
    for (int r = 0; r < world_size(); ++r) output.narrow(0, r * n, n).copy_(DistinctRow(input, r));
    return Work::Failed(absl::OkStatus());
  }
};

inline void ExpectAdasumHookMatchesThePerParameterTree(c10::Device device) {
  torch::manual_seed(5);
  for (int world = 2; world <= 5; ++world) {
    SCOPED_TRACE(::testing::Message() << "world " << world);
    DistinctRowsCommunicator comm(world, device);
    // Two parameters in one bucket, of 3 and 7 elements.
    const at::Tensor local = torch::randn({10});
    GradBucket bucket;
    bucket.buffer = local.clone().to(device);  // the hook writes its result there
    bucket.param_indices = {0, 1};
    bucket.offsets = {0, 3};
    bucket.numels = {3, 7};
    std::shared_ptr<BucketWork> work = AdasumHook().run(bucket, comm);
    StatusOr<at::Tensor> result = work->Wait(std::chrono::seconds(60));
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_EQ(result->device(), device);
    std::vector<at::Tensor> rows;
    for (int r = 0; r < world; ++r) rows.push_back(DistinctRow(local, r));
    at::Tensor per_parameter = torch::stack(rows);
    at::Tensor whole_bucket = per_parameter.clone();
    AdasumTreeInPlace(per_parameter.narrow(1, 0, 3));
    AdasumTreeInPlace(per_parameter.narrow(1, 3, 7));
    AdasumTreeInPlace(whole_bucket);
    const at::Tensor got = result->cpu();
    EXPECT_TRUE(torch::allclose(got, per_parameter[0], 1e-4, 1e-5))
        << "differs by " << (got - per_parameter[0]).abs().max().item<float>();
    // The data tells the two apart: the rule is applied per parameter.
    EXPECT_FALSE(torch::allclose(got, whole_bucket[0], 1e-4, 1e-5));
  }
}

}  // namespace adasum_check
}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_ADASUM_HOOK_CHECK_H_
