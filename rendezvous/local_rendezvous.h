// LocalRendezvous: the Rendezvous interface over an in-process RendezvousCore,
// for agent and coordinator tests without gRPC (nodes as threads).
//
//   RendezvousCore core;
//   core.CreateJob(config);
//   LocalRendezvous rendezvous(&core);
//   auto result = rendezvous.Join(request, seconds(10));
//
// Join parks the calling thread on a condition variable until the round
// closes; `timeout` is kept on the real steady clock (whatever Clock the
// core runs on), then the join is withdrawn (DeadlineExceeded).
// Thread safety: safe for concurrent use.
#ifndef LOCKSTEP_RENDEZVOUS_LOCAL_RENDEZVOUS_H_
#define LOCKSTEP_RENDEZVOUS_LOCAL_RENDEZVOUS_H_

#include "rendezvous/rendezvous.h"
#include "rendezvous/rendezvous_core.h"

namespace lockstep {
namespace rendezvous {

class LocalRendezvous : public Rendezvous {
 public:
  // `core` is not owned and must outlive this object.
  explicit LocalRendezvous(RendezvousCore* core) : core_(core) {}

  using Rendezvous::GetState;
  using Rendezvous::Leave;

  StatusOr<RendezvousResult> Join(const JoinRequest& request, Duration timeout) override;
  Status Leave(const JobId& job_id, const NodeId& node_id, int round, Duration timeout) override;
  StatusOr<RendezvousState> GetState(const JobId& job_id, Duration timeout) override;

 private:
  RendezvousCore* const core_;
};

}  // namespace rendezvous
}  // namespace lockstep

#endif  // LOCKSTEP_RENDEZVOUS_LOCAL_RENDEZVOUS_H_
