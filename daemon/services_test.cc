// The gRPC shells over loopback port 0: auth, status mapping, the WatchJob
// long poll, and an agent driven by the coordinator through gRPC.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <limits>
#include <regex>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/log_capture.h"
#include "daemon/agent.h"
#include "daemon/agent_service.h"
#include "daemon/coordinator.h"
#include "daemon/coordinator_service.h"
#include "daemon/fake_job_store.h"
#include "daemon/grpc_coordinator_client.h"
#include "daemon/job_spec.h"
#include "daemon/log_ticket.h"
#include "daemon/process_launcher.h"
#include "daemon/roles.h"
#include "daemon/token.h"
#include "rendezvous/grpc_limits.h"

namespace lockstep {
namespace daemon {
namespace {

constexpr char kToken[] = "t0ken";  // admin
constexpr char kViewerToken[] = "v1ewer";
constexpr char kAgentToken[] = "ag3nt";

class ServicesTest : public ::testing::Test {
 protected:
  ServicesTest() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    CoordinatorOptions options;
    options.heartbeat_interval = std::chrono::milliseconds(50);
    coordinator_ = std::make_unique<Coordinator>(options, RealClock(), &store_);
    EXPECT_TRUE(coordinator_->Recover().ok());
    roles_.SetToken(Role::kAdmin, kToken);
    roles_.SetToken(Role::kViewer, kViewerToken);
    roles_.SetToken(Role::kAgent, kAgentToken);
    coordinator_service_ =
        std::make_unique<CoordinatorGrpcService>(coordinator_.get(), &roles_, kToken);
    launcher_ = NewPosixProcessLauncher();
    AgentOptions agent_options;
    agent_options.node_id = "n1";
    agent_options.state_dir = std::string(tmp ? tmp : "/tmp") + "/services";
    agent_options.base_env = {"PATH=/usr/bin:/bin"};
    agent_ = std::make_unique<Agent>(agent_options, RealClock(), launcher_.get(), &client_proxy_);
    agent_service_ = std::make_unique<AgentGrpcService>(agent_.get());

    grpc::ServerBuilder builder;
    rendezvous::ApplyMessageLimits(&builder);  // as lockstepd's servers
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(coordinator_service_.get());
    builder.RegisterService(agent_service_.get());
    server_ = builder.BuildAndStart();
    address_ = "127.0.0.1:" + std::to_string(port);
    auto channel = rendezvous::CreateLockstepChannel(address_);
    coord_stub_ = v1::CoordinatorService::NewStub(channel);
    agent_stub_ = v1::AgentService::NewStub(channel);
    client_proxy_.client = std::make_unique<GrpcCoordinatorClient>(channel, kAgentToken, address_);
    agent_->SetAgentAddress(address_);
  }
  ~ServicesTest() override {
    agent_->Shutdown(std::chrono::milliseconds(200));
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  }

  std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token = kToken) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return ctx;
  }

  // A call to the agent carrying log ticket `ticket`.
  std::unique_ptr<grpc::ClientContext> TicketCtx(const std::string& ticket) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata("authorization", "Ticket " + ticket);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return ctx;
  }

  static int64_t UnixNow() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  struct Proxy : CoordinatorClient {
    StatusOr<v1::RegisterNodeResponse> RegisterNode(const v1::RegisterNodeRequest& r,
                                                    Duration t) override {
      return client->RegisterNode(r, t);
    }
    StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& r, Duration t) override {
      return client->Heartbeat(r, t);
    }
    std::unique_ptr<GrpcCoordinatorClient> client;
  };

  FakeJobStore store_;
  RoleTokens roles_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<CoordinatorGrpcService> coordinator_service_;
  std::unique_ptr<ProcessLauncher> launcher_;
  Proxy client_proxy_;
  std::unique_ptr<Agent> agent_;
  std::unique_ptr<AgentGrpcService> agent_service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<v1::CoordinatorService::Stub> coord_stub_;
  std::unique_ptr<v1::AgentService::Stub> agent_stub_;
};

