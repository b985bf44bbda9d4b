// Reducer and DistributedDataParallel logic on one process with a
// FakeCommunicator (multi-rank behaviour is in tests/ddp).
#include "ddp/reducer.h"

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "ddp/ddp.h"
#include "ddp/fake_communicator.h"
#include "ddp/streaming.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace ddp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Registers a, b, c but applies them as a(b(c(x))): gradients arrive a, b,
// c while reverse registration order expects c, b, a.
struct ReversedUseImpl : torch::nn::Module {
  ReversedUseImpl() {
    a = register_module("a", torch::nn::Linear(8, 8));
    b = register_module("b", torch::nn::Linear(8, 8));
    c = register_module("c", torch::nn::Linear(8, 8));
    for (auto& p : parameters()) {
      if (p.dim() == 1) p.set_requires_grad(false);  // Only weights train.
    }
  }
  torch::Tensor forward(torch::Tensor x) { return a(b(c(x))); }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
};
TORCH_MODULE(ReversedUse);

struct PartlyUnusedImpl : torch::nn::Module {
  PartlyUnusedImpl() {
    used = register_module("used", torch::nn::Linear(4, 4));
    spare = register_module("spare", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return used(x); }
  torch::nn::Linear used{nullptr}, spare{nullptr};
};
TORCH_MODULE(PartlyUnused);

DdpOptions OneParamPerBucket() {
  DdpOptions o;
  o.bucket_cap_mb = 1e-6;  // Every parameter closes its own bucket.
  return o;
}

// The bucket index each allreduce call reduced, by matching buffers.
std::vector<int> LaunchOrder(const FakeCommunicator& comm, const DistributedDataParallel& ddp) {
  std::vector<int> order;
  const auto layout = ddp.reducer().bucket_indices();
  for (const auto& call : comm.calls()) {
    if (call.op != "allreduce") continue;
    for (size_t b = 0; b < layout.size(); ++b) {
      const auto& p = ddp.reducer().params()[layout[b].front()].tensor;
      if (p.grad().defined() && p.grad().data_ptr() == call.data) order.push_back(b);
    }
  }
  return order;
}

// What Create refuses, each InvalidArgument naming it, before any bucket
// is built.
TEST(ReducerTest, CreateRefusesWhatCannotBeReduced) {
  torch::nn::Linear layer(2, 2);
  std::vector<Reducer::NamedParam> params;
  for (const auto& p : layer->named_parameters()) params.push_back({p.key(), p.value()});
  FakeCommunicator comm;
  auto refused = [&](std::vector<Reducer::NamedParam> ps, ReducerOptions options,
                     const std::string& want) {
    auto r = Reducer::Create(std::move(ps), &comm, options);
    ASSERT_FALSE(r.ok()) << want;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(want));
  };
  refused({}, ReducerOptions{}, "no parameters require grad");
  auto twice = params;
  twice.push_back({"again", params[0].tensor});
  refused(twice, ReducerOptions{}, "parameter 'again' is listed twice");
  auto frozen = params;
  frozen.push_back({"frozen", torch::zeros({2}, torch::requires_grad(false))});
  refused(frozen, ReducerOptions{}, "parameter 'frozen' is not a leaf requiring grad");
  auto derived = params;
  derived.push_back({"derived", params[0].tensor * 2});
  refused(derived, ReducerOptions{}, "parameter 'derived' is not a leaf requiring grad");
  ReducerOptions no_run;
  no_run.comm_hook.name = "empty";
  no_run.comm_hook.run = nullptr;
  refused(params, no_run, "comm hook 'empty' has no function");
  ReducerOptions zero_cap;
  zero_cap.bucket_cap_bytes = 0;
  refused(params, zero_cap, "bucket caps must be positive");
  EXPECT_TRUE(Reducer::Create(params, &comm, ReducerOptions{}).ok());
}

