// The job state machine on a FakeClock and a NodeTable, without a
// coordinator, a store or a socket.
#include "daemon/job_machine.h"

#include <gtest/gtest.h>

#include <limits>

#include "absl/strings/str_cat.h"
#include "daemon/test_spec.h"

namespace lockstep {
namespace daemon {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;

class JobMachineTest : public ::testing::Test {
 protected:
  // lease 10 s: a node's fence deadline is its last heartbeat + 13.5 s.
  JobMachineTest() : nodes_(seconds(10), seconds(1)), machine_(Options(), &clock_) {}

  static JobMachineOptions Options() {
    JobMachineOptions o;
    o.restart_backoff = seconds(1);
    o.max_restart_backoff = seconds(4);
    return o;
  }

  static v1::AgentJobReport Report(const std::string& job, int round,
                                   std::vector<v1::WorkerStatus> workers) {
    v1::AgentJobReport r;
    r.set_job_id(job);
    r.set_round(round);
    for (auto& w : workers) *r.add_workers() = w;
    return r;
  }
  static v1::WorkerStatus Worker(int rank, v1::WorkerState state, int code = 0, int sig = 0) {
    v1::WorkerStatus w;
    w.set_rank(rank);
    w.set_state(state);
    if (state == v1::WORKER_STATE_EXITED || state == v1::WORKER_STATE_STOPPED) {
      w.mutable_exit()->set_exit_code(code);
      w.mutable_exit()->set_signal(sig);
    }
    return w;
  }

  // A node whose agent reports `reports` (registration or heartbeat).
  void Node(const std::string& id, std::vector<v1::AgentJobReport> reports = {}) {
    NodeTable::Reports r;
    for (auto& x : reports) *r.Add() = x;
    if (nodes_.Find(id)) {
      nodes_.Renew(id, clock_.Now(), r);
    } else {
      v1::NodeInfo info;
      info.set_node_id(id);
      info.set_incarnation("inc-" + id);
      nodes_.Register(info, clock_.Now(), r);
    }
  }
  // Renews `id` and applies its report to the job, as a heartbeat does.
  void Beat(const std::string& id, std::vector<v1::WorkerStatus> workers, int round = -1,
            int64_t sent_mono_ns = 0) {
    v1::AgentJobReport r = Report(d_.job.job_id(), round < 0 ? Round() : round, workers);
    Node(id, {r});
    machine_.ApplyReport(&d_, id, r, clock_.Now(), sent_mono_ns);
  }
  void Advance(Duration by = Duration::zero()) {
    clock_.Advance(by);
    machine_.Advance(&d_, nodes_);
  }
  int Round() const { return d_.job.current_round().number(); }
  v1::JobState State() const { return d_.job.state(); }
  std::vector<std::string> NodeIds() const {
    const auto& ids = d_.job.current_round().node_ids();
    return {ids.begin(), ids.end()};
  }

  // n1 and n2 run a 2-node x 1-process job in round 1.
  void RunningOnTwoNodes(int max_restarts) {
    Node("n1");
    Node("n2");
    d_ = machine_.NewJob("j", TestSpec(2, 2, 1, max_restarts), "");
    Advance();
    ASSERT_EQ(NodeIds(), (std::vector<std::string>{"n1", "n2"}));
    Beat("n1", {Worker(0, v1::WORKER_STATE_RUNNING)});
    Beat("n2", {Worker(1, v1::WORKER_STATE_RUNNING)});
    ASSERT_EQ(State(), v1::JOB_STATE_RUNNING);
  }
  // n1 (ranks 0, 1) and n2 (ranks 2, 3) run a 2-node x 2-process job in
  // round 1, no restarts.
  void RunningTwoByTwo() {
    Node("n1");
    Node("n2");
    d_ = machine_.NewJob("j", TestSpec(2, 2, 2, 0), "");
    Advance();
    Beat("n1", {Worker(0, v1::WORKER_STATE_RUNNING), Worker(1, v1::WORKER_STATE_RUNNING)});
    Beat("n2", {Worker(2, v1::WORKER_STATE_RUNNING), Worker(3, v1::WORKER_STATE_RUNNING)});
  }
  // A worker that exited having given up waiting for rank `lost`.
  static v1::WorkerStatus GaveUp(int rank, int lost) {
    v1::WorkerStatus w = Worker(rank, v1::WORKER_STATE_EXITED, 1);
    w.mutable_exit()->set_peer_lost(true);
    w.mutable_exit()->set_lost_peer(lost);
    return w;
  }
  // Both nodes report their round-`round` workers stopped.
  void BothStopped(int round) {
    Beat("n1", {Worker(0, v1::WORKER_STATE_STOPPED)}, round);
    Beat("n2", {Worker(1, v1::WORKER_STATE_STOPPED)}, round);
  }

  // d_.changes as the coordinator logs them once written: "rank=R text"
  // ("rank=-" for the whole job), a line each.
  std::string Changes() const {
    std::string out;
    for (const ChangeLine& c : d_.changes) {
      absl::StrAppend(&out, "rank=", c.rank < 0 ? "-" : std::to_string(c.rank), " ", c.text, "\n");
    }
    return out;
  }

