// JobMachine: the job state machine. Every transition is a function from
// one JobDraft (a job and its runtime state) to the next; the Coordinator
// computes it on a copy, persists the job (JobStore::PutJob), and only then
// applies the copy, so a failed write changes nothing and needs no rollback.
// No I/O, no lock; time comes from the injected Clock (events, backoff) and
// node facts from a NodeTable passed in.
//
// States (DESIGN.md "Processes and data flow"):
//
//   PENDING --(min_nodes eligible: round 1 opens)--> RENDEZVOUS
//   RENDEZVOUS, round open --(RoundPlanner: close)--> RENDEZVOUS, closed
//   RENDEZVOUS, closed --(every rank reported)--> RUNNING
//   RENDEZVOUS/RUNNING --(a worker failed or a participant was lost, budget
//                         left)--> RESTARTING (restart_count + 1, backoff)
//   RUNNING --(an eligible node is not in the round, fewer than max_nodes)-->
//             RESTARTING (rescale: rescale_count + 1, not counted)
//   RESTARTING --(backoff passed and every participant's old workers are
//                 gone: NodeTable::OwnersGone)--> RENDEZVOUS (round + 1)
//   RUNNING --(every rank exited 0)--> SUCCEEDED
//   a failure with the budget spent, or a launch error --> FAILED
//   PENDING or an open round with fewer than min_nodes eligible for the
//   spec's join_timeout_s (0 = no limit) --> FAILED;   cancel --> CANCELLED
//
// The round. Job.current_round is the one record of the job's round: its
// number, whether it closed, its participants in node-rank order, world
// size, MASTER_PORT and last call (round_planner.h has the close rule and
// the rank order). A round opens with number + 1 and no participants; while
// open it is re-planned on every Advance from the eligible nodes; once closed
// its participants are fixed until the next round opens. The store
// namespace of round R is "<job>/R" (rendezvous::StoreNamespace).
//
// Ownership. A worker owns (job, round, rank) from spawn until it exits.
// A round opens only when every participant of the previous one has no
// worker of the job left (its agent reported none live, or its node is dead
// and past its fence deadline: node_table.h), so no rank has two live owners.
// Reports carry their round; a report of another round never changes a job.
//
// First failure by time. Each failed exit is placed on the coordinator's
// clock once, when first reported: exit instant = receipt - (sent_mono_ns -
// exited_mono_ns), both on the agent's monotonic clock (ExitInstant), where
// the coordinator passes as `receipt` the send instant on its own clock
// (NodeTable::PlaceAgentInstant), so queueing does not delay an exit. The
// earliest failed exit of the round is first_failure; the round's other
// failed exits are `consequences` ("after rank R failed"), also when their
// reports arrive after the job left RUNNING: they are recorded, and may
// move first_failure to an exit that turns out earlier, but never change
// the job's state or restart count. A new round clears the consequences.
//
// Thread safety: the machine holds no mutable state; its methods may run
// concurrently on different drafts.
#ifndef LOCKSTEP_DAEMON_JOB_MACHINE_H_
#define LOCKSTEP_DAEMON_JOB_MACHINE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "daemon/node_table.h"
#include "lockstep/v1/common.pb.h"

namespace lockstep {
namespace daemon {

// Events kept per job in Job.history (the first, "submitted", is kept).
inline constexpr int kMaxHistory = 200;

// What the coordinator keeps about a job besides the persisted Job. Lost on
// a coordinator restart; RecoveredRuntime rebuilds a safe default.
struct JobRuntime {
  // PENDING: since submit; RENDEZVOUS: since the round opened, or last had
  // MIN eligible nodes (join timeout).
  MonoTime waiting_since;
  // RESTARTING: the next round opens no earlier (backoff).
  MonoTime restart_at;
  // The open round's last call ends here (set once min_nodes are eligible).
  std::optional<MonoTime> last_call_deadline;
  // Failed ranks of the current round -> exit instant on the coordinator's
  // clock, from the first report of each (first report wins).
  std::map<int, MonoTime> exit_at;
  // Nodes an elastic job was left out of after a launch error there, with
  // the incarnation then: not eligible for it again until the node comes
  // back as another (its agent restarted, say after a fix).
  std::map<std::string, std::string> launch_failed_on;
};

// A line the JobMachine has to say about a change (a new state, a new first
// failure), with the rank it is about (-1: the whole job).
struct ChangeLine {
  int rank = -1;
  std::string text;
};

// A job and its runtime state: the unit that is computed, persisted, applied.
struct JobDraft {
  v1::Job job;
  JobRuntime rt;
  // What the machine did to this draft, for the log. Whoever persists the
  // draft logs them once it is written (Coordinator::Commit), so a change
  // whose write failed, and that is computed again at the next report or
  // tick, is never logged as made. Never persisted.
  std::vector<ChangeLine> changes;
};

struct JobMachineOptions {
  // Backoff before restart n is restart_backoff * 2^(n-1), capped.
  Duration restart_backoff = std::chrono::seconds(1);
  Duration max_restart_backoff = std::chrono::seconds(30);
};

class JobMachine {
 public:
  // `clock` must outlive the machine.
  JobMachine(JobMachineOptions options, Clock* clock);

