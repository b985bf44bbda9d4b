// lockstepd: the Lockstep daemon. Every daemon is an agent (AgentService,
// worker supervision); with --coordinator it also hosts the coordinator
// (CoordinatorService, job table in <state-dir>/coordinator.db), the
// store (StoreService) the workers rendezvous through.
// Composition root: flags -> config -> construct -> wire -> serve.
// See daemon/README.md for the operator's view.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/address.h"
#include "common/certs.h"
#include "common/clock.h"
#include "common/flags.h"
#include "common/ids.h"
#include "common/logging.h"
#include "common/version.h"
#include "common/status.h"
#include "daemon/agent.h"
#include "daemon/agent_service.h"
#include "daemon/coordinator.h"
#include "daemon/job_env.h"
#include "daemon/job_spec.h"
#include "daemon/coordinator_service.h"
#include "daemon/daemon_metrics.h"
#include "daemon/http_server.h"
#include "daemon/metrics.h"
#include "daemon/rpc_metrics.h"
#include "daemon/grpc_auth.h"
#include "daemon/grpc_coordinator_client.h"
#include "daemon/process_launcher.h"
#include "daemon/roles.h"
#include "daemon/sqlite_job_store.h"
#include "daemon/token.h"
#include "daemon/token_files.h"
#include "daemon/uid_lease.h"
#include "rendezvous/grpc_limits.h"
#include "rendezvous/malformed_request.h"
#include "rendezvous/grpc_server.h"
#include "rendezvous/store_core.h"
#include "rendezvous/store_service.h"
#include "rendezvous/tls.h"

extern char** environ;

