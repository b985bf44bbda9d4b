// CoordinatorGrpcService: the thin gRPC shell over Coordinator
// (lockstep.v1.CoordinatorService). Per RPC: authorize the bearer token's
// role (roles.h), validate, call the core, map the status through
// rendezvous/grpc_status.h; a refusal is logged (rendezvous/refusals.h).
// Answers to agents (RegisterNode, Heartbeat)
// also carry the admin and viewer token digests, and each start command the
// job's store token, so an agent needs only the agent token.
//
// Threading: gRPC's callback API. Every RPC but WatchJob completes inside
// its handler (core calls are short critical sections plus one SQLite
// write). WatchJob is a long poll that holds no thread while it waits: it
// registers Coordinator::WatchOnce and a gRPC callback alarm and returns;
// the reactor is finished from the core's change callback (on the thread
// that made the change), from the alarm when the request's timeout_ms
// passes (DEADLINE_EXCEEDED naming the job and the timeout), or from
// OnCancel when the client's deadline passes or it goes away.
#ifndef LOCKSTEP_DAEMON_COORDINATOR_SERVICE_H_
#define LOCKSTEP_DAEMON_COORDINATOR_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "common/logging.h"
#include "daemon/coordinator.h"
#include "daemon/roles.h"
#include "lockstep/v1/coordinator.grpc.pb.h"

namespace lockstep {
namespace daemon {

// WatchJob's timeout_ms: 0 means kDefaultWatchTimeout, larger values are
// clamped to kMaxWatchTimeout (as coordinator.proto documents).
inline constexpr std::chrono::milliseconds kDefaultWatchTimeout{10000};
inline constexpr std::chrono::milliseconds kMaxWatchTimeout{60000};

// The wait of a WatchJob request: InvalidArgument naming timeout_ms when
// negative; never more than kMaxWatchTimeout, so no value overflows.
StatusOr<std::chrono::milliseconds> WatchTimeout(int64_t timeout_ms);

// Whether a node may register (and heartbeat) as `node_id` when its client
// certificate's names are `san` (its subjectAltName DNS and IP entries, as
// text) and `cn` (its common names): `node_id` must be one of `san`, or of
// `cn` when `san` is empty (as a TLS client checks a server's name).
// PermissionDenied naming the node id and the certificate's names.
Status NodeIdNamedBy(const std::string& node_id, const std::vector<std::string>& san,
                     const std::vector<std::string>& cn);

class CoordinatorGrpcService final : public v1::CoordinatorService::CallbackService {
 public:
  // `core` and `roles` must outlive the service and the server.
  // `store_key` keys the jobs' store tokens (JobStoreToken) and the nodes'
  // log keys (NodeLogKey), which each node gets in its RegisterNode and
  // Heartbeat answers.
  // `bind_node_ids` (lockstepd --tls-bind-node-ids, mutual TLS): RegisterNode
  // and Heartbeat are admitted only for a node id the caller's certificate
  // names (NodeIdNamedBy).
  CoordinatorGrpcService(Coordinator* core, const RoleTokens* roles, std::string store_key,
                         bool bind_node_ids = false)
      : core_(core),
        roles_(roles),
        store_key_(std::move(store_key)),
        bind_node_ids_(bind_node_ids) {}

  grpc::ServerUnaryReactor* RegisterNode(grpc::CallbackServerContext* ctx,
                                         const v1::RegisterNodeRequest* req,
                                         v1::RegisterNodeResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* ctx,
                                      const v1::SubmitJobRequest* req,
                                      v1::SubmitJobResponse* resp) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
                                   v1::GetJobResponse* resp) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx,
                                      const v1::CancelJobRequest* req,
                                      v1::CancelJobResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* ctx,
                                      const v1::DeleteJobRequest* req,
                                      v1::DeleteJobResponse* resp) override;
  grpc::ServerUnaryReactor* ListNodes(grpc::CallbackServerContext* ctx,
                                      const v1::ListNodesRequest* req,
                                      v1::ListNodesResponse* resp) override;
  grpc::ServerUnaryReactor* WatchJob(grpc::CallbackServerContext* ctx,
                                     const v1::WatchJobRequest* req,
                                     v1::WatchJobResponse* resp) override;
  // Log tickets (log_ticket.h) of an existing job for the nodes asked for,
  // expiring kLogTicketLife from now by this host's wall clock.
  grpc::ServerUnaryReactor* IssueLogTickets(grpc::CallbackServerContext* ctx,
                                            const v1::IssueLogTicketsRequest* req,
                                            v1::IssueLogTicketsResponse* resp) override;

 private:
  // AuthorizeCall for "CoordinatorService/<method>".
  Status Authorize(const grpc::CallbackServerContext& ctx, absl::string_view method) const;
  // Finishes the call with `s`, logging it first if it is a refusal
  // (rendezvous/refusals.h) of "CoordinatorService/<method>" about `job`
  // ("" when none).
  grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx, absl::string_view method,
                                   const std::string& job, const Status& s) const;

  Coordinator* const core_;
  const RoleTokens* const roles_;
  // With bind_node_ids_: NodeIdNamedBy the call's certificate.
  Status CheckNodeIdBound(const grpc::CallbackServerContext& ctx, const std::string& node_id) const;

  const std::string store_key_;
  const bool bind_node_ids_;
  const Logger log_{"coordinator"};
};

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_COORDINATOR_SERVICE_H_
