#include "rendezvous/rendezvous_core.h"

#include <optional>
#include <set>

#include "gtest/gtest.h"

namespace lockstep {
namespace rendezvous {
namespace {

using std::chrono::seconds;

class RendezvousCoreTest : public ::testing::Test {
 protected:
  static RendezvousCore::Options NoTimerThread() {
    RendezvousCore::Options options;
    options.run_timer_thread = false;
    return options;
  }

  // A join's outcome, recorded when its callback runs.
  struct Joined {
    std::optional<StatusOr<RendezvousResult>> result;
    int calls = 0;
    RendezvousCore::JoinId id = 0;
    bool done() const { return result.has_value(); }
    const RendezvousResult& value() const { return result->value(); }
    absl::StatusCode code() const { return result->status().code(); }
  };

  void CreateJob(int min_nodes, int max_nodes, Duration last_call = seconds(10),
                 int nproc = 2) {
    RendezvousJobConfig config;
    config.job_id = JobId("job");
    config.min_nodes = min_nodes;
    config.max_nodes = max_nodes;
    config.nproc_per_node = nproc;
    config.last_call_timeout = last_call;
    config.join_timeout = seconds(100);
    ASSERT_TRUE(core_.CreateJob(config).ok());
  }

  std::shared_ptr<Joined> Join(const std::string& node, int round = 0,
                               MonoTime deadline = MonoTime::max()) {
    auto joined = std::make_shared<Joined>();
    JoinRequest request;
    request.job_id = JobId("job");
    request.node_id = NodeId(node);
    request.round = round;
    request.address = node + ".host";
    joined->id = core_.Join(request, deadline, [joined](StatusOr<RendezvousResult> r) {
      ++joined->calls;
      joined->result = std::move(r);
    });
    return joined;
  }

  RendezvousState State() { return *core_.GetState(JobId("job")); }

