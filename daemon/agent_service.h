// AgentGrpcService: the thin gRPC shell over Agent (lockstep.v1.AgentService).
//
// Auth: ListWorkers and ReadLogs need a log ticket (log_ticket.h) for the
// request's job on this node, checked with the key the coordinator sent
// (Agent::LogTicketKey(); until the agent first registers they answer
// UNAVAILABLE); bearer tokens are refused. ListWorkers needs a job id.
// ReportProgress needs the per-run token the agent gave the worker. Refusals are logged (rendezvous/refusals.h), those of
// ReportProgress at most every 10 s.
// Threading: gRPC's callback API; every handler completes at once (the
// core never blocks). Log following is client-side polling of ReadLogs
// with next_offset, so no server thread waits on a growing file.
#ifndef LOCKSTEP_DAEMON_AGENT_SERVICE_H_
#define LOCKSTEP_DAEMON_AGENT_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>

#include "common/logging.h"
#include "daemon/agent.h"
#include "lockstep/v1/agent.grpc.pb.h"

namespace lockstep {
namespace daemon {

class AgentGrpcService final : public v1::AgentService::CallbackService {
 public:
  // `core` must outlive the service and the server.
  explicit AgentGrpcService(Agent* core) : core_(core) {}

  grpc::ServerUnaryReactor* ReportProgress(grpc::CallbackServerContext* ctx,
                                           const v1::ReportProgressRequest* req,
                                           v1::ReportProgressResponse* resp) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* ctx,
                                        const v1::ListWorkersRequest* req,
                                        v1::ListWorkersResponse* resp) override;
  grpc::ServerUnaryReactor* ReadLogs(grpc::CallbackServerContext* ctx,
                                     const v1::ReadLogsRequest* req,
                                     v1::ReadLogsResponse* resp) override;

 private:
  Agent* const core_;
  // Every worker reports about once a second: a refused report (a stale or
  // forged token) is logged at most every 10 s by each service.
  RateLimiter refused_progress_log_{std::chrono::seconds(10)};
};

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_AGENT_SERVICE_H_
