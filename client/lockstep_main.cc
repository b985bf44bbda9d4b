// lockstep: the command-line client. Composition root: global flags, then
// one subcommand with its own flags. Talks to the coordinator (jobs, nodes)
// and, for logs, to the agent that holds the rank.
//
//   lockstep [--coordinator H:P] [--token-file F] [--json] SUBCOMMAND ...
//
// Exit codes: 0 ok; 1 an RPC failed (the message names the code and what);
// 2 bad usage; 3 `submit` (unless --detach), `run`, `logs --follow` or
// `watch` saw the job end other than SUCCEEDED; 128+N stopped by signal N.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <thread>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/certs.h"
#include "common/flags.h"
#include "client/json.h"
#include "client/standalone.h"
#include "client/state_lines.h"
#include "client/text.h"
#include "client/health_format.h"
#include "client/watch.h"
#include "common/ids.h"
#include "common/version.h"
#include "daemon/token.h"
#include "lockstep/v1/agent.grpc.pb.h"
#include "lockstep/v1/coordinator.grpc.pb.h"
#include "rendezvous/grpc_limits.h"
#include "rendezvous/grpc_status.h"
#include "rendezvous/tls.h"

namespace lockstep {
namespace client {
namespace {

constexpr char kDefaultCoordinator[] = "127.0.0.1:7070";
constexpr char kDefaultTokenFile[] = "/var/lib/lockstep/token";
constexpr auto kRpcTimeout = std::chrono::seconds(10);
constexpr int kExitRpc = 1;
constexpr int kExitUsage = 2;
constexpr int kExitJobNotSucceeded = 3;

struct Common {
  std::string coordinator;
  std::string token_file;
  bool json = false;
  // Mutual TLS (rendezvous/tls.h); empty: $LOCKSTEP_TLS_CA etc., else none.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  bool insecure_plaintext = false;
};

void AddCommon(FlagSet* flags, Common* c) {
  flags->String("coordinator", &c->coordinator,
                "coordinator host:port (default $LOCKSTEP_COORDINATOR or 127.0.0.1:7070)");
  flags->String("token-file", &c->token_file,
                "bearer token file: the coordinator's admin token, or its viewer.token for "
                "read-only use (default $LOCKSTEP_TOKEN_FILE or /var/lib/lockstep/token)");
  flags->Bool("json", &c->json, "print JSON instead of text");
  flags->String("tls-ca", &c->tls_ca,
                "mutual TLS: the cluster CA (default $LOCKSTEP_TLS_CA; none: plaintext, "
                "loopback only)");
  flags->String("tls-cert", &c->tls_cert,
                "mutual TLS: this client's certificate, e.g. client.pem from `lockstep certs` "
                "(default $LOCKSTEP_TLS_CERT)");
  flags->String("tls-key", &c->tls_key, "mutual TLS: its key (default $LOCKSTEP_TLS_KEY)");
  flags->Bool("insecure-plaintext", &c->insecure_plaintext,
              "without TLS: send the token to a non-loopback coordinator or agent in plaintext "
              "anyway (or $LOCKSTEP_INSECURE_PLAINTEXT=1)");
}

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// The signal that asked `lockstep run` to stop (0: none yet).
volatile sig_atomic_t g_stop_signal = 0;

void InstallStopHandlers() {
  struct sigaction sa {};
  sa.sa_handler = [](int sig) { g_stop_signal = sig; };
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

// Marks a status from deep in a command (a flag combination checked where
// it is used) as bad usage: main prints it as any error, and exits 2.
constexpr char kUsagePayload[] = "lockstep.client/usage";
Status AsUsage(Status s) {
  s.SetPayload(kUsagePayload, absl::Cord());
  return s;
}

// The coordinator refused what the flags said (it checks the spec, and
// logs the refusal): bad usage, exit 2. A spec field is named first in a
// refusal's message ("spec.run_as: ..."); InvalidArgument also covers a bad
// --request-id, AlreadyExists one reused with another spec.
bool RefusedSubmission(const Status& s) {
  if (absl::IsInvalidArgument(s) || absl::IsAlreadyExists(s)) return true;
  return absl::IsPermissionDenied(s) && absl::StrContains(s.message(), ": spec.");
}

// The directory this CLI runs in, as the user's shell names it: $PWD when
// it is this directory (a path through a symlink, e.g. a shared mount,
// more likely means the same on other nodes), else getcwd.
StatusOr<std::string> CurrentDir() {
  std::string cwd(4096, '\0');
  if (::getcwd(cwd.data(), cwd.size()) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot find the current directory: ", std::strerror(errno)));
  }
  cwd.resize(std::strlen(cwd.c_str()));
  const char* pwd = std::getenv("PWD");
  struct stat a, b;
  if (pwd && pwd[0] == '/' && ::stat(pwd, &a) == 0 && ::stat(cwd.c_str(), &b) == 0 &&
      a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
    return std::string(pwd);
  }
  return cwd;
}

// `path` made absolute against `base` and lexically normalized ("a/./b",
// "a/x/../b"). Symlinks are kept, not resolved: the program may exist only
// on the nodes, and some (a virtualenv's python) find their files through
// the path they were started by.
std::string AbsolutePath(const std::string& path, const std::string& base) {
  std::filesystem::path p(path);
  if (p.is_relative()) p = std::filesystem::path(base) / p;
  return p.lexically_normal().string();
}

class Cli {
 public:
  explicit Cli(Common common) : common_(std::move(common)) {}

  Status Connect() {
    if (common_.coordinator.empty()) {
      common_.coordinator = EnvOr("LOCKSTEP_COORDINATOR", kDefaultCoordinator);
    }
    // Transport first: no token is read for a channel that may not carry it.
    RETURN_IF_ERROR(SetUpTls());
    RETURN_IF_ERROR(rendezvous::CheckPlaintextAllowed(rendezvous::ProcessTls(),
                                                      common_.coordinator, "coordinator",
                                                      common_.insecure_plaintext));
    if (common_.token_file.empty()) {
      common_.token_file = EnvOr("LOCKSTEP_TOKEN_FILE", kDefaultTokenFile);
    }
    auto token = daemon::LoadToken(common_.token_file, /*create=*/false);
    if (absl::IsNotFound(token.status())) {
      return absl::NotFoundError(absl::StrCat(
          token.status().message(),
          "; name the coordinator's token with --token-file or $LOCKSTEP_TOKEN_FILE (lockstepd "
          "writes the admin token to <state-dir>/token, a read-only one to "
          "<state-dir>/viewer.token)"));
    }
    RETURN_IF_ERROR(token.status());
    token_ = *std::move(token);
    coord_ = v1::CoordinatorService::NewStub(
        rendezvous::CreateLockstepChannel(common_.coordinator));
    return absl::OkStatus();
  }

  // The process's TLS from the flags, else $LOCKSTEP_TLS_*; none for the
  // private plaintext daemon of `lockstep run`.
  Status SetUpTls() {
    if (private_daemon_) {
      rendezvous::SetProcessTls(rendezvous::TlsConfig{});
      return absl::OkStatus();
    }
    if (common_.tls_ca.empty()) common_.tls_ca = EnvOr("LOCKSTEP_TLS_CA", "");
    if (common_.tls_cert.empty()) common_.tls_cert = EnvOr("LOCKSTEP_TLS_CERT", "");
    if (common_.tls_key.empty()) common_.tls_key = EnvOr("LOCKSTEP_TLS_KEY", "");
    if (EnvOr("LOCKSTEP_INSECURE_PLAINTEXT", "") == "1") common_.insecure_plaintext = true;
    rendezvous::TlsConfig tls;
    tls.ca_file = common_.tls_ca;
    tls.cert_file = common_.tls_cert;
    tls.key_file = common_.tls_key;
    // Flags that cannot go together are bad usage (exit 2); a file that is
    // not what it should be is CheckTlsConfig's to name (exit 1).
    if ((!tls.cert_file.empty() || !tls.key_file.empty()) && tls.ca_file.empty()) {
      return AsUsage(absl::InvalidArgumentError("--tls-cert and --tls-key need --tls-ca"));
    }
    if (tls.cert_file.empty() != tls.key_file.empty()) {
      return AsUsage(absl::InvalidArgumentError("--tls-cert and --tls-key go together"));
    }
    RETURN_IF_ERROR(rendezvous::CheckTlsConfig(tls, /*need_identity=*/false));
    rendezvous::SetProcessTls(tls);
    return absl::OkStatus();
  }

  std::unique_ptr<grpc::ClientContext> Ctx(std::chrono::milliseconds timeout = kRpcTimeout) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata(daemon::kAuthorizationHeader, "Bearer " + token_);
    ctx->set_deadline(std::chrono::system_clock::now() + timeout);
    return ctx;
  }

  // A call to an agent: it carries a log ticket (daemon/log_ticket.h), never
  // this CLI's token.
  std::unique_ptr<grpc::ClientContext> AgentCtx(const std::string& ticket) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata(daemon::kAuthorizationHeader, "Ticket " + ticket);
    ctx->set_deadline(std::chrono::system_clock::now() + kRpcTimeout);
    return ctx;
  }