namespace lockstep {
namespace daemon {
namespace {

struct Config {
  std::string state_dir = "/var/lib/lockstep";
  std::string listen = "127.0.0.1:7070";
  std::string advertise;
  bool coordinator = false;
  bool agent = true;
  std::string coordinator_address;
  std::string token_file;
  std::string viewer_token_file;
  std::string agent_token_file;
  std::string node_id;
  std::string address_file;
  std::string run_as;
  std::string job_uids;
  uint32_t job_uid_first = 0;
  uint32_t job_uid_last = 0;
  std::string uid_lease_dir = kDefaultUidLeaseDir;
  std::vector<std::string> allowed_commands;
  std::vector<std::string> allowed_env;
  double lease_s = ToSeconds(kDefaultLease);
  double heartbeat_interval_s = ToSeconds(kDefaultHeartbeatInterval);
  double restart_backoff_s = ToSeconds(kDefaultRestartBackoff);
  double max_restart_backoff_s = ToSeconds(kDefaultMaxRestartBackoff);
  double shutdown_grace_s = 10;
  double max_log_mb = 1024;
  int64_t max_processes = kDefaultMaxJobProcesses;
  std::string kernel_log = "/dev/kmsg";
  double retain_finished_s = ToSeconds(kDefaultFinishedJobRetention);
  std::string log_level;
  std::string metrics_listen;  // empty: no /metrics endpoint
  // Mutual TLS (rendezvous/tls.h); all empty: plaintext, loopback only
  // unless insecure_plaintext.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  // What the workers get instead of tls_cert/tls_key (clientAuth only);
  // empty: the daemon's own, with a warning.
  std::string tls_worker_cert;
  std::string tls_worker_key;
  double tls_refresh_s = ToSeconds(rendezvous::kDefaultTlsRefreshInterval);
  // Coordinator: a node registers and heartbeats only under a node id its
  // client certificate names (CoordinatorGrpcService).
  bool tls_bind_node_ids = false;
  bool insecure_plaintext = false;
};

// The TLS material the workers get (LOCKSTEP_TLS_*_PEM), read now: the CA
// and --tls-worker-cert/--tls-worker-key, checked (they chain to the CA,
// match, are valid now, and are a client's only: certs::CheckClientOnly),
// or without those flags this daemon's own certificate and key. Called at
// start and at each launch, so renewed files reach the next workers.
StatusOr<WorkerTlsPem> ReadWorkerTls(const rendezvous::TlsConfig& tls, const Config& config) {
  const bool own = config.tls_worker_cert.empty();
  const std::string cert_flag = own ? "--tls-cert" : "--tls-worker-cert";
  const std::string key_flag = own ? "--tls-key" : "--tls-worker-key";
  const std::string& cert_file = own ? tls.cert_file : config.tls_worker_cert;
  const std::string& key_file = own ? tls.key_file : config.tls_worker_key;
  // Read once, and what was read is what is checked and handed out: a file
  // rewritten meanwhile cannot go out unchecked.
  WorkerTlsPem pem;
  ASSIGN_OR_RETURN(pem.ca, rendezvous::ReadPem(tls.ca_file, "--tls-ca"));
  ASSIGN_OR_RETURN(pem.cert, rendezvous::ReadPem(cert_file, cert_flag));
  ASSIGN_OR_RETURN(pem.key, rendezvous::ReadPem(key_file, key_flag));
  const std::string cert_what = absl::StrCat(cert_flag, " ", cert_file);
  RETURN_IF_ERROR(certs::CheckTlsMaterial(pem.ca, pem.cert, pem.key,
                                          std::chrono::system_clock::now(),
                                          absl::StrCat("--tls-ca ", tls.ca_file), cert_what,
                                          absl::StrCat(key_flag, " ", key_file)));
  if (!own) RETURN_IF_ERROR(certs::CheckClientOnly(pem.cert, cert_what));
  return pem;
}

StatusOr<Config> ParseFlags(int argc, char** argv) {
  Config c;
  FlagSet flags("lockstepd", "Lockstep daemon: agent on every host; --coordinator also hosts "
                             "the coordinator, the store and rendezvous.");
  flags.String("state-dir", &c.state_dir, "jobs, logs, token and the job table live here");
  flags.String("listen", &c.listen, "gRPC listen address (host:port; port 0 = pick one)");
  flags.String("advertise-address", &c.advertise,
               "address others use to reach this daemon (default: listen host + bound port)");
  flags.Bool("coordinator", &c.coordinator, "also run the coordinator, store and rendezvous");
  flags.Bool("agent", &c.agent, "run the agent (supervise workers on this host)");
  flags.String("coordinator-address", &c.coordinator_address,
               "host:port of the coordinator (default: this daemon with --coordinator)");
  flags.String("token-file", &c.token_file,
               "with --coordinator: the admin token (default <state-dir>/token; created 0600 if "
               "missing); without: the token this agent presents to the coordinator (a copy of "
               "its agent.token)");
  flags.String("viewer-token-file", &c.viewer_token_file,
               "coordinator: the viewer (read-only) token (default <state-dir>/viewer.token; "
               "created 0600 if missing)");
  flags.String("agent-token-file", &c.agent_token_file,
               "coordinator: the token agents register with (default <state-dir>/agent.token; "
               "created 0600 if missing)");
  flags.String("node-id", &c.node_id, "this node's stable id (default: hostname)");
  flags.String("address-file", &c.address_file,
               "write the advertised address here once serving and, with an agent, "
               "registered (for scripts using port 0)");
  flags.String("run-as", &c.run_as, "run workers as this user (never root)");
  flags.String("job-uids", &c.job_uids,
               absl::StrCat("FIRST-LAST: each job's workers run as a uid of their own from "
                            "this range, leased host-wide (needs root; the default for a root "
                            "daemon without --run-as is ", kDefaultJobUidFirst, "-",
                            kDefaultJobUidLast, "); off: no uid per job"));
  flags.String("uid-lease-dir", &c.uid_lease_dir,
               "where the host-wide leases on --job-uids are held (flock; made 0700)");
  flags.StringList("allowed-command", &c.allowed_commands,
                   "if given (repeatable), jobs may only run these programs (command[0])");
  flags.StringList("allowed-env", &c.allowed_env,
                   "repeatable: a variable NAME, PREFIX* or * (any) a job's --env may set, "
                   "beyond the engine's own (daemon/README.md, job environment)");
  flags.Double("lease-s", &c.lease_s,
               "coordinator: a node is dead this long after its last heartbeat; its agent "
               "stops its workers this long after sending it (agents take the coordinator's "
               "value; daemon/README.md, leases and fencing)");
  flags.Double("heartbeat-interval-s", &c.heartbeat_interval_s,
               "coordinator: agents heartbeat this often (agents take the coordinator's value)");
  flags.Double("restart-backoff-s", &c.restart_backoff_s, "coordinator: first restart backoff (doubles)");
  flags.Double("max-restart-backoff-s", &c.max_restart_backoff_s, "coordinator: backoff cap");
  flags.Double("retain-finished-s", &c.retain_finished_s,
               "coordinator: a finished job, its record and its logs on every node, is deleted "
               "this long after it ended (0 = kept until `lockstep delete`; 604800 = 7 days)");
  flags.Double("shutdown-grace-s", &c.shutdown_grace_s,
               "on SIGTERM or SIGINT: workers get this long after SIGTERM before SIGKILL");
  flags.Double("max-log-mb", &c.max_log_mb,
               "agent: a worker's stdout or stderr file past this many MiB is moved to "
               "rank-R.stdout.1 (or .stderr.1, replacing the previous one) and emptied, so one "
               "job's output cannot fill the state dir's disk; 0 = never");
  flags.Int("max-processes", &c.max_processes,
            "agent: with a uid per job (--job-uids), the most processes and threads one job's "
            "uid may have on this node (RLIMIT_NPROC), so a fork bomb stops there; a job's "
            "--max-processes may lower it, not raise it; 0 = no limit of its own");
  flags.String("kernel-log", &c.kernel_log,
               "agent: where a SIGKILL the agent did not send is looked up, to tell the OOM "
               "killer's (needs root or kernel.dmesg_restrict=0); empty, or where it cannot be "
               "read, the worker's memory cgroup's OOM kill count says (default /dev/kmsg)");
  flags.String("log-level", &c.log_level,
               "trace|debug|info|warn|error|critical|off (default LOCKSTEP_LOG_LEVEL or info)");
  flags.String("metrics-listen", &c.metrics_listen,
               "serve Prometheus metrics at http://HOST:PORT/metrics, https with --tls-* (a "
               "client certificate required); port 0 = pick one, logged; default: off; "
               "daemon/README.md, Metrics");
  flags.String("tls-ca", &c.tls_ca,
               "mutual TLS: the cluster CA (PEM) that peers' certificates must chain to "
               "(make one with `lockstep certs`; default: no TLS)");
  flags.String("tls-cert", &c.tls_cert,
               "mutual TLS: this daemon's certificate (PEM), served and presented to the "
               "coordinator; re-read when it changes");
  flags.String("tls-key", &c.tls_key, "mutual TLS: the key of --tls-cert (PEM)");
  flags.String("tls-worker-cert", &c.tls_worker_cert,
               "mutual TLS: the certificate this daemon's workers present (PEM, clientAuth "
               "only: worker.pem from `lockstep certs`); re-read at each launch. Default: "
               "--tls-cert, so a job holds this node's key (warned at start)");
  flags.String("tls-worker-key", &c.tls_worker_key,
               "mutual TLS: the key of --tls-worker-cert (PEM)");
  flags.Double("tls-refresh-s", &c.tls_refresh_s,
               "re-read the --tls-* files this often (whole seconds, at least 1)");
  flags.Bool("tls-bind-node-ids", &c.tls_bind_node_ids,
             "coordinator with mutual TLS: admit RegisterNode and Heartbeat only for a node id "
             "its caller's certificate names (a DNS or IP subjectAltName, or the CN of one "
             "without), so an agent token alone cannot pass for another node");
  flags.Bool("insecure-plaintext", &c.insecure_plaintext,
             "without --tls-*: listen and dial beyond loopback in plaintext anyway (tokens "
             "cross the network unencrypted)");
  flags.Version("lockstepd " LOCKSTEP_VERSION);
  ASSIGN_OR_RETURN(std::vector<std::string> rest, flags.Parse(argc, argv));
  if (!rest.empty()) return absl::InvalidArgumentError("unexpected argument: " + rest[0]);
  if (!c.coordinator && !c.agent) {
    return absl::InvalidArgumentError("--no-agent needs --coordinator: nothing to run");
  }
  if (c.tls_worker_cert.empty() != c.tls_worker_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-worker-cert and --tls-worker-key go together: give both or neither");
  }
  if (!c.tls_worker_cert.empty() && c.tls_ca.empty()) {
    return absl::InvalidArgumentError(
        "--tls-worker-cert and --tls-worker-key need --tls-ca, --tls-cert and --tls-key");
  }
  if (!c.coordinator && c.coordinator_address.empty()) {
    return absl::InvalidArgumentError(
        "nothing to join: give --coordinator to host a coordinator (and an agent), or "
        "--coordinator-address HOST:PORT to join one as an agent");
  }
  if (c.tls_bind_node_ids && (!c.coordinator || c.tls_ca.empty())) {
    return absl::InvalidArgumentError(
        "--tls-bind-node-ids needs --coordinator and mutual TLS (--tls-ca, --tls-cert, "
        "--tls-key): node ids are bound to the certificates agents present");
  }
  if (!(c.lease_s > 0) || !(c.heartbeat_interval_s > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--lease-s and --heartbeat-interval-s must be more than 0 (got ", c.lease_s, " and ",
        c.heartbeat_interval_s, ")"));
  }
  if (c.heartbeat_interval_s * 3 > c.lease_s) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--lease-s must be at least 3x --heartbeat-interval-s (got ", c.lease_s, " and ",
        c.heartbeat_interval_s, ")"));
  }
  // Durations in seconds, NaN and beyond a day refused: they become
  // nanosecond counts, where 1e10 s overflowed (a negative backoff cap: no
  // backoff at all).
  constexpr double kDay = 86400;
  const struct {
    const char* flag;
    double value;
    bool zero_ok;
  } durations[] = {{"--lease-s", c.lease_s, false},
                   {"--heartbeat-interval-s", c.heartbeat_interval_s, false},
                   {"--restart-backoff-s", c.restart_backoff_s, true},
                   {"--max-restart-backoff-s", c.max_restart_backoff_s, true},
                   {"--shutdown-grace-s", c.shutdown_grace_s, true},
                   {"--tls-refresh-s", c.tls_refresh_s, true}};
  for (const auto& d : durations) {
    if (!(d.zero_ok ? d.value >= 0 : d.value > 0) || !(d.value <= kDay)) {
      return absl::InvalidArgumentError(absl::StrCat(d.flag, ": want ", d.zero_ok ? "0" : "more than 0",
                                                     " to ", kDay, " seconds, got ", d.value));
    }
  }
  if (!(c.retain_finished_s >= 0 && c.retain_finished_s <= 100.0 * 365 * 86400)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--retain-finished-s: want 0 (keep) to 100 years in seconds, got ", c.retain_finished_s));
  }
  if (c.max_processes < 0 || c.max_processes > kMaxProcessesLimit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-processes: want 0 (no limit) to ", kMaxProcessesLimit, ", got ", c.max_processes));
  }
  if (!(c.max_log_mb >= 0 && c.max_log_mb <= 1024.0 * 1024 * 1024)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-log-mb: want 0 (no cap) to 1 PiB in MiB, got ", c.max_log_mb));
  }
  if (daemon::NamesRoot(c.run_as)) {
    return absl::InvalidArgumentError("--run-as: workers never run as root");
  }
  if (!c.advertise.empty() && !IsDialableAddress(c.advertise)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--advertise-address ", QuoteForError(c.advertise),
        ": want host:port or [v6]:port that others can dial (a port in 1-65535)"));
  }
  if (c.job_uids.empty() && c.agent && c.run_as.empty() && ::geteuid() == 0 &&
      MissingUserSwitchCapabilities().empty()) {
    // Isolation by default: a root daemon gives each job a uid of its own.
    c.job_uid_first = kDefaultJobUidFirst;
    c.job_uid_last = kDefaultJobUidLast;
  } else if (!c.job_uids.empty() && c.job_uids != "off") {
    std::vector<std::string> range = absl::StrSplit(c.job_uids, '-');
    if (range.size() != 2 || !absl::SimpleAtoi(range[0], &c.job_uid_first) ||
        !absl::SimpleAtoi(range[1], &c.job_uid_last) || c.job_uid_first == 0 ||
        c.job_uid_first > c.job_uid_last || c.job_uid_last == UINT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--job-uids: want FIRST-LAST with 0 < FIRST <= LAST, or off, got ",
          QuoteForError(c.job_uids)));
    }
    if (!c.run_as.empty()) {
      return absl::InvalidArgumentError("--job-uids and --run-as exclude each other: with "
                                        "--job-uids every job has a uid of its own");
    }
    if (::geteuid() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--job-uids needs a root lockstepd to switch users (this one runs as uid ",
          ::geteuid(), ")"));
    }
    if (std::string missing = MissingUserSwitchCapabilities(); !missing.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--job-uids needs ", missing, ", which this lockstepd lacks (a container or unit "
          "that dropped them): it could not run jobs as their own uids"));
    }
  }
  RETURN_IF_ERROR(daemon::ValidateEnvPatterns(c.allowed_env));
  if (c.token_file.empty()) c.token_file = c.state_dir + "/token";
  if (!c.coordinator && (!c.viewer_token_file.empty() || !c.agent_token_file.empty())) {
    return absl::InvalidArgumentError(
        "--viewer-token-file and --agent-token-file need --coordinator (an agent presents "
        "--token-file)");
  }
  if (c.viewer_token_file.empty()) c.viewer_token_file = c.state_dir + "/viewer.token";
  if (c.agent_token_file.empty()) c.agent_token_file = c.state_dir + "/agent.token";
  const bool from_hostname = c.node_id.empty();
  if (from_hostname) {
    char host[256] = {0};
    ::gethostname(host, sizeof(host) - 1);
    c.node_id = host;
  }
  // The coordinator refuses any other node id at every registration: said
  // here, once, instead of a warning every few seconds forever.
  if (c.agent && !IsSafeId(c.node_id)) {
    return absl::InvalidArgumentError(absl::StrCat(
        from_hostname ? "this host's name " : "--node-id ", QuoteForError(c.node_id),
        " is not a node id ([A-Za-z0-9._-]{1,128})",
        from_hostname ? ": give --node-id" : ""));
  }
  return c;
}

