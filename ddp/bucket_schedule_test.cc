// When buckets are reduced and stepped. DdpOptions::overlap_optimizer:
// OptimizerStep steps each bucket's parameters as soon as that bucket is
// reduced; DdpOptions::gradient_priority: the first layers' buckets go on the
// wire before later ones still queued. Ranks as threads over Gloo, compared
// with the same training without them.
#include <torch/torch.h>

#include <array>
#include <stdexcept>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ddp/ddp.h"
#include "ddp/fake_store.h"
#include "ddp/test_net.h"
#include "ddp/test_ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace ddp {
namespace {

using ::testing::HasSubstr;
using torch::Tensor;

using test_net::Data;
using test_net::Net;
using test_ranks::RunRanks;
using test_ranks::SingleRank;

constexpr int kSteps = 4;

Data MakeData(int world) {
  torch::manual_seed(23);
  Data data(world);
  for (int r = 0; r < world; ++r) {
    for (int s = 0; s < kSteps; ++s) {
      data[r].push_back({torch::randn({5, test_net::kNetIn}), torch::randn({5, test_net::kNetOut})});
    }
  }
  return data;
}

// SGD that counts its steps and the parameters each one saw.
struct CountingSgd : torch::optim::SGD {
  using torch::optim::SGD::SGD;
  Tensor step(LossClosure closure = nullptr) override {
    ++calls;
    for (const auto& g : param_groups()) seen += static_cast<int>(g.params().size());
    return torch::optim::SGD::step(closure);
  }
  int calls = 0;
  int seen = 0;
};

enum class Kind { kSgdMomentum, kAdam, kAdamW, kRmsprop, kAdagrad, kCounting };

// Two parameter groups (fc1 and fc2 with their own learning rates) and one
// tensor that is not in the model, so the optimizer holds parameters DDP
// does not reduce.
std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(Kind kind, Net& net, Tensor extra) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  std::vector<Tensor> first = net->fc1->parameters();
  std::vector<Tensor> second = net->fc2->parameters();
  second.push_back(extra);
  switch (kind) {
    case Kind::kSgdMomentum:
    case Kind::kCounting: {
      groups.emplace_back(first, std::make_unique<torch::optim::SGDOptions>(
                                     torch::optim::SGDOptions(0.1).momentum(0.9)));
      groups.emplace_back(second, std::make_unique<torch::optim::SGDOptions>(
                                      torch::optim::SGDOptions(0.05).momentum(0.9)));
      torch::optim::SGDOptions defaults(0.1);
      if (kind == Kind::kCounting) return std::make_unique<CountingSgd>(groups, defaults);
      return std::make_unique<torch::optim::SGD>(groups, defaults);
    }
    case Kind::kAdam:
      groups.emplace_back(first, std::make_unique<torch::optim::AdamOptions>(
                                     torch::optim::AdamOptions(0.01)));
      groups.emplace_back(second, std::make_unique<torch::optim::AdamOptions>(
                                      torch::optim::AdamOptions(0.02)));
      return std::make_unique<torch::optim::Adam>(groups, torch::optim::AdamOptions(0.01));
    case Kind::kAdamW:
      groups.emplace_back(first, std::make_unique<torch::optim::AdamWOptions>(
                                     torch::optim::AdamWOptions(0.01).weight_decay(0.1)));
      groups.emplace_back(second, std::make_unique<torch::optim::AdamWOptions>(
                                      torch::optim::AdamWOptions(0.02).amsgrad(true)));
      return std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(0.01));
    case Kind::kRmsprop:
      groups.emplace_back(first, std::make_unique<torch::optim::RMSpropOptions>(
                                     torch::optim::RMSpropOptions(0.01).momentum(0.5)));
      groups.emplace_back(second, std::make_unique<torch::optim::RMSpropOptions>(
                                      torch::optim::RMSpropOptions(0.02).centered(true)));
      return std::make_unique<torch::optim::RMSprop>(groups, torch::optim::RMSpropOptions(0.01));
    case Kind::kAdagrad:
      groups.emplace_back(first, std::make_unique<torch::optim::AdagradOptions>(
                                     torch::optim::AdagradOptions(0.1)));
      groups.emplace_back(second, std::make_unique<torch::optim::AdagradOptions>(
                                      torch::optim::AdagradOptions(0.05).lr_decay(0.01)));
      return std::make_unique<torch::optim::Adagrad>(groups, torch::optim::AdagradOptions(0.1));
  }
  return nullptr;
}

