// Communicator conformance suite, run against GlooCommunicator and
// ShmCommunicator with ranks as threads (FakeStore) and ranks as forked
// processes (FileStore on a temp dir); then each backend's own cases.
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>

#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ddp/fake_store.h"
#include "ddp/gloo_communicator.h"
#include "ddp/hierarchical_communicator.h"
#include "ddp/shm_communicator.h"
#include "ddp/streaming.h"
#include "gmock/gmock.h"
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

struct Backend {
  std::string name;  // "gloo" or "shm".
  Mode mode;
};

StatusOr<std::unique_ptr<Communicator>> Connect(
    const std::string& backend, rendezvous::Store* store, int rank, int world,
    Duration timeout = std::chrono::seconds(30),
    Duration connect_timeout = std::chrono::seconds(30)) {
  if (backend == "shm") {
    ShmOptions options;
    options.timeout = timeout;
    options.connect_timeout = connect_timeout;
    ASSIGN_OR_RETURN(auto comm, ShmCommunicator::Create(store, rank, world, options));
    return std::unique_ptr<Communicator>(std::move(comm));
  }
  GlooOptions options;
  options.timeout = timeout;
  options.connect_timeout = connect_timeout;
  ASSIGN_OR_RETURN(auto comm, GlooCommunicator::Create(store, rank, world, options));
  return std::unique_ptr<Communicator>(std::move(comm));
}

Status Expect(bool cond, const std::string& what) {
  return cond ? absl::OkStatus() : absl::InternalError(what);
}

class CommunicatorConformanceTest : public ::testing::TestWithParam<Backend> {};