// The agent's CoordinatorClient, connected once the coordinator's address
// is known (after bind, when this daemon is the coordinator).
class DeferredCoordinatorClient : public CoordinatorClient {
 public:
  // Presents the last SetToken's token.
  void Connect(const std::string& address) {
    address_ = address;
    client_ = std::make_unique<GrpcCoordinatorClient>(
        rendezvous::CreateLockstepChannel(address), token_, address);
  }
  // The token the calls present, before and after Connect (a rotation:
  // daemon/token_files.h). Called on the main thread only.
  void SetToken(const std::string& token) {
    token_ = token;
    if (client_) client_->SetToken(token);
  }
  // A registration that fails UNAVAILABLE says why when the cause is TLS
  // (rendezvous::ExplainTlsFailure: one handshake of our own per failure).
  StatusOr<v1::RegisterNodeResponse> RegisterNode(const v1::RegisterNodeRequest& request,
                                                  Duration timeout) override {
    auto response = client_->RegisterNode(request, timeout);
    if (!response.ok()) return rendezvous::WithTlsReason(response.status(), address_);
    return response;
  }
  StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request,
                                            Duration timeout) override {
    return client_->Heartbeat(request, timeout);
  }

 private:
  std::string address_;
  std::string token_;
  std::unique_ptr<GrpcCoordinatorClient> client_;  // set before the agent starts
};

