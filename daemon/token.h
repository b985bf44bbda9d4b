// Token files, secrets and job store tokens. Which token may call which
// RPC is roles.h's business (admin, viewer, agent and worker roles).
//
// A coordinator keeps one token file per role in its state dir (token,
// viewer.token, agent.token), each created with mode 0600 at the first
// start; the CLI and agents read a copy of the one they need. RPCs carry a
// token as metadata `authorization: Bearer <t>`.
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
// !create), PermissionDenied (the file is readable by group or others, is
// owned by another uid than this process's or root's, is not a regular file,
// or cannot be read), InvalidArgument (empty file). A symlink is followed and the file
// it leads to is judged; the daemon refuses symlinks for the token files in
// its state dir itself (lockstepd_main.cc).
StatusOr<std::string> LoadToken(const std::string& path, bool create);

// A secret: `prefix` + 32 bytes from OpenSSL's CSPRNG (RAND_bytes) as
// lowercase hex. Aborts the process if the CSPRNG fails (no weak fallback).
std::string NewSecret(absl::string_view prefix);

// Whether two secrets are equal, in time that depends only on their
// lengths (CRYPTO_memcmp), so a wrong guess tells nothing about the secret.
bool SecretsEqual(absl::string_view a, absl::string_view b);

// The store token of job `job_id`: lowercase hex of
// HMAC-SHA256(key = admin_token, message = job_id), 64 characters.
// Deterministic, so anyone holding the admin token (the coordinator, every
// agent) derives the same value, before and after a restart, with nothing
// stored. Agents hand it to workers as LOCKSTEP_STORE_TOKEN; it opens only
// store namespaces "<job_id>/..." (workers never see the admin token).
std::string JobStoreToken(absl::string_view admin_token, absl::string_view job_id);

// Authorizes a store call on namespace `ns` ("<job>/<round>") given its
// `authorization` metadata (`present` false when absent): the admin token
// opens every namespace; JobStoreToken(admin_token, job) opens those whose
// part before the first '/' is `job`. Unauthenticated naming the store when
// no token is sent (or it is not a Bearer token); PermissionDenied naming
// the namespace for any other token.
Status AuthorizeStore(absl::string_view header_value, bool present, const std::string& admin_token,
                      absl::string_view ns);

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_TOKEN_H_
