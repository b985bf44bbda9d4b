#include "daemon/coordinator_service.h"

#include <grpcpp/alarm.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "daemon/grpc_auth.h"
#include "daemon/job_spec.h"
#include "daemon/log_ticket.h"
#include "daemon/token.h"
#include "rendezvous/grpc_limits.h"
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

Status RequireJobId(const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError("job_id: empty");
  if (!IsSafeId(id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("job_id: ", QuoteForError(id), " is not a job id ([A-Za-z0-9._-]{1,128})"));
  }
  return absl::OkStatus();
}

// Long poll for WatchJob: finished exactly once (FinishOnce), by the core's
// callback, by the timeout alarm, or by OnCancel (see the header). The
// reactor is deleted when both OnDone and the alarm's callback have run
// (refs_): the alarm may fire, or report its cancel, after the call ended.
class WatchReactor : public grpc::ServerUnaryReactor {
 public:
  WatchReactor(Coordinator* core, const v1::WatchJobRequest* req, v1::WatchJobResponse* resp,
               std::chrono::milliseconds timeout)
      : core_(core), resp_(resp), job_id_(req->job_id()), after_version_(req->after_version()) {
    auto handle = core_->WatchOnce(JobId(req->job_id()), req->after_version(),
                                   [this](const v1::Job& job, int64_t version) {
                                     *resp_->mutable_job() = job;
                                     resp_->set_version(version);
                                     FinishOnce(grpc::Status::OK);
                                   });
    if (!handle.ok()) {
      FinishOnce(ToGrpcStatus(handle.status()));
      return;
    }
    MutexLock lock(&mu_);
    handle_ = *handle;
    if (cancelled_ && handle_ > 0 && core_->Unwatch(handle_)) {
      FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
      return;
    }
    if (handle_ == 0 || finished_.load()) return;  // answered already
    refs_.fetch_add(1);
    alarm_.Set(std::chrono::system_clock::now() + timeout, [this, timeout](bool fired) {
      if (fired) TimeOut(timeout);
      Unref();
    });
    alarm_set_.store(true);
  }
  void OnCancel() override {
    MutexLock lock(&mu_);
    cancelled_ = true;
    if (handle_ > 0 && core_->Unwatch(handle_)) {
      FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
    }
  }
  void OnDone() override { Unref(); }

 private:
  void TimeOut(std::chrono::milliseconds timeout) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    if (handle_ > 0 && core_->Unwatch(handle_)) {
      FinishOnce(grpc::Status(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          absl::StrCat("job ", QuoteForError(job_id_), " did not change past version ",
                       after_version_, " within timeout_ms=", timeout.count())));
    }
  }
  // Finishes the call once; then cancels a pending alarm so the reactor does
  // not outlive its call by the whole timeout. The extra reference keeps
  // `this` alive when OnDone runs on another thread right after Finish.
  void FinishOnce(const grpc::Status& s) {
    if (finished_.exchange(true)) return;
    refs_.fetch_add(1);
    Finish(s);
    // A cancelled alarm's callback only drops its reference (never takes
    // mu_), so this is safe with or without mu_ held. An alarm set just
    // after this check fires later and finds the watch gone: harmless.
    if (alarm_set_.load()) alarm_.Cancel();
    Unref();
  }
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }
  Coordinator* const core_;
  v1::WatchJobResponse* const resp_;
  const std::string job_id_;
  const int64_t after_version_;
  std::atomic<bool> finished_{false};
  std::atomic<int> refs_{1};  // OnDone, plus the alarm's callback once set
  grpc::Alarm alarm_;
  Mutex mu_;
  int64_t handle_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> alarm_set_{false};
};

}  // namespace

grpc::ServerUnaryReactor* CoordinatorGrpcService::Answer(grpc::CallbackServerContext* ctx,
                                                         absl::string_view method,
                                                         const std::string& job,
                                                         const Status& s) const {
  LogIfRefused(log_, *ctx, absl::StrCat("CoordinatorService/", method), job, s);
  return Done(ctx, s);
}

Status CoordinatorGrpcService::Authorize(const grpc::CallbackServerContext& ctx,
                                         absl::string_view method) const {
  return AuthorizeCall(ctx, *roles_, absl::StrCat("CoordinatorService/", method));
}