struct RankResult {
  std::vector<Tensor> params;  // The model's, then the extra tensor.
  int optimizer_calls = 0;     // CountingSgd only.
  int params_seen = 0;
  int buckets = 0;
};

// How a training loop resets gradients before its forward.
enum class Reset {
  kZero,       // opt->zero_grad(): LibTorch 1.13 zeroes them in place.
  kToNone,     // Each gradient reset to undefined (LibTorch 2.x's default).
};

// Trains kSteps steps on every rank with `options`.
std::vector<RankResult> RunDdp(const Net& init, const Data& data, Kind kind, DdpOptions options,
                               Reset reset = Reset::kZero) {
  std::vector<RankResult> results(data.size());
  RunRanks(static_cast<int>(data.size()), init, options,
           [&](int rank, Net net, TypedDistributedDataParallel<Net>& ddp) -> Status {
             // The same on every rank: the extra tensor's gradient is set by hand.
             Tensor extra = torch::ones({3}).requires_grad_();
             auto opt = MakeOptimizer(kind, net, extra);
             for (int s = 0; s < kSteps; ++s) {
               if (reset == Reset::kZero) {
                 opt->zero_grad();
               } else {
                 for (auto& group : opt->param_groups()) {
                   for (auto& p : group.params()) p.mutable_grad().reset();
                 }
               }
               ASSIGN_OR_RETURN(Tensor out, ddp.Forward(data[rank][s].x));
               RETURN_IF_ERROR(ddp.Backward(torch::mse_loss(out, data[rank][s].y)));
               extra.mutable_grad() = torch::full({3}, 0.5 * (s + 1));
               ddp.OptimizerStep(*opt);
             }
             // overlap_forward: the last step is still open. Then the last
             // step's communication errors, if any.
             RETURN_IF_ERROR(ddp.CompletePendingStep());
             RETURN_IF_ERROR(ddp.reducer().last_error());
             RankResult& result = results[rank];
             for (const auto& p : net->parameters()) result.params.push_back(p.detach().clone());
             result.params.push_back(extra.detach().clone());
             if (auto* counting = dynamic_cast<CountingSgd*>(opt.get())) {
               result.optimizer_calls = counting->calls;
               result.params_seen = counting->seen;
             }
             result.buckets = static_cast<int>(ddp.reducer().bucket_indices().size());
             return absl::OkStatus();
           });
  return results;
}

DdpOptions Options(bool overlap, bool bucket_view) {
  DdpOptions options;
  options.overlap_optimizer = overlap;
  options.gradient_as_bucket_view = bucket_view;
  options.bucket_cap_mb = 10.0 / (1024 * 1024);  // 10 bytes: one bucket per parameter.
  return options;
}

// overlap_optimizer with a hook that fails bucket 2 ("wire cut") and sums
// the others.
DdpOptions FailingBucketTwo() {
  DdpOptions options = Options(true, true);
  options.comm_hook.name = "failing";
  options.comm_hook.run = [](GradBucket& bucket, Communicator& comm) {
    if (bucket.index == 2) return BucketWork::Failed(absl::UnavailableError("wire cut"));
    return BucketWork::Of(comm.AllReduce(bucket.buffer, ReduceOp::kSum), bucket.buffer, 0);
  };
  return options;
}

// Every rank of `got` ends with `want`'s parameters and extra tensor, bit
// for bit (the same operations on the same values, only at another time),
// and training moved them (the comparison is not of two no-ops).
void ExpectSameParams(const std::vector<RankResult>& got, const std::vector<RankResult>& want,
                      const Net& init, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t r = 0; r < want.size(); ++r) {
    ASSERT_EQ(got[r].params.size(), want[r].params.size()) << what;
    for (size_t p = 0; p < want[r].params.size(); ++p) {
      EXPECT_TRUE(torch::equal(got[r].params[p], want[r].params[p]))
          << "rank " << r << " tensor " << p << " " << what;
    }
    EXPECT_FALSE(torch::equal(got[r].params[0], init->parameters()[0])) << what;
    EXPECT_FALSE(torch::equal(got[r].params.back(), torch::ones({3}))) << what;
  }
}

