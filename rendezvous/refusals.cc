#include "rendezvous/refusals.h"

#include <string>

#include "common/ids.h"

namespace lockstep {

bool IsRefusal(const Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kResourceExhausted:
      return true;
    default:
      return false;
  }
}

void LogIfRefused(const Logger& log, const grpc::ServerContextBase& ctx, absl::string_view rpc,
                  const std::string& job, const Status& status) {
  if (!IsRefusal(status)) return;
  const std::string peer = ctx.peer();
  (IsSafeId(job) ? log.WithJob(job) : log).Warn("refused {} from {}: {}: {}", std::string(rpc), peer.empty() ? "an unknown peer" : peer,
           absl::StatusCodeToString(status.code()), std::string(status.message()));
}

}  // namespace lockstep