StatusOr<std::chrono::milliseconds> WatchTimeout(int64_t timeout_ms) {
  if (timeout_ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout_ms: must be >= 0 (0 = the default ", kDefaultWatchTimeout.count(),
                     "), got ", timeout_ms));
  }
  if (timeout_ms == 0) return kDefaultWatchTimeout;
  return std::min(std::chrono::milliseconds(timeout_ms), kMaxWatchTimeout);
}

Status NodeIdNamedBy(const std::string& node_id, const std::vector<std::string>& san,
                     const std::vector<std::string>& cn) {
  const std::vector<std::string>& names = san.empty() ? cn : san;
  if (std::find(names.begin(), names.end(), node_id) != names.end()) return absl::OkStatus();
  std::vector<std::string> quoted;
  for (const std::string& n : names) quoted.push_back(QuoteForError(n));
  return absl::PermissionDeniedError(absl::StrCat(
      "node id ", QuoteForError(node_id), " is not a name in the caller's certificate (",
      names.empty() ? std::string("it has none")
                    : absl::StrCat(san.empty() ? "CN " : "subjectAltName ",
                                   absl::StrJoin(quoted, ", ")),
      "): with --tls-bind-node-ids a node registers under a name its certificate holds "
      "(lockstepd --node-id; lockstep certs --hosts)"));
}