// The state dir (and its jobs/) holds the tokens and the job table: this
// daemon's own. Made 0700; an existing one owned by another uid (root's
// excepted) is refused (its owner could swap the tokens or the job
// table), one of its own readable or
// writable by group or others (an emptyDir comes 0777) loses that access,
// and the log says so. With `workers_elsewhere` (workers run as other uids:
// --job-uids, --run-as) it also gets search access for group and others
// (0711, as the packages make the state dir): a worker reaches its job dir
// by its absolute path ($PWD), never lists the others.
Status MakeDir(const std::string& path, bool workers_elsewhere, const Logger& log) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::UnavailableError(absl::StrCat("mkdir ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::UnavailableError(absl::StrCat("stat ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("state dir ", path, " is not a directory"));
  }
  // Root's is trusted: a volume mounted for a non-root daemon (a
  // Kubernetes claim with fsGroup: root:<group> 2775) is root's, and its
  // mode is the platform's to set.
  if (st.st_uid == 0 && ::geteuid() != 0) return absl::OkStatus();
  if (st.st_uid != ::geteuid()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "state dir ", path, " is owned by uid ", st.st_uid, ", not by this daemon's uid ",
        ::geteuid(), ": its owner could replace the tokens or the job table; chown it or pick "
        "another --state-dir"));
  }
  // Search (x) for others may stay: with --run-as or --job-uids workers
  // reach their own job dir by path (the packages make it 0711).
  if (st.st_mode & 066) {
    const mode_t closed = 0700 | (st.st_mode & 011);
    if (::chmod(path.c_str(), closed) != 0) {
      return absl::PermissionDeniedError(absl::StrCat("state dir ", path, ": cannot take away "
                                                      "group and other access: ",
                                                      std::strerror(errno)));
    }
    log.Warn("state dir {} was mode {:04o}, readable or writable by group or others; made it "
             "{:04o}", path, st.st_mode & 07777, closed);
    st.st_mode = (st.st_mode & ~07777) | closed;
  }
  if (workers_elsewhere && (st.st_mode & 011) != 011) {
    const mode_t searchable = (st.st_mode & 07777) | 011;
    if (::chmod(path.c_str(), searchable) != 0) {
      return absl::PermissionDeniedError(absl::StrCat(
          "state dir ", path, ": cannot give workers of other uids search access (",
          std::strerror(errno), "): they could not reach their job dirs"));
    }
    log.Info("state dir {}: mode {:04o} (workers run as other uids and reach their job dir by "
             "path; they list nothing)", path, searchable);
  }
  return absl::OkStatus();
}