  // One agent to read a node's logs from.
  struct AgentRead {
    v1::AgentService::Stub* agent = nullptr;
    std::string address;
    std::string node;
    std::string ticket;  // for this job on that node
  };

  Status Check(const grpc::Status& s, const std::string& what) {
    return rendezvous::WithTlsReason(
        FromGrpcStatus(s, absl::StrCat(what, " (coordinator ", common_.coordinator, ")")),
        common_.coordinator);
  }

  // client/json.h: every field, numbers as numbers, enums without prefixes.
  void PrintJson(const google::protobuf::Message& m) { std::cout << ToJson(m) << "\n"; }

  StatusOr<v1::Job> GetJob(const std::string& id) {
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::GetJobResponse resp;
    RETURN_IF_ERROR(Check(coord_->GetJob(Ctx().get(), req, &resp), "get job " + id));
    return resp.job();
  }

  // ---------------------------------------------------------------- submit
  // `standalone`: `lockstep run` (or submit --standalone), see RunStandalone.
  StatusOr<int> Submit(const std::vector<std::string>& args, bool standalone) {
    const bool run_cmd = standalone;  // `lockstep run`, not submit --standalone
    FlagSet flags(standalone ? "lockstep run" : "lockstep submit",
                  standalone ? "Run a job on this host alone: start a private coordinator and "
                               "agent, run the job, print its output, exit with its state "
                               "(torchrun --standalone): lockstep run [flags] -- CMD ARGS"
                             : "Submit a job: lockstep submit [flags] -- CMD ARGS");
    AddCommon(&flags, &common_);
    std::string lockstepd, state_dir;
    flags.Bool("standalone", &standalone,
               "one host, no cluster: what `lockstep run` does");
    const std::string with_standalone = run_cmd ? "" : "with --standalone: ";
    flags.String("lockstepd", &lockstepd,
                 with_standalone + "the daemon to start (default $LOCKSTEPD, beside this "
                 "program, in the Bazel tree, or on PATH)");
    flags.String("state-dir", &state_dir,
                 with_standalone + "the private daemon's state dir, kept afterwards with the "
                 "job's logs (default $TMPDIR/lockstep-run-XXXXXX)");
    std::string nodes = "1";
    int32_t nproc = 1, max_restarts = 0;
    std::vector<std::string> env;
    std::string name, working_dir, run_as, request_id;
    bool wait = false;
    double stop_grace_s = 0, last_call_s = 0, join_timeout_s = 0;
    flags.String("nodes", &nodes,
                 run_cmd ? "nodes: 1 (lockstep run uses this host only)" : "N or MIN:MAX nodes");
    flags.Int32("nproc-per-node", &nproc, "workers per node");
    flags.Int32("max-restarts", &max_restarts, "restarts allowed for the whole job");
    flags.StringList("env", &env, "K=V for every worker (repeatable)");
    flags.String("name", &name, "a human-readable name");
    flags.String("working-dir", &working_dir,
                 "workers' working dir (default: the job's log dir; a relative one is taken "
                 "from here)");
    flags.String("run-as", &run_as, "user to run workers as (never root)");
    flags.Double("stop-grace-s", &stop_grace_s, "SIGTERM to SIGKILL grace (default 10)");
    flags.Double("last-call-s", &last_call_s, "wait this long for more than MIN nodes (default 2)");
    flags.Double("join-timeout-s", &join_timeout_s, "fail if MIN nodes never come (0 = wait)");
    flags.String("request-id", &request_id, "idempotency key (default: random)");
    int64_t max_open_files = 0, max_address_space = 0, max_cpu_seconds = 0, max_processes = 0;
    flags.Int("max-open-files", &max_open_files, "workers' RLIMIT_NOFILE (0 = inherit)");
    flags.Int("max-address-space", &max_address_space, "workers' RLIMIT_AS in bytes (0 = inherit)");
    flags.Int("max-cpu-seconds", &max_cpu_seconds, "workers' RLIMIT_CPU (0 = inherit)");
    flags.Int("max-processes", &max_processes,
              "workers' RLIMIT_NPROC: processes and threads of their uid, so per job on a node "
              "that gives each job a uid, where it may not pass the node's lockstepd "
              "--max-processes (0 = the node's, or inherit)");
    bool detach = false;
    flags.Bool("detach", &detach,
               "print the job id (with --json: the job) once it is accepted and return, instead "
               "of streaming its output until it ends");
    flags.Bool("wait", &wait,
               "stream until the job ends (the default; kept for scripts); --wait=false or "
               "--no-wait is --detach");
    flags.Short('d', "detach");
    // torchrun's spellings (its underscores, --nproc_per_node, are accepted
    // for every flag).
    flags.Alias("nnodes", "nodes");
    flags.Short('e', "env");
    // The flags that name a cluster mean nothing to a private daemon: `run`
    // does not list them, and refuses them below (as submit --standalone
    // does) rather than ignore them.
    static constexpr const char* kClusterFlags[] = {"coordinator", "token-file", "tls-ca",
                                                    "tls-cert",    "tls-key",    "insecure-plaintext"};
    if (run_cmd) {
      for (const char* f : kClusterFlags) flags.Hide(f);
      for (const char* f : {"standalone", "detach", "wait"}) flags.Hide(f);
    }
    // The program and its arguments follow lockstep's flags, with or
    // without "--", as torchrun takes them: everything from the first
    // argument that is not a flag is the program's, its flags included.
    auto rest = flags.Parse(args, /*stop_at_first_positional=*/true);
    if (!rest.ok()) return Usage(rest.status());
    if (run_cmd && !standalone) {
      return Usage(absl::InvalidArgumentError(
          "lockstep run always starts its own daemon (--no-standalone): to use a cluster's "
          "coordinator, lockstep submit"));
    }
    if (standalone) {
      // Given to `lockstep` itself, before the command, they land in common_.
      const bool global_set[] = {!common_.coordinator.empty() && !flags.WasSet("coordinator"),
                                 !common_.token_file.empty() && !flags.WasSet("token-file"),
                                 !common_.tls_ca.empty() && !flags.WasSet("tls-ca"),
                                 !common_.tls_cert.empty() && !flags.WasSet("tls-cert"),
                                 !common_.tls_key.empty() && !flags.WasSet("tls-key"),
                                 common_.insecure_plaintext && !flags.WasSet("insecure-plaintext")};
      for (size_t i = 0; i < std::size(kClusterFlags); ++i) {
        if (flags.WasSet(kClusterFlags[i]) || global_set[i]) {
          return Usage(absl::InvalidArgumentError(absl::StrCat(
              "--", kClusterFlags[i], " cannot be used with ",
              run_cmd ? "lockstep run" : "--standalone",
              ": it starts a coordinator and agent of its own on this host, in plaintext on "
              "loopback (lockstep submit uses a cluster's)")));
        }
      }
      if (nodes != "1" && nodes != "1:1") {
        return Usage(absl::InvalidArgumentError(
            absl::StrCat(run_cmd ? "lockstep run" : "--standalone",
                         " runs on this host only: --nodes must be 1, got \"", nodes, "\"")));
      }
    } else if (flags.WasSet("lockstepd") || flags.WasSet("state-dir")) {
      return Usage(absl::InvalidArgumentError("--lockstepd and --state-dir need --standalone"));
    }
    // --wait=false (--no-wait) asks for what --detach does.
    const bool no_wait = flags.WasSet("wait") && !wait;
    if ((detach || no_wait) && (wait || standalone)) {
      return Usage(absl::InvalidArgumentError(absl::StrCat(
          detach ? "--detach" : "--wait=false", " returns at once: it cannot be used with ",
          wait ? "--wait" : (run_cmd ? "lockstep run" : "--standalone"))));
    }
    detach = detach || no_wait;
    if (rest->empty()) {  // before reading a token or starting a daemon for nothing
      return Usage(absl::InvalidArgumentError("no command to run: expected -- CMD ARGS"));
    }
    // Workers start in their own directory on each node, so a relative
    // --working-dir, or a program given as a relative path ("./train"),
    // means what it means here: from this directory, the program from
    // --working-dir when given (where the worker would look for it). A bare
    // name stays a PATH lookup on the node.
    const bool relative_program = !rest->empty() && !(*rest)[0].empty() &&
                                  (*rest)[0][0] != '/' &&
                                  (*rest)[0].find('/') != std::string::npos;
    if (relative_program || (!working_dir.empty() && working_dir[0] != '/')) {
      ASSIGN_OR_RETURN(std::string cwd, CurrentDir());
      if (!working_dir.empty()) working_dir = AbsolutePath(working_dir, cwd);
      if (relative_program) {
        (*rest)[0] = AbsolutePath((*rest)[0], working_dir.empty() ? cwd : working_dir);
      }
    }
    v1::SubmitJobRequest req;
    v1::JobSpec* spec = req.mutable_spec();
    for (const auto& a : *rest) spec->add_command(a);
    std::vector<std::string> mm = absl::StrSplit(nodes, ':');
    int32_t min_nodes = 0, max_nodes = 0;
    if (mm.size() > 2 || !absl::SimpleAtoi(mm[0], &min_nodes) ||
        !absl::SimpleAtoi(mm.back(), &max_nodes)) {
      return Usage(absl::InvalidArgumentError("--nodes: expected N or MIN:MAX, got \"" + nodes + "\""));
    }
    if (max_nodes == 0) {  // 0 in the spec means "as min": never what was typed
      return Usage(absl::InvalidArgumentError("--nodes: the node count must be 1 or more, got \"" +
                                              nodes + "\""));
    }
    spec->set_min_nodes(min_nodes);
    spec->set_max_nodes(max_nodes);
    spec->set_nproc_per_node(nproc);
    spec->set_max_restarts(max_restarts);
    for (const auto& kv : env) {
      auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) {
        return Usage(absl::InvalidArgumentError("--env: expected K=V, got \"" + kv + "\""));
      }
      (*spec->mutable_env())[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    spec->set_name(name);
    spec->set_working_dir(working_dir);
    spec->set_run_as(run_as);
    spec->set_stop_grace_s(stop_grace_s);
    spec->set_last_call_timeout_s(last_call_s);
    spec->set_join_timeout_s(join_timeout_s);
    spec->mutable_limits()->set_max_open_files(max_open_files);
    spec->mutable_limits()->set_max_address_space(max_address_space);
    spec->mutable_limits()->set_max_cpu_seconds(max_cpu_seconds);
    spec->mutable_limits()->set_max_processes(max_processes);
    req.set_request_id(request_id.empty() ? NewRandomId("req-") : request_id);
    if (standalone) return RunStandalone(req, lockstepd, state_dir);
    RETURN_IF_ERROR(Connect());
    v1::SubmitJobResponse resp;
    Status submitted = Check(coord_->SubmitJob(Ctx().get(), req, &resp), "submit");
    if (RefusedSubmission(submitted)) return AsUsage(std::move(submitted));
    if (absl::IsDeadlineExceeded(submitted) || absl::IsUnavailable(submitted)) {
      // The request may have reached the coordinator: say how to retry it
      // without a second job.
      return absl::Status(submitted.code(),
                          absl::StrCat(submitted.message(),
                                       "; the job may or may not have been accepted: the same "
                                       "command with --request-id ",
                                       req.request_id(), " submits it at most once"));
    }
    RETURN_IF_ERROR(submitted);
    const std::string id = resp.job().job_id();
    if (detach) {
      if (common_.json) {
        PrintJson(resp.job());
      } else {
        std::cout << "submitted job " << id << "\n";
      }
      return 0;
    }
    // JSON: one job object per state change (JSON lines), no job output.
    if (common_.json) return FollowJson(id);
    // Like `ray job submit`: the job's output, every rank prefixed, and
    // its state changes, until it ends. Ctrl-C stops following, not the job.
    std::cout << "submitted job " << id << std::endl;
    InstallStopHandlers();
    LogView view;
    view.all_ranks = true;
    view.stderr_stream = true;
    view.prefixed = true;
    view.follow = true;
    view.state_lines = true;
    ASSIGN_OR_RETURN(int code, FollowLogs(id, view));
    if (g_stop_signal != 0) {
      std::cerr << "lockstep: stopped following; job " << id << " keeps running (lockstep cancel "
                << id << " stops it, lockstep logs -f -a " << id << " follows it again)\n";
    }
    return code;
  }

  // A private lockstepd for this one job: started, given the job, followed
  // (state changes and every rank's output, prefixed "[R] ") until the job
  // ends, then stopped. A SIGINT or SIGTERM cancels the job first, so the
  // workers get their grace period, then exits 128+signal. Exit codes
  // otherwise as for submit --wait.
  StatusOr<int> RunStandalone(const v1::SubmitJobRequest& req, const std::string& lockstepd,
                              const std::string& state_dir) {
    StandaloneDaemon::Options options;
    ASSIGN_OR_RETURN(options.lockstepd, FindLockstepd(lockstepd));
    options.state_dir = state_dir;
    ASSIGN_OR_RETURN(std::unique_ptr<StandaloneDaemon> daemon,
                     StandaloneDaemon::Start(std::move(options)));
    InstallStopHandlers();
    common_.coordinator = daemon->address();
    common_.token_file = daemon->token_file();
    private_daemon_ = true;
    RETURN_IF_ERROR(Connect());
    if (!common_.json) {
      std::cout << "standalone: lockstepd at " << daemon->address() << ", state dir "
                << daemon->state_dir() << std::endl;
    }
    v1::SubmitJobResponse resp;
    Status submitted = Check(coord_->SubmitJob(Ctx().get(), req, &resp), "submit");
    if (RefusedSubmission(submitted)) return AsUsage(std::move(submitted));
    RETURN_IF_ERROR(submitted);
    const std::string id = resp.job().job_id();
    if (!common_.json) std::cout << "submitted job " << id << std::endl;
    RankLogTail tail(daemon->job_dir(id), [&](int rank, bool is_stderr, const std::string& line) {
      if (common_.json) return;  // stdout carries the job's JSON only
      if (!RepeatedHeader(id, is_stderr, line)) {
        PrintRankLine(is_stderr ? std::cerr : std::cout, rank, line);
      }
    });
    int64_t version = 0;
    StateLines state_lines;
    bool cancelled = false;
    v1::Job job = resp.job();
    while (true) {
      if (g_stop_signal != 0 && !cancelled) {
        std::cerr << "lockstep: signal " << g_stop_signal << ": cancelling job " << id << "\n";
        v1::CancelJobRequest cancel;
        cancel.set_job_id(id);
        v1::CancelJobResponse cancel_resp;
        RETURN_IF_ERROR(Check(coord_->CancelJob(Ctx().get(), cancel, &cancel_resp), "cancel " + id));
        cancelled = true;
      }
      v1::WatchJobRequest watch;
      watch.set_job_id(id);
      watch.set_after_version(version);
      v1::WatchJobResponse wresp;
      grpc::Status s = coord_->WatchJob(Ctx(std::chrono::milliseconds(250)).get(), watch, &wresp);
      if (s.ok()) {
        version = wresp.version();
        job = wresp.job();
        if (!common_.json) state_lines.Print(job, std::cout);
      } else if (s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
        RETURN_IF_ERROR(Check(s, "watch job " + id));
      }
      tail.Poll(IsTerminal(job.state()));
      std::cout << std::flush;
      if (IsTerminal(job.state())) break;
    }
    if (common_.json) {
      PrintJson(job);
    } else {
      std::cout << "logs:       " << daemon->job_dir(id) << "/rank-R.{stdout,stderr}; daemon log "
                << daemon->log_path() << "\n";
    }
    Status stopped = daemon->Stop();
    if (!stopped.ok()) std::cerr << "lockstep: " << Printable(stopped.message()) << "\n";
    if (cancelled) return 128 + g_stop_signal;
    return job.state() == v1::JOB_STATE_SUCCEEDED ? 0 : kExitJobNotSucceeded;
  }

  // `submit --json` and `watch --json`: long-polls WatchJob until the job
  // ends, printing the job as a JSON line at each change. Returns the exit
  // code (0 SUCCEEDED, else 3).
  // stdout carries the job's JSON only: while the coordinator does not
  // answer (restarting, or a wrong address or TLS setting), it keeps trying
  // and says so on stderr, when that starts, every 30 s, and when it ends.
  StatusOr<int> FollowJson(const std::string& id) {
    int64_t version = 0;
    std::optional<std::chrono::steady_clock::time_point> unreachable_since, said_at;
    while (true) {
      v1::WatchJobRequest req;
      req.set_job_id(id);
      req.set_after_version(version);
      v1::WatchJobResponse resp;
      grpc::Status s = coord_->WatchJob(Ctx().get(), req, &resp);
      if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) continue;
      const auto now = std::chrono::steady_clock::now();
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
        if (!unreachable_since) unreachable_since = now;
        if (!said_at || now - *said_at >= std::chrono::seconds(30)) {
          const auto for_s =
              std::chrono::duration_cast<std::chrono::seconds>(now - *unreachable_since).count();
          const Status why = Check(s, "watch job " + id);
          std::cerr << "lockstep: " << absl::StatusCodeToString(why.code()) << ": " << why.message()
                    << (said_at ? absl::StrCat(" (for ", for_s, " s)") : "")
                    << "; still trying every 0.5 s\n";
          said_at = now;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        continue;
      }
      if (said_at) {
        std::cerr << "lockstep: coordinator " << common_.coordinator << " answers again\n";
        said_at.reset();
      }
      unreachable_since.reset();
      RETURN_IF_ERROR(Check(s, "watch job " + id));
      version = resp.version();
      PrintJson(resp.job());
      if (IsTerminal(resp.job().state())) {
        return resp.job().state() == v1::JOB_STATE_SUCCEEDED ? 0 : kExitJobNotSucceeded;
      }
    }
  }

