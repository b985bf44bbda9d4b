// Bearer-token check for the daemon's gRPC shells (see token.h).
#ifndef LOCKSTEP_DAEMON_GRPC_AUTH_H_
#define LOCKSTEP_DAEMON_GRPC_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <string>

#include "daemon/token.h"

namespace lockstep {
namespace daemon {

// Checks the `authorization` entry of a call's client metadata against the
// admin `token` (Unauthenticated, see CheckBearer).
inline Status CheckAuthorization(const std::multimap<grpc::string_ref, grpc::string_ref>& md,
                                 const std::string& token) {
  auto it = md.find(kAuthorizationHeader);
  if (it == md.end()) return CheckBearer("", false, token);
  return CheckBearer(absl::string_view(it->second.data(), it->second.size()), true, token);
}

inline Status AuthorizeCall(const grpc::ServerContextBase& ctx, const std::string& token) {
  return CheckAuthorization(ctx.client_metadata(), token);
}

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_GRPC_AUTH_H_