  FakeClock clock_;
  RendezvousCore core_{&clock_, NoTimerThread()};
};

TEST_F(RendezvousCoreTest, RoundClosesAtOnceWhenMaxNodesJoin) {
  CreateJob(1, 3);
  auto c = Join("c");
  auto a = Join("a");
  EXPECT_FALSE(a->done());
  auto b = Join("b");
  ASSERT_TRUE(a->done() && b->done() && c->done());
  // First round: ranks by node id.
  EXPECT_EQ(a->value().node_rank, 0);
  EXPECT_EQ(b->value().node_rank, 1);
  EXPECT_EQ(c->value().node_rank, 2);
  EXPECT_EQ(c->value().num_nodes, 3);
  EXPECT_EQ(c->value().world_size, 6);
  EXPECT_EQ(c->value().round, 1);
  EXPECT_EQ(c->value().store_namespace, "job/1");
  EXPECT_EQ(c->value().GlobalRank(1), 5);
  EXPECT_EQ(c->value().master_address, "a.host");
  EXPECT_EQ(c->value().node_ids, (std::vector<NodeId>{NodeId("a"), NodeId("b"), NodeId("c")}));
  EXPECT_EQ(State().phase, RoundPhase::kClosed);
}

TEST_F(RendezvousCoreTest, RoundClosesAfterLastCallOnceMinNodesJoined) {
  CreateJob(2, 4, seconds(10));
  auto a = Join("a");
  clock_.Advance(seconds(50));
  core_.AdvanceTimers();
  EXPECT_FALSE(a->done());
  EXPECT_FALSE(State().last_call_deadline.has_value());
  auto b = Join("b");
  ASSERT_TRUE(State().last_call_deadline.has_value());
  EXPECT_EQ(*State().last_call_deadline, clock_.Now() + seconds(10));
  clock_.Advance(seconds(9));
  EXPECT_EQ(core_.AdvanceTimers(), clock_.Now() + seconds(1));
  auto c = Join("c");  // joins during the last call
  EXPECT_FALSE(a->done());
  clock_.Advance(seconds(1));
  core_.AdvanceTimers();
  ASSERT_TRUE(a->done() && b->done() && c->done());
  EXPECT_EQ(a->value().num_nodes, 3);
}

TEST_F(RendezvousCoreTest, ZeroLastCallClosesAsSoonAsMinNodesJoin) {
  CreateJob(2, 8, Duration::zero());
  auto a = Join("a");
  auto b = Join("b");
  ASSERT_TRUE(a->done() && b->done());
  EXPECT_EQ(b->value().num_nodes, 2);
}

TEST_F(RendezvousCoreTest, LeaverBeforeCloseIsRemovedAndGetsAborted) {
  CreateJob(2, 3);
  auto a = Join("a");
  auto b = Join("b");
  ASSERT_TRUE(State().last_call_deadline.has_value());
  ASSERT_TRUE(core_.Leave(JobId("job"), NodeId("b"), 1).ok());
  ASSERT_TRUE(b->done());
  EXPECT_EQ(b->code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(State().last_call_deadline.has_value());  // below min again
  auto c = Join("c");
  auto d = Join("d");
  ASSERT_TRUE(a->done() && c->done() && d->done());
  EXPECT_EQ(a->value().node_ids, (std::vector<NodeId>{NodeId("a"), NodeId("c"), NodeId("d")}));
}

TEST_F(RendezvousCoreTest, LateJoinerWaitsForTheNextRound) {
  CreateJob(2, 2);
  auto a = Join("a");
  auto b = Join("b");
  ASSERT_TRUE(a->done());
  auto late = Join("late");
  EXPECT_FALSE(late->done());
  EXPECT_EQ(State().waiting, (std::vector<NodeId>{NodeId("late")}));
  ASSERT_EQ(*core_.OpenNextRound(JobId("job")), 2);
  EXPECT_FALSE(late->done());  // min 2: the late node alone cannot close round 2
  auto a2 = Join("a", 2);
  ASSERT_TRUE(late->done() && a2->done());
  EXPECT_EQ(late->value().round, 2);
  EXPECT_EQ(late->value().store_namespace, "job/2");
  EXPECT_EQ(a2->value().node_rank, 0);  // survivor keeps rank 0
  EXPECT_EQ(late->value().node_rank, 1);
}

TEST_F(RendezvousCoreTest, ParticipantRejoiningClosedRoundGetsSameResult) {
  CreateJob(1, 1);
  auto a = Join("a");
  ASSERT_TRUE(a->done());
  auto again = Join("a");
  ASSERT_TRUE(again->done());
  EXPECT_EQ(again->value().node_rank, a->value().node_rank);
  EXPECT_EQ(again->value().round, 1);
}

TEST_F(RendezvousCoreTest, SurvivorsKeepTheirRanksAcrossRounds) {
  CreateJob(1, 4, seconds(5));
  auto a = Join("a"), b = Join("b"), c = Join("c"), d = Join("d");
  ASSERT_TRUE(d->done());
  // b dies; a newcomer "aa" (sorts first) arrives.
  ASSERT_TRUE(*core_.MarkNodesDead(JobId("job"), {NodeId("b")}));
  ASSERT_EQ(*core_.OpenNextRound(JobId("job")), 2);
  auto d2 = Join("d"), aa = Join("aa"), a2 = Join("a"), c2 = Join("c");
  ASSERT_TRUE(d2->done());
  EXPECT_EQ(a2->value().node_rank, 0);
  EXPECT_EQ(c2->value().node_rank, 2);
  EXPECT_EQ(d2->value().node_rank, 3);
  EXPECT_EQ(aa->value().node_rank, 1);  // takes the free rank of b
}

TEST_F(RendezvousCoreTest, ShrinkingMovesOnlyTheSurvivorsWhoseRankNoLongerFits) {
  CreateJob(1, 4, seconds(5));
  auto a = Join("a"), b = Join("b"), c = Join("c"), d = Join("d");
  ASSERT_TRUE(*core_.MarkNodesDead(JobId("job"), {NodeId("a"), NodeId("b")}));
  ASSERT_EQ(*core_.OpenNextRound(JobId("job")), 2);
  auto c2 = Join("c"), d2 = Join("d");
  clock_.Advance(seconds(5));
  core_.AdvanceTimers();
  ASSERT_TRUE(c2->done() && d2->done());
  // c had rank 2, d rank 3; neither fits in [0, 2): they fill 0, 1 in order.
  EXPECT_EQ(c2->value().node_rank, 0);
  EXPECT_EQ(d2->value().node_rank, 1);
}

TEST_F(RendezvousCoreTest, RanksAreDeterministicForTheSameMembership) {
  std::vector<int> ranks_first;
  for (int trial = 0; trial < 2; ++trial) {
    FakeClock clock;
    RendezvousCore core(&clock, NoTimerThread());
    RendezvousJobConfig config;
    config.job_id = JobId("job");
    config.max_nodes = 3;
    ASSERT_TRUE(core.CreateJob(config).ok());
    std::vector<std::string> order =
        trial == 0 ? std::vector<std::string>{"x", "y", "z"} : std::vector<std::string>{"z", "x", "y"};
    std::map<std::string, int> ranks;
    for (const auto& node : order) {
      JoinRequest request;
      request.job_id = JobId("job");
      request.node_id = NodeId(node);
      core.Join(request, MonoTime::max(),
                [&ranks, node](StatusOr<RendezvousResult> r) { ranks[node] = r->node_rank; });
    }
    std::vector<int> got{ranks["x"], ranks["y"], ranks["z"]};
    if (trial == 0) ranks_first = got;
    EXPECT_EQ(got, ranks_first);
  }
}

TEST_F(RendezvousCoreTest, JoinTimeoutFailsTheJoinAndRemovesTheNode) {
  CreateJob(3, 3);
  auto a = Join("a", 0, clock_.Now() + seconds(5));
  auto b = Join("b");
  clock_.Advance(seconds(5));
  core_.AdvanceTimers();
  ASSERT_TRUE(a->done());
  EXPECT_EQ(a->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(a->result->status().message().find("min 3"), std::string::npos);
  EXPECT_EQ(State().participants, (std::vector<NodeId>{NodeId("b")}));
}

TEST_F(RendezvousCoreTest, JobJoinTimeoutAppliesWhenJoinNamesNone) {
  CreateJob(2, 2);
  auto a = Join("a");
  clock_.Advance(seconds(99));
  core_.AdvanceTimers();
  EXPECT_FALSE(a->done());
  clock_.Advance(seconds(1));
  core_.AdvanceTimers();
  ASSERT_TRUE(a->done());
  EXPECT_EQ(a->code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(RendezvousCoreTest, CloseRoundNeedsMinNodes) {
  CreateJob(2, 4);
  auto a = Join("a");
  Status early = core_.CloseRound(JobId("job"));
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(early.message().find("min_nodes is 2"), std::string::npos);
  auto b = Join("b");
  ASSERT_TRUE(core_.CloseRound(JobId("job")).ok());
  ASSERT_TRUE(a->done() && b->done());
  EXPECT_TRUE(core_.CloseRound(JobId("job")).ok());
}

TEST_F(RendezvousCoreTest, UnknownJobIsNotFound) {
  auto a = Join("a");
  ASSERT_TRUE(a->done());
  EXPECT_EQ(a->code(), absl::StatusCode::kNotFound);
  EXPECT_NE(a->result->status().message().find("job"), std::string::npos);
  EXPECT_EQ(core_.Leave(JobId("nope"), NodeId("a"), 0).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_.GetState(JobId("nope")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_.OpenNextRound(JobId("nope")).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RendezvousCoreTest, StaleRoundIsAbortedAndFutureRoundIsFailedPrecondition) {
  CreateJob(1, 1);
  Join("a");
  ASSERT_EQ(*core_.OpenNextRound(JobId("job")), 2);
  auto stale = Join("a", 1);
  ASSERT_TRUE(stale->done());
  EXPECT_EQ(stale->code(), absl::StatusCode::kAborted);
  EXPECT_NE(stale->result->status().message().find("stale"), std::string::npos);
  auto future = Join("a", 3);
  EXPECT_EQ(future->code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(core_.Leave(JobId("job"), NodeId("a"), 1).code(), absl::StatusCode::kAborted);
}

TEST_F(RendezvousCoreTest, BadInputIsInvalidArgument) {
  CreateJob(1, 2, seconds(1), /*nproc=*/2);
  auto empty = Join("");
  EXPECT_EQ(empty->code(), absl::StatusCode::kInvalidArgument);
  auto joined = std::make_shared<Joined>();
  JoinRequest request;
  request.job_id = JobId("job");
  request.node_id = NodeId("a");
  request.nproc_per_node = 3;
  core_.Join(request, MonoTime::max(),
             [joined](StatusOr<RendezvousResult> r) { joined->result = std::move(r); });
  EXPECT_EQ(joined->code(), absl::StatusCode::kInvalidArgument);
  RendezvousJobConfig bad;
  bad.job_id = JobId("bad");
  bad.min_nodes = 3;
  bad.max_nodes = 2;
  EXPECT_EQ(core_.CreateJob(bad).code(), absl::StatusCode::kInvalidArgument);
  bad.min_nodes = 1;
  bad.nproc_per_node = 0;
  EXPECT_EQ(core_.CreateJob(bad).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(RendezvousCoreTest, CreateJobIsIdempotentButRejectsADifferentConfig) {
  CreateJob(1, 2);
  RendezvousJobConfig config;
  config.job_id = JobId("job");
  config.min_nodes = 1;
  config.max_nodes = 5;
  EXPECT_EQ(core_.CreateJob(config).code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(RendezvousCoreTest, NewerJoinOfTheSameNodeSupersedesTheOlder) {
  CreateJob(2, 2);
  auto first = Join("a");
  auto second = Join("a");
  ASSERT_TRUE(first->done());
  EXPECT_EQ(first->code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(second->done());
  EXPECT_EQ(State().participants.size(), 1u);
}

TEST_F(RendezvousCoreTest, CancelledJoinLeavesTheRoundWithoutCallback) {
  CreateJob(2, 2);
  auto a = Join("a");
  EXPECT_TRUE(core_.CancelJoin(a->id));
  EXPECT_FALSE(core_.CancelJoin(a->id));
  EXPECT_TRUE(State().participants.empty());
  auto b = Join("b");
  auto c = Join("c");
  ASSERT_TRUE(b->done());
  EXPECT_EQ(a->calls, 0);
}

TEST_F(RendezvousCoreTest, DeadParticipantOfClosedRoundIsReportedAsDeparted) {
  CreateJob(1, 2);
  Join("a");
  Join("b");
  EXPECT_FALSE(*core_.MarkNodesDead(JobId("job"), {NodeId("unknown")}));
  EXPECT_TRUE(*core_.MarkNodesDead(JobId("job"), {NodeId("a")}));
  EXPECT_EQ(State().departed, (std::vector<NodeId>{NodeId("a")}));
  ASSERT_TRUE(core_.Leave(JobId("job"), NodeId("b"), 1).ok());
  EXPECT_EQ(State().departed.size(), 2u);
  // A departed node joining again waits for the next round.
  auto a2 = Join("a");
  EXPECT_FALSE(a2->done());
  EXPECT_EQ(State().waiting, (std::vector<NodeId>{NodeId("a")}));
}

TEST_F(RendezvousCoreTest, OpenNextRoundWhileOpenCarriesPendingJoinsOver) {
  CreateJob(2, 2);
  auto a = Join("a");
  ASSERT_EQ(*core_.OpenNextRound(JobId("job")), 2);
  EXPECT_FALSE(a->done());
  auto b = Join("b", 2);
  ASSERT_TRUE(a->done() && b->done());
  EXPECT_EQ(a->value().round, 2);
}

TEST_F(RendezvousCoreTest, RemoveJobAbortsPendingJoins) {
  CreateJob(2, 2);
  auto a = Join("a");
  ASSERT_TRUE(core_.RemoveJob(JobId("job")).ok());
  ASSERT_TRUE(a->done());
  EXPECT_EQ(a->code(), absl::StatusCode::kAborted);
  EXPECT_EQ(core_.RemoveJob(JobId("job")).code(), absl::StatusCode::kNotFound);
}

TEST_F(RendezvousCoreTest, RepeatedRoundsNumberUpAndUseFreshNamespaces) {
  CreateJob(1, 1);
  for (int round = 1; round <= 5; ++round) {
    if (round > 1) {
      ASSERT_EQ(*core_.OpenNextRound(JobId("job")), round);
    }
    auto a = Join("a", round);
    ASSERT_TRUE(a->done());
    EXPECT_EQ(a->value().round, round);
    EXPECT_EQ(a->value().store_namespace, "job/" + std::to_string(round));
    EXPECT_EQ(a->value().node_rank, 0);
  }
}

TEST_F(RendezvousCoreTest, RoundClosedListenerSeesEveryCloseInRankOrder) {
  std::vector<RendezvousState> closes;
  core_.SetRoundClosedListener([&](const RendezvousState& state) { closes.push_back(state); });
  CreateJob(2, 2);
  auto b = Join("b");
  auto a = Join("a");
  ASSERT_EQ(closes.size(), 1u);
  EXPECT_EQ(closes[0].round, 1);
  EXPECT_EQ(closes[0].phase, RoundPhase::kClosed);
  EXPECT_EQ(closes[0].participants, (std::vector<NodeId>{NodeId("a"), NodeId("b")}));
  ASSERT_EQ(*core_.OpenNextRound(JobId("job")), 2);
  Join("a");
  Join("b");
  ASSERT_EQ(closes.size(), 2u);
  EXPECT_EQ(closes[1].round, 2);
}

TEST(RendezvousCoreTimerThreadTest, TimerThreadClosesRoundOnRealClock) {
  RendezvousCore core;
  RendezvousJobConfig config;
  config.job_id = JobId("job");
  config.min_nodes = 1;
  config.max_nodes = 2;
  config.last_call_timeout = std::chrono::milliseconds(20);
  ASSERT_TRUE(core.CreateJob(config).ok());
  std::mutex mu;
  std::condition_variable cv;
  std::optional<StatusOr<RendezvousResult>> result;
  JoinRequest request;
  request.job_id = JobId("job");
  request.node_id = NodeId("a");
  core.Join(request, MonoTime::max(), [&](StatusOr<RendezvousResult> r) {
    std::lock_guard<std::mutex> lock(mu);
    result = std::move(r);
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, seconds(10), [&] { return result.has_value(); }));
  ASSERT_TRUE(result->ok()) << result->status();
  EXPECT_EQ((*result)->num_nodes, 1);
}

}  // namespace
}  // namespace rendezvous
}  // namespace lockstep
