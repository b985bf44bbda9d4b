// NcclCommunicator. Everything that needs a GPU skips, with the reason, where
// NCCL was not built in (the default CPU-only build), no CUDA device is
// visible, or LibTorch cannot make CUDA tensors (Debian's LibTorch).
// On a GPU machine: bazel test --config=cuda //ddp:nccl_communicator_test,
// or the CMake build (ddp/README.md, "CMake build (GPU machine)").
#include "ddp/nccl_communicator.h"

#include <torch/torch.h>

#include <chrono>
#include <thread>

#include "ddp/fake_store.h"
#include "ddp/nccl_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace ddp {
namespace {

using ::testing::HasSubstr;

constexpr Duration kWait = std::chrono::seconds(60);

torch::TensorOptions OnGpu(torch::ScalarType type = torch::kFloat) {
  return torch::TensorOptions().dtype(type).device(torch::Device(torch::kCUDA, 0));
}

// Runs everywhere: without NCCL the class still links, and says why it
// cannot work instead of failing obscurely.
TEST(NcclCommunicatorTest, WithoutNcclCreateNamesTheMissingBuildOption) {
  if (NcclCompiledIn()) GTEST_SKIP() << "built with NCCL; covered by the GPU tests";
  FakeStore store;
  auto comm = NcclCommunicator::Create(&store, 0, 1);
  ASSERT_FALSE(comm.ok());
  EXPECT_TRUE(absl::IsUnimplemented(comm.status())) << comm.status();
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("--config=cuda"));
}

TEST(NcclCommunicatorTest, RejectsBadRankBeforeTouchingTheGpu) {
  if (!NcclCompiledIn()) GTEST_SKIP() << "built without NCCL";
  FakeStore store;
  auto comm = NcclCommunicator::Create(&store, 2, 2);
  ASSERT_FALSE(comm.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(comm.status())) << comm.status();
}

TEST(NcclCommunicatorTest, WorldOfOneAllReduceSumAndAverage) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  FakeStore store;
  auto comm = MakeWorldOfOne(&store);
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->device(), torch::Device(torch::kCUDA, 0));
  for (auto type : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16}) {
    auto t = torch::arange(1000, OnGpu(type));
    const auto expected = t.clone();
    ASSERT_TRUE(comm->AllReduce(t, ReduceOp::kSum)->Wait(kWait).ok());
    EXPECT_TRUE(torch::equal(t, expected)) << c10::toString(type);
    ASSERT_TRUE(comm->AllReduce(t, ReduceOp::kAvg)->Wait(kWait).ok());
    EXPECT_TRUE(torch::equal(t, expected)) << c10::toString(type);
  }
  auto ints = torch::arange(17, OnGpu(torch::kLong));
  ASSERT_TRUE(comm->AllReduce(ints, ReduceOp::kSum)->Wait(kWait).ok());
  EXPECT_EQ(ints.sum().item<int64_t>(), 136);
  auto avg = comm->AllReduce(ints, ReduceOp::kAvg)->Wait(kWait);
  EXPECT_TRUE(absl::IsInvalidArgument(avg)) << avg;
}

TEST(NcclCommunicatorTest, BroadcastAllGatherAndBarrierComplete) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  FakeStore store;
  auto comm = MakeWorldOfOne(&store);
  ASSERT_NE(comm, nullptr);
  auto t = torch::full({64}, 3.0, OnGpu());
  ASSERT_TRUE(comm->Broadcast(t, 0)->Wait(kWait).ok());
  EXPECT_EQ(t.sum().item<float>(), 192.0f);
  auto out = torch::zeros({64}, OnGpu());
  ASSERT_TRUE(comm->AllGather(t, out)->Wait(kWait).ok());
  EXPECT_TRUE(torch::equal(out, t));
  auto barrier = comm->Barrier();
  ASSERT_TRUE(barrier->Wait(kWait).ok());
  EXPECT_LE(barrier->started_at(), barrier->finished_at());
  EXPECT_NE(barrier->started_at(), MonoTime{});
  auto bad_root = comm->Broadcast(t, 1)->Wait(kWait);
  EXPECT_TRUE(absl::IsInvalidArgument(bad_root)) << bad_root;
  auto bad_size = comm->AllGather(t, torch::zeros({63}, OnGpu()))->Wait(kWait);
  EXPECT_TRUE(absl::IsInvalidArgument(bad_size)) << bad_size;
}

