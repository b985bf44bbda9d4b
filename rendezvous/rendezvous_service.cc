#include "rendezvous/rendezvous_service.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "rendezvous/grpc_status.h"
#include "rendezvous/rendezvous_convert.h"

namespace lockstep {
namespace rendezvous {
namespace {

// A JoinRendezvous call parked in the core until its round closes.
class JoinReactor : public grpc::ServerUnaryReactor {
 public:
  JoinReactor(RendezvousCore* core, grpc::CallbackServerContext* ctx,
              const v1::JoinRendezvousRequest& request, v1::JoinRendezvousResponse* response)
      : core_(core) {
    if (request.job_id().empty() || request.node_id().empty()) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "JoinRendezvous needs job_id and node_id"));
      return;
    }
    if (request.timeout_ms() < 0 || request.nproc_per_node() < 0 || request.round() < 0) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("JoinRendezvous of node ", request.node_id(),
                                       ": timeout_ms, nproc_per_node and round must be >= 0")));
      return;
    }
    MonoTime now = core->clock()->Now();
    MonoTime deadline = MonoTime::max();
    if (request.timeout_ms() > 0) deadline = now + std::chrono::milliseconds(request.timeout_ms());
    if (ctx->deadline() != std::chrono::system_clock::time_point::max()) {
      MonoTime by_rpc = now + std::chrono::duration_cast<Duration>(
                                  ctx->deadline() - std::chrono::system_clock::now());
      deadline = std::min(deadline, by_rpc);
    }
    id_ = core_->Join(FromProto(request), deadline,
                      [this, response](StatusOr<RendezvousResult> result) {
                        if (result.ok()) *response->mutable_result() = ToProto(*result);
                        Finish(ToGrpcStatus(result.status()));
                      });
  }

  void OnCancel() override {
    if (id_ != 0 && core_->CancelJoin(id_)) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "rendezvous join cancelled by the client"));
    }
  }
  void OnDone() override { delete this; }

 private:
  RendezvousCore* const core_;
  RendezvousCore::JoinId id_ = 0;  // set in the constructor, before gRPC binds us
};

grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* ctx, const Status& status) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

Status RendezvousGrpcService::Authorize(const grpc::CallbackServerContext& ctx,
                                        absl::string_view job_id) const {
  if (!authorizer_) return absl::OkStatus();
  return authorizer_(ctx.client_metadata(), job_id);
}

grpc::ServerUnaryReactor* RendezvousGrpcService::JoinRendezvous(
    grpc::CallbackServerContext* ctx, const v1::JoinRendezvousRequest* request,
    v1::JoinRendezvousResponse* response) {
  if (Status s = Authorize(*ctx, request->job_id()); !s.ok()) return Refuse(ctx, s);
  return new JoinReactor(core_, ctx, *request, response);
}

grpc::ServerUnaryReactor* RendezvousGrpcService::LeaveRendezvous(
    grpc::CallbackServerContext* ctx, const v1::LeaveRendezvousRequest* request,
    v1::LeaveRendezvousResponse* response) {
  if (Status s = Authorize(*ctx, request->job_id()); !s.ok()) return Refuse(ctx, s);
  auto* reactor = ctx->DefaultReactor();
  if (request->job_id().empty() || request->node_id().empty() || request->round() < 0) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "LeaveRendezvous needs job_id, node_id and a round >= 0"));
    return reactor;
  }
  reactor->Finish(ToGrpcStatus(
      core_->Leave(JobId(request->job_id()), NodeId(request->node_id()), request->round())));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousGrpcService::GetRendezvousState(
    grpc::CallbackServerContext* ctx, const v1::GetRendezvousStateRequest* request,
    v1::GetRendezvousStateResponse* response) {
  if (Status s = Authorize(*ctx, request->job_id()); !s.ok()) return Refuse(ctx, s);
  auto* reactor = ctx->DefaultReactor();
  StatusOr<RendezvousState> state = core_->GetState(JobId(request->job_id()));
  if (state.ok()) *response = ToProto(*state);
  reactor->Finish(ToGrpcStatus(state.status()));
  return reactor;
}

}  // namespace rendezvous
}  // namespace lockstep
