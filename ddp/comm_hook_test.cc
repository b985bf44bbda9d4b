// Comm hooks (comm_hook.h) through the real engine: ranks as threads over a
// FakeStore with Gloo (and shm) communicators, each rank on its own batch;
// the gradients DDP leaves are compared with what the hook must compute
// from the ranks' local gradients, computed here in one process.
#include "ddp/comm_hook.h"

#include <torch/torch.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ddp/adasum_hook_check.h"
#include "ddp/ddp.h"
#include "ddp/fake_communicator.h"
#include "ddp/fake_store.h"
#include "ddp/shm_communicator.h"
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
constexpr int64_t kRows = 4;

using test_net::Batch;
using test_net::Data;
using test_net::Net;
using test_net::Replica;

Data MakeData(int world, int micro_batches, uint64_t seed = 11) {
  torch::manual_seed(seed);
  Data data(world);
  for (auto& rank : data) {
    for (int m = 0; m < micro_batches; ++m) {
      rank.push_back({torch::randn({kRows, kIn}), torch::randn({kRows, kOut})});
    }
  }
  return data;
}

Tensor Loss(Net& net, const Batch& b) { return torch::mse_loss(net->forward(b.x), b.y); }

// Each rank's local gradients (summed over its micro-batches), per parameter.
std::vector<std::vector<Tensor>> LocalGrads(const Net& init, const Data& data) {
  std::vector<std::vector<Tensor>> out;
  for (const auto& batches : data) {
    Net net = Replica(init);
    for (const auto& b : batches) Loss(net, b).backward();
    std::vector<Tensor> grads;
    for (const auto& p : net->parameters()) grads.push_back(p.grad().clone());
    out.push_back(grads);
  }
  return out;
}

std::vector<Tensor> Average(const std::vector<std::vector<Tensor>>& per_rank) {
  std::vector<Tensor> avg;
  for (size_t p = 0; p < per_rank[0].size(); ++p) {
    Tensor sum = torch::zeros_like(per_rank[0][p]);
    for (const auto& g : per_rank) sum += g[p];
    avg.push_back(sum / static_cast<double>(per_rank.size()));
  }
  return avg;
}

StatusOr<std::shared_ptr<Communicator>> Connect(const std::string& backend,
                                                rendezvous::Store* store, int rank, int world) {
  if (backend != "shm") return test_ranks::ConnectGloo(store, rank, world);
  ShmOptions options;
  options.timeout = std::chrono::seconds(30);
  options.connect_timeout = std::chrono::seconds(30);
  ASSIGN_OR_RETURN(auto comm, ShmCommunicator::Create(store, rank, world, options));
  return std::shared_ptr<Communicator>(std::move(comm));
}

struct RankResult {
  std::vector<Tensor> grads;  // After the synchronised backward.
  StepStats stats;
  bool buckets_in_comm_memory = false;
  bool grads_share_one_storage = false;  // All of them: bucket views of one block.
  std::vector<int64_t> bucket_numels;    // Elements of each bucket, last layout.
};

