// Coordinator core: the job table, the node registry and every decision
// about where and when workers run. Plain C++ (no gRPC); time comes from an
// injected Clock, durability from an injected JobStore.
//
// Job state machine (DESIGN.md "Processes and data flow"):
//
//   PENDING --(round opened)--> RENDEZVOUS --(all ranks reported)--> RUNNING
//   RUNNING --(worker failed / node lost, budget left)--> RESTARTING
//   RUNNING --(a node joined, fewer than max nodes)--> RESTARTING (rescale,
//             not counted against max_restarts)
//   RESTARTING --(old workers confirmed stopped or their node dead, and the
//                 backoff passed)--> RENDEZVOUS (round + 1)
//   RUNNING --(every rank exited 0)--> SUCCEEDED
//   any failure with the budget spent --> FAILED;  cancel --> CANCELLED
//
// Rounds are the store engineer's rendezvous::RendezvousCore (the one
// rendezvous implementation; the daemon also serves it as
// RendezvousService). A round is *open* while the job is in RENDEZVOUS with
// no participants (node_ids empty): the coordinator joins every eligible
// node (alive, and reporting no live workers of the job) on the node's
// behalf, so agents need no extra RPC. The core closes the round when
// max_nodes joined, or min_nodes and the last call passed, and assigns node
// ranks (survivors keep theirs, then new nodes by id: deterministic for a
// given membership); global rank = node_rank * nproc_per_node + local_rank.
// The core's join callbacks only queue the result; Tick() applies it, so
// no callback ever takes the coordinator's lock. The coordinator's round
// number is the core's; after a coordinator restart the core (in memory)
// is re-created and advanced to the job's next round when one is needed.
//
// Fencing. Every agent start has a fresh incarnation; a heartbeat from any
// other incarnation is rejected (Aborted). Every worker report and command
// carries the round; reports for another round never change the job. A
// new round is opened only once every participant of the old round has
// reported its workers stopped or has been declared dead: a node is dead
// when no heartbeat arrived for `lease` on this process's monotonic clock,
// and agents stop their own workers after lease/2 without renewal, so no
// rank ever has two owners.
//
// Commands are level-triggered: each heartbeat response lists every job
// the node must run (KIND_START for the current closed round); anything
// else the agent runs is stopped.
//
// Durability. Every change to a job or node registration is written to the
// JobStore before the call returns; if the write fails the in-memory change
// is rolled back and the error returned. Recover() reloads both tables; a
// reloaded node gets a full lease from the reload, and agents re-register.
//
// Thread safety: all methods are thread-safe (one internal mutex). No
// method blocks beyond a JobStore write.
#ifndef LOCKSTEP_DAEMON_COORDINATOR_H_
#define LOCKSTEP_DAEMON_COORDINATOR_H_

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/ids.h"
#include "common/logging.h"
#include "common/status.h"
#include "daemon/job_store.h"
#include "lockstep/v1/common.pb.h"
#include "rendezvous/rendezvous_core.h"

namespace lockstep {
namespace daemon {

// Default: a node is dead after this long without a heartbeat.
inline constexpr Duration kDefaultLease = std::chrono::seconds(10);
// Default: agents heartbeat this often.
inline constexpr Duration kDefaultHeartbeatInterval = std::chrono::seconds(1);
// Default: first restart backoff; doubles per restart up to the max.
inline constexpr Duration kDefaultRestartBackoff = std::chrono::seconds(1);
inline constexpr Duration kDefaultMaxRestartBackoff = std::chrono::seconds(30);
// Events kept per job in Job.history.
inline constexpr int kMaxHistory = 200;

struct CoordinatorOptions {
  Duration lease = kDefaultLease;
  Duration heartbeat_interval = kDefaultHeartbeatInterval;
  Duration restart_backoff = kDefaultRestartBackoff;
  Duration max_restart_backoff = kDefaultMaxRestartBackoff;
  // Non-empty: command[0] of every job must be one of these.
  std::vector<std::string> allowed_commands;
  // host:port workers get as LOCKSTEP_STORE (the coordinator's server).
  std::string store_address;
};

class Coordinator {
 public:
  // `clock`, `store` and `rendezvous` must outlive the coordinator.
  // `rendezvous` should run on the same clock.
  Coordinator(CoordinatorOptions options, Clock* clock, JobStore* store,
              rendezvous::RendezvousCore* rendezvous);

  // Reloads jobs and nodes from the store. Call once before serving.
  Status Recover();

  // Validates (InvalidArgument / PermissionDenied naming the field),
  // persists the job as PENDING and returns it. A retry with the same
  // non-empty request_id returns the job created first.
  StatusOr<v1::Job> SubmitJob(const v1::JobSpec& spec, const std::string& request_id);
  // NotFound naming the job.
  StatusOr<v1::Job> GetJob(const JobId& id) const;
  // All jobs, oldest first; `states` empty = all.
  std::vector<v1::Job> ListJobs(const std::vector<v1::JobState>& states) const;
  // Moves a live job to CANCELLED (agents stop its workers on their next
  // heartbeat). NotFound; FailedPrecondition if it already finished.
  StatusOr<v1::Job> CancelJob(const JobId& id);

