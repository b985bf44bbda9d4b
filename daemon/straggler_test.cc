#include "daemon/straggler.h"

#include "common/log_capture.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace daemon {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

v1::RankProgress Waits(int rank, std::vector<double> bucket_wait_ms, double step_ms = 250,
                       int steps = 8) {
  v1::RankProgress p;
  p.set_rank(rank);
  p.set_step_ms(step_ms);
  p.set_wait_steps(steps);
  for (double w : bucket_wait_ms) p.add_bucket_wait_ms(w);
  return p;
}

TEST(FindStragglerTest, NamesTheRankThatWaitsLeastAndTheBucketWhereOthersWaitMost) {
  auto s = FindStraggler({Waits(0, {212, 190}), Waits(1, {9, 6})});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->rank(), 1);
  EXPECT_EQ(s->lag_ms(), 203);
  EXPECT_EQ(s->bucket(), 0);
  EXPECT_EQ(s->steps(), 8);
}

TEST(FindStragglerTest, LagIsTheOtherRanksMeanSurplus) {
  auto s = FindStraggler({Waits(0, {5, 300}), Waits(1, {6, 10}), Waits(2, {4, 320})});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->rank(), 1);
  EXPECT_EQ(s->bucket(), 1);
  EXPECT_EQ(s->lag_ms(), 300);  // (300 + 320) / 2 - 10
}

TEST(FindStragglerTest, NoneWhenBalanced) {
  EXPECT_FALSE(FindStraggler({Waits(0, {30, 20}), Waits(1, {12, 9})}).has_value());
}

TEST(FindStragglerTest, NoneWhenTheLagIsASmallPartOfTheStep) {
  EXPECT_FALSE(FindStraggler({Waits(0, {150}, 1000), Waits(1, {10}, 1000)}).has_value());
}

TEST(FindStragglerTest, NoneUntilEveryRankAveragedEnoughSteps) {
  EXPECT_FALSE(FindStraggler({Waits(0, {300}), Waits(1, {5}, 250, 2)}).has_value());
  EXPECT_FALSE(FindStraggler({Waits(0, {300})}).has_value());
  EXPECT_FALSE(FindStraggler({Waits(0, {}), Waits(1, {})}).has_value());
}

const MonoTime kT0 = MonoTime(seconds(1000));

RankBeat Beat(int rank, int64_t step, MonoTime reported_at, bool in_collective = false,
              MonoTime since = {}) {
  RankBeat b;
  b.rank = rank;
  b.step = step;
  b.reported_at = reported_at;
  b.in_collective = in_collective;
  b.collective_since = since;
  b.collective_step = step + 1;
  b.collective_bucket = 3;
  b.op = "allreduce";
  return b;
}

TEST(FindHangTest, NamesTheWaitingRankAndTheSilentOne) {
  const MonoTime now = kT0 + seconds(12) + milliseconds(400);
  auto h = FindHang({Beat(0, 40, now - milliseconds(300), true, kT0),
                     Beat(1, 40, kT0 - milliseconds(200))},
                    2, now, kDefaultHangThreshold);
  ASSERT_TRUE(h.has_value());
  ASSERT_EQ(h->waiting_ranks_size(), 1);
  EXPECT_EQ(h->waiting_ranks(0), 0);
  EXPECT_EQ(h->wait_s(), 12);
  EXPECT_EQ(h->step(), 41);
  EXPECT_EQ(h->bucket(), 3);
  EXPECT_EQ(h->op(), "allreduce");
  ASSERT_EQ(h->culprits_size(), 1);
  EXPECT_EQ(h->culprits(0).rank(), 1);
  EXPECT_EQ(h->culprits(0).silent_s(), 12);
  EXPECT_EQ(h->culprits(0).last_step(), 40);
}

TEST(FindHangTest, NoneBeforeTheThreshold) {
  const MonoTime now = kT0 + seconds(4);
  EXPECT_FALSE(FindHang({Beat(0, 40, now, true, kT0), Beat(1, 40, kT0)}, 2, now,
                        kDefaultHangThreshold)
                   .has_value());
}