// `steps` DDP steps on `data.size()` ranks as threads, each on the same
// data (the parameters do not change): every micro-batch but the last under
// NoSync, the last synchronised. The second step runs on rebuilt buckets.
// Returns each rank's gradients after the last step.
// With `set_to_none` each step starts with the gradients reset to undefined
// (LibTorch 2.x's zero_grad()) instead of zeroed.
std::vector<RankResult> RunDdp(const std::string& backend, const Net& init, const Data& data,
                               DdpOptions options, int steps = 1, bool set_to_none = false) {
  const int world = static_cast<int>(data.size());
  std::vector<Net> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(Replica(init));
  FakeStore store;
  std::vector<Status> status(world);
  std::vector<RankResult> results(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      status[rank] = [&]() -> Status {
        ASSIGN_OR_RETURN(auto comm, Connect(backend, &store, rank, world));
        DdpOptions opts = options;
        opts.timeout = std::chrono::seconds(30);
        opts.report_progress = false;
        Net net = replicas[rank];
        ASSIGN_OR_RETURN(auto ddp, DistributedDataParallel::Create(net, comm, opts));
        const auto& batches = data[rank];
        for (int s = 0; s < steps; ++s) {
          if (set_to_none) {
            for (auto& p : net->parameters()) p.mutable_grad().reset();
          } else {
            net->zero_grad();
          }
          for (size_t m = 0; m < batches.size(); ++m) {
            auto step = [&]() -> Status {
              ASSIGN_OR_RETURN(Tensor out, ddp->Forward(batches[m].x));
              return ddp->Backward(torch::mse_loss(out, batches[m].y));
            };
            if (m + 1 < batches.size()) {
              auto scope = ddp->NoSync();
              RETURN_IF_ERROR(step());
            } else {
              RETURN_IF_ERROR(step());
            }
          }
        }
        const auto* first_storage = net->parameters()[0].grad().storage().unsafeGetStorageImpl();
        results[rank].grads_share_one_storage = true;
        for (const auto& p : net->parameters()) {
          results[rank].grads.push_back(p.grad().clone());
          if (p.grad().storage().unsafeGetStorageImpl() != first_storage) {
            results[rank].grads_share_one_storage = false;
          }
        }
        results[rank].stats = ddp->last_stats();
        results[rank].buckets_in_comm_memory = ddp->reducer().buckets_in_comm_memory();
        const auto params = net->parameters();
        for (const auto& bucket : ddp->reducer().bucket_indices()) {
          int64_t numel = 0;
          for (size_t i : bucket) numel += params[i].numel();
          results[rank].bucket_numels.push_back(numel);
        }
        return absl::OkStatus();
      }();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  return results;
}

void ExpectGradsNear(const std::vector<RankResult>& results, const std::vector<Tensor>& expected,
                     double rtol, double atol, const std::string& what) {
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_EQ(results[r].grads.size(), expected.size()) << what;
    for (size_t p = 0; p < expected.size(); ++p) {
      EXPECT_TRUE(results[r].grads[p].allclose(expected[p], rtol, atol))
          << what << ": rank " << r << " parameter " << p << " max error "
          << (results[r].grads[p] - expected[p]).abs().max().item<double>();
    }
  }
}

// Over shm the default hook's buckets live in the communicator's shared
// bucket memory and the average's division rides on the reduction (no
// prescale): the gradients still equal the average, with and without bucket
// views, zeroed or reset to undefined between steps, through NoSync
// micro-batches, several buckets and the rebuild; with views they alias the
// buckets (one block for all). Fresh gradients leave each rank's share of
// a bucket uncopied, read by shm from the gradients. Gloo has no bucket
// memory.
TEST(CommHookTest, ShmBucketsLiveInSharedMemoryAndAverageOnTheReduction) {
  torch::manual_seed(3);
  Net init;
  const Data data = MakeData(3, 2);
  const std::vector<Tensor> expected = Average(LocalGrads(init, data));
  for (bool view : {false, true}) {
    for (bool set_to_none : {false, true}) {
      DdpOptions options;
      options.gradient_as_bucket_view = view;
      options.bucket_cap_mb = 1e-4;  // Several buckets.
      auto results = RunDdp("shm", init, data, options, /*steps=*/3, set_to_none);
      const std::string what = absl::StrCat("shm, bucket view ", view, ", set_to_none ", set_to_none);
      ExpectGradsNear(results, expected, 1e-5, 1e-6, what);
      const int world = static_cast<int>(results.size());
      for (int rank = 0; rank < world; ++rank) {
        const RankResult& r = results[rank];
        EXPECT_TRUE(r.buckets_in_comm_memory) << what;
        EXPECT_EQ(r.grads_share_one_storage, view) << what;
        EXPECT_GT(r.stats.buckets, 1) << what;
        // A gradient that is not its slot already leaves the rank's own
        // share of its bucket (the slice it reduces) to the communicator
        // (reducer.h "Own share").
        int64_t share_bytes = 0;
        for (int64_t n : r.bucket_numels) share_bytes += (n * (rank + 1) / world - n * rank / world) * 4;
        const int64_t in_place = r.stats.reducer.bytes_read_in_place;
        EXPECT_EQ(in_place, view && !set_to_none ? 0 : share_bytes) << what << ", rank " << rank;
      }
    }
  }
  auto gloo = RunDdp("gloo", init, data, DdpOptions{});
  EXPECT_EQ(gloo[0].stats.reducer.bytes_read_in_place, 0) << "Gloo reads every bucket whole";
  EXPECT_FALSE(gloo[0].buckets_in_comm_memory);
  EXPECT_TRUE(gloo[0].grads_share_one_storage) << "bucket views are the default";
}

