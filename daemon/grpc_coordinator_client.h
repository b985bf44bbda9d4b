// GrpcCoordinatorClient: CoordinatorClient over a gRPC channel, sending the
// bearer token with every call. Thread-safe.
#ifndef LOCKSTEP_DAEMON_GRPC_COORDINATOR_CLIENT_H_
#define LOCKSTEP_DAEMON_GRPC_COORDINATOR_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "daemon/coordinator_client.h"
#include "lockstep/v1/coordinator.grpc.pb.h"

namespace lockstep {
namespace daemon {

class GrpcCoordinatorClient : public CoordinatorClient {
 public:
  GrpcCoordinatorClient(std::shared_ptr<grpc::Channel> channel, std::string token, std::string address)
      : stub_(v1::CoordinatorService::NewStub(channel)),
        token_(std::move(token)),
        address_(std::move(address)) {}

  StatusOr<v1::RegisterNodeResponse> RegisterNode(const v1::RegisterNodeRequest& request,
                                                  Duration timeout) override;
  StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request,
                                            Duration timeout) override;

 private:
  void Prepare(grpc::ClientContext* ctx, Duration timeout) const;
  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
  const std::string token_;
  const std::string address_;
};

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_GRPC_COORDINATOR_CLIENT_H_