// Every torch::optim optimizer but LBFGS (which needs a closure), each with
// two parameter groups of different options.
TEST(OverlapOptimizerTest, SteppingBucketByBucketEqualsOneStepForEveryTorchOptimizer) {
  torch::manual_seed(3);
  Net init;
  const Data data = MakeData(3);
  for (Kind kind : {Kind::kSgdMomentum, Kind::kAdam, Kind::kAdamW, Kind::kRmsprop, Kind::kAdagrad}) {
    for (bool bucket_view : {true, false}) {
      const auto plain = RunDdp(init, data, kind, Options(false, bucket_view));
      const auto overlapped = RunDdp(init, data, kind, Options(true, bucket_view));
      ExpectSameParams(overlapped, plain, init,
                       absl::StrCat("kind ", static_cast<int>(kind), " bucket_view ", bucket_view));
    }
  }
}

TEST(OverlapOptimizerTest, TheOptimizerStepsOneBucketAtATimeThenTheRest) {
  torch::manual_seed(4);
  Net init;
  const Data data = MakeData(2);
  const auto results = RunDdp(init, data, Kind::kCounting, Options(true, true));
  for (const auto& r : results) {
    ASSERT_EQ(r.buckets, 4);  // fc2.bias, fc2.weight, fc1.bias, fc1.weight.
    // Per step: one call per bucket (one parameter each) and one for the
    // extra tensor, which no bucket holds.
    EXPECT_EQ(r.optimizer_calls, kSteps * 5);
    EXPECT_EQ(r.params_seen, kSteps * 5);
  }
  const auto plain = RunDdp(init, data, Kind::kCounting, Options(false, true));
  for (const auto& r : plain) {
    EXPECT_EQ(r.optimizer_calls, kSteps);
    EXPECT_EQ(r.params_seen, kSteps * 5);
  }
}

// SGD that counts its steps into `*counter`, and throws at step `throw_at`
// (counted from 1; 0: never).
struct NotifyingSgd : torch::optim::SGD {
  NotifyingSgd(std::vector<Tensor> params, std::atomic<int>* counter, int throw_at = 0)
      : torch::optim::SGD(std::move(params), torch::optim::SGDOptions(0.1)),
        counter(counter),
        throw_at(throw_at) {}
  Tensor step(LossClosure closure = nullptr) override {
    if (++*counter == throw_at) throw std::runtime_error("the optimizer blew up");
    return torch::optim::SGD::step(closure);
  }
  std::atomic<int>* counter;
  int throw_at;
};

// One rank over Gloo with a NotifyingSgd over its Net, after one
// synchronised forward and backward (the step's buckets launched).
struct OneBackward {
  Status Run(DdpOptions options) {
    ASSIGN_OR_RETURN(ddp, SingleRank(&store, options));
    net = ddp->typed_module();
    opt = std::make_unique<NotifyingSgd>(net->parameters(), &stepped, throw_at);
    ASSIGN_OR_RETURN(Tensor out, ddp->Forward(torch::randn({4, test_net::kNetIn})));
    return ddp->Backward(out.sum());
  }
  FakeStore store;
  std::unique_ptr<test_ranks::Ddp> ddp;
  Net net{nullptr};
  std::atomic<int> stepped{0};
  int throw_at = 0;  // NotifyingSgd's
  std::unique_ptr<NotifyingSgd> opt;
};

// A hook that sums (the buckets are prescaled) and, when the last bucket's
// continuation runs (inside its wait), records how many optimizer steps its
// rank has taken in this step: the earlier buckets must have been stepped
// while the last one was still being reduced.
TEST(OverlapOptimizerTest, EarlierBucketsAreSteppedBeforeTheLastIsReduced) {
  torch::manual_seed(5);
  Net init;
  const Data data = MakeData(2);
  constexpr int kWorld = 2;
  std::array<std::atomic<int>, kWorld> stepped{};
  std::array<std::atomic<int>, kWorld> stepped_before_last{};
  CommHook hook;
  hook.name = "watching";
  hook.prescale_by_world = true;
  hook.run = [&](GradBucket& bucket, Communicator& comm) {
    std::shared_ptr<Work> work = comm.AllReduce(bucket.buffer, ReduceOp::kSum);
    if (bucket.index != 3) return BucketWork::Of(work, bucket.buffer, bucket.buffer.nbytes());
    const int rank = comm.rank();
    Tensor buffer = bucket.buffer;
    return BucketWork::Then(
        work,
        [&, rank, buffer]() -> StatusOr<at::Tensor> {
          stepped_before_last[rank] += stepped[rank].load();
          return buffer;
        },
        bucket.buffer.nbytes());
  };
  DdpOptions options = Options(true, true);
  options.comm_hook = hook;
  RunRanks(kWorld, init, options,
           [&](int rank, Net net, TypedDistributedDataParallel<Net>& ddp) -> Status {
             NotifyingSgd opt(net->parameters(), &stepped[rank]);
             for (int s = 0; s < kSteps; ++s) {
               opt.zero_grad();
               ASSIGN_OR_RETURN(Tensor out, ddp.Forward(data[rank][s].x));
               RETURN_IF_ERROR(ddp.Backward(torch::mse_loss(out, data[rank][s].y)));
               stepped[rank] = 0;
               ddp.OptimizerStep(opt);
               if (stepped[rank] != 4) {
                 return absl::InternalError(absl::StrCat(
                     "step ", s, ": ", stepped[rank].load(), " optimizer steps, want one per bucket"));
               }
             }
             return ddp.reducer().last_error();
           });
  for (int r = 0; r < kWorld; ++r) {
    // Buckets 0, 1 and 2 were stepped before bucket 3's wait ended, every step.
    EXPECT_EQ(stepped_before_last[r].load(), 3 * kSteps) << "rank " << r;
  }
}

