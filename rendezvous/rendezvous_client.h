// Client of the coordinator's RendezvousService, for agents (and tests).
//
//   ASSIGN_OR_RETURN(auto client, RendezvousClient::Connect(coordinator, seconds(30)));
//   JoinRequest join{JobId(job), NodeId(node), incarnation, nproc, round, host};
//   ASSIGN_OR_RETURN(RendezvousResult result, client->Join(join, seconds(600)));
//
// Deadlines: Join blocks until the round closes or `timeout` passes (the
// server answers DeadlineExceeded; the RPC deadline adds kRendezvousRpcGrace);
// Leave and GetState use `timeout` as their RPC deadline.
// Reconnection: calls wait for the channel to (re)connect until their
// deadline (gRPC wait_for_ready, with the channel's reconnect backoff), so a
// coordinator restart within the deadline is ridden out.
// Thread safety: safe for concurrent use; many Joins may be in flight.
#ifndef LOCKSTEP_RENDEZVOUS_RENDEZVOUS_CLIENT_H_
#define LOCKSTEP_RENDEZVOUS_RENDEZVOUS_CLIENT_H_

#include <chrono>
#include <memory>
#include <string>

#include "common/clock.h"
#include "common/status.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/rendezvous_core.h"

namespace grpc {
class Channel;
}

namespace lockstep {
namespace rendezvous {

// Added to a Join's own timeout for its RPC deadline, so the server's
// DeadlineExceeded (naming the counts) arrives before the transport's.
inline constexpr std::chrono::seconds kRendezvousRpcGrace{10};
class RendezvousClient : public Rendezvous {
 public:
  // Connects to the RendezvousService at `address` ("host:port"), waiting up
  // to `connect_timeout` (Unavailable naming the address).
  static StatusOr<std::unique_ptr<RendezvousClient>> Connect(const std::string& address,
                                                             Duration connect_timeout);
  // Uses an existing channel (e.g. the agent's channel to the coordinator).
  explicit RendezvousClient(std::shared_ptr<grpc::Channel> channel, std::string address = "");
  ~RendezvousClient() override;

  using Rendezvous::GetState;
  using Rendezvous::Leave;

  // Blocks until the round closes (the node's result) or `timeout` passes.
  // Errors: as RendezvousCore::Join, plus Unavailable (coordinator unreachable).
  StatusOr<RendezvousResult> Join(const JoinRequest& request, Duration timeout) override;
  Status Leave(const JobId& job_id, const NodeId& node_id, int round, Duration timeout) override;
  StatusOr<RendezvousState> GetState(const JobId& job_id, Duration timeout) override;

 private:
  struct Stub;
  std::shared_ptr<grpc::Channel> channel_;
  std::string address_;
  std::unique_ptr<Stub> stub_;
};

}  // namespace rendezvous
}  // namespace lockstep

#endif  // LOCKSTEP_RENDEZVOUS_RENDEZVOUS_CLIENT_H_
