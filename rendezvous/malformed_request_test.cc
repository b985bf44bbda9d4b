// Bytes that do not parse as a method's request: INVALID_ARGUMENT naming
// the method and the message type, where gRPC alone answers UNIMPLEMENTED
// with no message; methods the server does not serve keep UNIMPLEMENTED.
#include "rendezvous/malformed_request.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <future>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "lockstep/v1/store.grpc.pb.h"
#include "rendezvous/store_service.h"

namespace lockstep {
namespace rendezvous {
namespace {

class MalformedRequestTest : public ::testing::Test {
 protected:
  void Start(bool with_interceptor) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    if (with_interceptor) {
      std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> list;
      list.push_back(NewMalformedRequestInterceptor({v1::StoreService::service_full_name()}));
      builder.experimental().SetInterceptorCreators(std::move(list));
    }
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials());
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  grpc::Status Raw(const std::string& method, const std::string& bytes) {
    grpc::GenericStub stub(channel_);
    grpc::ClientContext ctx;
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                   [&done](grpc::Status s) { done.set_value(s); });
    return done.get_future().get();
  }

  StoreCore core_;
  StoreGrpcService service_{&core_};
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

const std::string kGarbage("\xff\xff\xff\xff", 4);  // a field tag that never ends

TEST_F(MalformedRequestTest, GarbageIsInvalidArgumentNamingTheMessageType) {
  Start(true);
  grpc::Status s = Raw("/lockstep.v1.StoreService/Set", kGarbage);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message(),
            "malformed request: the bytes sent to /lockstep.v1.StoreService/Set do not parse as "
            "lockstep.v1.StoreSetRequest");
  // A well-formed request still works, and nothing was written before.
  v1::StoreSetRequest set;
  set.set_namespace_("job/0");
  set.set_key("k");
  set.set_value("v");
  EXPECT_TRUE(Raw("/lockstep.v1.StoreService/Set", set.SerializeAsString()).ok());
  EXPECT_EQ(*core_.NumKeys("job/0"), 1);
}

TEST_F(MalformedRequestTest, MethodsNotServedStayUnimplemented) {
  Start(true);
  EXPECT_EQ(Raw("/lockstep.v1.StoreService/NoSuchMethod", "").error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  // A real lockstep method of a service this server does not host.
  EXPECT_EQ(Raw("/lockstep.v1.CoordinatorService/ListJobs", "").error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

// What gRPC does without it (the case the interceptor exists for).
TEST_F(MalformedRequestTest, WithoutTheInterceptorGrpcSaysUnimplemented) {
  Start(false);
  grpc::Status s = Raw("/lockstep.v1.StoreService/Set", kGarbage);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(s.error_message(), "");
}

}  // namespace
}  // namespace rendezvous
}  // namespace lockstep