// A hook that averages and, for the first bucket launched in each step,
// reports its collective done only a second after it is: the other buckets
// complete meanwhile on every rank, so all of them are queued when the next
// one is chosen. (Four buckets: each rank's fifth call starts a new step.)
CommHook SlowFirstLaunch() {
  auto calls = std::make_shared<std::array<std::atomic<int>, 2>>();
  CommHook hook;
  hook.name = "slow-first";
  hook.prescale_by_world = true;
  hook.run = [calls](GradBucket& bucket, Communicator& comm) {
    std::shared_ptr<Work> work = comm.AllReduce(bucket.buffer, ReduceOp::kSum);
    if ((*calls)[comm.rank()]++ % 4 != 0) {
      return BucketWork::Of(work, bucket.buffer, bucket.buffer.nbytes());
    }
    auto late = std::make_shared<Work>();
    std::thread([work, late] {
      Status s = work->Wait(std::chrono::seconds(30));
      std::this_thread::sleep_for(std::chrono::seconds(1));
      late->Finish(s);
    }).detach();
    return BucketWork::Of(late, bucket.buffer, bucket.buffer.nbytes());
  };
  return hook;
}

struct ScheduleResult {
  std::vector<std::vector<size_t>> launch_order;  // Per step.
  std::vector<int> agreements;                     // Per step.
  std::vector<std::vector<size_t>> layout;         // Parameter indices per bucket.
  std::vector<Tensor> params;
};

std::vector<ScheduleResult> RunScheduled(const Net& init, const Data& data, DdpOptions options) {
  std::vector<ScheduleResult> results(data.size());
  RunRanks(static_cast<int>(data.size()), init, options,
           [&](int rank, Net net, TypedDistributedDataParallel<Net>& ddp) -> Status {
             torch::optim::SGD opt(net->parameters(),
                                   torch::optim::SGDOptions(0.1).momentum(0.9));
             ScheduleResult& result = results[rank];
             for (size_t s = 0; s < data[rank].size(); ++s) {
               opt.zero_grad();
               ASSIGN_OR_RETURN(Tensor out, ddp.Forward(data[rank][s].x));
               RETURN_IF_ERROR(ddp.Backward(torch::mse_loss(out, data[rank][s].y)));
               ddp.OptimizerStep(opt);
               RETURN_IF_ERROR(ddp.reducer().last_error());
               const ReducerStepStats stats = ddp.reducer().last_stats();
               result.launch_order.push_back(stats.launch_order);
               result.agreements.push_back(stats.priority_agreements);
             }
             result.layout = ddp.reducer().bucket_indices();
             for (const auto& p : net->parameters()) result.params.push_back(p.detach().clone());
             return absl::OkStatus();
           });
  return results;
}

Data TwoSteps(int world) {
  Data data = MakeData(world);
  for (auto& batches : data) batches.resize(2);
  return data;
}