// A token file of the state dir (the default paths) must be the file
// itself: a symlink there could point the daemon at a token of someone
// else's choosing.
Status RefuseStateSymlink(const std::string& state_dir, const std::string& path) {
  if (path.rfind(state_dir + "/", 0) != 0) return absl::OkStatus();
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "token file ", path, " in the state dir is a symlink; refusing it (remove it to have a "
        "new token made, or give --token-file the real path)"));
  }
  return absl::OkStatus();
}

int Run(int argc, char** argv) {
  auto config_or = ParseFlags(argc, argv);
  if (!config_or.ok()) {
    if (config_or.status().code() == absl::StatusCode::kNotFound) {
      std::cout << config_or.status().message();
      return 0;
    }
    std::cerr << "lockstepd: " << config_or.status().message() << "\n";
    return 2;
  }
  Config config = *config_or;
  Status s = InitLogging(config.log_level);
  if (!s.ok()) {
    std::cerr << "lockstepd: " << s.message() << "\n";
    return 2;
  }
  Logger log("lockstepd");
  // Transport security first: nothing listens or dials before it is set.
  rendezvous::TlsConfig tls;
  tls.ca_file = config.tls_ca;
  tls.cert_file = config.tls_cert;
  tls.key_file = config.tls_key;
  tls.refresh_interval = FromSeconds(std::max(config.tls_refresh_s, 1.0));
  s = rendezvous::CheckTlsConfig(tls, /*need_identity=*/true);
  if (s.ok()) {
    s = rendezvous::CheckPlaintextAllowed(tls, config.listen, "--listen",
                                          config.insecure_plaintext);
  }
  if (s.ok() && config.agent && !config.coordinator_address.empty()) {
    s = rendezvous::CheckPlaintextAllowed(tls, config.coordinator_address,
                                          "--coordinator-address", config.insecure_plaintext);
  }
  // The advertised address is where this daemon's own agent sends its token
  // and workers send theirs (store, progress): a loopback --listen does not
  // make a non-loopback --advertise-address safe in plaintext.
  if (s.ok() && !config.advertise.empty()) {
    s = rendezvous::CheckPlaintextAllowed(tls, config.advertise, "--advertise-address",
                                          config.insecure_plaintext);
  }
  if (!s.ok()) {
    log.Error("{}", std::string(s.message()));
    return 2;
  }
  if (tls.enabled() && config.agent) {
    auto workers = ReadWorkerTls(tls, config);
    if (!workers.ok()) {
      log.Error("{}", std::string(workers.status().message()));
      return 2;
    }
  }
  rendezvous::SetProcessTls(tls);
  if (tls.enabled()) {
    log.Info("mutual TLS: CA {}, certificate {}, key {} (re-read every {:.0f} s)", tls.ca_file,
             tls.cert_file, tls.key_file, ToSeconds(tls.refresh_interval));
    if (config.agent && config.tls_worker_cert.empty()) {
      log.Warn("workers get this daemon's own TLS certificate and key (--tls-key), so a job's "
               "code could pass for this node to the CLI and to agents; give "
               "--tls-worker-cert and --tls-worker-key (worker.pem and worker.key from "
               "`lockstep certs`)");
    } else if (config.agent) {
      log.Info("workers present {} (--tls-worker-cert)", config.tls_worker_cert);
    }
  } else {
    if (!rendezvous::IsLoopbackHost(HostOfAddress(config.listen))) {
      log.Warn("plaintext on {} (--insecure-plaintext): tokens and job data cross the network "
               "unencrypted; give --tls-ca, --tls-cert and --tls-key", config.listen);
    }
    if (config.agent && !config.coordinator_address.empty() &&
        !rendezvous::IsLoopbackHost(HostOfAddress(config.coordinator_address))) {
      log.Warn("plaintext to the coordinator {} (--insecure-plaintext): this agent's token "
               "crosses the network unencrypted; give --tls-ca, --tls-cert and --tls-key",
               config.coordinator_address);
    }
  }
  const bool workers_elsewhere =
      config.agent && (config.job_uid_first != 0 || !config.run_as.empty());
  for (const auto& dir : {config.state_dir, config.state_dir + "/jobs"}) {
    s = MakeDir(dir, workers_elsewhere, log);
    if (!s.ok()) {
      log.Error("{}", s.ToString());
      return 1;
    }
  }
  // One daemon per state dir: a second one would share the job table and
  // the workers' log files. The lock goes with the process, however it ends.
  const std::string lock_path = config.state_dir + "/lockstepd.lock";
  const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (lock_fd < 0 || ::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    std::string holder;
    std::ifstream(lock_path) >> holder;
    log.Error("state dir {} is in use by another lockstepd{} ({}: {})", config.state_dir,
              holder.empty() ? "" : " (pid " + holder + ")", lock_path, std::strerror(errno));
    return 1;
  }
  if (::ftruncate(lock_fd, 0) == 0) {
    const std::string pid = std::to_string(::getpid()) + "\n";
    (void)!::write(lock_fd, pid.data(), pid.size());
  }
  // Roles (daemon/roles.h): a coordinator owns the admin, viewer and agent
  // tokens, and the key of its jobs' store tokens; an agent-only daemon
  // holds just the token it registers with.
  const std::string store_key_file = config.state_dir + "/store.key";
  for (const std::string* path : std::initializer_list<const std::string*>{
           &config.token_file, &config.viewer_token_file, &config.agent_token_file,
           &store_key_file}) {
    s = RefuseStateSymlink(config.state_dir, *path);
    if (!s.ok()) {
      log.Error("{}", s.ToString());
      return 1;
    }
  }
  auto token = LoadToken(config.token_file, /*create=*/config.coordinator);
  if (!token.ok()) {
    log.Error("{}{}", token.status().ToString(),
              config.coordinator ? "" : " (copy the coordinator's agent.token here)");
    return 1;
  }
  std::string store_key;
  RoleTokens roles;
  if (config.coordinator) {
    auto viewer = LoadToken(config.viewer_token_file, /*create=*/true);
    auto agent_tok = LoadToken(config.agent_token_file, /*create=*/true);
    auto key = LoadToken(store_key_file, /*create=*/true);
    for (const auto* t : {&viewer, &agent_tok, &key}) {
      if (!t->ok()) {
        log.Error("{}", t->status().ToString());
        return 1;
      }
    }
    store_key = *key;
    log.Info("tokens: admin {}, viewer {}, agent {} (daemon/README.md, Roles); re-read when they "
             "change or on SIGHUP", config.token_file, config.viewer_token_file,
             config.agent_token_file);
  } else {
    log.Info("token: {} (presented to the coordinator at {}; it must be the coordinator's "
             "agent or admin token); re-read when it changes or on SIGHUP", config.token_file,
             config.coordinator_address);
  }
  // Read again on SIGHUP and when a file changes (the main loop below):
  // a coordinator's files set what each role admits, and the current agent
  // token is what its own agent presents; an agent-only daemon presents
  // its file's current token.
  DeferredCoordinatorClient coordinator_client;
  std::vector<std::string> watched = {config.token_file};
  if (config.coordinator) {
    watched = {config.token_file, config.viewer_token_file, config.agent_token_file};
  }
  TokenFiles token_files(watched, [&](const std::vector<std::vector<std::string>>& t) {
    if (config.coordinator) {
      roles.SetTokens(Role::kAdmin, t[0]);
      roles.SetTokens(Role::kViewer, t[1]);
      roles.SetTokens(Role::kAgent, t[2]);
    }
    coordinator_client.SetToken(t.back().front());
  });
  s = token_files.Load();
  if (!s.ok()) {
    log.Error("{}", s.ToString());
    return 1;
  }

  // A write to a peer that hung up fails with EPIPE instead of ending the
  // daemon (each writer also guards itself: the metrics server's thread,
  // rendezvous/tls.cc). Workers start with every signal at its default
  // (process_launcher.cc).
  ::signal(SIGPIPE, SIG_IGN);
  // Block termination signals before any thread starts; main waits on them.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  // Coordinator side.
  std::unique_ptr<SqliteJobStore> job_store;
  std::unique_ptr<rendezvous::StoreCore> store_core;  // outlives the coordinator's hook
  std::unique_ptr<Coordinator> coordinator;
  std::unique_ptr<CoordinatorGrpcService> coordinator_service;
  std::unique_ptr<rendezvous::StoreGrpcService> store_service;
  if (config.coordinator) {
    auto opened = SqliteJobStore::Open(config.state_dir + "/coordinator.db");
    if (!opened.ok()) {
      log.Error("{}", opened.status().ToString());
      return 1;
    }
    job_store = std::move(*opened);
    CoordinatorOptions options;
    options.lease = FromSeconds(config.lease_s);
    options.heartbeat_interval = FromSeconds(config.heartbeat_interval_s);
    options.restart_backoff = FromSeconds(config.restart_backoff_s);
    options.max_restart_backoff = FromSeconds(config.max_restart_backoff_s);
    options.allowed_commands = config.allowed_commands;
    options.allowed_env = config.allowed_env;
    options.finished_job_retention = FromSeconds(config.retain_finished_s);
    store_core = std::make_unique<rendezvous::StoreCore>();
    // Namespaces of superseded rounds and ended jobs (see CoordinatorOptions);
    // an ended job's take no more writes.
    options.drop_store_prefix = [store = store_core.get()](const std::string& prefix) {
      store->DeleteNamespacesWithPrefix(prefix);
    };
    options.close_store_job = [store = store_core.get()](const std::string& job_id) {
      store->CloseJob(job_id);
    };
    coordinator = std::make_unique<Coordinator>(options, RealClock(), job_store.get());
    s = coordinator->Recover();
    if (!s.ok()) {
      log.Error("recovering the job table: {}", s.ToString());
      return 1;
    }
    coordinator_service = std::make_unique<CoordinatorGrpcService>(
        coordinator.get(), &roles, store_key, config.tls_bind_node_ids);
    if (config.tls_bind_node_ids) {
      log.Info("node ids are bound to certificates (--tls-bind-node-ids): a node registers "
               "only under a name its certificate holds");
    }
    // Workers hold their job's store token (LOCKSTEP_STORE_TOKEN), tools
    // the admin token; viewer and agent tokens are refused (roles.h).
    store_service = std::make_unique<rendezvous::StoreGrpcService>(
        store_core.get(),
        [&roles, store_key, coord = coordinator.get()](
            const std::multimap<grpc::string_ref, grpc::string_ref>& md, absl::string_view ns) {
          auto [value, present] = AuthorizationHeader(md);
          // A job's token opens its namespaces only while the job runs.
          return AuthorizeStoreCall(roles, store_key, value, present, ns,
                                    [coord](const std::string& job) {
                                      return coord->CheckStoreOpen(job);
                                    });
        });
  }

  // Agent side. Its own address (and, with --coordinator, the
  // coordinator's) is known only after bind; it starts after that.
  std::unique_ptr<ProcessLauncher> launcher = NewPosixProcessLauncher();
  WorkerExitCounter worker_exits;  // outlives the agent that feeds it
  std::unique_ptr<Agent> agent;
  std::unique_ptr<AgentGrpcService> agent_service;
  if (config.agent) {
    AgentOptions options;
    options.node_id = config.node_id;
    char host[256] = {0};
    ::gethostname(host, sizeof(host) - 1);
    options.hostname = host;
    options.state_dir = config.state_dir;
    options.run_as = config.run_as;
    options.job_uid_first = config.job_uid_first;
    options.job_uid_last = config.job_uid_last;
    options.uid_lease_dir = config.uid_lease_dir;
    options.kernel_log = config.kernel_log;
    // Say how an OOM kill will be told, once (daemon/oom.h).
    if (config.kernel_log.empty()) {
      log.Info("OOM kills of workers: told by their memory cgroups' OOM kill counts (--kernel-log "
               "is empty)");
    } else if (int fd = ::open(config.kernel_log.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC); fd < 0) {
      log.Info("OOM kills of workers: told by their memory cgroups' OOM kill counts ({} cannot be "
               "read: {})",
               config.kernel_log, std::strerror(errno));
    } else {
      ::close(fd);
      log.Info("OOM kills of workers: told by the kernel log, {}", config.kernel_log);
    }
    // Say how isolated jobs are, once, where the operator looks.
    if (config.job_uid_first != 0) {
      Status leases =
          UidLeases(config.uid_lease_dir, config.job_uid_first, config.job_uid_last).Prepare();
      if (!leases.ok()) {
        log.Error("{} (--uid-lease-dir)", leases.ToString());
        return 1;
      }
      log.Info("job isolation: each job runs as its own uid from {}-{} (host-wide leases in {}), "
               "at most {} processes and threads each (--max-processes)",
               config.job_uid_first, config.job_uid_last, config.uid_lease_dir,
               config.max_processes == 0 ? std::string("unlimited")
                                         : std::to_string(config.max_processes));
      options.max_job_processes = config.max_processes;
    } else if (::geteuid() != 0) {
      log.Warn("jobs are not isolated: their workers run as this daemon's uid {} and can read "
               "its token and each other's environment (a root lockstepd gives each job a uid "
               "of its own)",
               ::geteuid());
    } else if (config.run_as.empty() && config.job_uids != "off") {
      log.Warn("jobs are not isolated: their workers run as root, because this root daemon "
               "lacks {} to give each job a uid of its own",
               MissingUserSwitchCapabilities());
    } else if (config.run_as.empty()) {
      log.Warn("jobs are not isolated: their workers run as root (--job-uids=off)");
    } else {
      log.Warn("jobs are not isolated from each other: every job runs as {} (--job-uids gives "
               "each its own uid)", config.run_as);
    }
    options.allowed_commands = config.allowed_commands;
    options.allowed_env = config.allowed_env;
    for (char** e = environ; *e; ++e) options.base_env.push_back(*e);
    options.heartbeat_interval = FromSeconds(config.heartbeat_interval_s);
    options.lease = FromSeconds(config.lease_s);
    options.max_log_bytes = static_cast<int64_t>(config.max_log_mb * 1024 * 1024);
    if (tls.enabled()) {
      // Read at each launch: a renewed certificate reaches the next workers.
      options.worker_tls = [tls, config] { return ReadWorkerTls(tls, config); };
    }
    options.on_worker_exit = [&worker_exits](const std::string&, const v1::WorkerStatus& w) {
      worker_exits.Count(w);
    };
    agent = std::make_unique<Agent>(options, RealClock(), launcher.get(), &coordinator_client);
    agent_service = std::make_unique<AgentGrpcService>(agent.get());
  }

  // Metrics: bound before the gRPC port, so a busy metrics port stops the
  // daemon before it serves anything.
  RpcStats rpc_stats;
  MetricsRegistry metrics;
  std::unique_ptr<HttpServer> metrics_server;
  if (!config.metrics_listen.empty()) {
    metrics.AddCollector(ProcessCollector(LOCKSTEP_VERSION));
    if (coordinator) metrics.AddCollector(CoordinatorCollector(coordinator.get()));
    if (agent) metrics.AddCollector(AgentCollector(agent.get(), &worker_exits));
    metrics.AddCollector([&rpc_stats](std::vector<MetricFamily>* out) { rpc_stats.AppendTo(out); });
    // With TLS, HTTPS and a client certificate from the cluster's CA, as
    // on the gRPC port.
    HttpServerOptions metrics_options;
    if (tls.enabled()) {
      metrics_options.tls_ca_file = tls.ca_file;
      metrics_options.tls_cert_file = tls.cert_file;
      metrics_options.tls_key_file = tls.key_file;
      // Every job holds the workers' certificate: it does not read metrics.
      metrics_options.tls_refused_cert_file = config.tls_worker_cert;
    }
    auto served = HttpServer::Start(
        config.metrics_listen,
        [&metrics](const std::string& path) {
          if (path != "/metrics") return HttpResponse{404, "text/plain; charset=utf-8", "try /metrics\n"};
          return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", metrics.Render()};
        },
        "lockstepd metrics", metrics_options);
    if (!served.ok()) {
      log.Error("{}", std::string(served.status().message()));
      return 1;
    }
    metrics_server = std::move(*served);
    if (tls.enabled()) {
      log.Info("metrics: serving https://{}:{}/metrics (mutual TLS: scrapers present a "
               "certificate from --tls-ca)",
               HostOfAddress(config.metrics_listen), metrics_server->port());
    } else {
      log.Info("metrics: serving http://{}:{}/metrics", HostOfAddress(config.metrics_listen),
               metrics_server->port());
    }
  }
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  if (metrics_server) interceptors.push_back(NewRpcMetricsInterceptor(&rpc_stats));

  std::vector<grpc::Service*> services;
  std::vector<std::string> service_names;
  if (coordinator_service) {
    services.push_back(coordinator_service.get());
    service_names.push_back(v1::CoordinatorService::service_full_name());
  }
  if (store_service) {
    services.push_back(store_service.get());
    service_names.push_back(v1::StoreService::service_full_name());
  }
  if (agent_service) {
    services.push_back(agent_service.get());
    service_names.push_back(v1::AgentService::service_full_name());
  }
  // Requests whose bytes do not parse: INVALID_ARGUMENT, not gRPC's bare
  // UNIMPLEMENTED (rendezvous/malformed_request.h).
  interceptors.push_back(rendezvous::NewMalformedRequestInterceptor(std::move(service_names)));
  auto started =
      rendezvous::StartGrpcServer(config.listen, services, "lockstepd", std::move(interceptors));
  if (!started.ok()) {
    log.Error("{}", std::string(started.status().message()));
    return 1;
  }
  std::unique_ptr<grpc::Server> server = std::move(started->server);
  const int port = started->port;
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  health->SetServingStatus(false);
  std::string advertise = config.advertise;
  if (advertise.empty()) {
    std::string host = config.listen.substr(0, config.listen.rfind(':'));
    if (host == "0.0.0.0" || host == "[::]" || host == "::" || host.empty()) {
      char name[256] = {0};
      ::gethostname(name, sizeof(name) - 1);
      host = name;  // a wildcard is not an address others can dial
    }
    advertise = absl::StrCat(host, ":", port);
  }
  std::string coordinator_address =
      config.coordinator_address.empty() ? advertise : config.coordinator_address;
  log.Info("listening on {} (advertised {}), state dir {}, node {}{}", config.listen, advertise,
           config.state_dir, config.node_id,
           config.coordinator ? ", coordinator" : ", coordinator at " + coordinator_address);

  std::atomic<bool> stop{false};
  std::thread ticker;
  if (coordinator) {
    coordinator->SetStoreAddress(advertise);
    ticker = std::thread([&] {
      while (!stop.load()) {
        coordinator->Tick();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  }
  // glibc keeps what calls freed (cancelled waits, closed streams) in its
  // arenas; give it back to the system now and then, so what the daemon
  // holds follows its load down too (bench/daemon_load.sh, "released").
  std::thread trimmer([&] {
    for (int tick = 1; !stop.load(); ++tick) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (tick % 50 == 0) ::malloc_trim(0);
    }
  });
  if (agent) {
    coordinator_client.Connect(coordinator_address);
    agent->SetAgentAddress(advertise);
    agent->Start();
  }

  // Ready: the coordinator reloaded its table (above) and the agent is
  // registered. Only then does grpc.health.v1 answer SERVING.
  std::thread readiness([&] {
    while (!stop.load()) {
      if (!agent || agent->registered()) {
        health->SetServingStatus(true);
        log.Info("ready: health SERVING");
        if (!config.address_file.empty()) {
          std::string tmp = config.address_file + ".tmp";
          std::ofstream(tmp) << advertise << "\n";
          std::rename(tmp.c_str(), config.address_file.c_str());
        }
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });

  // Until SIGTERM or SIGINT; SIGHUP, or a token file changed on disk
  // (looked at every kTokenCheckInterval), re-reads the tokens.
  int sig = 0;
  std::string reload_error;  // logged once until it changes
  while (true) {
    const timespec wait{kTokenCheckInterval.count(), 0};
    sig = sigtimedwait(&sigs, nullptr, &wait);
    if (sig == SIGTERM || sig == SIGINT) break;
    if (sig != SIGHUP && !token_files.Changed()) continue;
    Status loaded = token_files.Load();
    if (loaded.ok()) {
      reload_error.clear();
      log.Info("tokens re-read ({}): {}", sig == SIGHUP ? "SIGHUP" : "a file changed",
               absl::StrJoin(token_files.paths(), ", "));
    } else if (loaded.ToString() != reload_error || sig == SIGHUP) {
      reload_error = loaded.ToString();
      log.Error("tokens not re-read, the ones in use stay: {}", reload_error);
    }
  }
  log.Info("signal {}: shutting down", sig);
  stop = true;
  if (metrics_server) metrics_server->Stop();
  readiness.join();
  health->SetServingStatus(false);
  if (agent) agent->Shutdown(FromSeconds(config.shutdown_grace_s));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server->Wait();
  if (ticker.joinable()) ticker.join();
  trimmer.join();
  log.Info("stopped");
  return 0;
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep

int main(int argc, char** argv) { return lockstep::daemon::Run(argc, argv); }
