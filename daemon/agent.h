// Agent core: supervises this node's workers as the coordinator directs.
// Plain C++ (no gRPC): the coordinator is behind CoordinatorClient, the OS
// behind ProcessLauncher, time behind Clock.
//
// Loop (RunOnce, every kPollInterval from the agent thread):
//   1. reap workers; escalate stops past their grace to SIGKILL;
//   2. when a heartbeat is due: report every job's workers, renew the
//      lease, apply the commands (register first, with a fresh incarnation
//      per agent start; re-register on NotFound);
//   3. self-fence: if no heartbeat succeeded for a lease (measured from
//      the *send* time S of the last successful one, on this host's
//      monotonic clock), stop every worker: SIGTERM, SIGKILL after
//      min(stop grace, lease/4). The agent also keeps the node's fence page
//      (common/worker_link.h) at S + lease + lease/4: a worker that links
//      the engine kills itself past it, even when this agent is frozen and
//      stops nobody. The coordinator declares the node dead a lease after
//      the *receipt* R >= S of that heartbeat and reassigns its ranks only
//      after R + lease + lease/4 + 1 s (its fence deadline), so a rank
//      never has two live owners. Holding the workers for a whole lease
//      (not less) is what lets them ride out a coordinator outage shorter
//      than the lease.
//
// Exits are reported at once: each worker's exit watcher wakes the loop,
// which reaps and heartbeats in the same iteration. Each exit carries the
// instant it happened on this host's monotonic clock (exited_mono_ns) and
// each request its send instant, so the coordinator orders exits of
// different nodes on its own clock.
//
// Commands are level-triggered (see Coordinator): START(job, round) is a
// no-op when that round already runs here (or ran: a round is never
// respawned); a newer round first stops the old workers and starts only
// once they are all reaped, so a rank never runs twice on a node; jobs not
// listed are stopped (SIGTERM to each worker's process group, SIGKILL after
// the spec's stop grace).
//
// Logs: <state_dir>/jobs/<job>/rank-<r>.{stdout,stderr}, appended across
// rounds with a header line per round.
//
// Thread safety: RunOnce is called from one thread (the launcher needs a
// long-lived thread; see ProcessLauncher); the other methods are
// thread-safe and never block on workers or the network. Nothing sleeps
// while holding mu_.
#ifndef LOCKSTEP_DAEMON_AGENT_H_
#define LOCKSTEP_DAEMON_AGENT_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/worker_env.h"
#include "common/worker_link.h"
#include "daemon/coordinator_client.h"
#include "daemon/fence_guard.h"
#include "daemon/process_launcher.h"
#include "daemon/uid_lease.h"
#include "daemon/uid_leftovers.h"
#include "daemon/cleaner.h"
#include "lockstep/v1/common.pb.h"

