// The engine reports each synchronised step to the process's progress sink:
// step numbers (also after ResumeAt), samples counted from Forward's first
// argument, the CPU loss summed over no_sync micro-batches, nothing when
// report_progress is off, and the sink lives exactly as long as its users.
#include "ddp/progress.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "ddp/ddp.h"
#include "ddp/fake_communicator.h"

namespace lockstep {
namespace ddp {
namespace {

struct Recorded {
  std::mutex mu;
  std::vector<StepProgress> reports;
  std::vector<CollectiveState> collectives;
  int sinks_alive = 0;
  int sinks_made = 0;
  int flushes = 0;
};

class RecordingSink : public ProgressSink {
 public:
  explicit RecordingSink(Recorded* r) : r_(r) {
    std::lock_guard<std::mutex> lock(r_->mu);
    ++r_->sinks_alive;
    ++r_->sinks_made;
  }
  ~RecordingSink() override {
    std::lock_guard<std::mutex> lock(r_->mu);
    --r_->sinks_alive;
  }
  void Report(const StepProgress& p) override {
    std::lock_guard<std::mutex> lock(r_->mu);
    r_->reports.push_back(p);
  }
  void SetCollective(const CollectiveState& c) override {
    std::lock_guard<std::mutex> lock(r_->mu);
    r_->collectives.push_back(c);
  }
  void Flush(std::chrono::milliseconds) override {
    std::lock_guard<std::mutex> lock(r_->mu);
    ++r_->flushes;
  }

 private:
  Recorded* r_;
};

class ProgressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::manual_seed(1);
    RegisterProgressSinkFactory([this] { return std::make_unique<RecordingSink>(&recorded_); });
  }
  void TearDown() override { RegisterProgressSinkFactory(nullptr); }

  // One step of `micro` micro-batches of `batch` samples; returns the sum
  // of the losses.
  double Step(DistributedDataParallel& ddp, int micro, int batch) {
    double sum = 0;
    for (int m = 0; m < micro; ++m) {
      std::unique_ptr<DistributedDataParallel::NoSyncScope> no_sync;
      if (m + 1 < micro) no_sync = std::make_unique<DistributedDataParallel::NoSyncScope>(&ddp);
      auto out = ddp.Forward(torch::randn({batch, 4}));
      EXPECT_TRUE(out.ok()) << out.status();
      torch::Tensor loss = out->pow(2).mean();
      sum += loss.item<double>();
      EXPECT_TRUE(ddp.Backward(loss).ok());
    }
    return sum;
  }