TEST(ReducerTest, GradientPriorityNeedsAHostCommunicator) {
  torch::nn::Linear layer(2, 2);
  std::vector<Reducer::NamedParam> params;
  for (const auto& p : layer->named_parameters()) params.push_back({p.key(), p.value()});
  ReducerOptions options;
  options.gradient_priority = true;
  // A CUDA device stands in for a device communicator (NCCL): refused
  // before anything else is looked at.
  FakeCommunicator device_comm(1, c10::Device(c10::DeviceType::CUDA, 0));
  auto refused = Reducer::Create(params, &device_comm, options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("gradient_priority"));
  FakeCommunicator host_comm;
  EXPECT_TRUE(Reducer::Create(params, &host_comm, options).ok());
}

TEST(ReducerTest, RequiresGradFalseParametersAreSkippedAndBucketsFollowReverseOrder) {
  auto model = ReversedUse();
  auto comm = std::make_shared<FakeCommunicator>();
  auto ddp = DistributedDataParallel::Create(model, comm, OneParamPerBucket());
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  const auto& params = (*ddp)->reducer().params();
  ASSERT_EQ(params.size(), 3u);
  EXPECT_EQ(params[0].name, "a.weight");
  EXPECT_THAT((*ddp)->reducer().bucket_indices(),
              ElementsAre(ElementsAre(2), ElementsAre(1), ElementsAre(0)));
  EXPECT_EQ((*ddp)->reducer().bucket_of(0), 2u);
  EXPECT_EQ((*ddp)->reducer().bucket_of(2), 0u);
}

TEST(ReducerTest, BucketsLaunchInIndexOrderAndRebuildInArrivalOrder) {
  auto model = ReversedUse();
  auto comm = std::make_shared<FakeCommunicator>();
  DdpOptions options = OneParamPerBucket();
  options.gradient_as_bucket_view = true;  // So grads identify buckets.
  auto ddp_or = DistributedDataParallel::Create(model, comm, options);
  ASSERT_TRUE(ddp_or.ok()) << ddp_or.status();
  auto& ddp = *ddp_or;
  comm->clear();
  auto out = ddp->Forward(torch::randn({4, 8}));
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE(ddp->Backward(out->sum()).ok());
  // Bucket 2 (a) completed first but was launched last.
  EXPECT_THAT(LaunchOrder(*comm, *ddp), ElementsAre(0, 1, 2));

  comm->clear();
  out = ddp->Forward(torch::randn({4, 8}));  // Rebuilds: a, b, c.
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(ddp->reducer().bucket_indices(),
              ElementsAre(ElementsAre(0), ElementsAre(1), ElementsAre(2)));
  EXPECT_EQ(ddp->reducer().bucket_of(0), 0u) << "bucket_of follows the rebuild";
  ASSERT_TRUE(ddp->Backward(out->sum()).ok());
  EXPECT_THAT(LaunchOrder(*comm, *ddp), ElementsAre(0, 1, 2));
  EXPECT_EQ(ddp->last_stats().step, 2);
  EXPECT_EQ(ddp->last_stats().buckets, 3);
  EXPECT_EQ(ddp->last_stats().bytes_reduced, 3 * 64 * 4);
}

TEST(ReducerTest, AveragedGradientsMatchLocalGradients) {
  // A world of identical ranks: the average equals the local gradient.
  auto model = ReversedUse();
  auto twin = ReversedUse();
  torch::NoGradGuard guard;
  for (size_t i = 0; i < model->parameters().size(); ++i) {
    twin->parameters()[i].copy_(model->parameters()[i]);
  }
  auto comm = std::make_shared<FakeCommunicator>(3);
  auto ddp = DistributedDataParallel::Create(model, comm, DdpOptions{});
  ASSERT_TRUE(ddp.ok());
  torch::Tensor x = torch::randn({4, 8});
  {
    torch::AutoGradMode enable(true);
    auto out = (*ddp)->Forward(x);
    ASSERT_TRUE((*ddp)->Backward(out->pow(2).sum()).ok());
    twin->forward(x).pow(2).sum().backward();
  }
  EXPECT_TRUE(model->a->weight.grad().allclose(twin->a->weight.grad()));
  EXPECT_TRUE(model->c->weight.grad().allclose(twin->c->weight.grad()));
}