namespace lockstep {
namespace daemon {

// How often the agent loop reaps workers and checks timers.
inline constexpr Duration kPollInterval = std::chrono::milliseconds(100);
// Deadline of one Register/Heartbeat RPC.
inline constexpr Duration kDefaultRpcTimeout = std::chrono::seconds(2);
// Lines of a failed worker's output kept in its ExitInfo.
inline constexpr int kLastLogLines = 20;
// Cap of one ReadLogs chunk.
inline constexpr int64_t kMaxLogChunkBytes = 1 << 20;
// The largest progress report a worker may send (ReportProgress;
// InvalidArgument beyond): every heartbeat carries each worker's last one,
// and kMaxProcPerNode (256) of them must fit one message with room to
// spare. 64 KiB holds about 7,000 bucket waits.
inline constexpr size_t kMaxProgressBytes = 64 * 1024;
// How often the agent measures live workers' log files against
// max_log_bytes and looks for processes workers left behind (orphans.h).
inline constexpr Duration kHousekeepingInterval = std::chrono::seconds(1);

struct AgentOptions {
  std::string node_id;
  std::string hostname;
  std::string agent_address;  // host:port of this node's AgentService
  std::string state_dir;      // logs under <state_dir>/jobs
  std::string run_as;         // default user for workers (never root)
  // Nonzero: each job's workers on this node run as a uid of their own from
  // [job_uid_first, job_uid_last] (gid the same number), allocated when its
  // first worker starts and returned when the agent forgets the job (or
  // stops), after every process of that uid is killed, the job dir is given
  // back to root and the uid's leftovers are removed: on a thread of its own
  // (cleaner.h), so a job that left a million files stalls no
  // heartbeat. A uid an earlier daemon left unclean is cleaned before it is
  // handed out. run_as is then not used. Needs a root agent.
  uint32_t job_uid_first = 0;
  uint32_t job_uid_last = 0;
  // Where the host-wide leases on those uids are taken (uid_lease.h), so
  // that no other lockstepd on the host gives a job the same uid.
  std::string uid_lease_dir = kDefaultUidLeaseDir;
  // When a job's uid is returned, what it owns under these dirs goes, with
  // its System V IPC objects (uid_leftovers.h).
  std::vector<std::string> uid_leftover_dirs = DefaultLeftoverDirs();
  // With job uids: a job's RLIMIT_NPROC (every process and thread of its
  // uid on this node) when its spec sets none, and the most it may set (a
  // higher limits.max_processes fails its launch, naming both). 0: none of
  // the node's. lockstepd: --max-processes.
  int64_t max_job_processes = 0;
  // The kernel log a SIGKILL the agent did not send is looked up in
  // (oom.h); empty: none, the worker's memory cgroup's OOM kill count
  // alone says. lockstepd: --kernel-log.
  std::string kernel_log = "/dev/kmsg";
  // Called on the cleaner's thread before each piece of its work, named
  // ("uid 70001", or a deleted job's dir); tests hold it there. Default:
  // none.
  std::function<void(const std::string& what)> before_clean;
  std::vector<std::string> allowed_commands;
  // Names or PREFIX* a job's env may set beyond the engine's (job_env.h).
  std::vector<std::string> allowed_env;
  // Environment every worker inherits before the job's and Lockstep's
  // variables ("K=V"); the daemon passes its own environment.
  std::vector<std::string> base_env;
  Duration rpc_timeout = kDefaultRpcTimeout;
  // Used until the coordinator's RegisterNode response says otherwise.
  Duration heartbeat_interval = std::chrono::seconds(1);
  Duration lease = std::chrono::seconds(10);
  // Called once per worker exit the agent reaps, with the job id and the
  // worker's final status (state EXITED or STOPPED, exit filled in); on the
  // agent's loop thread under its lock, so it must not block or call the
  // agent. Default: none. lockstepd counts exits for /metrics with it.
  std::function<void(const std::string& job_id, const v1::WorkerStatus& worker)> on_worker_exit;
  // The TLS material every worker gets (common/worker_env.h,
  // LOCKSTEP_TLS_*_PEM), asked for at each launch so a renewed certificate
  // reaches the next workers; an error fails that launch. Default: none
  // (workers without TLS).
  std::function<StatusOr<WorkerTlsPem>()> worker_tls;
  // A live worker's stdout or stderr file that has grown past this many
  // bytes is rotated, looked at every kHousekeepingInterval: moved to
  // rank-R.stdout.1 (replacing the previous one) and emptied
  // (log_files.h, RotateLog), so one job's output cannot fill the state
  // dir's disk. 0: never. lockstepd: --max-log-mb.
  int64_t max_log_bytes = 0;
  // A guard process (fence_guard.h) SIGKILLs, at the fence deadline, the
  // process group of every worker still running: it stops the workers of a
  // frozen agent that do not fence themselves (programs without the
  // engine). Tests of rules unrelated to it may turn it off.
  bool fence_guard = true;
};

// Who ended a worker, as far as the agent can tell.
enum class ExitCause {
  kItself,          // by itself, or a signal from outside the agent
  kStoppedByAgent,  // it exited after the agent signalled it (stop, restart, cancel)
  // A signal death of a worker whose engine had given up on a lost peer
  // before the agent signalled the stop (its own exit, cut short).
  kGaveUpBeforeStop,
  kOomKiller,   // the kernel's OOM killer sent the signal (oom.h)
  kFenceGuard,  // the node's fence guard sent it (fence_guard.h)
};

// How the agent's log line words a worker's exit: "exited with code 1
// by itself (not stopped by the agent)", "killed by signal 9, not by the
// agent (by the worker itself or from outside)", "killed by signal 15
// (stopped by the agent)", "killed by signal 9 by the kernel's OOM killer
// (out of memory)", "killed by signal 9 by this node's fence guard (...)".
std::string DescribeWorkerExit(int exit_code, int signal, ExitCause cause);

struct LogChunk {
  std::string data;
  int64_t next_offset = 0;
  bool worker_done = false;
  std::string path;
  // Which rotation of the file next_offset counts in (opaque; the reader
  // passes it back), and whether the reader's place was lost to rotations
  // (ReadLogs).
  std::string generation;
  bool rotated_past = false;
};

class Agent {
 public:
  // `clock`, `launcher` and `coordinator` must outlive the agent.
  Agent(AgentOptions options, Clock* clock, ProcessLauncher* launcher,
        CoordinatorClient* coordinator);
  ~Agent();

