// The one place absl::Status and grpc::Status are converted, both ways. gRPC
// shells (store, rendezvous, coordinator) map every status through here.
//
// Codes map one to one (both are the canonical google.rpc.Code set); the
// message is kept. Thread safety: pure functions.
#ifndef LOCKSTEP_RENDEZVOUS_GRPC_STATUS_H_
#define LOCKSTEP_RENDEZVOUS_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <cstdint>
#include <string>

#include "common/status.h"

namespace lockstep {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// For statuses carried inside messages as (google.rpc.Code, message), e.g.
// lockstep.v1.StoreOpResult. An out-of-range code becomes kUnknown.
absl::Status StatusFromCode(int32_t code, const std::string& message);

// Returns `status` with `context` prepended to its message when it is not OK
// (like Annotate), for wrapping transport errors: "store at host:1234: ...".
absl::Status FromGrpcStatus(const grpc::Status& status, const std::string& context);

}  // namespace lockstep

#endif  // LOCKSTEP_RENDEZVOUS_GRPC_STATUS_H_