TEST_P(CommunicatorConformanceTest, AllReduceSumsAndAveragesOverRanks) {
  constexpr int kWorld = 3;
  auto results = RunRanks(GetParam().mode, kWorld, [](int rank, rendezvous::Store* store) -> Status {
    ASSIGN_OR_RETURN(auto comm, Connect(GetParam().name, store, rank, kWorld));
    // Larger than Gloo's segment and shm's half slot, so both run in chunks.
    at::Tensor sum = at::full({1300001}, float(rank + 1));
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

// Arguments a collective cannot take are refused at the call (a Work
// already failed with InvalidArgument naming them), and the communicator
// keeps working: a bad argument is not a transport failure.
TEST_P(CommunicatorConformanceTest, BadArgumentsAreRefusedAndTheCommunicatorGoesOn) {
  constexpr int kWorld = 2;
  auto results = RunRanks(GetParam().mode, kWorld, [](int rank, rendezvous::Store* store) -> Status {
    ASSIGN_OR_RETURN(auto comm, Connect(GetParam().name, store, rank, kWorld));
    auto refused = [](const std::shared_ptr<Work>& w, const std::string& want) -> Status {
      Status s = w->Wait();
      return Expect(absl::IsInvalidArgument(s) && s.message().find(want) != std::string::npos,
                    "want InvalidArgument '" + want + "', got " + s.ToString());
    };
    RETURN_IF_ERROR(refused(comm->AllReduce(at::ones({4}, at::kByte), ReduceOp::kSum),
                            "allreduce does not support dtype Byte"));
    RETURN_IF_ERROR(refused(comm->AllReduce(at::ones({4}, at::kInt), ReduceOp::kAvg),
                            "allreduce average needs a floating dtype"));
    RETURN_IF_ERROR(refused(comm->AllGather(at::ones({3}), at::zeros({5})),
                            "allgather output needs 6 elements of Float, got 5 of Float"));
    RETURN_IF_ERROR(refused(comm->AllGather(at::ones({3}), at::zeros({6}, at::kDouble)),
                            "allgather output needs 6 elements of Float, got 6 of Double"));
    at::Tensor t = at::full({8}, float(rank + 1));
    RETURN_IF_ERROR(comm->AllReduce(t, ReduceOp::kSum)->Wait());
    return Expect(t.eq(3.0f).all().item<bool>(), "the allreduce after the refusals");
  });
  for (const auto& s : results) EXPECT_TRUE(s.ok()) << s;
}

// Work::Wait with a timeout shorter than the collective returns
// DeadlineExceeded and leaves the collective running: a later Wait gets its
// result. (Rank 1 joins the allreduce half a second late.)
TEST_P(CommunicatorConformanceTest, AWaitThatTimesOutLeavesTheCollectiveRunning) {
  constexpr int kWorld = 2;
  auto results = RunRanks(GetParam().mode, kWorld, [](int rank, rendezvous::Store* store) -> Status {
    ASSIGN_OR_RETURN(auto comm, Connect(GetParam().name, store, rank, kWorld));
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    at::Tensor t = at::full({8}, float(rank + 1));
    std::shared_ptr<Work> w = comm->AllReduce(t, ReduceOp::kSum);
    if (rank == 0) {
      Status early = w->Wait(std::chrono::milliseconds(50));
      RETURN_IF_ERROR(Expect(absl::IsDeadlineExceeded(early), "early wait: " + early.ToString()));
      RETURN_IF_ERROR(Expect(!w->IsCompleted(), "completed without rank 1"));
    }
    RETURN_IF_ERROR(w->Wait());
    return Expect(t.eq(3.0f).all().item<bool>(), "the sum after the timed-out wait");
  });
  for (const auto& s : results) EXPECT_TRUE(s.ok()) << s;
}

// AllReduceFrom: the elements the pieces cover are read from the pieces
// (the tensor holds NaN there), the result lands in all of the tensor, the
// sources are left as they were; bad pieces are refused before anything
// is queued, and the communicator goes on working.
TEST_P(CommunicatorConformanceTest, AllReduceFromReadsPiecesInsteadOfTheTensor) {
  constexpr int kWorld = 3;
  auto results = RunRanks(GetParam().mode, kWorld, [](int rank, rendezvous::Store* store) -> Status {
    ASSIGN_OR_RETURN(auto comm, Connect(GetParam().name, store, rank, kWorld));
    const int64_t n = 1000003;
    const at::Tensor input = at::arange(n, at::kFloat).remainder(977) * (rank + 1);
    at::Tensor t = input.clone();
    // Two pieces, given out of order; a gap between them stays in `t`.
    std::vector<InputPiece> pieces = {{600000, input.narrow(0, 600000, 1000).clone()},
                                      {17, input.narrow(0, 17, 400000).clone()}};
    const std::vector<at::Tensor> sources = {pieces[0].source.clone(), pieces[1].source.clone()};
    t.narrow(0, 600000, 1000).fill_(NAN);
    t.narrow(0, 17, 400000).fill_(NAN);
    RETURN_IF_ERROR(comm->AllReduceFrom(t, ReduceOp::kSum, pieces)->Wait());
    const at::Tensor want = at::arange(n, at::kFloat).remainder(977) * 6;
    RETURN_IF_ERROR(Expect(t.equal(want), "sum with pieces"));
    RETURN_IF_ERROR(Expect(pieces[0].source.equal(sources[0]) && pieces[1].source.equal(sources[1]),
                           "the sources were written"));
    // Refused: overlapping, outside, another dtype.
    at::Tensor u = at::ones({100});
    const std::vector<std::pair<std::vector<InputPiece>, std::string>> bad = {
        {{{10, at::ones({20})}, {25, at::ones({5})}}, "overlap"},
        {{{90, at::ones({20})}}, "outside the tensor"},
        {{{0, at::ones({5}, at::kDouble)}}, "Double"}};
    for (const auto& [p, word] : bad) {
      const Status s = comm->AllReduceFrom(u, ReduceOp::kSum, p)->Wait();
      RETURN_IF_ERROR(Expect(absl::IsInvalidArgument(s) && absl::StrContains(s.message(), word),
                             absl::StrCat("bad pieces (", word, "): ", s.ToString())));
    }
    RETURN_IF_ERROR(comm->AllReduce(u, ReduceOp::kSum)->Wait());
    return Expect(u.eq(kWorld).all().item<bool>(), "allreduce after the refusals");
  });
  for (const auto& s : results) EXPECT_TRUE(s.ok()) << s;
}

// What the fp16 and bf16 comm hooks put on the wire.
TEST_P(CommunicatorConformanceTest, AllReduceSumsAndAveragesHalfPrecision) {
  constexpr int kWorld = 3;
  auto results = RunRanks(GetParam().mode, kWorld, [](int rank, rendezvous::Store* store) -> Status {
    ASSIGN_OR_RETURN(auto comm, Connect(GetParam().name, store, rank, kWorld));
    // In chunks on both backends; 0.25 * (rank + 1) sums exactly.
    at::Tensor half = at::full({1300001}, 0.25 * (rank + 1), at::kHalf);
    at::Tensor bf16 = at::full({1300001}, 0.25 * (rank + 1), at::kBFloat16);
    at::Tensor half_avg = at::full({7}, float(rank + 1), at::kHalf);
    at::Tensor bf16_avg = at::full({7}, float(rank + 1), at::kBFloat16);
    auto w1 = comm->AllReduce(half, ReduceOp::kSum);
    auto w2 = comm->AllReduce(bf16, ReduceOp::kSum);
    auto w3 = comm->AllReduce(half_avg, ReduceOp::kAvg);
    auto w4 = comm->AllReduce(bf16_avg, ReduceOp::kAvg);
    for (const auto& w : {w1, w2, w3, w4}) RETURN_IF_ERROR(w->Wait());
    RETURN_IF_ERROR(Expect(half.eq(1.5).all().item<bool>(), "float16 sum"));
    RETURN_IF_ERROR(Expect(bf16.eq(1.5).all().item<bool>(), "bfloat16 sum"));
    RETURN_IF_ERROR(Expect(half_avg.eq(2).all().item<bool>(), "float16 average"));
    return Expect(bf16_avg.eq(2).all().item<bool>(), "bfloat16 average");
  });
  for (const auto& s : results) EXPECT_TRUE(s.ok()) << s;
}

TEST_P(CommunicatorConformanceTest, BroadcastCopiesRootTensorToEveryRank) {
  constexpr int kWorld = 3;
  auto results = RunRanks(GetParam().mode, kWorld, [](int rank, rendezvous::Store* store) -> Status {
    ASSIGN_OR_RETURN(auto comm, Connect(GetParam().name, store, rank, kWorld));
    at::Tensor t = at::arange(1000, at::kInt) * (rank + 1);
    RETURN_IF_ERROR(comm->Broadcast(t, 1)->Wait());
    return Expect(t.equal(at::arange(1000, at::kInt) * 2), "broadcast from rank 1");
  });
  for (const auto& s : results) EXPECT_TRUE(s.ok()) << s;
}

TEST_P(CommunicatorConformanceTest, AllGatherConcatenatesInRankOrderAndBarrierCompletes) {
  constexpr int kWorld = 2;
  auto results = RunRanks(GetParam().mode, kWorld, [](int rank, rendezvous::Store* store) -> Status {
    ASSIGN_OR_RETURN(auto comm, Connect(GetParam().name, store, rank, kWorld));
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
  auto results = RunRanks(GetParam().mode, kWorld, [&](int rank, rendezvous::Store* store) -> Status {
    ASSIGN_OR_RETURN(auto comm, Connect(GetParam().name, store, rank, kWorld, kTimeout));
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

// Ranks that issue different collectives at one point of their sequence
// (the invariant every communicator assumes, communicator.h) must not all
// return OK: shm compares what each rank entered and fails every rank at
// once with InvalidArgument saying `shm_says`; Gloo cannot tell and times
// out. Either way the communicator is broken: the next call is refused.
Status ExpectOutOfStep(Communicator* comm, const Status& s, const std::string& shm_says) {
  if (comm->backend() == "shm") {
    RETURN_IF_ERROR(Expect(absl::IsInvalidArgument(s) && absl::StrContains(s.message(), shm_says),
                           "want InvalidArgument '" + shm_says + "', got " + s.ToString()));
  } else {
    RETURN_IF_ERROR(Expect(!s.ok(), "a collective out of step returned OK"));
  }
  const Status later = comm->Barrier()->Wait();
  return Expect(absl::IsFailedPrecondition(later), "the call after it: " + later.ToString());
}

// Gloo's timeout (the way it notices) is short; shm does not wait for it.
constexpr auto kOutOfStepTimeout = std::chrono::seconds(3);

TEST_P(CommunicatorConformanceTest, DifferentCollectivesAtOneSeqFailEveryRank) {
  constexpr int kWorld = 2;
  auto results = RunRanks(GetParam().mode, kWorld, [](int rank, rendezvous::Store* store) -> Status {
    ASSIGN_OR_RETURN(auto comm, Connect(GetParam().name, store, rank, kWorld, kOutOfStepTimeout));
    at::Tensor t = at::full({256}, float(rank));  // 1 KiB
    RETURN_IF_ERROR(comm->AllReduce(t, ReduceOp::kSum)->Wait());  // #0, in step
    const Status s = rank == 0 ? comm->Broadcast(t, 0)->Wait() : comm->Barrier()->Wait();
    return ExpectOutOfStep(
        comm.get(), s,
        rank == 0 ? "shm broadcast #1 on rank 0: ranks are out of step: this rank is in broadcast "
                    "#1 (1024 bytes of Float, root 0), rank 1 is in barrier #1: every rank must "
                    "issue the same collectives, with the same sizes, dtypes and roots, in the "
                    "same order"
                  : "shm barrier #1 on rank 1: ranks are out of step: this rank is in barrier #1, "
                    "rank 0 is in broadcast #1 (1024 bytes of Float, root 0): every rank must");
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

TEST_P(CommunicatorConformanceTest, BroadcastWithDifferentRootsFails) {
  constexpr int kWorld = 2;
  auto results = RunRanks(GetParam().mode, kWorld, [](int rank, rendezvous::Store* store) -> Status {
    ASSIGN_OR_RETURN(auto comm, Connect(GetParam().name, store, rank, kWorld, kOutOfStepTimeout));
    at::Tensor t = at::full({256}, float(rank));
    RETURN_IF_ERROR(comm->AllReduce(t, ReduceOp::kSum)->Wait());
    const Status s = comm->Broadcast(t, rank)->Wait();  // each rank its own root
    return ExpectOutOfStep(
        comm.get(), s,
        absl::StrCat("this rank is in broadcast #1 (1024 bytes of Float, root ", rank, "), rank ",
                     1 - rank, " is in broadcast #1 (1024 bytes of Float, root ", 1 - rank, ")"));
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

TEST_P(CommunicatorConformanceTest, CreateNamesRanksThatNeverConnect) {
  constexpr int kWorld = 3;
  auto results = RunRanks(GetParam().mode, kWorld, [](int rank, rendezvous::Store* store) -> Status {
    if (rank == 2) return absl::OkStatus();
    auto comm = Connect(GetParam().name, store, rank, kWorld, std::chrono::seconds(30),
                        std::chrono::milliseconds(500));
    RETURN_IF_ERROR(Expect(absl::IsDeadlineExceeded(comm.status()), comm.status().ToString()));
    return Expect(comm.status().message().find("ranks [2]") != std::string::npos,
                  comm.status().ToString());
  });
  for (const auto& s : results) EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(All, CommunicatorConformanceTest,
                         ::testing::Values(Backend{"gloo", Mode::kThreads},
                                           Backend{"gloo", Mode::kProcesses},
                                           Backend{"shm", Mode::kThreads},
                                           Backend{"shm", Mode::kProcesses}),
                         [](const auto& info) {
                           return info.param.name +
                                  (info.param.mode == Mode::kThreads ? "Threads" : "Processes");
                         });

TEST(GlooCommunicatorTest, RejectsNonContiguousTensorWithoutRunning) {
  FakeStore store;
  auto comm = Connect("gloo", &store, 0, 1);
  ASSERT_TRUE(comm.ok()) << comm.status();
  at::Tensor t = at::ones({4, 4}).t();
  auto work = (*comm)->AllReduce(t, ReduceOp::kSum);
  EXPECT_TRUE(work->IsCompleted());
  EXPECT_TRUE(absl::IsInvalidArgument(work->status())) << work->status();
  EXPECT_TRUE(absl::IsInvalidArgument((*comm)->Broadcast(at::ones({2}), 3)->Wait()));
}

// ---- ShmCommunicator's own cases ----

using ::testing::HasSubstr;

StatusOr<std::unique_ptr<ShmCommunicator>> ConnectShm(rendezvous::Store* store, int rank,
                                                      int world, ShmOptions options = {}) {
  if (options.timeout == kDefaultCollectiveTimeout) options.timeout = std::chrono::seconds(30);
  options.connect_timeout = std::min<Duration>(options.connect_timeout, std::chrono::seconds(30));
  return ShmCommunicator::Create(store, rank, world, options);
}

// 1 KB slots (512-byte halves): every collective runs in many chunks, the
// halves alternate across collectives of different kinds, and odd sizes
// leave ragged last chunks and uneven per-rank reduction ranges.
TEST(ShmCommunicatorTest, MixedCollectivesThroughTinySlotsGiveExactResults) {
  constexpr int kWorld = 3;
  auto results = RunRanks(Mode::kThreads, kWorld, [](int rank, rendezvous::Store* store) -> Status {
    ShmOptions options;
    options.slot_bytes = 1000;  // Rounded up to 1024.
    ASSIGN_OR_RETURN(auto comm, ConnectShm(store, rank, kWorld, options));
    for (int round = 0; round < 3; ++round) {
      at::Tensor d = at::arange(10007, at::kDouble) * (rank + 1);
      at::Tensor i = at::arange(2001, at::kInt) + rank;
      at::Tensor b = at::arange(1250, at::kInt) * (rank + 7);
      at::Tensor in = at::arange(301, at::kFloat) + 1000 * rank;
      at::Tensor out = at::empty({301 * kWorld});
      auto w1 = comm->AllReduce(d, ReduceOp::kSum);
      auto w2 = comm->Broadcast(b, 2);
      auto w3 = comm->AllReduce(i, ReduceOp::kSum);
      auto w4 = comm->AllGather(in, out);
      auto w5 = comm->Barrier();
      for (auto* w : {&w1, &w2, &w3, &w4, &w5}) RETURN_IF_ERROR((*w)->Wait());
      RETURN_IF_ERROR(Expect(d.equal(at::arange(10007, at::kDouble) * 6), "double sum"));
      RETURN_IF_ERROR(Expect(i.equal(at::arange(2001, at::kInt) * 3 + 3), "int sum"));
      RETURN_IF_ERROR(Expect(b.equal(at::arange(1250, at::kInt) * 9), "broadcast from 2"));
      at::Tensor want = at::cat({at::arange(301, at::kFloat), at::arange(301, at::kFloat) + 1000,
                                 at::arange(301, at::kFloat) + 2000});
      RETURN_IF_ERROR(Expect(out.equal(want), "allgather"));
    }
    return absl::OkStatus();
  });
  for (const auto& s : results) EXPECT_TRUE(s.ok()) << s;
}

// Bucket memory: tensors inside a region are reduced in place across the
// ranks' buffers (no staging slots), for any offset, size and world, with
// the exact results of the slot path; ordinary tensors still work between
// them; a region goes when its last tensor does.
TEST(ShmCommunicatorTest, BucketMemoryIsReducedInPlaceWithExactResults) {
  for (int world : {2, 3, 5}) {
    for (Mode mode : {Mode::kThreads, Mode::kProcesses}) {
      auto results = RunRanks(mode, world, [world](int rank, rendezvous::Store* store) -> Status {
        ShmOptions options;
        options.slot_bytes = 4096;  // The ordinary path in many chunks.
        ASSIGN_OR_RETURN(auto comm, ConnectShm(store, rank, world, options));
        RETURN_IF_ERROR(Expect(comm->FusedAverage(), "shm averages in its reduction"));
        constexpr int64_t kElems = 300007;  // Odd: uneven per-rank slices.
        ASSIGN_OR_RETURN(at::Tensor region, comm->AllocateBucketMemory(kElems, at::kFloat));
        RETURN_IF_ERROR(Expect(region.defined() && region.numel() == kElems &&
                                   region.scalar_type() == at::kFloat,
                               "a float region of the size asked for"));
        RETURN_IF_ERROR(Expect(region.eq(0).all().item<bool>(), "the region starts zeroed"));
        ASSIGN_OR_RETURN(at::Tensor doubles, comm->AllocateBucketMemory(1001, at::kDouble));
        for (int round = 0; round < 3; ++round) {
          // Two buckets at different offsets of one region, like the
          // Reducer's, one averaged and one summed, and a double region.
          at::Tensor head = region.narrow(0, 0, 1000);
          at::Tensor tail = region.narrow(0, 1000, kElems - 1000);
          head.copy_(at::arange(1000, at::kFloat) * (rank + 1) + round);
          tail.copy_(at::full({kElems - 1000}, static_cast<float>(rank)));
          doubles.copy_(at::arange(1001, at::kDouble) * (rank + 1));
          at::Tensor ordinary = at::arange(5000, at::kInt) + rank;
          auto w1 = comm->AllReduce(head, ReduceOp::kAvg);
          auto w2 = comm->AllReduce(ordinary, ReduceOp::kSum);
          auto w3 = comm->AllReduce(tail, ReduceOp::kSum);
          auto w4 = comm->AllReduce(doubles, ReduceOp::kSum);
          for (auto* w : {&w1, &w2, &w3, &w4}) RETURN_IF_ERROR((*w)->Wait());
          const double ranks_sum = world * (world + 1) / 2.0;  // sum of rank + 1
          at::Tensor want_head = (at::arange(1000, at::kFloat) * ranks_sum + world * round) / world;
          RETURN_IF_ERROR(Expect(head.allclose(want_head), "averaged bucket at offset 0"));
          RETURN_IF_ERROR(Expect(tail.eq(world * (world - 1) / 2.0).all().item<bool>(),
                                 "summed bucket at offset 1000"));
          RETURN_IF_ERROR(Expect(doubles.equal(at::arange(1001, at::kDouble) * ranks_sum),
                                 "double region"));
          RETURN_IF_ERROR(Expect(ordinary.equal(at::arange(5000, at::kInt) * world +
                                                world * (world - 1) / 2),
                                 "ordinary tensor between region tensors"));
        }
        // The three region tensors of each round went in place, the
        // ordinary one through the slots.
        return Expect(comm->in_place_allreduces() == 9,
                      absl::StrCat("in-place allreduces: ", comm->in_place_allreduces(), ", want 9"));
      });
      for (int r = 0; r < world; ++r) {
        EXPECT_TRUE(results[r].ok()) << "world " << world << " rank " << r << ": " << results[r];
      }
    }
  }
}

// float32 buckets whose per-rank slice is at least kStreamingMinBytes (the
// size from which the copy into the slots streams, ddp/streaming.h; the
// reduction itself writes with ordinary stores) are reduced in one pass:
// sums and averages of whole numbers are exact there, and every rank ends
// with every slice.
TEST(ShmCommunicatorTest, LargeFloatBucketsStreamWithExactResults) {
  for (int world : {2, 3}) {
    auto results = RunRanks(Mode::kProcesses, world, [world](int rank, rendezvous::Store* store) -> Status {
      ASSIGN_OR_RETURN(auto comm, ConnectShm(store, rank, world, ShmOptions{}));
      // A slice per rank just over the bar, plus a remainder: uneven slices.
      const int64_t elems = kStreamingMinBytes / 4 * world + 7;
      ASSIGN_OR_RETURN(at::Tensor region, comm->AllocateBucketMemory(elems + 3, at::kFloat));
      RETURN_IF_ERROR(Expect(region.defined(), "bucket memory"));
      // At an offset of 3 floats: the slices start off a 32-byte boundary.
      at::Tensor bucket = region.narrow(0, 3, elems);
      const at::Tensor pattern = at::arange(elems, at::kFloat).remainder(1000);
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        bucket.copy_(pattern * (rank + 1));
        RETURN_IF_ERROR(comm->AllReduce(bucket, op)->Wait());
        const double ranks_sum = world * (world + 1) / 2.0;
        const at::Tensor want = op == ReduceOp::kSum ? pattern * ranks_sum : pattern * ranks_sum / world;
        RETURN_IF_ERROR(Expect(op == ReduceOp::kSum ? bucket.equal(want) : bucket.allclose(want, 1e-6, 0),
                               absl::StrCat(op == ReduceOp::kSum ? "sum" : "average", " of ", elems,
                                            " floats over ", world, " ranks")));
      }
      return Expect(comm->in_place_allreduces() == 2, "both went in place");
    });
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(results[r].ok()) << "world " << world << " rank " << r << ": " << results[r];
    }
  }
}

// In bucket memory shm reads the pieces inside this rank's slice in place
// (the counter says how many elements), copies in the parts outside it, and
// the results are exact; OwnShare names the slice only for float32 tensors
// in bucket memory.
TEST(ShmCommunicatorTest, AllReduceFromReadsTheOwnSliceInPlaceInBucketMemory) {
  for (int world : {2, 3}) {
    auto results = RunRanks(Mode::kProcesses, world, [world](int rank, rendezvous::Store* store) -> Status {
      ASSIGN_OR_RETURN(auto comm, ConnectShm(store, rank, world, ShmOptions{}));
      const int64_t elems = 300007;
      ASSIGN_OR_RETURN(at::Tensor region, comm->AllocateBucketMemory(elems + 3, at::kFloat));
      RETURN_IF_ERROR(Expect(region.defined(), "bucket memory"));
      at::Tensor bucket = region.narrow(0, 3, elems);
      const int64_t lo = elems * rank / world, hi = elems * (rank + 1) / world;
      const auto share = comm->OwnShare(bucket);
      RETURN_IF_ERROR(Expect(share.first == lo && share.second == hi,
                             absl::StrCat("own share [", share.first, ", ", share.second, ")")));
      RETURN_IF_ERROR(Expect(comm->OwnShare(at::zeros({elems})) == std::make_pair(int64_t{0}, int64_t{0}),
                             "a share of ordinary memory"));
      ASSIGN_OR_RETURN(at::Tensor ints, comm->AllocateBucketMemory(64, at::kInt));
      RETURN_IF_ERROR(Expect(comm->OwnShare(ints) == std::make_pair(int64_t{0}, int64_t{0}),
                             "a share of an int32 tensor"));
      const at::Tensor input = at::arange(elems, at::kFloat).remainder(1000) * (rank + 1);
      // One piece from before the slice into it (rank 0: from its start),
      // a gap of 10 elements left in the bucket, one piece from there to
      // past the slice's end.
      const int64_t a = std::max<int64_t>(0, lo - 100), mid = (lo + hi) / 2;
      const int64_t b = std::min<int64_t>(elems, hi + 100);
      std::vector<InputPiece> pieces = {{a, input.narrow(0, a, mid - a).clone()},
                                        {mid + 10, input.narrow(0, mid + 10, b - mid - 10).clone()}};
      uint64_t read_before = comm->elements_read_from_pieces();
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        bucket.copy_(input);
        bucket.narrow(0, a, mid - a).fill_(NAN);
        bucket.narrow(0, mid + 10, b - mid - 10).fill_(NAN);
        RETURN_IF_ERROR(comm->AllReduceFrom(bucket, op, pieces)->Wait());
        const double ranks_sum = world * (world + 1) / 2.0;
        const at::Tensor pattern = at::arange(elems, at::kFloat).remainder(1000);
        const at::Tensor want = op == ReduceOp::kSum ? pattern * ranks_sum : pattern * ranks_sum / world;
        RETURN_IF_ERROR(Expect(op == ReduceOp::kSum ? bucket.equal(want) : bucket.allclose(want, 1e-6, 0),
                               absl::StrCat(op == ReduceOp::kSum ? "sum" : "average", " over ", world,
                                            " ranks with pieces")));
      }
      const uint64_t read = comm->elements_read_from_pieces() - read_before;
      RETURN_IF_ERROR(Expect(read == static_cast<uint64_t>(2 * (hi - lo - 10)),
                             absl::StrCat(read, " elements read in place, want ", 2 * (hi - lo - 10))));
      return Expect(comm->in_place_allreduces() == 2, "both went in place");
    });
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(results[r].ok()) << "world " << world << " rank " << r << ": " << results[r];
    }
  }
}

// The divided sum the hierarchical host step uses: in bucket memory and in
// ordinary memory (through the slots), float32 and float64, the sum divided
// by the divisor given, not by the world; a divisor below 1, or one on an
// integer tensor, is refused naming it.
TEST(ShmCommunicatorTest, AllReduceDividedFromDividesTheSumByTheDivisorGiven) {
  constexpr int kWorld = 2;
  auto results = RunRanks(Mode::kProcesses, kWorld, [](int rank, rendezvous::Store* store) -> Status {
    ASSIGN_OR_RETURN(auto comm, ConnectShm(store, rank, kWorld, ShmOptions{}));
    ASSIGN_OR_RETURN(at::Tensor region, comm->AllocateBucketMemory(100003, at::kFloat));
    RETURN_IF_ERROR(Expect(region.defined(), "bucket memory"));
    at::Tensor plain = at::empty({70001}, at::kDouble);
    for (at::Tensor t : {region, plain}) {
      t.fill_(double(rank + 1) * 5);  // 5 and 10: the sum is 15
      RETURN_IF_ERROR(comm->AllReduceDividedFrom(t, 6.0, {})->Wait());
      RETURN_IF_ERROR(Expect(t.eq(2.5).all().item<bool>(),
                             absl::StrCat("15 / 6 in ", std::string(t.dtype().name()), ", got ",
                                          t.flatten()[0].item<double>())));
    }
    at::Tensor ints = at::ones({8}, at::kInt);
    Status s = comm->AllReduceDividedFrom(ints, 2.0, {})->Wait();
    RETURN_IF_ERROR(Expect(absl::IsInvalidArgument(s), absl::StrCat("int32 divided: ", s.ToString())));
    s = comm->AllReduceDividedFrom(region, 0.5, {})->Wait();
    RETURN_IF_ERROR(Expect(absl::IsInvalidArgument(s) && absl::StrContains(s.message(), "0.5"),
                           absl::StrCat("divisor 0.5: ", s.ToString())));
    region.fill_(1.0f);
    RETURN_IF_ERROR(comm->AllReduce(region, ReduceOp::kAvg)->Wait());
    return Expect(region.eq(1.0f).all().item<bool>(), "an average after the refusals");
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

// Bucket memory that rank 0 cannot create (a file-size limit makes its
// ftruncate fail) is refused on every rank alike: all get an undefined
// tensor (the Reducer then uses ordinary memory), and the communicator
// keeps working.
TEST(ShmCommunicatorTest, BucketMemoryOneRankCannotGetIsRefusedOnEveryRank) {
  constexpr int kWorld = 2;
  auto results = RunRanks(Mode::kProcesses, kWorld, [](int rank, rendezvous::Store* store) -> Status {
    auto lines = std::make_shared<std::vector<std::string>>();
    ShmOptions options;
    options.progress = [lines](const std::string& line) { lines->push_back(line); };
    ASSIGN_OR_RETURN(auto comm, ConnectShm(store, rank, kWorld, options));
    if (rank == 0) {
      signal(SIGXFSZ, SIG_IGN);  // ftruncate then fails with EFBIG instead.
      struct rlimit limit = {1 << 20, 1 << 20};
      RETURN_IF_ERROR(Expect(setrlimit(RLIMIT_FSIZE, &limit) == 0, "setrlimit"));
    }
    ASSIGN_OR_RETURN(at::Tensor region, comm->AllocateBucketMemory(4 << 20, at::kFloat));
    RETURN_IF_ERROR(Expect(!region.defined(), "a region rank 0 could not create was handed out"));
    // Every rank says so, naming the rank that could not.
    const std::string said = absl::StrJoin(*lines, "\n");
    RETURN_IF_ERROR(Expect(
        said.find(absl::StrCat("shm: rank ", rank, ": bucket region 1 not used, buckets stay in "
                               "ordinary memory (in-place allreduce off): rank 0: ")) !=
            std::string::npos,
        "no log line for the refused region: " + said));
    at::Tensor t = at::ones({1000});
    RETURN_IF_ERROR(comm->AllReduce(t, ReduceOp::kSum)->Wait());
    return Expect(t.eq(kWorld).all().item<bool>(), "allreduce after the refusal");
  });
  for (const auto& s : results) EXPECT_TRUE(s.ok()) << s;
}

// Ranks that disagree on where the tensor is (one in bucket memory, one
// not; or another offset) fail the collective naming both placements,
// instead of reducing the wrong bytes.
TEST(ShmCommunicatorTest, RanksThatDisagreeOnTheBucketFailNamingBothPlacements) {
  constexpr int kWorld = 2;
  auto results = RunRanks(Mode::kThreads, kWorld, [](int rank, rendezvous::Store* store) -> Status {
    ASSIGN_OR_RETURN(auto comm, ConnectShm(store, rank, kWorld));
    ASSIGN_OR_RETURN(at::Tensor region, comm->AllocateBucketMemory(4096, at::kFloat));
    at::Tensor t = rank == 0 ? region.narrow(0, 0, 1024) : at::zeros({1024});
    Status s = comm->AllReduce(t, ReduceOp::kSum)->Wait();
    RETURN_IF_ERROR(Expect(absl::IsInvalidArgument(s), "expected InvalidArgument: " + s.ToString()));
    const std::string m(s.message());
    RETURN_IF_ERROR(Expect(m.find("ranks disagree on the tensor") != std::string::npos &&
                               m.find("4096 bytes of Float (sum) in bucket region 1 at offset 0") !=
                                   std::string::npos &&
                               m.find("4096 bytes of Float (sum) in ordinary memory") !=
                                   std::string::npos,
                           "error does not name both placements: " + m));
    return absl::OkStatus();
  });
  for (const auto& s : results) EXPECT_TRUE(s.ok()) << s;
}

// A rank whose process dies is named at once, not after the timeout: the
// waiting ranks check their peers' pids (a zombie counts as dead).
TEST(ShmCommunicatorTest, KilledPeerIsNamedLongBeforeTheTimeout) {
  constexpr int kWorld = 2;
  constexpr auto kTimeout = std::chrono::seconds(60);
  auto results = RunRanks(Mode::kProcesses, kWorld, [&](int rank, rendezvous::Store* store) -> Status {
    ShmOptions options;
    options.timeout = kTimeout;
    ASSIGN_OR_RETURN(auto comm, ConnectShm(store, rank, kWorld, options));
    at::Tensor t = at::ones({1 << 20});
    RETURN_IF_ERROR(comm->AllReduce(t, ReduceOp::kSum)->Wait());
    if (rank == 1) raise(SIGKILL);  // Dies before the second allreduce.
    const auto start = std::chrono::steady_clock::now();
    Status s = comm->AllReduce(t, ReduceOp::kSum)->Wait();
    const auto elapsed = std::chrono::steady_clock::now() - start;
    RETURN_IF_ERROR(Expect(absl::IsUnavailable(s), "expected Unavailable: " + s.ToString()));
    RETURN_IF_ERROR(Expect(s.message().find("rank 1 (pid ") != std::string::npos &&
                               s.message().find(") exited") != std::string::npos,
                           "error does not name rank 1's process: " + s.ToString()));
    RETURN_IF_ERROR(Expect(elapsed < kTimeout / 2, "the death was found only by the timeout"));
    Status later = comm->Barrier()->Wait();
    return Expect(absl::IsFailedPrecondition(later), "later collective: " + later.ToString());
  });
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_FALSE(results[1].ok()) << "rank 1 was meant to die";
}

// A rank that comes after its peer gave up the collective (the peer's
// phase was already counted) fails it too, naming the peer, instead of
// passing the barrier and writing into a buffer nobody waits on. The peer
// waited for this rank: it marks no lost peer (a rank the peer had waited
// for instead would be marked, as the peer marks it).
TEST(ShmCommunicatorTest, ARankThatComesAfterItsPeerGaveUpFailsToo) {
  constexpr int kWorld = 2;
  auto results = RunRanks(Mode::kThreads, kWorld, [&](int rank, rendezvous::Store* store) -> Status {
    ShmOptions options;
    options.timeout = std::chrono::milliseconds(500);
    ASSIGN_OR_RETURN(auto comm, ConnectShm(store, rank, kWorld, options));
    at::Tensor t = at::ones({4096});
    RETURN_IF_ERROR(comm->AllReduce(t, ReduceOp::kSum)->Wait());
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    Status s = comm->AllReduce(t, ReduceOp::kSum)->Wait();
    if (rank == 0) {
      return Expect(absl::IsDeadlineExceeded(s), "rank 0: " + s.ToString());
    }
    // (Before, it passed the barrier rank 0 had counted itself at, then
    // waited at the next for rank 0, gone, and blamed it.)
    RETURN_IF_ERROR(Expect(absl::IsAborted(s), "rank 1: " + s.ToString()));
    return Expect(s.message().find("rank 0 gave up on it first, waiting for this rank") !=
                      std::string::npos,
                  s.ToString());
  });
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_TRUE(results[1].ok()) << results[1];
}

// A rank that has given up is seen by a peer still waiting at the barrier,
// at once, not after the peer's own timeout: rank 2 never comes, rank 0
// (0.5 s) gives up on it, and rank 1 (60 s) stops waiting for rank 2 too,
// saying rank 0 gave up first, instead of its own timeout a minute later
// (still DeadlineExceeded naming rank 2, as MissingRankFailsOthers...
// wants of every waiting rank). The timeouts say what rank 2 last entered.
TEST(ShmCommunicatorTest, PeerThatGaveUpIsSeenWhileWaiting) {
  constexpr int kWorld = 3;
  auto results = RunRanks(Mode::kThreads, kWorld, [](int rank, rendezvous::Store* store) -> Status {
    ShmOptions options;
    options.timeout = rank == 0 ? std::chrono::milliseconds(500) : std::chrono::seconds(60);
    options.blame_payload = true;
    ASSIGN_OR_RETURN(auto comm, ConnectShm(store, rank, kWorld, options));
    at::Tensor t = at::ones({1000});
    RETURN_IF_ERROR(comm->AllReduce(t, ReduceOp::kSum)->Wait());  // #0, every rank
    if (rank == 2) {
      return store->Wait({"test/done/0", "test/done/1"}, std::chrono::seconds(120));
    }
    const Status s = comm->AllReduce(t, ReduceOp::kSum)->Wait();
    RETURN_IF_ERROR(store->Set(absl::StrCat("test/done/", rank), "1"));
    if (rank == 0) {
      RETURN_IF_ERROR(Expect(absl::IsDeadlineExceeded(s), "rank 0: " + s.ToString()));
      return Expect(absl::StrContains(s.message(), "ranks [2] did not arrive within 0.5 s (rank 2 "
                                                   "last entered allreduce #0)"),
                    "rank 0: " + s.ToString());
    }
    RETURN_IF_ERROR(Expect(absl::IsDeadlineExceeded(s), "rank 1: " + s.ToString()));
    RETURN_IF_ERROR(Expect(LostPeerOf(s) == 2, "rank 1 blames rank 2: " + s.ToString()));
    return Expect(absl::StrContains(s.message(),
                                    "shm allreduce #1 on rank 1: ranks [2] did not arrive (rank 2 "
                                    "last entered allreduce #0); rank 0 gave up on it first, "
                                    "waiting for rank 2"),
                  "rank 1 did not see rank 0 give up: " + s.ToString());
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

// ---- Ranks out of step: every rank publishes what it entered (kind,
// size, dtype, root or divisor) and compares the others' after the first
// barrier; all fail together, naming both, and blame no peer as lost ----

// Two ranks that agree on allreduce #0 and then run `call` (#1 and on):
// each rank's first Work must fail with InvalidArgument containing
// `want[rank]`, no peer marked lost, and the next call is refused.
void ExpectShmOutOfStep(
    const std::function<std::vector<std::shared_ptr<Work>>(int rank, ShmCommunicator* comm)>& call,
    const std::vector<std::string>& want) {
  constexpr int kWorld = 2;
  auto results = RunRanks(Mode::kThreads, kWorld, [&](int rank, rendezvous::Store* store) -> Status {
    ShmOptions options;
    options.timeout = std::chrono::seconds(3);  // shm must not need it
    options.blame_payload = true;
    ASSIGN_OR_RETURN(auto comm, ConnectShm(store, rank, kWorld, options));
    at::Tensor t = at::ones({1000});
    RETURN_IF_ERROR(comm->AllReduce(t, ReduceOp::kSum)->Wait());
    const std::vector<std::shared_ptr<Work>> works = call(rank, comm.get());
    const Status s = works.front()->Wait();
    RETURN_IF_ERROR(Expect(absl::IsInvalidArgument(s) && absl::StrContains(s.message(), want[rank]),
                           "want InvalidArgument '" + want[rank] + "', got " + s.ToString()));
    RETURN_IF_ERROR(Expect(LostPeerOf(s) == -1,
                           absl::StrCat("rank ", LostPeerOf(s), " was blamed as lost")));
    for (const auto& w : works) {
      if (w == works.front()) continue;
      const Status later = w->Wait();
      RETURN_IF_ERROR(Expect(absl::IsFailedPrecondition(later), "a queued call: " + later.ToString()));
    }
    const Status later = comm->Barrier()->Wait();
    return Expect(absl::IsFailedPrecondition(later), "the call after it: " + later.ToString());
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

// The review's case: rank 0 in broadcast #1 while rank 1 is in barrier #1
// both passed the one barrier, and every allreduce after it read the other
// half of the peer's slot (the halves had drifted): wrong sums, OK status.
TEST(ShmCommunicatorTest, OutOfStepBroadcastDoesNotCorruptLaterAllReduces) {
  constexpr int kWorld = 2;
  auto results = RunRanks(Mode::kProcesses, kWorld, [](int rank, rendezvous::Store* store) -> Status {
    ShmOptions options;
    options.timeout = std::chrono::seconds(3);
    ASSIGN_OR_RETURN(auto comm, ConnectShm(store, rank, kWorld, options));
    at::Tensor t = at::full({1000}, float(100 + rank));
    RETURN_IF_ERROR(comm->AllReduce(t, ReduceOp::kSum)->Wait());
    at::Tensor b = at::full({256}, float(7));
    const Status s = rank == 0 ? comm->Broadcast(b, 0)->Wait() : comm->Barrier()->Wait();
    RETURN_IF_ERROR(Expect(!s.ok(), "the call out of step returned OK"));
    for (int i = 0; i < 3; ++i) {
      at::Tensor u = at::full({1000}, float(rank + 1));
      const Status later = comm->AllReduce(u, ReduceOp::kSum)->Wait();
      if (later.ok() && !u.eq(3.0f).all().item<bool>()) {
        return absl::InternalError(absl::StrCat("allreduce ", i, " after it returned OK with sum ",
                                                u[0].item<float>(), ", want 3"));
      }
      RETURN_IF_ERROR(Expect(absl::IsFailedPrecondition(later),
                             absl::StrCat("allreduce ", i, " after it: ", later.ToString())));
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

TEST(ShmCommunicatorTest, BroadcastOfDifferentSizesFailsNamingBoth) {
  ExpectShmOutOfStep(
      [](int rank, ShmCommunicator* comm) {
        return std::vector<std::shared_ptr<Work>>{
            comm->Broadcast(at::zeros({rank == 0 ? 256 : 512}), 0)};
      },
      {"shm broadcast #1 on rank 0: ranks are out of step: this rank is in broadcast #1 (1024 "
       "bytes of Float, root 0), rank 1 is in broadcast #1 (2048 bytes of Float, root 0): every "
       "rank must issue the same collectives, with the same sizes, dtypes and roots, in the same "
       "order",
       "shm broadcast #1 on rank 1: ranks are out of step: this rank is in broadcast #1 (2048 "
       "bytes of Float, root 0), rank 0 is in broadcast #1 (1024 bytes of Float, root 0)"});
}

TEST(ShmCommunicatorTest, AllGatherOfDifferentSizesFailsNamingBoth) {
  ExpectShmOutOfStep(
      [](int rank, ShmCommunicator* comm) {
        const int64_t n = rank == 0 ? 4 : 8;
        return std::vector<std::shared_ptr<Work>>{
            comm->AllGather(at::ones({n}, at::kDouble), at::empty({2 * n}, at::kDouble))};
      },
      {"this rank is in allgather #1 (32 bytes of Double from each rank), rank 1 is in allgather "
       "#1 (64 bytes of Double from each rank)",
       "this rank is in allgather #1 (64 bytes of Double from each rank), rank 0 is in allgather "
       "#1 (32 bytes of Double from each rank)"});
}

TEST(ShmCommunicatorTest, AllReduceAgainstBroadcastFailsNamingBoth) {
  ExpectShmOutOfStep(
      [](int rank, ShmCommunicator* comm) {
        at::Tensor t = at::ones({256});
        return std::vector<std::shared_ptr<Work>>{
            rank == 0 ? comm->AllReduce(t, ReduceOp::kSum) : comm->Broadcast(t, 0)};
      },
      {"shm allreduce #1 on rank 0: ranks are out of step: this rank is in allreduce #1 (1024 "
       "bytes of Float, sum), rank 1 is in broadcast #1 (1024 bytes of Float, root 0)",
       "shm broadcast #1 on rank 1: ranks are out of step: this rank is in broadcast #1 (1024 "
       "bytes of Float, root 0), rank 0 is in allreduce #1 (1024 bytes of Float, sum)"});
}

// An empty tensor skipped the barrier on the rank that had it: that rank
// went on one collective ahead of the other.
TEST(ShmCommunicatorTest, EmptyCollectiveOnOneRankFails) {
  ExpectShmOutOfStep(
      [](int rank, ShmCommunicator* comm) {
        at::Tensor t = rank == 0 ? at::ones({0}) : at::ones({4});
        return std::vector<std::shared_ptr<Work>>{comm->AllReduce(t, ReduceOp::kAvg)};
      },
      {"this rank is in allreduce #1 (0 bytes of Float, average), rank 1 is in allreduce #1 (16 "
       "bytes of Float, average)",
       "this rank is in allreduce #1 (16 bytes of Float, average), rank 0 is in allreduce #1 (0 "
       "bytes of Float, average)"});
}

// Rank 0 issues a broadcast that rank 1 skips: both fail at #1 naming what
// the other entered, and neither marks the other as a lost peer (both are
// alive; the program is wrong), nor waits out a timeout.
TEST(ShmCommunicatorTest, ARankOneCallAheadIsNamedNotBlamedAsLost) {
  ExpectShmOutOfStep(
      [](int rank, ShmCommunicator* comm) {
        at::Tensor t = at::ones({1000});
        if (rank == 1) return std::vector<std::shared_ptr<Work>>{comm->AllReduce(t, ReduceOp::kSum)};
        return std::vector<std::shared_ptr<Work>>{comm->Broadcast(at::ones({1000}), 0),
                                                  comm->AllReduce(t, ReduceOp::kSum)};
      },
      {"this rank is in broadcast #1 (4000 bytes of Float, root 0), rank 1 is in allreduce #1 "
       "(4000 bytes of Float, sum)",
       "this rank is in allreduce #1 (4000 bytes of Float, sum), rank 0 is in broadcast #1 (4000 "
       "bytes of Float, root 0)"});
}

// AllReduceDividedFrom's divisor is part of what the ranks agree on (the
// hierarchical host step divides by the whole world on every rank).
TEST(ShmCommunicatorTest, DivisorMismatchInAllReduceDividedFromFails) {
  ExpectShmOutOfStep(
      [](int rank, ShmCommunicator* comm) {
        auto region = comm->AllocateBucketMemory(1000, at::kFloat);
        EXPECT_TRUE(region.ok() && region->defined());
        return std::vector<std::shared_ptr<Work>>{
            comm->AllReduceDividedFrom(*region, rank == 0 ? 4.0 : 6.0, {})};
      },
      {"this rank is in allreduce #1 (4000 bytes of Float, sum divided by 4), rank 1 is in "
       "allreduce #1 (4000 bytes of Float, sum divided by 6)",
       "this rank is in allreduce #1 (4000 bytes of Float, sum divided by 6), rank 0 is in "
       "allreduce #1 (4000 bytes of Float, sum divided by 4)"});
}

// Rank 0's side of a bootstrap rank 1 was refused: it waited in vain.
Status RankOneNeverAttached(const Status& status) {
  RETURN_IF_ERROR(Expect(absl::IsDeadlineExceeded(status), status.ToString()));
  return Expect(status.message().find("ranks [1] never attached") != std::string::npos,
                status.ToString());
}

TEST(ShmCommunicatorTest, RankOnAnotherHostIsRefusedNamingBothHosts) {
  constexpr int kWorld = 2;
  auto results = RunRanks(Mode::kThreads, kWorld, [](int rank, rendezvous::Store* store) -> Status {
    ShmOptions options;
    options.hostname = rank == 0 ? "host-a" : "host-b";
    options.connect_timeout = std::chrono::seconds(1);
    auto comm = ShmCommunicator::Create(store, rank, kWorld, options);
    if (rank == 1) {
      RETURN_IF_ERROR(Expect(absl::IsFailedPrecondition(comm.status()), comm.status().ToString()));
      return Expect(comm.status().message().find("on host 'host-b' but rank 0 is on 'host-a'") !=
                        std::string::npos,
                    comm.status().ToString());
    }
    return RankOneNeverAttached(comm.status());
  });
  for (const auto& s : results) EXPECT_TRUE(s.ok()) << s;
}

// Every rank must pass the same slot_bytes (shm_communicator.h): one that
// does not is refused naming the segment's size and the one it expected,
// and the slot size rank 0 made it with against its own,
// and rank 0 names it as the rank that never attached.
TEST(ShmCommunicatorTest, RanksThatDisagreeOnSlotBytesAreRefusedNamingBoth) {
  constexpr int kWorld = 2;
  auto results = RunRanks(Mode::kThreads, kWorld, [](int rank, rendezvous::Store* store) -> Status {
    ShmOptions options;
    options.slot_bytes = rank == 0 ? 4096 : 8192;
    options.connect_timeout = std::chrono::seconds(1);
    auto comm = ShmCommunicator::Create(store, rank, kWorld, options);
    if (rank == 1) {
      RETURN_IF_ERROR(Expect(absl::IsInvalidArgument(comm.status()), comm.status().ToString()));
      return Expect(comm.status().message().find(
                        "has 8512 bytes, expected 16704: rank 0 made it for 2 ranks of 4096 "
                        "bytes each, this rank expects 2 of 8192 (do all ranks use the same "
                        "world size and sizes?)") != std::string::npos,
                    comm.status().ToString());
    }
    return RankOneNeverAttached(comm.status());
  });
  for (const auto& s : results) EXPECT_TRUE(s.ok()) << s;
}

// The tests that compare /dev/shm before and after look at a tmpfs of
// their own there: this thread leaves the process's mount namespace for a
// copy with a fresh tmpfs on /dev/shm, which the threads and processes it
// starts inherit (the destructor goes back). So another program's entries
// (podman's libpod_lock, a test running beside this one) cannot change what
// they compare. Without the privilege (not root) they compare the host's
// /dev/shm, which nothing else may touch meanwhile.
class PrivateDevShm {
 public:
  PrivateDevShm() {
    original_ = open("/proc/thread-self/ns/mnt", O_RDONLY | O_CLOEXEC);
    if (original_ < 0 || unshare(CLONE_NEWNS) != 0) return;
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
        mount("lockstep-test-shm", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=16m") == 0) {
      private_ = true;
    }
  }
  ~PrivateDevShm() {
    if (original_ < 0) return;
    if (setns(original_, CLONE_NEWNS) != 0) ADD_FAILURE() << "could not return to the mount namespace";
    close(original_);
  }
  bool is_private() const { return private_; }

 private:
  int original_ = -1;
  bool private_ = false;
};

std::set<std::string> DevShmEntries() {
  std::set<std::string> names;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* e = readdir(dir)) names.insert(e->d_name);
    closedir(dir);
  }
  return names;
}

TEST(ShmCommunicatorTest, SegmentHasNoNameInDevShm) {
  PrivateDevShm shm;
  const auto before = DevShmEntries();
  if (shm.is_private()) {
    EXPECT_EQ(before, (std::set<std::string>{".", ".."}));
  }
  FakeStore store;
  std::unique_ptr<ShmCommunicator> comms[2];
  std::thread other([&] {
    auto c = ConnectShm(&store, 1, 2);
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) comms[1] = std::move(*c);
  });
  auto c = ConnectShm(&store, 0, 2);
  other.join();
  ASSERT_TRUE(c.ok()) << c.status();
  comms[0] = std::move(*c);
  auto published = store.Get("shm/segment", std::chrono::seconds(1));
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_THAT(*published, testing::StartsWith(absl::StrCat(getpid(), ":")));
  EXPECT_EQ(DevShmEntries(), before) << "the segment appeared in /dev/shm";
  ASSERT_NE(comms[1], nullptr);
  at::Tensor a = at::ones({5}), b = at::ones({5});
  auto wa = comms[0]->AllReduce(a, ReduceOp::kAvg);
  auto wb = comms[1]->AllReduce(b, ReduceOp::kAvg);
  ASSERT_TRUE(wa->Wait().ok());
  ASSERT_TRUE(wb->Wait().ok());
  EXPECT_TRUE(a.equal(at::ones({5})));
}

// Ranks as processes, SIGKILLed at every moment of the bootstrap: before
// rank 0 creates the segment, after it published it and before the others
// attached (the moment that used to leak 8 MB), while they attach, and
// mid-collective. /dev/shm is as it was after each.
TEST(ShmCommunicatorTest, StopAtAnyMomentOfTheBootstrapLeavesDevShmAsItWas) {
  PrivateDevShm shm;
  const auto before = DevShmEntries();
  if (shm.is_private()) {
    EXPECT_EQ(before, (std::set<std::string>{".", ".."}));
  }
  auto spawn = [](const std::string& dir, int rank) {
    pid_t pid = fork();
    if (pid == 0) {
      auto store = rendezvous::FileStore::Open(dir);
      if (store.ok()) {
        auto comm = ConnectShm(store->get(), rank, 2);
        at::Tensor t = at::ones({1 << 20});
        while (comm.ok() && (*comm)->AllReduce(t, ReduceOp::kSum)->Wait().ok()) {
        }
      }
      _exit(0);
    }
    return pid;
  };
  auto kill_all = [](const std::vector<pid_t>& pids) {
    for (pid_t pid : pids) kill(pid, SIGKILL);
    for (pid_t pid : pids) waitpid(pid, nullptr, 0);
  };
  // Rank 0 alone, killed once its segment is published (rank 1 never came).
  {
    const std::string dir = TempDir();
    pid_t rank0 = spawn(dir, 0);
    auto store = rendezvous::FileStore::Open(dir);
    ASSERT_TRUE(store.ok());
    EXPECT_TRUE((*store)->Get("shm/segment", std::chrono::seconds(30)).ok());
    kill_all({rank0});
    EXPECT_EQ(DevShmEntries(), before) << "left behind by a rank 0 killed before anyone attached";
  }
  // Both ranks, killed after 0 to 50 ms: before, during and after attaching.
  for (int delay_ms : {0, 1, 2, 5, 10, 20, 50}) {
    const std::string dir = TempDir();
    std::vector<pid_t> pids = {spawn(dir, 0), spawn(dir, 1)};
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    kill_all(pids);
    EXPECT_EQ(DevShmEntries(), before) << "left behind by a stop after " << delay_ms << " ms";
  }
}

TEST(ShmCommunicatorTest, RankZeroThatNeverComesIsNamed) {
  FakeStore store;
  ShmOptions options;
  options.connect_timeout = std::chrono::milliseconds(300);
  auto c = ShmCommunicator::Create(&store, 1, 2, options);
  EXPECT_TRUE(absl::IsDeadlineExceeded(c.status())) << c.status();
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("rank 1 waiting for rank 0's shared-memory segment: ranks [0] did not "
                        "arrive within 0.3 s"));
}

// ---- HierarchicalCommunicator: two "hosts" of two ranks (separate shm
// segments per node, Gloo between the two leaders, all on loopback) ----

StatusOr<std::unique_ptr<HierarchicalCommunicator>> ConnectHier(
    rendezvous::Store* store, int rank, int nodes, int per_node,
    Duration timeout = std::chrono::seconds(30)) {
  HierarchicalLayout layout;
  layout.rank = rank;
  layout.world_size = nodes * per_node;
  layout.local_rank = rank % per_node;
  layout.local_world_size = per_node;
  layout.node_rank = rank / per_node;
  layout.num_nodes = nodes;
  HierarchicalOptions options;
  options.timeout = timeout;
  options.connect_timeout = std::chrono::seconds(30);
  return HierarchicalCommunicator::Create(store, layout, options);
}

TEST(HierarchicalCommunicatorTest, TwoHostsOfTwoRanksGiveTheResultsOfOneWorld) {
  constexpr int kWorld = 4;
  for (Mode mode : {Mode::kThreads, Mode::kProcesses}) {
    auto results = RunRanks(mode, kWorld, [](int rank, rendezvous::Store* store) -> Status {
      ASSIGN_OR_RETURN(auto comm, ConnectHier(store, rank, 2, 2));
      RETURN_IF_ERROR(Expect(comm->backend() == "shm+gloo", comm->backend()));
      at::Tensor sum = at::full({1300001}, float(rank + 1));
      at::Tensor avg = at::full({7}, double(rank + 1));
      at::Tensor ints = at::full({5}, int64_t(rank + 1), at::kLong);
      at::Tensor b = at::arange(1000, at::kInt) * (rank + 1);
      at::Tensor in = at::full({3}, float(rank));
      at::Tensor out = at::empty({3 * kWorld});
      at::Tensor half = at::full({9}, 0.5 * (rank + 1), at::kHalf);
      at::Tensor bf16 = at::full({9}, 0.5 * (rank + 1), at::kBFloat16);
      auto w1 = comm->AllReduce(sum, ReduceOp::kSum);
      auto w2 = comm->AllReduce(avg, ReduceOp::kAvg);
      auto w3 = comm->AllReduce(ints, ReduceOp::kSum);
      auto w4 = comm->Broadcast(b, 3);  // Local rank 1 of node 1.
      auto w5 = comm->AllGather(in, out);
      auto w6 = comm->Barrier();
      auto w7 = comm->AllReduce(half, ReduceOp::kSum);
      auto w8 = comm->AllReduce(bf16, ReduceOp::kAvg);
      for (auto* w : {&w1, &w2, &w3, &w4, &w5, &w6, &w7, &w8}) RETURN_IF_ERROR((*w)->Wait());
      RETURN_IF_ERROR(Expect(half.eq(5).all().item<bool>(), "float16 sum"));
      RETURN_IF_ERROR(Expect(bf16.eq(1.25).all().item<bool>(), "bfloat16 average"));
      RETURN_IF_ERROR(Expect(sum.eq(10.0f).all().item<bool>(), "float sum"));
      RETURN_IF_ERROR(Expect(avg.eq(2.5).all().item<bool>(), "double average"));
      RETURN_IF_ERROR(Expect(ints.eq(10).all().item<bool>(), "int64 sum"));
      RETURN_IF_ERROR(Expect(b.equal(at::arange(1000, at::kInt) * 4), "broadcast from rank 3"));
      return Expect(out.equal(at::arange(kWorld, at::kFloat).repeat_interleave(3)),
                    "allgather in global rank order");
    });
    for (const auto& s : results) EXPECT_TRUE(s.ok()) << s;
  }
}

// Bucket memory is the host's shm bucket memory (the Reducer's buckets then
// take the in-place host step); an allreduce of tensors inside it still
// gives the global sum and average.
TEST(HierarchicalCommunicatorTest, BucketMemoryComesFromTheHostAndReducesGlobally) {
  constexpr int kWorld = 4;
  auto results = RunRanks(Mode::kProcesses, kWorld, [](int rank, rendezvous::Store* store) -> Status {
    ASSIGN_OR_RETURN(auto comm, ConnectHier(store, rank, 2, 2));
    ASSIGN_OR_RETURN(at::Tensor region, comm->AllocateBucketMemory(1 << 20, at::kFloat));
    RETURN_IF_ERROR(Expect(region.defined(), "no bucket memory from the host's shm"));
    at::Tensor sum = region.narrow(0, 0, 300001);
    at::Tensor avg = region.narrow(0, 300032, 1000);
    sum.fill_(float(rank + 1));
    avg.fill_(float(2 * rank));
    RETURN_IF_ERROR(comm->AllReduce(sum, ReduceOp::kSum)->Wait());
    RETURN_IF_ERROR(comm->AllReduce(avg, ReduceOp::kAvg)->Wait());
    RETURN_IF_ERROR(Expect(sum.eq(10.0f).all().item<bool>(), "sum in bucket memory"));
    return Expect(avg.eq(3.0f).all().item<bool>(), "average in bucket memory");
  });
  for (const auto& s : results) EXPECT_TRUE(s.ok()) << s;
}

// The own share of a bucket is the slice this rank reduces on its host
// (local rank of 2 there), and AllReduceFrom reads it from the pieces in
// place: the bucket holds NaN where the pieces cover, yet every rank ends
// with the global sum and average, and the host step counted exactly the
// share's elements as read in place, per allreduce.
TEST(HierarchicalCommunicatorTest, AllReduceFromReadsTheOwnShareOnTheHostInPlace) {
  constexpr int kWorld = 4, kPerNode = 2;
  auto results = RunRanks(Mode::kProcesses, kWorld, [](int rank, rendezvous::Store* store) -> Status {
    ASSIGN_OR_RETURN(auto comm, ConnectHier(store, rank, kWorld / kPerNode, kPerNode));
    const int64_t elems = 200003;
    ASSIGN_OR_RETURN(at::Tensor region, comm->AllocateBucketMemory(elems + 5, at::kFloat));
    RETURN_IF_ERROR(Expect(region.defined(), "bucket memory"));
    at::Tensor bucket = region.narrow(0, 5, elems);
    const int local = rank % kPerNode;
    const int64_t lo = elems * local / kPerNode, hi = elems * (local + 1) / kPerNode;
    const auto share = comm->OwnShare(bucket);
    RETURN_IF_ERROR(Expect(share.first == lo && share.second == hi,
                           absl::StrCat("own share [", share.first, ", ", share.second,
                                        "), want the host slice [", lo, ", ", hi, ")")));
    RETURN_IF_ERROR(Expect(comm->OwnShare(at::zeros({elems})) == std::make_pair(int64_t{0}, int64_t{0}),
                           "a share of ordinary memory"));
    const at::Tensor pattern = at::arange(elems, at::kFloat).remainder(997);
    const at::Tensor input = pattern * (rank + 1);
    std::vector<InputPiece> pieces = {{lo, input.narrow(0, lo, hi - lo).clone()}};
    const uint64_t read_before = comm->host_elements_read_from_pieces();
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      bucket.copy_(input);
      bucket.narrow(0, lo, hi - lo).fill_(NAN);
      RETURN_IF_ERROR(comm->AllReduceFrom(bucket, op, pieces)->Wait());
      const double ranks_sum = kWorld * (kWorld + 1) / 2.0;
      const at::Tensor want = op == ReduceOp::kSum ? pattern * ranks_sum : pattern * ranks_sum / kWorld;
      RETURN_IF_ERROR(Expect(bucket.allclose(want, 1e-6, 0),
                             absl::StrCat(op == ReduceOp::kSum ? "sum" : "average",
                                          " over 2 hosts with the own share as a piece")));
    }
    const uint64_t read = comm->host_elements_read_from_pieces() - read_before;
    RETURN_IF_ERROR(Expect(read == static_cast<uint64_t>(2 * (hi - lo)),
                           absl::StrCat(read, " elements read in place, want ", 2 * (hi - lo))));
    // A piece the tensor cannot hold is refused before anything is queued,
    // and the communicator still works.
    auto bad = comm->AllReduceFrom(bucket, ReduceOp::kSum, {{elems - 1, at::zeros({2})}});
    RETURN_IF_ERROR(Expect(absl::IsInvalidArgument(bad->Wait()), "a piece past the end"));
    bucket.fill_(1.0f);
    RETURN_IF_ERROR(comm->AllReduce(bucket, ReduceOp::kSum)->Wait());
    return Expect(bucket.eq(float(kWorld)).all().item<bool>(), "an allreduce after the refusal");
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

// Rank 3 (node 1, local rank 1) never joins: its host's shm step names it in
// local ranks, and node 0's leader, left alone between hosts, names node 1.
TEST(HierarchicalCommunicatorTest, MissingRankFailsEveryRankSayingWhereItWasMissed) {
  constexpr int kWorld = 4;
  constexpr auto kTimeout = std::chrono::seconds(2);
  auto results = RunRanks(Mode::kProcesses, kWorld, [&](int rank, rendezvous::Store* store) -> Status {
    ASSIGN_OR_RETURN(auto comm, ConnectHier(store, rank, 2, 2, kTimeout));
    if (rank == 3) {
      return store->Wait({"test/done/0", "test/done/1", "test/done/2"}, std::chrono::seconds(60));
    }
    at::Tensor t = at::ones({1000});
    Status s = comm->AllReduce(t, ReduceOp::kSum)->Wait();
    RETURN_IF_ERROR(store->Set(absl::StrCat("test/done/", rank), "1"));
    RETURN_IF_ERROR(Expect(!s.ok(), absl::StrCat("rank ", rank, " succeeded")));
    const std::string m(s.message());
    if (rank == 2) {
      RETURN_IF_ERROR(Expect(m.find("on host 1 (local ranks)") != std::string::npos &&
                                 m.find("ranks [1]") != std::string::npos,
                             "rank 2: " + s.ToString()));
    }
    if (rank == 0) {
      RETURN_IF_ERROR(Expect(m.find("between hosts") != std::string::npos &&
                                 m.find("ranks [1]") != std::string::npos,
                             "rank 0: " + s.ToString()));
    }
    Status later = comm->Barrier()->Wait();
    return Expect(absl::IsFailedPrecondition(later), "later collective: " + later.ToString());
  });
  for (const auto& s : results) EXPECT_TRUE(s.ok()) << s;
}

TEST(HierarchicalCommunicatorTest, NonUniformLayoutIsRefusedWithTheNumbers) {
  FakeStore store;
  HierarchicalLayout layout;
  layout.rank = 1;
  layout.world_size = 3;
  layout.local_rank = 1;
  layout.local_world_size = 2;
  layout.node_rank = 0;
  layout.num_nodes = 2;
  auto comm = HierarchicalCommunicator::Create(&store, layout);
  EXPECT_TRUE(absl::IsInvalidArgument(comm.status())) << comm.status();
  EXPECT_THAT(std::string(comm.status().message()),
              HasSubstr("rank 1 of 3 is local rank 1 of 2 on node 0 of 2"));
}

}  // namespace
}  // namespace ddp
}  // namespace lockstep
