#include "client/health_format.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace client {
namespace {

TEST(HealthFormatTest, StragglerAndHangLines) {
  v1::Job job;
  job.set_state(v1::JOB_STATE_RUNNING);
  v1::Straggler* s = job.mutable_health()->mutable_straggler();
  s->set_rank(1);
  s->set_lag_ms(180);
  s->set_bucket(0);
  s->set_steps(8);
  v1::Hang* h = job.mutable_health()->mutable_hang();
  h->add_waiting_ranks(0);
  h->set_wait_s(12);
  h->set_step(41);
  h->set_bucket(3);
  h->set_op("allreduce");
  v1::HangCulprit* c = h->add_culprits();
  c->set_rank(1);
  c->set_silent_s(12);
  c->set_last_step(40);
  const auto lines = HealthLines(job);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0],
            "straggler: rank 1 (others wait 180 ms/step for it, at bucket 0; last 8 steps)");
  EXPECT_EQ(lines[1],
            "hang: rank 0 waits 12 s in allreduce (step 41, bucket 3); rank 1 silent for 12 s "
            "(last: step 40)");
  job.set_state(v1::JOB_STATE_CANCELLED);
  EXPECT_TRUE(HealthLines(job).empty());
}

// A culprit that reports: in another collective, or not in one; the op's
// text goes through Printable (a hostile agent's escape sequences).
TEST(HealthFormatTest, CulpritsThatReportSayWhereTheyAre) {
  v1::Job job;
  job.set_state(v1::JOB_STATE_RUNNING);
  v1::Hang* h = job.mutable_health()->mutable_hang();
  h->add_waiting_ranks(0);
  h->set_wait_s(9);
  h->set_step(8);
  h->set_bucket(3);
  h->set_op("all\x1b[2Jreduce");
  v1::HangCulprit* in_other = h->add_culprits();
  in_other->set_rank(1);
  in_other->set_last_step(7);
  in_other->set_in_collective(true);
  v1::HangCulprit* outside = h->add_culprits();
  outside->set_rank(2);
  outside->set_last_step(7);
  const auto lines = HealthLines(job);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("; rank 1 in another collective (step 7)"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("; rank 2 not in the collective (step 7)"), std::string::npos) << lines[0];
  EXPECT_EQ(lines[0].find('\x1b'), std::string::npos) << lines[0];
}

TEST(HealthFormatTest, StepSplitFitsEightyColumnsAndShowsComputeOnlyBackward) {
  v1::Job job;
  EXPECT_EQ(StepSplitTable(job), "");
  v1::WorkerStatus* w = job.add_workers();
  w->set_rank(0);
  v1::RankProgress* p = w->mutable_progress();
  p->set_step(12);
  p->set_step_ms(250);
  p->set_data_ms(200);
  p->set_forward_ms(10);
  p->set_backward_ms(30);
  p->set_exposed_comm_ms(20);
  p->set_optimizer_ms(5);
  const std::string t = StepSplitTable(job);
  EXPECT_EQ(t,
            "RANK  STEP       STEP_MS     DATA      FWD      BWD     COMM      OPT\n"
            "0     12           250.0    200.0     10.0     10.0     20.0      5.0\n");
  for (size_t start = 0, end; (end = t.find('\n', start)) != std::string::npos; start = end + 1) {
    EXPECT_LE(end - start, 80u);
  }
}

}  // namespace
}  // namespace client
}  // namespace lockstep
