// Coordinator core: the job table, the node registry and every decision
// about where and when workers run. Plain C++ (no gRPC); time comes from an
// injected Clock, durability from an injected JobStore. It composes three
// parts, each with its own header and tests:
//   - NodeTable (node_table.h): registrations, incarnations, leases, stall
//     compensation, which jobs each node still runs, fence deadlines;
//   - JobMachine (job_machine.h): the job state machine, including the one
//     persisted round record per job (Job.current_round);
//   - PlanRound (round_planner.h): when an open round closes and the
//     node-rank order.
//
// Compute, persist, apply. Every change to a job is computed by the
// JobMachine on a copy (JobDraft: the Job and its runtime state), written
// with JobStore::PutJob, and only then applied to memory and logged
// (JobDraft::changes); a failed write changes nothing, is logged with the
// job id, and is returned to the caller where there is one (a Tick has
// none: it retries on the next tick). A heartbeat or registration whose
// reports could not be written still renews the node's lease: the error
// goes back in reports_not_applied, and the next reports make the change
// again. Node
// registrations are written with PutNode before they are applied. Leases
// are never persisted: Recover gives every reloaded node a full lease.
//
// Side effects run after the change is applied and the lock released:
// watch callbacks, and the store hook (CoordinatorOptions::drop_store_prefix)
// for the namespace of a round that was superseded ("<job>/<R-1>" when
// round R opens) and for every namespace of a job that ended ("<job>/").
//
// Commands are level-triggered: each heartbeat response lists every job
// the node must run (KIND_START for the current closed round; node rank 0
// first, the others once it reported MASTER_PORT); any other job the agent
// reports gets KIND_STOP.
//
// Fencing (node_table.h has the rule and the figures): a new incarnation
// of a node rejects heartbeats from the old one (Aborted) and fails the
// rounds the node was in; reports carry their round and never change a job
// of another round; a job's next round opens only when every participant
// of the old one reported its workers stopped or is dead and past its fence
// deadline.
//
// Thread safety: every method is thread-safe (one Mutex, common/mutex.h;
// the NodeTable and the jobs are guarded by it). No method blocks beyond a
// JobStore write under it; callbacks and the store hook run without it.
#ifndef LOCKSTEP_DAEMON_COORDINATOR_H_
#define LOCKSTEP_DAEMON_COORDINATOR_H_

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "common/clock.h"
#include "common/ids.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "common/status.h"
#include "daemon/job_machine.h"
#include "daemon/job_store.h"
#include "daemon/node_table.h"
#include "daemon/straggler.h"
#include "lockstep/v1/common.pb.h"

namespace lockstep {
namespace daemon {

// Default: a node is dead a lease after the receipt of its last heartbeat,
// and its agent stops its workers a lease after sending it. 45 s lets agents
// keep their workers through a coordinator outage of 30 s plus reconnecting;
// a node cut off from everyone is replaced after lease + lease/4 + 1 s (its
// fence deadline, 57.25 s) plus the new round's startup: under two leases.
inline constexpr Duration kDefaultLease = std::chrono::seconds(45);
// Default: agents heartbeat this often.
inline constexpr Duration kDefaultHeartbeatInterval = std::chrono::seconds(1);
// Default: first restart backoff; doubles per restart up to the max.
inline constexpr Duration kDefaultRestartBackoff = std::chrono::seconds(1);
inline constexpr Duration kDefaultMaxRestartBackoff = std::chrono::seconds(30);
// Default: finished jobs kept in memory, the most recently submitted. Older
// ones live only in the JobStore and are read from it on request, so the
// coordinator's memory does not grow with the number of jobs it ran.
inline constexpr int kDefaultFinishedJobsInMemory = 64;
// Default of lockstepd --retain-finished-s: a finished job (its record, and
// its directory with the logs on every node) is deleted 7 days after it
// ended.
inline constexpr Duration kDefaultFinishedJobRetention = std::chrono::hours(7 * 24);

struct CoordinatorOptions {
  Duration lease = kDefaultLease;
  Duration heartbeat_interval = kDefaultHeartbeatInterval;
  Duration restart_backoff = kDefaultRestartBackoff;
  Duration max_restart_backoff = kDefaultMaxRestartBackoff;
  // A rank blocked in a collective this long is reported in Job.health
  // (daemon/straggler.h).
  Duration hang_threshold = kDefaultHangThreshold;
  // Non-empty: command[0] of every job must be one of these.
  std::vector<std::string> allowed_commands;
  // Names or PREFIX* a job's env may set beyond the engine's (job_env.h).
  std::vector<std::string> allowed_env;
  // host:port workers get as LOCKSTEP_STORE (the coordinator's server).
  std::string store_address;
  // Drops every store namespace whose name starts with `prefix`: called
  // with "<job>/<R-1>" once round R opened (the old owners are all gone by
  // then; rounds only grow, so the names it also matches, "<job>/<R-1>0"
  // and longer, are rounds that do not exist yet) and with "<job>/" once
  // the job ended. Runs without the coordinator's lock; must not block.
  // Default: none (nothing is dropped).
  std::function<void(const std::string& prefix)> drop_store_prefix;
  // Called with the job's id once it ended, instead of
  // drop_store_prefix("<job>/") when set: lockstepd's StoreCore::CloseJob,
  // which also refuses later writes there. Same rules as drop_store_prefix.
  std::function<void(const std::string& job_id)> close_store_job;
  int finished_jobs_in_memory = kDefaultFinishedJobsInMemory;
  // > 0: Tick deletes (as DeleteJob does) every job that finished longer
  // ago than this. 0: finished jobs are kept until deleted.
  Duration finished_job_retention = Duration::zero();
};

// Retention is checked this often.
inline constexpr Duration kRetentionSweepInterval = std::chrono::seconds(1);
// Deleted jobs one node has not acknowledged, at most (a node that never
// comes back does not grow the coordinator without bound; past this its
// directories stay).
inline constexpr size_t kMaxPendingDeletesPerNode = 10000;

class Coordinator {
 public:
  // `clock` and `store` must outlive the coordinator.
  Coordinator(CoordinatorOptions options, Clock* clock, JobStore* store);

