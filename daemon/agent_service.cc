#include "daemon/agent_service.h"

#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"
#include "daemon/grpc_auth.h"
#include "daemon/log_ticket.h"
#include "rendezvous/grpc_status.h"
#include "rendezvous/refusals.h"

namespace lockstep {
namespace daemon {
namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const Status& s) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

// Done, logging a refusal of "AgentService/<method>" (rendezvous/refusals.h)
// about `job` first.
grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx, absl::string_view method,
                                 const std::string& job, const Status& s) {
  static const Logger log("agent");
  LogIfRefused(log, *ctx, absl::StrCat("AgentService/", method), job, s);
  return Done(ctx, s);
}

// CheckLogTicket for `job` on this node; Unavailable (retryable) before the
// agent has its key.
Status Authorize(const grpc::CallbackServerContext& ctx, const Agent& agent,
                 absl::string_view method, const std::string& job) {
  const std::string key = agent.LogTicketKey();
  if (key.empty()) {
    return absl::UnavailableError(absl::StrCat(
        method, ": this agent has not registered with the coordinator yet, so it cannot "
                "check log tickets; retry"));
  }
  auto [value, present] = AuthorizationHeader(ctx.client_metadata());
  return CheckLogTicket(value, present, key, method, job, agent.node_id(),
                        RealClock()->UnixMillis() / 1000);
}

}  // namespace

grpc::ServerUnaryReactor* AgentGrpcService::ReportProgress(grpc::CallbackServerContext* ctx,
                                                           const v1::ReportProgressRequest* req,
                                                           v1::ReportProgressResponse*) {
  if (req->job_id().empty()) return Done(ctx, absl::InvalidArgumentError("job_id: empty"));
  Status s = core_->ReportProgress(req->job_id(), req->round(), req->token(), req->progress());
  if (IsRefusal(s) && refused_progress_log_.Allow()) {
    return Answer(ctx, "ReportProgress", req->job_id(), s);
  }
  return Done(ctx, s);
}

grpc::ServerUnaryReactor* AgentGrpcService::ListWorkers(grpc::CallbackServerContext* ctx,
                                                        const v1::ListWorkersRequest* req,
                                                        v1::ListWorkersResponse* resp) {
  Status s = req->job_id().empty()
                 ? absl::InvalidArgumentError(
                       "AgentService/ListWorkers: job_id: empty (a log ticket opens one job)")
                 : Authorize(*ctx, *core_, "AgentService/ListWorkers", req->job_id());
  if (!s.ok()) return Answer(ctx, "ListWorkers", req->job_id(), s);
  for (const auto& r : core_->ListWorkers(req->job_id())) {
    v1::AgentJobReportLite* out = resp->add_jobs();
    out->set_job_id(r.job_id());
    out->set_round(r.round());
    *out->mutable_workers() = r.workers();
  }
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* AgentGrpcService::ReadLogs(grpc::CallbackServerContext* ctx,
                                                     const v1::ReadLogsRequest* req,
                                                     v1::ReadLogsResponse* resp) {
  Status s = Authorize(*ctx, *core_, "AgentService/ReadLogs", req->job_id());
  if (!s.ok()) return Answer(ctx, "ReadLogs", req->job_id(), s);
  auto chunk = core_->ReadLogs(req->job_id(), req->rank(),
                               req->stream() == v1::ReadLogsRequest::STREAM_STDERR, req->offset(),
                               req->tail_bytes(), req->max_bytes(), req->generation());
  if (chunk.ok()) {
    resp->set_data(std::move(chunk->data));
    resp->set_next_offset(chunk->next_offset);
    resp->set_worker_done(chunk->worker_done);
    resp->set_path(chunk->path);
    resp->set_generation(chunk->generation);
    resp->set_rotated_past(chunk->rotated_past);
  }
  return Answer(ctx, "ReadLogs", req->job_id(), chunk.status());
}

}  // namespace daemon
}  // namespace lockstep
