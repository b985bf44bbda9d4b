// lockstepd: the Lockstep daemon. Every daemon is an agent (AgentService,
// worker supervision); with --coordinator it also hosts the coordinator
// (CoordinatorService, job table in <state-dir>/coordinator.db), the
// store (StoreService) the workers rendezvous through.
// Composition root: flags -> config -> construct -> wire -> serve.
// See daemon/README.md for the operator's view.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/address.h"
#include "common/clock.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/version.h"
#include "common/status.h"
#include "daemon/agent.h"
#include "daemon/agent_service.h"
#include "daemon/coordinator.h"
#include "daemon/job_env.h"
#include "daemon/coordinator_service.h"
#include "daemon/daemon_metrics.h"
#include "daemon/http_server.h"
#include "daemon/metrics.h"
#include "daemon/rpc_metrics.h"
#include "daemon/grpc_auth.h"
#include "daemon/grpc_coordinator_client.h"
#include "daemon/process_launcher.h"
#include "daemon/sqlite_job_store.h"
#include "daemon/token.h"
#include "rendezvous/grpc_limits.h"
#include "rendezvous/grpc_server.h"
#include "rendezvous/store_core.h"
#include "rendezvous/store_service.h"

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
  std::string node_id;
  std::string address_file;
  std::string run_as;
  std::string job_uids;
  uint32_t job_uid_first = 0;
  uint32_t job_uid_last = 0;
  std::vector<std::string> allowed_commands;
  std::vector<std::string> allowed_env;
  double lease_s = ToSeconds(kDefaultLease);
  double heartbeat_interval_s = ToSeconds(kDefaultHeartbeatInterval);
  double restart_backoff_s = ToSeconds(kDefaultRestartBackoff);
  double max_restart_backoff_s = ToSeconds(kDefaultMaxRestartBackoff);
  double shutdown_grace_s = 10;
  double retain_finished_s = ToSeconds(kDefaultFinishedJobRetention);
  std::string log_level;
  std::string metrics_listen;  // empty: no /metrics endpoint
};

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
               "bearer token file (default <state-dir>/token; created 0600 if missing)");
  flags.String("node-id", &c.node_id, "this node's stable id (default: hostname)");
  flags.String("address-file", &c.address_file,
               "write the bound address here once serving (for scripts using port 0)");
  flags.String("run-as", &c.run_as, "run workers as this user (never root)");
  flags.String("job-uids", &c.job_uids,
               "FIRST-LAST: each job's workers run as a uid of their own from this range "
               "(e.g. 61184-65519; needs root; replaces --run-as)");
  flags.StringList("allowed-command", &c.allowed_commands,
                   "if given (repeatable), jobs may only run these programs (command[0])");
  flags.StringList("allowed-env", &c.allowed_env,
                   "repeatable: a variable NAME or PREFIX* a job's --env may set, beyond the "
                   "engine's own (daemon/README.md, job environment)");
  flags.Double("lease-s", &c.lease_s,
               "a node is dead this long after its last heartbeat; its agent stops its "
               "workers this long after sending it (daemon/README.md, leases and fencing)");
  flags.Double("heartbeat-interval-s", &c.heartbeat_interval_s, "coordinator: agents heartbeat this often");
  flags.Double("restart-backoff-s", &c.restart_backoff_s, "coordinator: first restart backoff (doubles)");
  flags.Double("max-restart-backoff-s", &c.max_restart_backoff_s, "coordinator: backoff cap");
  flags.Double("retain-finished-s", &c.retain_finished_s,
               "coordinator: a finished job, its record and its logs on every node, is deleted "
               "this long after it ended (0 = kept until `lockstep delete`; default 7 days)");
  flags.Double("shutdown-grace-s", &c.shutdown_grace_s,
               "on SIGTERM: workers get this long after SIGTERM before SIGKILL");
  flags.String("log-level", &c.log_level, "trace|debug|info|warn|error (default LOCKSTEP_LOG_LEVEL or info)");
  flags.String("metrics-listen", &c.metrics_listen,
               "serve Prometheus metrics at http://HOST:PORT/metrics (port 0 = pick one, logged; "
               "default: off; daemon/README.md, Metrics)");
  flags.Version("lockstepd " LOCKSTEP_VERSION);
  ASSIGN_OR_RETURN(std::vector<std::string> rest, flags.Parse(argc, argv));
  if (!rest.empty()) return absl::InvalidArgumentError("unexpected argument: " + rest[0]);
  if (!c.coordinator && !c.agent) {
    return absl::InvalidArgumentError("--no-agent needs --coordinator: nothing to run");
  }
  if (!c.coordinator && c.coordinator_address.empty()) {
    return absl::InvalidArgumentError("--coordinator-address is required without --coordinator");
  }
  if (c.lease_s <= 0 || c.heartbeat_interval_s <= 0 || c.heartbeat_interval_s * 3 > c.lease_s) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--lease-s must be at least 3x --heartbeat-interval-s (got ", c.lease_s, " and ",
        c.heartbeat_interval_s, ")"));
  }
  if (!(c.retain_finished_s >= 0 && c.retain_finished_s <= 100.0 * 365 * 86400)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--retain-finished-s: want 0 (keep) to 100 years in seconds, got ", c.retain_finished_s));
  }
  if (c.run_as == "root" || c.run_as == "0") {
    return absl::InvalidArgumentError("--run-as: workers never run as root");
  }
  if (!c.job_uids.empty()) {
    std::vector<std::string> range = absl::StrSplit(c.job_uids, '-');
    if (range.size() != 2 || !absl::SimpleAtoi(range[0], &c.job_uid_first) ||
        !absl::SimpleAtoi(range[1], &c.job_uid_last) || c.job_uid_first == 0 ||
        c.job_uid_first > c.job_uid_last) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--job-uids: want FIRST-LAST with 0 < FIRST <= LAST, got ", QuoteForError(c.job_uids)));
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
  }
  RETURN_IF_ERROR(daemon::ValidateEnvPatterns(c.allowed_env));
  if (c.token_file.empty()) c.token_file = c.state_dir + "/token";
  if (c.node_id.empty()) {
    char host[256] = {0};
    ::gethostname(host, sizeof(host) - 1);
    c.node_id = host;
  }
  return c;
}