  // Reloads jobs and nodes from the store. Call once before serving.
  Status Recover();

  // Validates (InvalidArgument / PermissionDenied naming the field),
  // persists the job as PENDING and returns it (the store's error if that
  // write fails). A retry with the same non-empty request_id returns the job
  // created first.
  StatusOr<v1::Job> SubmitJob(const v1::JobSpec& spec, const std::string& request_id);
  // NotFound naming the job (a finished job that left memory is read from
  // the store; its error if that read fails).
  StatusOr<v1::Job> GetJob(const JobId& id) const;
  // OK while job `job_id` has not ended (its workers may use the store);
  // FailedPrecondition naming it once it ended, or when no such job exists
  // (deleted, or never): the store refuses its token then (the store
  // client reports FailedPrecondition as a refused session). Memory only.
  Status CheckStoreOpen(const std::string& job_id) const;
  // All jobs, oldest first; `states` empty = all. Reads the store when it
  // asks for finished jobs and some left memory (the store's error then).
  StatusOr<std::vector<v1::Job>> ListJobs(const std::vector<v1::JobState>& states) const;
  // Moves a live job to CANCELLED (agents stop its workers on their next
  // heartbeat). NotFound; FailedPrecondition if it already finished; the
  // store's error if the write fails (the job is then unchanged).
  StatusOr<v1::Job> CancelJob(const JobId& id);

  // Removes a finished job from memory and the store (GetJob then answers
  // NotFound) and tells every known node, in each heartbeat response until
  // the node acknowledges it (HeartbeatRequest.removed_job_ids; once to an
  // agent that does not), to remove the job's directory
  // (HeartbeatResponse.deleted_job_ids). Returns the job
  // as it was. NotFound; FailedPrecondition (naming the state) for a job
  // that has not finished; the store's error (nothing changed).
  StatusOr<v1::Job> DeleteJob(const JobId& id);

  // Registers (or re-registers) an agent. A new incarnation of a known node
  // means its old workers are gone: every job whose current round used the
  // node gets a "node lost: agent restarted" failure. InvalidArgument for bad
  // ids; the store's error if a write fails.
  StatusOr<v1::RegisterNodeResponse> RegisterNode(const v1::RegisterNodeRequest& request);
  // Renews the lease and applies worker reports. NotFound for an unknown
  // node (the agent re-registers); Aborted for a stale incarnation; the
  // store's error (naming the job) if persisting a job's change failed.
  StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  std::vector<v1::NodeInfo> ListNodes() const;

  // For metrics, from memory alone (never the store): the jobs in memory
  // (every live one and the most recent finished ones) and, by state, the
  // finished jobs that left memory.
  struct JobsSummary {
    std::vector<v1::Job> in_memory;
    std::map<v1::JobState, int64_t> left_memory_by_state;
  };
  JobsSummary SummarizeJobs() const;

