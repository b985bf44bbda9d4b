#include "daemon/roles.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include <openssl/sha.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/token.h"

namespace lockstep {
namespace daemon {
namespace {

constexpr Role kA = Role::kAdmin;
constexpr Role kV = Role::kViewer;
constexpr Role kG = Role::kAgent;
constexpr Role kW = Role::kWorker;
constexpr Role kT = Role::kLogTicket;

struct Entry {
  const char* method;
  std::vector<Role> roles;
};

// The role table. Worker entries are checked by their own credentials:
// StoreService by AuthorizeStore (the job's store token, its namespaces
// only), ReportProgress by the agent core (the run's progress token).
const std::vector<Entry>& Table() {
  static const auto* table = new std::vector<Entry>{
      {"CoordinatorService/RegisterNode", {kA, kG}},
      {"CoordinatorService/Heartbeat", {kA, kG}},
      {"CoordinatorService/SubmitJob", {kA}},
      {"CoordinatorService/CancelJob", {kA}},
      {"CoordinatorService/DeleteJob", {kA}},
      {"CoordinatorService/GetJob", {kA, kV}},
      {"CoordinatorService/ListJobs", {kA, kV}},
      {"CoordinatorService/ListNodes", {kA, kV}},
      {"CoordinatorService/WatchJob", {kA, kV}},
      {"CoordinatorService/IssueLogTickets", {kA, kV}},
      {"AgentService/ListWorkers", {kT}},
      {"AgentService/ReadLogs", {kT}},
      {"AgentService/ReportProgress", {kW}},
      {"StoreService/Set", {kA, kW}},
      {"StoreService/Get", {kA, kW}},
      {"StoreService/Add", {kA, kW}},
      {"StoreService/CompareSet", {kA, kW}},
      {"StoreService/Delete", {kA, kW}},
      {"StoreService/Wait", {kA, kW}},
      {"StoreService/NumKeys", {kA, kW}},
      {"StoreService/MultiGet", {kA, kW}},
      {"StoreService/MultiSet", {kA, kW}},
      {"StoreService/Session", {kA, kW}},
  };
  return *table;
}

int Slot(Role role) {
  switch (role) {
    case Role::kAdmin:
      return 0;
    case Role::kViewer:
      return 1;
    case Role::kAgent:
      return 2;
    case Role::kWorker:
    case Role::kLogTicket:
      break;
  }
  std::abort();  // programmer error: worker tokens and log tickets are not role tokens
}

// "a viewer", "an admin".
std::string WithArticle(Role role) {
  return absl::StrCat(role == Role::kAdmin || role == Role::kAgent ? "an " : "a ",
                      RoleName(role));
}

std::string RoleList(const std::vector<Role>& roles) {
  return absl::StrJoin(roles, " or ", [](std::string* out, Role r) {
    absl::StrAppend(out, RoleName(r));
  });
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kAdmin:
      return "admin";
    case Role::kViewer:
      return "viewer";
    case Role::kAgent:
      return "agent";
    case Role::kWorker:
      return "worker";
    case Role::kLogTicket:
      return "log ticket";
  }
  return "unknown";
}

std::optional<std::vector<Role>> MethodRoles(absl::string_view method) {
  for (const Entry& e : Table()) {
    if (method == e.method) return e.roles;
  }
  return std::nullopt;
}

std::vector<std::string> TableMethods() {
  std::vector<std::string> out;
  for (const Entry& e : Table()) out.push_back(e.method);
  return out;
}

std::string TokenSha256(absl::string_view token) {
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), md);
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * SHA256_DIGEST_LENGTH);
  for (unsigned char b : md) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

void RoleTokens::SetDigests(Role role, std::vector<std::string> sha256_hex) {
  sha256_hex.erase(std::remove(sha256_hex.begin(), sha256_hex.end(), std::string()),
                   sha256_hex.end());
  MutexLock lock(&mu_);
  digests_[Slot(role)] = std::move(sha256_hex);
}

void RoleTokens::SetTokens(Role role, const std::vector<std::string>& tokens) {
  std::vector<std::string> digests;
  for (const std::string& t : tokens) {
    if (!t.empty()) digests.push_back(TokenSha256(t));
  }
  SetDigests(role, std::move(digests));
}

std::string RoleTokens::Digest(Role role) const {
  MutexLock lock(&mu_);
  const auto& d = digests_[Slot(role)];
  return d.empty() ? std::string() : d.front();
}

std::vector<std::string> RoleTokens::Digests(Role role) const {
  MutexLock lock(&mu_);
  return digests_[Slot(role)];
}

std::optional<Role> RoleTokens::RoleOf(absl::string_view token) const {
  if (token.empty()) return std::nullopt;
  const std::string digest = TokenSha256(token);
  std::optional<Role> found;
  MutexLock lock(&mu_);
  for (Role role : {Role::kAdmin, Role::kViewer, Role::kAgent}) {
    // Every digest is compared, so the time does not tell which one matched.
    for (const std::string& want : digests_[Slot(role)]) {
      if (SecretsEqual(digest, want) && !found) found = role;
    }
  }
  return found;
}

Status AuthorizeRpc(const RoleTokens& roles, absl::string_view method,
                    absl::string_view header_value, bool present) {
  constexpr absl::string_view kPrefix = "Bearer ";
  if (!present) {
    return absl::UnauthenticatedError(absl::StrCat(
        method, ": missing `authorization: Bearer <token>` metadata (see --token-file)"));
  }
  if (!absl::StartsWith(header_value, kPrefix)) {
    return absl::UnauthenticatedError(
        absl::StrCat(method, ": authorization metadata is not a Bearer token"));
  }
  std::optional<Role> role = roles.RoleOf(header_value.substr(kPrefix.size()));
  if (!role) {
    return absl::UnauthenticatedError(absl::StrCat(
        method, ": wrong bearer token (not this cluster's admin, viewer or agent token)"));
  }
  auto allowed = MethodRoles(method);
  if (!allowed) {
    return absl::PermissionDeniedError(
        absl::StrCat(method, " is not in the role table: no token may call it"));
  }
  for (Role r : *allowed) {
    if (r == *role) return absl::OkStatus();
  }
  absl::string_view name = method.substr(method.find('/') + 1);
  return absl::PermissionDeniedError(absl::StrCat(WithArticle(*role), " token cannot ", name,
                                                  " (needs ", RoleList(*allowed), ")"));
}

Status AuthorizeStoreCall(const RoleTokens& roles, const std::string& store_key,
                          absl::string_view header_value, bool present, absl::string_view ns,
                          const std::function<Status(const std::string& job)>& job_open) {
  constexpr absl::string_view kPrefix = "Bearer ";
  if (present && absl::StartsWith(header_value, kPrefix)) {
    std::optional<Role> role = roles.RoleOf(header_value.substr(kPrefix.size()));
    if (role == Role::kAdmin) return absl::OkStatus();
    if (role == Role::kViewer || role == Role::kAgent) {
      return absl::PermissionDeniedError(absl::StrCat(
          WithArticle(*role), " token cannot use the store (namespace ", QuoteForError(ns),
          " needs admin or its job's store token)"));
    }
  }
  RETURN_IF_ERROR(AuthorizeStore(header_value, present, store_key, ns));
  if (job_open) return job_open(std::string(ns.substr(0, ns.find('/'))));
  return absl::OkStatus();
}

}  // namespace daemon
}  // namespace lockstep
