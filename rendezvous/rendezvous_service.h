// RendezvousGrpcService: the thin gRPC shell over RendezvousCore
// (lockstep.v1.RendezvousService), part of the coordinator's API. Per RPC it
// validates, converts, calls the core and maps the status through
// rendezvous/grpc_status.h; no state beyond a pointer to the core.
//
// Threading: gRPC's callback API. JoinRendezvous parks in the core
// (RendezvousCore::Join) and returns at once; its reactor is completed from
// the core's callback when the round closes (on the thread of the join that
// closed it, or the core's timer thread at the last call / join timeout), so
// a thousand waiting nodes hold no server thread. A client that disconnects
// mid-join (OnCancel) is withdrawn from the round (CancelJoin).
//
// Deadline of a join: the request's timeout_ms (0 = the job's join timeout),
// or the RPC deadline when earlier.
//
// Authorization: an optional RendezvousAuthorizer (Default: none, open).
// When set, every RPC is checked against (client metadata, the request's
// job id) first and fails with its status (Unauthenticated /
// PermissionDenied). lockstepd requires the admin token here.
//
// Registering on the coordinator's own server:
//   RendezvousGrpcService rendezvous_service(&rendezvous_core);
//   builder.RegisterService(&rendezvous_service);
// Jobs are created through the core (RendezvousCore::CreateJob), not RPCs.
#ifndef LOCKSTEP_RENDEZVOUS_RENDEZVOUS_SERVICE_H_
#define LOCKSTEP_RENDEZVOUS_RENDEZVOUS_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <utility>

#include "absl/strings/string_view.h"
#include "common/status.h"

#include "lockstep/v1/rendezvous.grpc.pb.h"
#include "rendezvous/rendezvous_core.h"

namespace lockstep {
namespace rendezvous {

// Decides whether a caller may act on job `job_id`. Must be thread-safe and
// must not block (runs on gRPC's callback threads).
using RendezvousAuthorizer = std::function<Status(
    const std::multimap<grpc::string_ref, grpc::string_ref>& client_metadata,
    absl::string_view job_id)>;

class RendezvousGrpcService final : public v1::RendezvousService::CallbackService {
 public:
  // `core` is not owned and must outlive the service and the server.
  // `authorizer`: see "Authorization" above; empty = open.
  explicit RendezvousGrpcService(RendezvousCore* core, RendezvousAuthorizer authorizer = nullptr)
      : core_(core), authorizer_(std::move(authorizer)) {}

  grpc::ServerUnaryReactor* JoinRendezvous(grpc::CallbackServerContext* ctx,
                                           const v1::JoinRendezvousRequest* request,
                                           v1::JoinRendezvousResponse* response) override;
  grpc::ServerUnaryReactor* LeaveRendezvous(grpc::CallbackServerContext* ctx,
                                            const v1::LeaveRendezvousRequest* request,
                                            v1::LeaveRendezvousResponse* response) override;
  grpc::ServerUnaryReactor* GetRendezvousState(grpc::CallbackServerContext* ctx,
                                               const v1::GetRendezvousStateRequest* request,
                                               v1::GetRendezvousStateResponse* response) override;

 private:
  // OK when no authorizer is set.
  Status Authorize(const grpc::CallbackServerContext& ctx, absl::string_view job_id) const;

  RendezvousCore* const core_;
  const RendezvousAuthorizer authorizer_;
};

}  // namespace rendezvous
}  // namespace lockstep

#endif  // LOCKSTEP_RENDEZVOUS_RENDEZVOUS_SERVICE_H_
