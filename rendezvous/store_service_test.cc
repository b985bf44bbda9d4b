// StoreGrpcService with an authorizer, over loopback: every unary RPC and
// every Session op is checked against (metadata, namespace).
#include "rendezvous/store_service.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <limits>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "lockstep/v1/store.grpc.pb.h"
#include "rendezvous/store_client.h"

namespace lockstep {
namespace rendezvous {
namespace {

using std::chrono::seconds;

// Test authorizer: token "admin" opens everything, "tok-<job>" opens
// "<job>/...", no token is Unauthenticated, anything else PermissionDenied.
Status TestAuthorizer(const std::multimap<grpc::string_ref, grpc::string_ref>& md,
                      absl::string_view ns) {
  auto it = md.find("authorization");
  if (it == md.end()) return absl::UnauthenticatedError("store: no token");
  std::string value(it->second.data(), it->second.size());
  std::string job(ns.substr(0, ns.find('/')));
  if (value == "Bearer admin" || value == "Bearer tok-" + job) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("token does not open namespace '", ns, "'"));
}

class StoreServiceAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service_ = std::make_unique<StoreGrpcService>(&core_, TestAuthorizer);
    grpc::ServerBuilder builder;
    ApplyMessageLimits(&builder);
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port_, 0);
    address_ = absl::StrCat("127.0.0.1:", port_);
    stub_ = v1::StoreService::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_->Shutdown(); }

  grpc::Status UnarySet(const std::string& ns, const std::string& token) {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    v1::StoreSetRequest request;
    request.set_namespace_(ns);
    request.set_key("k");
    request.set_value("v");
    v1::StoreSetResponse response;
    return stub_->Set(&ctx, request, &response);
  }

  std::unique_ptr<Store> Session(const std::string& ns, const std::string& token) {
    StoreClientOptions options;
    options.connect_timeout = seconds(10);
    options.token = token;
    auto store = ConnectStore(address_, ns, options);
    EXPECT_TRUE(store.ok()) << store.status();
    return std::move(*store);
  }

  StoreCore core_;
  std::unique_ptr<StoreGrpcService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
  std::unique_ptr<v1::StoreService::Stub> stub_;
};

TEST_F(StoreServiceAuthTest, UnaryWithoutTokenIsUnauthenticated) {
  grpc::Status s = UnarySet("job-a/0", "");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  EXPECT_FALSE(core_.NumKeys("job-a/0").ok() && *core_.NumKeys("job-a/0") > 0);
}

TEST_F(StoreServiceAuthTest, UnaryWithOtherJobsTokenIsPermissionDeniedNamingNamespace) {
  grpc::Status s = UnarySet("job-a/0", "tok-job-b");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(s.error_message().find("job-a/0"), std::string::npos) << s.error_message();
}

TEST_F(StoreServiceAuthTest, UnaryWithRightTokenWorks) {
  grpc::Status s = UnarySet("job-a/0", "tok-job-a");
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(UnarySet("job-b/0", "admin").ok());
  auto n = core_.NumKeys("job-a/0");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1);
}