TEST(GradientPriorityTest, QueuedBucketsGoFirstLayersFirstOnEveryRank) {
  torch::manual_seed(8);
  Net init;
  const Data data = TwoSteps(2);
  for (bool overlap : {false, true}) {
    DdpOptions options = Options(overlap, true);
    options.comm_hook = SlowFirstLaunch();
    options.gradient_priority = true;
    const auto results = RunScheduled(init, data, options);
    ASSERT_EQ(results.size(), 2u);
    for (size_t r = 0; r < results.size(); ++r) {
      const ScheduleResult& got = results[r];
      ASSERT_EQ(got.layout.size(), 4u);
      ASSERT_EQ(got.launch_order.size(), 2u);
      // Parameters in registration order: fc1.weight 0, fc1.bias 1,
      // fc2.weight 2, fc2.bias 3. Backward makes fc2's gradients first, so
      // bucket 0 holds one of fc2's.
      std::vector<size_t> first_param;
      for (const auto& b : got.layout) first_param.push_back(b.at(0));
      for (size_t s = 0; s < got.launch_order.size(); ++s) {
        const std::vector<size_t>& order = got.launch_order[s];
        ASSERT_EQ(order.size(), 4u) << "rank " << r << " step " << s;
        // After the first (slow) launch, everything being ready everywhere,
        // the rest by their parameters' registration order.
        for (size_t k = 2; k < order.size(); ++k) {
          EXPECT_LT(first_param[order[k - 1]], first_param[order[k]])
              << "rank " << r << " step " << s << " overlap " << overlap;
        }
        // One agreement before every launch but the last.
        EXPECT_EQ(got.agreements[s], 3) << "rank " << r << " step " << s;
        EXPECT_EQ(order, results[0].launch_order[s]) << "ranks launch in one order";
      }
    }
    // Without priority: index order (the last layers' first, whatever is
    // queued), and the same parameters as with it.
    DdpOptions plain = Options(overlap, true);
    plain.comm_hook = SlowFirstLaunch();
    const auto fifo = RunScheduled(init, data, plain);
    for (size_t r = 0; r < fifo.size(); ++r) {
      for (const auto& order : fifo[r].launch_order) {
        EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3}));
      }
      EXPECT_EQ(fifo[r].agreements, (std::vector<int>{0, 0}));
      for (size_t p = 0; p < fifo[r].params.size(); ++p) {
        EXPECT_TRUE(torch::equal(fifo[r].params[p], results[r].params[p])) << "rank " << r;
      }
    }
  }
}

// overlap_forward: OptimizerStep leaves the step open and each bucket is
// stepped when the training thread first reaches for its parameters.
TEST(OverlapForwardTest, ParametersEqualTrainingWithoutIt) {
  torch::manual_seed(9);
  Net init;
  const Data data = MakeData(3);
  for (Kind kind : {Kind::kSgdMomentum, Kind::kAdam}) {
    for (bool bucket_view : {true, false}) {
      for (Reset reset : {Reset::kZero, Reset::kToNone}) {
        const auto plain = RunDdp(init, data, kind, Options(false, bucket_view), reset);
        for (bool priority : {false, true}) {
          DdpOptions options = Options(true, bucket_view);
          options.overlap_forward = true;
          options.gradient_priority = priority;
          // Each step before the forward that reads it.
          ExpectSameParams(RunDdp(init, data, kind, options, reset), plain, init,
                           absl::StrCat("kind ", static_cast<int>(kind), " bucket_view ",
                                        bucket_view, " reset ", static_cast<int>(reset),
                                        " priority ", priority));
        }
      }
    }
  }
}