TEST(FindHangTest, ASilentRankIsNeverTheWaitingOne) {
  // Both stopped in a collective long ago: nobody reports, nobody "waits".
  const MonoTime now = kT0 + seconds(30);
  EXPECT_FALSE(FindHang({Beat(0, 40, kT0, true, kT0), Beat(1, 40, kT0, true, kT0)}, 2, now,
                        kDefaultHangThreshold)
                   .has_value());
}

TEST(FindHangTest, ARankOutsideTheCollectiveOrNeverReportingIsACulprit) {
  const MonoTime now = kT0 + seconds(8);
  auto h = FindHang({Beat(0, 7, now, true, kT0), Beat(1, 6, now - milliseconds(500))}, 3, now,
                    kDefaultHangThreshold);
  ASSERT_TRUE(h.has_value());
  ASSERT_EQ(h->culprits_size(), 2);
  EXPECT_EQ(h->culprits(0).rank(), 1);
  EXPECT_EQ(h->culprits(0).silent_s(), 0);  // It reports: stuck in its own code.
  EXPECT_FALSE(h->culprits(0).in_collective());
  EXPECT_EQ(h->culprits(1).rank(), 2);
  EXPECT_EQ(h->culprits(1).silent_s(), -1);  // Never reported.
}

// A job of two ranks on one node, and reports of it as the agent sends them.
class HealthTrackerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    job_.set_job_id("j1");
    job_.set_state(v1::JOB_STATE_RUNNING);
    job_.set_world_size(2);
    job_.mutable_current_round()->set_number(1);
  }
  // Rank `rank` reported `p` to its agent at agent-clock `reported_ns`.
  void SetProgress(int rank, v1::RankProgress p, int64_t reported_ns) {
    p.set_rank(rank);
    p.set_reported_mono_ns(reported_ns);
    v1::WorkerStatus* w = nullptr;
    for (auto& e : *job_.mutable_workers()) {
      if (e.rank() == rank) w = &e;
    }
    if (w == nullptr) w = job_.add_workers();
    w->set_rank(rank);
    w->set_round(1);
    w->set_state(v1::WORKER_STATE_RUNNING);
    *w->mutable_progress() = p;
  }
  // The agent sends every worker at agent-clock `sent_ns`, which the
  // coordinator places at `sent_at`; assessed at `now`.
  void Heartbeat(int64_t sent_ns, MonoTime sent_at, MonoTime now) {
    v1::AgentJobReport report;
    report.set_job_id("j1");
    report.set_round(1);
    for (const auto& w : job_.workers()) *report.add_workers() = w;
    tracker_.Update(&job_, report, sent_at, sent_ns, now);
  }

  v1::Job job_;
  HealthTracker tracker_{kDefaultHangThreshold};
};

TEST_F(HealthTrackerTest, StragglerFromTheRanksProgress) {
  SetProgress(0, Waits(0, {205}), 1);
  SetProgress(1, Waits(1, {4}), 1);
  Heartbeat(2, kT0, kT0);
  ASSERT_TRUE(job_.health().has_straggler());
  EXPECT_EQ(job_.health().straggler().rank(), 1);
  EXPECT_EQ(job_.health().straggler().lag_ms(), 201);
  EXPECT_FALSE(job_.health().has_hang());
}

TEST_F(HealthTrackerTest, StragglerLinesAreAboutTheStragglingRank) {
  LogCapture log;
  SetProgress(0, Waits(0, {205}), 1);
  SetProgress(1, Waits(1, {4}), 1);
  Heartbeat(2, kT0, kT0);
  ASSERT_TRUE(job_.health().has_straggler());
  EXPECT_NE(log.Lines().find("[health] job=j1 rank=1 straggler: the other ranks wait 201 ms per "
                             "step for rank 1 (bucket 0)\n"),
            std::string::npos)
      << log.Lines();
  // Balanced again: the line that it ended is about the same rank.
  SetProgress(0, Waits(0, {30}), 3);
  SetProgress(1, Waits(1, {12}), 3);
  Heartbeat(4, kT0 + seconds(1), kT0 + seconds(1));
  EXPECT_FALSE(job_.health().has_straggler());
  EXPECT_NE(log.Lines().find("[health] job=j1 rank=1 rank 1 is no longer a straggler\n"),
            std::string::npos)
      << log.Lines();
}