// Gradients above kStreamingMinBytes are copied into their slots with
// streaming stores (ddp/streaming.h), scaled by 1/world on the way: with two
// identical ranks the average is the local gradient bit for bit (x * 0.5 * 2
// is exact), on the first step and after the gradients were reset to
// undefined (zero_grad with set_to_none).
TEST(ReducerTest, LargeGradientsStreamIntoTheirSlotsExactly) {
  auto make = [] { return torch::nn::Sequential(torch::nn::Linear(1100, 1000), torch::nn::ReLU(),
                                                torch::nn::Linear(1000, 4)); };
  auto model = make();
  auto twin = make();
  {
    torch::NoGradGuard guard;
    for (size_t i = 0; i < model->parameters().size(); ++i) {
      twin->parameters()[i].copy_(model->parameters()[i]);
    }
  }
  const torch::Tensor big = model->parameters()[0];
  ASSERT_GE(big.nbytes(), static_cast<size_t>(kStreamingMinBytes));
  auto comm = std::make_shared<FakeCommunicator>(2);
  auto ddp = DistributedDataParallel::Create(model, comm, DdpOptions{});
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  for (int step = 0; step < 2; ++step) {
    for (auto* m : {&model, &twin}) {
      for (auto& p : (*m)->parameters()) p.mutable_grad().reset();
    }
    const torch::Tensor x = torch::randn({8, 1100});
    auto out = (*ddp)->Forward(x);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_TRUE((*ddp)->Backward(out->pow(2).sum()).ok());
    twin->forward(x).pow(2).sum().backward();
    for (size_t i = 0; i < model->parameters().size(); ++i) {
      EXPECT_TRUE(model->parameters()[i].grad().equal(twin->parameters()[i].grad()))
          << "step " << step << " parameter " << i;
    }
  }
}

// A device communicator's allreduce: WaitStream returns once the caller's
// stream is ordered after it, and the collective may fail after that
// (NCCL's watchdog aborts on a lost peer, the bucket half written). Here
// what reached the bucket says every rank is done.
class AllReduceFailingAfterItsStreamWait : public FakeCommunicator {
 public:
  AllReduceFailingAfterItsStreamWait() : FakeCommunicator(2) {}
  ~AllReduceFailingAfterItsStreamWait() override {
    for (auto& t : finishers_) t.join();
  }
  std::shared_ptr<Work> AllReduce(at::Tensor tensor, ReduceOp op) override {
    tensor.mul_(world_size());
    auto work = std::make_shared<Work>();
    work->SetStreamWaiter([] { return absl::OkStatus(); });
    work->MarkStarted();
    finishers_.emplace_back([this, work] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      broken_ = true;
      work->Finish(absl::UnavailableError(
          "nccl allreduce #2 on rank 0 failed: asynchronous NCCL error: remote process exited; "
          "communicator aborted"));
    });
    return work;
  }
  // Every later call fails, as on an aborted NCCL communicator.
  std::shared_ptr<Work> Broadcast(at::Tensor tensor, int root) override {
    if (broken_) {
      return Work::Failed(absl::FailedPreconditionError(
          "nccl broadcast on rank 0: the communicator failed earlier"));
    }
    return FakeCommunicator::Broadcast(std::move(tensor), root);
  }

 private:
  std::atomic<bool> broken_{false};
  std::vector<std::thread> finishers_;
};

// AllDone reads the counts only once their collective has ended well: a
// loop must not stop on "every rank done" that was never reduced.
TEST(ReducerTest, AllDoneIsFalseWhenTheCountsCollectiveFailedAfterItsStreamWait) {
  auto model = ReversedUse();
  auto comm = std::make_shared<AllReduceFailingAfterItsStreamWait>();
  DdpOptions options;
  options.weight_by_samples = true;
  auto ddp = DistributedDataParallel::Create(model, comm, options);
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  ASSERT_TRUE((*ddp)->JoinStep().ok()) << "only the stream waited";
  EXPECT_FALSE((*ddp)->AllDone());
}

