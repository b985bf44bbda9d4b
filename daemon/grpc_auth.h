// Bearer-token check for the daemon's gRPC shells (see token.h).
#ifndef LOCKSTEP_DAEMON_GRPC_AUTH_H_
#define LOCKSTEP_DAEMON_GRPC_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "daemon/token.h"

namespace lockstep {
namespace daemon {

inline Status AuthorizeCall(const grpc::ServerContextBase& ctx, const std::string& token) {
  const auto& md = ctx.client_metadata();
  auto it = md.find(kAuthorizationHeader);
  if (it == md.end()) return CheckBearer("", false, token);
  return CheckBearer(absl::string_view(it->second.data(), it->second.size()), true, token);
}

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_GRPC_AUTH_H_