TEST_F(ServicesTest, EveryCallNeedsTheToken) {
  v1::ListJobsResponse resp;
  EXPECT_EQ(coord_stub_->ListJobs(Ctx("").get(), {}, &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(coord_stub_->ListJobs(Ctx("wrong").get(), {}, &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  v1::SubmitJobRequest submit;
  submit.mutable_spec()->add_command("/bin/true");
  submit.mutable_spec()->set_min_nodes(1);
  submit.mutable_spec()->set_nproc_per_node(1);
  v1::SubmitJobResponse sresp;
  EXPECT_EQ(coord_stub_->SubmitJob(Ctx("wrong").get(), submit, &sresp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(coordinator_->ListJobs({})->empty()) << "nothing changed";
  v1::ReadLogsResponse lresp;
  // Before it registers the agent has no log key to check tickets with.
  EXPECT_EQ(agent_stub_->ReadLogs(Ctx().get(), {}, &lresp).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  agent_->RunOnce();
  ASSERT_TRUE(agent_->registered());
  // Its own key only, derived from the coordinator's store key.
  EXPECT_EQ(agent_->LogTicketKey(), NodeLogKey(kToken, "n1"));
  EXPECT_EQ(agent_stub_->ReadLogs(Ctx("").get(), {}, &lresp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(agent_stub_->ReadLogs(Ctx("wrong").get(), {}, &lresp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // No cluster token opens an agent, the admin's included.
  for (const char* token : {kToken, kViewerToken, kAgentToken}) {
    grpc::Status s = agent_stub_->ReadLogs(Ctx(token).get(), {}, &lresp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << token;
    EXPECT_NE(s.error_message().find("agents take log tickets, not bearer tokens"),
              std::string::npos)
        << s.error_message();
  }
  EXPECT_TRUE(coord_stub_->ListJobs(Ctx().get(), {}, &resp).ok());
}

// Every worker reports about once a second, and may keep a stale or forged
// token: refused reports are logged at most once every 10 s by each agent
// service. 100 refused reports in a row (well under 10 s) give one line.
// The test runs twice, each time on its own service: with one limiter for
// the whole process the second run would log nothing.
class RefusedProgressTest : public ServicesTest, public ::testing::WithParamInterface<int> {};

TEST_P(RefusedProgressTest, RefusedProgressReportsInARowAreLoggedOnce) {
  LogCapture log;
  v1::ReportProgressRequest req;
  req.set_job_id("j-none");
  req.set_round(1);
  req.set_token("pt-forged");
  req.mutable_progress()->set_rank(0);
  for (int i = 0; i < 100; ++i) {
    v1::ReportProgressResponse resp;
    ASSERT_EQ(agent_stub_->ReportProgress(Ctx("").get(), req, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  const std::string lines = log.Lines();
  const std::regex refusal(
      "\\[agent\\] job=j-none rank=- refused AgentService/ReportProgress from "
      "ipv4:127\\.0\\.0\\.1:[0-9]+: PERMISSION_DENIED: wrong progress token[^\n]*\n");
  EXPECT_EQ(std::distance(std::sregex_iterator(lines.begin(), lines.end(), refusal),
                          std::sregex_iterator()),
            1)
      << lines;
}

INSTANTIATE_TEST_SUITE_P(EachOnItsOwnService, RefusedProgressTest, ::testing::Values(1, 2));

// Jobs that stay PENDING (two nodes wanted, none registered), each with an
// `pad_bytes` of arguments so the spec has a size.
// Their ids in ListJobs order: submit time, then id.
std::vector<std::string> SubmitPending(v1::CoordinatorService::Stub* stub,
                                       const std::function<std::unique_ptr<grpc::ClientContext>()>& ctx,
                                       int n, size_t pad_bytes) {
  std::vector<std::pair<int64_t, std::string>> keys;
  for (int i = 0; i < n; ++i) {
    v1::SubmitJobRequest submit;
    submit.mutable_spec()->set_min_nodes(2);
    submit.mutable_spec()->set_max_nodes(2);
    submit.mutable_spec()->set_nproc_per_node(1);
    submit.mutable_spec()->add_command("/bin/true");
    for (size_t left = pad_bytes; left > 0;) {  // arguments of at most 120 KiB (kMaxArgBytes)
      const size_t n = std::min<size_t>(left, 120 * 1024);
      submit.mutable_spec()->add_command(std::string(n, 'x'));
      left -= n;
    }
    v1::SubmitJobResponse resp;
    grpc::Status s = stub->SubmitJob(ctx().get(), submit, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    keys.emplace_back(resp.job().submitted_unix_ms(), resp.job().job_id());
  }
  std::sort(keys.begin(), keys.end());
  std::vector<std::string> ids;
  for (auto& k : keys) ids.push_back(k.second);
  return ids;
}

// ListJobs pages: by count, every job once and in submit order, the token
// continuing after the last, also when that job was deleted meanwhile; bad
// paging arguments are named.
TEST_F(ServicesTest, ListJobsPagesByCountInSubmitOrder) {
  const std::vector<std::string> ids = SubmitPending(coord_stub_.get(), [&] { return Ctx(); }, 5, 0);
  v1::ListJobsRequest req;
  req.set_page_size(2);
  std::vector<std::string> listed;
  std::vector<int> sizes;
  for (int page = 0; page < 10; ++page) {
    v1::ListJobsResponse resp;
    ASSERT_TRUE(coord_stub_->ListJobs(Ctx(kViewerToken).get(), req, &resp).ok());
    sizes.push_back(resp.jobs_size());
    for (const auto& job : resp.jobs()) listed.push_back(job.job_id());
    if (resp.next_page_token().empty()) break;
    req.set_page_token(resp.next_page_token());
  }
  EXPECT_EQ(sizes, (std::vector<int>{2, 2, 1}));
  EXPECT_EQ(listed, ids);

  // The first page ends at ids[1]; cancelled and deleted, the next page
  // still starts at ids[2].
  req.clear_page_token();
  v1::ListJobsResponse first;
  ASSERT_TRUE(coord_stub_->ListJobs(Ctx().get(), req, &first).ok());
  ASSERT_EQ(first.jobs_size(), 2);
  v1::CancelJobRequest cancel;
  cancel.set_job_id(ids[1]);
  v1::CancelJobResponse cancelled;
  ASSERT_TRUE(coord_stub_->CancelJob(Ctx().get(), cancel, &cancelled).ok());
  v1::DeleteJobRequest del;
  del.set_job_id(ids[1]);
  v1::DeleteJobResponse deleted;
  grpc::Status ds = coord_stub_->DeleteJob(Ctx().get(), del, &deleted);
  ASSERT_TRUE(ds.ok()) << ds.error_message();
  req.set_page_token(first.next_page_token());
  v1::ListJobsResponse next;
  ASSERT_TRUE(coord_stub_->ListJobs(Ctx().get(), req, &next).ok());
  ASSERT_EQ(next.jobs_size(), 2);
  EXPECT_EQ(next.jobs(0).job_id(), ids[2]);
  EXPECT_EQ(next.jobs(1).job_id(), ids[3]);

  v1::ListJobsResponse resp;
  req.set_page_token("garbage");
  grpc::Status s = coord_stub_->ListJobs(Ctx().get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("page_token \"garbage\""), std::string::npos) << s.error_message();
  req.set_page_token("");
  req.set_page_size(-1);
  s = coord_stub_->ListJobs(Ctx().get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("page_size"), std::string::npos) << s.error_message();
}

// A table larger than one answer may hold: no page exceeds
// kListJobsPageBytes (far below the message limit), and the pages together
// hold every job once, in submit order.
TEST_F(ServicesTest, ListJobsOfATableLargerThanOneAnswerComesInPages) {
  // 70 specs of about 240 KiB (the largest is 256 KiB): 16.4 MiB of jobs.
  constexpr int kJobs = 70;
  constexpr size_t kPad = 240 * 1024;
  const std::vector<std::string> ids =
      SubmitPending(coord_stub_.get(), [&] { return Ctx(); }, kJobs, kPad);
  v1::ListJobsRequest req;
  std::vector<std::string> listed;
  int pages = 0;
  while (pages < kJobs) {
    v1::ListJobsResponse resp;
    grpc::Status s = coord_stub_->ListJobs(Ctx().get(), req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ++pages;
    size_t bytes = 0;
    for (const auto& job : resp.jobs()) bytes += job.ByteSizeLong();
    EXPECT_LE(bytes, rendezvous::kListJobsPageBytes) << "page " << pages;
    EXPECT_GT(resp.jobs_size(), 0) << "page " << pages;
    for (const auto& job : resp.jobs()) listed.push_back(job.job_id());
    if (resp.next_page_token().empty()) break;
    req.set_page_token(resp.next_page_token());
  }
  EXPECT_GE(pages, 2) << "the table fit one page: make the jobs bigger";
  EXPECT_EQ(listed, ids);
}

TEST_F(ServicesTest, ErrorsKeepTheirCanonicalCodes) {
  v1::SubmitJobRequest submit;
  submit.mutable_spec()->set_min_nodes(3);
  submit.mutable_spec()->set_max_nodes(2);
  submit.mutable_spec()->set_nproc_per_node(1);
  submit.mutable_spec()->add_command("/bin/true");
  v1::SubmitJobResponse sresp;
  grpc::Status s = coord_stub_->SubmitJob(Ctx().get(), submit, &sresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("spec.nodes"), std::string::npos);
  v1::GetJobRequest get;
  get.set_job_id("j-missing");
  v1::GetJobResponse gresp;
  s = coord_stub_->GetJob(Ctx().get(), get, &gresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("j-missing"), std::string::npos);
  v1::ReadLogsRequest logs;
  logs.set_job_id("../../etc");
  v1::ReadLogsResponse lresp;
  agent_->RunOnce();  // registers: the agent learns its log key
  // The coordinator issues no ticket for such a job id; one made with the
  // node's key gets past the ticket check and is refused by the agent core.
  v1::IssueLogTicketsRequest ask;
  ask.set_job_id("../../etc");
  v1::IssueLogTicketsResponse tickets;
  EXPECT_EQ(coord_stub_->IssueLogTickets(Ctx().get(), ask, &tickets).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  const std::string forged =
      MakeLogTicket(NodeLogKey(kToken, "n1"), "../../etc", "n1", UnixNow() + 60);
  EXPECT_EQ(agent_stub_->ReadLogs(TicketCtx(forged).get(), logs, &lresp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ServicesTest, JobRunsThroughGrpcAndWatchReportsEachChange) {
  agent_->Start();
  v1::SubmitJobRequest submit;
  submit.mutable_spec()->add_command("/bin/sh");
  submit.mutable_spec()->add_command("-c");
  submit.mutable_spec()->add_command("echo hello from $RANK store=$LOCKSTEP_STORE_TOKEN");
  submit.mutable_spec()->set_min_nodes(1);
  submit.mutable_spec()->set_nproc_per_node(2);
  v1::SubmitJobResponse sresp;
  ASSERT_TRUE(coord_stub_->SubmitJob(Ctx().get(), submit, &sresp).ok());
  std::string id = sresp.job().job_id();

  std::atomic<bool> done{false};
  std::thread ticker([&] {
    while (!done.load()) {
      coordinator_->Tick();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  int64_t version = 0;
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(6);
  while (state != v1::JOB_STATE_SUCCEEDED && std::chrono::steady_clock::now() < deadline) {
    v1::WatchJobRequest watch;
    watch.set_job_id(id);
    watch.set_after_version(version);
    v1::WatchJobResponse wresp;
    auto ctx = Ctx();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    grpc::Status s = coord_stub_->WatchJob(ctx.get(), watch, &wresp);
    if (!s.ok()) continue;
    EXPECT_GT(wresp.version(), version);
    version = wresp.version();
    state = wresp.job().state();
  }
  done = true;
  ticker.join();
  ASSERT_EQ(state, v1::JOB_STATE_SUCCEEDED);
  // A viewer asks the coordinator for tickets (the nodes of the job's
  // workers by default) and reads the logs with them from the agent.
  v1::IssueLogTicketsRequest ask;
  ask.set_job_id(id);
  v1::IssueLogTicketsResponse tickets;
  ASSERT_TRUE(coord_stub_->IssueLogTickets(Ctx(kViewerToken).get(), ask, &tickets).ok());
  ASSERT_EQ(tickets.tickets_size(), 1);
  EXPECT_EQ(tickets.tickets(0).node_id(), "n1");
  EXPECT_EQ(tickets.tickets(0).agent_address(), address_);
  EXPECT_NEAR(tickets.tickets(0).expires_unix_s(), UnixNow() + kLogTicketLife.count(), 5);
  const std::string ticket = tickets.tickets(0).ticket();
  v1::ReadLogsRequest logs;
  logs.set_job_id(id);
  logs.set_rank(1);
  v1::ReadLogsResponse lresp;
  ASSERT_TRUE(agent_stub_->ReadLogs(TicketCtx(ticket).get(), logs, &lresp).ok());
  EXPECT_NE(lresp.data().find("hello from 1"), std::string::npos);
  EXPECT_TRUE(lresp.worker_done());
  // The agent holds only the agent token: the coordinator sent the job's
  // store token with the start command.
  EXPECT_NE(lresp.data().find("store=" + JobStoreToken(kToken, id)), std::string::npos)
      << lresp.data();
  // Bearer tokens are refused by the agent, its own agent token too.
  for (const char* token : {kToken, kViewerToken, kAgentToken}) {
    v1::ReadLogsResponse refused;
    grpc::Status s = agent_stub_->ReadLogs(Ctx(token).get(), logs, &refused);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << token;
    EXPECT_TRUE(refused.data().empty());
  }
  // The ticket opens this job only, and only on this node.
  v1::ReadLogsRequest other = logs;
  other.set_job_id("j-other");
  grpc::Status s = agent_stub_->ReadLogs(TicketCtx(ticket).get(), other, &lresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(s.error_message().find("not one for job \"j-other\" on node n1"), std::string::npos)
      << s.error_message();
  ask.add_node_ids("n2");
  ASSERT_TRUE(coord_stub_->IssueLogTickets(Ctx().get(), ask, &tickets).ok());
  ASSERT_EQ(tickets.tickets_size(), 1);
  EXPECT_EQ(tickets.tickets(0).agent_address(), "") << "n2 is not registered";
  EXPECT_EQ(agent_stub_->ReadLogs(TicketCtx(tickets.tickets(0).ticket()).get(), logs, &lresp)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // Expired: made with the node's key, an hour old.
  s = agent_stub_->ReadLogs(
      TicketCtx(MakeLogTicket(NodeLogKey(kToken, "n1"), id, "n1", UnixNow() - 3600)).get(), logs,
      &lresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(s.error_message().find("expired at"), std::string::npos) << s.error_message();

  v1::ListWorkersRequest lw;
  lw.set_job_id(id);
  v1::ListWorkersResponse lwresp;
  // (The finished run may already be gone from the agent: nothing else listed.)
  ASSERT_TRUE(agent_stub_->ListWorkers(TicketCtx(ticket).get(), lw, &lwresp).ok());
  for (const auto& job : lwresp.jobs()) EXPECT_EQ(job.job_id(), id);
  EXPECT_EQ(agent_stub_->ListWorkers(Ctx(kViewerToken).get(), lw, &lwresp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(agent_stub_->ListWorkers(Ctx(JobStoreToken(kToken, id)).get(), lw, &lwresp)
                .error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  lw.clear_job_id();
  EXPECT_EQ(agent_stub_->ListWorkers(TicketCtx(ticket).get(), lw, &lwresp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// A job that stays PENDING (it wants 5 nodes): its version never moves.
std::string SubmitWaitingJob(Coordinator* coordinator) {
  v1::JobSpec spec;
  spec.add_command("/bin/true");
  spec.set_min_nodes(5);
  spec.set_nproc_per_node(1);
  return coordinator->SubmitJob(spec, "").value().job_id();
}

TEST_F(ServicesTest, WatchEndsWhenTheClientGivesUp) {
  const std::string id = SubmitWaitingJob(coordinator_.get());
  v1::WatchJobRequest watch;
  watch.set_job_id(id);
  watch.set_after_version(1000);
  v1::WatchJobResponse wresp;
  auto ctx = Ctx();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  EXPECT_EQ(coord_stub_->WatchJob(ctx.get(), watch, &wresp).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
}

// timeout_ms bounds the long poll on the server (the client's own deadline
// is far later): DEADLINE_EXCEEDED naming the job, not a hang.
TEST_F(ServicesTest, WatchHonoursItsTimeout) {
  const std::string id = SubmitWaitingJob(coordinator_.get());
  v1::WatchJobRequest watch;
  watch.set_job_id(id);
  watch.set_after_version(1000);
  watch.set_timeout_ms(300);
  v1::WatchJobResponse wresp;
  auto start = std::chrono::steady_clock::now();
  grpc::Status s = coord_stub_->WatchJob(Ctx().get(), watch, &wresp);
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_NE(s.error_message().find(id), std::string::npos) << s.error_message();
  EXPECT_GE(took, std::chrono::milliseconds(250));
  EXPECT_LT(took, std::chrono::seconds(3));

  // A huge timeout is clamped, never overflowing into an instant deadline:
  // the call waits until the client's own deadline.
  watch.set_timeout_ms(std::numeric_limits<int64_t>::max());
  auto ctx = Ctx();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(400));
  start = std::chrono::steady_clock::now();
  s = coord_stub_->WatchJob(ctx.get(), watch, &wresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(350));

  watch.set_timeout_ms(-1);
  s = coord_stub_->WatchJob(Ctx().get(), watch, &wresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("timeout_ms"), std::string::npos) << s.error_message();

  // A change before the timeout still answers at once, with the job.
  watch.set_after_version(0);
  watch.set_timeout_ms(5000);
  s = coord_stub_->WatchJob(Ctx().get(), watch, &wresp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(wresp.job().job_id(), id);
}

TEST(WatchTimeoutTest, DefaultsClampsAndRefuses) {
  EXPECT_EQ(*WatchTimeout(0), kDefaultWatchTimeout);
  EXPECT_EQ(*WatchTimeout(1500), std::chrono::milliseconds(1500));
  EXPECT_EQ(*WatchTimeout(int64_t{1} << 62), kMaxWatchTimeout);
  EXPECT_EQ(*WatchTimeout(std::numeric_limits<int64_t>::max()), kMaxWatchTimeout);
  EXPECT_TRUE(absl::IsInvalidArgument(WatchTimeout(-1).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(WatchTimeout(std::numeric_limits<int64_t>::min()).status()));
}

// A 5 MiB spec crosses the channel (the limit is kMaxGrpcMessageBytes on
// both sides) and is refused by validation, naming its size; nothing is
// stored and the service goes on answering.
TEST_F(ServicesTest, OversizedSpecIsRefusedAtSubmitNamingItsSize) {
  v1::SubmitJobRequest req;
  req.mutable_spec()->add_command("/bin/true");
  req.mutable_spec()->set_min_nodes(1);
  req.mutable_spec()->set_nproc_per_node(1);
  (*req.mutable_spec()->mutable_env())["BIG"] = std::string(5 << 20, 'x');
  v1::SubmitJobResponse resp;
  grpc::Status s = coord_stub_->SubmitJob(Ctx().get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find(absl::StrCat(req.spec().ByteSizeLong(), " bytes")),
            std::string::npos)
      << s.error_message();
  EXPECT_LT(s.error_message().size(), 300u);
  EXPECT_TRUE(coordinator_->ListJobs({})->empty());
  v1::ListJobsResponse list;
  EXPECT_TRUE(coord_stub_->ListJobs(Ctx().get(), v1::ListJobsRequest(), &list).ok());
}

// Errors that echo request fields quote a short, escaped prefix.
TEST_F(ServicesTest, ErrorsQuoteAShortPrefixOfBadInput) {
  v1::GetJobRequest req;
  req.set_job_id(std::string(1 << 20, 'j') + "\n");
  v1::GetJobResponse resp;
  grpc::Status s = coord_stub_->GetJob(Ctx().get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_LT(s.error_message().size(), 200u) << s.error_message().size();
  EXPECT_NE(s.error_message().find("job_id"), std::string::npos);
}

TEST_F(ServicesTest, EachRoleGetsOnlyItsRpcs) {
  const std::string id = SubmitWaitingJob(coordinator_.get());
  v1::CancelJobRequest cancel;
  cancel.set_job_id(id);
  v1::CancelJobResponse cresp;
  grpc::Status s = coord_stub_->CancelJob(Ctx(kViewerToken).get(), cancel, &cresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(), "a viewer token cannot CancelJob (needs admin)");
  EXPECT_EQ(coordinator_->GetJob(JobId(id))->state(), v1::JOB_STATE_PENDING) << "not cancelled";

  v1::GetJobRequest get;
  get.set_job_id(id);
  v1::GetJobResponse gresp;
  EXPECT_TRUE(coord_stub_->GetJob(Ctx(kViewerToken).get(), get, &gresp).ok());
  v1::ListJobsResponse lresp;
  EXPECT_TRUE(coord_stub_->ListJobs(Ctx(kViewerToken).get(), {}, &lresp).ok());
  v1::ListNodesResponse nresp;
  EXPECT_TRUE(coord_stub_->ListNodes(Ctx(kViewerToken).get(), {}, &nresp).ok());

  v1::SubmitJobRequest submit;
  submit.mutable_spec()->add_command("/bin/true");
  submit.mutable_spec()->set_min_nodes(1);
  submit.mutable_spec()->set_nproc_per_node(1);
  v1::SubmitJobResponse sresp;
  s = coord_stub_->SubmitJob(Ctx(kAgentToken).get(), submit, &sresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(), "an agent token cannot SubmitJob (needs admin)");
  EXPECT_EQ(coord_stub_->GetJob(Ctx(kAgentToken).get(), get, &gresp).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(coord_stub_->SubmitJob(Ctx(kViewerToken).get(), submit, &sresp).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(coordinator_->ListJobs({})->size(), 1u) << "nothing was submitted";

  // A worker's store token opens no coordinator RPC.
  EXPECT_EQ(coord_stub_->ListJobs(Ctx(JobStoreToken(kToken, id)).get(), {}, &lresp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  ASSERT_TRUE(coord_stub_->CancelJob(Ctx().get(), cancel, &cresp).ok());
  EXPECT_EQ(cresp.job().state(), v1::JOB_STATE_CANCELLED);
}

// Who gets log tickets: admin and viewer, for jobs that exist, for node ids
// that are ids.
TEST_F(ServicesTest, LogTicketsGoToReadersOfJobsThatExist) {
  const std::string id = SubmitWaitingJob(coordinator_.get());
  v1::IssueLogTicketsRequest ask;
  ask.set_job_id(id);
  ask.add_node_ids("n1");
  v1::IssueLogTicketsResponse tickets;
  grpc::Status s = coord_stub_->IssueLogTickets(Ctx(kAgentToken).get(), ask, &tickets);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(), "an agent token cannot IssueLogTickets (needs admin or viewer)");
  EXPECT_EQ(coord_stub_->IssueLogTickets(Ctx(JobStoreToken(kToken, id)).get(), ask, &tickets)
                .error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(tickets.tickets().empty());
  ASSERT_TRUE(coord_stub_->IssueLogTickets(Ctx().get(), ask, &tickets).ok());
  ASSERT_EQ(tickets.tickets_size(), 1);
  EXPECT_EQ(tickets.tickets(0).ticket(),
            MakeLogTicket(NodeLogKey(kToken, "n1"), id, "n1", tickets.tickets(0).expires_unix_s()));

  ask.set_job_id("j-missing");
  s = coord_stub_->IssueLogTickets(Ctx().get(), ask, &tickets);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("j-missing"), std::string::npos) << s.error_message();
  ask.set_job_id(id);
  ask.add_node_ids("n/../x");
  s = coord_stub_->IssueLogTickets(Ctx().get(), ask, &tickets);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("is not a node id"), std::string::npos) << s.error_message();
  ask.clear_node_ids();
  for (int i = 0; i <= kMaxLogTicketNodes; ++i) ask.add_node_ids("n" + std::to_string(i));
  s = coord_stub_->IssueLogTickets(Ctx().get(), ask, &tickets);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("at most 4096"), std::string::npos) << s.error_message();
}

// --tls-bind-node-ids: the names a node may take are its certificate's
// (tests/e2e:node_identity_test runs it over mutual TLS).
TEST(NodeIdNamedByTest, ANodeTakesOnlyANameItsCertificateHolds) {
  const std::vector<std::string> san = {"node1", "10.0.0.3"};
  EXPECT_TRUE(NodeIdNamedBy("node1", san, {"node1"}).ok());
  EXPECT_TRUE(NodeIdNamedBy("10.0.0.3", san, {}).ok());
  Status other = NodeIdNamedBy("node2", san, {"node2"});
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(other.message().find(
                "node id \"node2\" is not a name in the caller's certificate (subjectAltName "
                "\"node1\", \"10.0.0.3\")"),
            std::string::npos)
      << other;
  // Without subjectAltNames the CN counts, as a TLS client checks a server.
  EXPECT_TRUE(NodeIdNamedBy("node1", {}, {"node1"}).ok());
  EXPECT_NE(NodeIdNamedBy("node2", {}, {"node1"}).message().find("(CN \"node1\")"),
            std::string::npos);
  // No certificate (plaintext) or no names: nothing is admitted.
  EXPECT_NE(NodeIdNamedBy("node1", {}, {}).message().find("(it has none)"), std::string::npos);
  // Not a prefix or a case-insensitive match.
  EXPECT_FALSE(NodeIdNamedBy("node", san, {}).ok());
  EXPECT_FALSE(NodeIdNamedBy("NODE1", san, {}).ok());
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