  // One loop iteration (see above). Call from one long-lived thread.
  void RunOnce();
  // Runs RunOnce every kPollInterval on an owned thread until Shutdown.
  void Start();
  // Stops the loop, then stops every worker (SIGTERM, `grace`, SIGKILL)
  // and reaps them, on the loop thread (see ProcessLauncher on
  // PDEATHSIG). Blocks for at most grace + 1 s plus one loop iteration.
  void Shutdown(Duration grace);

  // Sets the address workers and the coordinator use to reach this agent,
  // known only once the server bound its port. REQUIRES: before Start.
  void SetAgentAddress(const std::string& address);

  // True once the coordinator accepted a registration.
  bool registered() const { return registered_.load(); }
  const std::string& incarnation() const { return incarnation_; }

  // A worker's progress. PermissionDenied: wrong progress token; Aborted:
  // stale round; NotFound: no such job/rank here.
  Status ReportProgress(const std::string& job_id, int round, const std::string& token,
                        const v1::RankProgress& progress);
  // Reads a rank's captured output. InvalidArgument: a job id that is not
  // a safe path component, a negative rank; NotFound: no output for that
  // job and rank on this node.
  //
  // `generation`: the one the reader's last chunk came with (empty on its
  // first read). A file rotated once since (CapLogs) is read on from
  // `offset` in `path`.1, which holds what the file held, then from the
  // start of the file; rotated more than once, or by an earlier agent
  // process, from the start of the file with rotated_past set.
  StatusOr<LogChunk> ReadLogs(const std::string& job_id, int rank, bool stderr_stream,
                              int64_t offset, int64_t tail_bytes, int64_t max_bytes,
                              const std::string& generation = "") const;
  // Current worker statuses; `job_id` empty = all jobs.
  std::vector<v1::AgentJobReport> ListWorkers(const std::string& job_id) const;
  // The cleaner's backlog (cleaner.h): metrics.
  Cleaner::Backlog CleanerBacklog() const { return cleaner_->Stats(); }
  // The fence guard (fence_guard.h), for metrics: whether one runs, and how
  // often one that ended was started again. Thread safe.
  struct GuardState {
    bool up = false;
    int64_t restarts = 0;
  };
  GuardState FenceGuardState() const { return {guard_up_.load(), guard_restarts_.load()}; }
  // This node's log key (log_ticket.h) from the coordinator's latest
  // RegisterNode or Heartbeat answer, empty before the first: the log
  // tickets this agent serves its workers and logs to. Thread safe.
  std::string LogTicketKey() const {
    MutexLock lock(&key_mu_);
    return log_ticket_key_;
  }
  const std::string& node_id() const { return options_.node_id; }