// The last bucket launched in each step (one of fc1's, whose gradients come
// last) is held back: step k's reports done only once the test allows k + 1
// of them. A forward that uses fc2 first finds fc2's buckets stepped and
// fc1's still pending; only then does it allow fc1's, and its use of fc1
// waits for it.
TEST(OverlapForwardTest, TheForwardWaitsOnlyForTheBucketsItReaches) {
  torch::manual_seed(10);
  Net init;
  const Data data = MakeData(2);
  constexpr int kWorld = 2;
  std::array<std::atomic<int>, kWorld> stepped{};
  std::array<std::atomic<int>, kWorld> last_done{};  // Held buckets done.
  std::array<std::atomic<int>, kWorld> allowed{};    // Held buckets allowed to finish.
  auto calls = std::make_shared<std::array<std::atomic<int>, kWorld>>();
  CommHook hook;
  hook.name = "held-last";
  hook.prescale_by_world = true;
  hook.run = [calls, &last_done, &allowed](GradBucket& bucket, Communicator& comm) {
    const int rank = comm.rank();
    std::shared_ptr<Work> work = comm.AllReduce(bucket.buffer, ReduceOp::kSum);
    const int call = (*calls)[rank]++;
    if (call % 4 != 3) return BucketWork::Of(work, bucket.buffer, bucket.buffer.nbytes());
    const int held = call / 4;
    auto late = std::make_shared<Work>();
    std::thread([work, late, rank, held, &last_done, &allowed] {
      Status s = work->Wait(std::chrono::seconds(30));
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (allowed[rank].load() <= held && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (allowed[rank].load() <= held) s = absl::DeadlineExceededError("never allowed");
      ++last_done[rank];
      late->Finish(s);
    }).detach();
    return BucketWork::Of(late, bucket.buffer, bucket.buffer.nbytes());
  };
  struct Probe {
    int stepped = -1;    // Optimizer steps (buckets) when fc2 first ran.
    int last_done = -1;  // Held buckets done by then, and after forward.
    int last_done_after = -1;
  };
  std::array<std::vector<Probe>, kWorld> probes;
  auto run = [&](bool overlap_forward) {
    std::array<std::vector<Tensor>, kWorld> params;
    for (int r = 0; r < kWorld; ++r) {
      last_done[r] = 0;
      allowed[r] = 0;
      (*calls)[r] = 0;
      probes[r].clear();
    }
    DdpOptions options = Options(true, true);
    options.comm_hook = hook;
    options.overlap_forward = overlap_forward;
    RunRanks(kWorld, init, options,
             [&](int rank, Net net, TypedDistributedDataParallel<Net>& ddp) -> Status {
               NotifyingSgd opt(net->parameters(), &stepped[rank]);
               for (int s = 0; s < kSteps; ++s) {
                 for (auto& p : net->parameters()) p.mutable_grad().reset();
                 // Step 3's forward re-packs the buckets (in the first
                 // step's order), which completes step 2 before it starts.
                 if (s == 2) allowed[rank] = s;
                 Probe probe;
                 ASSIGN_OR_RETURN(Tensor out, ddp.ForwardWith([&] {
                   {
                     // Outside the graph, so the gradients' order (and the
                     // rebuilt buckets) stay those of the plain forward.
                     torch::NoGradGuard no_grad;
                     net->fc2(torch::zeros({1, test_net::kNetHidden}));
                   }
                   probe.stepped = stepped[rank].load();
                   probe.last_done = last_done[rank].load();
                   allowed[rank] = s;  // The previous step's held bucket.
                   return net->forward(data[rank][s].x);
                 }));
                 probe.last_done_after = last_done[rank].load();
                 probes[rank].push_back(probe);
                 RETURN_IF_ERROR(ddp.Backward(torch::mse_loss(out, data[rank][s].y)));
                 stepped[rank] = 0;
                 if (!overlap_forward) allowed[rank] = s + 1;  // OptimizerStep waits for it.
                 ddp.OptimizerStep(opt);
               }
               allowed[rank] = kSteps;
               RETURN_IF_ERROR(ddp.CompletePendingStep());
               for (const auto& p : net->parameters()) params[rank].push_back(p.detach().clone());
               return ddp.reducer().last_error();
             });
    return params;
  };
  const auto gated = run(true);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(probes[r].size(), static_cast<size_t>(kSteps));
    // Steps 2 and 4 overlap: fc2's two buckets (launched first) were
    // stepped, fc1's held one not yet, until fc1 was used. (Step 1 has no
    // open step before it; step 3 re-packs the buckets.)
    for (int s : {1, 3}) {
      const Probe& p = probes[r][s];
      EXPECT_EQ(p.stepped, 2) << "rank " << r << " step " << s + 1;
      EXPECT_EQ(p.last_done, s - 1) << "rank " << r << " step " << s + 1;
      EXPECT_EQ(p.last_done_after, s) << "rank " << r << " step " << s + 1;
    }
    EXPECT_EQ(probes[r][2].stepped, 4) << "rank " << r;
  }
  const auto waited = run(false);
  for (int r = 0; r < kWorld; ++r) {
    // Without it OptimizerStep waited for every bucket.
    for (int s = 1; s < kSteps; ++s) {
      EXPECT_EQ(probes[r][s].stepped, 4) << "rank " << r << " step " << s + 1;
      EXPECT_EQ(probes[r][s].last_done, s) << "rank " << r << " step " << s + 1;
    }
    ASSERT_EQ(gated[r].size(), waited[r].size());
    for (size_t p = 0; p < waited[r].size(); ++p) {
      EXPECT_TRUE(torch::equal(gated[r][p], waited[r][p])) << "rank " << r << " tensor " << p;
    }
  }
}

