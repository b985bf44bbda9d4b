#include "rendezvous/rendezvous_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "lockstep/v1/rendezvous.grpc.pb.h"
#include "rendezvous/grpc_status.h"
#include "rendezvous/rendezvous_convert.h"

namespace lockstep {
namespace rendezvous {
namespace {

constexpr Duration kMaxTimeout = std::chrono::hours(24 * 365);

std::chrono::system_clock::time_point DeadlineIn(Duration timeout) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             std::clamp(timeout, Duration::zero(), kMaxTimeout));
}

}  // namespace

struct RendezvousClient::Stub {
  std::unique_ptr<v1::RendezvousService::Stub> stub;
};

StatusOr<std::unique_ptr<RendezvousClient>> RendezvousClient::Connect(const std::string& address,
                                                                      Duration connect_timeout) {
  if (address.empty()) return absl::InvalidArgumentError("rendezvous address is empty");
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(DeadlineIn(connect_timeout))) {
    return absl::UnavailableError(
        absl::StrCat("rendezvous service at ", address, " is not reachable"));
  }
  return std::make_unique<RendezvousClient>(std::move(channel), address);
}

RendezvousClient::RendezvousClient(std::shared_ptr<grpc::Channel> channel, std::string address)
    : channel_(std::move(channel)), address_(std::move(address)), stub_(new Stub) {
  stub_->stub = v1::RendezvousService::NewStub(channel_);
}

RendezvousClient::~RendezvousClient() = default;

StatusOr<RendezvousResult> RendezvousClient::Join(const JoinRequest& request, Duration timeout) {
  timeout = std::clamp(timeout, Duration::zero(), kMaxTimeout);
  v1::JoinRendezvousRequest proto = ToProto(request);
  // At least 1 ms: 0 would mean "the job's join timeout" to the server.
  proto.set_timeout_ms(std::max<int64_t>(
      1, std::chrono::ceil<std::chrono::milliseconds>(timeout).count()));
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(timeout + kRendezvousRpcGrace));
  ctx.set_wait_for_ready(true);
  v1::JoinRendezvousResponse response;
  grpc::Status status = stub_->stub->JoinRendezvous(&ctx, proto, &response);
  RETURN_IF_ERROR(FromGrpcStatus(status, absl::StrCat("rendezvous at ", address_)));
  return FromProto(response.result());
}

Status RendezvousClient::Leave(const JobId& job_id, const NodeId& node_id, int round,
                               Duration timeout) {
  v1::LeaveRendezvousRequest request;
  request.set_job_id(job_id.value());
  request.set_node_id(node_id.value());
  request.set_round(round);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(timeout));
  ctx.set_wait_for_ready(true);
  v1::LeaveRendezvousResponse response;
  return FromGrpcStatus(stub_->stub->LeaveRendezvous(&ctx, request, &response),
                        absl::StrCat("rendezvous at ", address_));
}

StatusOr<RendezvousState> RendezvousClient::GetState(const JobId& job_id, Duration timeout) {
  v1::GetRendezvousStateRequest request;
  request.set_job_id(job_id.value());
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(timeout));
  ctx.set_wait_for_ready(true);
  v1::GetRendezvousStateResponse response;
  RETURN_IF_ERROR(FromGrpcStatus(stub_->stub->GetRendezvousState(&ctx, request, &response),
                                 absl::StrCat("rendezvous at ", address_)));
  RendezvousState state = FromProto(response);
  state.job_id = job_id;
  return state;
}

}  // namespace rendezvous
}  // namespace lockstep