 private:
  // Wakes the loop thread early (a worker exited). Shared with the exit
  // watchers, which may outlive the agent.
  struct Waker {
    Mutex mu;
    CondVar cv;
    bool woken ABSL_GUARDED_BY(mu) = false;
    void Wake() {
      MutexLock lock(&mu);
      woken = true;
      cv.Signal();
    }
    // Returns at the first Wake or after `timeout`.
    void Wait(Duration timeout) {
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      MutexLock lock(&mu);
      while (!woken && !cv.WaitWithDeadline(&mu, deadline)) {
      }
      woken = false;
    }
  };
  struct Worker {
    int rank = 0;
    int local_rank = 0;
    std::unique_ptr<Process> process;
    v1::WorkerStatus status;
    // Just before the launch (steady clock): an end instant the worker
    // wrote on its status page is believed only from here on.
    std::chrono::steady_clock::time_point launched_at;
    // Its memory cgroup, last seen (at launch and each housekeeping), and
    // the OOM kills counted there then (-1: unknown): oom.h.
    std::string oom_cgroup;
    std::string oom_file;
    int64_t oom_base = -1;
    // Its listing with the fence guard, forgotten once it is reaped.
    FenceGuard::Entry guard;
  };
  struct JobRun {
    v1::JobSpec spec;
    v1::RoundAssignment assignment;
    std::string progress_token;
    std::vector<Worker> workers;
    // Where each local rank's engine bootstrap is (startup failures).
    std::unique_ptr<worker_link::StatusPage> status_page;
    bool stopping = false;
    // When StopRun signalled the workers (steady clock): a worker that
    // exited before it died on its own, even if reaped after.
    std::chrono::steady_clock::time_point stop_signalled;
    bool killed = false;
    MonoTime kill_at;
    bool final_reported = false;  // a heartbeat carried its terminal state
  };

