#include "client/progress_reporter.h"

#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <mutex>

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
    last = *req;
    ++calls;
    return grpc::Status::OK;
  }
  std::mutex mu;
  v1::ReportProgressRequest last;
  int calls = 0;
};

TEST(ProgressReporterTest, DisabledWithoutAgentAddress) {
  ::unsetenv("LOCKSTEP_AGENT");
  auto r = ProgressReporter::FromEnv();
  EXPECT_FALSE(r->enabled());
  r->Report({.step = 1});
  r->Flush(std::chrono::milliseconds(10));
}

TEST(ProgressReporterTest, SendsTheLatestReportWithRunIdentity) {
  RecordingAgent agent;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&agent);
  auto server = builder.BuildAndStart();
  ::setenv("LOCKSTEP_AGENT", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
  ::setenv("LOCKSTEP_AGENT_TOKEN", "pt-1", 1);
  ::setenv("LOCKSTEP_JOB_ID", "j-1", 1);
  ::setenv("LOCKSTEP_ROUND", "3", 1);
  ::setenv("LOCKSTEP_RANK", "2", 1);
  auto r = ProgressReporter::FromEnv();
  ASSERT_TRUE(r->enabled());
  for (int i = 1; i <= 5; ++i) r->Report({.step = i, .loss = 1.0 / i});
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

TEST(ProgressReporterTest, UnreachableAgentNeverBlocksReport) {
  ::setenv("LOCKSTEP_AGENT", "127.0.0.1:1", 1);
  auto r = ProgressReporter::FromEnv();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 1000; ++i) r->Report({.step = i});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));
}

}  // namespace
}  // namespace client
}  // namespace lockstep
