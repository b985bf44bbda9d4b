// Role check for the daemon's gRPC shells (see roles.h): reads the call's
// `authorization` metadata and authorizes it against the role table.
#ifndef LOCKSTEP_DAEMON_GRPC_AUTH_H_
#define LOCKSTEP_DAEMON_GRPC_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <string>

#include "absl/strings/string_view.h"
#include "daemon/roles.h"
#include "daemon/token.h"

namespace lockstep {
namespace daemon {

// The `authorization` metadata of a call: (value, present).
inline std::pair<absl::string_view, bool> AuthorizationHeader(
    const std::multimap<grpc::string_ref, grpc::string_ref>& md) {
  auto it = md.find(kAuthorizationHeader);
  if (it == md.end()) return {absl::string_view(), false};
  return {absl::string_view(it->second.data(), it->second.size()), true};
}

// AuthorizeRpc for a call of `method` ("Service/Method"; Unauthenticated or
// PermissionDenied, see roles.h).
inline Status AuthorizeCall(const grpc::ServerContextBase& ctx, const RoleTokens& roles,
                            absl::string_view method) {
  auto [value, present] = AuthorizationHeader(ctx.client_metadata());
  return AuthorizeRpc(roles, method, value, present);
}

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_GRPC_AUTH_H_
