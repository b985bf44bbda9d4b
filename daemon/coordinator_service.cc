#include "daemon/coordinator_service.h"

#include <atomic>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "daemon/grpc_auth.h"
#include "rendezvous/grpc_status.h"

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
  return absl::OkStatus();
}

// Long poll for WatchJob: finished exactly once, by the core's callback or
// by OnCancel (see the header).
class WatchReactor : public grpc::ServerUnaryReactor {
 public:
  WatchReactor(Coordinator* core, const v1::WatchJobRequest* req, v1::WatchJobResponse* resp)
      : core_(core), resp_(resp) {
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
    std::lock_guard<std::mutex> lock(mu_);
    handle_ = *handle;
    if (cancelled_ && handle_ > 0 && core_->Unwatch(handle_)) {
      FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
    }
  }
  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    if (handle_ > 0 && core_->Unwatch(handle_)) {
      FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
    }
  }
  void OnDone() override { delete this; }

 private:
  void FinishOnce(const grpc::Status& s) {
    if (!finished_.exchange(true)) Finish(s);
  }
  Coordinator* const core_;
  v1::WatchJobResponse* const resp_;
  std::atomic<bool> finished_{false};
  std::mutex mu_;
  int64_t handle_ = 0;      // GUARDED_BY(mu_)
  bool cancelled_ = false;  // GUARDED_BY(mu_)
};

}  // namespace

grpc::ServerUnaryReactor* CoordinatorGrpcService::RegisterNode(grpc::CallbackServerContext* ctx,
                                                               const v1::RegisterNodeRequest* req,
                                                               v1::RegisterNodeResponse* resp) {
  Status s = AuthorizeCall(*ctx, token_);
  if (!s.ok()) return Done(ctx, s);
  auto r = core_->RegisterNode(*req);
  if (r.ok()) *resp = *r;
  return Done(ctx, r.status());
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                            const v1::HeartbeatRequest* req,
                                                            v1::HeartbeatResponse* resp) {
  Status s = AuthorizeCall(*ctx, token_);
  if (!s.ok()) return Done(ctx, s);
  auto r = core_->Heartbeat(*req);
  if (r.ok()) *resp = std::move(*r);
  return Done(ctx, r.status());
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::SubmitJob(grpc::CallbackServerContext* ctx,
                                                            const v1::SubmitJobRequest* req,
                                                            v1::SubmitJobResponse* resp) {
  Status s = AuthorizeCall(*ctx, token_);
  if (!s.ok()) return Done(ctx, s);
  auto r = core_->SubmitJob(req->spec(), req->request_id());
  if (r.ok()) *resp->mutable_job() = std::move(*r);
  return Done(ctx, r.status());
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::GetJob(grpc::CallbackServerContext* ctx,
                                                         const v1::GetJobRequest* req,
                                                         v1::GetJobResponse* resp) {
  Status s = AuthorizeCall(*ctx, token_);
  if (s.ok()) s = RequireJobId(req->job_id());
  if (!s.ok()) return Done(ctx, s);
  auto r = core_->GetJob(JobId(req->job_id()));
  if (r.ok()) *resp->mutable_job() = std::move(*r);
  return Done(ctx, r.status());
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::ListJobs(grpc::CallbackServerContext* ctx,
                                                           const v1::ListJobsRequest* req,
                                                           v1::ListJobsResponse* resp) {
  Status s = AuthorizeCall(*ctx, token_);
  if (!s.ok()) return Done(ctx, s);
  std::vector<v1::JobState> states;
  for (int st : req->states()) states.push_back(static_cast<v1::JobState>(st));
  auto jobs = core_->ListJobs(states);
  if (!jobs.ok()) return Done(ctx, jobs.status());
  for (auto& job : *jobs) *resp->add_jobs() = std::move(job);
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::CancelJob(grpc::CallbackServerContext* ctx,
                                                            const v1::CancelJobRequest* req,
                                                            v1::CancelJobResponse* resp) {
  Status s = AuthorizeCall(*ctx, token_);
  if (s.ok()) s = RequireJobId(req->job_id());
  if (!s.ok()) return Done(ctx, s);
  auto r = core_->CancelJob(JobId(req->job_id()));
  if (r.ok()) *resp->mutable_job() = std::move(*r);
  return Done(ctx, r.status());
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::ListNodes(grpc::CallbackServerContext* ctx,
                                                            const v1::ListNodesRequest* req,
                                                            v1::ListNodesResponse* resp) {
  Status s = AuthorizeCall(*ctx, token_);
  if (!s.ok()) return Done(ctx, s);
  for (auto& node : core_->ListNodes()) *resp->add_nodes() = std::move(node);
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::WatchJob(grpc::CallbackServerContext* ctx,
                                                           const v1::WatchJobRequest* req,
                                                           v1::WatchJobResponse* resp) {
  Status s = AuthorizeCall(*ctx, token_);
  if (s.ok()) s = RequireJobId(req->job_id());
  if (!s.ok()) return Done(ctx, s);
  return new WatchReactor(core_, req, resp);
}

}  // namespace daemon
}  // namespace lockstep