// A user hook: twice the average (prescaled by the Reducer, then doubled).
CommHook Doubling() {
  return CommHook{"double", /*prescale_by_world=*/true, [](GradBucket& b, Communicator& comm) {
                    b.buffer.mul_(2);
                    return BucketWork::Of(comm.AllReduce(b.buffer, ReduceOp::kSum), b.buffer,
                                          static_cast<int64_t>(b.buffer.nbytes()));
                  }};
}

TEST(CommHookTest, DefaultHookAveragesAcrossRanks) {
  torch::manual_seed(3);
  Net init;
  const Data data = MakeData(3, 1);
  auto results = RunDdp("gloo", init, data, DdpOptions{});
  ExpectGradsNear(results, Average(LocalGrads(init, data)), 1e-5, 1e-6, "allreduce");
}

TEST(CommHookTest, UserHookDoublingGivesTwiceTheAverageWithNoSyncRebuildAndBucketViews) {
  torch::manual_seed(3);
  Net init;
  const Data data = MakeData(2, 2);  // One NoSync micro-batch, then a synchronised one.
  std::vector<Tensor> expected = Average(LocalGrads(init, data));
  for (auto& e : expected) e = e * 2;
  for (bool view : {false, true}) {
    DdpOptions options;
    options.comm_hook = Doubling();
    options.gradient_as_bucket_view = view;
    options.bucket_cap_mb = 1e-4;  // Several buckets.
    auto results = RunDdp("gloo", init, data, options, /*steps=*/2);
    ExpectGradsNear(results, expected, 1e-5, 1e-6, absl::StrCat("doubling, bucket view ", view));
    EXPECT_GT(results[0].stats.buckets, 1);
  }
}

TEST(CommHookTest, UserHookWithoutPrescaleSeesRawGradientsAndMayReturnAnotherTensor) {
  torch::manual_seed(3);
  Net init;
  const Data data = MakeData(2, 1);
  CommHook avg_x3{"avg_x3", false, [](GradBucket& b, Communicator& comm) {
                    // Returns a new tensor: the Reducer copies it into the bucket.
                    at::Tensor sum = b.buffer.clone();
                    auto work = comm.AllReduce(sum, ReduceOp::kAvg);
                    return BucketWork::Then(
                        work, [sum]() -> StatusOr<at::Tensor> { return sum * 3; },
                        static_cast<int64_t>(sum.nbytes()));
                  }};
  DdpOptions options;
  options.comm_hook = avg_x3;
  auto results = RunDdp("gloo", init, data, options);
  std::vector<Tensor> expected = Average(LocalGrads(init, data));
  for (auto& e : expected) e = e * 3;
  ExpectGradsNear(results, expected, 1e-5, 1e-6, "avg then x3");
}