  void Reap() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notes live worker `w`'s memory cgroup and its OOM kill count, if the
  // cgroup is new (at launch, and each housekeeping).
  void NoteMemoryCgroup(const std::string& job_id, Worker* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether worker `w`, SIGKILLed by someone else, was the OOM killer's
  // victim by its memory cgroup's count (the kernel log unread); logs why.
  bool OomKilledByCount(const std::string& job_id, const Worker& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Has the cleaner rotate the live workers' log files past max_log_bytes
  // (each file once at a time).
  void CapLogs() ABSL_LOCKS_EXCLUDED(mu_);
  // Reaps the agent's children that are not workers (orphans it adopted as
  // a child subreaper, see orphans.h) once they exit, and SIGKILLs (with
  // their process group, if they lead one) those this agent's workers left
  // behind: their job has no live worker here in their round, or `all`
  // (the agent shutting down). Logs each.
  void SweepOrphans(bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reap's work for one job's run.
  void ReapRun(const std::string& job_id, JobRun* run, MonoTime now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopRun(const std::string& job_id, JobRun* run, Duration grace, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartRun(const v1::AgentCommand& cmd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyCommands(const v1::HeartbeatResponse& resp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<v1::AgentJobReport> Reports() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AllRunsDone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static bool RunDone(const JobRun& run);
  void Register();
  void Heartbeat();
  // Logs (rate-limited) a RegisterNode or Heartbeat response's
  // reports_not_applied, if any.
  void WarnReportsNotApplied(const std::string& why);
  // A heartbeat or registration sent at `sent` was accepted.
  void Renewed(MonoTime sent);
  void StopAllAndReap(Duration grace);
  std::string LogPath(const std::string& job_id, int rank, bool stderr_stream) const;
  // The coordinator deleted the job: removes <state-dir>/jobs/<id> unless
  // this node still runs it, and queues the id for the next heartbeat's
  // acknowledgment (removed_job_ids) unless it still runs it (the
  // coordinator then sends it again).
  void RemoveJobDir(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's uid, found by the cleaner before StartRun (TakeAcquiredUids),
  // or why there is none (ResourceExhausted naming the range).
  StatusOr<uint32_t> JobUid(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `cmd`'s job must be found a uid (Cleaner::Acquire) before it
  // starts: job uids are on and it has none yet, nor an error saying why.
  bool NeedsJobUid(const v1::AgentCommand& cmd) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the uids the cleaner found for pending starts (or why none),
  // dropping those for starts no longer pending.
  void TakeAcquiredUids() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // At start: the uids that still own job dirs of this state dir (a daemon
  // killed before it returned them) go to the cleaner, if no one holds
  // them; it gives those dirs back to root and removes the uids' leftovers.
  void ReclaimStaleJobUids();
  // Housekeeping: a fence guard process that ended is started again.
  void KeepGuard();
  // Hands the job's uid to the cleaner, which kills what still runs as
  // it, gives its dir back to root, removes its leftovers and frees it.
  void ReleaseJobUid(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const AgentOptions options_;
  Clock* const clock_;
  ProcessLauncher* const launcher_;
  CoordinatorClient* const coordinator_;
  std::string incarnation_;
  std::string agent_address_;
  Logger log_{"agent"};
  // While the coordinator cannot be reached each try would warn again: at
  // most one warning per interval, each agent its own.
  RateLimiter register_warning_{std::chrono::seconds(5)};
  RateLimiter heartbeat_warning_{std::chrono::seconds(2)};
  RateLimiter reports_warning_{std::chrono::seconds(10)};
  RateLimiter rotate_warning_{std::chrono::seconds(10)};
  RateLimiter guard_warning_{std::chrono::seconds(60)};
  MonoTime next_housekeeping_{};  // agent thread only

  // The node's fence page, inherited by every worker.
  worker_link::FencePage fence_;
  // Kills, past the fence deadline, the workers this agent cannot stop
  // while it is frozen; null when off or when it could not start. Declared
  // before runs_, whose workers' listings it must outlive.
  std::unique_ptr<FenceGuard> guard_;
  std::atomic<bool> guard_up_{false};
  std::atomic<int64_t> guard_restarts_{0};
  std::shared_ptr<Waker> waker_ = std::make_shared<Waker>();

  // Loop-thread state.
  Duration heartbeat_interval_;
  Duration lease_;
  std::optional<MonoTime> last_renewed_;
  MonoTime next_heartbeat_;
  bool fenced_ = false;
  std::atomic<bool> registered_{false};
  // Set on the loop thread, read by the gRPC threads.
  mutable Mutex key_mu_;
  std::string log_ticket_key_ ABSL_GUARDED_BY(key_mu_);
  // Sets log_ticket_key_ from a RegisterNode or Heartbeat answer.
  void TakeLogTicketKey(const std::string& key);

  // The workers' log files' rotations (CapLogs), for followers (ReadLogs):
  // per job, per (rank, is_stderr), how many so far and whether the last
  // kept its copy in the file's .1. A rotation empties a file under
  // logs_mu_ and ReadLogs reads under it, so a chunk and its generation
  // agree. Taken after mu_, never before it.
  struct LogGeneration {
    int64_t rotations = 0;
    bool kept = false;
  };
  mutable Mutex logs_mu_;
  std::map<std::string, std::map<std::pair<int, bool>, LogGeneration>> log_generations_
      ABSL_GUARDED_BY(logs_mu_);
  // Names this process's generations: another agent's counts start again.
  const std::string logs_instance_;
  std::string GenerationName(int64_t rotations) const;

  mutable Mutex mu_;
  std::map<std::string, JobRun> runs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, v1::AgentCommand> pending_starts_ ABSL_GUARDED_BY(mu_);
  // Per OOM counter file: the count up to which kills were given to
  // workers (one kill, one worker).
  std::map<std::string, int64_t> oom_kills_given_ ABSL_GUARDED_BY(mu_);
  // Deleted jobs whose directories are gone, for the next accepted heartbeat
  // to acknowledge; and those kept because they still ran (logged once).
  std::set<std::string> removed_job_ids_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> deletion_deferred_ ABSL_GUARDED_BY(mu_);
  // Job -> its leased uid on this node (options_.job_uid_first..last).
  std::map<std::string, UidLease> job_uids_ ABSL_GUARDED_BY(mu_);
  // Why no uid could be found for a pending start, until StartRun says so.
  std::map<std::string, Status> uid_errors_ ABSL_GUARDED_BY(mu_);
  // Returns uids off the loop thread (thread-safe itself).
  std::unique_ptr<Cleaner> cleaner_;

  std::atomic<bool> stop_{false};
  Duration shutdown_grace_ = std::chrono::seconds(10);  // written before stop_
  std::thread thread_;
};

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_AGENT_H_
