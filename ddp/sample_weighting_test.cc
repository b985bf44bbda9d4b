// DdpOptions::weight_by_samples (heterogeneous batch sizes) and JoinStep /
// AllDone (uneven inputs): ranks as threads over a FakeStore with Gloo,
// compared with one process training on the same samples.
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

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

constexpr int64_t kIn = test_net::kNetIn;
constexpr int64_t kOut = test_net::kNetOut;
constexpr double kLr = 0.1;
// Bound on a rank's loop: the tests need at most 10 iterations.
constexpr int kMaxIterations = 20;

using test_net::Batch;
using test_net::Data;
using test_net::Net;
using test_net::Replica;
using test_ranks::RunRanks;
using test_ranks::SingleRank;

// rows[r][s]: rank r's batch size at its step s. Made on the calling thread
// (torch's generator is global).
Data MakeData(const std::vector<std::vector<int64_t>>& rows) {
  torch::manual_seed(17);
  Data data(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    for (int64_t n : rows[r]) data[r].push_back({torch::randn({n, kIn}), torch::randn({n, kOut})});
  }
  return data;
}

// One process: at step s, the mean loss over the concatenation of every
// rank's step-s batch (ranks with no step s contribute nothing).
std::vector<Tensor> TrainOnConcatenation(const Net& init, const Data& data) {
  Net net = Replica(init);
  torch::optim::SGD opt(net->parameters(), kLr);
  size_t steps = 0;
  for (const auto& batches : data) steps = std::max(steps, batches.size());
  for (size_t s = 0; s < steps; ++s) {
    std::vector<Tensor> xs, ys;
    for (const auto& batches : data) {
      if (s < batches.size()) {
        xs.push_back(batches[s].x);
        ys.push_back(batches[s].y);
      }
    }
    opt.zero_grad();
    torch::mse_loss(net->forward(torch::cat(xs)), torch::cat(ys)).backward();
    opt.step();
  }
  std::vector<Tensor> out;
  for (const auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

struct RankResult {
  std::vector<Tensor> params;
  int iterations = 0;             // Loop iterations, the final JoinStep included.
  int64_t global_samples = 0;     // last_global_samples() after the last data step.
};

// Each rank trains on its batches with SGD; once out of data it calls
// JoinStep until AllDone. With overlap_optimizer the optimizer runs through
// OptimizerStep.
std::vector<RankResult> RunDdp(const Net& init, const Data& data, DdpOptions options) {
  std::vector<RankResult> results(data.size());
  RunRanks(static_cast<int>(data.size()), init, options,
           [&](int rank, Net net, TypedDistributedDataParallel<Net>& ddp) -> Status {
             torch::optim::SGD opt(net->parameters(), kLr);
             const auto& batches = data[rank];
             RankResult& result = results[rank];
             for (size_t s = 0;; ++s) {
               if (++result.iterations > kMaxIterations) {
                 return absl::DeadlineExceededError("AllDone never became true");
               }
               opt.zero_grad();
               if (s < batches.size()) {
                 ASSIGN_OR_RETURN(Tensor out, ddp.Forward(batches[s].x));
                 RETURN_IF_ERROR(ddp.Backward(torch::mse_loss(out, batches[s].y)));
                 result.global_samples = ddp.last_global_samples();
                 if (ddp.AllDone()) return absl::InternalError("AllDone while this rank has data");
               } else {
                 if (!options.weight_by_samples) break;
                 RETURN_IF_ERROR(ddp.JoinStep());
                 if (ddp.AllDone()) break;
               }
               if (options.overlap_optimizer) {
                 ddp.OptimizerStep(opt);
               } else {
                 opt.step();
               }
             }
             RETURN_IF_ERROR(ddp.CompletePendingStep());  // overlap_forward's last step.
             for (const auto& p : net->parameters()) result.params.push_back(p.detach().clone());
             return absl::OkStatus();
           });
  return results;
}

double MaxError(const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  double err = 0;
  for (size_t p = 0; p < want.size(); ++p) {
    err = std::max(err, (got[p] - want[p]).abs().max().item<double>());
  }
  return err;
}

DdpOptions Weighted(bool bucket_view, bool overlap_forward = false) {
  DdpOptions options;
  options.weight_by_samples = true;
  options.overlap_optimizer = overlap_forward;
  options.overlap_forward = overlap_forward;
  options.gradient_as_bucket_view = bucket_view;
  options.bucket_cap_mb = 100.0 / (1024 * 1024);  // ~100 bytes: several buckets, each with [n, done].
  return options;
}

TEST(SampleWeightingTest, BatchesOf8And16And40MatchOneProcessOn64Samples) {
  torch::manual_seed(5);
  Net init;
  const Data data = MakeData({{8, 8, 8}, {16, 16, 16}, {40, 40, 40}});
  const std::vector<Tensor> expected = TrainOnConcatenation(init, data);
  for (bool bucket_view : {false, true}) {
    auto results = RunDdp(init, data, Weighted(bucket_view));
    for (size_t r = 0; r < results.size(); ++r) {
      ASSERT_EQ(results[r].params.size(), expected.size());
      EXPECT_LT(MaxError(results[r].params, expected), 1e-5)
          << "rank " << r << " bucket_view " << bucket_view;
      EXPECT_EQ(results[r].global_samples, 64);
    }
  }
  // The data makes the difference visible: the plain average over ranks
  // (each rank's mean weighted 1/3) does not match.
  auto unweighted = RunDdp(init, data, DdpOptions{});
  EXPECT_GT(MaxError(unweighted[0].params, expected), 1e-4);
}

TEST(SampleWeightingTest, UnevenInputsOf5And7And9BatchesJoinAndMatchOneProcess) {
  torch::manual_seed(6);
  Net init;
  const Data data = MakeData({std::vector<int64_t>(5, 4), std::vector<int64_t>(7, 6),
                              std::vector<int64_t>(9, 8)});
  const std::vector<Tensor> expected = TrainOnConcatenation(init, data);
  for (bool bucket_view : {false, true}) {
    // overlap_forward: each step's buckets stepped as the next forward (or
    // JoinStep, which completes the step first) reaches them.
    for (bool overlap_forward : {false, true}) {
      auto results = RunDdp(init, data, Weighted(bucket_view, overlap_forward));
      for (size_t r = 0; r < results.size(); ++r) {
        ASSERT_EQ(results[r].params.size(), expected.size());
        EXPECT_LT(MaxError(results[r].params, expected), 1e-5)
            << "rank " << r << " bucket_view " << bucket_view << " overlap " << overlap_forward;
        // 9 steps with data somewhere, then the join step where all are done.
        EXPECT_EQ(results[r].iterations, 10) << "rank " << r;
      }
    }
  }
}

TEST(SampleWeightingTest, FirstStepAsJoinStillMatches) {
  // Rank 0 (whose arrival order the others' rebuild uses) has no data at all.
  torch::manual_seed(7);
  Net init;
  const Data data = MakeData({{}, {3, 5}});
  auto results = RunDdp(init, data, Weighted(false));
  const std::vector<Tensor> expected = TrainOnConcatenation(init, data);
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_LT(MaxError(results[r].params, expected), 1e-5) << "rank " << r;
    EXPECT_EQ(results[r].iterations, 3) << "rank " << r;
  }
}

TEST(SampleWeightingTest, WeightingNeedsTheSummingHookAndJoinNeedsWeighting) {
  auto create_with = [](const CommHook& hook) {
    FakeStore store;
    DdpOptions options = Weighted(false);
    options.comm_hook = hook;
    return SingleRank(&store, options).status();
  };
  auto fp16 = CommHookFromName("fp16");
  ASSERT_TRUE(fp16.ok());
  Status bad = create_with(*fp16);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_THAT(std::string(bad.message()), HasSubstr("weight_by_samples"));

  // The name proves nothing: a user hook called "allreduce" that does not
  // say it sums weighted buckets is refused too; one that says so is taken.
  CommHook impostor = AllreduceHook();
  impostor.sums_weighted_buckets = false;
  bad = create_with(impostor);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_THAT(std::string(bad.message()), HasSubstr("sums weighted buckets"));
  CommHook mine = AllreduceHook();
  mine.name = "mine";
  EXPECT_TRUE(create_with(mine).ok()) << create_with(mine);

  FakeStore store2;
  auto plain = SingleRank(&store2, DdpOptions{});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->JoinStep().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(SampleWeightingTest, ForwardWithWithoutCountedSamplesIsFailedPrecondition) {
  FakeStore store;
  auto ddp = SingleRank(&store, Weighted(false));
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  Net net = (*ddp)->typed_module();
  auto out = (*ddp)->ForwardWith([&] { return net->forward(torch::randn({2, kIn})); });
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
  (*ddp)->CountSamples(2);
  EXPECT_TRUE((*ddp)->ForwardWith([&] { return net->forward(torch::randn({2, kIn})); }).ok());
}

}  // namespace
}  // namespace ddp
}  // namespace lockstep
