// Log tickets: how `lockstep logs` reads a job's output from the agents
// without handing them a cluster token.
//
// Agents serve ReadLogs and ListWorkers (AgentService) to holders of a log
// ticket and to nothing else: an admin or viewer token sent to an agent
// would be one captured by whoever runs that agent, or registers under its
// node id with the agent token. The CLI asks the coordinator for tickets
// (CoordinatorService.IssueLogTickets, admin or viewer), one per node it
// reads from, and sends each to its node only, as metadata
// `authorization: Ticket <ticket>`.
//
// A ticket opens one job's logs on one node until it expires:
//   node key  = hex HMAC-SHA256(store.key, "lockstep log key v1\n" + node_id)
//   ticket    = "<expires_unix_s>:" +
//               hex HMAC-SHA256(node key, "lockstep log ticket v1\n" + job_id +
//                               "\n" + node_id + "\n" + <expires_unix_s>)
// The coordinator sends each node its own key in every RegisterNode and
// Heartbeat answer (never another node's), so a node can check its tickets
// and mint none for another node. Keys derive from the coordinator's
// store.key, so they and the tickets outlive a coordinator restart. Expiry is
// judged against the agent's wall clock: clocks apart by more than a
// ticket's life (kLogTicketLife) make every ticket look expired, and the
// agent's error gives both times.
//
// Thread safety: pure functions.
#ifndef LOCKSTEP_DAEMON_LOG_TICKET_H_
#define LOCKSTEP_DAEMON_LOG_TICKET_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "common/status.h"

namespace lockstep {
namespace daemon {

inline constexpr std::chrono::seconds kLogTicketLife{600};
// Most node ids one IssueLogTickets call may name.
inline constexpr int kMaxLogTicketNodes = 4096;

// The key node `node_id` checks its tickets with (see above).
std::string NodeLogKey(absl::string_view store_key, absl::string_view node_id);

// A ticket for job `job_id`'s logs on node `node_id`, signed with that
// node's key, valid until `expires_unix_s`.
std::string MakeLogTicket(absl::string_view node_key, absl::string_view job_id,
                          absl::string_view node_id, int64_t expires_unix_s);

// Whether an agent on node `node_id` holding `node_key` may serve `method`
// ("AgentService/ReadLogs") for job `job_id` to a call whose
// `authorization` metadata is `header_value` (`present` false when absent),
// at `now_unix_s`. Unauthenticated: no metadata, a bearer token (named as
// such: agents take tickets only), a malformed ticket, or an expired one
// (both clocks named); PermissionDenied: a well-formed ticket that is not
// for this job on this node (or is forged). A ticket's text is never
// echoed.
Status CheckLogTicket(absl::string_view header_value, bool present, absl::string_view node_key,
                      absl::string_view method, absl::string_view job_id,
                      absl::string_view node_id, int64_t now_unix_s);

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_LOG_TICKET_H_
