// DistributedDataParallel on CUDA over NCCL (world size 1: the GPU machines
// have one GPU, and NCCL refuses two ranks on one device). A full training
// step of the example models must give the same gradients and parameters as
// local training of the same model, the buckets' collectives must start
// while backward is still running, and a model split across CPU and GPU is
// rejected. Skips, with the reason, without NCCL or a usable GPU.
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "ddp/adasum_hook_check.h"
#include "ddp/checkpoint.h"
#include "ddp/ddp.h"
#include "ddp/fake_communicator.h"
#include "ddp/fake_store.h"
#include "ddp/nccl_communicator.h"
#include "ddp/nccl_test_util.h"
#include "examples/models.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace ddp {
namespace {

using ::testing::HasSubstr;

const torch::Device kGpu(torch::kCUDA, 0);

std::shared_ptr<NcclCommunicator> MakeComm(FakeStore* store) { return MakeWorldOfOne(store); }

examples::Workload OnGpu(const std::string& name) {
  auto w = examples::MakeWorkload(name, /*seed=*/7);
  EXPECT_TRUE(w.ok()) << w.status();
  w->root->to(kGpu);
  w->root->train();
  return std::move(*w);
}

torch::Tensor Loss(const torch::Tensor& out, const torch::Tensor& y) {
  return torch::nn::functional::cross_entropy(out, y);
}

struct Param {
  std::string name;
  torch::Tensor value, grad;
};

std::vector<Param> Snapshot(torch::nn::Module& m) {
  std::vector<Param> out;
  for (const auto& item : m.named_parameters()) {
    out.push_back({item.key(), item.value().detach().cpu().clone(),
                   item.value().grad().defined() ? item.value().grad().cpu().clone()
                                                 : torch::Tensor()});
  }
  return out;
}

void ExpectSame(const std::vector<Param>& ddp, const std::vector<Param>& local,
                const std::string& what) {
  ASSERT_EQ(ddp.size(), local.size());
  for (size_t i = 0; i < ddp.size(); ++i) {
    ASSERT_EQ(ddp[i].name, local[i].name);
    EXPECT_TRUE(torch::allclose(ddp[i].value, local[i].value, 1e-5, 1e-6))
        << what << ": parameter " << ddp[i].name;
    ASSERT_EQ(ddp[i].grad.defined(), local[i].grad.defined()) << ddp[i].name;
    if (ddp[i].grad.defined()) {
      EXPECT_TRUE(torch::allclose(ddp[i].grad, local[i].grad, 1e-4, 1e-6))
          << what << ": gradient of " << ddp[i].name << " differs by "
          << (ddp[i].grad - local[i].grad).abs().max().item<float>();
    }
  }
}

// Three SGD steps (the second rebuilds the buckets on the device) of DDP and
// of plain local training from the same initial model and data.
// `comm` defaults to a world-of-one NcclCommunicator.
// `hook` defaults to the average (AllreduceHook).
void TrainAndCompare(const std::string& model, bool gradient_as_bucket_view,
                     std::shared_ptr<Communicator> comm = nullptr,
                     CommHook hook = AllreduceHook()) {
  FakeStore store;
  if (comm == nullptr) comm = MakeComm(&store);
  ASSERT_NE(comm, nullptr);
  examples::Workload local = OnGpu(model);
  examples::Workload dist = OnGpu(model);
  DdpOptions options;
  options.gradient_as_bucket_view = gradient_as_bucket_view;
  options.comm_hook = std::move(hook);
  auto ddp = DistributedDataParallel::Create(dist.module, comm, options);
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  torch::optim::SGD local_opt(local.root->parameters(), torch::optim::SGDOptions(0.05));
  torch::optim::SGD ddp_opt(dist.root->parameters(), torch::optim::SGDOptions(0.05));
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = examples::MakeBatch(local, 32, /*seed=*/100 + step);
    x = x.to(kGpu);
    y = y.to(kGpu);
    local_opt.zero_grad();
    torch::manual_seed(1000 + step);  // Same dropout masks in both.
    Loss(local.module.forward(x), y).backward();
    ddp_opt.zero_grad();
    torch::manual_seed(1000 + step);
    auto out = (*ddp)->Forward(x);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_TRUE((*ddp)->Backward(Loss(*out, y)).ok());
    ExpectSame(Snapshot(*dist.root), Snapshot(*local.root),
               model + " step " + std::to_string(step) + " gradients");
    local_opt.step();
    ddp_opt.step();
  }
  ExpectSame(Snapshot(*dist.root), Snapshot(*local.root), model + " after 3 steps");
  EXPECT_EQ((*ddp)->last_stats().step, 3);
}