TEST(NcclCommunicatorTest, CpuTensorIsRejectedNamingBothDevices) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  FakeStore store;
  auto comm = MakeWorldOfOne(&store);
  ASSERT_NE(comm, nullptr);
  Status s = comm->AllReduce(torch::ones({4}), ReduceOp::kSum)->Wait(kWait);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("is on cpu, expected cuda:0"));
}

// The collective must run after the kernels already queued on the caller's
// stream. The input is written by a fill queued behind ~seconds of matrix
// products; the allgather copies it out on the NCCL stream (a non-blocking
// stream, which does not wait for the default stream on its own). Without
// the event ordering the copy reads the old zeros.
TEST(NcclCommunicatorTest, CollectiveRunsAfterTheProducingStream) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  FakeStore store;
  auto comm = MakeWorldOfOne(&store);
  ASSERT_NE(comm, nullptr);
  auto input = torch::zeros({1 << 20}, OnGpu());
  auto output = torch::zeros({1 << 20}, OnGpu());
  torch::cuda::synchronize();
  auto a = torch::randn({4096, 4096}, OnGpu());
  for (int i = 0; i < 40; ++i) a = torch::mm(a, a).div_(4096.0);  // Keeps the stream busy.
  input.fill_(7.0);
  auto work = comm->AllGather(input, output);
  ASSERT_TRUE(work->Wait(kWait).ok());
  EXPECT_EQ(output.min().item<float>(), 7.0f);
  EXPECT_EQ(output.max().item<float>(), 7.0f);
}

// WaitStream orders the caller's stream after the collective without a host
// wait: a reduction queued right after it sees the gathered values.
TEST(NcclCommunicatorTest, WaitStreamOrdersTheConsumerWithoutBlockingTheHost) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  FakeStore store;
  auto comm = MakeWorldOfOne(&store);
  ASSERT_NE(comm, nullptr);
  const int64_t n = int64_t{1} << 27;  // 512 MB: the copy takes a while.
  auto input = torch::ones({n}, OnGpu());
  auto output = torch::zeros({n}, OnGpu());
  torch::cuda::synchronize();
  auto work = comm->AllGather(input, output);
  ASSERT_TRUE(work->WaitStream().ok());
  const double sum = output.sum(torch::kDouble).item<double>();
  EXPECT_EQ(sum, static_cast<double>(n));
  ASSERT_TRUE(work->Wait(kWait).ok());
}

TEST(NcclCommunicatorTest, InitTimeoutNamesTheRankThatNeverArrived) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  FakeStore store;
  NcclOptions options;
  options.device = 0;
  options.connect_timeout = std::chrono::seconds(3);
  auto comm = NcclCommunicator::Create(&store, 0, 2, options);  // Rank 1 never comes.
  ASSERT_FALSE(comm.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(comm.status())) << comm.status();
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("ranks [1] never arrived"));
}

TEST(NcclCommunicatorTest, MissingUniqueIdNamesRankZero) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  FakeStore store;
  NcclOptions options;
  options.device = 0;
  options.connect_timeout = std::chrono::seconds(1);
  auto comm = NcclCommunicator::Create(&store, 1, 2, options);
  ASSERT_FALSE(comm.ok());
  EXPECT_THAT(std::string(comm.status().message()),
              HasSubstr("rank 0 did not publish the NCCL unique id"));
}

#ifdef LOCKSTEP_WITH_NCCL
// A collective that cannot finish within its timeout (here: it waits for the
// caller's stream, which a host callback holds) is aborted by the watchdog;
// the Work fails with DeadlineExceeded, and the communicator refuses every
// later call. With one GPU this stands in for a peer that never arrives
// (the multi-GPU case also names the missing ranks through the store).
TEST(NcclCommunicatorTest, CollectivePastItsTimeoutAbortsTheCommunicator) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  FakeStore store;
  auto comm = MakeWorldOfOne(&store, std::chrono::seconds(1));
  ASSERT_NE(comm, nullptr);
  auto t = torch::ones({1024}, OnGpu());
  torch::cuda::synchronize();
  // The current torch stream is the default stream here; released well
  // after the 1 s timeout.
  std::thread release = HoldDefaultStream(std::chrono::seconds(3));
  Status s = comm->AllReduce(t, ReduceOp::kSum)->Wait(kWait);
  release.join();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("did not complete within 1 s"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("communicator aborted"));
  Status later = comm->AllReduce(t, ReduceOp::kSum)->Wait(kWait);
  EXPECT_TRUE(absl::IsFailedPrecondition(later)) << later;
  torch::cuda::synchronize();
}
#endif  // LOCKSTEP_WITH_NCCL

}  // namespace
}  // namespace ddp
}  // namespace lockstep
