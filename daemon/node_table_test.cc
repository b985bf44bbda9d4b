#include "daemon/node_table.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>

namespace lockstep {
namespace daemon {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class NodeTableTest : public ::testing::Test {
 protected:
  static v1::NodeInfo Info(const std::string& id, const std::string& inc = "") {
    v1::NodeInfo info;
    info.set_node_id(id);
    info.set_incarnation(inc.empty() ? "inc-" + id : inc);
    return info;
  }
  // Reports for `job` with one worker in `state` (none when UNSPECIFIED).
  static NodeTable::Reports Reports(const std::string& job = "",
                                    v1::WorkerState state = v1::WORKER_STATE_UNSPECIFIED) {
    NodeTable::Reports reports;
    if (job.empty()) return reports;
    v1::AgentJobReport* r = reports.Add();
    r->set_job_id(job);
    r->set_round(1);
    if (state != v1::WORKER_STATE_UNSPECIFIED) r->add_workers()->set_state(state);
    return reports;
  }
  MonoTime At(Duration d) const { return t0_ + d; }

  // lease 10 s, heartbeat interval 1 s: fence deadline = R + 10 + 2.5 + 1.
  NodeTable table_{seconds(10), seconds(1)};
  MonoTime t0_{seconds(1000)};
};

TEST_F(NodeTableTest, IncarnationChecks) {
  table_.Register(Info("n1"), At(seconds(0)), Reports());
  EXPECT_TRUE(table_.CheckIncarnation("n1", "inc-n1").ok());
  EXPECT_EQ(table_.CheckIncarnation("n1", "old").code(), absl::StatusCode::kAborted);
  EXPECT_EQ(table_.CheckIncarnation("nx", "inc-nx").code(), absl::StatusCode::kNotFound);
  table_.Register(Info("n1", "second"), At(seconds(1)), Reports());
  EXPECT_EQ(table_.CheckIncarnation("n1", "inc-n1").code(), absl::StatusCode::kAborted);
  EXPECT_EQ(table_.Find("n1")->incarnation(), "second");
}

TEST_F(NodeTableTest, NodeIsDeadALeaseAfterItsLastHeartbeatAndComesBack) {
  table_.Register(Info("n1"), At(seconds(0)), Reports());
  table_.CompensateStall(At(seconds(0)));
  for (int s = 1; s <= 10; ++s) {
    table_.CompensateStall(At(seconds(s)));
    EXPECT_TRUE(table_.ExpireLeases(At(seconds(s))).empty()) << s;
  }
  table_.CompensateStall(At(milliseconds(10100)));
  auto expired = table_.ExpireLeases(At(milliseconds(10100)));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].node_id, "n1");
  EXPECT_NE(expired[0].reason.find("no heartbeat for 10.1s (lease 10s)"), std::string::npos)
      << expired[0].reason;
  EXPECT_FALSE(table_.Alive("n1"));
  EXPECT_EQ(table_.DeathReason("n1"), expired[0].reason);
  EXPECT_TRUE(table_.ExpireLeases(At(seconds(11))).empty()) << "declared once";
  EXPECT_TRUE(table_.Renew("n1", At(seconds(12)), Reports())) << "it was dead";
  EXPECT_TRUE(table_.Alive("n1"));
  EXPECT_FALSE(table_.Renew("n1", At(seconds(13)), Reports()));
}

TEST_F(NodeTableTest, FenceDeadlineIsReceiptPlusLeasePlusQuarterLeasePlusOneSecond) {
  table_.Register(Info("n1"), At(seconds(0)), Reports("j", v1::WORKER_STATE_RUNNING));
  table_.Renew("n1", At(seconds(3)), Reports("j", v1::WORKER_STATE_RUNNING));
  EXPECT_EQ(table_.FenceDeadline("n1"), At(milliseconds(3000 + 10000 + 2500 + 1000)));
}

