// Communicator conformance suite, run against GlooCommunicator with ranks as
// threads (FakeStore) and ranks as forked processes (FileStore on a temp dir).
#include "ddp/gloo_communicator.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ddp/fake_store.h"
#include "gtest/gtest.h"
#include "rendezvous/file_store.h"

namespace lockstep {
namespace ddp {
namespace {

using RankBody = std::function<Status(int rank, rendezvous::Store* store)>;

enum class Mode { kThreads, kProcesses };

std::string TempDir() {
  std::string base = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
  std::string templ = base + "/comm_XXXXXX";
  EXPECT_NE(mkdtemp(templ.data()), nullptr);
  return templ;
}

// Runs `body` for ranks 0..world-1 and returns each rank's status.
std::vector<Status> RunRanks(Mode mode, int world, const RankBody& body) {
  std::vector<Status> results(world);
  if (mode == Mode::kThreads) {
    FakeStore store;
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] { results[r] = body(r, &store); });
    }
    for (auto& t : threads) t.join();
    return results;
  }
  const std::string dir = TempDir();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      auto store = rendezvous::FileStore::Open(dir);
      Status s = store.ok() ? body(r, store->get()) : store.status();
      if (!s.ok()) fprintf(stderr, "rank %d: %s\n", r, s.ToString().c_str());
      fflush(stderr);
      _exit(s.ok() ? 0 : 1);
    }
    pids.push_back(pid);
  }
  for (int r = 0; r < world; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      results[r] = absl::InternalError(absl::StrCat("rank ", r, " process failed"));
    }
  }
  return results;
}

StatusOr<std::unique_ptr<GlooCommunicator>> Connect(rendezvous::Store* store, int rank, int world,
                                                    Duration timeout = std::chrono::seconds(30)) {
  GlooOptions options;
  options.timeout = timeout;
  options.connect_timeout = std::chrono::seconds(30);
  return GlooCommunicator::Create(store, rank, world, options);
}

Status Expect(bool cond, const std::string& what) {
  return cond ? absl::OkStatus() : absl::InternalError(what);
}

class CommunicatorConformanceTest : public ::testing::TestWithParam<Mode> {};

TEST_P(CommunicatorConformanceTest, AllReduceSumsAndAveragesOverRanks) {
  constexpr int kWorld = 3;
  auto results = RunRanks(GetParam(), kWorld, [](int rank, rendezvous::Store* store) -> Status {
    ASSIGN_OR_RETURN(auto comm, Connect(store, rank, kWorld));
    // Larger than Gloo's segment size, so the ring runs several segments.
    at::Tensor sum = at::full({300001}, float(rank + 1));
    at::Tensor avg = at::full({7}, double(rank + 1));
    at::Tensor ints = at::full({5}, int64_t(rank + 1), at::kLong);
    auto w1 = comm->AllReduce(sum, ReduceOp::kSum);
    auto w2 = comm->AllReduce(avg, ReduceOp::kAvg);
    auto w3 = comm->AllReduce(ints, ReduceOp::kSum);
    RETURN_IF_ERROR(w1->Wait());
    RETURN_IF_ERROR(w2->Wait());
    RETURN_IF_ERROR(w3->Wait());
    RETURN_IF_ERROR(Expect(sum.eq(6.0f).all().item<bool>(), "float sum"));
    RETURN_IF_ERROR(Expect(avg.eq(2.0).all().item<bool>(), "double average"));
    RETURN_IF_ERROR(Expect(ints.eq(6).all().item<bool>(), "int64 sum"));
    return Expect(w1->IsCompleted() && w1->started_at() <= w1->finished_at(), "timestamps");
  });
  for (const auto& s : results) EXPECT_TRUE(s.ok()) << s;
}

TEST_P(CommunicatorConformanceTest, BroadcastCopiesRootTensorToEveryRank) {
  constexpr int kWorld = 3;
  auto results = RunRanks(GetParam(), kWorld, [](int rank, rendezvous::Store* store) -> Status {
    ASSIGN_OR_RETURN(auto comm, Connect(store, rank, kWorld));
    at::Tensor t = at::arange(1000, at::kInt) * (rank + 1);
    RETURN_IF_ERROR(comm->Broadcast(t, 1)->Wait());
    return Expect(t.equal(at::arange(1000, at::kInt) * 2), "broadcast from rank 1");
  });
  for (const auto& s : results) EXPECT_TRUE(s.ok()) << s;
}

