// CoordinatorClient: how an agent talks to the coordinator. Interface so
// the agent core is tested with a fake; the gRPC implementation lives in
// grpc_coordinator_client.h.
//
// Thread safety: implementations are thread-safe.
// Errors: whatever the coordinator returns (NotFound: not registered;
// Aborted: stale incarnation), Unavailable / DeadlineExceeded when it
// cannot be reached within `timeout`.
#ifndef LOCKSTEP_DAEMON_COORDINATOR_CLIENT_H_
#define LOCKSTEP_DAEMON_COORDINATOR_CLIENT_H_

#include "common/clock.h"
#include "common/status.h"
#include "lockstep/v1/common.pb.h"

namespace lockstep {
namespace daemon {

class CoordinatorClient {
 public:
  virtual ~CoordinatorClient() = default;
  virtual StatusOr<v1::RegisterNodeResponse> RegisterNode(const v1::RegisterNodeRequest& request,
                                                          Duration timeout) = 0;
  virtual StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request,
                                                    Duration timeout) = 0;
};

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_COORDINATOR_CLIENT_H_