TEST_F(NodeTableTest, OwnersGoneWhenReportedStoppedOrDeadPastTheFenceDeadline) {
  table_.Register(Info("n1"), At(seconds(0)), Reports("j", v1::WORKER_STATE_RUNNING));
  table_.Register(Info("n2"), At(seconds(0)), Reports("j", v1::WORKER_STATE_RUNNING));
  EXPECT_FALSE(table_.OwnersGone("n1", "j", At(seconds(1))));
  EXPECT_TRUE(table_.OwnersGone("n1", "other", At(seconds(1)))) << "no worker of that job";
  EXPECT_TRUE(table_.OwnersGone("never-registered", "j", At(seconds(1))));

  table_.Renew("n1", At(seconds(1)), Reports("j", v1::WORKER_STATE_STOPPED));
  EXPECT_TRUE(table_.OwnersGone("n1", "j", At(seconds(1)))) << "its agent reported them stopped";

  // n2 goes silent with live workers: dead at 10 s, fenced at 13.5 s.
  table_.ExpireLeases(At(milliseconds(10001)));
  EXPECT_FALSE(table_.Alive("n2"));
  EXPECT_FALSE(table_.OwnersGone("n2", "j", At(seconds(13))));
  EXPECT_FALSE(table_.OwnersGone("n2", "j", At(milliseconds(13499))));
  EXPECT_TRUE(table_.OwnersGone("n2", "j", At(milliseconds(13500))));
}

TEST_F(NodeTableTest, EligibleNodesAreAliveReportedAndFreeOfTheJob) {
  table_.Register(Info("b"), At(seconds(0)), Reports());
  table_.Register(Info("a"), At(seconds(0)), Reports());
  table_.Register(Info("c"), At(seconds(0)), Reports("j", v1::WORKER_STATE_STARTING));
  table_.Restore(Info("d"), At(seconds(0)));  // reloaded: workers unknown
  EXPECT_EQ(table_.Eligible("j"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(table_.Eligible("k"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_FALSE(table_.OwnersGone("d", "j", At(seconds(1)))) << "unknown until it reports";
  table_.Renew("d", At(seconds(1)), Reports());
  EXPECT_EQ(table_.Eligible("j"), (std::vector<std::string>{"a", "b", "d"}));
}

TEST_F(NodeTableTest, RestoredNodeGetsAFullLeaseFromTheReload) {
  table_.Restore(Info("n1"), At(seconds(100)));
  EXPECT_TRUE(table_.Alive("n1"));
  table_.CompensateStall(At(seconds(100)));
  for (int s = 101; s <= 110; ++s) {
    table_.CompensateStall(At(seconds(s)));
    EXPECT_TRUE(table_.ExpireLeases(At(seconds(s))).empty());
  }
  table_.CompensateStall(At(seconds(111)));
  EXPECT_EQ(table_.ExpireLeases(At(seconds(111))).size(), 1u);
}

TEST_F(NodeTableTest, StallOfTheCoordinatorDoesNotCountAgainstLeases) {
  table_.Register(Info("n1"), At(seconds(0)), Reports());
  table_.Register(Info("n2"), At(seconds(0)), Reports());
  EXPECT_FALSE(table_.CompensateStall(At(seconds(0)))) << "the first call only starts the clock";
  EXPECT_FALSE(table_.CompensateStall(At(seconds(2)))) << "a gap of 2 intervals is on time";
  EXPECT_FALSE(table_.CompensateStall(At(seconds(4))));
  table_.Renew("n1", At(seconds(5)), Reports());
  EXPECT_FALSE(table_.CompensateStall(At(seconds(5))));
  // SIGSTOPped for 30 s (more than the 10 s lease): nobody could renew.
  std::optional<Duration> gap = table_.CompensateStall(At(seconds(35)));
  ASSERT_TRUE(gap.has_value());
  EXPECT_EQ(*gap, seconds(30));
  EXPECT_TRUE(table_.ExpireLeases(At(seconds(35))).empty());
  // n1 renewed at 5 s, n2 at 0 s: their leases run on from 35 s and 30 s.
  EXPECT_EQ(table_.FenceDeadline("n1"), At(milliseconds(35000 + 13500)));
  EXPECT_EQ(table_.FenceDeadline("n2"), At(milliseconds(30000 + 13500)));
  for (int s = 36; s <= 40; ++s) table_.CompensateStall(At(seconds(s)));
  auto expired = table_.ExpireLeases(At(milliseconds(40001)));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].node_id, "n2");
}

TEST_F(NodeTableTest, StallCompensationNeverMovesAHeartbeatPastNow) {
  table_.Register(Info("n1"), At(seconds(0)), Reports());
  table_.CompensateStall(At(seconds(0)));
  // A heartbeat queued during the stall is served before the tick runs.
  table_.Renew("n1", At(seconds(20)), Reports());
  ASSERT_TRUE(table_.CompensateStall(At(seconds(20))).has_value());
  EXPECT_EQ(table_.FenceDeadline("n1"), At(milliseconds(20000 + 13500)));
}

TEST_F(NodeTableTest, ListReportsAliveAndHeartbeatAge) {
  table_.Register(Info("n2"), At(seconds(0)), Reports());
  table_.Register(Info("n1"), At(seconds(2)), Reports());
  table_.ExpireLeases(At(seconds(11)));
  auto nodes = table_.List(At(seconds(11)));
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].node_id(), "n1");
  EXPECT_TRUE(nodes[0].alive());
  EXPECT_DOUBLE_EQ(nodes[0].last_heartbeat_age_s(), 9);
  EXPECT_FALSE(nodes[1].alive());
}