TEST_F(HealthTrackerTest, HangFromBeatsPlacedOnTheCoordinatorsClock) {
  LogCapture log;
  // The agent's clock runs 500 s ahead of the coordinator's: only its
  // differences count.
  const int64_t agent = std::chrono::nanoseconds(seconds(1500)).count();
  const int64_t ms = 1000000;
  v1::RankProgress r0;
  r0.set_step(40);
  v1::RankProgress r1 = r0;
  SetProgress(0, r0, agent);
  SetProgress(1, r1, agent);
  Heartbeat(agent + 100 * ms, kT0 + milliseconds(100), kT0 + milliseconds(100));
  EXPECT_FALSE(job_.has_health());
  // Rank 1 stops; rank 0 keeps beating from inside step 41's allreduce.
  for (int s = 1; s <= 12; ++s) {
    r0.set_in_collective(true);
    r0.set_collective_step(41);
    r0.set_collective_bucket(0);
    r0.set_collective_op("allreduce");
    r0.set_collective_wait_ms(s * 1000.0 - 100);  // Waiting since kT0 + 100 ms.
    SetProgress(0, r0, agent + s * 1000 * ms);
    Heartbeat(agent + s * 1000 * ms + 100 * ms, kT0 + seconds(s) + milliseconds(200),
              kT0 + seconds(s) + milliseconds(200));
    EXPECT_EQ(job_.health().has_hang(), s >= 5) << s;
  }
  const v1::Hang& h = job_.health().hang();
  ASSERT_EQ(h.waiting_ranks_size(), 1);
  EXPECT_EQ(h.waiting_ranks(0), 0);
  EXPECT_EQ(h.wait_s(), 12);
  EXPECT_EQ(h.step(), 41);
  ASSERT_EQ(h.culprits_size(), 1);
  EXPECT_EQ(h.culprits(0).rank(), 1);
  EXPECT_EQ(h.culprits(0).silent_s(), 12);
  EXPECT_EQ(h.culprits(0).last_step(), 40);
  // One rank waited for: the line is about it.
  EXPECT_NE(log.Lines().find("[health] job=j1 rank=1 hang: ranks [0] wait 5 s in allreduce (step "
                             "41, bucket 0) for ranks [1]"),
            std::string::npos)
      << log.Lines();
  // Rank 0 leaves the collective: the hang is over, and that line is about
  // the rank the hang was about too.
  r0.set_in_collective(false);
  r0.set_step(41);
  SetProgress(0, r0, agent + 13 * 1000 * ms);
  Heartbeat(agent + 13 * 1000 * ms + 100 * ms, kT0 + seconds(13) + milliseconds(200),
            kT0 + seconds(13) + milliseconds(200));
  EXPECT_FALSE(job_.health().has_hang());
  EXPECT_NE(log.Lines().find(
                "[health] job=j1 rank=1 hang over: no rank waits in a collective past 5 s\n"),
            std::string::npos)
      << log.Lines();
}

TEST_F(HealthTrackerTest, ClearedWhenTheJobIsNotRunning) {
  SetProgress(0, Waits(0, {205}), 1);
  SetProgress(1, Waits(1, {4}), 1);
  Heartbeat(2, kT0, kT0);
  ASSERT_TRUE(job_.has_health());
  job_.set_state(v1::JOB_STATE_CANCELLED);
  Heartbeat(3, kT0, kT0);
  EXPECT_FALSE(job_.has_health());
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
