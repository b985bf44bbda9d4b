#include "client/progress_reporter.h"

#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "lockstep/v1/agent.grpc.pb.h"

namespace lockstep {
namespace client {
namespace {

class RecordingAgent : public v1::AgentService::Service {
 public:
  grpc::Status ReportProgress(grpc::ServerContext*, const v1::ReportProgressRequest* req,
                              v1::ReportProgressResponse*) override {
    std::lock_guard<std::mutex> lock(mu);
    ++calls;
    if (calls <= fail_first) return grpc::Status(fail_with, "not now");
    last = *req;
    return grpc::Status::OK;
  }
  std::mutex mu;
  v1::ReportProgressRequest last;
  int calls = 0;
  // The first `fail_first` calls answer `fail_with` and are not recorded.
  int fail_first = 0;
  grpc::StatusCode fail_with = grpc::StatusCode::UNAVAILABLE;
};

// A report of `step` with `loss` (NaN: unknown).
Progress AtStep(int64_t step, double loss = std::nan("")) {
  Progress p;
  p.step = step;
  p.loss = loss;
  return p;
}

// Serves `agent` on a free loopback port and points LOCKSTEP_AGENT at it.
std::unique_ptr<grpc::Server> Serve(RecordingAgent* agent) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(agent);
  auto server = builder.BuildAndStart();
  ::setenv("LOCKSTEP_AGENT", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
  return server;
}

TEST(ProgressReporterTest, DisabledWithoutAgentAddress) {
  ::unsetenv("LOCKSTEP_AGENT");
  auto r = ProgressReporter::FromEnv();
  EXPECT_FALSE(r->enabled());
  r->Report(AtStep(1));
  r->Flush(std::chrono::milliseconds(10));
}

TEST(ProgressReporterTest, SendsTheLatestReportWithRunIdentity) {
  RecordingAgent agent;
  auto server = Serve(&agent);
  ::setenv("LOCKSTEP_AGENT_TOKEN", "pt-1", 1);
  ::setenv("LOCKSTEP_JOB_ID", "j-1", 1);
  ::setenv("LOCKSTEP_ROUND", "3", 1);
  ::setenv("LOCKSTEP_RANK", "2", 1);
  auto r = ProgressReporter::FromEnv();
  ASSERT_TRUE(r->enabled());
  for (int i = 1; i <= 5; ++i) r->Report(AtStep(i, 1.0 / i));
  r->Flush(std::chrono::seconds(5));
  std::lock_guard<std::mutex> lock(agent.mu);
  EXPECT_GE(agent.calls, 1);
  EXPECT_EQ(agent.last.progress().step(), 5);
  EXPECT_EQ(agent.last.progress().rank(), 2);
  EXPECT_EQ(agent.last.round(), 3);
  EXPECT_EQ(agent.last.job_id(), "j-1");
  EXPECT_EQ(agent.last.token(), "pt-1");
  server->Shutdown();
}

TEST(ProgressReporterTest, BeatsResendTheLatestReportWithTheCollectiveWait) {
  RecordingAgent agent;
  auto server = Serve(&agent);
  auto r = ProgressReporter::FromEnv();
  r->Report(AtStep(7));
  ddp::CollectiveState c;
  c.active = true;
  c.step = 8;
  c.bucket = 1;
  c.op = "allreduce";
  c.since = std::chrono::steady_clock::now() - std::chrono::seconds(2);
  r->SetCollective(c);
  // No new step: only a beat can carry the collective (within ~1 s).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  v1::RankProgress got;
  while (std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(agent.mu);
      got = agent.last.progress();
    }
    if (got.in_collective()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(got.in_collective());
  EXPECT_EQ(got.step(), 7);
  EXPECT_EQ(got.collective_step(), 8);
  EXPECT_EQ(got.collective_bucket(), 1);
  EXPECT_EQ(got.collective_op(), "allreduce");
  EXPECT_GE(got.collective_wait_ms(), 2000);
  r.reset();
  server->Shutdown();
}

// A report lost on the way is sent again: Flush returns once the last one
// arrived, and the destructor (a worker's exit) delivers the final step.
TEST(ProgressReporterTest, LostReportsAreSentAgainUntilTheyArrive) {
  RecordingAgent agent;
  agent.fail_first = 3;
  auto server = Serve(&agent);
  auto r = ProgressReporter::FromEnv();
  r->Report(AtStep(5));
  r->Flush(std::chrono::seconds(20));
  {
    std::lock_guard<std::mutex> lock(agent.mu);
    EXPECT_EQ(agent.last.progress().step(), 5) << agent.calls << " calls";
    EXPECT_GE(agent.calls, 4);
    agent.fail_first = agent.calls + 2;
  }
  r->Report(AtStep(6));
  r.reset();
  std::lock_guard<std::mutex> lock(agent.mu);
  EXPECT_EQ(agent.last.progress().step(), 6) << "the final step was lost at exit";
  server->Shutdown();
}

// A refusal (a wrong token, a stale round) is final: Flush returns after
// it, where sending it again would have kept Flush retrying (every 50 ms,
// doubling) for its whole timeout. At most one beat (a second) may follow.
TEST(ProgressReporterTest, RefusedReportIsNotSentAgain) {
  RecordingAgent agent;
  agent.fail_first = 1000;
  auto server = Serve(&agent);
  for (auto code : {grpc::StatusCode::PERMISSION_DENIED, grpc::StatusCode::ABORTED}) {
    {
      std::lock_guard<std::mutex> lock(agent.mu);
      agent.calls = 0;
      agent.fail_with = code;
    }
    auto r = ProgressReporter::FromEnv();
    r->Report(AtStep(5));
    r->Flush(std::chrono::seconds(20));
    {
      std::lock_guard<std::mutex> lock(agent.mu);
      EXPECT_LE(agent.calls, 2) << code;
    }
    r.reset();
  }
  server->Shutdown();
}

// An agent that takes every report and answers none until Open(): each
// RPC ends at the reporter's deadline (kReportDeadline) instead.
class HoldingAgent : public v1::AgentService::Service {
 public:
  grpc::Status ReportProgress(grpc::ServerContext*, const v1::ReportProgressRequest* req,
                              v1::ReportProgressResponse*) override {
    std::unique_lock<std::mutex> lock(mu);
    ++entered;
    cv.notify_all();
    cv.wait_for(lock, std::chrono::seconds(60), [&] { return open; });
    // Held ones end in any order once open: the highest step delivered.
    max_step = std::max(max_step, req->progress().step());
    return grpc::Status::OK;
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
  std::mutex mu;
  std::condition_variable cv;
  int entered = 0;
  bool open = false;
  int64_t max_step = -1;
};

// Report stores the value and returns, whatever the agent does: with the
// agent holding the first RPC, 1000 more reports all return (a Report that
// sent, or waited for its send, would take kReportDeadline each: over
// 8 minutes), and the latest is what reaches the agent once it answers.
TEST(ProgressReporterTest, AgentThatNeverAnswersNeverBlocksReport) {
  HoldingAgent agent;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&agent);
  auto server = builder.BuildAndStart();
  ::setenv("LOCKSTEP_AGENT", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
  auto r = ProgressReporter::FromEnv();
  r->Report(AtStep(0));
  bool reached;
  {
    std::unique_lock<std::mutex> lock(agent.mu);
    reached = agent.cv.wait_for(lock, std::chrono::seconds(20), [&] { return agent.entered > 0; });
  }
  if (!reached) agent.Open();
  ASSERT_TRUE(reached) << "the first report never reached the agent in 20 s";
  std::atomic<int> returned{0};
  std::thread reporting([&] {
    for (int i = 1; i <= 1000; ++i) {
      r->Report(AtStep(i));
      ++returned;
    }
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (returned < 1000 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const int returned_while_held = returned;
  agent.Open();  // lets a blocked Report, if any, finish
  reporting.join();
  ASSERT_EQ(returned_while_held, 1000)
      << "Report calls that returned in 20 s while the agent held the reporter's RPC";
  r->Flush(std::chrono::seconds(20));
  {
    std::lock_guard<std::mutex> lock(agent.mu);
    EXPECT_EQ(agent.max_step, 1000) << agent.entered << " RPCs";
  }
  r.reset();
  server->Shutdown();
}

}  // namespace
}  // namespace client
}  // namespace lockstep
