// Token files, secrets and job store tokens. Which token may call which
// RPC is roles.h's business (admin, viewer, agent and worker roles).
//
// A coordinator keeps one token file per role in its state dir (token,
// viewer.token, agent.token), each created with mode 0600 at the first
// start; the CLI and agents read a copy of the one they need. RPCs carry a
// token as metadata `authorization: Bearer <t>`.
//
// A token file holds one token per line. The first is the one a client
// presents; the others are still admitted by a coordinator that reads the
// file (a rotation: the new token first, the old one after it until every
// holder has the new one). lockstepd re-reads its files when they change
// (daemon/README.md, Rotating tokens). The jobs' store tokens are keyed by
// a secret of their own (store.key), so rotating the admin token leaves
// running jobs alone.
#ifndef LOCKSTEP_DAEMON_TOKEN_H_
#define LOCKSTEP_DAEMON_TOKEN_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/status.h"

namespace lockstep {
namespace daemon {

inline constexpr char kAuthorizationHeader[] = "authorization";
// Largest token file read (a few dozen tokens of 64 characters).
inline constexpr size_t kMaxTokenFileBytes = 4096;
// Shortest token a token file may hold: 24 characters (16 random bytes in
// base64; lockstepd makes 64 hex digits, 32 bytes). A guessable token is a
// key to the cluster for whoever tries it over the network.
inline constexpr size_t kMinTokenChars = 24;

// Reads the token at `path`, creating it (mode 0600, 32 random bytes as
// hex) when `create` and it does not exist. Errors: NotFound (missing and
// !create), PermissionDenied (the file is readable by group or others, is
// owned by another uid than this process's or root's, is not a regular file,
// or cannot be read), InvalidArgument (empty file, or a token shorter than
// kMinTokenChars, naming its line and length, never its text). A symlink is followed and the file
// it leads to is judged; the daemon refuses symlinks for the token files in
// its state dir itself (lockstepd_main.cc).
StatusOr<std::string> LoadToken(const std::string& path, bool create);
// Every token of the file (see above), the first one first; the same
// errors as LoadToken.
StatusOr<std::vector<std::string>> LoadTokens(const std::string& path, bool create);

// A secret: `prefix` + 32 bytes from OpenSSL's CSPRNG (RAND_bytes) as
// lowercase hex. Aborts the process if the CSPRNG fails (no weak fallback).
std::string NewSecret(absl::string_view prefix);

// Whether two secrets are equal, in time that depends only on their
// lengths (CRYPTO_memcmp), so a wrong guess tells nothing about the secret.
bool SecretsEqual(absl::string_view a, absl::string_view b);

// Lowercase hex of HMAC-SHA256(key, message), 64 characters.
std::string HmacSha256Hex(absl::string_view key, absl::string_view message);

// The store token of job `job_id`: lowercase hex of
// HMAC-SHA256(key = store_key, message = job_id), 64 characters, where
// store_key is the coordinator's store.key (a secret no client holds).
// Deterministic, so the coordinator derives the same value before and
// after a restart, with nothing stored per job. Agents hand it to workers
// as LOCKSTEP_STORE_TOKEN; it opens only store namespaces "<job_id>/...".
std::string JobStoreToken(absl::string_view store_key, absl::string_view job_id);

// Authorizes a store call on namespace `ns` ("<job>/<round>") given its
// `authorization` metadata (`present` false when absent):
// JobStoreToken(store_key, job) opens the namespaces whose part before the
// first '/' is `job` (the admin token, checked by role, opens every one:
// AuthorizeStoreCall). Unauthenticated naming the store when no token is
// sent (or it is not a Bearer token); PermissionDenied naming the
// namespace for any other token.
Status AuthorizeStore(absl::string_view header_value, bool present, const std::string& store_key,
                      absl::string_view ns);

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_TOKEN_H_