TEST_F(StoreServiceAuthTest, UnaryBlockingGetIsCheckedToo) {
  grpc::ClientContext ctx;
  v1::StoreGetRequest request;
  request.set_namespace_("job-a/0");
  request.set_key("k");
  request.set_timeout_ms(0);
  v1::StoreGetResponse response;
  EXPECT_EQ(stub_->Get(&ctx, request, &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(StoreServiceAuthTest, SessionWithoutTokenFailsEachOpUnauthenticated) {
  auto store = Session("job-a/0", "");
  Status s = store->Set("k", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_EQ(store->Get("k", seconds(1)).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(StoreServiceAuthTest, SessionWithOtherJobsTokenIsPermissionDeniedNamingNamespace) {
  auto store = Session("job-a/0", "tok-job-b");
  Status s = store->Set("k", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("job-a/0"), std::string::npos) << s;
  EXPECT_EQ(store->Add("c", 1).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(StoreServiceAuthTest, SessionWithRightTokenWorks) {
  auto store = Session("job-a/0", "tok-job-a");
  ASSERT_TRUE(store->Set("k", "v").ok());
  auto v = store->Get("k", seconds(5));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "v");
}

TEST(StoreServiceOpenTest, NoAuthorizerAcceptsCallsWithoutToken) {
  StoreCore core;
  StoreGrpcService service(&core);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  auto store = ConnectStore(absl::StrCat("127.0.0.1:", port), "job-a/0", seconds(10));
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE((*store)->Set("k", "v").ok());
  store->reset();  // close the Session stream: Shutdown waits for open calls
  server->Shutdown();
}

// store.proto: "empty + expect_absent: set only if missing". The shell used
// to drop the flag, so a key holding "" was swapped. Found by
// //tests/fuzz:store_fuzzer.
TEST_F(StoreServiceAuthTest, CompareSetExpectAbsentNeverSwapsAnExistingKey) {
  auto compare_set = [&](const std::string& desired, bool expect_absent,
                         v1::StoreCompareSetResponse* response) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer admin");
    v1::StoreCompareSetRequest request;
    request.set_namespace_("job-a/0");
    request.set_key("leader");
    request.set_expect_absent(expect_absent);
    request.set_desired(desired);
    return stub_->CompareSet(&ctx, request, response);
  };
  v1::StoreCompareSetResponse response;
  ASSERT_TRUE(compare_set("", true, &response).ok());
  EXPECT_TRUE(response.swapped());
  ASSERT_TRUE(compare_set("rank1", true, &response).ok());
  EXPECT_FALSE(response.swapped());
  EXPECT_EQ(response.current(), "");
  ASSERT_TRUE(compare_set("rank2", false, &response).ok());
  EXPECT_TRUE(response.swapped());
}

TEST(StoreWaitTimeoutTest, ClampsHugeAndRefusesNegative) {
  EXPECT_EQ(*StoreWaitTimeout(0), Duration::zero());
  EXPECT_EQ(*StoreWaitTimeout(1500), std::chrono::milliseconds(1500));
  EXPECT_EQ(*StoreWaitTimeout(int64_t{1} << 62), kMaxStoreWait);
  EXPECT_EQ(*StoreWaitTimeout(std::numeric_limits<int64_t>::max()), kMaxStoreWait);
  Status negative = StoreWaitTimeout(-5).status();
  EXPECT_TRUE(absl::IsInvalidArgument(negative));
  EXPECT_NE(negative.message().find("timeout_ms"), std::string::npos) << negative;
}

// timeout_ms >= 2^62 used to overflow into an instant deadline: a Get with
// such a timeout must still wait, and return the value once it is Set.
TEST_F(StoreServiceAuthTest, HugeTimeoutWaitsInsteadOfExpiringAtOnce) {
  for (int64_t huge : {int64_t{1} << 62, std::numeric_limits<int64_t>::max()}) {
    const std::string key = absl::StrCat("late-", huge);
    std::thread setter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      grpc::ClientContext ctx;
      ctx.AddMetadata("authorization", "Bearer admin");
      v1::StoreSetRequest set;
      set.set_namespace_("job-a/0");
      set.set_key(key);
      set.set_value("v");
      v1::StoreSetResponse response;
      EXPECT_TRUE(stub_->Set(&ctx, set, &response).ok());
    });
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer admin");
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    v1::StoreGetRequest get;
    get.set_namespace_("job-a/0");
    get.set_key(key);
    get.set_timeout_ms(huge);
    v1::StoreGetResponse response;
    grpc::Status s = stub_->Get(&ctx, get, &response);
    setter.join();
    EXPECT_TRUE(s.ok()) << huge << ": " << s.error_message();
    EXPECT_EQ(response.value(), "v");
  }

  // Negative: refused naming the field, on unary and Wait alike.
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer admin");
  v1::StoreWaitRequest wait;
  wait.set_namespace_("job-a/0");
  wait.add_keys("never");
  wait.set_timeout_ms(-1);
  v1::StoreWaitResponse wait_response;
  grpc::Status s = stub_->Wait(&ctx, wait, &wait_response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("timeout_ms"), std::string::npos) << s.error_message();
}

}  // namespace
}  // namespace rendezvous
}  // namespace lockstep
