#include "client/state_lines.h"

#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace lockstep {
namespace client {
namespace {

void AddEvent(v1::Job* job, int64_t ms, v1::JobState state, int round, int restarts,
              const std::string& detail) {
  v1::JobEvent* e = job->add_history();
  e->set_unix_ms(ms);
  e->set_state(state);
  e->set_round(round);
  e->set_restart_count(restarts);
  e->set_detail(detail);
}

// The job's snapshot fields, as a status poll returns them.
void SetSnapshot(v1::Job* job, v1::JobState state, int round, const std::string& message) {
  job->set_state(state);
  job->set_round(round);
  job->set_message(message);
}

// A job that failed once: round 1 runs and fails, round 2 runs and succeeds.
// The follower's first snapshot is round 1 RUNNING; its second is already
// SUCCEEDED. The RESTARTING, round 2's RENDEZVOUS and RUNNING in between
// are printed from the history, in order, before the final line.
TEST(StateLinesTest, StatesBetweenTwoSnapshotsArePrintedFromTheHistory) {
  v1::Job job;
  job.mutable_spec()->set_max_restarts(1);
  AddEvent(&job, 1, v1::JOB_STATE_PENDING, 0, 0, "submitted");
  AddEvent(&job, 2, v1::JOB_STATE_RENDEZVOUS, 1, 0, "round 1 opened");
  AddEvent(&job, 3, v1::JOB_STATE_RENDEZVOUS, 1, 0, "round 1 closed");
  AddEvent(&job, 4, v1::JOB_STATE_RUNNING, 1, 0, "all 2 ranks started");
  SetSnapshot(&job, v1::JOB_STATE_RUNNING, 1, "all 2 ranks started");
  StateLines lines;
  std::ostringstream first;
  lines.Print(job, first);
  // The first snapshot: what came before it is history, not news, but for
  // the states it passed through (PENDING, RENDEZVOUS) the user sees them.
  EXPECT_EQ(first.str(),
            "lockstep: PENDING  round 0  restarts 0/1  submitted\n"
            "lockstep: RENDEZVOUS  round 1  restarts 0/1  round 1 opened\n"
            "lockstep: RUNNING  round 1  restarts 0/1  all 2 ranks started\n");

  std::ostringstream same;
  lines.Print(job, same);
  EXPECT_EQ(same.str(), "") << "nothing changed";

  AddEvent(&job, 5, v1::JOB_STATE_RESTARTING, 1, 1, "restart 1 of 1 after rank 1 exited");
  AddEvent(&job, 6, v1::JOB_STATE_RENDEZVOUS, 2, 1, "round 2 opened");
  AddEvent(&job, 7, v1::JOB_STATE_RUNNING, 2, 1, "all 2 ranks started");
  AddEvent(&job, 8, v1::JOB_STATE_SUCCEEDED, 2, 1, "all 2 ranks exited 0");
  SetSnapshot(&job, v1::JOB_STATE_SUCCEEDED, 2, "all 2 ranks exited 0");
  job.set_restart_count(1);
  std::ostringstream second;
  lines.Print(job, second);
  EXPECT_EQ(second.str(),
            "lockstep: RESTARTING  round 1  restarts 1/1  restart 1 of 1 after rank 1 exited\n"
            "lockstep: RENDEZVOUS  round 2  restarts 1/1  round 2 opened\n"
            "lockstep: RUNNING  round 2  restarts 1/1  all 2 ranks started\n"
            "lockstep: SUCCEEDED  round 2  restarts 1/1  all 2 ranks exited 0\n");
}

// A message change within one state (round 1's RENDEZVOUS, opened then
// closed) is a line of its own, as before; an event that changes no state
// adds none.
TEST(StateLinesTest, AMessageChangeWithinAStateIsALineAndAnEventAloneIsNot) {
  v1::Job job;
  job.mutable_spec()->set_max_restarts(0);
  AddEvent(&job, 1, v1::JOB_STATE_RENDEZVOUS, 1, 0, "round 1 opened");
  SetSnapshot(&job, v1::JOB_STATE_RENDEZVOUS, 1, "waiting for 1..1 nodes");
  StateLines lines;
  std::ostringstream out;
  lines.Print(job, out);
  AddEvent(&job, 2, v1::JOB_STATE_RENDEZVOUS, 1, 0, "round 1 closed: nodes [a]");
  job.set_message("round 1 closed; starting 2 workers");
  lines.Print(job, out);
  EXPECT_EQ(out.str(),
            "lockstep: RENDEZVOUS  round 1  restarts 0/0  waiting for 1..1 nodes\n"
            "lockstep: RENDEZVOUS  round 1  restarts 0/0  round 1 closed; starting 2 workers\n");
}

}  // namespace
}  // namespace client
}  // namespace lockstep