TEST(CommHookTest, HookErrorsFailTheStepNamingTheHook) {
  torch::manual_seed(3);
  Net init;
  const Data data = MakeData(1, 1);
  for (int mode = 0; mode < 3; ++mode) {
    CommHook bad{"bad", false, [mode](GradBucket& b, Communicator&) -> std::shared_ptr<BucketWork> {
                   if (mode == 0) throw std::runtime_error("boom");
                   if (mode == 1) return BucketWork::Failed(absl::UnavailableError("no wire"));
                   return BucketWork::Of(Work::Failed(absl::OkStatus()), b.buffer.narrow(0, 0, 1),
                                         0);
                 }};
    DdpOptions options;
    options.comm_hook = bad;
    options.report_progress = false;
    Net net = Replica(init);
    auto ddp = DistributedDataParallel::Create(
        net, std::shared_ptr<Communicator>(new FakeCommunicator(1)), options);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    auto out = (*ddp)->Forward(data[0][0].x);
    ASSERT_TRUE(out.ok());
    Status s = (*ddp)->Backward(torch::mse_loss(*out, data[0][0].y));
    EXPECT_FALSE(s.ok());
    const std::string message(s.message());
    const char* expected[] = {"comm hook 'bad' threw on bucket 0: boom", "no wire",
                              "comm hook 'bad' returned 1 elements of Float"};
    EXPECT_THAT(message, HasSubstr(expected[mode]));
  }
}

// fp16/bf16: the average within the rounding of the wire dtype (unit
// roundoff u = 2^-11 / 2^-8; with the values divided before the cast, each
// result carries the cast's rounding and one per addition, so a few u of
// the largest gradient), and half the bytes of the float32 allreduce.
TEST(CommHookTest, CompressionHooksAverageWithinRoundingOnHalfTheBytes) {
  torch::manual_seed(3);
  Net init;
  const Data data = MakeData(3, 1);
  const std::vector<Tensor> expected = Average(LocalGrads(init, data));
  double max_abs = 0;
  for (const auto& e : expected) max_abs = std::max(max_abs, e.abs().max().item<double>());
  for (const std::string backend : {"gloo", "shm"}) {
    const int64_t fp32_bytes = RunDdp(backend, init, data, DdpOptions{})[0].stats.bytes_reduced;
    for (const auto& [name, unit] : {std::pair<std::string, double>{"fp16", 1.0 / 2048},
                                     std::pair<std::string, double>{"bf16", 1.0 / 256}}) {
      DdpOptions options;
      options.comm_hook = *CommHookFromName(name);
      auto results = RunDdp(backend, init, data, options);
      const double bound = 4 * unit * max_abs;
      ExpectGradsNear(results, expected, 0, bound, absl::StrCat(name, " over ", backend));
      // Not the float32 path by accident: the rounding shows.
      double max_error = 0;
      for (size_t p = 0; p < expected.size(); ++p) {
        max_error =
            std::max(max_error, (results[0].grads[p] - expected[p]).abs().max().item<double>());
      }
      EXPECT_GT(max_error, 1e-7) << name << " over " << backend;
      EXPECT_EQ(results[0].stats.bytes_reduced * 2, fp32_bytes) << name << " over " << backend;
    }
  }
}

// Three ranks with gradients of 40000: their sum (120000) is beyond float16
// (65504), their average is not. The fp16 hook divides first.
TEST(CommHookTest, Fp16HookDoesNotOverflowWhereTheAverageFits) {
  constexpr int kWorld = 3;
  torch::manual_seed(3);
  Net init;
  Data data(kWorld);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : init->parameters()) p.fill_(0);
    init->fc2->bias.fill_(0);
  }
  // d(mse)/d(fc2.bias) = 2 (out - y) / numel: with out = 0 and
  // y = -40000 * numel / 2, the bias gradient is 40000 per element.
  const double y = -40000.0 * kRows * kOut / 2 / kRows;
  for (auto& rank : data)
    rank.push_back({torch::zeros({kRows, kIn}), torch::full({kRows, kOut}, y)});
  DdpOptions options;
  options.comm_hook = Fp16CompressHook();
  auto results = RunDdp("gloo", init, data, options);
  const auto expected = Average(LocalGrads(init, data));
  ASSERT_TRUE(expected[3].eq(40000).all().item<bool>()) << expected[3];
  ExpectGradsNear(results, expected, 0, 1e-3, "fp16 at 40000");
}

