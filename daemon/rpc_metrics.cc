#include "daemon/rpc_metrics.h"

#include <grpcpp/support/interceptor.h>

#include <chrono>
#include <string>

namespace lockstep {
namespace daemon {
namespace {

using grpc::experimental::InterceptionHookPoints;

class RpcMetricsInterceptor : public grpc::experimental::Interceptor {
 public:
  RpcMetricsInterceptor(RpcStats* stats, const char* method)
      : stats_(stats),
        method_(method != nullptr ? method : "unknown"),
        start_(std::chrono::steady_clock::now()) {}

  ~RpcMetricsInterceptor() override {
    if (!recorded_) Record(GrpcCodeName(grpc::StatusCode::CANCELLED));
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (!recorded_ && methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      Record(GrpcCodeName(methods->GetSendStatus().error_code()));
    }
    methods->Proceed();
  }

 private:
  void Record(const std::string& code) {
    recorded_ = true;
    stats_->Record(method_, code,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }

  RpcStats* const stats_;
  const std::string method_;
  const std::chrono::steady_clock::time_point start_;
  bool recorded_ = false;  // hook points of one call run one at a time
};

class RpcMetricsFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcMetricsFactory(RpcStats* stats) : stats_(stats) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new RpcMetricsInterceptor(stats_, info->method());
  }

 private:
  RpcStats* const stats_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewRpcMetricsInterceptor(
    RpcStats* stats) {
  return std::make_unique<RpcMetricsFactory>(stats);
}

}  // namespace daemon
}  // namespace lockstep