TEST(DdpCudaTest, MlpStepMatchesLocalTraining) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  TrainAndCompare("mlp", false);
}

TEST(DdpCudaTest, TransformerStepMatchesLocalTraining) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  TrainAndCompare("transformer", false);
}

TEST(DdpCudaTest, GradientAsBucketViewMatchesLocalTraining) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  TrainAndCompare("mlp", true);
}

// A world of one never divides. A fake world of two identical ranks on the
// GPU (its allreduce doubles the bucket on the current stream) checks the
// 1/world scaling of each gradient on the compute stream: without it, or
// with it out of order, the gradients would differ from local training.
TEST(DdpCudaTest, WorldOfTwoScalingOnTheGpuMatchesLocalTraining) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  auto fake = std::make_shared<FakeCommunicator>(2, kGpu);
  TrainAndCompare("mlp", false, fake);
  TrainAndCompare("transformer", true, fake);
  int allreduces = 0;
  for (const auto& call : fake->calls()) allreduces += call.op == "allreduce";
  EXPECT_GE(allreduces, 2 * 3 * 2) << "two models, three steps, at least two buckets each";
}

// Adasum on the GPU. Its hook allgathers the bucket and runs the pairwise
// tree on the device. Over NCCL at world 1 (the allgather is NCCL's), and
// over fake worlds of 2 and 3 identical ranks (3: the remainder rank folds
// into rank 0 first): Adasum of identical gradients is that gradient, so
// training must match local training, as the average does.
TEST(DdpCudaTest, AdasumMatchesLocalTrainingForIdenticalRanks) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  TrainAndCompare("mlp", true, nullptr, AdasumHook());
  for (int world : {2, 3}) {
    auto fake = std::make_shared<FakeCommunicator>(world, kGpu);
    TrainAndCompare("transformer", false, fake, AdasumHook());
    int allgathers = 0;
    for (const auto& call : fake->calls()) allgathers += call.op == "allgather";
    EXPECT_GE(allgathers, 3 * 2) << "world " << world << ": three steps, two buckets or more";
  }
}

// The hook on the device over fake worlds of 2 to 5 ranks whose rows
// differ (identical ranks, above, cannot tell a wrong row order,
// coefficient or remainder fold), against the per-parameter tree on the
// CPU; comm_hook_test runs the same check on the CPU.
TEST(DdpCudaTest, AdasumHookOverDistinctRowsMatchesThePerParameterTree) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  adasum_check::ExpectAdasumHookMatchesThePerParameterTree(kGpu);
}

// The Adasum rule on the device against the same rule on the CPU, for
// ranks with different gradients (2 to 5 ranks; 3 and 5 fold a remainder).
// comm_hook_test checks the CPU rule against the paper's formula.
TEST(DdpCudaTest, AdasumTreeOnTheGpuEqualsTheCpuTree) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  torch::manual_seed(11);
  for (int world = 2; world <= 5; ++world) {
    torch::Tensor cpu = torch::randn({world, 4099});
    torch::Tensor gpu = cpu.to(kGpu);
    AdasumTreeInPlace(cpu);
    AdasumTreeInPlace(gpu);
    EXPECT_TRUE(torch::allclose(gpu.cpu()[0], cpu[0], 1e-4, 1e-5))
        << "world " << world << ": differs by " << (gpu.cpu()[0] - cpu[0]).abs().max().item<float>();
  }
}

// Overlap on the GPU: the watchdog marks a bucket started when its start
// event has completed on the GPU (so no earlier than the GPU began it), and
// backward_end is when the host finished queuing backward (no later than the
// GPU finished it). The first bucket starting before backward_end therefore
// proves the collective ran while backward was still in progress. A small
// batch keeps the GPU close behind the host, as in latency-bound training.
// The last step's stats once the watchdog has marked every bucket's
// collective ended (Backward's end only queued stream waits), or after 30 s.
ReducerStepStats StatsOnceEveryBucketEnded(const DistributedDataParallel& ddp) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  ReducerStepStats s = ddp.last_stats().reducer;
  while (std::count(s.bucket_comm_end.begin(), s.bucket_comm_end.end(), MonoTime{}) > 0 &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    s = ddp.last_stats().reducer;
  }
  return s;
}

