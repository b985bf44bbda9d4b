// StoreGrpcService with an authorizer, over loopback: every unary RPC and
// every Session op is checked against (metadata, namespace).
#include "rendezvous/store_service.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <iterator>
#include <limits>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log_capture.h"
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

// `service` served on a loopback port the kernel picks (set in *port), with
// lockstepd's message limits.
std::unique_ptr<grpc::Server> Serve(StoreGrpcService* service, int* port) {
  grpc::ServerBuilder builder;
  ApplyMessageLimits(&builder);
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

class StoreServiceAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // TestAuthorizer, counting the checks of Session streams at open (a
    // job's namespaces, "<job>/*"): the server's side of each open.
    service_ = std::make_unique<StoreGrpcService>(
        &core_, [this](const std::multimap<grpc::string_ref, grpc::string_ref>& md,
                       absl::string_view ns) {
          if (absl::EndsWith(ns, "/*")) ++session_opens_checked_;
          return TestAuthorizer(md, ns);
        });
    server_ = Serve(service_.get(), &port_);
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
  std::atomic<int> session_opens_checked_{0};
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
  LogCapture log;
  grpc::Status s = UnarySet("job-a/0", "tok-job-b");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(s.error_message().find("job-a/0"), std::string::npos) << s.error_message();
  // The refusal is logged: the RPC, its namespace, the caller, the reason.
  EXPECT_TRUE(std::regex_search(
      log.Lines(), std::regex("\\[store\\] job=job-a rank=- refused StoreService/Set on namespace "
                              "\"job-a/0\" from ipv4:127\\.0\\.0\\.1:[0-9]+: PERMISSION_DENIED: "
                              "token does not open namespace 'job-a/0'\n")))
      << log.Lines();
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
  // Refused when the stream opened: for all of job-a's namespaces.
  EXPECT_NE(s.message().find("namespace 'job-a/*'"), std::string::npos) << s;
  EXPECT_EQ(store->Add("c", 1).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(StoreServiceAuthTest, SessionWithRightTokenWorks) {
  auto store = Session("job-a/0", "tok-job-a");
  ASSERT_TRUE(store->Set("k", "v").ok());
  auto v = store->Get("k", seconds(5));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "v");
}

// A raw Session stream (no store client), its job named as the client does.
std::unique_ptr<grpc::ClientReaderWriter<v1::StoreOp, v1::StoreOpResult>> RawSession(
    v1::StoreService::Stub* stub, grpc::ClientContext* ctx, const std::string& job,
    const std::string& token) {
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  ctx->AddMetadata(kStoreJobMetadata, job);
  return stub->Session(ctx);
}

// A stream without a valid token is refused when it opens, with the
// authorizer's status, and the server keeps nothing for it: 1,000 of them,
// all still open on the client side, hold no Session on the server (they
// used to hold a reactor and its buffers each: 20,000 took 397 MB).
TEST_F(StoreServiceAuthTest, UnauthenticatedSessionsAreRefusedAtOpenAndHoldNothing) {
  constexpr int kStreams = 1000;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReaderWriter<v1::StoreOp, v1::StoreOpResult>>> streams;
  for (int i = 0; i < kStreams; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    // A stream the server kept open (no refusal at open) ends here instead
    // of hanging the test: DEADLINE_EXCEEDED, not the authorizer's status.
    contexts.back()->set_deadline(std::chrono::system_clock::now() + seconds(30));
    streams.push_back(RawSession(stub_.get(), contexts.back().get(), "job-a",
                                 i % 2 == 0 ? "" : "tok-job-b"));
  }
  // The server has checked every open...
  const auto deadline = std::chrono::steady_clock::now() + seconds(30);
  while (session_opens_checked_ < kStreams && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(session_opens_checked_, kStreams) << "Session opens the server checked in 30 s";
  EXPECT_EQ(service_->NumSessions(), 0) << "refused streams, still open, hold Sessions";
  for (int i = 0; i < kStreams; ++i) {
    v1::StoreOpResult result;
    EXPECT_FALSE(streams[i]->Read(&result)) << "stream " << i << " was not refused";
  }
  // ...and finished every stream (each Read above saw its end); the client
  // still holds them all.
  EXPECT_EQ(service_->NumSessions(), 0) << "refused streams, still open, hold Sessions";
  for (int i = 0; i < kStreams; ++i) {
    grpc::Status s = streams[i]->Finish();
    EXPECT_EQ(s.error_code(), i % 2 == 0 ? grpc::StatusCode::UNAUTHENTICATED
                                         : grpc::StatusCode::PERMISSION_DENIED)
        << s.error_message();
  }
  EXPECT_EQ(service_->NumSessions(), 0);
  // A valid token's streams are held, and released when they end.
  {
    grpc::ClientContext ctx;
    auto stream = RawSession(stub_.get(), &ctx, "job-a", "tok-job-a");
    v1::StoreOp op;
    op.set_id(1);
    op.mutable_add()->set_namespace_("job-a/0");
    op.mutable_add()->set_key("n");
    op.mutable_add()->set_delta(1);
    ASSERT_TRUE(stream->Write(op));
    v1::StoreOpResult result;
    ASSERT_TRUE(stream->Read(&result));
    EXPECT_EQ(result.code(), 0) << result.message();
    EXPECT_EQ(service_->NumSessions(), 1);
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }
  for (int i = 0; i < 100 && service_->NumSessions() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(service_->NumSessions(), 0);
}

// Bytes on a Session stream that do not parse as a StoreOp end the stream
// with INVALID_ARGUMENT naming StoreOp, after the results of the ops before
// them; they used to end it with OK, as if the client had finished.
TEST_F(StoreServiceAuthTest, MalformedStoreOpEndsTheSessionWithInvalidArgumentNamingStoreOp) {
  grpc::GenericStub stub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer tok-job-a");
  ctx.AddMetadata(kStoreJobMetadata, "job-a");
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(30));  // a stream left open ends
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&ctx, "/lockstep.v1.StoreService/Session", &cq);
  // One operation at a time: each completes before the next starts.
  auto done = [&cq](int want) {
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(tag, reinterpret_cast<void*>(want));
    return ok;
  };
  auto write = [&](const std::string& bytes) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, reinterpret_cast<void*>(2));
    return done(2);
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(done(1));
  v1::StoreOp add;
  add.set_id(7);
  add.mutable_add()->set_namespace_("job-a/0");
  add.mutable_add()->set_key("n");
  add.mutable_add()->set_delta(1);
  ASSERT_TRUE(write(add.SerializeAsString()));
  grpc::ByteBuffer reply;
  call->Read(&reply, reinterpret_cast<void*>(3));
  ASSERT_TRUE(done(3));
  v1::StoreOpResult result;
  ASSERT_TRUE(grpc::SerializationTraits<v1::StoreOpResult>::Deserialize(&reply, &result).ok());
  EXPECT_EQ(result.id(), 7u);
  EXPECT_EQ(result.code(), 0) << result.message();
  write(std::string("\xff\xff\xff", 3));
  call->Read(&reply, reinterpret_cast<void*>(3));
  EXPECT_FALSE(done(3)) << "the stream went on after a malformed StoreOp";
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(4));
  done(4);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("lockstep.v1.StoreOp"), std::string::npos)
      << status.error_message();
  EXPECT_EQ(*core_.TryGet("job-a/0", "n"), "1");
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
}

