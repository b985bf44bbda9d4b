#include "daemon/rpc_metrics.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <future>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "rendezvous/grpc_server.h"

namespace lockstep {
namespace daemon {
namespace {

// Calls `method` with an empty request through a generic stub.
grpc::Status Call(grpc::GenericStub* stub, const std::string& method) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice empty("");  // an empty HealthCheckRequest: service ""
  grpc::ByteBuffer request(&empty, 1), response;
  std::promise<grpc::Status> done;
  stub->UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                  [&done](grpc::Status s) { done.set_value(s); });
  return done.get_future().get();
}

TEST(RpcMetricsTest, InterceptorTimesAndCountsEveryCallByMethodAndCode) {
  RpcStats stats;
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(NewRpcMetricsInterceptor(&stats));
  auto started = rendezvous::StartGrpcServer("127.0.0.1:0", {}, "test", std::move(interceptors));
  ASSERT_TRUE(started.ok()) << started.status();
  grpc::GenericStub stub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", started->port),
                                             grpc::InsecureChannelCredentials()));
  // The default health service: service "" is SERVING (OK).
  ASSERT_TRUE(Call(&stub, "/grpc.health.v1.Health/Check").ok());
  ASSERT_TRUE(Call(&stub, "/grpc.health.v1.Health/Check").ok());
  std::vector<MetricFamily> out;
  rendezvous::ShutdownGrpcServer(&started->server, std::chrono::seconds(1));
  stats.AppendTo(&out);
  const std::string text = RenderExposition(out);
  EXPECT_TRUE(absl::StrContains(
      text, "lockstep_rpc_duration_seconds_count{method=\"/grpc.health.v1.Health/Check\"} 2\n"))
      << text;
  EXPECT_TRUE(absl::StrContains(
      text, "lockstep_rpc_duration_seconds_bucket{method=\"/grpc.health.v1.Health/Check\",le=\"+Inf\"} 2\n"));
  EXPECT_TRUE(absl::StrContains(
      text, "lockstep_rpcs_total{method=\"/grpc.health.v1.Health/Check\",code=\"OK\"} 2\n"))
      << text;
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
