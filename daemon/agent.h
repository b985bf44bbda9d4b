// Agent core: supervises this node's workers as the coordinator directs.
// Plain C++ (no gRPC): the coordinator is behind CoordinatorClient, the OS
// behind ProcessLauncher, time behind Clock.
//
// Loop (RunOnce, every kPollInterval from the agent thread):
//   1. reap workers; escalate stops past their grace to SIGKILL;
//   2. when a heartbeat is due: report every job's workers, renew the
//      lease, apply the commands (register first, with a fresh incarnation
//      per agent start; re-register on NotFound);
//   3. self-fence: if no heartbeat succeeded for lease/2 (measured from
//      the *send* time of the last successful one, on this host's monotonic
//      clock), stop every worker. The coordinator declares the node dead
//      only after a full lease from the *receipt* of that heartbeat, so our
//      workers are stopped before their ranks can be handed out again.
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
// thread-safe and never block on workers or the network.
#ifndef LOCKSTEP_DAEMON_AGENT_H_
#define LOCKSTEP_DAEMON_AGENT_H_

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/logging.h"
#include "common/status.h"
#include "daemon/coordinator_client.h"
#include "daemon/process_launcher.h"
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

struct AgentOptions {
  std::string node_id;
  std::string hostname;
  std::string agent_address;  // host:port of this node's AgentService
  std::string state_dir;      // logs under <state_dir>/jobs
  std::string run_as;         // default user for workers (never root)
  std::vector<std::string> allowed_commands;
  // Environment every worker inherits before the job's and Lockstep's
  // variables ("K=V"); the daemon passes its own environment.
  std::vector<std::string> base_env;
  // The cluster admin token. Workers never get it: they get
  // LOCKSTEP_STORE_TOKEN = JobStoreToken(admin_token, job), which opens only
  // their job's store namespaces. Default: empty (no store token set).
  std::string admin_token;
  Duration rpc_timeout = kDefaultRpcTimeout;
  // Used until the coordinator's RegisterNode response says otherwise.
  Duration heartbeat_interval = std::chrono::seconds(1);
  Duration lease = std::chrono::seconds(10);
};

struct LogChunk {
  std::string data;
  int64_t next_offset = 0;
  bool worker_done = false;
  std::string path;
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
  void SetAgentAddress(const std::string& address) { agent_address_ = address; }

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
  StatusOr<LogChunk> ReadLogs(const std::string& job_id, int rank, bool stderr_stream,
                              int64_t offset, int64_t tail_bytes, int64_t max_bytes) const;
  // Current worker statuses; `job_id` empty = all jobs.
  std::vector<v1::AgentJobReport> ListWorkers(const std::string& job_id) const;

 private:
  struct Worker {
    int rank = 0;
    int local_rank = 0;
    std::unique_ptr<Process> process;
    v1::WorkerStatus status;
    bool has_progress = false;
  };
  struct JobRun {
    v1::JobSpec spec;
    v1::RoundAssignment assignment;
    std::string progress_token;
    std::vector<Worker> workers;
    bool stopping = false;
    bool killed = false;
    MonoTime kill_at;
    bool final_reported = false;  // a heartbeat carried its terminal state
  };

  void Reap();                                              // REQUIRES: mu_ held
  void StopRun(const std::string& job_id, JobRun* run, Duration grace,
               const std::string& why);                      // REQUIRES: mu_ held
  void StartRun(const v1::AgentCommand& cmd);                // REQUIRES: mu_ held
  void ApplyCommands(const v1::HeartbeatResponse& resp);     // REQUIRES: mu_ held
  std::vector<v1::AgentJobReport> Reports() const;          // REQUIRES: mu_ held
  bool RunDone(const JobRun& run) const;
  void Register();
  void Heartbeat();
  void StopAllAndReap(Duration grace);
  std::string LogPath(const std::string& job_id, int rank, bool stderr_stream) const;

  const AgentOptions options_;
  Clock* const clock_;
  ProcessLauncher* const launcher_;
  CoordinatorClient* const coordinator_;
  std::string incarnation_;
  std::string agent_address_;
  Logger log_{"agent"};

  // Loop-thread state.
  Duration heartbeat_interval_;
  Duration lease_;
  std::optional<MonoTime> last_renewed_;
  MonoTime next_heartbeat_;
  bool fenced_ = false;
  std::atomic<bool> registered_{false};

  mutable std::mutex mu_;
  std::map<std::string, JobRun> runs_;                      // GUARDED_BY(mu_)
  std::map<std::string, v1::AgentCommand> pending_starts_;  // GUARDED_BY(mu_)

  std::atomic<bool> stop_{false};
  Duration shutdown_grace_ = std::chrono::seconds(10);  // written before stop_
  std::thread thread_;
};

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_AGENT_H_