// The agent's CoordinatorClient, connected once the coordinator's address
// is known (after bind, when this daemon is the coordinator).
class DeferredCoordinatorClient : public CoordinatorClient {
 public:
  void Connect(const std::string& address, const std::string& token) {
    client_ = std::make_unique<GrpcCoordinatorClient>(
        rendezvous::CreateLockstepChannel(address), token, address);
  }
  StatusOr<v1::RegisterNodeResponse> RegisterNode(const v1::RegisterNodeRequest& request,
                                                  Duration timeout) override {
    return client_->RegisterNode(request, timeout);
  }
  StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request,
                                            Duration timeout) override {
    return client_->Heartbeat(request, timeout);
  }

 private:
  std::unique_ptr<GrpcCoordinatorClient> client_;  // set before the agent starts
};

Status MakeDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::UnavailableError(absl::StrCat("mkdir ", path, ": ", std::strerror(errno)));
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
  for (const auto& dir : {config.state_dir, config.state_dir + "/jobs"}) {
    s = MakeDir(dir);
    if (!s.ok()) {
      log.Error("{}", s.ToString());
      return 1;
    }
  }
  // One daemon per state dir: a second one would share the job table and
  // the workers' log files. The lock goes with the process, however it ends.
  const std::string lock_path = config.state_dir + "/lockstepd.lock";
  const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
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
  auto token = LoadToken(config.token_file, /*create=*/true);
  if (!token.ok()) {
    log.Error("{}", token.status().ToString());
    return 1;
  }

  // Block termination signals before any thread starts; main waits on them.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
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
    // Namespaces of superseded rounds and ended jobs (see CoordinatorOptions).
    options.drop_store_prefix = [store = store_core.get()](const std::string& prefix) {
      store->DeleteNamespacesWithPrefix(prefix);
    };
    coordinator = std::make_unique<Coordinator>(options, RealClock(), job_store.get());
    s = coordinator->Recover();
    if (!s.ok()) {
      log.Error("recovering the job table: {}", s.ToString());
      return 1;
    }
    coordinator_service = std::make_unique<CoordinatorGrpcService>(coordinator.get(), *token);
    // Workers hold their job's store token (LOCKSTEP_STORE_TOKEN), the CLI
    // and tools the admin token; see AuthorizeStore.
    store_service = std::make_unique<rendezvous::StoreGrpcService>(
        store_core.get(),
        [admin = *token](const std::multimap<grpc::string_ref, grpc::string_ref>& md,
                         absl::string_view ns) {
          auto it = md.find(kAuthorizationHeader);
          if (it == md.end()) return AuthorizeStore("", false, admin, ns);
          return AuthorizeStore(absl::string_view(it->second.data(), it->second.size()), true,
                                admin, ns);
        });
  }

  // Agent side. Its own address (and, with --coordinator, the
  // coordinator's) is known only after bind; it starts after that.
  std::unique_ptr<ProcessLauncher> launcher = NewPosixProcessLauncher();
  DeferredCoordinatorClient coordinator_client;
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
    // Say how isolated jobs are, once, where the operator looks.
    if (config.job_uid_first != 0) {
      log.Info("job isolation: each job runs as its own uid from {}-{}", config.job_uid_first,
               config.job_uid_last);
    } else if (::geteuid() != 0) {
      log.Warn("jobs are not isolated: their workers run as this daemon's uid {} and can read "
               "its token and each other's environment (run as root with --job-uids)",
               ::geteuid());
    } else if (config.run_as.empty()) {
      log.Warn("jobs are not isolated: their workers run as root (use --job-uids, or --run-as)");
    } else {
      log.Warn("jobs are not isolated from each other: every job runs as {} (--job-uids gives "
               "each its own uid)", config.run_as);
    }
    options.allowed_commands = config.allowed_commands;
    options.allowed_env = config.allowed_env;
    for (char** e = environ; *e; ++e) options.base_env.push_back(*e);
    options.heartbeat_interval = FromSeconds(config.heartbeat_interval_s);
    options.lease = FromSeconds(config.lease_s);
    options.admin_token = *token;
    options.on_worker_exit = [&worker_exits](const std::string&, const v1::WorkerStatus& w) {
      worker_exits.Count(w);
    };
    agent = std::make_unique<Agent>(options, RealClock(), launcher.get(), &coordinator_client);
    agent_service = std::make_unique<AgentGrpcService>(agent.get(), *token);
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
    auto served = HttpServer::Start(
        config.metrics_listen,
        [&metrics](const std::string& path) {
          if (path != "/metrics") return HttpResponse{404, "text/plain; charset=utf-8", "try /metrics\n"};
          return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", metrics.Render()};
        },
        "lockstepd metrics");
    if (!served.ok()) {
      log.Error("{}", std::string(served.status().message()));
      return 1;
    }
    metrics_server = std::move(*served);
    log.Info("metrics: serving http://{}:{}/metrics", HostOfAddress(config.metrics_listen),
             metrics_server->port());
  }
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  if (metrics_server) interceptors.push_back(NewRpcMetricsInterceptor(&rpc_stats));

  std::vector<grpc::Service*> services;
  if (coordinator_service) services.push_back(coordinator_service.get());
  if (store_service) services.push_back(store_service.get());
  if (agent_service) services.push_back(agent_service.get());
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
  if (agent) {
    coordinator_client.Connect(coordinator_address, *token);
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

  int sig = 0;
  sigwait(&sigs, &sig);
  log.Info("signal {}: shutting down", sig);
  stop = true;
  if (metrics_server) metrics_server->Stop();
  readiness.join();
  health->SetServingStatus(false);
  if (agent) agent->Shutdown(FromSeconds(config.shutdown_grace_s));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server->Wait();
  if (ticker.joinable()) ticker.join();
  log.Info("stopped");
  return 0;
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep

int main(int argc, char** argv) { return lockstep::daemon::Run(argc, argv); }
