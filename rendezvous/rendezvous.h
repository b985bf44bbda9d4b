// Rendezvous: what a node (an agent) calls to get its rank, as an interface,
// so agents are tested without a network. Implementations:
//   RendezvousClient (rendezvous_client.h): over gRPC to the coordinator.
//   LocalRendezvous (local_rendezvous.h): in-process over a RendezvousCore.
//
// Thread safety: implementations are safe for concurrent use.
// Blocking: Join blocks until the node's round closes or `timeout` passes;
// Leave and GetState are short calls bounded by `timeout`.
// Errors: as RendezvousCore::Join / Leave / GetState (rendezvous_core.h), plus
// Unavailable when the coordinator cannot be reached.
#ifndef LOCKSTEP_RENDEZVOUS_RENDEZVOUS_H_
#define LOCKSTEP_RENDEZVOUS_RENDEZVOUS_H_

#include <chrono>

#include "common/clock.h"
#include "common/status.h"
#include "rendezvous/rendezvous_core.h"

namespace lockstep {
namespace rendezvous {

// Default deadline of Leave and GetState.
inline constexpr std::chrono::seconds kDefaultRendezvousRpcTimeout{30};

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;

  virtual StatusOr<RendezvousResult> Join(const JoinRequest& request, Duration timeout) = 0;
  virtual Status Leave(const JobId& job_id, const NodeId& node_id, int round,
                       Duration timeout) = 0;
  virtual StatusOr<RendezvousState> GetState(const JobId& job_id, Duration timeout) = 0;

  // With kDefaultRendezvousRpcTimeout.
  Status Leave(const JobId& job_id, const NodeId& node_id, int round) {
    return Leave(job_id, node_id, round, kDefaultRendezvousRpcTimeout);
  }
  StatusOr<RendezvousState> GetState(const JobId& job_id) {
    return GetState(job_id, kDefaultRendezvousRpcTimeout);
  }
};

}  // namespace rendezvous
}  // namespace lockstep

#endif  // LOCKSTEP_RENDEZVOUS_RENDEZVOUS_H_