  // Registers (or re-registers) an agent. A new incarnation of a known node
  // means its old workers are gone: every job whose current round used the
  // node gets a "node restarted" failure. InvalidArgument for empty ids.
  StatusOr<v1::RegisterNodeResponse> RegisterNode(const v1::RegisterNodeRequest& request);
  // Renews the lease and applies worker reports. NotFound for an unknown
  // node (the agent re-registers); Aborted for a stale incarnation.
  StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  std::vector<v1::NodeInfo> ListNodes() const;

  // Sets the LOCKSTEP_STORE address handed to workers (known only once the
  // server bound its port). Overrides options.store_address.
  void SetStoreAddress(const std::string& address);

  // Drives time: lease expiry, round opening and closing, restart backoff.
  // Call every ~100 ms (the daemon) or after FakeClock::Advance (tests).
  void Tick();

  // Change notification for long polls: every job change bumps the job's
  // version. The callback runs under no coordinator lock, on the thread
  // that made the change; it must not block.
  using JobCallback = std::function<void(const v1::Job& job, int64_t version)>;
  // Returns the job's current version and snapshot (NotFound).
  StatusOr<std::pair<v1::Job, int64_t>> GetJobVersion(const JobId& id) const;
  // Calls `cb` once, on the next change of the job after `after_version`
  // (at once if it already changed). Returns a handle for Unwatch.
  StatusOr<int64_t> WatchOnce(const JobId& id, int64_t after_version, JobCallback cb);
  // Removes a pending watch; false if it already fired.
  bool Unwatch(int64_t handle);

 private:
  struct NodeState {
    v1::NodeInfo info;
    MonoTime last_heartbeat;
    bool alive = true;
    bool reported = false;  // a heartbeat/registration reported its workers
    // Jobs this node reported live (STARTING/RUNNING) workers for.
    std::set<std::string> live_jobs;
  };
  struct JobRuntime {
    MonoTime round_opened;
    MonoTime restart_at;
    int64_t version = 1;
    bool rendezvous_created = false;  // the job exists in the core
    std::set<std::string> joined;     // nodes joined to the open round
  };
  struct RendezvousEvent {
    std::string job_id;
    std::string node_id;
    StatusOr<rendezvous::RendezvousResult> result;
  };
  struct Watch {
    std::string job_id;
    int64_t after_version;
    JobCallback cb;
  };
  using Notification = std::pair<JobCallback, std::pair<v1::Job, int64_t>>;

  // Persists `job` (the new value of jobs_[id]); on failure restores
  // `before` and returns the error. Bumps the version and collects watches.
  Status CommitJob(const v1::Job& before, v1::Job* job, std::vector<Notification>* notify);
  void AddEvent(v1::Job* job, const std::string& detail);
  void SetState(v1::Job* job, v1::JobState state, const std::string& detail);
  // Applies a failure to a live job: restart or FAIL. Does not persist.
  void HandleFailure(v1::Job* job, const v1::Failure& failure, bool counts);
  void ApplyReport(NodeState* node, const v1::AgentJobReport& report,
                   std::vector<Notification>* notify);
  void DeclareDead(NodeState* node, const std::string& reason, std::vector<Notification>* notify);
  void TickJob(v1::Job* job, std::vector<Notification>* notify);
  std::vector<v1::AgentCommand> CommandsFor(const NodeState& node) const;
  std::vector<std::string> EligibleNodes(const v1::Job& job) const;
  v1::RoundAssignment AssignmentFor(const v1::Job& job, int node_rank) const;
  Duration BackoffFor(int restart_count) const;
  static bool IsTerminal(v1::JobState state);
  // Makes the core's current round of `job` equal `round` (creating the
  // job in the core if needed). REQUIRES: mu_ held.
  Status EnsureRendezvousRound(const v1::Job& job, int round);
  // Applies queued join results (round closes). REQUIRES: mu_ held.
  void DrainRendezvous(std::vector<Notification>* notify);
  void ForgetRendezvous(const std::string& job_id);  // REQUIRES: mu_ held
  void Deliver(std::vector<Notification>* notify);

  const CoordinatorOptions options_;
  Clock* const clock_;
  JobStore* const store_;
  rendezvous::RendezvousCore* const rendezvous_;
  Logger log_{"coordinator"};

  std::mutex events_mu_;  // never held with mu_ taken after it
  std::vector<RendezvousEvent> events_;  // GUARDED_BY(events_mu_)

  mutable std::mutex mu_;
  std::map<std::string, v1::Job> jobs_;          // GUARDED_BY(mu_)
  std::vector<std::string> job_order_;           // GUARDED_BY(mu_) submit order
  std::map<std::string, JobRuntime> runtime_;    // GUARDED_BY(mu_)
  std::map<std::string, NodeState> nodes_;       // GUARDED_BY(mu_)
  std::map<int64_t, Watch> watches_;             // GUARDED_BY(mu_)
  int64_t next_watch_ = 1;                       // GUARDED_BY(mu_)
  std::string store_address_;                    // GUARDED_BY(mu_)
};

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_COORDINATOR_H_
