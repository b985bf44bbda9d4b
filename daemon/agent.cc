#include "daemon/agent.h"

#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <chrono>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/address.h"
#include "common/ids.h"
#include "common/worker_env.h"
#include "daemon/job_env.h"
#include "daemon/job_spec.h"
#include "daemon/log_files.h"
#include "daemon/oom.h"
#include "daemon/orphans.h"
#include "daemon/straggler.h"
#include "daemon/token.h"
#include "daemon/uid_leftovers.h"

namespace lockstep {
namespace daemon {
namespace {

bool IsLive(const v1::WorkerStatus& s) {
  return s.state() == v1::WORKER_STATE_STARTING || s.state() == v1::WORKER_STATE_RUNNING;
}

Status MakeDirs(const std::string& path) {
  std::string cur;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part.empty()) {
      if (cur.empty()) cur = "/";
      continue;
    }
    if (!cur.empty() && cur.back() != '/') cur += '/';
    cur += std::string(part);
    if (::mkdir(cur.c_str(), 0750) != 0 && errno != EEXIST) {
      return absl::UnavailableError(absl::StrCat("mkdir ", cur, ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

// Up to `n` bytes of the open file `fd` from `offset`.
std::string ReadAt(int fd, int64_t offset, int64_t n) {
  std::string data(static_cast<size_t>(std::max<int64_t>(0, n)), '\0');
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t r = ::pread(fd, data.data() + got, data.size() - got, offset + got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  data.resize(got);
  return data;
}

// The last `n` lines after the last "=== lockstep" header of a log file
// (none from anything but a regular file: log_files.h).
std::vector<std::string> TailLines(const std::string& path, int n) {
  StatusOr<int> fd = OpenLogForRead(path);
  if (!fd.ok()) return {};
  struct stat st;
  std::string data;
  if (::fstat(*fd, &st) == 0) {
    const int64_t start = std::max<int64_t>(0, st.st_size - 16384);
    data = ReadAt(*fd, start, st.st_size - start);
  }
  ::close(*fd);
  auto header = data.rfind("=== lockstep");
  if (header != std::string::npos) {
    auto eol = data.find('\n', header);
    data = eol == std::string::npos ? "" : data.substr(eol + 1);
  }
  std::vector<std::string> lines = absl::StrSplit(data, '\n', absl::SkipEmpty());
  if (static_cast<int>(lines.size()) > n) lines.erase(lines.begin(), lines.end() - n);
  return lines;
}

// The wall-clock time of an exit seen on the monotonic clock.
int64_t ExitedUnixMs(const ExitStatus& e) {
  using namespace std::chrono;
  const auto ago = e.exited_at.time_since_epoch().count() == 0
                       ? steady_clock::duration::zero()
                       : std::max(steady_clock::duration::zero(), steady_clock::now() - e.exited_at);
  return duration_cast<milliseconds>((system_clock::now() - ago).time_since_epoch()).count();
}

// A port that is free on `host` now: bound with port 0 and read back (and
// released, so the worker can bind it; torchrun's agent does the same).
StatusOr<int> PickFreePort(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), "0", &hints, &found);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("MASTER_PORT: cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  std::string why = "no address";
  int port = 0;
  for (addrinfo* ai = found; ai != nullptr && port == 0; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0) {
      port = NumericPort(bound);
    } else {
      why = std::strerror(errno);
    }
    close(fd);
  }
  freeaddrinfo(found);
  if (port == 0) {
    return absl::UnavailableError(absl::StrCat("MASTER_PORT: no free port on ", host, ": ", why));
  }
  return port;
}

}  // namespace

std::string DescribeWorkerExit(int exit_code, int signal, ExitCause cause) {
  switch (cause) {
    case ExitCause::kFenceGuard:
      return absl::StrCat("killed by signal ", signal,
                          " by this node's fence guard (the agent had not renewed its lease by "
                          "the fence deadline: it was frozen or cut off)");
    case ExitCause::kOomKiller:
      return absl::StrCat("killed by signal ", signal,
                          " by the kernel's OOM killer (out of memory)");
    case ExitCause::kGaveUpBeforeStop:
      return absl::StrCat("killed by signal ", signal,
                          " after its engine had given up on a lost peer, before the agent's stop"
                          " (counted as its own exit)");
    case ExitCause::kStoppedByAgent:
      return absl::StrCat(signal ? absl::StrCat("killed by signal ", signal)
                                 : absl::StrCat("exited with code ", exit_code),
                          " (stopped by the agent)");
    case ExitCause::kItself:
      break;
  }
  // The agent signals workers only to stop them: any other signal came from
  // the worker itself or from another process (an OOM kill, a user's kill).
  if (signal) {
    return absl::StrCat("killed by signal ", signal,
                        ", not by the agent (by the worker itself or from outside)");
  }
  return absl::StrCat("exited with code ", exit_code, " by itself (not stopped by the agent)");
}

Agent::Agent(AgentOptions options, Clock* clock, ProcessLauncher* launcher,
             CoordinatorClient* coordinator)
    : options_(std::move(options)),
      clock_(clock),
      launcher_(launcher),
      coordinator_(coordinator),
      incarnation_(NewRandomId("inc-")),
      agent_address_(options_.agent_address),
      heartbeat_interval_(options_.heartbeat_interval),
      lease_(options_.lease),
      next_heartbeat_(clock->Now()),
      logs_instance_(NewRandomId("logs-")) {
  if (!BecomeChildSubreaper()) {
    log_.Warn("cannot become the child subreaper ({}): processes a worker leaves running in a "
              "session of its own are not stopped with it",
              std::strerror(errno));
  }
  CleanerOptions cleaning;
  cleaning.state_dir = options_.state_dir;
  cleaning.leftover_dirs = options_.uid_leftover_dirs;
  cleaning.before_clean = options_.before_clean;
  cleaning.on_acquired = [waker = waker_] { waker->Wake(); };
  cleaner_ = std::make_unique<Cleaner>(std::move(cleaning));
  Status fence = fence_.Create();
  if (!fence.ok()) {
    log_.Error("no fence page ({}): a frozen agent's workers will not stop themselves",
               fence.ToString());
  } else if (options_.fence_guard) {
    auto guard = FenceGuard::Start(&fence_);
    if (guard.ok()) {
      guard_ = *std::move(guard);
      guard_->SetAgent(agent_address_);
      // A frozen agent's cleaner cannot end its job uids' processes: the
      // guard kills those in its tree whose environment it cannot read.
      guard_->SetJobUids(options_.job_uid_first, options_.job_uid_last);
      guard_up_ = true;
    } else {
      log_.Error("{}: a frozen agent's workers that do not link the engine will not be stopped",
                 guard.status().ToString());
    }
  }
  ReclaimStaleJobUids();
}

void Agent::ReclaimStaleJobUids() {
  if (options_.job_uid_first == 0) return;
  const std::string jobs = absl::StrCat(options_.state_dir, "/jobs");
  std::set<uint32_t> owners;
  for (const auto& [name, uid] : EntryOwners(jobs)) {
    if (uid >= options_.job_uid_first && uid <= options_.job_uid_last) owners.insert(uid);
  }
  UidLeases leases(options_.uid_lease_dir, options_.job_uid_first, options_.job_uid_last);
  for (const uint32_t uid : owners) {
    StatusOr<UidLease> lease = leases.Take(uid);
    if (!lease.ok()) {
      log_.Warn("a job dir under {} is still uid {}'s, which cannot be cleaned now: {}", jobs, uid,
                lease.status().ToString());
      continue;
    }
    log_.Warn("job dirs under {} are still uid {}'s (this daemon stopped before returning it): "
              "cleaning it",
              jobs, uid);
    cleaner_->Reclaim(*std::move(lease), "");
  }
}

Agent::~Agent() {
  if (thread_.joinable()) Shutdown(std::chrono::seconds(1));
}

StatusOr<uint32_t> Agent::JobUid(const std::string& job_id) {
  auto it = job_uids_.find(job_id);
  if (it != job_uids_.end()) return it->second.uid();
  auto error = uid_errors_.find(job_id);
  if (error == uid_errors_.end()) {
    return absl::InternalError("no uid was looked for before the job's start");
  }
  Status status = std::move(error->second);
  uid_errors_.erase(error);
  return status;
}

bool Agent::NeedsJobUid(const v1::AgentCommand& cmd) const {
  return options_.job_uid_first != 0 && cmd.spec().run_as().empty() &&
         !job_uids_.count(cmd.job_id()) && !uid_errors_.count(cmd.job_id());
}

void Agent::TakeAcquiredUids() {
  for (auto& [job_id, lease] : cleaner_->TakeAcquired()) {
    // Found for a start no longer wanted: the lease goes (the uid is clean
    // and was never used).
    if (!pending_starts_.count(job_id) || job_uids_.count(job_id)) {
      if (lease.ok()) {
        log_.WithJob(job_id).Info("uid {}, found for a start no longer wanted here, is free again",
                                  lease->uid());
      }
      continue;
    }
    if (!lease.ok()) {
      uid_errors_[job_id] = lease.status();
      continue;
    }
    log_.WithJob(job_id).Info("workers run as uid {} (--job-uids), leased in {}", lease->uid(),
                              options_.uid_lease_dir);
    job_uids_[job_id] = *std::move(lease);
  }
  for (auto it = uid_errors_.begin(); it != uid_errors_.end();) {
    it = pending_starts_.count(it->first) ? std::next(it) : uid_errors_.erase(it);
  }
}

void Agent::ReleaseJobUid(const std::string& job_id) {
  auto it = job_uids_.find(job_id);
  if (it == job_uids_.end()) return;
  log_.WithJob(job_id).Info("uid {}: its processes, job dir and leftovers go on the cleaner's "
                            "thread; the uid is free once they are gone",
                            it->second.uid());
  cleaner_->Reclaim(std::move(it->second), job_id);
  job_uids_.erase(it);
}

void Agent::RemoveJobDir(const std::string& job_id) {
  Logger log = log_.WithJob(job_id);
  if (!IsSafeId(job_id)) {
    log.Warn("the coordinator deleted job {}: not a job id, no directory removed",
             QuoteForError(job_id));
    removed_job_ids_.insert(job_id);  // nothing to remove, ever
    return;
  }
  if (runs_.count(job_id) || pending_starts_.count(job_id)) {
    // Not acknowledged: the coordinator sends it again until the run is gone.
    if (deletion_deferred_.insert(job_id).second) {
      log.Info("the coordinator deleted the job; this node still runs it: "
               "directory kept until its workers are gone");
    }
    return;
  }
  deletion_deferred_.erase(job_id);
  {
    MutexLock logs(&logs_mu_);
    log_generations_.erase(job_id);
  }
  // Acknowledged once it is gone (the coordinator sends it until then).
  if (cleaner_->Pending(job_id)) return;
  const std::string dir = absl::StrCat(options_.state_dir, "/jobs/", job_id);
  cleaner_->RemoveJobDir(job_id, dir);
}

std::string Agent::LogPath(const std::string& job_id, int rank, bool stderr_stream) const {
  return absl::StrCat(options_.state_dir, "/jobs/", job_id, "/rank-", rank,
                      stderr_stream ? ".stderr" : ".stdout");
}

bool Agent::RunDone(const JobRun& run) {
  for (const auto& w : run.workers) {
    if (IsLive(w.status)) return false;
  }
  return true;
}

void Agent::StartRun(const v1::AgentCommand& cmd) {
  next_heartbeat_ = clock_->Now();  // report the new workers promptly
  const std::string& job_id = cmd.job_id();
  Logger log = log_.WithJob(job_id);
  JobRun& run = runs_[job_id];
  run = JobRun();
  run.spec = cmd.spec();
  run.assignment = cmd.assignment();
  // What this job's earlier rounds left running outside their workers'
  // groups goes before this round's workers start (not at the next
  // housekeeping): a helper of round N must not run beside round N+1's
  // worker of its rank.
  SweepOrphans(/*all=*/false);
  run.progress_token = NewSecret("pt-");
  const v1::RoundAssignment& a = cmd.assignment();
  int nproc = std::max(1, a.nproc_per_node());
  run.status_page = std::make_unique<worker_link::StatusPage>();
  if (Status page = run.status_page->Create(nproc); !page.ok()) {
    log.Warn("no status page ({}): startup failures of this run cannot be told apart", page.ToString());
    run.status_page.reset();
  }

  Status ok = IsSafeId(job_id) ? ValidateJobSpec(cmd.spec(), options_.allowed_commands)
                               : absl::InvalidArgumentError(absl::StrCat(
                                     "job id \"", job_id, "\" is not a safe path component"));
  if (ok.ok()) {
    ok = CheckJobEnv(cmd.spec(), {options_.allowed_env, !options_.allowed_commands.empty()});
  }
  std::string dir = absl::StrCat(options_.state_dir, "/jobs/", job_id);
  if (ok.ok()) ok = MakeDirs(dir);
  std::string run_as = cmd.spec().run_as().empty() ? options_.run_as : cmd.spec().run_as();
  uint32_t job_uid = 0;
  // A job uid's processes and threads: the node's cap unless the job asks
  // for fewer.
  int64_t max_processes = cmd.spec().limits().max_processes();
  if (ok.ok() && options_.job_uid_first != 0 && options_.max_job_processes > 0) {
    if (max_processes == 0) {
      max_processes = options_.max_job_processes;
    } else if (max_processes > options_.max_job_processes) {
      ok = absl::PermissionDeniedError(absl::StrCat(
          "spec.limits.max_processes ", max_processes, " is above this node's ",
          options_.max_job_processes, " processes and threads per job (lockstepd --max-processes)"));
    }
  }
  if (ok.ok() && options_.job_uid_first != 0) {
    if (!cmd.spec().run_as().empty()) {
      ok = absl::PermissionDeniedError(absl::StrCat(
          "run_as \"", cmd.spec().run_as(), "\": this node runs each job as a uid of its own "
          "(--job-uids ", options_.job_uid_first, "-", options_.job_uid_last, ")"));
    } else {
      auto uid = JobUid(job_id);
      if (uid.ok()) {
        job_uid = *uid;
      } else {
        ok = uid.status();
      }
    }
  } else if (ok.ok() && !options_.run_as.empty() && run_as != options_.run_as) {
    ok = absl::PermissionDeniedError(absl::StrCat("run_as \"", run_as, "\": this node runs workers only as \"",
                                                  options_.run_as, "\" (--run-as)"));
  }

  WorkerTlsPem tls;
  if (ok.ok() && options_.worker_tls) {
    auto read = options_.worker_tls();
    if (read.ok()) {
      tls = *std::move(read);
    } else {
      ok = read.status();
    }
  }

  // Node rank 0 hosts MASTER_PORT: it picks a free one for this round and
  // reports it; the coordinator starts the other nodes once it knows it.
  if (ok.ok() && a.node_rank() == 0 && a.master_port() == 0) {
    auto port = PickFreePort(a.master_addr().empty() ? HostOfAddress(agent_address_)
                                                     : a.master_addr());
    if (port.ok()) {
      run.assignment.set_master_port(*port);
    } else {
      ok = port.status();
    }
  }

  std::map<std::string, std::string> base;
  for (const auto& kv : options_.base_env) {
    auto eq = kv.find('=');
    if (eq != std::string::npos) base[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : cmd.spec().env()) base[k] = v;
  // The daemon's shell leftovers describe its own session, not a worker's
  // (each worker's PWD is set to its working dir below).
  for (const char* stale : {"PWD", "OLDPWD", "SHLVL", "_"}) base.erase(stale);
  // torchrun's habit: one OpenMP thread per worker unless the job or the
  // daemon says otherwise, so N workers on a host do not start N x cores.
  if (base.find("OMP_NUM_THREADS") == base.end()) {
    base["OMP_NUM_THREADS"] = "1";
    log.Info("OMP_NUM_THREADS=1 for its workers: neither the job nor the daemon set it "
             "(submit --env OMP_NUM_THREADS=N to change it)");
  }

  for (int local = 0; local < nproc; ++local) {
    Worker w;
    w.rank = a.node_rank() * nproc + local;
    w.local_rank = local;
    w.status.set_rank(w.rank);
    w.status.set_local_rank(local);
    w.status.set_node_id(options_.node_id);
    w.status.set_round(cmd.round());
    w.status.set_stdout_path(LogPath(job_id, w.rank, false));
    w.status.set_stderr_path(LogPath(job_id, w.rank, true));
    Status launched = ok;
    if (launched.ok()) {
      std::map<std::string, std::string> env = base;
      // The worker contract: common/worker_env.h writes every name.
      WorkerEnv contract;
      contract.job_id = job_id;
      contract.rank = w.rank;
      contract.local_rank = local;
      contract.world_size = a.world_size();
      contract.local_world_size = nproc;
      contract.node_rank = a.node_rank();
      contract.num_nodes = a.num_nodes();
      contract.round = cmd.round();
      contract.restart_count = a.restart_count();
      contract.max_restarts = cmd.spec().max_restarts();
      contract.store_address = a.store_address();
      contract.store_token = cmd.store_token();
      contract.agent_address = agent_address_;
      contract.agent_token = run.progress_token;
      contract.tls = tls;
      // The node's own address: the data plane binds it (ddp/data_plane.h).
      contract.node_addr = HostOfAddress(agent_address_);
      contract.master_addr =
          JoinHostPort(a.master_addr(), std::to_string(run.assignment.master_port()));
      for (auto& [k, v] : WorkerEnvVars(contract)) env[k] = std::move(v);
      env["PWD"] = cmd.spec().working_dir().empty() ? dir : cmd.spec().working_dir();
      if (fence_.fd() >= 0) env[worker_link::kFenceFdEnv] = std::to_string(fence_.fd());
      if (run.status_page) env[worker_link::kStatusFdEnv] = std::to_string(run.status_page->fd());
      LaunchSpec spec;
      spec.argv.assign(cmd.spec().command().begin(), cmd.spec().command().end());
      for (const auto& [k, v] : env) spec.env.push_back(k + "=" + v);
      spec.working_dir = cmd.spec().working_dir().empty() ? dir : cmd.spec().working_dir();
      spec.own_working_dir = cmd.spec().working_dir().empty();
      spec.stdout_path = w.status.stdout_path();
      spec.stderr_path = w.status.stderr_path();
      spec.max_open_files = cmd.spec().limits().max_open_files();
      spec.max_address_space = cmd.spec().limits().max_address_space();
      spec.max_cpu_seconds = cmd.spec().limits().max_cpu_seconds();
      spec.max_processes = max_processes;
      spec.run_as = run_as;
      spec.run_as_uid = job_uid;
      if (fence_.fd() >= 0) spec.inherit_fds.push_back(fence_.fd());
      if (run.status_page) spec.inherit_fds.push_back(run.status_page->fd());
      spec.on_exit = [waker = waker_] { waker->Wake(); };
      spec.log_header = absl::StrCat("=== lockstep: job ", job_id, " round ", cmd.round(),
                                     " rank ", w.rank, " restart ", a.restart_count(), " ===\n");
      w.launched_at = std::chrono::steady_clock::now();
      auto proc = launcher_->Launch(spec);
      if (proc.ok()) {
        w.process = std::move(*proc);
        w.status.set_pid(w.process->pid());
        w.status.set_state(v1::WORKER_STATE_STARTING);
        log.WithRank(w.rank).Info("spawned pid {} for round {}", w.process->pid(), cmd.round());
        if (guard_) {
          w.guard = guard_->Watch(static_cast<pid_t>(w.process->pid()), job_id, w.rank,
                                  cmd.round());
          if (!w.guard.guarded()) {
            log.WithRank(w.rank).Warn("the fence guard lists {} workers already: this one is not "
                                      "stopped by it if this agent freezes",
                                      FenceGuard::kSlots);
          }
        }
        NoteMemoryCgroup(job_id, &w);
        run.workers.push_back(std::move(w));
        continue;
      }
      launched = proc.status();
    }
    log.WithRank(w.rank).Error("cannot start worker: {}", launched.ToString());
    w.status.set_state(v1::WORKER_STATE_EXITED);
    v1::ExitInfo* exit = w.status.mutable_exit();
    exit->set_exit_code(127);
    // Never ran, so never in the engine's bootstrap. A permanent error
    // (this node's checks above, or the launcher's) fails the job at once;
    // Unavailable (fork, log files, a free port) may pass on a restart.
    exit->set_startup_failure(false);
    exit->set_launch_error(IsPermanentLaunchError(launched));
    exit->set_message(std::string(launched.message()));
    exit->add_last_log_lines(std::string(launched.message()));
    run.workers.push_back(std::move(w));
  }
}

void Agent::StopRun(const std::string& job_id, JobRun* run, Duration grace,
                    const std::string& why) {
  if (run->stopping) return;
  // Exits that happened before this stop are the workers' own, whenever
  // they are reaped: reap them now, before the stop is signalled. The exit
  // instant alone cannot tell: its watcher thread stamps it when it runs,
  // which for an agent that was frozen (SIGSTOP, swapped out) is after the
  // agent resumed and perhaps after this stop.
  ReapRun(job_id, run, clock_->Now());
  run->stopping = true;
  // The first signal counts (a re-armed stop keeps it).
  if (run->stop_signalled == std::chrono::steady_clock::time_point()) {
    run->stop_signalled = std::chrono::steady_clock::now();
  }
  run->kill_at = clock_->Now() + grace;
  bool any = false;
  for (auto& w : run->workers) {
    if (IsLive(w.status) && w.process) {
      w.process->SignalGroup(SIGTERM);
      any = true;
    }
  }
  if (any) {
    log_.WithJob(job_id).Info("stopping workers of round {} ({}): SIGTERM, SIGKILL after {}s",
                              run->assignment.round(), why, ToSeconds(grace));
  }
}

void Agent::Reap() {
  MonoTime now = clock_->Now();
  for (auto& [job_id, run] : runs_) ReapRun(job_id, &run, now);
}

void Agent::ReapRun(const std::string& job_id, JobRun* run_ptr, MonoTime now) {
  JobRun& run = *run_ptr;
  bool escalate = run.stopping && !run.killed && now >= run.kill_at;
  for (auto& w : run.workers) {
    if (!IsLive(w.status) || !w.process) continue;
    if (escalate) w.process->SignalGroup(SIGKILL);
    std::optional<ExitStatus> e = w.process->Poll();
    if (!e) continue;
    next_heartbeat_ = now;  // report the exit promptly
    // Killed by the fence guard while this agent did not run: it died at
    // the guard's instant, not when a watcher thread of a thawed agent saw
    // it.
    const int64_t guard_killed_ns = w.guard.KilledNs();
    w.guard.Forget();
    const bool fenced = guard_killed_ns != 0 && e->signal == SIGKILL;
    if (fenced) {
      e->exited_at = std::min(e->exited_at, std::chrono::steady_clock::time_point(
                                                std::chrono::nanoseconds(guard_killed_ns)));
    }
    // A worker that exited by itself (a code, no signal) and wrote when it
    // began to end (worker_link.h: its engine gave up on a lost peer, or it
    // called exit()) ended then, not when the watcher thread saw it, which
    // for an agent resumed from a freeze can be long after, and after a
    // stop this agent signalled since. A signal death keeps the watcher's
    // instant (it may be this agent's own stop), unless the engine had
    // given up on a lost peer before this agent signalled the stop: the
    // worker was ending on its own, and the stop only cut that short.
    const int32_t slot =
        run.status_page ? run.status_page->Get(w.local_rank) : worker_link::kNotStarted;
    bool gave_up_first = false;
    if (run.status_page) {
      const std::chrono::steady_clock::time_point ended{
          std::chrono::nanoseconds(run.status_page->EndedNs(w.local_rank))};
      const bool stamped = ended >= w.launched_at && ended < e->exited_at;
      gave_up_first = stamped && e->signal != 0 && worker_link::IsPeerLost(slot) &&
                      run.stopping && ended < run.stop_signalled;
      if (stamped && (e->signal == 0 || gave_up_first)) e->exited_at = ended;
    }
    v1::ExitInfo* exit = w.status.mutable_exit();
    exit->set_exit_code(e->exit_code);
    exit->set_signal(e->signal);
    exit->set_exited_unix_ms(ExitedUnixMs(*e));
    // steady_clock is CLOCK_MONOTONIC, the clock of sent_mono_ns.
    exit->set_exited_mono_ns(
        std::chrono::duration_cast<std::chrono::nanoseconds>(e->exited_at.time_since_epoch())
            .count());
    bool failed = e->exit_code != 0 || e->signal != 0;
    // Stopped by us only if it exited after we signalled it: a rank that
    // died first (the failure that made the job stop) stays a failure
    // however late its exit is reaped.
    const bool stopped = run.stopping && e->exited_at >= run.stop_signalled;
    w.status.set_state(stopped ? v1::WORKER_STATE_STOPPED : v1::WORKER_STATE_EXITED);
    if (failed && !stopped) {
      // Died inside the engine's bootstrap; a program that does not use
      // the engine never marks its slot and is never a startup failure.
      exit->set_startup_failure(slot == worker_link::kBootstrapBegun);
      // Its collective broke because a peer was gone: a consequence.
      exit->set_peer_lost(worker_link::IsPeerLost(slot));
      if (worker_link::LostPeer(slot) >= 0) exit->set_lost_peer(worker_link::LostPeer(slot));
      std::vector<std::string> lines = TailLines(w.status.stderr_path(), kLastLogLines);
      if (lines.empty()) lines = TailLines(w.status.stdout_path(), kLastLogLines);
      for (auto& l : lines) exit->add_last_log_lines(l);
      // A SIGKILL this agent did not send: the kernel log says whether it
      // was the OOM killer's.
      if (e->signal == SIGKILL && !fenced) {
        const int64_t launched_ns =
            std::chrono::duration_cast<std::chrono::nanoseconds>(w.launched_at.time_since_epoch())
                .count();
        bool log_read = false;
        if (auto oom = FindOomKill(static_cast<pid_t>(w.process->pid()), launched_ns,
                                   options_.kernel_log, &log_read)) {
          exit->set_oom_killed(true);
          log_.WithJob(job_id).WithRank(w.rank).Warn("the kernel log: {}", *oom);
        } else if (!log_read && OomKilledByCount(job_id, w)) {
          exit->set_oom_killed(true);
        }
      }
    }
    log_.WithJob(job_id).WithRank(w.rank).Info(
        "worker pid {} {}", w.process->pid(),
        DescribeWorkerExit(e->exit_code, e->signal,
                           fenced               ? ExitCause::kFenceGuard
                           : exit->oom_killed() ? ExitCause::kOomKiller
                           : gave_up_first      ? ExitCause::kGaveUpBeforeStop
                           : stopped            ? ExitCause::kStoppedByAgent
                                                : ExitCause::kItself));
    if (options_.on_worker_exit) options_.on_worker_exit(job_id, w.status);
  }
  if (escalate) run.killed = true;
}

void Agent::NoteMemoryCgroup(const std::string& job_id, Worker* w) {
  if (!w->process || !IsLive(w->status)) return;
  std::optional<OomCounter> counter = OomCounterOfPid(static_cast<pid_t>(w->process->pid()));
  if (!counter || counter->file == w->oom_file) return;
  const bool moved = !w->oom_file.empty();
  w->oom_cgroup = counter->cgroup;
  w->oom_file = counter->file;
  w->oom_base = ReadOomKills(counter->file).value_or(-1);
  if (moved) {
    log_.WithJob(job_id).WithRank(w->rank).Info(
        "worker pid {} is now in memory cgroup {} ({} OOM kills counted there)", w->process->pid(),
        w->oom_cgroup, w->oom_base < 0 ? "no" : std::to_string(w->oom_base));
  }
}

bool Agent::OomKilledByCount(const std::string& job_id, const Worker& w) {
  if (w.oom_base < 0) return false;
  const std::optional<int64_t> now = ReadOomKills(w.oom_file);
  if (!now) return false;
  int64_t& given = oom_kills_given_[w.oom_file];
  const int64_t from = std::max(given, w.oom_base);
  if (*now <= from) return false;
  given = from + 1;
  log_.WithJob(job_id).WithRank(w.rank).Warn(
      "the kernel log is not readable here ({}); the worker's memory cgroup {} counted {} OOM "
      "kill(s) since it was seen there ({}): the SIGKILL is taken as the OOM killer's",
      options_.kernel_log.empty() ? "--kernel-log is empty" : options_.kernel_log, w.oom_cgroup,
      *now - from, w.oom_file);
  return true;
}

std::vector<v1::AgentJobReport> Agent::Reports() const {
  std::vector<v1::AgentJobReport> out;
  for (const auto& [job_id, run] : runs_) {
    v1::AgentJobReport r;
    r.set_job_id(job_id);
    r.set_round(run.assignment.round());
    if (run.assignment.node_rank() == 0) r.set_master_port(run.assignment.master_port());
    for (const auto& w : run.workers) *r.add_workers() = w.status;
    out.push_back(std::move(r));
  }
  return out;
}

void Agent::Renewed(MonoTime sent) {
  last_renewed_ = sent;
  fenced_ = false;
  // Workers must be gone by S + lease + lease/4 (see the header); the page
  // is on the real monotonic clock whatever clock_ is.
  const Duration left = sent + lease_ + lease_ / 4 - clock_->Now();
  fence_.SetDeadline(worker_link::MonotonicNowNs() +
                     std::chrono::duration_cast<std::chrono::nanoseconds>(left).count());
}

void Agent::Register() {
  v1::RegisterNodeRequest req;
  req.set_node_id(options_.node_id);
  req.set_hostname(options_.hostname);
  req.set_agent_address(agent_address_);
  req.set_incarnation(incarnation_);
  {
    MutexLock lock(&mu_);
    for (auto& r : Reports()) *req.add_jobs() = std::move(r);
  }
  MonoTime sent = clock_->Now();
  req.set_sent_mono_ns(worker_link::MonotonicNowNs());
  auto resp = coordinator_->RegisterNode(req, options_.rpc_timeout);
  if (!resp.ok()) {
    if (register_warning_.Allow()) log_.Warn("cannot register with the coordinator: {}", resp.status().ToString());
    return;
  }
  if (resp->lease_s() > 0) lease_ = FromSeconds(resp->lease_s());
  if (resp->heartbeat_interval_s() > 0) heartbeat_interval_ = FromSeconds(resp->heartbeat_interval_s());
  TakeLogTicketKey(resp->log_ticket_key());
  Renewed(sent);
  registered_ = true;
  next_heartbeat_ = clock_->Now();  // fetch commands at once
  log_.Info("registered as node {} (incarnation {}), lease {}s", options_.node_id, incarnation_,
            ToSeconds(lease_));
  WarnReportsNotApplied(resp->reports_not_applied());
}

void Agent::TakeLogTicketKey(const std::string& key) {
  MutexLock lock(&key_mu_);
  if (key.empty() && !log_ticket_key_.empty()) {
    // A coordinator that sends none cannot issue tickets this agent could
    // check; keeping the old key would serve an older coordinator's.
    log_.Warn("the coordinator sent no log ticket key: logs cannot be read from this node until "
              "it does (is it older than this agent?)");
  }
  log_ticket_key_ = key;
}

void Agent::WarnReportsNotApplied(const std::string& why) {
  if (why.empty() || !reports_warning_.Allow()) return;
  log_.Warn("the coordinator renewed this node's lease but could not apply its job reports; "
            "they go again with every heartbeat: {}", why);
}

void Agent::Heartbeat() {
  v1::HeartbeatRequest req;
  req.set_node_id(options_.node_id);
  req.set_incarnation(incarnation_);
  std::set<std::string> done_at_send;
  const std::set<std::string> removed_at_send = [&] {
    MutexLock lock(&mu_);
    for (std::string& id : cleaner_->TakeRemovedJobDirs()) {
      removed_job_ids_.insert(std::move(id));
    }
    for (auto& r : Reports()) {
      if (RunDone(runs_.at(r.job_id()))) done_at_send.insert(r.job_id());
      *req.add_jobs() = std::move(r);
    }
    return removed_job_ids_;
  }();
  req.set_acks_deleted_job_ids(true);
  for (const auto& id : removed_at_send) req.add_removed_job_ids(id);
  MonoTime sent = clock_->Now();
  req.set_sent_mono_ns(worker_link::MonotonicNowNs());
  // Bounded by lease/4 so a hung coordinator cannot delay the self-fence.
  auto resp = coordinator_->Heartbeat(req, std::min<Duration>(options_.rpc_timeout, lease_ / 4));
  if (!resp.ok()) {
    if (resp.status().code() == absl::StatusCode::kNotFound) {
      log_.Warn("coordinator does not know this node ({}); registering again",
                std::string(resp.status().message()));
      registered_ = false;
      Register();
    } else if (resp.status().code() == absl::StatusCode::kAborted) {
      log_.Error("coordinator fenced this incarnation ({}); stopping workers, new incarnation",
                 std::string(resp.status().message()));
      MutexLock lock(&mu_);
      for (auto& [id, run] : runs_) StopRun(id, &run, std::chrono::seconds(1), "fenced");
      incarnation_ = NewRandomId("inc-");
      registered_ = false;
    } else {
      if (heartbeat_warning_.Allow()) {
        log_.Warn("heartbeat failed ({}s since the last accepted one, lease {}s): {}",
                  last_renewed_ ? ToSeconds(clock_->Now() - *last_renewed_) : 0.0,
                  ToSeconds(lease_), resp.status().ToString());
      }
    }
    return;
  }
  if (resp->lease_s() > 0) lease_ = FromSeconds(resp->lease_s());
  TakeLogTicketKey(resp->log_ticket_key());
  if (fenced_ || (last_renewed_ && clock_->Now() - *last_renewed_ > heartbeat_interval_ * 3)) {
    log_.Info("heartbeat accepted again after {}s", ToSeconds(clock_->Now() - *last_renewed_));
  }
  Renewed(sent);
  WarnReportsNotApplied(resp->reports_not_applied());
  MutexLock lock(&mu_);
  // Reports the coordinator could not apply are not yet its: a finished run
  // is reported until one is.
  if (!resp->reports_not_applied().empty()) done_at_send.clear();
  for (const auto& id : done_at_send) {
    auto it = runs_.find(id);
    if (it != runs_.end() && RunDone(it->second)) it->second.final_reported = true;
  }
  // The coordinator has them: it sends them no more.
  for (const auto& id : removed_at_send) removed_job_ids_.erase(id);
  ApplyCommands(*resp);
}

void Agent::ApplyCommands(const v1::HeartbeatResponse& resp) {
  std::set<std::string> desired;
  for (const auto& cmd : resp.commands()) {
    if (cmd.kind() != v1::AgentCommand::KIND_START) continue;
    desired.insert(cmd.job_id());
    auto it = runs_.find(cmd.job_id());
    if (it == runs_.end()) {
      pending_starts_[cmd.job_id()] = cmd;
    } else if (it->second.assignment.round() < cmd.round()) {
      StopRun(cmd.job_id(), &it->second, FromSeconds(it->second.spec.stop_grace_s()),
              absl::StrCat("round ", cmd.round(), " supersedes it"));
      pending_starts_[cmd.job_id()] = cmd;
    }
  }
  for (auto it = pending_starts_.begin(); it != pending_starts_.end();) {
    if (desired.count(it->first)) {
      ++it;
      continue;
    }
    // A uid found for a start that never came is given back.
    if (!runs_.count(it->first)) ReleaseJobUid(it->first);
    it = pending_starts_.erase(it);
  }
  for (const auto& id : resp.deleted_job_ids()) RemoveJobDir(id);
  for (auto it = runs_.begin(); it != runs_.end();) {
    if (desired.count(it->first)) {
      ++it;
      continue;
    }
    StopRun(it->first, &it->second, FromSeconds(it->second.spec.stop_grace_s()),
            "no longer assigned to this node");
    if (RunDone(it->second) && it->second.final_reported) {
      ReleaseJobUid(it->first);
      it = runs_.erase(it);
    } else {
      ++it;
    }
  }
}

void Agent::CapLogs() {
  if (options_.max_log_bytes <= 0) return;
  struct Full {
    std::string job_id;
    int rank;
    bool is_stderr;
    std::string path;
  };
  std::vector<Full> full;
  {
    MutexLock lock(&mu_);
    for (const auto& [id, run] : runs_) {
      for (const auto& w : run.workers) {
        if (!IsLive(w.status)) continue;
        for (bool err : {false, true}) {
          std::string path = LogPath(id, w.rank, err);
          struct stat st;
          if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
              st.st_size > options_.max_log_bytes) {
            full.push_back({id, w.rank, err, std::move(path)});
          }
        }
      }
    }
  }
  // The copy is up to max_log_bytes per file: on the cleaner's thread.
  for (Full& f : full) {
    Logger log = log_.WithJob(f.job_id).WithRank(f.rank);
    const int64_t cap = options_.max_log_bytes;
    cleaner_->Run(f.job_id, f.path, [this, f, log, cap] {
      const std::string& path = f.path;
      const std::string name = path.substr(path.rfind('/') + 1);
      StatusOr<Rotation> r = RotateLog(
          path,
          absl::StrCat("=== lockstep: ", name, " grew past ", cap,
                       " bytes (lockstepd --max-log-mb) and was rotated"),
          &logs_mu_, [this, &f](const Rotation& done) {
            logs_mu_.AssertHeld();  // RotateLog calls it under logs_mu_
            LogGeneration& g = log_generations_[f.job_id][{f.rank, f.is_stderr}];
            ++g.rotations;
            g.kept = done.kept;
          });
      if (!r.ok()) {
        if (rotate_warning_.Allow()) log.Warn("{}", r.status().ToString());
      } else if (r->kept) {
        log.Info("{} grew past {} bytes: its {} bytes moved to {}.1, the file emptied", name, cap,
                 r->bytes, name);
      } else {
        log.Warn("{} grew past {} bytes: emptied, its {} bytes dropped ({})", name, cap, r->bytes,
                 r->why_lost);
      }
    });
  }
}

namespace {

// How often the last sweep reads again, 5 ms apart, the environment of a
// child that shows none (an exec takes well under a millisecond or two).
constexpr int kEnvironTries = 100;

}  // namespace

void Agent::SweepOrphans(bool all) {
  std::set<pid_t> workers;
  for (const auto& [id, run] : runs_) {
    for (const auto& w : run.workers) {
      if (w.process) workers.insert(static_cast<pid_t>(w.process->pid()));
    }
  }
  for (const pid_t pid : ChildrenOf(::getpid())) {
    if (workers.count(pid)) continue;  // reaped by its Process
    if (guard_ && pid == guard_->pid()) continue;
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) continue;  // one that had exited
    auto env = EnvironOf(pid, {worker_env::kAgent, worker_env::kJobId, worker_env::kRound});
    // No environment to read: in the middle of an execve (a helper the
    // worker started just before it exited), or exiting. The next sweep
    // looks again; the last one, as the agent stops, waits for it (the
    // window is that of an exec) or for the process to go.
    for (int tries = 0; all && !env && tries < kEnvironTries; ++tries) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (::waitpid(pid, &st, WNOHANG) == pid) break;
      env = EnvironOf(pid, {worker_env::kAgent, worker_env::kJobId, worker_env::kRound});
    }
    if (!env) {
      if (all) log_.Warn("pid {} ({}), adopted from a worker, shows no environment: left running", pid, CommOf(pid));
      continue;
    }
    auto at = [&env](const char* name) {
      auto it = env->find(name);
      return it == env->end() ? std::string() : it->second;
    };
    const std::string job_id = at(worker_env::kJobId);
    // Only what this agent's workers started: another agent in this
    // process (tests) or a child of the daemon's own is left alone.
    if (job_id.empty() || at(worker_env::kAgent) != agent_address_) continue;
    int round = 0;
    (void)absl::SimpleAtoi(at(worker_env::kRound), &round);
    auto run = runs_.find(job_id);
    const bool live = run != runs_.end() && run->second.assignment.round() == round &&
                      !RunDone(run->second);
    if (live && !all) continue;
    const bool leader = ::getpgid(pid) == pid;
    const std::string comm = CommOf(pid);
    ::kill(leader ? -pid : pid, SIGKILL);
    log_.WithJob(job_id).Warn(
        "killed pid {} ({}{}), which round {}'s workers left running {} (it had left their "
        "process group: setsid or a double fork)",
        pid, comm, leader ? " and its process group" : "", round,
        all ? "as the agent stops" : "after they ended");
  }
}

void Agent::SetAgentAddress(const std::string& address) {
  agent_address_ = address;
  // What the guard looks for in helpers' environment (LOCKSTEP_AGENT).
  if (guard_) guard_->SetAgent(address);
}

void Agent::KeepGuard() {
  if (!guard_) return;
  const pid_t pid = guard_->pid();
  const std::optional<std::string> ended = guard_->Ended();
  if (!ended) return;
  const Status restarted = guard_->Restart();
  guard_up_ = restarted.ok();
  if (restarted.ok()) {
    ++guard_restarts_;
    log_.Error("the fence guard (pid {}) {}: started another (pid {}), which guards the same "
               "workers",
               pid, *ended, guard_->pid());
  } else if (guard_warning_.Allow()) {
    log_.Error("the fence guard (pid {}) {} and cannot be started again ({}): while this agent is "
               "frozen, workers that do not link the engine are not stopped",
               pid, *ended, restarted.ToString());
  }
}

void Agent::RunOnce() {
  if (clock_->Now() >= next_housekeeping_) {
    next_housekeeping_ = clock_->Now() + kHousekeepingInterval;
    CapLogs();
    KeepGuard();
    MutexLock lock(&mu_);
    SweepOrphans(/*all=*/false);
    for (auto& [id, run] : runs_) {
      for (Worker& w : run.workers) NoteMemoryCgroup(id, &w);
    }
  }
  MonoTime now = clock_->Now();
  {
    MutexLock lock(&mu_);
    Reap();
    TakeAcquiredUids();  // found for starts no longer wanted: dropped
    // Start pending rounds whose previous workers are all gone.
    for (auto it = pending_starts_.begin(); it != pending_starts_.end();) {
      auto run = runs_.find(it->first);
      if (run != runs_.end() && !RunDone(run->second)) {
        ++it;
        continue;
      }
      // Its uid from an earlier run here is still being cleaned (the
      // cleaner gives the job dir to root meanwhile), or its new uid is
      // being found.
      if (cleaner_->Pending(it->first)) {
        ++it;
        continue;
      }
      // Again here: a search that ended since the call above is in no
      // lane now, and its result must be taken before asking for another.
      TakeAcquiredUids();
      if (NeedsJobUid(it->second)) {
        cleaner_->Acquire(it->first, UidLeases(options_.uid_lease_dir, options_.job_uid_first,
                                               options_.job_uid_last));
        ++it;
        continue;
      }
      StartRun(it->second);
      it = pending_starts_.erase(it);
    }
  }
  now = clock_->Now();  // Reap may have asked for a heartbeat now
  if (now >= next_heartbeat_) {
    next_heartbeat_ = now + heartbeat_interval_;
    if (!registered_) {
      Register();
    } else {
      Heartbeat();
    }
  }
  now = clock_->Now();
  if (last_renewed_ && !fenced_ && now - *last_renewed_ > lease_) {
    fenced_ = true;
    MutexLock lock(&mu_);
    bool any = false;
    for (auto& [id, run] : runs_) {
      if (RunDone(run)) continue;
      any = true;
      Duration grace = std::min<Duration>(FromSeconds(run.spec.stop_grace_s()), lease_ / 4);
      StopRun(id, &run, grace, "lease not renewed");
    }
    if (any) {
      log_.Error("no heartbeat accepted for {}s (lease {}s): stopped this node's workers",
                 ToSeconds(now - *last_renewed_), ToSeconds(lease_));
    }
  }
}

void Agent::Start() {
  thread_ = std::thread([this] {
    while (!stop_.load()) {
      RunOnce();
      waker_->Wait(kPollInterval);  // a worker's exit ends the wait early
    }
    // Stop the workers from this thread: they carry PR_SET_PDEATHSIG for
    // the thread that forked them, so they must be gone before it exits or
    // they would get SIGKILL without their grace period.
    StopAllAndReap(shutdown_grace_);
  });
}

void Agent::Shutdown(Duration grace) {
  shutdown_grace_ = grace;
  if (thread_.joinable()) {
    stop_ = true;
    waker_->Wake();
    thread_.join();
  } else {
    StopAllAndReap(grace);
  }
}

bool Agent::AllRunsDone() const {
  for (const auto& [id, run] : runs_) {
    if (!RunDone(run)) return false;
  }
  return true;
}

void Agent::StopAllAndReap(Duration grace) {
  {
    MutexLock lock(&mu_);
    pending_starts_.clear();
    for (auto& [id, run] : runs_) {
      if (RunDone(run)) continue;
      run.stopping = false;  // re-arm with the shutdown grace
      StopRun(id, &run, grace, "agent shutting down");
    }
  }
  MonoTime deadline = clock_->Now() + grace + std::chrono::seconds(1);
  while (true) {
    {
      MutexLock lock(&mu_);
      Reap();
      if (AllRunsDone() || clock_->Now() > deadline) break;
    }
    waker_->Wait(std::chrono::milliseconds(20));  // not under mu_
  }
  {
    MutexLock lock(&mu_);
    SweepOrphans(/*all=*/true);
    // Every job's uid goes back clean before the daemon exits (one that
    // dies first leaves them to the next daemon's cleaner).
    while (!job_uids_.empty()) ReleaseJobUid(job_uids_.begin()->first);
  }
  cleaner_->Drain(kCleanShutdownLimit);
  MutexLock lock(&mu_);
  TakeAcquiredUids();  // found for starts that will not come: dropped
}

Status Agent::ReportProgress(const std::string& job_id, int round, const std::string& token,
                             const v1::RankProgress& progress) {
  MutexLock lock(&mu_);
  // One answer for "no such job here" and "wrong token", so the call is no
  // oracle for which jobs run on this node; compared in constant time.
  auto it = runs_.find(job_id);
  if (it == runs_.end() || !SecretsEqual(token, it->second.progress_token)) {
    return absl::PermissionDeniedError(
        "wrong progress token (LOCKSTEP_AGENT_TOKEN) for this job on this node");
  }
  JobRun& run = it->second;
  if (round != run.assignment.round()) {
    return absl::AbortedError(absl::StrCat("job ", QuoteForError(job_id), ": stale round ", round, " (current ",
                                           run.assignment.round(), ")"));
  }
  // Every heartbeat carries each worker's last report: an unbounded one
  // would make every heartbeat of this node too big to send, and the node,
  // with every job on it, would be lost for good.
  const size_t bytes = progress.ByteSizeLong();
  if (bytes > kMaxProgressBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "progress of rank ", progress.rank(), ": ", bytes, " bytes exceeds the limit of ",
        kMaxProgressBytes, " bytes (kMaxProgressBytes; ", progress.bucket_wait_ms_size(),
        " bucket waits, collective_op of ", progress.collective_op().size(), " bytes)"));
  }
  // Values the coordinator's health checks compute with (daemon/straggler.h).
  if (Status s = CheckProgress(progress); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", progress.rank(), "'s ", s.message()));
  }
  for (auto& w : run.workers) {
    if (w.rank != progress.rank()) continue;
    *w.status.mutable_progress() = progress;
    w.status.mutable_progress()->set_reported_unix_ms(clock_->UnixMillis());
    // The clock of the heartbeat's sent_mono_ns (hang reports: daemon/straggler.h).
    w.status.mutable_progress()->set_reported_mono_ns(worker_link::MonotonicNowNs());
    if (w.status.state() == v1::WORKER_STATE_STARTING) w.status.set_state(v1::WORKER_STATE_RUNNING);
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("job ", QuoteForError(job_id), ": rank ", progress.rank(),
                                          " does not run on node ", options_.node_id));
}