// A worker may repeat a refused op in a loop: refusals of Session ops are
// logged at most once every 10 s over all of a service's streams. 200 ops
// (well under 10 s) on two streams give one line. The test runs twice,
// each time on its own service: with one limiter for the whole process the
// second run would log nothing.
class RefusedSessionOpsTest : public StoreServiceAuthTest,
                              public ::testing::WithParamInterface<int> {};

INSTANTIATE_TEST_SUITE_P(EachOnItsOwnService, RefusedSessionOpsTest, ::testing::Values(1, 2));

TEST_P(RefusedSessionOpsTest, RefusedSessionOpsInARowAreLoggedOnce) {
  LogCapture log;
  int64_t id = 0;
  for (int stream_number = 0; stream_number < 2; ++stream_number) {
    grpc::ClientContext ctx;
    auto stream = RawSession(stub_.get(), &ctx, "job-a", "tok-job-a");
    for (int i = 0; i < 100; ++i) {
      v1::StoreOp op;
      op.set_id(++id);
      op.mutable_set()->set_namespace_("job-b/0");  // not job-a's token's
      op.mutable_set()->set_key("k");
      op.mutable_set()->set_value("v");
      ASSERT_TRUE(stream->Write(op));
      // The result comes after its refusal was (or was not) logged.
      v1::StoreOpResult result;
      ASSERT_TRUE(stream->Read(&result));
      ASSERT_EQ(result.code(), grpc::StatusCode::PERMISSION_DENIED) << result.message();
    }
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }
  const std::string lines = log.Lines();
  const std::regex refusal(
      "\\[store\\] job=job-b rank=- refused StoreService/Session on namespace \"job-b/0\" from "
      "ipv4:127\\.0\\.0\\.1:[0-9]+: PERMISSION_DENIED: token does not open namespace "
      "'job-b/0'\n");
  EXPECT_EQ(std::distance(std::sregex_iterator(lines.begin(), lines.end(), refusal),
                          std::sregex_iterator()),
            1)
      << lines;
  EXPECT_FALSE(core_.NumKeys("job-b/0").ok() && *core_.NumKeys("job-b/0") > 0);
}