  // ---------------------------------------------------------------- status
  StatusOr<int> Status_(const std::vector<std::string>& args) {
    FlagSet flags("lockstep status", "Show a job: lockstep status JOB");
    AddCommon(&flags, &common_);
    auto rest = flags.Parse(args);
    if (!rest.ok()) return Usage(rest.status());
    if (rest->size() != 1) return Usage(OneJobId("status", *rest));
    RETURN_IF_ERROR(Connect());
    ASSIGN_OR_RETURN(v1::Job job, GetJob((*rest)[0]));
    if (common_.json) {
      PrintJson(job);
      return 0;
    }
    const auto& spec = job.spec();
    std::cout << "job:        " << job.job_id() << (spec.name().empty() ? "" : "  (" + Printable(spec.name()) + ")")
              << "\n"
              << "state:      " << StateName(job.state()) << "\n"
              << "message:    " << Printable(job.message()) << "\n"
              << "command:    " << Printable(absl::StrJoin(spec.command(), " ")) << "\n"
              << "nodes:      " << spec.min_nodes() << ":" << spec.max_nodes() << " x "
              << spec.nproc_per_node() << " workers; round " << job.round() << " on ["
              << absl::StrJoin(job.node_ids(), ", ") << "], world size " << job.world_size() << "\n"
              << "restarts:   " << job.restart_count() << " of max " << spec.max_restarts()
              << (job.rescale_count() ? absl::StrCat(" (+", job.rescale_count(), " membership changes)") : "")
              << "\n"
              << "submitted:  " << TimeOf(job.submitted_unix_ms()) << "\n";
    if (job.finished_unix_ms()) std::cout << "finished:   " << TimeOf(job.finished_unix_ms()) << "\n";
    if (job.has_first_failure()) {
      const v1::Failure& f = job.first_failure();
      std::cout << "failure:    round " << f.round() << ": ";
      if (f.rank() >= 0 && f.waiting_ranks_size() > 0) {
        std::cout << "rank " << f.rank() << " on node " << f.node_id()
                  << " did not arrive: rank" << (f.waiting_ranks_size() > 1 ? "s " : " ")
                  << absl::StrJoin(f.waiting_ranks(), ", ")
                  << " gave up waiting for it (hung, stopped or cut off)\n";
      } else if (f.rank() >= 0) {
        std::cout << "rank " << f.rank() << " on node " << f.node_id() << " "
                  << (f.exit().signal() ? absl::StrCat("killed by signal ", f.exit().signal())
                                        : absl::StrCat("exit code ", f.exit().exit_code()))
                  << (f.exit().oom_killed() ? " (out of memory: the kernel's OOM killer)" : "")
                  << (f.exit().startup_failure() ? " (startup failure: died in the engine's bootstrap)" : "")
                  << (f.exit().launch_error() ? " (launch error: not retried)" : "")
                  << "\n";
      } else {
        std::cout << Printable(f.reason()) << "\n";
      }
      if (!f.exit().message().empty()) std::cout << "            " << Printable(f.exit().message()) << "\n";
      for (const auto& l : f.exit().last_log_lines()) std::cout << "  | " << Printable(l) << "\n";
      // What followed in the same round: consequences, not causes.
      for (const auto& c : job.consequences()) {
        std::cout << "then:       rank " << c.rank() << " on node " << c.node_id() << " "
                  << (c.exit().signal() ? absl::StrCat("killed by signal ", c.exit().signal())
                                        : absl::StrCat("exit code ", c.exit().exit_code()))
                  << (c.exit().peer_lost() ? " (its collective lost a peer)" : "")
                  << ", after rank " << f.rank() << " failed\n";
      }
    }
    if (job.workers_size()) {
      std::cout << absl::StrFormat("%-5s %-12s %-8s %-9s %-8s %-10s %-11s %s\n", "RANK", "NODE",
                                   "PID", "STATE", "STEP", "LOSS", "SAMPLES/S", "EXIT");
      for (const auto& w : job.workers()) {
        std::cout << absl::StrFormat(
            "%-5d %-12s %-8d %-9s %-8d %-10.4f %-11.1f %s\n", w.rank(), w.node_id(), w.pid(),
            WorkerStateName(w.state()), w.progress().step(), w.progress().loss(),
            w.progress().samples_per_s(),
            w.state() == v1::WORKER_STATE_EXITED || w.state() == v1::WORKER_STATE_STOPPED
                ? (w.exit().signal() ? absl::StrCat("signal ", w.exit().signal(),
                                                    w.exit().oom_killed() ? " (OOM)" : "")
                                     : absl::StrCat("code ", w.exit().exit_code()))
                : "-");
      }
      std::cout << StepSplitTable(job);
    }
    for (const auto& line : HealthLines(job)) std::cout << line << "\n";
    PrintLogHint(job);
    std::cout << "history:\n";
    for (const auto& e : job.history()) {
      std::cout << "  " << TimeOf(e.unix_ms()) << "  " << absl::StrFormat("%-11s", StateName(e.state()))
                << " round " << e.round() << "  " << Printable(e.detail()) << "\n";
    }
    return 0;
  }

