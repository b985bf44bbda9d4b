// Requests the gRPC shells refuse, logged where they are answered so an
// operator sees them: one warning per refusal naming the RPC, the caller's
// address as gRPC reports it, the job (the logger's job=, "-" when none)
// and the reason:
//   [coordinator] job=- rank=- refused CoordinatorService/SubmitJob from
//   ipv4:127.0.0.1:40412: INVALID_ARGUMENT: spec.command: empty
// A refusal is a status that rejects the request itself: Unauthenticated or
// PermissionDenied (token, role), InvalidArgument (the request) and
// ResourceExhausted (a quota or limit). Other errors answer a valid request
// (NotFound, FailedPrecondition, Unavailable, ...) and are not logged here.
//
// Thread safety: thread-safe.
#ifndef LOCKSTEP_RENDEZVOUS_REFUSALS_H_
#define LOCKSTEP_RENDEZVOUS_REFUSALS_H_

#include <grpcpp/grpcpp.h>

#include "absl/strings/string_view.h"
#include "common/logging.h"
#include "common/status.h"

namespace lockstep {

bool IsRefusal(const Status& status);

// Logs `status` on `log` (Warn) when IsRefusal(status). `rpc`:
// "Service/Method". `job`: the job the request names, put in the line's
// job= when it is a well-formed id (IsSafeId, common/ids.h); anything else
// (empty, a path, control characters) leaves job= as `log` has it (the
// reason quotes it escaped).
void LogIfRefused(const Logger& log, const grpc::ServerContextBase& ctx, absl::string_view rpc,
                  const std::string& job, const Status& status);

}  // namespace lockstep

#endif  // LOCKSTEP_RENDEZVOUS_REFUSALS_H_