// The store client reports a refused stream with the server's code and
// reason at once, instead of retrying it as a broken connection.
TEST_F(StoreServiceAuthTest, StoreClientGetsTheRefusalAtOnce) {
  StoreClientOptions options;
  options.connect_timeout = seconds(10);
  options.rpc_timeout = seconds(30);
  auto store = ConnectStore(address_, "job-a/0", options);
  ASSERT_TRUE(store.ok()) << store.status();
  // A retried refusal would end as Unavailable ("not reachable") at the deadline.
  Status s = (*store)->Set("k", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_NE(s.message().find("refused the session"), std::string::npos) << s;
}

class StoreServiceLimitsTest : public ::testing::Test {
 protected:
  void Start(StoreGrpcService::Limits limits) {
    service_ = std::make_unique<StoreGrpcService>(&core_, TestAuthorizer, limits);
    server_ = Serve(service_.get(), &port_);
    ASSERT_NE(server_, nullptr);
    grpc::ChannelArguments args = LockstepChannelArguments();
    stub_ = v1::StoreService::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials(), args));
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
  }

  StoreCore core_;
  std::unique_ptr<StoreGrpcService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<v1::StoreService::Stub> stub_;
};

// Sessions beyond the per-job cap are refused at open with
// ResourceExhausted naming the limit; other jobs still get theirs, and a
// closed stream gives its place back.
TEST_F(StoreServiceLimitsTest, SessionsPerJobAndInAllAreCapped) {
  StoreGrpcService::Limits limits;
  limits.max_sessions_per_job = 2;
  limits.max_sessions = 3;
  Start(limits);
  auto open = [&](grpc::ClientContext* ctx, const std::string& job) {
    auto stream = RawSession(stub_.get(), ctx, job, "admin");
    v1::StoreOp op;
    op.set_id(1);
    op.mutable_num_keys()->set_namespace_(job + "/0");
    v1::StoreOpResult result;
    const bool served = stream->Write(op) && stream->Read(&result);
    return std::make_pair(std::move(stream), served);
  };
  grpc::ClientContext c1, c2, c3, c4, c5;
  auto s1 = open(&c1, "job-a");
  auto s2 = open(&c2, "job-a");
  ASSERT_TRUE(s1.second && s2.second);
  LogCapture log;
  auto s3 = open(&c3, "job-a");
  EXPECT_FALSE(s3.second);
  grpc::Status refused = s3.first->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.error_message().find("kMaxSessionsPerJob=2"), std::string::npos)
      << refused.error_message();
  // The daemon's log says so too, naming the caller.
  EXPECT_TRUE(std::regex_search(
      log.Lines(), std::regex("refused StoreService/Session on namespace \"job-a/\\*\" from "
                              "ipv4:127\\.0\\.0\\.1:[0-9]+: RESOURCE_EXHAUSTED: .*"
                              "kMaxSessionsPerJob=2\n")))
      << log.Lines();
  auto s4 = open(&c4, "job-b");
  EXPECT_TRUE(s4.second);
  auto s5 = open(&c5, "job-c");
  EXPECT_FALSE(s5.second);
  grpc::Status full = s5.first->Finish();
  EXPECT_NE(full.error_message().find("kMaxSessions=3"), std::string::npos) << full.error_message();
  EXPECT_EQ(service_->NumSessions(), 3);
  s1.first->WritesDone();
  EXPECT_TRUE(s1.first->Finish().ok());
  for (int i = 0; i < 100 && service_->NumSessions() != 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  grpc::ClientContext c6;
  auto s6 = open(&c6, "job-c");
  EXPECT_TRUE(s6.second);
  for (auto* s : {&s2, &s4, &s6}) {
    s->first->WritesDone();
    s->first->Finish();
  }
}