struct WithBuffersImpl : torch::nn::Module {
  WithBuffersImpl() {
    fc = register_module("fc", torch::nn::Linear(4, 4));
    bn = register_module("bn", torch::nn::BatchNorm1d(4));
  }
  torch::Tensor forward(torch::Tensor x) { return bn(fc(x)); }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(WithBuffers);

// A step whose allreduce failed after backward returned (CUDA) fails the
// next forward with that allreduce's error, named as the previous step's,
// before the buffer broadcast runs into the aborted communicator.
TEST(ReducerTest, TheNextForwardNamesThePreviousStepsFailedAllreduceBeforeBroadcasting) {
  auto model = WithBuffers();
  auto comm = std::make_shared<AllReduceFailingAfterItsStreamWait>();
  auto ddp = DistributedDataParallel::Create(model, comm);
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  auto out = (*ddp)->Forward(torch::randn({8, 4}));
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE((*ddp)->Backward(out->pow(2).sum()).ok()) << "only the stream waited";
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the abort lands
  auto next = (*ddp)->Forward(torch::randn({8, 4}));
  ASSERT_FALSE(next.ok());
  EXPECT_THAT(std::string(next.status().message()),
              HasSubstr("gradient allreduce of bucket 0 in the previous step failed"));
  EXPECT_THAT(std::string(next.status().message()), HasSubstr("remote process exited"));
}

// Buffers go out before a Forward that follows a training one, as PyTorch's
// require_forward_param_sync: an evaluation pass under NoGradGuard
// broadcasts at its first Forward only, so ranks with 100 and 99
// evaluation batches do not wait on each other (every Forward broadcast,
// and the rank with one batch more waited out its timeout); the training
// Forward after it does not, nor one after a no_sync micro-batch.
TEST(ReducerTest, BuffersAreBroadcastOnlyAfterATrainingForwardAsInPyTorch) {
  auto model = WithBuffers();
  auto comm = std::make_shared<FakeCommunicator>();
  auto ddp = DistributedDataParallel::Create(model, comm);
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  auto broadcasts = [&] {
    int n = 0;
    for (const auto& c : comm->calls()) n += c.op == "broadcast";
    return n;
  };
  auto train = [&] {
    auto out = (*ddp)->Forward(torch::randn({8, 4}));
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_TRUE((*ddp)->Backward(out->pow(2).sum()).ok());
  };
  // One buffer broadcast is a few collectives (one per dtype); the second
  // Forward also re-packs the buckets (a broadcast of its own).
  int before = broadcasts();
  train();
  const int per_forward = broadcasts() - before;
  ASSERT_GT(per_forward, 0) << "the first Forward broadcasts";
  train();
  before = broadcasts();
  train();
  EXPECT_EQ(broadcasts() - before, per_forward) << "after a training Forward";
  before = broadcasts();
  {
    torch::NoGradGuard no_grad;
    for (int i = 0; i < 3; ++i) ASSERT_TRUE((*ddp)->Forward(torch::randn({8, 4})).ok());
  }
  EXPECT_EQ(broadcasts() - before, per_forward) << "an evaluation pass: its first Forward only";
  before = broadcasts();
  train();
  EXPECT_EQ(broadcasts() - before, 0) << "after an evaluation Forward: none";
  before = broadcasts();
  {
    DistributedDataParallel::NoSyncScope no_sync(ddp->get());
    auto out = (*ddp)->Forward(torch::randn({8, 4}));  // after training: broadcasts
    ASSERT_TRUE(out.ok());
    ASSERT_TRUE((*ddp)->Backward(out->pow(2).sum()).ok());
  }
  EXPECT_EQ(broadcasts() - before, per_forward);
  before = broadcasts();
  train();  // after a no_sync micro-batch: none
  EXPECT_EQ(broadcasts() - before, 0);
}

TEST(ReducerTest, MissingGradientFailsNamingTheParameterInsteadOfHanging) {
  auto model = PartlyUnused();
  auto comm = std::make_shared<FakeCommunicator>();
  auto ddp = DistributedDataParallel::Create(model, comm);
  ASSERT_TRUE(ddp.ok());
  auto out = (*ddp)->Forward(torch::randn({2, 4}));
  Status s = (*ddp)->Backward(out->sum());
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("spare.weight"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("find_unused_parameters"));
  // The next forward reports it too.
  EXPECT_FALSE((*ddp)->Forward(torch::randn({2, 4})).ok());
}

TEST(ReducerTest, FindUnusedParametersMarksUnreachedParametersReady) {
  auto model = PartlyUnused();
  auto comm = std::make_shared<FakeCommunicator>();
  DdpOptions options;
  options.find_unused_parameters = true;
  auto ddp = DistributedDataParallel::Create(model, comm, options);
  ASSERT_TRUE(ddp.ok());
  for (int step = 0; step < 2; ++step) {
    auto out = (*ddp)->Forward(torch::randn({2, 4}));
    ASSERT_TRUE(out.ok());
    Status s = (*ddp)->Backward(out->sum());
    ASSERT_TRUE(s.ok()) << s;
  }
  // Used by no rank: no gradient, as in one process (the optimizer skips
  // it), not a zero one that weight decay or momentum would act on.
  EXPECT_FALSE(model->spare->weight.grad().defined());
  EXPECT_TRUE(model->used->weight.grad().defined());
  // A gradient it already had is left as it was.
  model->spare->weight.mutable_grad() = torch::full({4, 4}, 7.0);
  auto out = (*ddp)->Forward(torch::randn({2, 4}));
  ASSERT_TRUE(out.ok());
  ASSERT_TRUE((*ddp)->Backward(out->sum()).ok());
  EXPECT_TRUE(model->spare->weight.grad().eq(7).all().item<bool>());
}

// a, b, c applied in that order: gradients arrive c, b, a, each its own
// bucket, launched as they arrive.
struct ChainImpl : torch::nn::Module {
  ChainImpl() {
    a = register_module("a", torch::nn::Linear(4, 4));
    b = register_module("b", torch::nn::Linear(4, 4));
    c = register_module("c", torch::nn::Linear(4, 4));
    for (auto& p : parameters()) {
      if (p.dim() == 1) p.set_requires_grad(false);
    }
  }
  torch::Tensor forward(torch::Tensor x) { return c(b(a(x))); }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
};
TORCH_MODULE(Chain);

// A backward that throws (the program's own gradient hook) after two of
// three buckets went out: the next Forward is refused saying so, as
// PyTorch's "Expected to have finished reduction in the prior iteration";
// it reset the step and refilled buckets still on the wire before.
TEST(ReducerTest, AForwardAfterABackwardThatThrewMidwayIsRefused) {
  auto model = Chain();
  auto comm = std::make_shared<FakeCommunicator>();
  auto ddp = DistributedDataParallel::Create(model, comm, OneParamPerBucket());
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  model->a->weight.register_hook([](torch::Tensor g) -> torch::Tensor {
    throw std::runtime_error("the program's hook failed");
  });
  auto out = (*ddp)->Forward(torch::randn({2, 4}));
  ASSERT_TRUE(out.ok()) << out.status();
  Status s = (*ddp)->Backward(out->sum());
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("the program's hook failed"));
  auto next = (*ddp)->Forward(torch::randn({2, 4}));
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition) << next.status();
  EXPECT_THAT(std::string(next.status().message()),
              HasSubstr("the previous backward launched 2 of 3 gradient buckets and did not finish"));
}