std::string Agent::GenerationName(int64_t rotations) const {
  return absl::StrCat(logs_instance_, ".", rotations);
}

namespace {

int64_t FileSize(int fd) {
  struct stat st;
  return ::fstat(fd, &st) == 0 ? st.st_size : 0;
}

// Reads up to `max_bytes` of the open log `fd`, `size` bytes long, from
// `offset` into `chunk`; an offset past the end reads nothing. Closes `fd`.
void ReadChunk(int fd, int64_t size, int64_t offset, int64_t max_bytes, LogChunk* chunk) {
  chunk->data =
      offset < size ? ReadAt(fd, offset, std::min<int64_t>(max_bytes, size - offset)) : std::string();
  chunk->next_offset = offset + static_cast<int64_t>(chunk->data.size());
  ::close(fd);
}

}  // namespace

StatusOr<LogChunk> Agent::ReadLogs(const std::string& job_id, int rank, bool stderr_stream,
                                   int64_t offset, int64_t tail_bytes, int64_t max_bytes,
                                   const std::string& generation) const {
  if (!IsSafeId(job_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("job id ", QuoteForError(job_id), " is not a valid job id (no paths)"));
  }
  if (rank < 0) return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is negative"));
  if (offset < 0) {
    return absl::InvalidArgumentError(absl::StrCat("log offset ", offset, " is negative"));
  }
  if (max_bytes <= 0 || max_bytes > kMaxLogChunkBytes) max_bytes = kMaxLogChunkBytes;
  LogChunk chunk;
  chunk.path = LogPath(job_id, rank, stderr_stream);
  {
    MutexLock logs(&logs_mu_);  // no rotation empties the file meanwhile
    LogGeneration now;
    if (auto job = log_generations_.find(job_id); job != log_generations_.end()) {
      if (auto it = job->second.find({rank, stderr_stream}); it != job->second.end()) now = it->second;
    }
    chunk.generation = GenerationName(now.rotations);
    if (!generation.empty() && generation != chunk.generation) {
      if (now.rotations > 0 && now.kept && generation == GenerationName(now.rotations - 1)) {
        // Rotated once since the reader's last chunk: the rest of what it
        // was reading is in .1, at the same offsets.
        const std::string previous = chunk.path + ".1";
        StatusOr<int> fd = OpenLogForRead(previous);
        if (fd.ok()) {
          ReadChunk(*fd, FileSize(*fd), offset, max_bytes, &chunk);
          if (!chunk.data.empty()) {
            chunk.path = previous;
            chunk.generation = generation;
          }
        } else {
          chunk.rotated_past = true;  // .1 gone (removed by hand): its rest is lost
        }
      } else {
        chunk.rotated_past = true;
      }
      offset = 0;
    }
    if (chunk.data.empty()) {
      StatusOr<int> fd = OpenLogForRead(chunk.path);
      if (fd.status().code() == absl::StatusCode::kNotFound) {
        return absl::NotFoundError(absl::StrCat("job ", job_id, " has no rank ", rank,
                                                " output on node ", options_.node_id));
      }
      if (!fd.ok()) return fd.status();
      const int64_t size = FileSize(*fd);
      if (generation.empty() && tail_bytes > 0 && offset == 0) {
        offset = std::max<int64_t>(0, size - tail_bytes);
      }
      // Past the end in the same generation: the file was emptied by other
      // means (or by an agent before this one); it goes on from the start.
      if (offset > size) offset = 0;
      ReadChunk(*fd, size, offset, max_bytes, &chunk);
    }
  }
  chunk.worker_done = true;
  MutexLock lock(&mu_);
  auto it = runs_.find(job_id);
  if (it != runs_.end()) {
    for (const auto& w : it->second.workers) {
      if (w.rank == rank && IsLive(w.status)) chunk.worker_done = false;
    }
  }
  if (pending_starts_.count(job_id)) chunk.worker_done = false;
  return chunk;
}

std::vector<v1::AgentJobReport> Agent::ListWorkers(const std::string& job_id) const {
  MutexLock lock(&mu_);
  std::vector<v1::AgentJobReport> out;
  for (auto& r : Reports()) {
    if (job_id.empty() || r.job_id() == job_id) out.push_back(std::move(r));
  }
  return out;
}

}  // namespace daemon
}  // namespace lockstep