  void PrintLogHint(const v1::Job& job) {
    if (job.workers_size() == 0) return;
    std::cout << "logs:       lockstep logs " << job.job_id() << " --rank R   (files: "
              << job.workers(0).stdout_path().substr(
                     0, job.workers(0).stdout_path().rfind('/') + 1)
              << "rank-R.{stdout,stderr} on each node)\n";
  }

  // ---------------------------------------------------------------- list
  StatusOr<int> List(const std::vector<std::string>& args) {
    FlagSet flags("lockstep list", "List jobs");
    AddCommon(&flags, &common_);
    auto rest = flags.Parse(args);
    if (!rest.ok()) return Usage(rest.status());
    if (!rest->empty()) {
      return Usage(absl::InvalidArgumentError(
          absl::StrCat("list takes no arguments, got \"", Printable((*rest)[0]), "\"")));
    }
    RETURN_IF_ERROR(Connect());
    // Every page (the coordinator answers at most 16 MiB of jobs at a time).
    v1::ListJobsResponse resp;
    v1::ListJobsRequest req;
    for (int page = 1;; ++page) {
      v1::ListJobsResponse part;
      RETURN_IF_ERROR(Check(coord_->ListJobs(Ctx().get(), req, &part),
                            absl::StrCat("list jobs (page ", page, ")")));
      if (part.jobs_size() == 0 && !part.next_page_token().empty()) {
        return absl::InternalError(absl::StrCat("list jobs: page ", page,
                                                " is empty but says more follow"));
      }
      for (auto& job : *part.mutable_jobs()) *resp.add_jobs() = std::move(job);
      if (part.next_page_token().empty()) break;
      req.set_page_token(part.next_page_token());
    }
    if (common_.json) {
      PrintJson(resp);
      return 0;
    }
    std::cout << JobListTable({resp.jobs().begin(), resp.jobs().end()});
    return 0;
  }