  // A PENDING job. REQUIRES: `spec` validated, defaults applied.
  JobDraft NewJob(const std::string& job_id, const v1::JobSpec& spec,
                  const std::string& request_id) const;
  // Runtime state for a job reloaded after a coordinator restart: timeouts
  // count from now, a backoff under way is not resumed (a RESTARTING job
  // waits for the gate alone: its nodes' reports or fence deadlines, which
  // a restarted coordinator learns afresh), the last call starts again, exits not yet
  // placed are placed when next reported. Also fills current_round from the
  // mirror fields for a job persisted before current_round existed.
  JobDraft Recovered(v1::Job job) const;

  // Time-driven transitions: opens, plans and closes rounds, join timeout,
  // the RESTARTING gate, a participant found dead (a counted failure),
  // elastic scale-up.
  void Advance(JobDraft* d, const NodeTable& nodes) const;
  // Applies one agent's report of the job's workers, received at `receipt`
  // (coordinator clock) in a request the agent sent at `sent_mono_ns` (its
  // steady clock; 0 = unknown).
  void ApplyReport(JobDraft* d, const std::string& node_id, const v1::AgentJobReport& report,
                   MonoTime receipt, int64_t sent_mono_ns) const;
  // A participant of the current round is gone (its agent restarted; an
  // expired lease is found by Advance): a counted failure if the job is in
  // RENDEZVOUS or RUNNING.
  void NodeLost(JobDraft* d, const std::string& node_id, const std::string& reason) const;
  void Cancel(JobDraft* d) const;

  // The exit's instant on the coordinator's clock (see the file comment);
  // falls back to exited_unix_ms against this clock's wall time, then to
  // `receipt`.
  MonoTime ExitInstant(const v1::ExitInfo& exit, MonoTime receipt, int64_t sent_mono_ns) const;

  static bool IsTerminal(v1::JobState state);
  // "SUCCEEDED" for JOB_STATE_SUCCEEDED: a state as the CLI prints it, for
  // messages that reach users (client/text.h's StateName).
  static std::string StateName(v1::JobState state);
  // Node rank of `node_id` in the current round if it is closed, else -1.
  static int NodeRank(const v1::Job& job, const std::string& node_id);
  // Writes the mirror fields (Job.round, world_size, node_ids, master_port)
  // from current_round: the one place they are written.
  static void MirrorRound(v1::Job* job);

 private:
  void AddEvent(v1::Job* job, const std::string& detail) const;
  // Records the change in the job's history and in d->changes, with `rank`
  // when it is about one rank (a rank's failure; -1: the whole job).
  void SetState(JobDraft* d, v1::JobState state, const std::string& detail, int rank = -1) const;
  // Applies a failure of the current round: FAILED (launch error, budget
  // spent), else RESTARTING. `counts` = false for a rescale. A launch error
  // of an elastic job that has MIN nodes without that node leaves the node
  // out (RESTARTING, not counted).
  void HandleFailure(JobDraft* d, const v1::Failure& failure, bool counts) const;
  // Re-derives first_failure (earliest exit) and the consequences of the
  // current round from its workers; never changes the state.
  void AttributeFailures(JobDraft* d) const;
  void OpenNextRound(JobDraft* d) const;
  // The nodes that can join a round of the job: NodeTable::Eligible less
  // those it was left out of after a launch error (JobRuntime).
  std::vector<std::string> EligibleFor(JobDraft* d, const NodeTable& nodes) const;
  // Plans the open round: close, start/stop the last call, join timeout.
  void PlanOpenRound(JobDraft* d, const NodeTable& nodes) const;
  Duration BackoffFor(int restart_count) const;

  const JobMachineOptions options_;
  Clock* const clock_;
};

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_JOB_MACHINE_H_
