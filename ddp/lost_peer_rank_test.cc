// The lost-peer mark a worker leaves for its agent (common/worker_link.h)
// names a global rank, the one the coordinator blames, also when it comes
// from one of HierarchicalCommunicator's sub-communicators, whose ranks are
// a host's local ranks (shared memory) or node ranks (the leaders' Gloo).
#include <fcntl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/worker_link.h"
#include "ddp/gloo_communicator.h"
#include "ddp/hierarchical_communicator.h"
#include "ddp/missing_ranks.h"
#include "ddp/shm_communicator.h"
#include "gtest/gtest.h"
#include "rendezvous/file_store.h"

namespace lockstep {
namespace ddp {
namespace {

// Runs `body` in one process per rank over a FileStore; true per rank that
// returned true. (The parent never touches worker_link: it caches the
// status page at its first use in a process, and each rank must find its
// own in the environment.)
std::vector<bool> RunRankProcesses(int world, const std::function<bool(int, rendezvous::Store*)>& body) {
  const std::string base = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
  std::string dir = base + "/lost_peer_XXXXXX";
  EXPECT_NE(mkdtemp(dir.data()), nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      auto store = rendezvous::FileStore::Open(dir);
      const bool ok = store.ok() && body(r, store->get());
      fflush(stderr);
      _exit(ok ? 0 : 1);
    }
    pids.push_back(pid);
  }
  std::vector<bool> ok;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok.push_back(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  return ok;
}

// Makes `page` with `world` slots, inherited by the rank processes
// RunRankProcesses forks; its descriptor as text ("" if it could not be made).
std::string SharedStatusPage(worker_link::StatusPage* page, int world) {
  if (!page->Create(world).ok()) return "";
  ::fcntl(page->fd(), F_SETFD, 0);
  return std::to_string(page->fd());
}

// Host 2 of a job of 3 hosts with 2 ranks each (its ranks 4 and 5).
HierarchicalLayout Host2() {
  HierarchicalLayout host2;
  host2.node_rank = 2;
  host2.num_nodes = 3;
  host2.local_world_size = 2;
  host2.world_size = 6;
  return host2;
}

TEST(LostPeerRankTest, TheHierarchicalSubCommunicatorsMapTheirRanksToTheJobs) {
  // Its local rank 1 is global rank 5; node 1's leader (its local rank 0)
  // is global rank 2.
  const HierarchicalLayout host2 = Host2();
  EXPECT_EQ(HostRanks(host2).Global(1), 5);
  EXPECT_EQ(LeaderRanks(host2).Global(1), 2);
  EXPECT_EQ(HostRanks(host2).Global(-1), -1) << "not known stays not known";
}

// Each rank process gets a status page slot, as under lockstepd. Rank 1
// exits before the second allreduce; rank 0's mark names it by the job's
// rank through the communicator's global_ranks (HostRanks for shared
// memory, LeaderRanks for the leaders' Gloo).
TEST(LostPeerRankTest, ALostPeerIsMarkedByItsGlobalRank) {
  constexpr int kWorld = 2;
  const HierarchicalLayout host2 = Host2();
  for (const bool shm : {true, false}) {
    SCOPED_TRACE(shm ? "shm" : "gloo");
    worker_link::StatusPage page;
    const std::string fd = SharedStatusPage(&page, kWorld);
    ASSERT_FALSE(fd.empty());
    const std::vector<bool> ok = RunRankProcesses(kWorld, [&](int rank, rendezvous::Store* store) {
      ::setenv(worker_link::kStatusFdEnv, fd.c_str(), 1);
      ::setenv("LOCKSTEP_LOCAL_RANK", std::to_string(rank).c_str(), 1);
      std::unique_ptr<Communicator> comm;
      if (shm) {
        ShmOptions options;
        options.timeout = std::chrono::seconds(30);
        options.global_ranks = HostRanks(host2);
        auto made = ShmCommunicator::Create(store, rank, kWorld, options);
        if (!made.ok()) return false;
        comm = std::move(*made);
      } else {
        GlooOptions options;
        options.timeout = std::chrono::seconds(5);
        options.global_ranks = LeaderRanks(host2);
        auto made = GlooCommunicator::Create(store, rank, kWorld, options);
        if (!made.ok()) return false;
        comm = std::move(*made);
      }
      at::Tensor t = at::ones({64});
      if (!comm->AllReduce(t, ReduceOp::kSum)->Wait().ok()) return false;
      if (rank == 1) _exit(0);  // Gone before the second allreduce.
      return !comm->AllReduce(t, ReduceOp::kSum)->Wait().ok();
    });
    EXPECT_TRUE(ok[0]) << "rank 0's second allreduce did not fail";
    ASSERT_TRUE(worker_link::IsPeerLost(page.Get(0))) << page.Get(0);
    EXPECT_EQ(worker_link::LostPeer(page.Get(0)), shm ? 5 : 2);
  }
}

// The rank an error names as the end of the ranks' waits ("... lead to
// rank R, which never gave up"), -1 when it names none.
int LostPeerOfChainEnd(const Status& s) {
  const std::string m(s.message());
  const std::string key = "lead to rank ";
  const size_t at = m.find(key);
  return at == std::string::npos ? -1 : std::atoi(m.c_str() + at + key.size());
}

// Rank `rank` of a job of 2 hosts x 2 ranks (host = rank / 2).
HierarchicalLayout TwoHostsOfTwo(int rank) {
  HierarchicalLayout layout;
  layout.rank = rank;
  layout.world_size = 4;
  layout.local_rank = rank % 2;
  layout.local_world_size = 2;
  layout.node_rank = rank / 2;
  layout.num_nodes = 2;
  return layout;
}

// In a rank's process: its lost-peer mark goes to slot `rank` of the
// test's one status page (descriptor `fd`, which holds every rank).
void UseTheTestsStatusPage(const std::string& fd, int rank) {
  ::setenv(worker_link::kStatusFdEnv, fd.c_str(), 1);
  ::setenv("LOCKSTEP_LOCAL_RANK", std::to_string(rank).c_str(), 1);
}

// Four ranks over Gloo, rank 3 gone (exit 0, as from a training loop left
// early) after the first allreduce: every other rank marks rank 3. Gloo
// closes only the connection that failed, so rank 1 (not rank 3's ring
// neighbour) went on waiting over its healthy connections until its own
// timeout; ranks 0 and 2, done with their diagnosis long before, named rank
// 1 as not arriving, and the coordinator followed them to it. Now a rank
// that fails closes all its connections, and rank 1 fails at once.
TEST(LostPeerRankTest, EveryRankOfAGlooRingMarksTheRankThatLeft) {
  constexpr int kWorld = 4;
  worker_link::StatusPage page;
  const std::string fd = SharedStatusPage(&page, kWorld);
  ASSERT_FALSE(fd.empty());
  const std::vector<bool> ok = RunRankProcesses(kWorld, [&](int rank, rendezvous::Store* store) {
    UseTheTestsStatusPage(fd, rank);
    GlooOptions options;
    options.timeout = std::chrono::seconds(30);
    auto made = GlooCommunicator::Create(store, rank, kWorld, options);
    if (!made.ok()) return false;
    at::Tensor t = at::ones({1 << 16});
    if (!(*made)->AllReduce(t, ReduceOp::kSum)->Wait().ok()) return false;
    if (rank == 3) _exit(0);
    const Status second = (*made)->AllReduce(t, ReduceOp::kSum)->Wait();
    if (second.ok()) return false;
    std::fprintf(stderr, "rank %d: %s\n", rank, std::string(second.message()).c_str());
    return true;
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(ok[r]) << "rank " << r << "'s second allreduce did not fail";
    ASSERT_TRUE(worker_link::IsPeerLost(page.Get(r))) << "rank " << r;
    EXPECT_EQ(worker_link::LostPeer(page.Get(r)), 3) << "rank " << r;
  }
}

// A store that cannot read rank 2's published blame (its Get of
// ".../waits/<n>/2" fails UNAVAILABLE), the rest passed through.
class NoWaitsStore : public rendezvous::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  StatusOr<std::string> Get(const std::string& k, Duration timeout) override {
    if (k.find("/waits/") != std::string::npos && k.back() == '2') {
      return absl::UnavailableError("store down");
    }
    return ForwardingStore::Get(k, timeout);
  }
};

// A frozen rank of a job of 2 hosts x 2 ranks (shm inside each, Gloo
// between them) is the lost peer every other rank marks, although each
// waited for another: with rank 3 frozen, rank 2 waits for it on host 1,
// rank 0 for rank 2 between hosts, rank 1 for rank 0's result broadcast
// (HierarchicalCommunicator follows the blames the ranks publish). With rank
// 1 frozen the chain runs the other way (rank 3 -> 2 -> 0 -> 1). Where a
// blame on the way cannot be read back (rank 2's, with rank 3 frozen), a
// rank keeps the one it made (the peer it waited for), not the rank where
// the store failed: rank 1 blames rank 0, not rank 2, which did give up.
TEST(LostPeerRankTest, EveryRankOfAHierarchicalJobMarksTheFrozenRank) {
  constexpr int kWorld = 4;
  constexpr auto kTimeout = std::chrono::seconds(3);
  struct Case {
    int frozen;
    bool store_reads_blames;
    std::vector<int> marks;  // per rank (the frozen one's unused)
  };
  for (const Case& c : {Case{3, true, {3, 3, 3, -1}}, Case{1, true, {1, -1, 1, 1}},
                        Case{3, false, {2, 0, 3, -1}}}) {
    const int frozen = c.frozen;
    SCOPED_TRACE("rank " + std::to_string(frozen) + " frozen" +
                 (c.store_reads_blames ? "" : ", the blames unreadable"));
    worker_link::StatusPage page;
    const std::string fd = SharedStatusPage(&page, kWorld);
    ASSERT_FALSE(fd.empty());
    std::vector<std::string> errors(kWorld);
    const std::vector<bool> ok = RunRankProcesses(kWorld, [&](int rank, rendezvous::Store* store) {
      UseTheTestsStatusPage(fd, rank);
      const HierarchicalLayout layout = TwoHostsOfTwo(rank);
      HierarchicalOptions options;
      options.timeout = kTimeout;
      NoWaitsStore no_waits(store);
      auto comm = HierarchicalCommunicator::Create(c.store_reads_blames ? store : &no_waits,
                                                   layout, options);
      if (!comm.ok()) return false;
      at::Tensor t = at::ones({1024});
      if (!(*comm)->AllReduce(t, ReduceOp::kSum)->Wait().ok()) return false;
      if (rank == frozen) {
        // Frozen: never comes to the next collective, and never gives up.
        std::this_thread::sleep_for(kTimeout * 2);
        _exit(0);
      }
      const Status s = (*comm)->AllReduce(t, ReduceOp::kSum)->Wait();
      std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
      // The blame travels in the mark; the error the caller prints carries
      // no payload (the sub-collective's was consumed).
      return !s.ok() && LostPeerOf(s) == -1 &&
             (c.marks[rank] == LostPeerOfChainEnd(s) || LostPeerOfChainEnd(s) == -1);
    });
    for (int r = 0; r < kWorld; ++r) {
      if (r == frozen) continue;
      EXPECT_TRUE(ok[r]) << "rank " << r << "'s collective did not fail naming rank " << c.marks[r];
      ASSERT_TRUE(worker_link::IsPeerLost(page.Get(r))) << r << ": " << page.Get(r);
      EXPECT_EQ(worker_link::LostPeer(page.Get(r)), c.marks[r]) << "rank " << r;
    }
  }
}

// The hosts may be a collective apart when a rank freezes: in a broadcast
// from host 1, host 1's ranks are done once the leaders have it, while host
// 0's leader (rank 0) still waits to hand it to rank 1. With rank 1 frozen
// there, ranks 2 and 3 go on to the next collective and wait for rank 0 in
// it; their walk must still reach rank 0's blame, published from the
// collective before (blames are keyed by rank, not by collective).
TEST(LostPeerRankTest, HostsACollectiveApartStillFindTheFrozenRank) {
  constexpr int kWorld = 4;
  constexpr int kFrozen = 1;
  constexpr auto kTimeout = std::chrono::seconds(3);
  worker_link::StatusPage page;
  const std::string fd = SharedStatusPage(&page, kWorld);
  ASSERT_FALSE(fd.empty());
  const std::vector<bool> ok = RunRankProcesses(kWorld, [&](int rank, rendezvous::Store* store) {
    UseTheTestsStatusPage(fd, rank);
    const HierarchicalLayout layout = TwoHostsOfTwo(rank);
    HierarchicalOptions options;
    options.timeout = kTimeout;
    auto comm = HierarchicalCommunicator::Create(store, layout, options);
    if (!comm.ok()) return false;
    at::Tensor t = at::ones({1024});
    if (!(*comm)->AllReduce(t, ReduceOp::kSum)->Wait().ok()) return false;
    if (rank == kFrozen) {
      std::this_thread::sleep_for(kTimeout * 3);
      _exit(0);
    }
    Status s = (*comm)->Broadcast(t, /*root=*/2)->Wait();
    if (rank != 0) {
      // Host 1 has its broadcast and goes on; rank 0 is still in it.
      if (!s.ok()) return false;
      s = (*comm)->AllReduce(t, ReduceOp::kSum)->Wait();
    }
    std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    return !s.ok();
  });
  for (int r = 0; r < kWorld; ++r) {
    if (r == kFrozen) continue;
    EXPECT_TRUE(ok[r]) << "rank " << r;
    ASSERT_TRUE(worker_link::IsPeerLost(page.Get(r))) << r << ": " << page.Get(r);
    EXPECT_EQ(worker_link::LostPeer(page.Get(r)), kFrozen) << "rank " << r;
  }
}

// A store that is down (every op Unavailable, as a client whose server does
// not answer reports it), over a store that works.
class DownStore : public rendezvous::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  Status Wait(const std::vector<std::string>&, Duration) override {
    ++calls;
    return absl::UnavailableError("store server at 10.0.0.1:7070 did not answer op 7 in time");
  }
  StatusOr<std::string> Get(const std::string&, Duration) override {
    ++calls;
    return absl::UnavailableError("store server at 10.0.0.1:7070 did not answer op 8 in time");
  }
  int calls = 0;
};

// A store that cannot answer tells nothing of which ranks arrived: the
// diagnosis stops at its first error and says so, rather than asking key by
// key (each costing its RPC timeout) and calling every rank missing.
TEST(LostPeerRankTest, AStoreThatIsDownNamesNoRankMissing) {
  const std::string base = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
  std::string dir = base + "/down_store_XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  auto files = rendezvous::FileStore::Open(dir);
  ASSERT_TRUE(files.ok()) << files.status();
  DownStore down(files->get());
  Status store_error;
  EXPECT_TRUE(
      ReportAndFindMissing(&down, "failed/3/", 0, 8, std::chrono::seconds(1), &store_error).empty());
  EXPECT_TRUE(absl::IsUnavailable(store_error)) << store_error;
  EXPECT_EQ(down.calls, 1) << "asked on after the store failed";
  // Ranks that did not report in time, with a store that answers, are
  // missing: rank 1 reported, 2 and 3 did not.
  ASSERT_TRUE((*files)->Set("failed/4/1", "1").ok());
  Status none;
  EXPECT_EQ(ReportAndFindMissing(files->get(), "failed/4/", 0, 4, std::chrono::milliseconds(100),
                                 &none),
            (std::vector<int>{2, 3}));
  EXPECT_TRUE(none.ok()) << none;
}

}  // namespace
}  // namespace ddp
}  // namespace lockstep