// The timestamps of one step, in microseconds after the end of forward.
void PrintTimeline(const ReducerStepStats& s) {
  auto us = [&](MonoTime t) {
    return static_cast<long long>(std::chrono::duration_cast<std::chrono::microseconds>(
                                      t - s.forward_end).count());
  };
  std::printf("timeline (us after forward's end): backward queued until %lld\n",
              us(s.backward_end));
  for (int b = 0; b < s.buckets; ++b) {
    std::printf("  bucket %d: launched %lld, started on the GPU %lld, done %lld\n", b,
                us(s.bucket_launched[b]), us(s.bucket_comm_start[b]), us(s.bucket_comm_end[b]));
  }
  std::fflush(stdout);
}

TEST(DdpCudaTest, FirstBucketStartsBeforeBackwardEnds) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  FakeStore store;
  auto comm = MakeComm(&store);
  ASSERT_NE(comm, nullptr);
  examples::Workload w = OnGpu("transformer");
  auto ddp = DistributedDataParallel::Create(w.module, comm);
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  auto [x, y] = examples::MakeBatch(w, 8, /*seed=*/3);
  x = x.to(kGpu);
  y = y.to(kGpu);
  int overlapped = 0;
  const int steps = 10;
  for (int step = 0; step < steps; ++step) {
    auto out = (*ddp)->Forward(x);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_TRUE((*ddp)->Backward(Loss(*out, y)).ok());
    const ReducerStepStats s = StatsOnceEveryBucketEnded(**ddp);
    ASSERT_GE(s.buckets, 2);
    ASSERT_EQ(s.bucket_comm_start.size(), static_cast<size_t>(s.buckets));
    for (int b = 0; b < s.buckets; ++b) {
      ASSERT_NE(s.bucket_comm_end[b], MonoTime{}) << "bucket " << b << " never finished";
      EXPECT_LE(s.bucket_comm_start[b], s.bucket_comm_end[b]);
      if (b > 0) {
        EXPECT_LE(s.bucket_comm_end[b - 1], s.bucket_comm_end[b]) << "out of order";
      }
    }
    if (s.bucket_comm_start.front() < s.backward_end) ++overlapped;
    if (step == steps - 1) PrintTimeline(s);
  }
  // Step 1 runs before the bucket rebuild; later steps use the rebuilt order.
  EXPECT_GE(overlapped, steps / 2) << "the first bucket started before the end of backward in "
                                   << overlapped << " of " << steps << " steps";
}

#ifdef LOCKSTEP_WITH_NCCL
// Backward's end queues stream waits instead of waiting on the host, so a
// bucket's allreduce can fail after Backward has returned OK (here: held
// past its 1 s timeout behind the default stream, then aborted). The next
// step must fail, naming the bucket and the timeout, not train on.
TEST(DdpCudaTest, AllreduceFailingAfterBackwardReturnedFailsTheNextStep) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  FakeStore store;
  std::shared_ptr<Communicator> comm = MakeWorldOfOne(&store, std::chrono::seconds(1));
  ASSERT_NE(comm, nullptr);
  examples::Workload w = OnGpu("mlp");
  auto ddp = DistributedDataParallel::Create(w.module, comm);
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  auto [x, y] = examples::MakeBatch(w, 8, /*seed=*/5);
  x = x.to(kGpu);
  y = y.to(kGpu);
  // Two healthy steps first: the second accumulates into existing gradients,
  // so every kernel of the held step has run once. (CUDA loads kernels
  // lazily, and loading one can wait for the whole device, held stream
  // included.)
  for (int step = 0; step < 2; ++step) {
    auto out = (*ddp)->Forward(x);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_TRUE((*ddp)->Backward(Loss(*out, y)).ok());
  }
  torch::cuda::synchronize();

  auto out = (*ddp)->Forward(x);
  ASSERT_TRUE(out.ok()) << out.status();
  torch::Tensor loss = Loss(*out, y);
  std::thread release = HoldDefaultStream(std::chrono::seconds(3));
  Status held = (*ddp)->Backward(loss);
  // Backward returned while its buckets were still queued behind the held
  // stream: its end waited on the GPU through the stream, not the host.
  const ReducerStepStats queued = (*ddp)->last_stats().reducer;
  release.join();
  torch::cuda::synchronize();
  EXPECT_TRUE(held.ok()) << held;
  ASSERT_EQ(queued.buckets, 3);
  EXPECT_EQ(queued.bucket_comm_end[0], MonoTime{}) << "backward's end waited on the host";

  // The watchdog aborts at 1 s, but ncclCommAbort returns only once the
  // held kernels could run; wait for the failure to reach the Works.
  StatsOnceEveryBucketEnded(**ddp);
  auto next = (*ddp)->Forward(x);
  ASSERT_FALSE(next.ok()) << "a step after a failed allreduce went on";
  EXPECT_THAT(std::string(next.status().message()),
              HasSubstr("gradient allreduce of bucket 0 in the previous step failed"));
  EXPECT_THAT(std::string(next.status().message()), HasSubstr("did not complete within 1 s"));
}
#endif  // LOCKSTEP_WITH_NCCL

