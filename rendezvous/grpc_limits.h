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

#include "rendezvous/tls.h"

namespace lockstep {
namespace rendezvous {

// The largest gRPC message any Lockstep server or client sends or accepts
// (64 MiB): room for a kMaxValueBytes (16 MiB) store value plus framing, or
// several values in one MultiGet/MultiSet. Larger messages fail with
// RESOURCE_EXHAUSTED from gRPC.
inline constexpr int kMaxGrpcMessageBytes = 64 * 1024 * 1024;

// The most one ListJobs answer holds (serialized jobs): a quarter of the
// message limit, so a page of jobs of the largest spec still fits. The rest
// of the table comes in further pages (next_page_token).
inline constexpr size_t kListJobsPageBytes = 16 * 1024 * 1024;

// Channel arguments with kMaxGrpcMessageBytes both ways. Start from these
// when a channel needs more arguments of its own.
inline grpc::ChannelArguments LockstepChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxGrpcMessageBytes);
  args.SetMaxSendMessageSize(kMaxGrpcMessageBytes);
  return args;
}

// A channel to `address` with LockstepChannelArguments() and the process's
// transport security (mutual TLS or plaintext, rendezvous/tls.h): what
// every Lockstep client uses instead of grpc::CreateChannel.
inline std::shared_ptr<grpc::Channel> CreateLockstepChannel(const std::string& address) {
  return grpc::CreateCustomChannel(address, LockstepChannelCredentials(),
                                   LockstepChannelArguments());
}

// Sets kMaxGrpcMessageBytes both ways on a server being built.
// Concurrent streams one client connection may have open on a Lockstep
// server (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; gRPC's default is
// unbounded): more wait on the client's side, not in the server's memory.
inline constexpr int kMaxStreamsPerConnection = 1024;
// gRPC's own memory (transport buffers, call arenas, messages being read)
// on a Lockstep server, as a gRPC ResourceQuota: under pressure gRPC
// shrinks buffers and refuses new streams instead of growing.
inline constexpr size_t kGrpcMemoryBudgetBytes = size_t{1} << 30;

inline void ApplyMessageLimits(grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(kMaxGrpcMessageBytes);
  builder->SetMaxSendMessageSize(kMaxGrpcMessageBytes);
}

}  // namespace rendezvous
}  // namespace lockstep

#endif  // LOCKSTEP_RENDEZVOUS_GRPC_LIMITS_H_