TEST(OverlapForwardTest, AForwardOnAnotherThreadCompletesTheStepFirst) {
  torch::manual_seed(11);
  Net init;
  const Data data = MakeData(1);
  auto train = [&](bool overlap_forward) -> std::vector<Tensor> {
    FakeStore store;
    auto comm = test_ranks::ConnectGloo(&store, 0, 1);
    EXPECT_TRUE(comm.ok()) << comm.status();
    if (!comm.ok()) return {};
    DdpOptions options = Options(true, true);
    options.overlap_forward = overlap_forward;
    options.report_progress = false;
    Net net = test_net::Replica(init);
    auto ddp = DistributedDataParallel::Create(net, *comm, options);
    EXPECT_TRUE(ddp.ok()) << ddp.status();
    if (!ddp.ok()) return {};
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int s = 0; s < kSteps; ++s) {
      for (auto& p : net->parameters()) p.mutable_grad().reset();
      StatusOr<Tensor> out;
      // Every other forward on a thread of its own, where no gate runs.
      if (s % 2 == 1) {
        std::thread([&] { out = (*ddp)->Forward(data[0][s].x); }).join();
      } else {
        out = (*ddp)->Forward(data[0][s].x);
      }
      EXPECT_TRUE(out.ok()) << out.status();
      if (!out.ok()) return {};
      EXPECT_TRUE((*ddp)->Backward(torch::mse_loss(*out, data[0][s].y)).ok());
      (*ddp)->OptimizerStep(opt);
      EXPECT_EQ((*ddp)->reducer().step_open(), overlap_forward);
    }
    EXPECT_TRUE((*ddp)->CompletePendingStep().ok());
    EXPECT_FALSE((*ddp)->reducer().step_open());
    std::vector<Tensor> params;
    for (const auto& p : net->parameters()) params.push_back(p.detach().clone());
    return params;
  };
  const auto plain = train(false);
  const auto gated = train(true);
  ASSERT_EQ(gated.size(), plain.size());
  ASSERT_FALSE(plain.empty());
  for (size_t p = 0; p < plain.size(); ++p) {
    EXPECT_TRUE(torch::equal(gated[p], plain[p])) << "tensor " << p;
  }
}

TEST(OverlapForwardTest, AFailedBucketFailsTheForwardThatReachesForIt) {
  DdpOptions options = FailingBucketTwo();
  options.overlap_forward = true;
  OneBackward t;
  ASSERT_TRUE(t.Run(options).ok());
  t.ddp->OptimizerStep(*t.opt);
  EXPECT_EQ(t.stepped.load(), 0);  // Nothing waited for yet.
  EXPECT_TRUE(t.ddp->reducer().step_open());
  auto next = t.ddp->Forward(torch::randn({4, test_net::kNetIn}));
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(next.status().message()), HasSubstr("wire cut"));
  EXPECT_EQ(t.stepped.load(), 2);  // Buckets 0 and 1, launched before the failed one.
  EXPECT_FALSE(t.ddp->reducer().step_open());
}

TEST(OverlapForwardTest, DestroyedWithAStepOpenWaitsForItWithoutSteppingIt) {
  DdpOptions options = Options(true, true);
  options.overlap_forward = true;
  int reported = 0;
  options.on_step = [&reported](const StepStats&) { ++reported; };
  OneBackward t;
  ASSERT_TRUE(t.Run(options).ok());
  // Read before OptimizerStep: after it, an operator on them would run the
  // gate and complete the step.
  std::vector<Tensor> before;
  for (const auto& p : t.net->parameters()) before.push_back(p.detach().clone());
  t.ddp->OptimizerStep(*t.opt);
  EXPECT_TRUE(t.ddp->reducer().step_open());
  t.ddp.reset();
  EXPECT_EQ(reported, 1);  // The step ended, reported to a live object.
  EXPECT_EQ(t.stepped.load(), 0);
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(torch::equal(t.net->parameters()[i], before[i])) << "parameter " << i;
  }
}

TEST(OverlapForwardTest, NeedsOverlapOptimizer) {
  FakeStore store;
  DdpOptions options = Options(false, true);
  options.overlap_forward = true;
  auto ddp = SingleRank(&store, options);
  ASSERT_FALSE(ddp.ok());
  EXPECT_EQ(ddp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ddp.status().message()), HasSubstr("overlap_optimizer"));
}

TEST(OverlapOptimizerTest, PlainOptimizerStepInsteadOfOptimizerStepFailsTheNextForward) {
  FakeStore store;
  auto ddp = SingleRank(&store, Options(true, true));
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  Net net = (*ddp)->typed_module();
  torch::optim::SGD opt(net->parameters(), 0.1);
  const Tensor x = torch::randn({4, test_net::kNetIn});
  auto out = (*ddp)->Forward(x);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE((*ddp)->Backward(out->sum()).ok());
  EXPECT_TRUE((*ddp)->reducer().step_open());
  opt.step();  // Not through OptimizerStep: the step is never completed.
  auto next = (*ddp)->Forward(x);
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(next.status().message()), HasSubstr("OptimizerStep"));
}