  FakeClock clock_;
  NodeTable nodes_;
  JobMachine machine_;
  JobDraft d_;
};

TEST_F(JobMachineTest, PendingUntilMinNodesThenLastCallThenClose) {
  d_ = machine_.NewJob("j", TestSpec(2, 3, 2, 0), "");
  Advance();
  EXPECT_EQ(State(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Round(), 0);
  Node("n2");
  Node("n1");
  Advance();
  EXPECT_EQ(State(), v1::JOB_STATE_RENDEZVOUS);
  EXPECT_EQ(Round(), 1);
  EXPECT_FALSE(d_.job.current_round().closed()) << "last call for a third node";
  EXPECT_EQ(d_.job.current_round().last_call_deadline_unix_ms(), clock_.UnixMillis() + 1000);
  Advance(milliseconds(900));
  EXPECT_FALSE(d_.job.current_round().closed());
  Advance(milliseconds(100));
  ASSERT_TRUE(d_.job.current_round().closed());
  EXPECT_EQ(NodeIds(), (std::vector<std::string>{"n1", "n2"}));
  EXPECT_EQ(d_.job.current_round().world_size(), 4);
  EXPECT_EQ(d_.job.current_round().last_call_deadline_unix_ms(), 0);
}

// A job short of nodes says how many it has and how many it needs, in
// PENDING and in a round that lost nodes before it closed.
TEST_F(JobMachineTest, WaitingForNodesSaysHowManyItHasAndNeeds) {
  Node("a");
  v1::JobSpec spec = TestSpec(2, 3, 1, 0);
  spec.set_join_timeout_s(60);
  d_ = machine_.NewJob("j", spec, "");
  Advance();
  EXPECT_EQ(State(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(d_.job.message(),
            "waiting for nodes: 1 of 2 registered and alive (needs --nodes 2:3, join timeout 60s)");
  d_ = machine_.NewJob("k", TestSpec(3, 3, 1, 0), "");
  Advance();
  EXPECT_EQ(d_.job.message(), "waiting for nodes: 1 of 3 registered and alive (needs --nodes 3)");

  Node("b");
  d_ = machine_.NewJob("j", TestSpec(2, 3, 1, 0), "");
  Advance();
  ASSERT_EQ(State(), v1::JOB_STATE_RENDEZVOUS);
  clock_.Advance(seconds(11));  // both silent for a lease
  nodes_.ExpireLeases(clock_.Now());
  Node("a");
  Advance();
  EXPECT_EQ(d_.job.message(),
            "round 1 waiting for nodes: 1 of 2 registered and alive (needs --nodes 2:3)");
}

TEST_F(JobMachineTest, RoundClosesAtOnceWithMaxNodes) {
  Node("a");
  Node("b");
  d_ = machine_.NewJob("j", TestSpec(1, 2, 1, 0), "");
  Advance();
  EXPECT_TRUE(d_.job.current_round().closed());
  EXPECT_EQ(NodeIds(), (std::vector<std::string>{"a", "b"}));
}

TEST_F(JobMachineTest, LastCallStopsWhenNodesDropBelowMin) {
  Node("a");
  Node("b");
  d_ = machine_.NewJob("j", TestSpec(2, 3, 1, 0), "");
  Advance();
  ASSERT_NE(d_.job.current_round().last_call_deadline_unix_ms(), 0);
  clock_.Advance(seconds(11));  // both silent for a lease
  nodes_.ExpireLeases(clock_.Now());
  Node("a");
  Advance();
  EXPECT_EQ(d_.job.current_round().last_call_deadline_unix_ms(), 0);
  EXPECT_FALSE(d_.job.current_round().closed());
  Node("b");
  Advance();
  Advance(milliseconds(999));
  EXPECT_FALSE(d_.job.current_round().closed()) << "a new last call started";
  Advance(milliseconds(1));
  EXPECT_TRUE(d_.job.current_round().closed());
}

TEST_F(JobMachineTest, JoinTimeoutFailsAnOpenRoundBelowMin) {
  v1::JobSpec spec = TestSpec(2, 2, 1, 0);
  spec.set_join_timeout_s(5);
  d_ = machine_.NewJob("j", spec, "");
  Advance(seconds(4));
  EXPECT_EQ(State(), v1::JOB_STATE_PENDING);
  Advance(seconds(1));
  EXPECT_EQ(State(), v1::JOB_STATE_FAILED);
  EXPECT_NE(d_.job.message().find("fewer than min 2 nodes within join timeout 5s"),
            std::string::npos)
      << d_.job.message();
}

TEST_F(JobMachineTest, NoJoinTimeoutMeansWaitingForever) {
  d_ = machine_.NewJob("j", TestSpec(1, 1, 1, 0), "");
  Advance(seconds(100000));
  EXPECT_EQ(State(), v1::JOB_STATE_PENDING);
}

TEST_F(JobMachineTest, AllRanksStartedIsRunningAllExitedZeroIsSucceeded) {
  RunningOnTwoNodes(0);
  Beat("n1", {Worker(0, v1::WORKER_STATE_EXITED)});
  EXPECT_EQ(State(), v1::JOB_STATE_RUNNING);
  Beat("n2", {Worker(1, v1::WORKER_STATE_EXITED)});
  EXPECT_EQ(State(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_GT(d_.job.finished_unix_ms(), 0);
}

TEST_F(JobMachineTest, ReportsOfAnotherRoundOrOfAnotherNodesRanksAreIgnored) {
  RunningOnTwoNodes(1);
  Beat("n1", {Worker(0, v1::WORKER_STATE_EXITED, 1)}, /*round=*/7);
  EXPECT_EQ(State(), v1::JOB_STATE_RUNNING);
  Beat("n1", {Worker(1, v1::WORKER_STATE_EXITED, 1)});  // rank 1 is n2's
  EXPECT_EQ(State(), v1::JOB_STATE_RUNNING);
  machine_.ApplyReport(&d_, "stranger", Report("j", 1, {Worker(0, v1::WORKER_STATE_EXITED, 1)}),
                       clock_.Now(), 0);
  EXPECT_EQ(State(), v1::JOB_STATE_RUNNING);
}

TEST_F(JobMachineTest, FailureRestartsWithDoublingBackoffAndANewRound) {
  RunningOnTwoNodes(3);
  Beat("n2", {Worker(1, v1::WORKER_STATE_EXITED, 0, 9)});
  EXPECT_EQ(State(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(d_.job.restart_count(), 1);
  BothStopped(1);
  Advance(milliseconds(999));
  EXPECT_EQ(Round(), 1) << "backoff 1 s";
  Advance(milliseconds(1));
  EXPECT_EQ(State(), v1::JOB_STATE_RENDEZVOUS);
  EXPECT_EQ(Round(), 2);
  Beat("n1", {Worker(0, v1::WORKER_STATE_RUNNING)});
  Beat("n2", {Worker(1, v1::WORKER_STATE_EXITED, 1)});
  EXPECT_EQ(d_.job.restart_count(), 2);
  BothStopped(2);
  Advance(milliseconds(1999));
  EXPECT_EQ(Round(), 2) << "backoff 2 s";
  Advance(milliseconds(1));
  EXPECT_EQ(Round(), 3);
}

// The line of a change a rank caused carries that rank, so an operator
// finds every line about rank 1 with "rank=1"; a job-wide change has none.
// (The coordinator logs them once the change is written: coordinator_test.)
TEST_F(JobMachineTest, StateChangesARankCausedAreLoggedWithItsRank) {
  RunningOnTwoNodes(1);
  Beat("n2", {Worker(1, v1::WORKER_STATE_EXITED, 0, 9)});
  ASSERT_EQ(State(), v1::JOB_STATE_RESTARTING);
  BothStopped(1);
  Advance(seconds(1));
  Beat("n1", {Worker(0, v1::WORKER_STATE_EXITED, 2)});
  ASSERT_EQ(State(), v1::JOB_STATE_FAILED);
  const std::string lines = Changes();
  EXPECT_NE(lines.find("rank=- RUNNING round=1 restarts=0: all 2 "
                       "ranks started"),
            std::string::npos)
      << lines;
  EXPECT_NE(lines.find("rank=1 RESTARTING round=1 restarts=1: "
                       "restart 1 of 1 after rank 1 on node n2 killed by signal 9"),
            std::string::npos)
      << lines;
  EXPECT_NE(lines.find("rank=- RENDEZVOUS round=2"), std::string::npos)
      << lines;
  EXPECT_NE(lines.find("rank=0 FAILED round=2 restarts=1: rank 0 on "
                       "node n1 exited with code 2"),
            std::string::npos)
      << lines;
}

TEST_F(JobMachineTest, BudgetSpentFailsNamingTheFirstFailure) {
  RunningOnTwoNodes(0);
  v1::WorkerStatus w = Worker(1, v1::WORKER_STATE_EXITED, 3);
  w.mutable_exit()->set_startup_failure(true);
  Beat("n2", {w});
  EXPECT_EQ(State(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(d_.job.first_failure().rank(), 1);
  EXPECT_NE(d_.job.message().find("rank 1 on node n2 exited with code 3 (startup failure"),
            std::string::npos)
      << d_.job.message();
  EXPECT_NE(d_.job.message().find("restart budget spent (0 of max_restarts 0)"), std::string::npos);
}

// The OOM killer's SIGKILL (the agent read it in the kernel log) is named
// in the job's message, so `status` says out of memory, not just signal 9.
TEST_F(JobMachineTest, AnOomKillIsNamedAsSuch) {
  RunningOnTwoNodes(0);
  v1::WorkerStatus w = Worker(1, v1::WORKER_STATE_EXITED, 0, 9);
  w.mutable_exit()->set_oom_killed(true);
  Beat("n2", {w});
  EXPECT_EQ(State(), v1::JOB_STATE_FAILED);
  EXPECT_NE(d_.job.message().find(
                "rank 1 on node n2 killed by signal 9 (out of memory: the kernel's OOM killer) in round 1"),
            std::string::npos)
      << d_.job.message();
}

TEST_F(JobMachineTest, LaunchErrorFailsAtOnceWhateverTheBudget) {
  RunningOnTwoNodes(5);
  v1::WorkerStatus w = Worker(0, v1::WORKER_STATE_EXITED, 127);
  w.mutable_exit()->set_launch_error(true);
  w.mutable_exit()->set_message("exec /bin/train: No such file or directory");
  Beat("n1", {w});
  EXPECT_EQ(State(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(d_.job.restart_count(), 0);
  EXPECT_TRUE(d_.job.first_failure().exit().launch_error());
}

TEST_F(JobMachineTest, RescaleIsNotCountedAgainstTheBudget) {
  Node("n1");
  d_ = machine_.NewJob("j", TestSpec(1, 2, 1, 0), "");
  Advance();
  Advance(seconds(1));
  ASSERT_EQ(NodeIds(), (std::vector<std::string>{"n1"}));
  Beat("n1", {Worker(0, v1::WORKER_STATE_RUNNING)});
  ASSERT_EQ(State(), v1::JOB_STATE_RUNNING);
  Node("n2");
  Advance();
  EXPECT_EQ(State(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(d_.job.restart_count(), 0);
  EXPECT_EQ(d_.job.rescale_count(), 1);
  Beat("n1", {Worker(0, v1::WORKER_STATE_STOPPED)});
  Advance();
  EXPECT_EQ(Round(), 2);
  EXPECT_EQ(NodeIds(), (std::vector<std::string>{"n1", "n2"}));
}

TEST_F(JobMachineTest, SurvivorsKeepTheirNodeRanksInTheNextRound) {
  Node("n3");
  Node("n2");
  d_ = machine_.NewJob("j", TestSpec(2, 3, 1, 3), "");
  Advance();
  Advance(seconds(1));  // last call: round 1 runs on [n2, n3]
  ASSERT_EQ(NodeIds(), (std::vector<std::string>{"n2", "n3"}));
  Beat("n2", {Worker(0, v1::WORKER_STATE_RUNNING)});
  Beat("n3", {Worker(1, v1::WORKER_STATE_RUNNING)});
  Node("n1");  // a new node sorts first by id, but survivors keep their ranks
  Advance();
  ASSERT_EQ(State(), v1::JOB_STATE_RESTARTING);
  Beat("n2", {Worker(0, v1::WORKER_STATE_STOPPED)});
  Beat("n3", {Worker(1, v1::WORKER_STATE_STOPPED)});
  Advance();
  ASSERT_EQ(Round(), 2);
  EXPECT_EQ(NodeIds(), (std::vector<std::string>{"n2", "n3", "n1"}));
  EXPECT_EQ(d_.job.current_round().previous_node_ids_size(), 2);
}

// The rule of node_table.h: a frozen node's ranks are handed out only past
// its fence deadline (last heartbeat + lease + lease/4 + 1 s).
TEST_F(JobMachineTest, NextRoundWaitsForTheFenceDeadlineOfADeadParticipant) {
  Node("n1");
  Node("n2");
  d_ = machine_.NewJob("j", TestSpec(1, 2, 1, 3), "");
  Advance();
  Beat("n1", {Worker(0, v1::WORKER_STATE_RUNNING)});
  Beat("n2", {Worker(1, v1::WORKER_STATE_RUNNING)});  // n2's last heartbeat: t = 0
  const MonoTime fence = nodes_.FenceDeadline("n2");
  ASSERT_EQ(State(), v1::JOB_STATE_RUNNING);
  for (int i = 0; i < 10; ++i) {  // n1 keeps beating, n2 is frozen
    clock_.Advance(seconds(1));
    Beat("n1", {Worker(0, v1::WORKER_STATE_RUNNING)});
    nodes_.ExpireLeases(clock_.Now());
    Advance();
  }
  EXPECT_EQ(State(), v1::JOB_STATE_RUNNING) << "a lease has not passed yet";
  clock_.Advance(milliseconds(1));
  nodes_.ExpireLeases(clock_.Now());
  Advance();
  ASSERT_EQ(State(), v1::JOB_STATE_RESTARTING);
  EXPECT_NE(d_.job.first_failure().reason().find("node n2 lost: no heartbeat for"),
            std::string::npos);
  Beat("n1", {Worker(0, v1::WORKER_STATE_STOPPED)});
  while (clock_.Now() + milliseconds(100) < fence) {
    Advance(milliseconds(100));
    ASSERT_EQ(Round(), 1) << "opened before n2's fence deadline";
    Beat("n1", {}, 1);
  }
  // The last tick before the deadline still holds the round; the deadline
  // itself opens it, so neither a tick of slack nor a rounded deadline passes.
  Advance(fence - nanoseconds(1) - clock_.Now());
  ASSERT_EQ(Round(), 1) << "opened 1 ns before n2's fence deadline";
  Advance(nanoseconds(1));
  ASSERT_EQ(clock_.Now(), fence);
  EXPECT_EQ(State(), v1::JOB_STATE_RENDEZVOUS);
  EXPECT_EQ(Round(), 2) << "not opened at n2's fence deadline";
}

TEST_F(JobMachineTest, NextRoundWaitsForLiveWorkersOfAnAliveParticipant) {
  RunningOnTwoNodes(3);
  Beat("n2", {Worker(1, v1::WORKER_STATE_EXITED, 1)});
  ASSERT_EQ(State(), v1::JOB_STATE_RESTARTING);
  Advance(seconds(30));
  Node("n2");
  Node("n1", {Report("j", 1, {Worker(0, v1::WORKER_STATE_RUNNING)})});
  Advance();
  EXPECT_EQ(Round(), 1) << "n1 still runs rank 0 of round 1";
  Node("n1", {Report("j", 1, {Worker(0, v1::WORKER_STATE_STOPPED)})});
  Advance();
  EXPECT_EQ(Round(), 2);
}

// kill -9 of rank 1 on n2, whose peer rank 0 on n1 fails 100 ms later; n1
// reports first. The agents' monotonic clocks have nothing in common.
TEST_F(JobMachineTest, FirstFailureIsTheEarliestExitOnTheCoordinatorsClock) {
  RunningOnTwoNodes(3);
  const int64_t n1_clock = 5'000'000'000'000;  // agent steady clocks, ns
  const int64_t n2_clock = 9'000'000'000'000;
  // Coordinator time T0: rank 1 dies. T0 + 100 ms: rank 0 fails.
  v1::WorkerStatus peer = Worker(0, v1::WORKER_STATE_EXITED, 1);
  peer.mutable_exit()->set_exited_mono_ns(n1_clock + 100'000'000);
  v1::WorkerStatus killed = Worker(1, v1::WORKER_STATE_EXITED, 0, 9);
  killed.mutable_exit()->set_exited_mono_ns(n2_clock);
  // n1's report reaches the coordinator at T0 + 150 ms, n2's at T0 + 450 ms.
  clock_.Advance(milliseconds(150));
  Beat("n1", {peer}, 1, /*sent_mono_ns=*/n1_clock + 150'000'000);
  EXPECT_EQ(State(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(d_.job.first_failure().rank(), 0) << "all the coordinator knows so far";
  clock_.Advance(milliseconds(300));
  Beat("n2", {killed}, 1, /*sent_mono_ns=*/n2_clock + 450'000'000);
  EXPECT_EQ(State(), v1::JOB_STATE_RESTARTING) << "a late report never changes the state";
  EXPECT_EQ(d_.job.restart_count(), 1);
  EXPECT_EQ(d_.job.first_failure().rank(), 1);
  EXPECT_EQ(d_.job.first_failure().exit().signal(), 9);
  ASSERT_EQ(d_.job.consequences_size(), 1);
  EXPECT_EQ(d_.job.consequences(0).rank(), 0);
  EXPECT_EQ(d_.job.consequences(0).exit().exit_code(), 1);
  EXPECT_EQ(d_.job.consequences(0).reason(), "after rank 1 failed");
}

TEST_F(JobMachineTest, ExitsReportedTogetherAreOrderedByTime) {
  RunningOnTwoNodes(0);
  d_.job.mutable_spec()->set_nproc_per_node(2);  // n1 runs ranks 0 and 1
  d_.job.mutable_current_round()->set_world_size(4);
  const int64_t agent = 7'000'000'000'000;
  v1::WorkerStatus killed = Worker(1, v1::WORKER_STATE_EXITED, 0, 9);
  killed.mutable_exit()->set_exited_mono_ns(agent);
  v1::WorkerStatus peer = Worker(0, v1::WORKER_STATE_EXITED, 1);
  peer.mutable_exit()->set_exited_mono_ns(agent + 100'000'000);
  Beat("n1", {peer, killed}, 1, agent + 200'000'000);
  EXPECT_EQ(State(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(d_.job.first_failure().rank(), 1);
  ASSERT_EQ(d_.job.consequences_size(), 1);
  EXPECT_EQ(d_.job.consequences(0).rank(), 0);
  EXPECT_NE(d_.job.message().find("rank 1 on node n1 killed by signal 9"), std::string::npos)
      << d_.job.message();
}

// The exit watcher of the killed rank was woken late (a loaded machine): by
// the clocks rank 0 exited first. But rank 0's engine marked its status
// slot "lost a peer" before it gave up, so rank 1 is the first failure.
TEST_F(JobMachineTest, ARankThatLostAPeerIsAConsequenceWhateverTheClocks) {
  RunningOnTwoNodes(0);
  d_.job.mutable_spec()->set_nproc_per_node(2);  // n1 runs ranks 0 and 1
  d_.job.mutable_current_round()->set_world_size(4);
  const int64_t agent = 7'000'000'000'000;
  v1::WorkerStatus peer = Worker(0, v1::WORKER_STATE_EXITED, 1);
  peer.mutable_exit()->set_exited_mono_ns(agent);
  peer.mutable_exit()->set_peer_lost(true);
  v1::WorkerStatus killed = Worker(1, v1::WORKER_STATE_EXITED, 0, 9);
  killed.mutable_exit()->set_exited_mono_ns(agent + 5'000'000);
  Beat("n1", {peer}, 1, agent + 1'000'000);  // rank 0's exit reported alone first
  EXPECT_EQ(d_.job.first_failure().rank(), 0) << "all the coordinator knows so far";
  Beat("n1", {peer, killed}, 1, agent + 10'000'000);
  EXPECT_EQ(State(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(d_.job.first_failure().rank(), 1);
  EXPECT_EQ(d_.job.first_failure().exit().signal(), 9);
  ASSERT_EQ(d_.job.consequences_size(), 1);
  EXPECT_EQ(d_.job.consequences(0).rank(), 0);
  EXPECT_EQ(d_.job.consequences(0).reason(), "after rank 1 failed");
  EXPECT_NE(d_.job.message().find("rank 1 on node n1 killed by signal 9"), std::string::npos)
      << d_.job.message();
  bool event = false;
  for (const auto& e : d_.job.history()) {
    event |= e.detail().find("first failure is rank 1 (rank 0 lost a peer)") != std::string::npos;
  }
  EXPECT_TRUE(event) << "no event says why rank 1 replaced rank 0";
  EXPECT_NE(Changes().find("rank=1 first failure is rank 1 (rank 0 lost a peer)"),
            std::string::npos)
      << "the daemon's log says so too, about rank 1: " << Changes();
}

// Every failed rank lost a peer (a cut network): time decides.
TEST_F(JobMachineTest, WhenEveryRankLostAPeerTheEarliestExitIsFirst) {
  RunningOnTwoNodes(0);
  const int64_t agent = 7'000'000'000'000;
  v1::WorkerStatus a = Worker(0, v1::WORKER_STATE_EXITED, 1);
  a.mutable_exit()->set_exited_mono_ns(agent + 100'000'000);
  a.mutable_exit()->set_peer_lost(true);
  v1::WorkerStatus b = Worker(1, v1::WORKER_STATE_EXITED, 1);
  b.mutable_exit()->set_exited_mono_ns(agent);
  b.mutable_exit()->set_peer_lost(true);
  Beat("n1", {a}, 1, agent + 200'000'000);
  Beat("n2", {b}, 1, agent + 200'000'000);
  EXPECT_EQ(d_.job.first_failure().rank(), 1);
  ASSERT_EQ(d_.job.consequences_size(), 1);
  EXPECT_EQ(d_.job.consequences(0).rank(), 0);
}

// SIGSTOP of rank 1 (or a hang): rank 0's collective times out, its engine
// marks "lost a peer: rank 1", and it exits; rank 1 never fails on its own,
// its agent stops it with the job. Rank 1 is the first failure, not rank 0.
TEST_F(JobMachineTest, TheRankAPeerGaveUpWaitingForIsTheFirstFailure) {
  RunningOnTwoNodes(0);
  v1::WorkerStatus gave_up = Worker(0, v1::WORKER_STATE_EXITED, 1);
  gave_up.mutable_exit()->set_peer_lost(true);
  gave_up.mutable_exit()->set_lost_peer(1);
  Beat("n1", {gave_up});
  EXPECT_EQ(State(), v1::JOB_STATE_FAILED);
  const v1::Failure& first = d_.job.first_failure();
  EXPECT_EQ(first.rank(), 1);
  EXPECT_EQ(first.node_id(), "n2");
  EXPECT_EQ(first.reason(), "did not arrive");
  EXPECT_EQ(std::vector<int>(first.waiting_ranks().begin(), first.waiting_ranks().end()),
            std::vector<int>{0});
  ASSERT_EQ(d_.job.consequences_size(), 1);
  EXPECT_EQ(d_.job.consequences(0).rank(), 0);
  EXPECT_EQ(d_.job.consequences(0).reason(), "after rank 1 failed");
  EXPECT_NE(d_.job.message().find("rank 1 on node n2 did not arrive: rank 0 gave up waiting for "
                                  "it (hung, stopped or cut off) in round 1; restart budget spent"),
            std::string::npos)
      << d_.job.message();
  // Stopped with the job: still the first failure.
  v1::WorkerStatus stopped = Worker(1, v1::WORKER_STATE_STOPPED, 0, 15);
  Beat("n2", {stopped});
  EXPECT_EQ(d_.job.first_failure().rank(), 1);
  EXPECT_EQ(d_.job.first_failure().reason(), "did not arrive");
  ASSERT_EQ(d_.job.consequences_size(), 1);
  EXPECT_EQ(d_.job.consequences(0).rank(), 0);
}

// Ranks that each gave up waiting for another that was itself waiting (a
// job of 2 nodes x 2 ranks over shm and Gloo with rank 3 frozen, where the
// engines could not follow each other's blames: rank 0 names 2, rank 1
// names 0, rank 2 names 3): the chain leads to rank 3, which did not fail,
// whoever reported first. (A chain that comes back on itself: below.)
TEST_F(JobMachineTest, AChainOfRanksWaitingForEachOtherLeadsToTheOneThatDidNotFail) {
  RunningTwoByTwo();
  ASSERT_EQ(State(), v1::JOB_STATE_RUNNING);
  Beat("n1", {GaveUp(0, 2), GaveUp(1, 0)});
  EXPECT_EQ(State(), v1::JOB_STATE_FAILED);
  // Rank 2 has not reported yet: the chain ends at it.
  EXPECT_EQ(d_.job.first_failure().rank(), 2);
  EXPECT_EQ(d_.job.first_failure().reason(), "did not arrive");
  Beat("n2", {GaveUp(2, 3), Worker(3, v1::WORKER_STATE_STOPPED, 0, 15)});
  const v1::Failure& first = d_.job.first_failure();
  EXPECT_EQ(first.rank(), 3);
  EXPECT_EQ(first.node_id(), "n2");
  EXPECT_EQ(first.reason(), "did not arrive");
  EXPECT_EQ(std::vector<int>(first.waiting_ranks().begin(), first.waiting_ranks().end()),
            (std::vector<int>{0, 1, 2}));
  ASSERT_EQ(d_.job.consequences_size(), 3);
  for (const auto& c : d_.job.consequences()) EXPECT_EQ(c.reason(), "after rank 3 failed");
}

// Ranks whose waits come back on themselves (rank 0 names 1, rank 1 names
// 0): no rank on the chain is the one that never gave up, so none is named
// as not arriving; the first failure is the first report's own exit.
TEST_F(JobMachineTest, AChainThatComesBackOnItselfNamesNoOneAsNotArriving) {
  RunningTwoByTwo();
  ASSERT_EQ(State(), v1::JOB_STATE_RUNNING);
  Beat("n1", {GaveUp(0, 1), GaveUp(1, 0)});
  EXPECT_EQ(State(), v1::JOB_STATE_FAILED);
  const v1::Failure& first = d_.job.first_failure();
  EXPECT_EQ(first.rank(), 0);
  EXPECT_EQ(first.reason(), "worker exited");
  EXPECT_EQ(first.waiting_ranks_size(), 0);
}

TEST_F(JobMachineTest, ARestartNamesTheRankAPeerGaveUpWaitingFor) {
  RunningOnTwoNodes(3);
  v1::WorkerStatus gave_up = Worker(1, v1::WORKER_STATE_EXITED, 1);
  gave_up.mutable_exit()->set_peer_lost(true);
  gave_up.mutable_exit()->set_lost_peer(0);
  Beat("n2", {gave_up});
  EXPECT_EQ(State(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(d_.job.first_failure().rank(), 0);
  EXPECT_EQ(d_.job.first_failure().node_id(), "n1");
  EXPECT_NE(d_.job.message().find("restart 1 of 3 after rank 0 on node n1 did not arrive: rank 1 "
                                  "gave up waiting for it"),
            std::string::npos)
      << d_.job.message();
}

// The rank waited for failed on its own (it crashed, its exit reported
// late): it is the first failure, by its exit, as any other.
TEST_F(JobMachineTest, ARankThatWasWaitedForAndFailedIsTheFirstFailureByItsExit) {
  RunningOnTwoNodes(0);
  v1::WorkerStatus gave_up = Worker(0, v1::WORKER_STATE_EXITED, 1);
  gave_up.mutable_exit()->set_peer_lost(true);
  gave_up.mutable_exit()->set_lost_peer(1);
  Beat("n1", {gave_up});
  ASSERT_EQ(d_.job.first_failure().reason(), "did not arrive");
  Beat("n2", {Worker(1, v1::WORKER_STATE_EXITED, 0, 9)});
  EXPECT_EQ(d_.job.first_failure().rank(), 1);
  EXPECT_EQ(d_.job.first_failure().reason(), "worker exited");
  EXPECT_EQ(d_.job.first_failure().exit().signal(), 9);
  EXPECT_EQ(d_.job.first_failure().waiting_ranks_size(), 0);
  EXPECT_NE(d_.job.message().find("rank 1 on node n2 killed by signal 9"), std::string::npos)
      << d_.job.message();
  EXPECT_NE(d_.job.history().rbegin()->detail().find(
                "first failure is rank 1 (its own exit, reported after its peers gave up "
                "waiting for it): rank 1 on node n2 killed by signal 9"),
            std::string::npos)
      << d_.job.history().rbegin()->detail();
}

// A cut network: each rank gave up waiting for the other, both exited.
// Neither is blamed for the other's wait; time decides, as without names.
TEST_F(JobMachineTest, RanksThatGaveUpWaitingForEachOtherAreOrderedByTime) {
  RunningOnTwoNodes(0);
  const int64_t agent = 7'000'000'000'000;
  v1::WorkerStatus a = Worker(0, v1::WORKER_STATE_EXITED, 1);
  a.mutable_exit()->set_exited_mono_ns(agent + 100'000'000);
  a.mutable_exit()->set_peer_lost(true);
  a.mutable_exit()->set_lost_peer(1);
  v1::WorkerStatus b = Worker(1, v1::WORKER_STATE_EXITED, 1);
  b.mutable_exit()->set_exited_mono_ns(agent);
  b.mutable_exit()->set_peer_lost(true);
  b.mutable_exit()->set_lost_peer(0);
  Beat("n1", {a}, 1, agent + 200'000'000);
  Beat("n2", {b}, 1, agent + 200'000'000);
  EXPECT_EQ(d_.job.first_failure().rank(), 1);
  EXPECT_EQ(d_.job.first_failure().reason(), "worker exited");
  ASSERT_EQ(d_.job.consequences_size(), 1);
  EXPECT_EQ(d_.job.consequences(0).rank(), 0);
}

TEST_F(JobMachineTest, WithoutMonotonicTimesExitsFallBackToWallClock) {
  RunningOnTwoNodes(0);
  v1::WorkerStatus later = Worker(0, v1::WORKER_STATE_EXITED, 1);
  later.mutable_exit()->set_exited_unix_ms(clock_.UnixMillis() - 100);
  v1::WorkerStatus earlier = Worker(1, v1::WORKER_STATE_EXITED, 0, 9);
  earlier.mutable_exit()->set_exited_unix_ms(clock_.UnixMillis() - 200);
  Beat("n1", {later});
  Beat("n2", {earlier});
  EXPECT_EQ(d_.job.first_failure().rank(), 1);
  EXPECT_EQ(d_.job.consequences(0).rank(), 0);
  EXPECT_NE(d_.job.message().find("rank 1 on node n2 killed by signal 9"), std::string::npos)
      << "the FAILED message follows: " << d_.job.message();
}

// Exit times at int64's ends are placed at most kMaxAgentClockSpan from the
// receipt: converting them used to overflow (signed, undefined). Found by
// //tests/fuzz:coordinator_fuzzer (UBSan).
TEST_F(JobMachineTest, ExtremeExitTimesArePlacedWithinADayOfTheReceipt) {
  const MonoTime now = clock_.Now();
  const int64_t max = std::numeric_limits<int64_t>::max();
  v1::ExitInfo exit;
  exit.set_exited_unix_ms(max);  // far ahead of our wall clock
  EXPECT_EQ(machine_.ExitInstant(exit, now, 0), now + kMaxAgentClockSpan);
  exit.set_exited_unix_ms(1);  // 1970
  EXPECT_EQ(machine_.ExitInstant(exit, now, 0), now - kMaxAgentClockSpan);
  exit.set_exited_mono_ns(1);
  EXPECT_EQ(machine_.ExitInstant(exit, now, max), now - kMaxAgentClockSpan);
  exit.set_exited_mono_ns(max);
  EXPECT_EQ(machine_.ExitInstant(exit, now, 1), now + kMaxAgentClockSpan);
  exit.set_exited_mono_ns(900);
  EXPECT_EQ(machine_.ExitInstant(exit, now, 1000), now - std::chrono::nanoseconds(100));
}

TEST_F(JobMachineTest, FirstReportOfAnExitWins) {
  RunningOnTwoNodes(3);
  const int64_t agent = 1'000'000'000'000;
  v1::WorkerStatus a = Worker(0, v1::WORKER_STATE_EXITED, 1);
  a.mutable_exit()->set_exited_mono_ns(agent);
  Beat("n1", {a}, 1, agent + 50'000'000);  // rank 0 exited 50 ms before now
  clock_.Advance(seconds(1));
  v1::WorkerStatus b = Worker(1, v1::WORKER_STATE_EXITED, 1);
  b.mutable_exit()->set_exited_mono_ns(agent);
  Beat("n2", {b}, 1, agent + 1'000'000'000);  // rank 1 exited 1 s ago: 50 ms after rank 0
  // n1's report comes again, delayed (sent with the first): mapped anew it
  // would land after rank 1's exit; the first mapping stands.
  Beat("n1", {a}, 1, agent + 50'000'000);
  EXPECT_EQ(d_.job.first_failure().rank(), 0);
  ASSERT_EQ(d_.job.consequences_size(), 1);
  EXPECT_EQ(d_.job.consequences(0).rank(), 1);
}

TEST_F(JobMachineTest, FailuresAfterANodeWasLostAreItsConsequences) {
  RunningOnTwoNodes(3);
  machine_.NodeLost(&d_, "n2", "agent restarted");
  ASSERT_EQ(State(), v1::JOB_STATE_RESTARTING);
  Beat("n1", {Worker(0, v1::WORKER_STATE_EXITED, 1)});
  EXPECT_EQ(d_.job.first_failure().rank(), -1);
  ASSERT_EQ(d_.job.consequences_size(), 1);
  EXPECT_EQ(d_.job.consequences(0).reason(), "after node n2 was lost");
  EXPECT_EQ(d_.job.restart_count(), 1);
}

TEST_F(JobMachineTest, NewRoundClearsConsequencesAndWorkers) {
  RunningOnTwoNodes(3);
  Beat("n1", {Worker(0, v1::WORKER_STATE_EXITED, 1)});
  Beat("n2", {Worker(1, v1::WORKER_STATE_EXITED, 1)});
  ASSERT_EQ(d_.job.consequences_size(), 1);
  Advance(seconds(2));
  ASSERT_EQ(Round(), 2);
  EXPECT_EQ(d_.job.consequences_size(), 0);
  EXPECT_EQ(d_.job.workers_size(), 0);
  EXPECT_EQ(d_.job.first_failure().round(), 1) << "the last failure stays for status";
}

TEST_F(JobMachineTest, CancelEndsTheJob) {
  RunningOnTwoNodes(0);
  machine_.Cancel(&d_);
  EXPECT_EQ(State(), v1::JOB_STATE_CANCELLED);
  EXPECT_TRUE(JobMachine::IsTerminal(State()));
}

TEST_F(JobMachineTest, RecoveredJobFromBeforeCurrentRoundKeepsItsRound) {
  v1::Job old;
  old.set_job_id("j");
  old.set_state(v1::JOB_STATE_RUNNING);
  old.set_round(3);
  old.add_node_ids("n1");
  old.set_world_size(2);
  old.set_master_port(29500);
  JobDraft d = machine_.Recovered(old);
  EXPECT_EQ(d.job.current_round().number(), 3);
  EXPECT_TRUE(d.job.current_round().closed());
  EXPECT_EQ(d.job.current_round().node_ids(0), "n1");
  EXPECT_EQ(d.job.current_round().master_port(), 29500);
  JobMachine::MirrorRound(&d.job);
  EXPECT_EQ(d.job.round(), 3);
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
