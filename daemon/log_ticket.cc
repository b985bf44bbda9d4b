#include "daemon/log_ticket.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/token.h"

namespace lockstep {
namespace daemon {
namespace {

constexpr absl::string_view kTicketScheme = "Ticket ";

std::string UtcTime(int64_t unix_s) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixSeconds(unix_s), absl::UTCTimeZone());
}

}  // namespace

std::string NodeLogKey(absl::string_view store_key, absl::string_view node_id) {
  return HmacSha256Hex(store_key, absl::StrCat("lockstep log key v1\n", node_id));
}

std::string MakeLogTicket(absl::string_view node_key, absl::string_view job_id,
                          absl::string_view node_id, int64_t expires_unix_s) {
  const std::string expires = absl::StrCat(expires_unix_s);
  return absl::StrCat(
      expires, ":",
      HmacSha256Hex(node_key, absl::StrCat("lockstep log ticket v1\n", job_id, "\n", node_id,
                                           "\n", expires)));
}

Status CheckLogTicket(absl::string_view header_value, bool present, absl::string_view node_key,
                      absl::string_view method, absl::string_view job_id,
                      absl::string_view node_id, int64_t now_unix_s) {
  if (!present) {
    return absl::UnauthenticatedError(absl::StrCat(
        method, ": missing `authorization: Ticket <log ticket>` metadata (`lockstep logs` gets "
                "tickets from the coordinator; agents take nothing else)"));
  }
  if (absl::StartsWith(header_value, "Bearer ")) {
    return absl::UnauthenticatedError(absl::StrCat(
        method, ": agents take log tickets, not bearer tokens: no cluster token is ever sent "
                "to an agent (use a lockstep CLI that asks the coordinator for tickets)"));
  }
  if (!absl::StartsWith(header_value, kTicketScheme)) {
    return absl::UnauthenticatedError(
        absl::StrCat(method, ": authorization metadata is not a log ticket"));
  }
  absl::string_view ticket = header_value.substr(kTicketScheme.size());
  const size_t colon = ticket.find(':');
  int64_t expires = 0;
  if (colon == absl::string_view::npos || colon == 0 || colon > 19 ||
      ticket.substr(0, colon).find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(ticket.substr(0, colon), &expires)) {
    return absl::UnauthenticatedError(
        absl::StrCat(method, ": malformed log ticket (want <expiry>:<mac>)"));
  }
  // The MAC is checked before the expiry, so a forged expiry learns nothing.
  if (node_key.empty() ||
      !SecretsEqual(MakeLogTicket(node_key, job_id, node_id, expires), ticket)) {
    return absl::PermissionDeniedError(
        absl::StrCat(method, ": the log ticket is not one for job ", QuoteForError(job_id),
                     " on node ", node_id,
                     " (issued for another job or node, or by another coordinator)"));
  }
  if (now_unix_s > expires) {
    return absl::UnauthenticatedError(absl::StrCat(
        method, ": the log ticket for job ", QuoteForError(job_id), " expired at ", UtcTime(expires),
        " by this agent's clock, which reads ", UtcTime(now_unix_s),
        " (tickets live ", kLogTicketLife.count(),
        " s: a clock that far ahead of the coordinator's expires every one)"));
  }
  return absl::OkStatus();
}

}  // namespace daemon
}  // namespace lockstep
