// Conversions between the rendezvous domain types (rendezvous_core.h) and
// their lockstep.v1 protos, shared by the service, the client and the
// coordinator (which ships RendezvousResult in AgentCommand).
// Thread safety: pure functions.
#ifndef LOCKSTEP_RENDEZVOUS_RENDEZVOUS_CONVERT_H_
#define LOCKSTEP_RENDEZVOUS_RENDEZVOUS_CONVERT_H_

#include "lockstep/v1/rendezvous.pb.h"
#include "rendezvous/rendezvous_core.h"

namespace lockstep {
namespace rendezvous {

v1::RendezvousResult ToProto(const RendezvousResult& result);
RendezvousResult FromProto(const v1::RendezvousResult& proto);

// timeout_ms is not part of JoinRequest (the caller's deadline); ignored here.
v1::JoinRendezvousRequest ToProto(const JoinRequest& request);
JoinRequest FromProto(const v1::JoinRendezvousRequest& proto);

v1::GetRendezvousStateResponse ToProto(const RendezvousState& state);
RendezvousState FromProto(const v1::GetRendezvousStateResponse& proto);

}  // namespace rendezvous
}  // namespace lockstep

#endif  // LOCKSTEP_RENDEZVOUS_RENDEZVOUS_CONVERT_H_
