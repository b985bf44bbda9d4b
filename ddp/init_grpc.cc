// Registers the gRPC store with InitFromEnv (ddp/init.h) at static
// initialisation: LOCKSTEP_STORE=host:port connects the store client
// (//rendezvous:store_client); MASTER_ADDR/MASTER_PORT without LOCKSTEP_STORE
// makes rank 0 serve a store there (//rendezvous:store_server) and every rank
// connect to it. The served store lives as long as rank 0's ProcessGroup.
// The host:port client sends LOCKSTEP_STORE_TOKEN (set by lockstepd's agent:
// the job's store token) as its bearer token when the variable is set.
// It also registers the progress sink (ddp/progress.h) that sends each DDP
// step to this node's agent (client/progress_reporter.h; none without
// LOCKSTEP_AGENT). With LOCKSTEP_TLS_*_PEM set all of them (store client,
// rank 0's store server, progress reporter) use that TLS material
// (rendezvous/tls.h, ProcessTls). Under lockstepd it is a client's only
// (--tls-worker-cert) and LOCKSTEP_STORE is always set, so no worker
// serves a store there.
// Link //ddp:init_from_env_grpc (alwayslink) into the binary to enable it.
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/progress_reporter.h"
#include "common/address.h"
#include "common/logging.h"
#include "ddp/init.h"
#include "ddp/missing_ranks.h"
#include "ddp/progress.h"
#include "rendezvous/store_client.h"
#include "rendezvous/store_server.h"
#include "rendezvous/tls.h"

namespace lockstep {
namespace ddp {
namespace {

// A client Store that also owns the server it talks to (rank 0).
class ServingStore : public rendezvous::ForwardingStore {
 public:
  ServingStore(std::unique_ptr<rendezvous::StoreServer> server,
               std::unique_ptr<rendezvous::Store> client)
      : ForwardingStore(client.get()), server_(std::move(server)), client_(std::move(client)) {}
  ~ServingStore() override {
    client_.reset();
    server_.reset();
  }

