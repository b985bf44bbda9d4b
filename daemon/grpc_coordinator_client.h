// GrpcCoordinatorClient: CoordinatorClient over a gRPC channel, sending the
// bearer token with every call (SetToken changes it for the next calls: a
// rotation). Thread-safe.
#ifndef LOCKSTEP_DAEMON_GRPC_COORDINATOR_CLIENT_H_
#define LOCKSTEP_DAEMON_GRPC_COORDINATOR_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "common/mutex.h"
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
  void SetToken(std::string token) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Prepare(grpc::ClientContext* ctx, Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);
  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
  mutable Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  const std::string address_;
};

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_GRPC_COORDINATOR_CLIENT_H_
