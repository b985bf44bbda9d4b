#include "rendezvous/malformed_request.h"

#include <google/protobuf/descriptor.h>
#include <grpcpp/support/interceptor.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace rendezvous {
namespace {

using grpc::experimental::InterceptionHookPoints;

class MalformedRequestInterceptor : public grpc::experimental::Interceptor {
 public:
  // `request_type`: the method's request message ("" for a method not served).
  MalformedRequestInterceptor(std::string method, std::string request_type)
      : method_(std::move(method)), request_type_(std::move(request_type)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (!request_type_.empty() &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED && status.error_message().empty()) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("malformed request: the bytes sent to ", method_, " do not parse as ",
                         request_type_)));
      }
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  const std::string request_type_;
};

class MalformedRequestFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit MalformedRequestFactory(std::vector<std::string> services)
      : services_(std::move(services)) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    const std::string method = info->method() != nullptr ? info->method() : "";
    return new MalformedRequestInterceptor(method, RequestType(method));
  }

 private:
  // "/pkg.Service/Method" of a served service -> "pkg.MethodRequest".
  std::string RequestType(const std::string& method) const {
    const size_t slash = method.rfind('/');
    if (method.empty() || method[0] != '/' || slash == 0 || slash == std::string::npos) return "";
    const std::string service = method.substr(1, slash - 1);
    if (std::find(services_.begin(), services_.end(), service) == services_.end()) return "";
    const google::protobuf::MethodDescriptor* found =
        google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(
            absl::StrCat(service, ".", method.substr(slash + 1)));
    return found != nullptr ? found->input_type()->full_name() : "";
  }

  const std::vector<std::string> services_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewMalformedRequestInterceptor(std::vector<std::string> services) {
  return std::make_unique<MalformedRequestFactory>(std::move(services));
}

}  // namespace rendezvous
}  // namespace lockstep