TEST(OverlapOptimizerTest, AFailedBucketStopsTheSteppingAndFailsTheNextForward) {
  OneBackward t;
  ASSERT_TRUE(t.Run(FailingBucketTwo()).ok());  // Nothing waited for yet.
  t.ddp->OptimizerStep(*t.opt);
  EXPECT_EQ(t.stepped.load(), 2);  // Buckets 0 and 1; not 2, 3 or the rest.
  auto next = t.ddp->Forward(torch::randn({4, test_net::kNetIn}));
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(next.status().message()), HasSubstr("wire cut"));
}

// An optimizer that is not a torch::optim::Optimizer cannot be stepped a
// bucket at a time: OptimizerStep waits for every bucket, then steps it once.
TEST(OverlapOptimizerTest, AnOptimizerOfAnotherKindIsSteppedOnceAfterEveryBucket) {
  OneBackward t;
  ASSERT_TRUE(t.Run(Options(true, true)).ok());
  ASSERT_TRUE(t.ddp->reducer().step_open());
  struct Plain {
    const test_ranks::Ddp* ddp;
    int steps = 0;
    bool open_at_step = true;
    void step() {
      ++steps;
      open_at_step = ddp->reducer().step_open();
    }
  } plain{t.ddp.get()};
  t.ddp->OptimizerStep(plain);
  EXPECT_EQ(plain.steps, 1);
  EXPECT_FALSE(plain.open_at_step) << "stepped before every bucket was reduced";
  EXPECT_EQ(t.stepped.load(), 0);
}

// What the optimizer throws leaves OptimizerStep only once every bucket was
// waited for: no collective is left running into the next step.
TEST(OverlapOptimizerTest, WhatTheOptimizerThrowsPassesThroughAfterEveryBucketWasWaitedFor) {
  OneBackward t;
  t.throw_at = 2;  // Bucket 1's part.
  ASSERT_TRUE(t.Run(Options(true, true)).ok());
  try {
    t.ddp->OptimizerStep(*t.opt);
    ADD_FAILURE() << "OptimizerStep did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("the optimizer blew up"));
  }
  EXPECT_EQ(t.stepped.load(), 2);  // Bucket 0, then bucket 1, which threw.
  EXPECT_FALSE(t.ddp->reducer().step_open()) << "a bucket was left unwaited";
  auto next = t.ddp->Forward(torch::randn({4, test_net::kNetIn}));
  EXPECT_TRUE(next.ok()) << next.status();
}

// overlap_forward: the optimizer steps inside the next forward's gate, which
// cannot fail an operator; what it throws there is that forward's error.
TEST(OverlapForwardTest, AnOptimizerThatThrowsInTheGateFailsThatForward) {
  DdpOptions options = Options(true, true);
  options.overlap_forward = true;
  OneBackward t;
  t.throw_at = 1;
  ASSERT_TRUE(t.Run(options).ok());
  t.ddp->OptimizerStep(*t.opt);
  EXPECT_EQ(t.stepped.load(), 0);  // Deferred to the gate.
  auto next = t.ddp->Forward(torch::randn({4, test_net::kNetIn}));
  ASSERT_FALSE(next.ok());
  EXPECT_THAT(std::string(next.status().message()), HasSubstr("the optimizer blew up"));
  EXPECT_FALSE(t.ddp->reducer().step_open());
}

TEST(GradientPriorityTest, AMissingGradientFailsNamingTheParameterAndReleasesTheScheduler) {
  FakeStore store;
  DdpOptions options = Options(false, true);
  options.gradient_priority = true;
  auto ddp = SingleRank(&store, options);
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  Net net = (*ddp)->typed_module();
  const Tensor x = torch::randn({4, test_net::kNetIn});
  // Only fc1 takes part: fc2's buckets never complete, and the scheduler
  // waiting for them must be released.
  auto out = (*ddp)->ForwardWith([&] { return net->fc1(x); });
  ASSERT_TRUE(out.ok()) << out.status();
  Status s = (*ddp)->Backward(out->sum());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("fc2.weight"));
}

}  // namespace
}  // namespace ddp
}  // namespace lockstep