  Recorded recorded_;
};

TEST_F(ProgressTest, EachSynchronisedStepIsReported) {
  torch::nn::Linear model(4, 2);
  auto ddp = DistributedDataParallel::Create(model, std::make_shared<FakeCommunicator>());
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  std::vector<double> losses;
  losses.push_back(Step(**ddp, 1, 8));
  losses.push_back(Step(**ddp, 3, 5));  // Two no_sync micro-batches, then one synchronised.
  (*ddp)->ResumeAt(40);
  losses.push_back(Step(**ddp, 1, 8));

  std::lock_guard<std::mutex> lock(recorded_.mu);
  ASSERT_EQ(recorded_.reports.size(), 3u);
  const int64_t want_steps[] = {1, 2, 41};
  const int64_t want_samples[] = {8, 15, 8};
  for (size_t i = 0; i < 3; ++i) {
    const StepProgress& p = recorded_.reports[i];
    SCOPED_TRACE(i);
    EXPECT_EQ(p.step, want_steps[i]);
    EXPECT_EQ(p.samples, want_samples[i]);
    EXPECT_GT(p.samples_per_s, 0);
    EXPECT_NEAR(p.loss, losses[i], 1e-9);
    EXPECT_GE(p.backward_ms, 0);
    EXPECT_EQ(p.buckets, 1);
    EXPECT_EQ(p.bytes_reduced, (4 * 2 + 2) * 4);
  }
}

// Stands in for a torch optimizer: counts its steps.
struct CountingOptimizer {
  int steps = 0;
  torch::Tensor step() {
    ++steps;
    return {};
  }
};

TEST_F(ProgressTest, OptimizerStepEndsTheStepAndSplitsItsTime) {
  torch::nn::Linear model(4, 2);
  auto ddp = DistributedDataParallel::Create(model, std::make_shared<FakeCommunicator>());
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  CountingOptimizer opt;
  for (int i = 0; i < 3; ++i) {
    Step(**ddp, 1, 8);
    {
      std::lock_guard<std::mutex> lock(recorded_.mu);
      // Step 1 goes out at the end of backward (OptimizerStep was not seen
      // yet); later steps wait for the optimizer.
      EXPECT_EQ(recorded_.reports.size(), i == 0 ? 1u : static_cast<size_t>(i));
    }
    (*ddp)->OptimizerStep(opt);
  }
  EXPECT_EQ(opt.steps, 3);
  std::lock_guard<std::mutex> lock(recorded_.mu);
  ASSERT_EQ(recorded_.reports.size(), 3u);
  EXPECT_EQ(recorded_.reports[0].optimizer_ms, 0);
  for (size_t i = 1; i < 3; ++i) {
    const StepProgress& p = recorded_.reports[i];
    SCOPED_TRACE(i);
    EXPECT_EQ(p.step, static_cast<int64_t>(i + 1));
    EXPECT_GT(p.step_ms, 0);
    EXPECT_GT(p.optimizer_ms, 0);
    EXPECT_GE(p.data_ms, 0);
    // Disjoint intervals of one step on one clock.
    EXPECT_LE(p.data_ms + p.forward_ms + p.backward_ms + p.optimizer_ms, p.step_ms + 1e-6);
    EXPECT_LE(p.exposed_comm_ms, p.backward_ms);
    EXPECT_NEAR(p.samples_per_s, p.samples * 1000.0 / p.step_ms, 1e-6);
  }
}

// overlap_optimizer and overlap_forward.
DdpOptions OverlapForward() {
  DdpOptions options;
  options.overlap_optimizer = true;
  options.overlap_forward = true;
  return options;
}

// overlap_forward: a step ends at OptimizerStep but its buckets are done
// during the next forward; it is reported then, once, with its own counts
// (not the next forward's samples), and the last one by CompletePendingStep.
TEST_F(ProgressTest, OverlappedForwardReportsEachStepOnceWithItsOwnCounts) {
  torch::nn::Linear model(4, 2);
  auto ddp = DistributedDataParallel::Create(model, std::make_shared<FakeCommunicator>(),
                                             OverlapForward());
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  torch::optim::SGD opt(model->parameters(), 0.1);
  const int batches[] = {8, 5, 6};
  std::vector<double> losses;
  for (int i = 0; i < 3; ++i) {
    losses.push_back(Step(**ddp, 1, batches[i]));
    (*ddp)->OptimizerStep(opt);
    std::lock_guard<std::mutex> lock(recorded_.mu);
    // Step i + 1 is still open: reported are those before it.
    EXPECT_EQ(recorded_.reports.size(), static_cast<size_t>(i));
    EXPECT_TRUE((*ddp)->reducer().step_open());
  }
  ASSERT_TRUE((*ddp)->CompletePendingStep().ok());
  std::lock_guard<std::mutex> lock(recorded_.mu);
  ASSERT_EQ(recorded_.reports.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const StepProgress& p = recorded_.reports[i];
    SCOPED_TRACE(i);
    EXPECT_EQ(p.step, static_cast<int64_t>(i + 1));
    EXPECT_EQ(p.samples, batches[i]);
    EXPECT_NEAR(p.loss, losses[i], 1e-9);
    EXPECT_GT(p.step_ms, 0);
    EXPECT_GE(p.optimizer_ms, 0);
    EXPECT_NEAR(p.samples_per_s, p.samples * 1000.0 / p.step_ms, 1e-6);
    // Its backward does not run on into the next forward, where it ended.
    EXPECT_LE(p.exposed_comm_ms, p.backward_ms);
    EXPECT_LE(p.data_ms + p.forward_ms + p.backward_ms + p.optimizer_ms, p.step_ms + 1e-6);
  }
}

// An SGD whose every step takes `kSlow` longer, as a heavy optimizer would.
constexpr auto kSlow = std::chrono::milliseconds(40);
class SlowSgd : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;
  torch::Tensor step(LossClosure closure = nullptr) override {
    std::this_thread::sleep_for(kSlow);
    return torch::optim::SGD::step(closure);
  }
};