// A grad-enabled Forward with no Backward (a validation pass without
// NoGradGuard) launched nothing: the next step goes on.
TEST(ReducerTest, AForwardWithoutABackwardLeavesTheNextStepAlone) {
  auto model = Chain();
  auto comm = std::make_shared<FakeCommunicator>();
  auto ddp = DistributedDataParallel::Create(model, comm, OneParamPerBucket());
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  ASSERT_TRUE((*ddp)->Forward(torch::randn({2, 4})).ok());
  auto out = (*ddp)->Forward(torch::randn({2, 4}));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE((*ddp)->Backward(out->sum()).ok());
}

// A layer frozen after Create (set_requires_grad(false)): with
// find_unused_parameters training goes on, the frozen weight untouched;
// without, the next Forward says what happened. Both were refused as "no
// longer the one DDP was created over ... moved or converted".
TEST(ReducerTest, ALayerFrozenAfterCreateIsUnusedOrNamed) {
  for (bool find_unused : {true, false}) {
    SCOPED_TRACE(find_unused);
    auto model = PartlyUnused();
    auto comm = std::make_shared<FakeCommunicator>();
    DdpOptions options;
    options.find_unused_parameters = find_unused;
    auto ddp = DistributedDataParallel::Create(model, comm, options);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    model->used->bias.set_requires_grad(false);
    auto out = (*ddp)->Forward(torch::randn({2, 4}));
    if (!find_unused) {
      ASSERT_FALSE(out.ok());
      EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(std::string(out.status().message()),
                  HasSubstr("parameter used.bias no longer requires grad (frozen after Create)"));
      continue;
    }
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_TRUE((*ddp)->Backward(out->sum()).ok());
    EXPECT_TRUE(model->used->weight.grad().defined());
    EXPECT_FALSE(model->used->bias.grad().defined());
  }
}

