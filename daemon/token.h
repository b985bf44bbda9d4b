// The bearer token that guards every Lockstep RPC but health checks,
// reflection and workers' progress reports (those carry a per-run token).
//
// The token lives in a file, by default <state-dir>/token, created with
// mode 0600 at the first start; the CLI and other daemons read the same
// file (or a copy). RPCs carry it as metadata `authorization: Bearer <t>`.
#ifndef LOCKSTEP_DAEMON_TOKEN_H_
#define LOCKSTEP_DAEMON_TOKEN_H_

#include <string>

#include "absl/strings/string_view.h"
#include "common/status.h"

namespace lockstep {
namespace daemon {

inline constexpr char kAuthorizationHeader[] = "authorization";

// Reads the token at `path`, creating it (mode 0600, 32 random bytes as
// hex) when `create` and it does not exist. Errors: NotFound (missing and
// !create), PermissionDenied (the file is readable by group or others, or
// cannot be read), InvalidArgument (empty file).
StatusOr<std::string> LoadToken(const std::string& path, bool create);

// Checks an `authorization` metadata value against `token` in constant
// time. Unauthenticated (naming what is wrong) unless it is "Bearer <token>".
Status CheckBearer(absl::string_view header_value, bool present, const std::string& token);

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_TOKEN_H_