// overlap_forward: a step's buckets are stepped in the next forward, after
// the step ended, so their optimizer time is that forward's, not the step's
// optimizer_ms (it was both, and the step's parts outgrew its step_ms by the
// optimizer's time: the slow SGD makes that 40 ms, not a microsecond).
TEST_F(ProgressTest, OverlappedForwardCountsBucketStepsInTheForwardThatRunsThem) {
  torch::nn::Linear model(4, 2);
  auto ddp = DistributedDataParallel::Create(model, std::make_shared<FakeCommunicator>(),
                                             OverlapForward());
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  SlowSgd opt(model->parameters(), 0.1);
  for (int i = 0; i < 3; ++i) {
    Step(**ddp, 1, 8);
    (*ddp)->OptimizerStep(opt);
  }
  ASSERT_TRUE((*ddp)->CompletePendingStep().ok());
  std::lock_guard<std::mutex> lock(recorded_.mu);
  ASSERT_EQ(recorded_.reports.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const StepProgress& p = recorded_.reports[i];
    SCOPED_TRACE(i);
    EXPECT_LT(p.optimizer_ms, 40) << "the bucket steps after the step's end were counted in it";
    EXPECT_LE(p.data_ms + p.forward_ms + p.backward_ms + p.optimizer_ms, p.step_ms + 1e-6);
    // Steps 2 and 3 start with a forward that steps the step before's bucket.
    if (i > 0) EXPECT_GE(p.forward_ms, 40);
  }
}

// overlap_optimizer: OptimizerStep waits for each bucket before stepping its
// parameters. That wait is the step's exposed communication, not optimizer
// time. The hook's Work completes 300 ms after the bucket is launched.
TEST_F(ProgressTest, OverlappedOptimizerCountsItsBucketWaitsAsExposedCommunication) {
  constexpr auto kHeld = std::chrono::milliseconds(300);
  torch::nn::Linear model(4, 2);
  DdpOptions options;
  options.overlap_optimizer = true;
  std::vector<std::thread> finishers;
  options.comm_hook.name = "held";
  options.comm_hook.run = [&finishers, kHeld](GradBucket& bucket, Communicator&) {
    auto work = std::make_shared<Work>();
    work->MarkStarted();
    finishers.emplace_back([work, kHeld] {
      std::this_thread::sleep_for(kHeld);
      work->Finish(absl::OkStatus());
    });
    return BucketWork::Of(work, bucket.buffer, 0);
  };
  auto ddp = DistributedDataParallel::Create(model, std::make_shared<FakeCommunicator>(), options);
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  torch::optim::SGD opt(model->parameters(), 0.1);
  for (int i = 0; i < 3; ++i) {
    Step(**ddp, 1, 8);
    (*ddp)->OptimizerStep(opt);
  }
  for (std::thread& t : finishers) t.join();
  std::lock_guard<std::mutex> lock(recorded_.mu);
  ASSERT_EQ(recorded_.reports.size(), 3u);
  // Step 1 went out at the end of backward (no OptimizerStep seen yet).
  for (size_t i = 1; i < 3; ++i) {
    const StepProgress& p = recorded_.reports[i];
    SCOPED_TRACE(i);
    EXPECT_GE(p.exposed_comm_ms, 250) << "the wait for the held bucket is not exposed communication";
    EXPECT_LT(p.optimizer_ms, 250) << "the wait for the held bucket was counted as optimizer time";
    // The wait is part of backward_ms (forward's end to the gradients'
    // sync), as it is without the option; the intervals stay disjoint.
    EXPECT_LE(p.exposed_comm_ms, p.backward_ms);
    EXPECT_LE(p.data_ms + p.forward_ms + p.backward_ms + p.optimizer_ms, p.step_ms + 1e-6);
  }
}

TEST_F(ProgressTest, WithoutOptimizerStepEachStepEndsAtGradientSync) {
  torch::nn::Linear model(4, 2);
  auto ddp = DistributedDataParallel::Create(model, std::make_shared<FakeCommunicator>());
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  Step(**ddp, 1, 8);
  Step(**ddp, 1, 8);
  std::lock_guard<std::mutex> lock(recorded_.mu);
  ASSERT_EQ(recorded_.reports.size(), 2u);
  const StepProgress& p = recorded_.reports[1];
  EXPECT_EQ(p.optimizer_ms, 0);
  EXPECT_GT(p.step_ms, 0);
  EXPECT_LE(p.data_ms + p.forward_ms + p.backward_ms, p.step_ms + 1e-6);
}

