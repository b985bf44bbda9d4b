// The one gRPC message-size limit of the project, for every server it runs
// (lockstepd's coordinator/agent/store services, StoreServer) and every
// channel it opens (agent -> coordinator, CLI -> coordinator and agents,
// store clients, the workers' progress reporter).
//
// Why one number: a limit lower on one side than the other turns a message
// the server accepted into RESOURCE_EXHAUSTED on every later read of it
// (a large job spec rode in every heartbeat and wedged the node). Inputs
// that end up inside messages are bounded well below it: a job spec by
// daemon::kMaxJobSpecBytes, a store value by kMaxValueBytes.
#ifndef LOCKSTEP_RENDEZVOUS_GRPC_LIMITS_H_
#define LOCKSTEP_RENDEZVOUS_GRPC_LIMITS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace lockstep {
namespace rendezvous {

// The largest gRPC message any Lockstep server or client sends or accepts
// (64 MiB): room for a kMaxValueBytes (16 MiB) store value plus framing, or
// several values in one MultiGet/MultiSet. Larger messages fail with
// RESOURCE_EXHAUSTED from gRPC.
inline constexpr int kMaxGrpcMessageBytes = 64 * 1024 * 1024;

// Channel arguments with kMaxGrpcMessageBytes both ways. Start from these
// when a channel needs more arguments of its own.
inline grpc::ChannelArguments LockstepChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxGrpcMessageBytes);
  args.SetMaxSendMessageSize(kMaxGrpcMessageBytes);
  return args;
}

// An insecure channel to `address` with LockstepChannelArguments(): what
// every Lockstep client uses instead of grpc::CreateChannel.
inline std::shared_ptr<grpc::Channel> CreateLockstepChannel(const std::string& address) {
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   LockstepChannelArguments());
}

// Sets kMaxGrpcMessageBytes both ways on a server being built.
inline void ApplyMessageLimits(grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(kMaxGrpcMessageBytes);
  builder->SetMaxSendMessageSize(kMaxGrpcMessageBytes);
}

}  // namespace rendezvous
}  // namespace lockstep

#endif  // LOCKSTEP_RENDEZVOUS_GRPC_LIMITS_H_
