#include "daemon/straggler.h"

#include <cmath>
#include <functional>
#include <limits>

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

// A rank that arrived in the waiters' collective (same step and bucket)
// after them, and reports, is neither waiting yet nor what they wait for;
// one in another collective is a culprit, said to be in a collective.
TEST(FindHangTest, ALateArrivalInTheSameCollectiveIsNoCulprit) {
  const MonoTime now = kT0 + seconds(8);
  RankBeat late = Beat(1, 7, now, true, now - seconds(1));  // same step 8, bucket 3
  RankBeat other = Beat(2, 7, now, true, now - seconds(1));
  other.collective_bucket = 5;
  auto h = FindHang({Beat(0, 7, now, true, kT0), late, other}, 3, now, kDefaultHangThreshold);
  ASSERT_TRUE(h.has_value());
  ASSERT_EQ(h->culprits_size(), 1);
  EXPECT_EQ(h->culprits(0).rank(), 2);
  EXPECT_TRUE(h->culprits(0).in_collective());
  EXPECT_EQ(h->culprits(0).silent_s(), 0);
}

// What a rank's progress may hold: durations finite, 0 to 1e9 ms; counts
// not negative; a collective's name. A NaN loss is a diverged run's, not
// bad input.
TEST(CheckProgressTest, RefusesWhatTheHealthChecksCannotComputeWith) {
  v1::RankProgress ok;
  ok.set_step(3);
  ok.set_step_ms(120);
  ok.add_bucket_wait_ms(4);
  ok.set_collective_bucket(-1);
  ok.set_collective_op("allreduce");
  ok.set_loss(std::nan(""));
  ok.set_samples_per_s(std::numeric_limits<double>::infinity());
  EXPECT_TRUE(CheckProgress(ok).ok()) << CheckProgress(ok);
  auto refused = [&](std::function<void(v1::RankProgress*)> change, const std::string& want) {
    v1::RankProgress p = ok;
    change(&p);
    Status s = CheckProgress(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << want;
    EXPECT_NE(s.message().find(want), std::string::npos) << s;
  };
  refused([](auto* p) { p->set_collective_wait_ms(std::nan("")); }, "collective_wait_ms is nan");
  refused([](auto* p) { p->set_collective_wait_ms(1e13); }, "collective_wait_ms is 1e+13");
  refused([](auto* p) { p->set_step_ms(-1); }, "step_ms is -1");
  refused([](auto* p) { p->set_bucket_wait_ms(0, -1e6); }, "bucket_wait_ms[0] is -1e+06");
  refused([](auto* p) { p->add_bucket_wait_ms(std::numeric_limits<double>::infinity()); },
          "bucket_wait_ms[1] is inf");
  refused([](auto* p) { p->set_step(-2); }, "step is -2");
  refused([](auto* p) { p->set_collective_bucket(-7); }, "collective_bucket is -7");
  refused([](auto* p) { p->set_collective_op("all\x1b[31mreduce"); }, "is not a collective's name");
}

// A job of two ranks on one node, and reports of it as the agent sends them.
class HealthTrackerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    job_.set_job_id("j1");
    job_.set_state(v1::JOB_STATE_RUNNING);
    job_.set_world_size(2);
    job_.mutable_spec()->set_nproc_per_node(2);
    job_.mutable_current_round()->set_number(1);
    job_.mutable_current_round()->set_closed(true);
    job_.mutable_current_round()->add_node_ids("n1");
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
  void Heartbeat(int64_t sent_ns, MonoTime sent_at, MonoTime now, const std::string& node = "n1") {
    v1::AgentJobReport report;
    report.set_job_id("j1");
    report.set_round(1);
    for (const auto& w : job_.workers()) *report.add_workers() = w;
    tracker_.Update(&job_, node, report, sent_at, sent_ns, now);
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

// Only the ranks the round gives the reporting node, with values the checks
// can use, and a send instant that places them: a report of rank 0 from
// another node, of rank 1e9, with a NaN wait or an unusable sent_mono_ns
// changes nothing.
TEST_F(HealthTrackerTest, BeatsComeOnlyFromTheNodesOwnRanksWithUsableValues) {
  const int64_t ms = 1000 * 1000;
  v1::RankProgress waiting;
  waiting.set_step(40);
  waiting.set_in_collective(true);
  waiting.set_collective_step(41);
  waiting.set_collective_bucket(3);
  waiting.set_collective_op("allreduce");
  waiting.set_collective_wait_ms(0);
  SetProgress(0, waiting, 1 * ms);
  v1::RankProgress working;
  working.set_step(40);
  SetProgress(1, working, 1 * ms);
  Heartbeat(2 * ms, kT0, kT0);
  ASSERT_FALSE(job_.health().has_hang());
  // Twelve seconds on, rank 0 still waits and says so; rank 1 works on.
  const MonoTime later = kT0 + seconds(12);
  waiting.set_collective_wait_ms(12000);
  SetProgress(0, waiting, 12000 * ms);
  SetProgress(1, working, 12000 * ms);
  Heartbeat(12001 * ms, later, later);
  ASSERT_TRUE(job_.health().has_hang());
  const v1::Hang real = job_.health().hang();

  // From a node the round does not have: nothing recorded.
  v1::RankProgress quiet = working;
  quiet.set_in_collective(false);
  SetProgress(0, quiet, 12100 * ms);
  Heartbeat(12101 * ms, later, later, "n2");
  EXPECT_TRUE(job_.health().has_hang()) << "another node's report overwrote rank 0's beat";
  SetProgress(0, waiting, 12000 * ms);

  // A rank no world has.
  v1::WorkerStatus* ghost = job_.add_workers();
  ghost->set_rank(1000000000);
  ghost->set_round(1);
  ghost->set_state(v1::WORKER_STATE_RUNNING);
  *ghost->mutable_progress() = waiting;
  ghost->mutable_progress()->set_rank(1000000000);
  Heartbeat(12001 * ms, later, later);
  ASSERT_TRUE(job_.health().has_hang());
  EXPECT_EQ(job_.health().hang().SerializeAsString(), real.SerializeAsString());
  job_.mutable_workers()->RemoveLast();

  // A NaN wait (undefined as a duration before): left out, rank 0's
  // earlier beat stands.
  v1::RankProgress nan = waiting;
  nan.set_collective_wait_ms(std::nan(""));
  SetProgress(0, nan, 12200 * ms);
  Heartbeat(12201 * ms, later, later);
  ASSERT_TRUE(job_.health().has_hang());
  EXPECT_EQ(job_.health().hang().wait_s(), real.wait_s());

  // A send instant that cannot be subtracted from, or none.
  SetProgress(0, quiet, 12300 * ms);
  Heartbeat(std::numeric_limits<int64_t>::min(), later, later);
  EXPECT_TRUE(job_.health().has_hang());
  Heartbeat(0, later, later);
  EXPECT_TRUE(job_.health().has_hang());
  // The same report, placed: rank 0 no longer waits.
  Heartbeat(12301 * ms, later, later);
  EXPECT_FALSE(job_.health().has_hang());
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