// ---- Adasum ---------------------------------------------------------------

// The rule written out directly, in double.
Tensor Formula(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(torch::kDouble), y = b.to(torch::kDouble);
  const double ab = x.dot(y).item<double>();
  return x * (1 - ab / (2 * x.dot(x).item<double>())) +
         y * (1 - ab / (2 * y.dot(y).item<double>()));
}

// The tree written out directly: remainder ranks folded into rank r - P,
// then neighbours combined level by level.
Tensor DirectTree(std::vector<Tensor> g) {
  size_t pow2 = 1;
  while (pow2 * 2 <= g.size()) pow2 *= 2;
  for (size_t r = pow2; r < g.size(); ++r) g[r - pow2] = Formula(g[r - pow2], g[r]);
  g.resize(pow2);
  while (g.size() > 1) {
    std::vector<Tensor> next;
    for (size_t i = 0; i < g.size(); i += 2) next.push_back(Formula(g[i], g[i + 1]));
    g = next;
  }
  return g[0].to(torch::kDouble);
}

TEST(AdasumTest, OrthogonalGradientsAddUp) {
  Tensor a = torch::tensor({1.0f, 0.0f, 0.0f, 3.0f});
  Tensor b = torch::tensor({0.0f, 2.0f, -5.0f, 0.0f});
  AdasumCombineInto(a, b);
  EXPECT_TRUE(a.equal(torch::tensor({1.0f, 2.0f, -5.0f, 3.0f}))) << a;
}

TEST(AdasumTest, IdenticalGradientsGiveOneOfThem) {
  Tensor a = torch::tensor({1.0f, -2.0f, 3.5f});
  AdasumCombineInto(a, a.clone());
  EXPECT_TRUE(a.allclose(torch::tensor({1.0f, -2.0f, 3.5f}), 0, 1e-6)) << a;
}

TEST(AdasumTest, ZeroGradientLeavesTheOther) {
  Tensor a = torch::zeros({3});
  AdasumCombineInto(a, torch::tensor({1.0f, 2.0f, 3.0f}));
  EXPECT_TRUE(a.equal(torch::tensor({1.0f, 2.0f, 3.0f}))) << a;
}

TEST(AdasumTest, RandomPairMatchesTheFormula) {
  torch::manual_seed(5);
  for (auto dtype : {torch::kFloat, torch::kDouble}) {
    Tensor a = torch::randn({257}, dtype), b = torch::randn({257}, dtype) + 0.3 * a;
    const Tensor expected = Formula(a, b);
    AdasumCombineInto(a, b);
    EXPECT_TRUE(a.to(torch::kDouble).allclose(expected, 1e-5, 1e-6));
  }
}

// Strided views and half precision take the tensor-op path (the one a GPU
// takes: no host sync): the same rule, to their precision.
TEST(AdasumTest, StridedAndHalfPrecisionGradientsMatchTheFormula) {
  torch::manual_seed(6);
  Tensor a2 = torch::randn({64, 2}), b2 = torch::randn({64, 2});
  b2.add_(0.3 * a2);
  Tensor a = a2.select(1, 0), b = b2.select(1, 1);  // stride 2
  ASSERT_FALSE(a.is_contiguous());
  Tensor expected = Formula(a.clone(), b.clone());
  AdasumCombineInto(a, b);
  EXPECT_TRUE(a.to(torch::kDouble).allclose(expected, 1e-5, 1e-6));
  EXPECT_TRUE(a2.select(1, 0).equal(a)) << "not written through the view";
  for (auto dtype : {torch::kBFloat16, torch::kHalf}) {
    Tensor h = torch::randn({129}).to(dtype), k = (torch::randn({129}) + 0.3 * h.to(torch::kFloat)).to(dtype);
    expected = Formula(h.to(torch::kFloat), k.to(torch::kFloat));
    AdasumCombineInto(h, k);
    EXPECT_TRUE(h.to(torch::kDouble).allclose(expected, 2e-2, 2e-2)) << dtype;
  }
  // A zero gradient's coefficient is 1 on this path too.
  Tensor z = torch::zeros({4, 2}).select(1, 0), w = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f});
  AdasumCombineInto(z, w);
  EXPECT_TRUE(z.equal(w)) << z;
}

