// RendezvousService and its client over loopback gRPC.
#include "rendezvous/rendezvous_client.h"

#include <grpcpp/grpcpp.h>

#include <set>
#include <thread>

#include "gtest/gtest.h"
#include "lockstep/v1/rendezvous.grpc.pb.h"
#include "rendezvous/rendezvous_server.h"
#include "rendezvous/store_client.h"

namespace lockstep {
namespace rendezvous {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

template <typename Pred>
bool Eventually(Pred pred, Duration limit = seconds(10)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return pred();
}

class RendezvousClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = *RendezvousServer::Start("127.0.0.1:0");
    client_ = *RendezvousClient::Connect(server_->address(), seconds(10));
  }
  void CreateJob(const std::string& id, int min_nodes, int max_nodes, int nproc = 1,
                 Duration last_call = seconds(30)) {
    RendezvousJobConfig config;
    config.job_id = JobId(id);
    config.min_nodes = min_nodes;
    config.max_nodes = max_nodes;
    config.nproc_per_node = nproc;
    config.last_call_timeout = last_call;
    ASSERT_TRUE(server_->rendezvous_core()->CreateJob(config).ok());
  }
  static JoinRequest Request(const std::string& job, const std::string& node, int round = 0) {
    JoinRequest request;
    request.job_id = JobId(job);
    request.node_id = NodeId(node);
    request.round = round;
    request.address = "10.0.0." + node;
    return request;
  }
  std::unique_ptr<RendezvousServer> server_;
  std::unique_ptr<RendezvousClient> client_;
};

TEST_F(RendezvousClientTest, NodesJoiningOverGrpcGetRanksAndAStoreNamespace) {
  CreateJob("job", 2, 2, 4);
  StatusOr<RendezvousResult> a = absl::UnknownError("not run");
  std::thread t([&] { a = client_->Join(Request("job", "a"), seconds(10)); });
  auto b = client_->Join(Request("job", "b"), seconds(10));
  t.join();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->node_rank, 0);
  EXPECT_EQ(b->node_rank, 1);
  EXPECT_EQ(b->world_size, 8);
  EXPECT_EQ(b->nproc_per_node, 4);
  EXPECT_EQ(b->round, 1);
  EXPECT_EQ(b->master_address, "10.0.0.a");
  EXPECT_EQ(b->node_ids, (std::vector<NodeId>{NodeId("a"), NodeId("b")}));
  // The same server hosts the store for that namespace.
  auto store = *ConnectStore(server_->address(), b->store_namespace, seconds(10));
  ASSERT_TRUE(store->Set("rank0/addr", "10.0.0.a:1234").ok());
  EXPECT_EQ(server_->store_core()->TryGet("job/1", "rank0/addr").value(), "10.0.0.a:1234");

  auto state = client_->GetState(JobId("job"));
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->phase, RoundPhase::kClosed);
  EXPECT_EQ(state->participants.size(), 2u);
  EXPECT_EQ(state->max_nodes, 2);
}

TEST_F(RendezvousClientTest, ManySimulatedNodesGetUniqueGapFreeRanks) {
  constexpr int kNodes = 256;
  CreateJob("big", kNodes, kNodes, 2);
  std::vector<StatusOr<RendezvousResult>> results(kNodes, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kNodes; ++i) {
    threads.emplace_back([&, i] {
      results[i] = client_->Join(Request("big", "node-" + std::to_string(i)), seconds(60));
    });
  }
  for (auto& t : threads) t.join();
  std::set<int> ranks;
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->num_nodes, kNodes);
    EXPECT_EQ(r->world_size, 2 * kNodes);
    ranks.insert(r->node_rank);
  }
  EXPECT_EQ(ranks.size(), static_cast<size_t>(kNodes));
  EXPECT_EQ(*ranks.begin(), 0);
  EXPECT_EQ(*ranks.rbegin(), kNodes - 1);
}

TEST_F(RendezvousClientTest, BadRequestsGetClearErrorsAndTheServerKeepsServing) {
  CreateJob("job", 1, 1);
  auto unknown = client_->Join(Request("no-such-job", "a"), seconds(5));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("no-such-job"), std::string::npos);

  auto empty = client_->Join(Request("job", ""), seconds(5));
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE(client_->Join(Request("job", "a"), seconds(5)).ok());
  ASSERT_EQ(*server_->rendezvous_core()->OpenNextRound(JobId("job")), 2);
  auto stale = client_->Join(Request("job", "a", 1), seconds(5));
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(stale.status().message().find("stale"), std::string::npos);
  EXPECT_EQ(client_->Leave(JobId("job"), NodeId("a"), 1).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(client_->GetState(JobId("nope")).status().code(), absl::StatusCode::kNotFound);

  auto fresh = client_->Join(Request("job", "a", 2), seconds(5));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(fresh->round, 2);
}

TEST_F(RendezvousClientTest, JoinThatTimesOutIsDeadlineExceededAndRemoved) {
  CreateJob("job", 2, 2);
  auto lonely = client_->Join(Request("job", "a"), milliseconds(100));
  EXPECT_EQ(lonely.status().code(), absl::StatusCode::kDeadlineExceeded) << lonely.status();
  EXPECT_TRUE(client_->GetState(JobId("job"))->participants.empty());
}

TEST_F(RendezvousClientTest, ClientThatDisconnectsMidJoinIsWithdrawnFromTheRound) {
  CreateJob("job", 2, 2);
  auto stub = v1::RendezvousService::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  std::thread t([&] {
    v1::JoinRendezvousRequest request;
    request.set_job_id("job");
    request.set_node_id("quitter");
    request.set_timeout_ms(60000);
    v1::JoinRendezvousResponse response;
    grpc::Status status = stub->JoinRendezvous(&ctx, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  });
  ASSERT_TRUE(Eventually([&] { return client_->GetState(JobId("job"))->participants.size() == 1; }));
  ctx.TryCancel();
  t.join();
  ASSERT_TRUE(Eventually([&] { return client_->GetState(JobId("job"))->participants.empty(); }));
  // The round still works for others.
  StatusOr<RendezvousResult> a = absl::UnknownError("not run");
  std::thread ta([&] { a = client_->Join(Request("job", "a"), seconds(10)); });
  auto b = client_->Join(Request("job", "b"), seconds(10));
  ta.join();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->node_ids, (std::vector<NodeId>{NodeId("a"), NodeId("b")}));
}

TEST_F(RendezvousClientTest, LeaveBeforeCloseRemovesTheNode) {
  CreateJob("job", 2, 3);
  StatusOr<RendezvousResult> a = absl::UnknownError("not run");
  std::thread t([&] { a = client_->Join(Request("job", "a"), seconds(10)); });
  ASSERT_TRUE(Eventually([&] { return client_->GetState(JobId("job"))->participants.size() == 1; }));
  ASSERT_TRUE(client_->Leave(JobId("job"), NodeId("a"), 1).ok());
  t.join();
  EXPECT_EQ(a.status().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(client_->GetState(JobId("job"))->participants.empty());
}

TEST(RendezvousClientConnectTest, ConnectToNothingIsUnavailable) {
  auto server = *RendezvousServer::Start("127.0.0.1:0");
  std::string address = server->address();
  server.reset();
  auto client = RendezvousClient::Connect(address, milliseconds(200));
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace rendezvous
}  // namespace lockstep