 private:
  std::unique_ptr<rendezvous::StoreServer> server_;
  std::unique_ptr<rendezvous::Store> client_;
};

// Connects a store client to `address` for up to `timeout`, a slice
// (kBootstrapProgressInterval) at a time, so that a rank can say every few
// seconds whom it waits for. After each slice in which the server was not
// there (Unavailable, DeadlineExceeded), `after_slice(error, waited,
// out_of_time)` returns the error to end with, or OK to go on (out of time,
// the wait ends with `error`); other errors end the wait at once.
using AfterSlice = std::function<Status(const Status& error, Duration waited, bool out_of_time)>;
StatusOr<std::unique_ptr<rendezvous::Store>> ConnectInSlices(const std::string& address,
                                                             const std::string& ns,
                                                             rendezvous::StoreClientOptions options,
                                                             Duration timeout,
                                                             const AfterSlice& after_slice) {
  const MonoTime start = RealClock()->Now();
  const MonoTime deadline = start + timeout;
  while (true) {
    options.connect_timeout = std::min<Duration>(
        kBootstrapProgressInterval, std::max<Duration>(deadline - RealClock()->Now(), {}));
    auto client = rendezvous::ConnectStore(address, ns, options);
    if (client.ok()) return client;
    const absl::StatusCode code = client.status().code();
    if (code != absl::StatusCode::kUnavailable && code != absl::StatusCode::kDeadlineExceeded) {
      return client.status();
    }
    const MonoTime now = RealClock()->Now();
    RETURN_IF_ERROR(after_slice(client.status(), now - start, now >= deadline));
    if (now >= deadline) return client.status();
  }
}

StatusOr<std::unique_ptr<rendezvous::Store>> MasterStore(const WorkerEnv& env,
                                                         const std::string& ns,
                                                         Duration timeout) {
  // Beyond loopback the served store takes only the job's token: without
  // one, anyone who can reach MASTER_PORT could write the job's bootstrap
  // keys (PyTorch's TCPStore has that hole, CVE-2024-5480).
  const std::string host = HostOfAddress(env.master_addr);
  // By value, not spelling: "127.x.example" is a name, not 127.0.0.0/8.
  const bool loopback = rendezvous::IsLoopbackHost(host);
  if (!loopback && env.store_token.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "MASTER_ADDR ", host, " is not a loopback address, so rank 0's store would be open to "
        "the network: set LOCKSTEP_STORE_TOKEN to the same secret on every rank (or use "
        "127.0.0.1 for a one-host job)"));
  }
  std::unique_ptr<rendezvous::StoreServer> server;
  if (env.rank == 0) {
    // Beyond loopback rank 0 listens on every interface, as torch's
    // TCPStore does: MASTER_ADDR is how the other hosts reach it, and on
    // this host the same name may mean another address (Debian maps its
    // own hostname to 127.0.1.1), which they could not reach. The token
    // (required above) guards it.
    const std::string listen =
        loopback ? env.master_addr : JoinHostPort("::", PortOfAddress(env.master_addr));
    if (!loopback) {
      // Listening on every interface resolves nothing: a name that does
      // not resolve here fails rank 0 now, as binding it used to.
      if (Status resolves = CheckResolves(host); !resolves.ok()) {
        return absl::Status(resolves.code(),
                            absl::StrCat("rank 0 serves the job's store at MASTER_ADDR:MASTER_PORT: "
                                         "MASTER_ADDR ",
                                         resolves.message()));
      }
      Logger("ddp", env.job_id, env.rank)
          .Info("rank 0 serves the job's store on every interface, port {} (MASTER_ADDR {} is not "
                "loopback; the store takes the job's token only)",
                PortOfAddress(env.master_addr), host);
    }
    auto started = rendezvous::StoreServer::Start(
        listen, nullptr,
        env.store_token.empty() ? nullptr : rendezvous::StoreServer::BearerToken(env.store_token));
    if (!started.ok()) {
      return absl::Status(started.status().code(),
                          absl::StrCat("rank 0 serves the job's store at MASTER_ADDR:MASTER_PORT: ",
                                       started.status().message()));
    }
    server = std::move(*started);
  }
  // Rank 0 may start later than the others: wait for its store in slices,
  // saying every few seconds whom this rank waits for. A MASTER_ADDR that
  // does not resolve is waited for too, since a cluster's DNS may lag
  // behind the pods it names (a headless service names rank 0's pod only
  // once it runs), but each line and the final error say that it does not
  // resolve rather than blame rank 0.
  Logger log("ddp", env.job_id, env.rank);
  rendezvous::StoreClientOptions options;
  options.token = env.store_token;
  ASSIGN_OR_RETURN(
      auto client,
      ConnectInSlices(env.master_addr, ns, options, timeout,
                      [&](const Status& error, Duration waited, bool out_of_time) -> Status {
                        const Status resolves = CheckResolves(host);
                        if (out_of_time && !resolves.ok()) {
                          return absl::DeadlineExceededError(absl::StrCat(
                              "rank ", env.rank, ": MASTER_ADDR ", resolves.message(),
                              " (retried for ", ToSeconds(timeout), " s; check the name)"));
                        }
                        if (out_of_time) {
                          return absl::DeadlineExceededError(absl::StrCat(
                              "rank ", env.rank, ": rank 0's store at MASTER_ADDR:MASTER_PORT ",
                              env.master_addr, " did not come up within ", ToSeconds(timeout),
                              " s (is rank 0 running?): ", error.message()));
                        }
                        if (!resolves.ok()) {
                          log.Info("waiting for MASTER_ADDR to resolve: {} ({:.0f} s of {:.0f} s)",
                                   std::string(resolves.message()), ToSeconds(waited),
                                   ToSeconds(timeout));
                        } else {
                          log.Info("waiting for rank 0's store at {} (MASTER_ADDR:MASTER_PORT): "
                                   "{:.0f} s of {:.0f} s",
                                   env.master_addr, ToSeconds(waited), ToSeconds(timeout));
                        }
                        return absl::OkStatus();
                      }));
  return std::unique_ptr<rendezvous::Store>(
      std::make_unique<ServingStore>(std::move(server), std::move(client)));
}

// LOCKSTEP_STORE=host:port (lockstepd's store): connects in slices, saying
// every few seconds whom it waits for, and on failure says for how long and,
// where the handshake is why, what TLS refused (an expired worker.pem,
// another CA). It waited the whole timeout without a word before.
StatusOr<std::unique_ptr<rendezvous::Store>> ConnectJobStore(const std::string& address,
                                                             const std::string& ns,
                                                             Duration timeout) {
  // lockstepd's store wants the job's token, which the agent hands its
  // workers as LOCKSTEP_STORE_TOKEN (unset: no token, for open stores).
  rendezvous::StoreClientOptions options;
  if (const char* token = std::getenv(worker_env::kStoreToken)) options.token = token;
  const WorkerIdentity who = ReadWorkerIdentity(std::getenv);
  Logger log("ddp", who.job_id, who.rank);
  return ConnectInSlices(
      address, ns, options, timeout,
      [&](const Status& error, Duration waited, bool out_of_time) -> Status {
        if (out_of_time) {
          const Status why = rendezvous::WithTlsReason(
              absl::UnavailableError(std::string(error.message())), address);
          return absl::DeadlineExceededError(
              absl::StrCat("the job's store at ", address,
                           " (LOCKSTEP_STORE) could not be reached in ", ToSeconds(timeout),
                           " s: ", why.message()));
        }
        log.Info("waiting for the job's store at {} (LOCKSTEP_STORE): {:.0f} s of {:.0f} s",
                 address, ToSeconds(waited), ToSeconds(timeout));
        return absl::OkStatus();
      });
}

// The engine's progress, sent to the agent by a ProgressReporter.
class AgentProgressSink : public ProgressSink {
 public:
  explicit AgentProgressSink(std::unique_ptr<client::ProgressReporter> reporter)
      : reporter_(std::move(reporter)) {}
  void Report(const StepProgress& p) override { reporter_->Report(p); }
  void SetCollective(const CollectiveState& c) override { reporter_->SetCollective(c); }
  void Flush(std::chrono::milliseconds timeout) override { reporter_->Flush(timeout); }

 private:
  std::unique_ptr<client::ProgressReporter> reporter_;
};

const bool kRegistered = [] {
  RegisterProgressSinkFactory([]() -> std::unique_ptr<ProgressSink> {
    auto reporter = client::ProgressReporter::FromEnv();
    if (!reporter->enabled()) return nullptr;
    return std::make_unique<AgentProgressSink>(std::move(reporter));
  });
  RegisterStoreFactory(ConnectJobStore);
  RegisterMasterStoreFactory(MasterStore);
  return true;
}();

}  // namespace
}  // namespace ddp
}  // namespace lockstep
