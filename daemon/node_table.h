// NodeTable: the coordinator's view of its agents: registration and
// incarnation, the lease (last heartbeat on the coordinator's monotonic
// clock), alive or dead, which jobs each node still runs workers for, and
// each node's fence deadline. Plain C++, no clock of its own: every call
// that needs the time takes `now`.
//
// Leases and fences (daemon/README.md "Leases and fencing" has the figures).
// Let S be the agent's send time of its last accepted heartbeat (its clock)
// and R >= S the coordinator's receipt of it (this table's last_heartbeat).
//   - The agent stops its workers at S + lease (SIGTERM, SIGKILL after
//     min(stop grace, lease/4)); a worker linking the engine kills itself
//     at S + lease + lease/4 even when its agent is frozen.
//   - The coordinator declares the node dead at R + lease (ExpireLeases).
//   - The node's FENCE DEADLINE is R + lease + lease/4 + 1 s
//     (kFenceMargin): by then every worker of the node is gone, because the
//     agent's and the workers' deadlines are measured from S <= R. The 1 s
//     covers the agent's kill and reap and the tick granularity. The
//     coordinator reassigns a node's ranks only once the node reported its
//     workers stopped, or it is dead and past its fence deadline
//     (OwnersGone), so no rank ever has two live owners.
//
// Stall compensation: time during which the coordinator itself did not run
// (SIGSTOP, a hung host) does not count against any lease. CompensateStall,
// called at the start of every tick, sees a gap between two ticks larger
// than 2 x heartbeat_interval and moves every node's last heartbeat forward
// by the gap (never past `now`). Agents could not renew during the stall, so
// without this a coordinator stopped for most of a lease would declare
// every node dead the moment it resumed. The fence deadline moves with the
// last heartbeat, which only delays a reassignment.
//
// Thread safety: not thread-safe. The Coordinator owns one and calls it
// under its mutex (Coordinator::nodes_ is ABSL_GUARDED_BY its mu_).
#ifndef LOCKSTEP_DAEMON_NODE_TABLE_H_
#define LOCKSTEP_DAEMON_NODE_TABLE_H_

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "lockstep/v1/common.pb.h"

namespace lockstep {
namespace daemon {

// How fast PlaceAgentInstant lets its clock-offset estimate grow: 1 ms per
// second, far above the rate difference of two hosts' clocks (tens of ppm).
inline constexpr double kClockDriftAllowance = 1e-3;

// Agents' clock readings (sent_mono_ns, an exit's exited_mono_ns and
// exited_unix_ms) are numbers from the network: the coordinator places no
// request or exit further than this (a day) from the instant it derives it
// from, so no stamp overflows MonoTime; a garbage one costs at most the
// order of a failure.
inline constexpr Duration kMaxAgentClockSpan = std::chrono::hours(24);

// Added to a dead node's fence deadline (see the file comment).
inline constexpr Duration kFenceMargin = std::chrono::seconds(1);

class NodeTable {
 public:
  using Reports = google::protobuf::RepeatedPtrField<v1::AgentJobReport>;

  // REQUIRES: lease > 0, heartbeat_interval > 0.
  NodeTable(Duration lease, Duration heartbeat_interval);

  // A registration reloaded from the JobStore after a coordinator restart:
  // alive with a full lease from `now`, its workers unknown (not eligible,
  // not fenced) until its agent reports.
  void Restore(const v1::NodeInfo& info, MonoTime now);

  // Applies a registration that was already persisted: alive, lease renewed
  // at `now`, live jobs from `reports`. Replaces any other incarnation.
  void Register(const v1::NodeInfo& info, MonoTime now,
                const Reports& reports);

  // OK when `incarnation` is the node's current one; NotFound for an unknown
  // node (its agent re-registers), Aborted for another incarnation.
  Status CheckIncarnation(const std::string& node_id, const std::string& incarnation) const;