struct TwoLayersImpl : torch::nn::Module {
  TwoLayersImpl() {
    first = register_module("first", torch::nn::Linear(4, 4));
    second = register_module("second", torch::nn::Linear(4, 2));
  }
  torch::Tensor forward(torch::Tensor x) { return second(first(x)); }
  torch::nn::Linear first{nullptr}, second{nullptr};
};
TORCH_MODULE(TwoLayers);

TEST(DdpCudaTest, ModelSplitAcrossCpuAndGpuIsRejected) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  FakeStore store;
  auto comm = MakeComm(&store);
  ASSERT_NE(comm, nullptr);
  TwoLayers model;
  model->second->to(kGpu);  // The first layer stays on the CPU.
  auto ddp = DistributedDataParallel::Create(model, comm);
  ASSERT_FALSE(ddp.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(ddp.status())) << ddp.status();
  EXPECT_THAT(std::string(ddp.status().message()),
              HasSubstr("more than one device ('first.weight' on cpu, 'second.weight' on cuda:0)"));
}

// A checkpoint is read onto its model's device, so the optimizer's state
// lands beside the parameters wherever it was saved from: a CPU save
// restored on the GPU (its momentum stayed on the CPU and the first step
// failed), and, with two GPUs, rank 0's cuda:0 save restored on cuda:1.
TEST(DdpCudaTest, ACheckpointsOptimizerStateIsRestoredOntoTheModelsDevice) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/ddp_cuda_test_checkpoint";
  std::filesystem::remove_all(dir);
  torch::manual_seed(3);
  torch::nn::Linear saved(4, 3);
  torch::optim::SGD saved_opt(saved->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto one_step = [](torch::nn::Linear& m, torch::optim::SGD& opt) {
    const torch::Device d = m->weight.device();
    opt.zero_grad();
    m->forward(torch::ones({2, 4}, d)).pow(2).sum().backward();
    opt.step();
  };
  one_step(saved, saved_opt);
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {1, 1, 1}, *saved, &saved_opt).ok());
  auto restore_on = [&](const torch::Device& device) {
    SCOPED_TRACE(device.str());
    torch::nn::Linear m(4, 3);
    m->to(device);
    torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    auto restored = RestoreCheckpoint(dir, *m, &opt);
    ASSERT_TRUE(restored.ok()) << restored.status();
    ASSERT_TRUE(restored->has_value());
    ASSERT_EQ(opt.state().size(), 2u);
    for (const auto& [key, state] : opt.state()) {
      const auto& sgd = static_cast<const torch::optim::SGDParamState&>(*state);
      EXPECT_EQ(sgd.momentum_buffer().device(), device) << key;
    }
    one_step(m, opt);  // threw (tensors on two devices) before
    torch::nn::Linear expect(4, 3);
    torch::optim::SGD expect_opt(expect->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    ASSERT_TRUE(RestoreCheckpoint(dir, *expect, &expect_opt).ok());
    one_step(expect, expect_opt);
    EXPECT_TRUE(torch::allclose(m->weight.cpu(), expect->weight, 1e-6, 1e-6));
  };
  restore_on(kGpu);
  if (torch::cuda::device_count() >= 2) {
    saved->to(kGpu);
    torch::optim::SGD gpu_opt(saved->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    one_step(saved, gpu_opt);
    std::filesystem::remove_all(dir);
    ASSERT_TRUE(SaveCheckpoint(dir, 0, {2, 1, 1}, *saved, &gpu_opt).ok());
    restore_on(torch::Device(torch::kCUDA, 1));
  }
}

TEST(DdpCudaTest, CpuModelWithTheNcclBackendIsRejected) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  FakeStore store;
  auto comm = MakeComm(&store);
  ASSERT_NE(comm, nullptr);
  auto ddp = DistributedDataParallel::Create(torch::nn::Linear(4, 4), comm);
  ASSERT_FALSE(ddp.ok());
  EXPECT_THAT(std::string(ddp.status().message()),
              HasSubstr("the model is on cpu but the nccl communicator reduces tensors on cuda:0"));
}

}  // namespace
}  // namespace ddp
}  // namespace lockstep