  // ---------------------------------------------------------------- cancel
  StatusOr<int> Cancel(const std::vector<std::string>& args) {
    FlagSet flags("lockstep cancel", "Cancel a job: lockstep cancel JOB");
    AddCommon(&flags, &common_);
    auto rest = flags.Parse(args);
    if (!rest.ok()) return Usage(rest.status());
    if (rest->size() != 1) return Usage(OneJobId("cancel", *rest));
    RETURN_IF_ERROR(Connect());
    v1::CancelJobRequest req;
    req.set_job_id((*rest)[0]);
    v1::CancelJobResponse resp;
    RETURN_IF_ERROR(Check(coord_->CancelJob(Ctx().get(), req, &resp), "cancel " + req.job_id()));
    if (common_.json) {
      PrintJson(resp.job());
    } else {
      std::cout << "cancelled job " << resp.job().job_id()
                << " (agents stop its workers: SIGTERM, SIGKILL after " << resp.job().spec().stop_grace_s()
                << "s)\n";
    }
    return 0;
  }

  // ----------------------------------------------------------------- certs
  // A cluster CA and certificates (common/certs.h); talks to no daemon.
  StatusOr<int> Certs(const std::vector<std::string>& args) {
    FlagSet flags("lockstep certs",
                  "Make a cluster CA and mutual TLS certificates: lockstep certs --out DIR "
                  "--hosts HOST,IP,... (reuses DIR/ca.pem and DIR/ca.key when present)");
    std::string out, hosts;
    int32_t days = certs::kDefaultCertDays;
    flags.String("out", &out, "directory to write into (created if missing)");
    flags.String("hosts", &hosts,
                 "comma-separated DNS names or IP addresses, one certificate each: every "
                 "address a node is dialled at (its --advertise-address host)");
    flags.Int32("days", &days,
                absl::StrCat("validity of the certificates in days, 1 to ", certs::kMaxCertDays));
    // --json is refused below with a reason, wherever it is given.
    flags.Bool("json", &common_.json, "refused: certs prints no JSON");
    flags.Hide("json");
    auto rest = flags.Parse(args);
    if (!rest.ok()) return Usage(rest.status());
    std::vector<std::string> list = absl::StrSplit(hosts, ',', absl::SkipEmpty());
    const char* missing = out.empty()      ? "--out DIR (where to write) is missing"
                          : !flags.WasSet("hosts") ? "--hosts HOST,... (a certificate each) is missing"
                          : list.empty()   ? "--hosts names no host"
                                           : nullptr;
    if (missing != nullptr) {
      return Usage(absl::InvalidArgumentError(
          absl::StrCat("certs: ", missing, " (lockstep certs --out DIR --hosts HOST,...)")));
    }
    if (!rest->empty()) {
      return Usage(absl::InvalidArgumentError(absl::StrCat(
          "certs takes no arguments, got ", QuoteForError((*rest)[0]), " (hosts go in --hosts)")));
    }
    // It writes files and names them; it has no JSON to print (it printed
    // its text and ignored --json).
    if (common_.json) {
      return Usage(absl::InvalidArgumentError("certs prints no JSON: leave out --json"));
    }
    auto written = certs::WriteClusterCerts(out, list, days);
    if (absl::IsInvalidArgument(written.status())) return Usage(written.status());
    RETURN_IF_ERROR(written.status());
    if (std::find(written->begin(), written->end(), out + "/ca.pem") == written->end()) {
      std::cout << "reused " << out << "/ca.pem and " << out << "/ca.key (the cluster's CA)\n";
    }
    for (const std::string& path : *written) std::cout << "wrote " << path << "\n";
    std::cout << "lockstepd on HOST: --tls-ca " << out << "/ca.pem --tls-cert " << out
              << "/HOST.pem --tls-key " << out << "/HOST.key --tls-worker-cert " << out
              << "/worker.pem --tls-worker-key " << out << "/worker.key\n"
              << "lockstep: --tls-ca " << out << "/ca.pem --tls-cert " << out
              << "/client.pem --tls-key " << out << "/client.key (or LOCKSTEP_TLS_CA, "
              << "LOCKSTEP_TLS_CERT, LOCKSTEP_TLS_KEY)\n"
              << "keep " << out << "/ca.key off the nodes: it signs certificates\n";
    return 0;
  }

  // ---------------------------------------------------------------- delete
  StatusOr<int> Delete(const std::vector<std::string>& args) {
    FlagSet flags("lockstep delete",
                  "Delete finished jobs, their records and their logs on every node: lockstep "
                  "delete JOB...");
    AddCommon(&flags, &common_);
    auto rest = flags.Parse(args);
    if (!rest.ok()) return Usage(rest.status());
    if (rest->empty()) return Usage(absl::InvalidArgumentError("delete: expected one or more JOB ids"));
    RETURN_IF_ERROR(Connect());
    Status first_error;
    for (const auto& id : *rest) {
      v1::DeleteJobRequest req;
      req.set_job_id(id);
      v1::DeleteJobResponse resp;
      Status s = Check(coord_->DeleteJob(Ctx().get(), req, &resp), "delete " + id);
      if (!s.ok()) {
        std::cerr << "lockstep: " << absl::StatusCodeToString(s.code()) << ": "
                  << Printable(s.message()) << "\n";
        if (first_error.ok()) first_error = s;
        continue;
      }
      if (common_.json) {
        PrintJson(resp.job());
      } else {
        std::cout << "deleted job " << id << " (" << StateName(resp.job().state())
                  << "; its logs go from each node at its next heartbeat)\n";
      }
    }
    return first_error.ok() ? 0 : kExitRpc;
  }

  // ---------------------------------------------------------------- nodes
  StatusOr<int> NodesCmd(const std::vector<std::string>& args) {
    FlagSet flags("lockstep nodes", "List nodes");
    AddCommon(&flags, &common_);
    auto rest = flags.Parse(args);
    if (!rest.ok()) return Usage(rest.status());
    if (!rest->empty()) {
      return Usage(absl::InvalidArgumentError(
          absl::StrCat("nodes takes no arguments, got \"", Printable((*rest)[0]), "\"")));
    }
    RETURN_IF_ERROR(Connect());
    v1::ListNodesResponse resp;
    RETURN_IF_ERROR(Check(coord_->ListNodes(Ctx().get(), {}, &resp), "list nodes"));
    if (common_.json) {
      PrintJson(resp);
      return 0;
    }
    std::cout << absl::StrFormat("%-16s %-22s %-6s %-9s %-24s %s\n", "NODE", "ADDRESS", "ALIVE",
                                 "LAST_HB", "INCARNATION", "JOBS");
    for (const auto& n : resp.nodes()) {
      std::cout << absl::StrFormat("%-16s %-22s %-6s %-9s %-24s %s\n", n.node_id(), Printable(n.agent_address()),
                                   n.alive() ? "yes" : "DEAD",
                                   absl::StrFormat("%.1fs", n.last_heartbeat_age_s()),
                                   Printable(n.incarnation()),
                                   absl::StrJoin(n.job_ids(), ","));
    }
    return 0;
  }

  // ---------------------------------------------------------------- logs
  // One rank's stream on one node, as far as this CLI has printed it.
  struct LogCursor {
    int64_t offset = 0;
    std::string generation;  // of the file `offset` counts in (ReadLogs)
    bool started = false;
    std::string partial;  // an unfinished line, for the prefixed view
  };

  // What FollowLogs prints: one rank or all, which streams, from where.
  struct LogView {
    bool all_ranks = false;
    int rank = 0;
    bool stdout_stream = true;
    bool stderr_stream = false;
    bool prefixed = false;   // "[R] line"; stderr lines go to stderr
    bool follow = false;     // until the job ends, through restarts
    bool state_lines = false;  // also "lockstep: <state>" on each change (submit)
    int64_t tail_bytes = 0;
    int64_t tail_lines = 0;
    bool tail_bytes_given = false;  // --tail-bytes: that window exactly, whatever the lines
  };