TEST(AdasumTest, TreeMatchesTheDirectTreeForEveryWorldSize) {
  torch::manual_seed(5);
  for (int world = 1; world <= 7; ++world) {
    Tensor rows = torch::randn({world, 33});
    std::vector<Tensor> g;
    for (int r = 0; r < world; ++r) g.push_back(rows[r].clone());
    AdasumTreeInPlace(rows);
    EXPECT_TRUE(rows[0].to(torch::kDouble).allclose(DirectTree(g), 1e-5, 1e-6))
        << "world " << world;
  }
}

// Ranks as threads over Gloo; the bucket holds all four parameters, and the
// rule applies per parameter: the result differs from Adasum over the whole
// flat bucket, which the test checks so it can tell them apart.
TEST(AdasumTest, HookMatchesTheDirectTreeOnTwoToFiveRanks) {
  torch::manual_seed(3);
  Net init;
  for (int world = 2; world <= 5; ++world) {
    const Data data = MakeData(world, 1, /*seed=*/20 + world);
    const auto local = LocalGrads(init, data);
    std::vector<Tensor> expected;
    std::vector<Tensor> flat_rows;
    for (size_t p = 0; p < local[0].size(); ++p) {
      std::vector<Tensor> g;
      for (const auto& rank : local) g.push_back(rank[p].reshape(-1));
      expected.push_back(DirectTree(g).to(torch::kFloat).view_as(local[0][p]));
    }
    for (const auto& rank : local) {
      std::vector<Tensor> parts;
      for (const auto& t : rank) parts.push_back(t.reshape(-1));
      flat_rows.push_back(torch::cat(parts));
    }
    const Tensor whole_bucket = DirectTree(flat_rows).to(torch::kFloat);
    std::vector<Tensor> expected_flat;
    for (const auto& e : expected) expected_flat.push_back(e.reshape(-1));
    ASSERT_FALSE(torch::cat(expected_flat).allclose(whole_bucket, 1e-3, 1e-4))
        << "world " << world << ": per-parameter and per-bucket Adasum coincide";

    DdpOptions options;
    options.comm_hook = AdasumHook();
    // Adasum needs only an allgather: the same on both host communicators.
    for (const std::string backend : {"gloo", "shm"}) {
      auto results = RunDdp(backend, init, data, options);
      EXPECT_EQ(results[0].stats.buckets, 1);
      ExpectGradsNear(results, expected, 1e-5, 1e-6,
                      absl::StrCat("adasum over ", backend, ", world ", world));
      for (int r = 1; r < world; ++r) {
        for (size_t p = 0; p < expected.size(); ++p) {
          EXPECT_TRUE(results[r].grads[p].equal(results[0].grads[p]))
              << "ranks differ over " << backend << ", world " << world;
        }
      }
    }
  }
}

// The hook alone over ranks whose rows differ, 2 to 5 of them (3 and 5
// fold a remainder), against the per-parameter tree (ddp_cuda_test runs
// the same on the GPU).
TEST(AdasumTest, HookOverDistinctRowsMatchesThePerParameterTree) {
  adasum_check::ExpectAdasumHookMatchesThePerParameterTree(c10::Device(c10::DeviceType::CPU));
}