  // Renews the lease at `now` (the receipt) and records which jobs the node
  // runs live workers for. Returns true if the node was dead and is back.
  // REQUIRES: CheckIncarnation(node_id, ...) is OK.
  bool Renew(const std::string& node_id, MonoTime now,
             const Reports& reports);

  // The instant on this coordinator's clock at which the node's agent sent a
  // request stamped `sent_mono_ns` (its monotonic clock), handled at
  // `receipt`. Each request bounds the clock offset from above (receipt -
  // sent); queueing (gRPC, a busy coordinator, the lock) only ever adds to
  // it, so the smallest bound seen is the estimate, allowed to grow by
  // kClockDriftAllowance of the time since it was last set, as the two
  // clocks' rates differ. Exits are placed with it, so a report that waited
  // 200 ms in a queue does not make its exits look 200 ms later than a
  // peer's. `receipt` when sent_mono_ns is 0 (no stamp); never earlier
  // than receipt - kMaxAgentClockSpan.
  // REQUIRES: the node is known.
  MonoTime PlaceAgentInstant(const std::string& node_id, MonoTime receipt, int64_t sent_mono_ns);

  // See "Stall compensation" above. Returns the gap that was compensated, or
  // nullopt when the coordinator ran on time (also on the first call).
  std::optional<Duration> CompensateStall(MonoTime now);

  struct Expired {
    std::string node_id;
    std::string reason;  // "no heartbeat for 10.1s (lease 10s)"
  };
  // Marks dead every alive node whose last heartbeat is more than a lease
  // before `now`, and returns them (by node id).
  std::vector<Expired> ExpireLeases(MonoTime now);

  // The registration as persisted; nullptr for an unknown node.
  const v1::NodeInfo* Find(const std::string& node_id) const;
  // False for a dead or unknown node.
  bool Alive(const std::string& node_id) const;
  // Why the node is not alive ("no heartbeat for ...", "not registered").
  std::string DeathReason(const std::string& node_id) const;
  // R + lease + lease/4 + kFenceMargin. REQUIRES: the node is known.
  MonoTime FenceDeadline(const std::string& node_id) const;

  // A heartbeat's answer to `node_id` carries a start of `job_id`: until
  // the node's next report, its workers of the job may be starting.
  // REQUIRES: the node is known.
  void NoteStarted(const std::string& node_id, const std::string& job_id);

  // True when no worker of `job_id` can still run on `node_id`: its agent's
  // last report listed none live and no answer started the job there since
  // (NoteStarted), or the node is dead and `now` is past its fence deadline.
  // An unknown node never ran anything: true.
  bool OwnersGone(const std::string& node_id, const std::string& job_id, MonoTime now) const;

  // Nodes that can join a round of `job_id`: alive, reported since the last
  // (re)load, and running no live worker of the job. Sorted by node id.
  std::vector<std::string> Eligible(const std::string& job_id) const;

  // Every node (sorted by id) with alive and last_heartbeat_age_s set.
  std::vector<v1::NodeInfo> List(MonoTime now) const;

 private:
  struct Node {
    v1::NodeInfo info;
    MonoTime last_heartbeat;  // R: receipt of the last accepted heartbeat
    bool alive = true;
    std::string dead_reason;  // set when the lease expired
    bool reported = false;  // its agent reported its workers since the (re)load
    std::set<std::string> live_jobs;  // jobs with STARTING/RUNNING workers here
    // Jobs an answer started here since its agent's last report, which
    // could not list them (NoteStarted).
    std::set<std::string> started_since_report;
    // PlaceAgentInstant: coordinator clock minus agent clock, as estimated,
    // and when the estimate was last lowered or aged.
    std::optional<Duration> clock_offset;
    MonoTime clock_offset_at;
  };
  static std::set<std::string> LiveJobs(const Reports& reports);

  const Duration lease_;
  const Duration heartbeat_interval_;
  std::map<std::string, Node> nodes_;
  std::optional<MonoTime> last_tick_;
};

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_NODE_TABLE_H_