Status CoordinatorGrpcService::CheckNodeIdBound(const grpc::CallbackServerContext& ctx,
                                                const std::string& node_id) const {
  if (!bind_node_ids_) return absl::OkStatus();
  std::vector<std::string> san, cn;
  if (const auto auth = ctx.auth_context(); auth != nullptr) {
    for (const grpc::string_ref& v : auth->FindPropertyValues("x509_subject_alternative_name")) {
      san.emplace_back(v.data(), v.size());
    }
    for (const grpc::string_ref& v : auth->FindPropertyValues("x509_common_name")) {
      cn.emplace_back(v.data(), v.size());
    }
  }
  return NodeIdNamedBy(node_id, san, cn);
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::RegisterNode(grpc::CallbackServerContext* ctx,
                                                               const v1::RegisterNodeRequest* req,
                                                               v1::RegisterNodeResponse* resp) {
  Status s = Authorize(*ctx, "RegisterNode");
  if (s.ok()) s = CheckNodeIdBound(*ctx, req->node_id());
  if (!s.ok()) return Answer(ctx, "RegisterNode", "", s);
  auto r = core_->RegisterNode(*req);
  if (r.ok()) {
    *resp = *r;
    resp->set_log_ticket_key(NodeLogKey(store_key_, req->node_id()));
  }
  return Answer(ctx, "RegisterNode", "", r.status());
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                            const v1::HeartbeatRequest* req,
                                                            v1::HeartbeatResponse* resp) {
  Status s = Authorize(*ctx, "Heartbeat");
  if (s.ok()) s = CheckNodeIdBound(*ctx, req->node_id());
  if (!s.ok()) return Answer(ctx, "Heartbeat", "", s);
  auto r = core_->Heartbeat(*req);
  if (r.ok()) {
    *resp = std::move(*r);
    resp->set_log_ticket_key(NodeLogKey(store_key_, req->node_id()));
    for (v1::AgentCommand& cmd : *resp->mutable_commands()) {
      if (cmd.kind() == v1::AgentCommand::KIND_START) {
        cmd.set_store_token(JobStoreToken(store_key_, cmd.job_id()));
      }
    }
  }
  return Answer(ctx, "Heartbeat", "", r.status());
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::SubmitJob(grpc::CallbackServerContext* ctx,
                                                            const v1::SubmitJobRequest* req,
                                                            v1::SubmitJobResponse* resp) {
  // A refused submit has no job id: its line names the submission instead.
  std::string what = "SubmitJob";
  if (!req->spec().name().empty()) absl::StrAppend(&what, " of job name ", QuoteForError(req->spec().name()));
  if (!req->request_id().empty()) absl::StrAppend(&what, " (request ", QuoteForError(req->request_id()), ")");
  Status s = Authorize(*ctx, "SubmitJob");
  if (!s.ok()) return Answer(ctx, what, "", s);
  auto r = core_->SubmitJob(req->spec(), req->request_id());
  if (r.ok()) *resp->mutable_job() = std::move(*r);
  return Answer(ctx, what, r.ok() ? r->job_id() : "", r.status());
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::GetJob(grpc::CallbackServerContext* ctx,
                                                         const v1::GetJobRequest* req,
                                                         v1::GetJobResponse* resp) {
  Status s = Authorize(*ctx, "GetJob");
  if (s.ok()) s = RequireJobId(req->job_id());
  if (!s.ok()) return Answer(ctx, "GetJob", req->job_id(), s);
  auto r = core_->GetJob(JobId(req->job_id()));
  if (r.ok()) *resp->mutable_job() = std::move(*r);
  return Answer(ctx, "GetJob", req->job_id(), r.status());
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::ListJobs(grpc::CallbackServerContext* ctx,
                                                           const v1::ListJobsRequest* req,
                                                           v1::ListJobsResponse* resp) {
  Status s = Authorize(*ctx, "ListJobs");
  if (!s.ok()) return Answer(ctx, "ListJobs", "", s);
  if (req->page_size() < 0) {
    return Answer(ctx, "ListJobs", "",
                  absl::InvalidArgumentError(absl::StrCat(
                      "page_size must be 0 (no count limit) or more, got ", req->page_size())));
  }
  // A page continues after the job named by the token: "<submitted ms>:<job id>".
  std::pair<int64_t, std::string> after;
  const bool continues = !req->page_token().empty();
  if (continues) {
    const std::string& token = req->page_token();
    const size_t colon = token.find(':');
    if (colon == std::string::npos || colon + 1 == token.size() ||
        !absl::SimpleAtoi(absl::string_view(token).substr(0, colon), &after.first)) {
      return Answer(ctx, "ListJobs", "",
                    absl::InvalidArgumentError(absl::StrCat(
                        "page_token ", QuoteForError(token),
                        " is not one a ListJobs answer gave (its next_page_token)")));
    }
    after.second = token.substr(colon + 1);
  }
  std::vector<v1::JobState> states;
  for (int st : req->states()) states.push_back(static_cast<v1::JobState>(st));
  auto jobs = core_->ListJobs(states);
  if (!jobs.ok()) return Answer(ctx, "ListJobs", "", jobs.status());
  // Submit time, then job id: the order the job table is read back in after
  // a restart, and the one the tokens name a place in, so a page continues
  // exactly after its token's job even when that job is gone (deleted).
  auto key = [](const v1::Job& job) {
    return std::make_pair(job.submitted_unix_ms(), job.job_id());
  };
  std::sort(jobs->begin(), jobs->end(),
            [&](const v1::Job& a, const v1::Job& b) { return key(a) < key(b); });
  size_t first = 0;
  if (continues) {
    first = static_cast<size_t>(
        std::upper_bound(jobs->begin(), jobs->end(), after,
                         [&](const std::pair<int64_t, std::string>& k, const v1::Job& job) {
                           return k < key(job);
                         }) -
        jobs->begin());
  }
  size_t bytes = 0;
  for (size_t i = first; i < jobs->size(); ++i) {
    v1::Job& job = (*jobs)[i];
    const size_t size = job.ByteSizeLong();
    const bool full = (req->page_size() > 0 && resp->jobs_size() >= req->page_size()) ||
                      (resp->jobs_size() > 0 && bytes + size > rendezvous::kListJobsPageBytes);
    if (full) {
      const v1::Job& last = resp->jobs(resp->jobs_size() - 1);
      resp->set_next_page_token(absl::StrCat(last.submitted_unix_ms(), ":", last.job_id()));
      break;
    }
    bytes += size;
    *resp->add_jobs() = std::move(job);
  }
  return Answer(ctx, "ListJobs", "", absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::CancelJob(grpc::CallbackServerContext* ctx,
                                                            const v1::CancelJobRequest* req,
                                                            v1::CancelJobResponse* resp) {
  Status s = Authorize(*ctx, "CancelJob");
  if (s.ok()) s = RequireJobId(req->job_id());
  if (!s.ok()) return Answer(ctx, "CancelJob", req->job_id(), s);
  auto r = core_->CancelJob(JobId(req->job_id()));
  if (r.ok()) *resp->mutable_job() = std::move(*r);
  return Answer(ctx, "CancelJob", req->job_id(), r.status());
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::DeleteJob(grpc::CallbackServerContext* ctx,
                                                            const v1::DeleteJobRequest* req,
                                                            v1::DeleteJobResponse* resp) {
  Status s = Authorize(*ctx, "DeleteJob");
  if (s.ok()) s = RequireJobId(req->job_id());
  if (!s.ok()) return Answer(ctx, "DeleteJob", req->job_id(), s);
  auto r = core_->DeleteJob(JobId(req->job_id()));
  if (r.ok()) *resp->mutable_job() = std::move(*r);
  return Answer(ctx, "DeleteJob", req->job_id(), r.status());
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::ListNodes(grpc::CallbackServerContext* ctx,
                                                            const v1::ListNodesRequest* req,
                                                            v1::ListNodesResponse* resp) {
  Status s = Authorize(*ctx, "ListNodes");
  if (!s.ok()) return Answer(ctx, "ListNodes", "", s);
  for (auto& node : core_->ListNodes()) *resp->add_nodes() = std::move(node);
  return Answer(ctx, "ListNodes", "", absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::WatchJob(grpc::CallbackServerContext* ctx,
                                                           const v1::WatchJobRequest* req,
                                                           v1::WatchJobResponse* resp) {
  Status s = Authorize(*ctx, "WatchJob");
  if (s.ok()) s = RequireJobId(req->job_id());
  if (!s.ok()) return Answer(ctx, "WatchJob", req->job_id(), s);
  auto timeout = WatchTimeout(req->timeout_ms());
  if (!timeout.ok()) return Answer(ctx, "WatchJob", req->job_id(), timeout.status());
  return new WatchReactor(core_, req, resp, *timeout);
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::IssueLogTickets(
    grpc::CallbackServerContext* ctx, const v1::IssueLogTicketsRequest* req,
    v1::IssueLogTicketsResponse* resp) {
  Status s = Authorize(*ctx, "IssueLogTickets");
  if (s.ok()) s = RequireJobId(req->job_id());
  if (s.ok() && req->node_ids_size() > kMaxLogTicketNodes) {
    s = absl::InvalidArgumentError(absl::StrCat("node_ids: ", req->node_ids_size(),
                                                " node ids, at most ", kMaxLogTicketNodes));
  }
  for (const std::string& node : req->node_ids()) {
    if (!s.ok()) break;
    if (!IsSafeId(node)) {
      s = absl::InvalidArgumentError(absl::StrCat("node_ids: ", QuoteForError(node),
                                                  " is not a node id ([A-Za-z0-9._-]{1,128})"));
    }
  }
  if (!s.ok()) return Answer(ctx, "IssueLogTickets", req->job_id(), s);
  // Only a job that exists gets tickets (one that left memory included).
  auto job = core_->GetJob(JobId(req->job_id()));
  if (!job.ok()) return Answer(ctx, "IssueLogTickets", req->job_id(), job.status());
  std::vector<std::string> nodes(req->node_ids().begin(), req->node_ids().end());
  if (nodes.empty()) {
    for (const v1::WorkerStatus& w : job->workers()) {
      if (std::find(nodes.begin(), nodes.end(), w.node_id()) == nodes.end()) {
        nodes.push_back(w.node_id());
      }
    }
  }
  std::map<std::string, std::string> addresses;
  for (const v1::NodeInfo& n : core_->ListNodes()) addresses[n.node_id()] = n.agent_address();
  const int64_t expires = RealClock()->UnixMillis() / 1000 + kLogTicketLife.count();
  for (const std::string& node : nodes) {
    v1::LogTicket* t = resp->add_tickets();
    t->set_node_id(node);
    auto it = addresses.find(node);
    if (it != addresses.end()) t->set_agent_address(it->second);
    t->set_ticket(MakeLogTicket(NodeLogKey(store_key_, node), req->job_id(), node, expires));
    t->set_expires_unix_s(expires);
  }
  return Answer(ctx, "IssueLogTickets", req->job_id(), absl::OkStatus());
}

}  // namespace daemon
}  // namespace lockstep
