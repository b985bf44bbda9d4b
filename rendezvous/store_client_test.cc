// The gRPC client and service over loopback: the Store conformance suite,
// plus what only a network brings (restarts, disconnects, raw bad input).
#include "rendezvous/store_client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "lockstep/v1/store.grpc.pb.h"
#include "rendezvous/grpc_limits.h"
#include "rendezvous/grpc_server.h"
#include "rendezvous/store_conformance.h"
#include "rendezvous/store_server.h"

namespace lockstep {
namespace rendezvous {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class GrpcEnv : public StoreConformanceEnv {
 public:
  GrpcEnv() { server_ = *StoreServer::Start("127.0.0.1:0"); }
  std::unique_ptr<Store> Open(const std::string& ns) override {
    auto store = ConnectStore(server_->address(), ns, seconds(10));
    EXPECT_TRUE(store.ok()) << store.status();
    return std::move(*store);
  }

 private:
  std::unique_ptr<StoreServer> server_;
};

INSTANTIATE_TEST_SUITE_P(Grpc, StoreConformanceTest,
                         ::testing::Values(StoreEnvFactory([] {
                           return std::unique_ptr<StoreConformanceEnv>(new GrpcEnv());
                         })));

// Waits (with a deadline) until `pred` holds; for server-side effects that
// follow a client action asynchronously.
template <typename Pred>
bool Eventually(Pred pred, Duration limit = seconds(10)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return pred();
}

TEST(StoreClientTest, ConnectToNothingIsUnavailableNamingAddress) {
  auto server = *StoreServer::Start("127.0.0.1:0");
  std::string address = server->address();
  server.reset();
  auto store = ConnectStore(address, "ns", milliseconds(200));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(store.status().message().find(address), std::string::npos) << store.status();
}

// A request over gRPC's message limit is refused by the client before it is
// sent, naming its size and the limit; the client's Session, and the other
// threads' ops on it, go on. gRPC used to refuse to send it, ending the
// stream: every op in flight failed ("refused the session").
TEST(StoreClientTest, ARequestOverTheMessageLimitIsRefusedAndTheSessionGoesOn) {
  auto core = std::make_shared<StoreCore>();
  auto server = StoreServer::Start("127.0.0.1:0", core);
  ASSERT_TRUE(server.ok()) << server.status();
  auto store = ConnectStore((*server)->address(), "job/1", seconds(10));
  ASSERT_TRUE(store.ok()) << store.status();
  StatusOr<std::string> parked = absl::UnknownError("not run");
  std::thread waiter([&] { parked = (*store)->Get("x", seconds(20)); });
  ASSERT_TRUE(Eventually([&] { return core->NumPendingWaiters() == 1; }));
  // Five values at kMaxValueBytes: each valid, together over 64 MiB.
  const std::string value(kMaxValueBytes, 'v');
  std::vector<std::pair<std::string, std::string>> entries;
  for (int i = 0; i < 5; ++i) entries.emplace_back("big" + std::to_string(i), value);
  Status too_big = (*store)->MultiSet(entries);
  EXPECT_EQ(too_big.code(), absl::StatusCode::kInvalidArgument) << too_big;
  EXPECT_NE(too_big.message().find("kMaxGrpcMessageBytes"), std::string::npos) << too_big;
  EXPECT_NE(too_big.message().find(std::to_string(kMaxGrpcMessageBytes)), std::string::npos)
      << too_big;
  EXPECT_EQ(*core->NumKeys("job/1"), 0) << "nothing of the refused MultiSet was written";
  ASSERT_TRUE((*store)->Set("x", "here").ok());
  waiter.join();
  ASSERT_TRUE(parked.ok()) << parked.status();
  EXPECT_EQ(*parked, "here");
}

// A store service whose session answers every op but Add, and ends the
// stream (UNAVAILABLE) on an Add it has read: the client cannot know whether
// that Add was applied.
class DropsAddService final : public v1::StoreService::Service {
 public:
  grpc::Status Session(grpc::ServerContext*,
                       grpc::ServerReaderWriter<v1::StoreOpResult, v1::StoreOp>* stream) override {
    v1::StoreOp op;
    while (stream->Read(&op)) {
      if (op.has_add()) {
        ++adds_read_;
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server went away mid-op");
      }
      v1::StoreOpResult result;
      result.set_id(op.id());
      if (!stream->Write(result)) break;
    }
    return grpc::Status::OK;
  }
  std::atomic<int> adds_read_{0};
};

// Add and CompareSet are not idempotent: one that reached the server before
// the stream broke is not sent again, and the error says it may have been
// applied (an idempotent Set is retried instead).
TEST(StoreClientTest, AnAddCutOffAfterItWasSentMayOrMayNotHaveBeenApplied) {
  DropsAddService service;
  auto started = StartGrpcServer("127.0.0.1:0", {&service}, "the test's store");
  ASSERT_TRUE(started.ok()) << started.status();
  auto store = ConnectStore(started->address, "job/1", seconds(10));
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Set("k", "v").ok());
  StatusOr<int64_t> added = (*store)->Add("n", 1);
  ASSERT_FALSE(added.ok());
  EXPECT_EQ(added.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(added.status().message().find("on store key 'n' may or may not have been applied"),
            std::string::npos)
      << added.status();
  EXPECT_EQ(service.adds_read_.load(), 1) << "the Add was sent again";
  EXPECT_TRUE((*store)->Set("k", "again").ok()) << "the client did not reconnect";
  store->reset();  // Its open session would hold up the server's shutdown.
  ShutdownGrpcServer(&started->server, seconds(5));
}

// A store service whose session takes ops and never answers them (a hung
// server, a silent partition).
class SilentService final : public v1::StoreService::Service {
 public:
  grpc::Status Session(grpc::ServerContext* context,
                       grpc::ServerReaderWriter<v1::StoreOpResult, v1::StoreOp>* stream) override {
    stream->SendInitialMetadata();
    v1::StoreOp op;
    while (!context->IsCancelled() && stream->Read(&op)) ops_read_++;
    return grpc::Status::OK;
  }
  std::atomic<int> ops_read_{0};
};

// A server that does not answer is Unavailable, not DeadlineExceeded: that
// code is the server's own answer for keys that never came, which callers
// take as ranks that never arrived.
TEST(StoreClientTest, AServerThatDoesNotAnswerIsUnavailableNotDeadlineExceeded) {
  SilentService service;
  auto started = StartGrpcServer("127.0.0.1:0", {&service}, "the test's store");
  ASSERT_TRUE(started.ok()) << started.status();
  StoreClientOptions options;
  options.connect_timeout = seconds(10);
  options.rpc_timeout = milliseconds(300);
  auto store = ConnectStore(started->address, "job/1", options);
  ASSERT_TRUE(store.ok()) << store.status();
  const Status set = (*store)->Set("k", "v");
  EXPECT_EQ(set.code(), absl::StatusCode::kUnavailable) << set;
  EXPECT_NE(set.message().find("did not answer"), std::string::npos) << set;
  const StatusOr<std::string> got = (*store)->Get("k", milliseconds(100));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
  EXPECT_GE(service.ops_read_.load(), 2);
  store->reset();
  ShutdownGrpcServer(&started->server, seconds(5));
}

TEST(StoreClientTest, InvalidNamespaceIsRejectedBeforeConnecting) {
  EXPECT_EQ(ConnectStore("127.0.0.1:1", "", seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StoreClientTest, ClientReconnectsAfterServerRestartsOnSamePort) {
  auto server = *StoreServer::Start("127.0.0.1:0");
  int port = server->port();
  auto store = *ConnectStore(server->address(), "ns", seconds(10));
  ASSERT_TRUE(store->Set("k", "before").ok());
  server->Shutdown();
  server.reset();
  server = *StoreServer::Start("127.0.0.1:" + std::to_string(port));
  // A restarted server starts empty; the client's next ops reconnect.
  Status set = store->Set("k", "after");
  ASSERT_TRUE(set.ok()) << set;
  EXPECT_EQ(*store->Get("k", seconds(5)), "after");
  EXPECT_EQ(*store->Add("n", 1), 1);
}

TEST(StoreClientTest, BlockingGetSurvivesServerRestart) {
  auto server = *StoreServer::Start("127.0.0.1:0");
  int port = server->port();
  auto reader = *ConnectStore(server->address(), "ns", seconds(10));
  StatusOr<std::string> got = absl::UnknownError("not run");
  std::thread t([&] { got = reader->Get("k", seconds(20)); });
  ASSERT_TRUE(Eventually([&] { return server->core()->NumPendingWaiters() == 1; }));
  server->Shutdown();
  server.reset();
  server = *StoreServer::Start("127.0.0.1:" + std::to_string(port));
  ASSERT_TRUE(Eventually([&] { return server->core()->NumPendingWaiters() == 1; }));
  auto writer = *ConnectStore(server->address(), "ns", seconds(10));
  ASSERT_TRUE(writer->Set("k", "v").ok());
  t.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v");
}

TEST(StoreClientTest, ClientThatDisconnectsMidWaitLeavesNoWaiterAndServerKeepsServing) {
  auto server = *StoreServer::Start("127.0.0.1:0");
  {
    // A waiter that is woken normally leaves nothing behind.
    auto waiter = *ConnectStore(server->address(), "ns", seconds(10));
    std::thread t([&] { EXPECT_TRUE(waiter->Get("woken", seconds(60)).ok()); });
    ASSERT_TRUE(Eventually([&] { return server->core()->NumPendingWaiters() == 1; }));
    auto helper = *ConnectStore(server->address(), "ns", seconds(10));
    ASSERT_TRUE(helper->Set("woken", "x").ok());
    t.join();
    EXPECT_EQ(server->core()->NumPendingWaiters(), 0);
  }
  // A raw stream that parks a wait and then vanishes.
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  auto stub = v1::StoreService::NewStub(channel);
  {
    grpc::ClientContext ctx;
    auto stream = stub->Session(&ctx);
    v1::StoreOp op;
    op.set_id(1);
    op.mutable_get()->set_namespace_("ns");
    op.mutable_get()->set_key("absent");
    op.mutable_get()->set_timeout_ms(60000);
    ASSERT_TRUE(stream->Write(op));
    ASSERT_TRUE(Eventually([&] { return server->core()->NumPendingWaiters() == 1; }));
    ctx.TryCancel();
  }
  ASSERT_TRUE(Eventually([&] { return server->core()->NumPendingWaiters() == 0; }));
  // A unary Wait whose client gives up (deadline) is cancelled as well.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + milliseconds(100));
    v1::StoreWaitRequest request;
    request.set_namespace_("ns");
    request.add_keys("absent");
    request.set_timeout_ms(60000);
    v1::StoreWaitResponse response;
    grpc::Status status = stub->Wait(&ctx, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  ASSERT_TRUE(Eventually([&] { return server->core()->NumPendingWaiters() == 0; }));
  auto store = *ConnectStore(server->address(), "ns", seconds(10));
  EXPECT_EQ(*store->Add("still-serving", 1), 1);
}

class RawStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = *StoreServer::Start("127.0.0.1:0");
    stub_ = v1::StoreService::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }
  std::unique_ptr<StoreServer> server_;
  std::unique_ptr<v1::StoreService::Stub> stub_;
};

TEST_F(RawStoreTest, UnaryRpcsWorkAndReportCanonicalCodes) {
  grpc::ClientContext set_ctx;
  v1::StoreSetRequest set;
  set.set_namespace_("ns");
  set.set_key("k");
  set.set_value("hello");
  v1::StoreSetResponse set_response;
  ASSERT_TRUE(stub_->Set(&set_ctx, set, &set_response).ok());

  grpc::ClientContext add_ctx;
  v1::StoreAddRequest add;
  add.set_namespace_("ns");
  add.set_key("k");
  add.set_delta(1);
  v1::StoreAddResponse add_response;
  grpc::Status wrong_type = stub_->Add(&add_ctx, add, &add_response);
  EXPECT_EQ(wrong_type.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(wrong_type.error_message().find("\"k\""), std::string::npos);

  grpc::ClientContext get_ctx;
  v1::StoreGetRequest get;
  get.set_namespace_("ns");
  get.set_key("k");
  v1::StoreGetResponse get_response;
  ASSERT_TRUE(stub_->Get(&get_ctx, get, &get_response).ok());
  EXPECT_EQ(get_response.value(), "hello");

  grpc::ClientContext missing_ctx;
  get.set_key("missing");
  get.set_timeout_ms(0);  // do not wait
  grpc::Status missing = stub_->Get(&missing_ctx, get, &get_response);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);

  grpc::ClientContext negative_ctx;
  get.set_timeout_ms(-1);
  EXPECT_EQ(stub_->Get(&negative_ctx, get, &get_response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  grpc::ClientContext multi_ctx;
  v1::StoreMultiGetRequest multi;
  multi.set_namespace_("ns");
  multi.add_keys("k");
  multi.set_timeout_ms(1000);
  v1::StoreMultiGetResponse multi_response;
  ASSERT_TRUE(stub_->MultiGet(&multi_ctx, multi, &multi_response).ok());
  EXPECT_EQ(multi_response.values(0), "hello");

  grpc::ClientContext empty_ctx;
  set.set_key("");
  EXPECT_EQ(stub_->Set(&empty_ctx, set, &set_response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(RawStoreTest, SessionAnswersBadOpsWithErrorsAndKeepsTheStreamOpen) {
  grpc::ClientContext ctx;
  auto stream = stub_->Session(&ctx);
  v1::StoreOp empty;
  empty.set_id(7);
  ASSERT_TRUE(stream->Write(empty));
  v1::StoreOpResult result;
  ASSERT_TRUE(stream->Read(&result));
  EXPECT_EQ(result.id(), 7u);
  EXPECT_EQ(result.code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));

  v1::StoreOp big;
  big.set_id(8);
  big.mutable_set()->set_namespace_("ns");
  big.mutable_set()->set_key(std::string(kMaxKeyBytes + 1, 'k'));
  ASSERT_TRUE(stream->Write(big));
  ASSERT_TRUE(stream->Read(&result));
  EXPECT_EQ(result.id(), 8u);
  EXPECT_EQ(result.code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_NE(result.message().find("kMaxKeyBytes"), std::string::npos);

  v1::StoreOp add;
  add.set_id(9);
  add.mutable_add()->set_namespace_("ns");
  add.mutable_add()->set_key("n");
  add.mutable_add()->set_delta(2);
  ASSERT_TRUE(stream->Write(add));
  ASSERT_TRUE(stream->Read(&result));
  EXPECT_EQ(result.code(), 0);
  EXPECT_EQ(result.add().value(), 2);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(RawStoreTest, ResultsOfParkedWaitsArriveOutOfOrderById) {
  grpc::ClientContext ctx;
  auto stream = stub_->Session(&ctx);
  v1::StoreOp wait;
  wait.set_id(1);
  wait.mutable_get()->set_namespace_("ns");
  wait.mutable_get()->set_key("later");
  wait.mutable_get()->set_timeout_ms(10000);
  ASSERT_TRUE(stream->Write(wait));
  v1::StoreOp set;
  set.set_id(2);
  set.mutable_set()->set_namespace_("ns");
  set.mutable_set()->set_key("later");
  set.mutable_set()->set_value("v");
  ASSERT_TRUE(stream->Write(set));
  v1::StoreOpResult first, second;
  ASSERT_TRUE(stream->Read(&first));
  ASSERT_TRUE(stream->Read(&second));
  // The Get completes from inside the Set: either order is legal, ids tell.
  const v1::StoreOpResult& get = first.id() == 1 ? first : second;
  EXPECT_EQ(get.id(), 1u);
  EXPECT_EQ(get.get().value(), "v");
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

}  // namespace
}  // namespace rendezvous
}  // namespace lockstep