  StatusOr<int> Logs(const std::vector<std::string>& args) {
    FlagSet flags("lockstep logs",
                  "Print a rank's output: lockstep logs JOB [--rank R | --all-ranks] [--follow] "
                  "[--stderr] [--tail N] [--tail-bytes B]");
    AddCommon(&flags, &common_);
    int32_t rank = 0;
    bool follow = false, stderr_stream = false, all_ranks = false;
    int64_t tail = 0, tail_lines = 0;
    flags.Int32("rank", &rank, "global rank");
    flags.Bool("all-ranks", &all_ranks, "every rank, each line prefixed \"[R] \"");
    flags.Bool("follow", &follow,
               "keep printing, through restarts and while workers have not started yet, until "
               "the job ends; then print its final state and exit 0 if it SUCCEEDED, else 3");
    flags.Bool("stderr", &stderr_stream, "print stderr instead of stdout");
    flags.Int("tail-bytes", &tail, "start this many bytes before the end");
    flags.Int("tail", &tail_lines,
              "start with the last N lines, looked for in the last N KiB (at most 1 MiB) or in "
              "the last --tail-bytes when given");
    flags.Short('f', "follow");
    flags.Short('r', "rank");
    flags.Short('a', "all-ranks");
    auto rest = flags.Parse(args);
    if (!rest.ok()) return Usage(rest.status());
    if (rest->size() != 1) return Usage(OneJobId("logs", *rest, "; a rank is --rank R"));
    if (all_ranks && common_.json) {
      return Usage(absl::InvalidArgumentError("--all-ranks prints text: drop --json"));
    }
    if (all_ranks && flags.WasSet("rank")) {
      return Usage(absl::InvalidArgumentError("--rank and --all-ranks exclude each other"));
    }
    if (rank < 0) {
      return Usage(absl::InvalidArgumentError(absl::StrCat("--rank: expected 0 or more, got ", rank)));
    }
    if (flags.WasSet("tail") && tail_lines <= 0) {
      return Usage(absl::InvalidArgumentError(
          absl::StrCat("--tail: expected 1 or more lines, got ", tail_lines)));
    }
    if (flags.WasSet("tail-bytes") && tail <= 0) {
      return Usage(absl::InvalidArgumentError(
          absl::StrCat("--tail-bytes: expected 1 or more bytes, got ", tail)));
    }
    RETURN_IF_ERROR(Connect());
    LogView view;
    view.all_ranks = all_ranks;
    view.rank = rank;
    view.stdout_stream = !stderr_stream;
    view.stderr_stream = stderr_stream;
    view.prefixed = all_ranks;
    view.follow = follow;
    view.tail_lines = tail_lines;
    view.tail_bytes = tail;
    view.tail_bytes_given = flags.WasSet("tail-bytes");
    if (tail_lines > 0 && !flags.WasSet("tail-bytes")) {
      view.tail_bytes = std::min<int64_t>(int64_t{1} << 20, tail_lines * 1024);
    }
    return FollowLogs((*rest)[0], view);
  }