// The per-job cap counts a stream under its job ("<job>" of what the
// client names at open), as authorization reads it: a job's token naming
// "job-a/1", "job-a/2", ... gets no extra slot per name (it could take
// every slot of the store that way).
TEST_F(StoreServiceLimitsTest, SessionsNamingRoundsOfAJobCountAgainstThatJob) {
  StoreGrpcService::Limits limits;
  limits.max_sessions_per_job = 2;
  Start(limits);
  auto open = [&](grpc::ClientContext* ctx, const std::string& named) {
    auto stream = RawSession(stub_.get(), ctx, named, "tok-job-a");
    v1::StoreOp op;
    op.set_id(1);
    op.mutable_num_keys()->set_namespace_("job-a/0");
    v1::StoreOpResult result;
    const bool served = stream->Write(op) && stream->Read(&result);
    return std::make_pair(std::move(stream), served);
  };
  grpc::ClientContext c1, c2, c3;
  auto s1 = open(&c1, "job-a");
  auto s2 = open(&c2, "job-a/1");
  ASSERT_TRUE(s1.second && s2.second);
  auto s3 = open(&c3, "job-a/2");
  EXPECT_FALSE(s3.second) << "a third stream of job-a was served";
  if (s3.second) s3.first->WritesDone();  // so Finish returns what it was
  grpc::Status refused = s3.first->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_NE(refused.error_message().find("job \"job-a\""), std::string::npos)
      << refused.error_message();
  EXPECT_NE(refused.error_message().find("kMaxSessionsPerJob=2"), std::string::npos)
      << refused.error_message();
  EXPECT_EQ(service_->NumSessions(), 2);
  for (auto* s : {&s1, &s2}) {
    s->first->WritesDone();
    EXPECT_TRUE(s->first->Finish().ok());
  }
}

// A client that sends ops but never reads their results: once the
// results it has not taken fill the queue (the HTTP/2 window is full of
// 1 MiB values), the server stops reading its ops, so what it holds for
// the client stays bounded; when the client reads, the rest run.
TEST_F(StoreServiceLimitsTest, ASessionThatDoesNotReadStopsBeingRead) {
  StoreGrpcService::Limits limits;
  limits.max_queued_results = 4;
  Start(limits);
  ASSERT_TRUE(core_.Set("job-a/0", "big", std::string(1 << 20, 'x')).ok());
  constexpr int kPairs = 40;
  grpc::ClientContext ctx;
  auto stream = RawSession(stub_.get(), &ctx, "job-a", "admin");
  std::thread writer([&] {
    for (int i = 0; i < kPairs; ++i) {
      v1::StoreOp get;
      get.set_id(2 * i);
      get.mutable_get()->set_namespace_("job-a/0");
      get.mutable_get()->set_key("big");
      v1::StoreOp add;
      add.set_id(2 * i + 1);
      add.mutable_add()->set_namespace_("job-a/0");
      add.mutable_add()->set_key("ops");
      add.mutable_add()->set_delta(1);
      if (!stream->Write(get) || !stream->Write(add)) return;
    }
    stream->WritesDone();
  });
  auto executed = [&] {
    auto v = core_.TryGet("job-a/0", "ops");
    return v.ok() ? std::stoi(*v) : 0;
  };
  // Give the server time to run everything it would run unchecked.
  int seen = -1;
  for (int i = 0; i < 20 && seen != executed(); ++i) {
    seen = executed();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_LT(executed(), kPairs / 2) << "the server kept reading ops of a client that reads nothing";
  v1::StoreOpResult result;
  int results = 0;
  while (results < 2 * kPairs && stream->Read(&result)) ++results;
  writer.join();
  EXPECT_EQ(results, 2 * kPairs);
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(executed(), kPairs);
}

TEST(StoreServiceOpenTest, NoAuthorizerAcceptsCallsWithoutToken) {
  StoreCore core;
  StoreGrpcService service(&core);
  int port = 0;
  auto server = Serve(&service, &port);
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