TEST(NodeTableClockTest, TheSmallestOffsetSeenPlacesAnAgentsInstantsAndAgesSlowly) {
  FakeClock clock;
  NodeTable table(std::chrono::seconds(10), std::chrono::seconds(1));
  v1::NodeInfo info;
  info.set_node_id("n1");
  info.set_incarnation("i1");
  table.Register(info, clock.Now(), {});
  const int64_t agent = 5'000'000'000'000;  // the agent's clock
  const auto ms = [](int64_t n) { return std::chrono::milliseconds(n); };
  // Handled 2 ms after it was sent: the first bound.
  clock.Advance(ms(2));
  MonoTime placed = table.PlaceAgentInstant("n1", clock.Now(), agent);
  EXPECT_EQ(placed, clock.Now());
  // Sent 1 s later, handled 300 ms late: placed by the earlier offset, aged
  // by at most 1.3 ms (1 ms per second).
  clock.Advance(ms(1300));
  placed = table.PlaceAgentInstant("n1", clock.Now(), agent + 1'000'000'000);
  EXPECT_LE(placed, clock.Now() - ms(298));
  EXPECT_GE(placed, clock.Now() - ms(300));
  // A quicker request lowers the estimate at once.
  clock.Advance(ms(1000));
  placed = table.PlaceAgentInstant("n1", clock.Now(), agent + 2'300'000'000);
  EXPECT_EQ(placed, clock.Now());
  // No stamp: the receipt.
  EXPECT_EQ(table.PlaceAgentInstant("n1", clock.Now(), 0), clock.Now());
  // A new registration (maybe another host) forgets the offset.
  table.Register(info, clock.Now(), {});
  clock.Advance(ms(50));
  EXPECT_EQ(table.PlaceAgentInstant("n1", clock.Now(), 1), clock.Now());
}

// Stamps at int64's ends place nothing further than kMaxAgentClockSpan
// from the receipt, so later arithmetic on the instant cannot overflow.
// Found by //tests/fuzz:coordinator_fuzzer (UBSan).
TEST(NodeTableClockTest, ExtremeStampsArePlacedWithinADayOfTheReceipt) {
  FakeClock clock;
  NodeTable table(std::chrono::seconds(10), std::chrono::seconds(1));
  v1::NodeInfo info;
  info.set_node_id("n1");
  info.set_incarnation("i1");
  table.Register(info, clock.Now(), {});
  clock.Advance(std::chrono::seconds(5));
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(table.PlaceAgentInstant("n1", clock.Now(), max), clock.Now());
  // The offset learnt from `max` would place a small stamp 292 years back.
  EXPECT_EQ(table.PlaceAgentInstant("n1", clock.Now(), 1), clock.Now() - kMaxAgentClockSpan);
}

// Ids and incarnations in errors are quoted, short and escaped: a
// heartbeat may carry any bytes. Found by //tests/fuzz:coordinator_fuzzer.
TEST(NodeTableIncarnationTest, ErrorsQuoteUnknownIdsAndIncarnationsShortAndEscaped) {
  NodeTable table(std::chrono::seconds(10), std::chrono::seconds(1));
  v1::NodeInfo info;
  info.set_node_id("n1");
  info.set_incarnation(std::string(3000, 'i'));
  table.Register(info, MonoTime(), {});
  Status unknown = table.CheckIncarnation("\x1b[2J" + std::string(2000, 'n'), "x");
  EXPECT_TRUE(absl::IsNotFound(unknown)) << unknown;
  EXPECT_LT(unknown.message().size(), 200u) << unknown;
  EXPECT_EQ(unknown.message().find('\x1b'), std::string::npos) << unknown;
  Status stale = table.CheckIncarnation("n1", "new\n" + std::string(3000, 'j'));
  EXPECT_TRUE(absl::IsAborted(stale)) << stale;
  EXPECT_LT(stale.message().size(), 400u) << stale;
  EXPECT_EQ(stale.message().find('\n'), std::string::npos) << stale;
  EXPECT_EQ(stale.message().rfind("node n1: stale incarnation \"new\\n", 0), 0u) << stale;
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
