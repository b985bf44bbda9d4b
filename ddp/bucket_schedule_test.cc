// When buckets are reduced and stepped. DdpOptions::overlap_optimizer:
// OptimizerStep steps each bucket's parameters as soon as that bucket is
// reduced; DdpOptions::gradient_priority: the first layers' buckets go on the
// wire before later ones still queued. Ranks as threads over Gloo, compared
// with the same training without them.
#include <torch/torch.h>

#include <array>
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

enum class Kind { kSgdMomentum, kAdam, kCounting };

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
  }
  return nullptr;
}

struct RankResult {
  std::vector<Tensor> params;  // The model's, then the extra tensor.
  int optimizer_calls = 0;     // CountingSgd only.
  int params_seen = 0;
  int buckets = 0;
};

// Trains kSteps steps on every rank with `options`.
std::vector<RankResult> RunDdp(const Net& init, const Data& data, Kind kind, DdpOptions options) {
  std::vector<RankResult> results(data.size());
  RunRanks(static_cast<int>(data.size()), init, options,
           [&](int rank, Net net, TypedDistributedDataParallel<Net>& ddp) -> Status {
             // The same on every rank: the extra tensor's gradient is set by hand.
             Tensor extra = torch::ones({3}).requires_grad_();
             auto opt = MakeOptimizer(kind, net, extra);
             for (int s = 0; s < kSteps; ++s) {
               opt->zero_grad();
               ASSIGN_OR_RETURN(Tensor out, ddp.Forward(data[rank][s].x));
               RETURN_IF_ERROR(ddp.Backward(torch::mse_loss(out, data[rank][s].y)));
               extra.mutable_grad() = torch::full({3}, 0.5 * (s + 1));
               ddp.OptimizerStep(*opt);
             }
             // The last step's communication errors, if any.
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

TEST(OverlapOptimizerTest, SteppingBucketByBucketEqualsOneStepForSgdMomentumAndAdam) {
  torch::manual_seed(3);
  Net init;
  const Data data = MakeData(3);
  for (Kind kind : {Kind::kSgdMomentum, Kind::kAdam}) {
    for (bool bucket_view : {true, false}) {
      const auto plain = RunDdp(init, data, kind, Options(false, bucket_view));
      const auto overlapped = RunDdp(init, data, kind, Options(true, bucket_view));
      ASSERT_EQ(plain.size(), 3u);
      ASSERT_EQ(overlapped.size(), 3u);
      for (size_t r = 0; r < 3; ++r) {
        ASSERT_EQ(overlapped[r].params.size(), plain[r].params.size());
        for (size_t p = 0; p < plain[r].params.size(); ++p) {
          // Each parameter is updated by the same operations on the same
          // values, only at another time: bit for bit equal.
          EXPECT_TRUE(torch::equal(overlapped[r].params[p], plain[r].params[p]))
              << "rank " << r << " tensor " << p << " kind " << static_cast<int>(kind)
              << " bucket_view " << bucket_view;
        }
        // And training moved them (the comparison is not of two no-ops).
        EXPECT_FALSE(torch::equal(overlapped[r].params[0], init->parameters()[0]));
        EXPECT_FALSE(torch::equal(overlapped[r].params.back(), torch::ones({3})));
      }
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

// SGD that counts its steps into `*counter`.
struct NotifyingSgd : torch::optim::SGD {
  NotifyingSgd(std::vector<Tensor> params, std::atomic<int>* counter)
      : torch::optim::SGD(std::move(params), torch::optim::SGDOptions(0.1)), counter(counter) {}
  Tensor step(LossClosure closure = nullptr) override {
    ++*counter;
    return torch::optim::SGD::step(closure);
  }
  std::atomic<int>* counter;
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
  FakeStore store;
  DdpOptions options = Options(true, true);
  options.comm_hook.name = "failing";
  options.comm_hook.run = [](GradBucket& bucket, Communicator& comm) {
    if (bucket.index == 2) return BucketWork::Failed(absl::UnavailableError("wire cut"));
    return BucketWork::Of(comm.AllReduce(bucket.buffer, ReduceOp::kSum), bucket.buffer, 0);
  };
  auto ddp = SingleRank(&store, options);
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  Net net = (*ddp)->typed_module();
  std::atomic<int> stepped{0};
  NotifyingSgd opt(net->parameters(), &stepped);
  auto out = (*ddp)->Forward(torch::randn({4, test_net::kNetIn}));
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE((*ddp)->Backward(out->sum()).ok());  // Nothing waited for yet.
  (*ddp)->OptimizerStep(opt);
  EXPECT_EQ(stepped.load(), 2);  // Buckets 0 and 1; not 2, 3 or the rest.
  auto next = (*ddp)->Forward(torch::randn({4, test_net::kNetIn}));
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(next.status().message()), HasSubstr("wire cut"));
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