TEST_P(CommunicatorConformanceTest, AllGatherConcatenatesInRankOrderAndBarrierCompletes) {
  constexpr int kWorld = 2;
  auto results = RunRanks(GetParam(), kWorld, [](int rank, rendezvous::Store* store) -> Status {
    ASSIGN_OR_RETURN(auto comm, Connect(store, rank, kWorld));
    at::Tensor in = at::full({4}, float(rank));
    at::Tensor out = at::empty({8});
    RETURN_IF_ERROR(comm->AllGather(in, out)->Wait());
    RETURN_IF_ERROR(comm->Barrier()->Wait());
    return Expect(out.equal(at::cat({at::zeros({4}), at::ones({4})})), "allgather order");
  });
  for (const auto& s : results) EXPECT_TRUE(s.ok()) << s;
}

TEST_P(CommunicatorConformanceTest, MissingRankFailsOthersWithinTimeoutNamingIt) {
  constexpr int kWorld = 3;
  constexpr auto kTimeout = std::chrono::seconds(2);
  auto results = RunRanks(GetParam(), kWorld, [&](int rank, rendezvous::Store* store) -> Status {
    ASSIGN_OR_RETURN(auto comm, Connect(store, rank, kWorld, kTimeout));
    if (rank == 2) {
      // Never joins the allreduce; stays connected until the others are done.
      return store->Wait({"test/done/0", "test/done/1"}, std::chrono::seconds(30));
    }
    at::Tensor t = at::ones({1000});
    const auto start = std::chrono::steady_clock::now();
    Status s = comm->AllReduce(t, ReduceOp::kSum)->Wait();
    const auto elapsed = std::chrono::steady_clock::now() - start;
    RETURN_IF_ERROR(store->Set(absl::StrCat("test/done/", rank), "1"));
    RETURN_IF_ERROR(Expect(absl::IsDeadlineExceeded(s), "expected DeadlineExceeded: " + s.ToString()));
    RETURN_IF_ERROR(Expect(s.message().find("ranks [2]") != std::string::npos,
                           "error does not name rank 2: " + s.ToString()));
    RETURN_IF_ERROR(Expect(elapsed < kTimeout + std::chrono::seconds(1), "took too long"));
    Status later = comm->Barrier()->Wait();
    return Expect(absl::IsFailedPrecondition(later), "later collective: " + later.ToString());
  });
  for (const auto& s : results) EXPECT_TRUE(s.ok()) << s;
}

TEST_P(CommunicatorConformanceTest, CreateNamesRanksThatNeverConnect) {
  constexpr int kWorld = 3;
  auto results = RunRanks(GetParam(), kWorld, [](int rank, rendezvous::Store* store) -> Status {
    if (rank == 2) return absl::OkStatus();
    GlooOptions options;
    options.connect_timeout = std::chrono::milliseconds(500);
    auto comm = GlooCommunicator::Create(store, rank, kWorld, options);
    RETURN_IF_ERROR(Expect(absl::IsDeadlineExceeded(comm.status()), comm.status().ToString()));
    return Expect(comm.status().message().find("ranks [2]") != std::string::npos,
                  comm.status().ToString());
  });
  for (const auto& s : results) EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Gloo, CommunicatorConformanceTest,
                         ::testing::Values(Mode::kThreads, Mode::kProcesses),
                         [](const auto& info) {
                           return info.param == Mode::kThreads ? "Threads" : "Processes";
                         });

TEST(GlooCommunicatorTest, RejectsNonContiguousTensorWithoutRunning) {
  FakeStore store;
  auto comm = Connect(&store, 0, 1);
  ASSERT_TRUE(comm.ok()) << comm.status();
  at::Tensor t = at::ones({4, 4}).t();
  auto work = (*comm)->AllReduce(t, ReduceOp::kSum);
  EXPECT_TRUE(work->IsCompleted());
  EXPECT_TRUE(absl::IsInvalidArgument(work->status())) << work->status();
  EXPECT_TRUE(absl::IsInvalidArgument((*comm)->Broadcast(at::ones({2}), 3)->Wait()));
}

}  // namespace
}  // namespace ddp
}  // namespace lockstep