// Two heads, one per task.
struct TwoHeadsImpl : torch::nn::Module {
  TwoHeadsImpl() {
    h0 = register_module("h0", torch::nn::Linear(4, 4));
    h1 = register_module("h1", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(torch::Tensor x, int64_t task) { return task == 0 ? h0(x) : h1(x); }
  torch::nn::Linear h0{nullptr}, h1{nullptr};
};
TORCH_MODULE(TwoHeads);

// With find_unused_parameters, two Forwards (one per head) before one
// Backward: the last Forward reached h1 only, so h0 went out as unused when
// backward began, and its gradient came after. That fails the backward
// naming it, as PyTorch does; h0 kept this rank's own gradient before (a
// silent divergence of the ranks).
TEST(ReducerTest, AGradientAfterFindUnusedTookTheParameterAsUnusedFailsNamingIt) {
  auto model = TwoHeads();
  auto comm = std::make_shared<FakeCommunicator>();
  DdpOptions options;
  options.find_unused_parameters = true;
  auto ddp = DistributedDataParallel::Create(model, comm, options);
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  const torch::Tensor x = torch::randn({2, 4});
  auto a = (*ddp)->Forward(x, int64_t{0});
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = (*ddp)->Forward(x, int64_t{1});
  ASSERT_TRUE(b.ok()) << b.status();
  Status s = (*ddp)->Backward(a->sum() + b->sum());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("got a gradient after find_unused_parameters had taken it as unused"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("parameter h0."));
}

// A layer used in some steps only.
struct SometimesUsedImpl : torch::nn::Module {
  SometimesUsedImpl() {
    used = register_module("used", torch::nn::Linear(4, 4));
    spare = register_module("spare", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return use_spare ? spare(used(x)) : used(x); }
  torch::nn::Linear used{nullptr}, spare{nullptr};
  bool use_spare = true;
};
TORCH_MODULE(SometimesUsed);

// Parameters a forward did not reach are taken when backward starts, as
// PyTorch's reducer takes them, not at forward: a forward alone (a
// validation pass) launches nothing, and the zero_grad() between forward
// and backward applies to them (marked at forward, the previous step's
// gradient was copied and written back, whichever way the step zeroed).
TEST(ReducerTest, UnusedParametersAreTakenWhenBackwardStartsNotAtForward) {
  for (bool set_to_none : {true, false}) {
    for (bool as_view : {true, false}) {
      SCOPED_TRACE(absl::StrCat("set_to_none ", set_to_none, ", gradient_as_bucket_view ", as_view));
      auto model = SometimesUsed();
      auto comm = std::make_shared<FakeCommunicator>();
      DdpOptions options = OneParamPerBucket();  // spare's buckets hold nothing else
      options.find_unused_parameters = true;
      options.gradient_as_bucket_view = as_view;
      auto ddp = DistributedDataParallel::Create(model, comm, options);
      ASSERT_TRUE(ddp.ok()) << ddp.status();
      StatusOr<torch::Tensor> out;
      for (int step = 0; step < 2; ++step) {  // the second rebuilds the buckets
        out = (*ddp)->Forward(torch::randn({2, 4}));
        ASSERT_TRUE(out.ok());
        ASSERT_TRUE((*ddp)->Backward(out->pow(2).sum()).ok());
      }
      ASSERT_FALSE(model->spare->weight.grad().eq(0).all().item<bool>()) << "spare was used";

      model->use_spare = false;
      comm->clear();
      out = (*ddp)->Forward(torch::randn({2, 4}));
      ASSERT_TRUE(out.ok());
      EXPECT_TRUE(comm->calls().empty()) << "a forward launched " << comm->calls().size()
                                         << " collectives before any backward";
      model->zero_grad(set_to_none);
      ASSERT_TRUE((*ddp)->Backward(out->pow(2).sum()).ok());
      // Used by no rank: .grad as zero_grad left it (none, or zeros).
      ASSERT_EQ(model->spare->weight.grad().defined(), !set_to_none);
      if (!set_to_none) {
        EXPECT_TRUE(model->spare->weight.grad().eq(0).all().item<bool>())
            << "the previous step's gradient came back after zero_grad";
      }
      EXPECT_FALSE(comm->calls().empty()) << "the step's buckets were reduced";
    }
  }
}

// Module::to(dtype) after Create drops the parameters' gradient
// accumulators, where the reducer's hooks sit: backward then reduced
// nothing and returned OK. The forward now refuses, naming the parameter.
TEST(ReducerTest, AModuleConvertedAfterCreateIsRefusedNotLeftUnsynchronised) {
  auto model = torch::nn::Linear(4, 4);
  auto comm = std::make_shared<FakeCommunicator>();
  auto ddp = DistributedDataParallel::Create(model, comm);
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  auto out = (*ddp)->Forward(torch::randn({2, 4}));
  ASSERT_TRUE(out.ok());
  ASSERT_TRUE((*ddp)->Backward(out->sum()).ok());
  model->to(torch::kDouble);
  comm->clear();
  out = (*ddp)->Forward(torch::randn({2, 4}, torch::kDouble));
  ASSERT_FALSE(out.ok()) << "a forward after to(kDouble) went on";
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition) << out.status();
  EXPECT_THAT(std::string(out.status().message()),
              HasSubstr("parameter weight is no longer the one DDP was created over (now Double on cpu)"));
}

struct SparseEmbeddingImpl : torch::nn::Module {
  SparseEmbeddingImpl() {
    table = register_module(
        "table", torch::nn::Embedding(torch::nn::EmbeddingOptions(10, 4).sparse(true)));
    head = register_module("head", torch::nn::Linear(4, 1));
  }
  torch::Tensor forward(torch::Tensor ids) { return head(table(ids)); }
  torch::nn::Embedding table{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(SparseEmbedding);

// A sparse gradient (Embedding with sparse=true) fails backward naming the
// parameter and why, instead of "Cannot access data pointer of Tensor that
// doesn't have storage".
TEST(ReducerTest, ASparseGradientFailsNamingTheParameter) {
  auto model = SparseEmbedding();
  auto comm = std::make_shared<FakeCommunicator>();
  auto ddp = DistributedDataParallel::Create(model, comm);
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  auto out = (*ddp)->Forward(torch::tensor({1, 2, 3}, torch::kLong));
  ASSERT_TRUE(out.ok()) << out.status();
  Status s = (*ddp)->Backward(out->sum());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("parameter table.weight has a sparse gradient (an Embedding or "
                        "EmbeddingBag with sparse=true)"));
}

TEST(ReducerTest, NoSyncIssuesNoCollectivesAndNextSyncReducesTheSum) {
  auto model = ReversedUse();
  auto comm = std::make_shared<FakeCommunicator>();
  auto ddp = DistributedDataParallel::Create(model, comm, OneParamPerBucket());
  ASSERT_TRUE(ddp.ok());
  comm->clear();
  torch::Tensor x = torch::randn({4, 8});
  {
    auto scope = (*ddp)->NoSync();
    auto out = (*ddp)->Forward(x);
    ASSERT_TRUE((*ddp)->Backward(out->sum()).ok());
  }
  EXPECT_TRUE(comm->calls().empty());
  torch::Tensor once = model->a->weight.grad().clone();
  auto out = (*ddp)->Forward(x);
  ASSERT_TRUE((*ddp)->Backward(out->sum()).ok());
  EXPECT_EQ(comm->calls().size(), 3u);
  EXPECT_TRUE(model->a->weight.grad().allclose(once * 2));
}

TEST(ReducerTest, CommunicatorFailureSurfacesAsStatusFromBackward) {
  auto model = ReversedUse();
  auto comm = std::make_shared<FakeCommunicator>();
  auto ddp = DistributedDataParallel::Create(model, comm);
  ASSERT_TRUE(ddp.ok());
  comm->fail_after(0);
  auto out = (*ddp)->Forward(torch::randn({4, 8}));
  Status s = (*ddp)->Backward(out->sum());
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("injected"));
}

// Devices are checked before any hook is installed. Meta tensors stand in
// for a second device here, so this runs on CPU-only builds; the CUDA case
// is the same code path (ddp_cuda_test covers it where a GPU exists).
TEST(ReducerTest, ParametersOnTwoDevicesAreRejectedNamingBoth) {
  FakeCommunicator comm;
  auto cpu = torch::zeros({4}, torch::TensorOptions().requires_grad(true));
  auto other = torch::zeros({4}, torch::TensorOptions().device(torch::kMeta).requires_grad(true));
  auto r = Reducer::Create({{"layer.weight", cpu}, {"head.bias", other}}, &comm, {});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("more than one device ('layer.weight' on cpu, 'head.bias' on meta)"));
}

TEST(ReducerTest, ParametersOffTheCommunicatorsDeviceAreRejected) {
  FakeCommunicator comm;  // Reduces CPU tensors, like Gloo.
  auto other = torch::zeros({4}, torch::TensorOptions().device(torch::kMeta).requires_grad(true));
  auto r = Reducer::Create({{"w", other}}, &comm, {});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("the model is on meta but the fake communicator reduces tensors on cpu"));
}

struct BufferElsewhereImpl : torch::nn::Module {
  BufferElsewhereImpl() {
    fc = register_module("fc", torch::nn::Linear(4, 4));
    register_buffer("running", torch::zeros({4}, torch::TensorOptions().device(torch::kMeta)));
  }
  torch::Tensor forward(torch::Tensor x) { return fc(x); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(BufferElsewhere);

TEST(ReducerTest, DdpRejectsAModelSplitAcrossDevicesBeforeAnyCollective) {
  auto comm = std::make_shared<FakeCommunicator>();
  auto ddp = DistributedDataParallel::Create(BufferElsewhere(), comm);
  ASSERT_FALSE(ddp.ok());
  EXPECT_THAT(std::string(ddp.status().message()),
              HasSubstr("more than one device ('fc.weight' on cpu, 'running' on meta)"));
  EXPECT_TRUE(comm->calls().empty()) << "a collective ran before the device check";
}

}  // namespace
}  // namespace ddp
}  // namespace lockstep
