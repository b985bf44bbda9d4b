#include "daemon/grpc_coordinator_client.h"

#include "absl/strings/str_cat.h"
#include "daemon/token.h"
#include "rendezvous/grpc_status.h"

namespace lockstep {
namespace daemon {

void GrpcCoordinatorClient::Prepare(grpc::ClientContext* ctx, Duration timeout) const {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::duration_cast<std::chrono::system_clock::duration>(timeout));
  MutexLock lock(&mu_);
  ctx->AddMetadata(kAuthorizationHeader, "Bearer " + token_);
}

void GrpcCoordinatorClient::SetToken(std::string token) {
  MutexLock lock(&mu_);
  token_ = std::move(token);
}

StatusOr<v1::RegisterNodeResponse> GrpcCoordinatorClient::RegisterNode(
    const v1::RegisterNodeRequest& request, Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  v1::RegisterNodeResponse resp;
  grpc::Status s = stub_->RegisterNode(&ctx, request, &resp);
  if (!s.ok()) return FromGrpcStatus(s, absl::StrCat("coordinator at ", address_));
  return resp;
}

StatusOr<v1::HeartbeatResponse> GrpcCoordinatorClient::Heartbeat(const v1::HeartbeatRequest& request,
                                                                 Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  v1::HeartbeatResponse resp;
  grpc::Status s = stub_->Heartbeat(&ctx, request, &resp);
  if (!s.ok()) return FromGrpcStatus(s, absl::StrCat("coordinator at ", address_));
  return resp;
}

}  // namespace daemon
}  // namespace lockstep