  // Prints a job's logs as `view` says. Without view.follow: what is there
  // now, then 0. With it: until the job ends (waiting for workers to
  // start, across restarts and an agent that is down for a while), then
  // the final state on stderr; 0 if it SUCCEEDED, else 3. With the stop
  // handlers installed (submit: InstallStopHandlers) a SIGINT or SIGTERM
  // ends it with 128+N; `logs` keeps their default action. Either way the
  // job is left alone.
  StatusOr<int> FollowLogs(const std::string& id, const LogView& view) {
    using CursorKey = std::tuple<int, std::string, bool>;  // (rank, node, is_stderr)
    std::map<CursorKey, LogCursor> cursors;
    std::set<CursorKey> placed;  // what the last poll read: the ranks' nodes then
    std::map<std::string, v1::LogTicket> tickets;  // node -> its agent and log ticket
    std::map<std::string, std::unique_ptr<v1::AgentService::Stub>> agents;
    // The agent serving `node`'s logs, with its address and a log ticket for
    // this job there (from the coordinator, renewed a minute before it
    // expires, or after the agent refused it: forget_ticket).
    auto agent_of = [&](const std::string& node, int rank) -> StatusOr<AgentRead> {
      auto it = tickets.find(node);
      if (it == tickets.end() || it->second.expires_unix_s() - 60 < NowUnixMs() / 1000) {
        v1::IssueLogTicketsRequest req;
        req.set_job_id(id);
        req.add_node_ids(node);
        v1::IssueLogTicketsResponse resp;
        RETURN_IF_ERROR(Check(coord_->IssueLogTickets(Ctx().get(), req, &resp),
                              absl::StrCat("log ticket for job ", id, " on node ", node)));
        if (resp.tickets_size() != 1 || resp.tickets(0).node_id() != node) {
          return absl::InternalError(absl::StrCat("the coordinator answered no log ticket for node ",
                                                  node));
        }
        it = tickets.insert_or_assign(node, resp.tickets(0)).first;
      }
      AgentRead read;
      read.address = it->second.agent_address();
      read.node = node;
      read.ticket = it->second.ticket();
      if (read.address.empty()) {
        return absl::NotFoundError(
            absl::StrCat("node ", node, " of rank ", rank, " is not registered"));
      }
      auto& agent = agents[read.address];
      if (!agent) {
        RETURN_IF_ERROR(rendezvous::CheckPlaintextAllowed(rendezvous::ProcessTls(), read.address,
                                                          "agent", common_.insecure_plaintext));
        agent = v1::AgentService::NewStub(rendezvous::CreateLockstepChannel(read.address));
      }
      read.agent = agent.get();
      return read;
    };
    // A ticket the agent refused (expired by its clock, or one from before
    // the coordinator's key changed) is asked for again at the next read.
    auto forget_ticket = [&](const std::string& node, const Status& read) {
      if (absl::IsUnauthenticated(read) || absl::IsPermissionDenied(read)) tickets.erase(node);
    };
    bool said_waiting = false;
    StateLines state_lines;
    std::set<std::string> unreachable;  // agents whose last read failed (said once)
    std::set<CursorKey> no_output;      // ranks whose file was never made (said once)
    while (true) {
      if (g_stop_signal != 0) return 128 + g_stop_signal;
      StatusOr<v1::Job> got = GetJob(id);
      if (absl::IsUnavailable(got.status()) && view.follow) {
        // The coordinator restarting does not end a follow.
        std::cerr << "lockstep: " << Printable(got.status().message()) << " (retrying)\n";
        std::this_thread::sleep_for(std::chrono::seconds(1));
        continue;
      }
      RETURN_IF_ERROR(got.status());
      const v1::Job& job = *got;
      const bool ended = IsTerminal(job.state());  // read before the logs: all is written
      const int64_t max_world = int64_t{std::max(job.spec().max_nodes(), job.spec().min_nodes())} *
                                job.spec().nproc_per_node();
      if (view.follow && !view.all_ranks && max_world > 0 && view.rank >= max_world) {
        // No round can ever have it: following would wait the job out.
        return absl::NotFoundError(absl::StrCat("job ", id, " has no rank ", view.rank,
                                                " and never will: at most ", max_world,
                                                " ranks (max nodes x nproc per node)"));
      }
      if (view.state_lines) state_lines.Print(job, std::cout);
      std::vector<const v1::WorkerStatus*> workers;
      for (const auto& w : job.workers()) {
        if (view.all_ranks || w.rank() == view.rank) workers.push_back(&w);
      }
      if (workers.empty() && !view.follow) {
        return absl::NotFoundError(absl::StrCat(
            "job ", id, " has no rank ", view.rank, " in round ", job.round(), " (world size ",
            job.world_size(), job.workers_size() == 0 ? ", no workers started yet" : "",
            "; --follow waits for them)"));
      }
      if (workers.empty() && !ended && !said_waiting && !view.state_lines) {
        std::cerr << "lockstep: job " << id << " is " << StateName(job.state())
                  << ": waiting for its workers to start\n";
        said_waiting = true;
      }
      // A stream with more to read than one drain takes (kDrainChunks):
      // polled again at once, the job's state and a stop signal between.
      bool more = false;
      std::set<CursorKey> now_placed;
      for (const v1::WorkerStatus* w : workers) {
        for (bool is_stderr : {false, true}) {
          if (is_stderr ? view.stderr_stream : view.stdout_stream) {
            now_placed.insert({w->rank(), w->node_id(), is_stderr});
          }
        }
      }
      // A rank's output on a node that no longer runs it (a restart moved
      // the rank, or its round ended) is read to its end first, so that
      // what it wrote after the last poll comes before the next round's.
      // An agent that cannot be read then is said, and passed over.
      for (const CursorKey& key : placed) {
        if (now_placed.count(key) != 0) continue;
        const auto& [rank, node, is_stderr] = key;
        StatusOr<AgentRead> agent = agent_of(node, rank);
        Status read = agent.status();
        // To its end: the next poll no longer looks there.
        for (bool left = read.ok(); left && read.ok() && g_stop_signal == 0;) {
          left = false;
          read = DrainLog(*agent, id, rank, is_stderr, view, &cursors[key], &left);
        }
        forget_ticket(node, read);
        if (!read.ok() && !(view.state_lines && agent.ok() && unreachable.count(agent->address) != 0)) {
          std::cerr << "lockstep: rank " << rank << "'s output on node " << node << " past byte "
                    << cursors[key].offset << " was not read: " << Printable(read.message())
                    << "\n";
        }
      }
      placed = std::move(now_placed);
      for (const v1::WorkerStatus* w : workers) {
        ASSIGN_OR_RETURN(AgentRead agent, agent_of(w->node_id(), w->rank()));
        const std::string& address = agent.address;
        for (bool is_stderr : {false, true}) {
          if (!(is_stderr ? view.stderr_stream : view.stdout_stream)) continue;
          LogCursor& cursor = cursors[{w->rank(), w->node_id(), is_stderr}];
          Status read = DrainLog(agent, id, w->rank(), is_stderr, view, &cursor, &more);
          forget_ticket(w->node_id(), read);
          if (read.ok()) {
            unreachable.erase(address);
            continue;
          }
          if (absl::IsNotFound(read) && view.follow) {
            // No such file on its node: the worker never started (a launch
            // error; `status` says why), or has not yet. Not a read failure.
            if (ended && (!is_stderr || !view.stdout_stream) &&
                no_output.insert({w->rank(), w->node_id(), is_stderr}).second) {
              std::cerr << "lockstep: rank " << w->rank() << " left no "
                        << (is_stderr ? "stderr" : "stdout") << " on node " << w->node_id()
                        << " (it never started: lockstep status " << id << " says why)\n";
            }
            continue;
          }
          const std::string where = absl::StrCat("; the file is ",
                                                 is_stderr ? w->stderr_path() : w->stdout_path(),
                                                 " on node ", w->node_id());
          // submit follows the job even where its output cannot be read
          // (an agent this host cannot reach, behind NAT or in a cluster
          // network): said once per agent, the job's state still decides.
          if (view.state_lines) {
            if (unreachable.insert(address).second) {
              std::cerr << "lockstep: " << Printable(read.message()) << Printable(where)
                        << " (following the job's state; its output from there is not shown)\n";
            }
            continue;
          }
          if (!view.follow || ended) return Status(read.code(), absl::StrCat(read.message(), where));
          // A node's agent that is down (restarting) does not end a follow.
          if (unreachable.insert(address).second) {
            std::cerr << "lockstep: " << Printable(read.message()) << " (retrying)\n";
          }
        }
      }
      if (g_stop_signal != 0) return 128 + g_stop_signal;
      if (more) continue;
      if (!view.follow) return 0;
      if (ended) {
        std::cout << std::flush;
        std::cerr << "lockstep: job " << id << " " << StateName(job.state()) << " (round "
                  << job.round() << ", restarts " << job.restart_count() << ")\n";
        return job.state() == v1::JOB_STATE_SUCCEEDED ? 0 : kExitJobNotSucceeded;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  }

  // Chunks (ReadLogs, 1 MiB at most each) one DrainLog reads.
  static constexpr int kDrainChunks = 16;

  // Prints what one rank's stream on one agent holds past `cursor`: up to
  // kDrainChunks chunks, setting *more when there may be more, and none
  // once a stop signal came.
  Status DrainLog(const AgentRead& agent, const std::string& id, int rank, bool is_stderr,
                  const LogView& view, LogCursor* cursor, bool* more) {
    std::ostream& out = view.prefixed && is_stderr ? std::cerr : std::cout;
    for (int chunks = 0;; ++chunks) {
      if (g_stop_signal != 0) return absl::OkStatus();
      if (chunks == kDrainChunks) {
        *more = true;
        return absl::OkStatus();
      }
      v1::ReadLogsRequest req;
      req.set_job_id(id);
      req.set_rank(rank);
      req.set_stream(is_stderr ? v1::ReadLogsRequest::STREAM_STDERR
                               : v1::ReadLogsRequest::STREAM_STDOUT);
      req.set_offset(cursor->offset);
      req.set_generation(cursor->generation);
      if (!cursor->started) req.set_tail_bytes(view.tail_bytes);
      v1::ReadLogsResponse resp;
      RETURN_IF_ERROR(
          FromGrpcStatus(agent.agent->ReadLogs(AgentCtx(agent.ticket).get(), req, &resp),
                         absl::StrCat("read logs of rank ", rank, " from agent ", agent.address)));
      std::string data = resp.data();
      if (!cursor->started && view.tail_lines > 0) {
        // Start after the newline before the last tail_lines lines (the
        // final newline ends the last line rather than starting one).
        size_t pos = data.size();
        if (pos > 0 && data[pos - 1] == '\n') --pos;
        for (int64_t n = 0; n < view.tail_lines && pos != std::string::npos; ++n) {
          pos = pos == 0 ? std::string::npos : data.rfind('\n', pos - 1);
        }
        const bool window_starts_mid_file =
            resp.next_offset() > static_cast<int64_t>(resp.data().size());
        if (pos != std::string::npos) {
          data.erase(0, pos + 1);
        } else if (window_starts_mid_file && !view.tail_bytes_given) {
          // Fewer than tail_lines lines in the window: its first line began
          // before it (lines longer than the KiB per line allowed for).
          // Whole lines only, as tail(1) prints, unless that leaves none.
          const size_t first = data.find('\n');
          if (first != std::string::npos && first + 1 < data.size()) data.erase(0, first + 1);
        }
      }
      if (resp.rotated_past()) {
        std::cout << std::flush;
        std::cerr << "lockstep: rank " << rank << "'s " << (is_stderr ? "stderr" : "stdout")
                  << " on node " << agent.node
                  << " was rotated more than once since the last read (lockstepd --max-log-mb): "
                     "the output in between is not shown\n";
      }
      cursor->started = true;
      cursor->offset = resp.next_offset();
      cursor->generation = resp.generation();
      if (common_.json) {
        resp.set_data(data);
        PrintJson(resp);
      } else if (view.prefixed) {
        TakeLines(&cursor->partial, data, [&](const std::string& line) {
          if (!RepeatedHeader(id, is_stderr, line)) PrintRankLine(out, rank, line);
        });
        out << std::flush;
      } else {
        // Raw into a pipe or file; escaped on a terminal, where a worker's
        // escape sequences would act on the user's terminal.
        std::cout << (::isatty(1) ? Printable(data) : data) << std::flush;
      }
      if (resp.data().empty()) return absl::OkStatus();
    }
  }

  // ---------------------------------------------------------------- watch
  // Fetches the job every --interval-s and draws it (client/watch.h): in
  // place on a terminal, a block per change when piped. While the
  // coordinator does not answer, the last view stays up marked STALE.
  // Ends with the job: 0 if it SUCCEEDED, else 3; 128+N on signal N.
  StatusOr<int> Watch(const std::vector<std::string>& args) {
    FlagSet flags("lockstep watch", "Live view of a job: lockstep watch JOB");
    AddCommon(&flags, &common_);
    double interval_s = 1;
    flags.Double("interval-s", &interval_s, "seconds between refreshes (default 1)");
    flags.Short('n', "interval-s");
    auto rest = flags.Parse(args);
    if (!rest.ok()) return Usage(rest.status());
    if (rest->size() != 1) return Usage(OneJobId("watch", *rest));
    if (!(interval_s >= 0.1 && interval_s <= 3600)) {
      return Usage(absl::InvalidArgumentError("--interval-s: expected 0.1 to 3600 seconds"));
    }
    const std::string& id = (*rest)[0];
    RETURN_IF_ERROR(Connect());
    if (common_.json) return FollowJson(id);
    const auto interval = std::chrono::milliseconds(static_cast<int64_t>(interval_s * 1000));
    const bool tty = ::isatty(1);
    InstallStopHandlers();
    if (tty) std::cout << "\x1b[?25l";  // no cursor blinking over the table
    WatchContext ctx;
    ctx.coordinator = common_.coordinator;
    std::optional<v1::Job> job;
    std::string last_block;
    int code = -1;
    while (code < 0) {
      const auto started = std::chrono::steady_clock::now();
      auto fetch_timeout = std::max<std::chrono::milliseconds>(interval, std::chrono::seconds(2));
      v1::GetJobRequest req;
      req.set_job_id(id);
      v1::GetJobResponse resp;
      grpc::Status s = coord_->GetJob(Ctx(fetch_timeout).get(), req, &resp);
      ctx.now_unix_ms = NowUnixMs();
      if (s.ok()) {
        job = resp.job();
        ctx.fetched_unix_ms = ctx.now_unix_ms;
        ctx.unreachable_since_unix_ms = 0;
        ctx.last_error.clear();
      } else if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                 s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        if (ctx.unreachable_since_unix_ms == 0) ctx.unreachable_since_unix_ms = ctx.now_unix_ms;
        ctx.last_error = s.error_code() == grpc::StatusCode::UNAVAILABLE ? "UNAVAILABLE"
                                                                         : "DEADLINE_EXCEEDED";
        if (!job) ctx.fetched_unix_ms = 0;
      } else {
        if (tty) std::cout << "\x1b[?25h" << std::flush;
        return Check(s, "get job " + id);
      }
      if (job && IsTerminal(job->state()) && ctx.unreachable_since_unix_ms == 0) {
        code = job->state() == v1::JOB_STATE_SUCCEEDED ? 0 : kExitJobNotSucceeded;
      }
      if (g_stop_signal != 0) code = 128 + g_stop_signal;
      v1::Job shown = job ? *job : v1::Job();
      if (!job) shown.set_job_id(id);
      auto [cols, rows] = TerminalSize(1);
      ctx.width = tty ? cols : 0;  // piped: lines whole
      ctx.max_lines = tty ? rows : 1000;
      std::vector<std::string> lines = RenderWatch(shown, ctx);
      if (tty) {
        std::cout << RedrawInPlace(lines) << std::flush;
      } else {
        // Piped: a block when something other than the clock changed.
        std::vector<std::string> rest_lines(lines.begin() + 1, lines.end());
        const std::string block = absl::StrJoin(rest_lines, "\n");
        if (block != last_block || code >= 0) {
          std::cout << absl::StrJoin(lines, "\n") << "\n\n" << std::flush;
          last_block = block;
        }
      }
      if (code >= 0) break;
      std::this_thread::sleep_until(started + interval);
    }
    if (tty) std::cout << "\n\x1b[?25h" << std::flush;
    return code;
  }

  static int64_t NowUnixMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  // One line of rank `rank`'s output, prefixed "[R] "; escaped when `os`
  // is a terminal.
  // The agent heads both of a worker's files with the same line
  // (daemon/agent.cc: "=== lockstep: job J round N rank R restart K ==="):
  // the streamed views show it once, from stdout.
  static bool RepeatedHeader(const std::string& job, bool is_stderr, const std::string& line) {
    return is_stderr && absl::StartsWith(line, absl::StrCat("=== lockstep: job ", job, " round ")) &&
           absl::EndsWith(line, " ===");
  }

  static void PrintRankLine(std::ostream& os, int rank, const std::string& line) {
    const bool tty = ::isatty(&os == &std::cerr ? 2 : 1);
    os << "[" << rank << "] " << (tty ? Printable(line) : line) << "\n";
  }

  // The usage error for `args` that are not one job id: none, or the first
  // extra one named (`hint` after it).
  static Status OneJobId(absl::string_view cmd, const std::vector<std::string>& args,
                         absl::string_view hint = "") {
    if (args.empty()) return absl::InvalidArgumentError(absl::StrCat(cmd, ": expected a JOB id"));
    return absl::InvalidArgumentError(absl::StrCat(cmd, ": expected one JOB id, got ", args.size(),
                                                   " arguments (", QuoteForError(args[1]),
                                                   " is one too many", hint, ")"));
  }

  StatusOr<int> Usage(const Status& s) {
    if (s.code() == absl::StatusCode::kNotFound) {  // --help
      std::cout << s.message();
      return 0;
    }
    std::cerr << "lockstep: " << Printable(s.message()) << "\n";
    return kExitUsage;
  }

 private:
  Common common_;
  std::string token_;
  bool private_daemon_ = false;  // `lockstep run`'s own loopback daemon: no TLS
  std::unique_ptr<v1::CoordinatorService::Stub> coord_;
};

constexpr char kUsage[] =
    "usage: lockstep [--coordinator H:P] [--token-file F] [--json]\n"
    "                [--tls-ca CA --tls-cert CERT --tls-key KEY | --insecure-plaintext]\n"
    "                COMMAND ...\n"
    "commands:\n"
    "  submit [--nodes N|MIN:MAX] [--nproc-per-node K] [--max-restarts R] [--env K=V]...\n"
    "         [--name N] [--detach] [--standalone] -- CMD ARGS   (streams every rank's output\n"
    "         until the job ends, exit 0 if it SUCCEEDED; --detach or --wait=false returns\n"
    "         at once)\n"
    "  run [--nproc-per-node K] [--max-restarts R] ... -- CMD ARGS   (this host alone: a\n"
    "         private coordinator and agent, the job's output, its state as exit code)\n"
    "  status JOB\n"
    "  list\n"
    "  logs JOB [--rank R | --all-ranks] [--follow] [--stderr] [--tail N] [--tail-bytes B]\n"
    "  cancel JOB\n"
    "  delete JOB...   (finished jobs: their records and logs)\n"
    "  nodes\n"
    "  watch JOB [--interval-s S]\n"
    "  certs --out DIR --hosts HOST,IP,... [--days N]   (a cluster CA and mutual TLS\n"
    "         certificates: ca.pem, HOST.pem/.key per host, client.pem/.key,\n"
    "         worker.pem/.key)\n"
    "Each command takes --help. A viewer token (the coordinator's viewer.token) runs\n"
    "status, list, logs, nodes and watch; submit, cancel and delete need the admin token.\n";

constexpr const char* kCommands[] = {"submit", "run",   "status", "list",  "logs",
                                     "cancel", "delete", "nodes", "watch", "certs"};

int Main(int argc, char** argv) {
  Common common;
  FlagSet flags("lockstep", "Lockstep command-line client");
  AddCommon(&flags, &common);
  flags.Version("lockstep " LOCKSTEP_VERSION);
  auto rest = flags.Parse(argc, argv, /*stop_at_first_positional=*/true);
  if (!rest.ok()) {
    if (rest.status().code() == absl::StatusCode::kNotFound) {
      // --version wherever it stands among the global flags; else --help.
      bool version = false;
      for (int i = 1; i < argc && !version; ++i) version = std::string(argv[i]) == "--version";
      std::cout << (version ? std::string(rest.status().message()) : kUsage);
      return 0;
    }
    // A command's flag given before the command ("lockstep --rank 1 logs
    // J"): say where it goes.
    std::string where;
    if (absl::StartsWith(rest.status().message(), "unknown flag ")) {
      for (int i = 1; i < argc && where.empty(); ++i) {
        const std::string a = argv[i];
        for (const char* c : kCommands) {
          if (a == c) where = absl::StrCat(" (a flag of ", c, " goes after it: lockstep ", c, " --...)");
        }
      }
    }
    std::cerr << "lockstep: " << rest.status().message() << where << "\n" << kUsage;
    return kExitUsage;
  }
  if (rest->empty()) {
    std::cerr << "lockstep: no command given\n" << kUsage;
    return kExitUsage;
  }
  std::string cmd = (*rest)[0];
  if (cmd == "help" || cmd == "version") {  // as git and kubectl take them
    std::cout << (cmd == "help" ? std::string(kUsage) : "lockstep " LOCKSTEP_VERSION "\n");
    return 0;
  }
  std::vector<std::string> args(rest->begin() + 1, rest->end());
  Cli cli(common);
  StatusOr<int> result = absl::InvalidArgumentError("");
  if (cmd == "submit") {
    result = cli.Submit(args, /*standalone=*/false);
  } else if (cmd == "run") {
    result = cli.Submit(args, /*standalone=*/true);
  } else if (cmd == "status") {
    result = cli.Status_(args);
  } else if (cmd == "list") {
    result = cli.List(args);
  } else if (cmd == "logs") {
    result = cli.Logs(args);
  } else if (cmd == "cancel") {
    result = cli.Cancel(args);
  } else if (cmd == "delete") {
    result = cli.Delete(args);
  } else if (cmd == "certs") {
    result = cli.Certs(args);
  } else if (cmd == "nodes") {
    result = cli.NodesCmd(args);
  } else if (cmd == "watch") {
    result = cli.Watch(args);
  } else {
    const std::string near =
        NearestMatch(cmd, std::vector<std::string>(std::begin(kCommands), std::end(kCommands)));
    std::cerr << "lockstep: unknown command \"" << Printable(cmd) << "\""
              << (near.empty() ? "" : " (did you mean \"" + near + "\"?)") << "\n"
              << kUsage;
    return kExitUsage;
  }
  if (!result.ok()) {
    std::cerr << "lockstep: " << absl::StatusCodeToString(result.status().code()) << ": "
              << Printable(result.status().message()) << "\n";
    return result.status().GetPayload(kUsagePayload).has_value() ? kExitUsage : kExitRpc;
  }
  return *result;
}

}  // namespace
}  // namespace client
}  // namespace lockstep

int main(int argc, char** argv) { return lockstep::client::Main(argc, argv); }