TEST_F(ProgressTest, BucketWaitsAreAveragedOverAWindowOfSteps) {
  torch::nn::Linear model(4, 2);
  auto ddp = DistributedDataParallel::Create(model, std::make_shared<FakeCommunicator>());
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  for (int i = 0; i < kWaitWindowSteps + 2; ++i) Step(**ddp, 1, 4);
  std::lock_guard<std::mutex> lock(recorded_.mu);
  ASSERT_EQ(recorded_.reports.size(), static_cast<size_t>(kWaitWindowSteps + 2));
  for (size_t i = 0; i < recorded_.reports.size(); ++i) {
    const StepProgress& p = recorded_.reports[i];
    SCOPED_TRACE(i);
    EXPECT_EQ(p.wait_steps, std::min<int>(static_cast<int>(i) + 1, kWaitWindowSteps));
    ASSERT_EQ(p.bucket_wait_ms.size(), 1u);
    EXPECT_GE(p.bucket_wait_ms[0], 0);
  }
}

TEST_F(ProgressTest, CollectiveWaitsAreMarkedAndClearedWithTheirStep) {
  torch::nn::BatchNorm1d model(4);  // A buffer: the first forward broadcasts it.
  auto ddp = DistributedDataParallel::Create(model, std::make_shared<FakeCommunicator>());
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  auto out = (*ddp)->Forward(torch::randn({8, 4}));
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE((*ddp)->Backward(out->pow(2).mean()).ok());
  std::lock_guard<std::mutex> lock(recorded_.mu);
  ASSERT_GE(recorded_.collectives.size(), 2u);
  const CollectiveState& first = recorded_.collectives.front();
  EXPECT_TRUE(first.active);
  EXPECT_EQ(first.op, "broadcast");
  EXPECT_EQ(first.step, 1);
  EXPECT_EQ(first.bucket, -1);
  for (const auto& c : recorded_.collectives) {
    if (c.active && c.op == "allreduce") {
      EXPECT_EQ(c.step, 1);
    }
  }
  EXPECT_FALSE(recorded_.collectives.back().active);
}

TEST_F(ProgressTest, SamplesComeFromCountSamplesWithForwardWith) {
  torch::nn::Linear model(4, 2);
  auto ddp = DistributedDataParallel::Create(model, std::make_shared<FakeCommunicator>());
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  auto out = (*ddp)->ForwardWith([&] { return model->forward(torch::randn({6, 4})); });
  ASSERT_TRUE(out.ok());
  (*ddp)->CountSamples(6);
  ASSERT_TRUE((*ddp)->Backward(out->sum()).ok());
  std::lock_guard<std::mutex> lock(recorded_.mu);
  ASSERT_EQ(recorded_.reports.size(), 1u);
  EXPECT_EQ(recorded_.reports[0].samples, 6);
}

TEST_F(ProgressTest, OffWhenDisabledOrWithoutAFactory) {
  torch::nn::Linear model(4, 2);
  DdpOptions options;
  options.report_progress = false;
  auto quiet = DistributedDataParallel::Create(model, std::make_shared<FakeCommunicator>(), options);
  ASSERT_TRUE(quiet.ok());
  Step(**quiet, 1, 4);
  RegisterProgressSinkFactory(nullptr);
  EXPECT_EQ(AcquireProgressSink(), nullptr);
  auto unregistered = DistributedDataParallel::Create(model, std::make_shared<FakeCommunicator>());
  ASSERT_TRUE(unregistered.ok());
  Step(**unregistered, 1, 4);
  std::lock_guard<std::mutex> lock(recorded_.mu);
  EXPECT_TRUE(recorded_.reports.empty());
  EXPECT_EQ(recorded_.sinks_made, 0);
}

TEST_F(ProgressTest, OneSinkSharedByItsUsersAndGoneWithTheLast) {
  torch::nn::Linear a(4, 2), b(4, 2);
  auto first = DistributedDataParallel::Create(a, std::make_shared<FakeCommunicator>());
  auto second = DistributedDataParallel::Create(b, std::make_shared<FakeCommunicator>());
  ASSERT_TRUE(first.ok() && second.ok());
  {
    std::lock_guard<std::mutex> lock(recorded_.mu);
    EXPECT_EQ(recorded_.sinks_made, 1);
    EXPECT_EQ(recorded_.sinks_alive, 1);
  }
  first->reset();
  {
    std::lock_guard<std::mutex> lock(recorded_.mu);
    EXPECT_EQ(recorded_.sinks_alive, 1);
  }
  second->reset();
  std::lock_guard<std::mutex> lock(recorded_.mu);
  EXPECT_EQ(recorded_.sinks_alive, 0);
}

}  // namespace
}  // namespace ddp
}  // namespace lockstep