  // Sets the LOCKSTEP_STORE address handed to workers (known only once the
  // server bound its port). Overrides options.store_address.
  void SetStoreAddress(const std::string& address);

  // Drives time: stall compensation, lease expiry, round opening and
  // closing, restart backoff. Call every ~100 ms (the daemon) or after
  // FakeClock::Advance (tests).
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
  struct JobEntry {
    JobDraft current;
    int64_t version = 1;
    // When a failed write of this job was last logged (a retried change
    // is said again after kPersistErrorLogInterval, per job).
    std::optional<MonoTime> persist_error_logged;
  };
  static constexpr Duration kPersistErrorLogInterval = std::chrono::seconds(5);
  struct Watch {
    std::string job_id;
    int64_t after_version;
    JobCallback cb;
  };
  // Work for after the lock: watch callbacks and store namespace drops.
  struct Effects {
    std::vector<std::pair<JobCallback, std::pair<v1::Job, int64_t>>> notify;
    std::vector<std::string> drop_prefixes;
    std::vector<std::string> closed_jobs;
  };

  // What computes a change again after its write failed.
  enum class Retry { kNone, kEveryTick, kNextReport };
  // Persists `next` (the new value of job `id`) if the Job changed, then
  // logs next.changes and applies it; on a failed write logs that with the
  // job id (rate-limited when the change is retried), returns it and
  // changes nothing. Collects the watches and store drops it causes.
  Status Commit(const std::string& id, JobDraft next, Effects* effects,
                Retry retry = Retry::kNone) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails every job whose current round used `node_id` (its agent
  // restarted); the first persistence error.
  Status NodeLost(const std::string& node_id, const std::string& reason, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Registers the node (its earlier incarnation's rounds failed first);
  // the first persistence error of its job reports goes to `reports`.
  Status RegisterLocked(const v1::RegisterNodeRequest& request, Effects* effects, Status* reports)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies an agent's job reports; the first persistence error.
  Status ApplyReports(const std::string& node_id, const NodeTable::Reports& reports,
                      int64_t sent_mono_ns, Effects* effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<v1::AgentCommand> CommandsFor(const std::string& node_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::RoundAssignment AssignmentFor(const v1::Job& job, int node_rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run(Effects* effects) ABSL_LOCKS_EXCLUDED(mu_);
  // A job in memory, or a finished one read back from the store, with its
  // version (NotFound naming it).
  StatusOr<std::pair<v1::Job, int64_t>> FindJob(const std::string& id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DeleteJob's work for a finished `job`; `why` goes into the log line.
  Status DeleteLocked(const v1::Job& job, absl::string_view why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops job `id` from finished_by_time_ (it finished at `finished_unix_ms`).
  void ForgetFinished(int64_t finished_unix_ms, const std::string& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes the jobs that finished before options_.finished_job_retention;
  // stops at the first failed delete (retried on the next sweep).
  void SweepRetention() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the oldest finished jobs from memory beyond
  // options_.finished_jobs_in_memory (they stay in the store).
  void EvictFinished() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoordinatorOptions options_;
  Clock* const clock_;
  JobStore* const store_;
  const JobMachine machine_;
  Logger log_{"coordinator"};

  mutable Mutex mu_;
  NodeTable nodes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, JobEntry> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> job_order_ ABSL_GUARDED_BY(mu_);  // submit order
  // Finished jobs that left memory: id -> last version; request id -> id.
  std::map<std::string, int64_t> evicted_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> evicted_requests_ ABSL_GUARDED_BY(mu_);
  std::map<v1::JobState, int64_t> evicted_by_state_ ABSL_GUARDED_BY(mu_);
  // Every finished job (in memory or not) by finished_unix_ms, for retention.
  std::multimap<int64_t, std::string> finished_by_time_ ABSL_GUARDED_BY(mu_);
  MonoTime next_retention_sweep_ ABSL_GUARDED_BY(mu_){};
  // node -> deleted job ids it has not acknowledged (kept in the job store
  // too, so a restart resends them).
  std::map<std::string, std::set<std::string>> deleted_for_node_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, Watch> watches_ ABSL_GUARDED_BY(mu_);
  int64_t next_watch_ ABSL_GUARDED_BY(mu_) = 1;
  std::string store_address_ ABSL_GUARDED_BY(mu_);
  // Job.health from the workers' reports (not persisted: rebuilt from them).
  HealthTracker health_ ABSL_GUARDED_BY(mu_){options_.hang_threshold};
};

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_COORDINATOR_H_