// A device communicator's gather is only ordered before the caller's
// stream when WaitStream returns; one that then fails (a peer lost
// mid-gather: NCCL's watchdog aborts and the rows stay half written) must
// fail the bucket, not have Adasum combine what the rows hold.
class GatherFailingAfterItsStreamWait : public FakeCommunicator {
 public:
  GatherFailingAfterItsStreamWait() : FakeCommunicator(2) {}
  ~GatherFailingAfterItsStreamWait() override {
    if (finisher_.joinable()) finisher_.join();
  }
  std::shared_ptr<Work> AllGather(at::Tensor input, at::Tensor output) override {
    auto work = std::make_shared<Work>();
    work->SetStreamWaiter([] { return absl::OkStatus(); });
    work->MarkStarted();
    finisher_ = std::thread([work] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      work->Finish(absl::DeadlineExceededError(
          "nccl allgather #3 on rank 0 did not complete within 1 s: ranks [1] did not arrive; "
          "communicator aborted"));
    });
    return work;
  }

 private:
  std::thread finisher_;
};

TEST(AdasumTest, AGatherThatFailsAfterItsStreamWaitFailsTheBucket) {
  GatherFailingAfterItsStreamWait comm;
  GradBucket bucket;
  bucket.buffer = torch::ones({6});
  bucket.param_indices = {0, 1};
  bucket.offsets = {0, 2};
  bucket.numels = {2, 4};
  CommHook hook = AdasumHook();
  std::shared_ptr<BucketWork> work = hook.run(bucket, comm);
  StatusOr<at::Tensor> result = work->Wait(std::chrono::seconds(5));
  ASSERT_FALSE(result.ok()) << "combined rows the gather never finished writing";
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("ranks [1] did not arrive"));
}

TEST(CommHookTest, CommHookFromNameNamesTheChoices) {
  EXPECT_EQ(CommHookFromName("adasum")->name, "adasum");
  EXPECT_EQ(CommHookFromName("allreduce")->name, "allreduce");
  EXPECT_EQ(CommHookFromName("fp16")->name, "fp16");
  EXPECT_EQ(CommHookFromName("bf16")->name, "bf16");
  auto bad = CommHookFromName("fp8");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("unknown comm hook 'fp8'"));
}

// A continuation that throws fails the bucket with Internal naming it (the
// Reducer then fails the step); it runs once: a second Wait returns the
// same result without running it again.
TEST(BucketWorkTest, AContinuationThatThrowsIsInternalAndRunsOnce) {
  auto work = std::make_shared<Work>();
  work->MarkStarted();
  work->Finish(absl::OkStatus());
  int runs = 0;
  auto bucket = BucketWork::Then(
      work,
      [&runs]() -> StatusOr<at::Tensor> {
        ++runs;
        throw std::runtime_error("cast back blew up");
      },
      16);
  StatusOr<at::Tensor> first = bucket->Wait(std::chrono::seconds(5));
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(first.status().message()),
              HasSubstr("comm hook continuation threw: cast back blew up"));
  StatusOr<at::Tensor> second = bucket->Wait(std::chrono::seconds(5));
  EXPECT_EQ(second.status(), first.status());
  EXPECT_EQ(runs, 1);
  // A continuation that succeeds: its tensor, once, however often waited.
  int ok_runs = 0;
  auto good = BucketWork::Then(
      work,
      [&ok_runs]() -> StatusOr<at::Tensor> {
        ++ok_runs;
        return torch::full({2}, 7.0);
      },
      16);
  for (int i = 0; i < 2; ++i) {
    StatusOr<at::Tensor> r = good->Wait(std::chrono::seconds(5));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(torch::equal(*r, torch::full({2}, 7.0)));
  }
  EXPECT_EQ(ok_runs, 1);
}


}  // namespace
}  // namespace ddp
}  // namespace lockstep
