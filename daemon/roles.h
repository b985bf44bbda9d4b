// Roles: who may call which Lockstep RPC. Deny by default.
//
// A role is what a bearer token lets its holder do. Each role has separate
// credentials:
//   admin   the coordinator's `token`: everything (submit, cancel, delete,
//           read); may also register and heartbeat as an agent, so a
//           single-host daemon and older agent setups keep working.
//   viewer  the coordinator's `viewer.token`: read only (GetJob, ListJobs,
//           ListNodes, WatchJob, and IssueLogTickets for reading logs).
//   agent   the coordinator's `agent.token`: RegisterNode and Heartbeat.
//   worker  not a bearer token of the cluster: a job's store token (opens
//           only "<job>/..." store namespaces, see AuthorizeStore) and the
//           per-run progress token an agent checks in ReportProgress. Any
//           other RPC refuses them (they match no role: Unauthenticated).
//   log ticket  not a bearer token either: what an agent serves ReadLogs and
//           ListWorkers to (log_ticket.h). An admin or viewer gets tickets
//           from the coordinator (IssueLogTickets); agents refuse every
//           bearer token, so no cluster token is ever sent to one.
//
// The role table (MethodRoles) lists every RPC of CoordinatorService,
// AgentService and StoreService as "Service/Method"; a method missing from
// it is refused whatever the token (PermissionDenied). A known token whose
// role is not listed for the method gets PermissionDenied naming both roles
// ("a viewer token cannot CancelJob (needs admin)"); no token or an unknown
// one gets Unauthenticated.
//
// Tokens are compared by SHA-256 digest in constant time (SecretsEqual);
// only the coordinator holds them (agents check log tickets instead). A role may admit
// several tokens at once: its current one and those still listed after it
// in its token file during a rotation (token.h). Plain C++, no gRPC.
#ifndef LOCKSTEP_DAEMON_ROLES_H_
#define LOCKSTEP_DAEMON_ROLES_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/mutex.h"
#include "common/status.h"

namespace lockstep {
namespace daemon {

enum class Role { kAdmin, kViewer, kAgent, kWorker, kLogTicket };

inline constexpr Role kAllRoles[] = {Role::kAdmin, Role::kViewer, Role::kAgent, Role::kWorker,
                                     Role::kLogTicket};

// "admin", "viewer", "agent", "worker", "log ticket".
absl::string_view RoleName(Role role);

// The roles allowed `method` ("CoordinatorService/CancelJob"), or nullopt
// when the table does not list it (then nobody may call it).
std::optional<std::vector<Role>> MethodRoles(absl::string_view method);

// Every "Service/Method" the table lists (for tests and docs).
std::vector<std::string> TableMethods();

// SHA-256 of `token` as 64 lowercase hex digits.
std::string TokenSha256(absl::string_view token);

// The digests of the bearer-token roles (admin, viewer, agent) a daemon
// admits. Thread safe: an agent's loop thread, or a coordinator re-reading
// its token files, updates it while the gRPC threads read it.
class RoleTokens {
 public:
  // Sets the digests (TokenSha256) the role admits, its current one first;
  // empty entries are dropped, none: no token has the role.
  // REQUIRES: role is admin, viewer or agent (worker tokens are per job,
  // log tickets per job and node, see above).
  void SetDigests(Role role, std::vector<std::string> sha256_hex);
  void SetDigest(Role role, std::string sha256_hex) { SetDigests(role, {std::move(sha256_hex)}); }
  // The same from the tokens themselves.
  void SetTokens(Role role, const std::vector<std::string>& tokens);
  void SetToken(Role role, absl::string_view token) { SetTokens(role, {std::string(token)}); }
  // The role's current digest (the first), empty when unset.
  std::string Digest(Role role) const;
  // Every digest the role admits, the current one first.
  std::vector<std::string> Digests(Role role) const;
  // The role whose token `token` is; nullopt when none (or `token` is
  // empty). Compares against every digest of every role, each in constant
  // time.
  std::optional<Role> RoleOf(absl::string_view token) const;

 private:
  mutable Mutex mu_;
  std::vector<std::string> digests_[3] ABSL_GUARDED_BY(mu_);  // admin, viewer, agent
};

// Authorizes a call of `method` ("Service/Method") carrying the
// `authorization` metadata `header_value` (`present` false when absent).
// Unauthenticated: no metadata, not "Bearer <t>", or a token of no role
// (naming the method). PermissionDenied: the method is not in the table, or
// the token's role may not call it ("a viewer token cannot CancelJob (needs
// admin)").
Status AuthorizeRpc(const RoleTokens& roles, absl::string_view method,
                    absl::string_view header_value, bool present);

// Authorizes a store call on namespace `ns`: an admin token opens every
// namespace; otherwise AuthorizeStore with `store_key` (the job's store
// token), except that a viewer or agent token gets PermissionDenied naming
// its role rather than the namespace. With `job_open`, a job's store token
// is also refused (with its error) unless job_open(job) is OK, the job being
// the namespace up to its first '/': the coordinator's CheckStoreOpen, so a
// token outliving its job opens nothing.
Status AuthorizeStoreCall(const RoleTokens& roles, const std::string& store_key,
                          absl::string_view header_value, bool present, absl::string_view ns,
                          const std::function<Status(const std::string& job)>& job_open = nullptr);

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_ROLES_H_
