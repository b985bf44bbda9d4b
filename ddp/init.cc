#include "ddp/init.h"

#include <dlfcn.h>
#include <malloc.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/address.h"
#include "common/logging.h"
#include "common/worker_link.h"
#include "ddp/data_plane.h"
#include "ddp/gloo_communicator.h"
#include "ddp/hierarchical_communicator.h"
#include "ddp/missing_ranks.h"
#include "ddp/nccl_communicator.h"
#include "ddp/shm_communicator.h"
#include "rendezvous/file_store.h"

namespace lockstep {
namespace ddp {
namespace {

std::mutex& FactoryMu() {
  static std::mutex mu;
  return mu;
}
StoreFactory& Factory() {
  static StoreFactory* factory = new StoreFactory();
  return *factory;
}
MasterStoreFactory& MasterFactory() {
  static MasterStoreFactory* factory = new MasterStoreFactory();
  return *factory;
}

}  // namespace

void RegisterStoreFactory(StoreFactory factory) {
  std::lock_guard<std::mutex> lock(FactoryMu());
  Factory() = std::move(factory);
}

void RegisterMasterStoreFactory(MasterStoreFactory factory) {
  std::lock_guard<std::mutex> lock(FactoryMu());
  MasterFactory() = std::move(factory);
}

StatusOr<std::unique_ptr<rendezvous::Store>> OpenStore(const WorkerEnv& env, Duration timeout) {
  const std::string ns = rendezvous::StoreNamespace(env.job_id, env.round);
  const std::string& address = env.store_address;
  if (address.empty()) {
    if (!env.master_addr.empty()) {
      if (HostOfAddress(env.master_addr).empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "MASTER_ADDR is not set (MASTER_PORT=", PortOfAddress(env.master_addr), " is)"));
      }
      MasterStoreFactory master;
      {
        std::lock_guard<std::mutex> lock(FactoryMu());
        master = MasterFactory();
      }
      if (master) return master(env, ns, timeout);
      return absl::FailedPreconditionError(absl::StrCat(
          "LOCKSTEP_STORE is not set; MASTER_ADDR/MASTER_PORT (", env.master_addr,
          ") alone need a store server on rank 0: link //ddp:init_from_env_grpc, or set "
          "LOCKSTEP_STORE=file:/shared/dir or host:port"));
    }
    return absl::FailedPreconditionError(
        "LOCKSTEP_STORE is not set (use file:/some/dir for one host, or host:port)");
  }
  if (absl::StartsWith(address, "file:")) {
    const std::string dir = address.substr(5);
    if (dir.empty()) return absl::InvalidArgumentError("LOCKSTEP_STORE=file: needs a directory");
    ASSIGN_OR_RETURN(auto store, rendezvous::FileStore::Open(dir + "/" + ns));
    return std::unique_ptr<rendezvous::Store>(std::move(store));
  }
  if (address.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LOCKSTEP_STORE='", address, "' is neither file:/dir nor host:port"));
  }
  StoreFactory factory;
  {
    std::lock_guard<std::mutex> lock(FactoryMu());
    factory = Factory();
  }
  if (!factory) {
    return absl::FailedPreconditionError(absl::StrCat(
        "LOCKSTEP_STORE='", address,
        "' needs the gRPC store client; link //ddp:init_from_env_grpc into this binary"));
  }
  return factory(address, ns, timeout);
}

Status JoinStore(rendezvous::Store* store, const WorkerEnv& env) {
  const std::string where =
      absl::StrCat("the store at ", env.store_address.empty() ? env.master_addr : env.store_address,
                   " (namespace ", rendezvous::StoreNamespace(env.job_id, env.round), ")");
  const std::string world = std::to_string(env.world_size);
  // The likely cause, by store kind.
  const std::string cause =
      !env.store_address.empty()
          ? absl::StartsWith(env.store_address, "file:")
                ? "the rank was started twice, or the directory is left from an earlier run "
                  "(give each run its own)"
                : "the rank has two owners"
          : "another job uses this MASTER_ADDR:MASTER_PORT (give each job its own)";
  ASSIGN_OR_RETURN(std::string agreed, store->CompareSet("lockstep/world_size", "", world));
  if (agreed != world) {
    // Said where the ranks that joined wait for this one (WaitForRanks), so
    // they name the refusal instead of "did not arrive".
    (void)store->Set(RefusedRankKey(env.rank),
                     absl::StrCat("came with a world of ", world, " ranks, not ", agreed));
    return absl::FailedPreconditionError(absl::StrCat(
        where, " belongs to a world of ", agreed, " ranks; rank ", env.rank, " of job ",
        env.job_id, " expects ", world, ": the ranks were started with different world sizes "
        "(WORLD_SIZE), or ", cause));
  }
  ASSIGN_OR_RETURN(int64_t owners, store->Add(absl::StrCat("lockstep/member/", env.rank), 1));
  if (owners != 1) {
    return absl::AlreadyExistsError(absl::StrCat("rank ", env.rank, " of job ", env.job_id,
                                                 " round ", env.round, " already joined ", where,
                                                 ": ", cause));
  }
  return absl::OkStatus();
}

bool KeepFreedMemory() {
  const char* keep = std::getenv("LOCKSTEP_KEEP_FREED_MEMORY");
  if (keep != nullptr && std::string(keep) == "0") return false;
  // mallopt takes an int: ~2 GB is the largest round value.
  constexpr int kKeepBytes = 2'000'000'000;
  const bool mmap_ok = ::mallopt(M_MMAP_THRESHOLD, kKeepBytes) == 1;
  const bool trim_ok = ::mallopt(M_TRIM_THRESHOLD, kKeepBytes) == 1;
  return mmap_ok && trim_ok;
}

StatusOr<int> SetIntraOpThreads(int threads) {
  if (threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("intra-op threads must be at least 1, got ", threads));
  }
  at::set_num_threads(threads);
  // Looked up, not linked: the BLAS behind LibTorch is chosen at run time
  // (Debian's alternatives), and may not be OpenBLAS at all.
  using SetThreads = void (*)(int);
  using GetThreads = int (*)();
  auto set = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  auto get = reinterpret_cast<GetThreads>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (set == nullptr || get == nullptr) return 0;
  set(threads);
  return get();
}

namespace {

// The data-plane address of this worker (ddp/data_plane.h has the rule).
StatusOr<DataPlaneAddress> DataPlaneHost(const WorkerEnv& env, const InitOptions& options) {
  DataPlaneInputs in;
  in.override_host = options.gloo_hostname;
  if (in.override_host.empty()) {
    const char* host = std::getenv("LOCKSTEP_GLOO_HOST");
    if (host != nullptr) in.override_host = host;
  }
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) in.socket_ifname = ifname;
  in.node_addr = env.node_addr;
  if (!env.master_addr.empty()) in.master_host = HostOfAddress(env.master_addr);
  if (!env.store_address.empty() && !absl::StartsWith(env.store_address, "file:")) {
    in.store_host = HostOfAddress(env.store_address);
  }
  return ChooseDataPlaneAddress(in);
}

template <typename T>
StatusOr<std::unique_ptr<Communicator>> Upcast(StatusOr<std::unique_ptr<T>> comm) {
  if (!comm.ok()) return comm.status();
  return std::unique_ptr<Communicator>(std::move(*comm));
}

// The communicator of `backend` for this worker.
StatusOr<std::unique_ptr<Communicator>> Connect(const std::string& backend, const WorkerEnv& env,
                                                const std::string& data_host,
                                                rendezvous::Store* store,
                                                const InitOptions& options) {
  Logger log("ddp", env.job_id, env.rank);
  const ProgressLog progress = [log](const std::string& line) { log.Info("{}", line); };
  if (backend == "gloo") {
    GlooOptions gloo;
    gloo.timeout = options.timeout;
    gloo.connect_timeout = options.connect_timeout;
    gloo.hostname = data_host;
    return Upcast(GlooCommunicator::Create(store, env.rank, env.world_size, gloo));
  }
  if (backend == "shm" && env.local_world_size == env.world_size) {
    ShmOptions shm;
    shm.timeout = options.timeout;
    shm.connect_timeout = options.connect_timeout;
    shm.progress = progress;
    return Upcast(ShmCommunicator::Create(store, env.rank, env.world_size, shm));
  }
  if (backend == "shm") {
    // Several nodes: shared memory inside each, Gloo between their leaders.
    HierarchicalLayout layout;
    layout.rank = env.rank;
    layout.world_size = env.world_size;
    layout.local_rank = env.local_rank;
    layout.local_world_size = env.local_world_size;
    layout.node_rank = env.node_rank;
    layout.num_nodes = env.num_nodes > 1 ? env.num_nodes
                                         : std::max(1, env.world_size / env.local_world_size);
    HierarchicalOptions hier;
    hier.timeout = options.timeout;
    hier.connect_timeout = options.connect_timeout;
    hier.gloo_hostname = data_host;
    hier.progress = progress;
    return Upcast(HierarchicalCommunicator::Create(store, layout, hier));
  }
  if (backend == "nccl") {
    // NCCL picks its bootstrap interface by itself (the first that is not
    // loopback or docker); point it at the one holding the data-plane
    // address unless the user chose one.
    const std::string ifname = InterfaceOf(data_host);
    if (std::getenv("NCCL_SOCKET_IFNAME") == nullptr && !ifname.empty() &&
        !ResolvesToLoopback(data_host)) {
      ::setenv("NCCL_SOCKET_IFNAME", ("=" + ifname).c_str(), 0);
    }
    NcclOptions nccl;
    nccl.progress = progress;
    nccl.device = env.local_rank;
    nccl.timeout = options.timeout;
    nccl.connect_timeout = options.connect_timeout;
    return Upcast(NcclCommunicator::Create(store, env.rank, env.world_size, nccl));
  }
  return absl::InternalError(absl::StrCat("backend '", backend, "' passed CheckBackend"));
}

// The one check of a backend name, before anything is opened.
Status CheckBackend(const std::string& backend) {
  if (backend == "gloo" || backend == "shm" || backend == "nccl") return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown communication backend '", backend, "' (LOCKSTEP_BACKEND): use gloo, shm or nccl"));
}

}  // namespace

StatusOr<std::unique_ptr<ProcessGroup>> InitFromEnv(InitOptions options) {
  // Under lockstepd: tell the agent the bootstrap began (dying before it
  // ends is a startup failure), and fence this worker if the agent stops
  // renewing its lease (common/worker_link.h). No-ops otherwise.
  worker_link::MarkBootstrap(worker_link::kBootstrapBegun);
  const bool fenced = worker_link::StartFenceWatchdog();
  if (options.keep_freed_memory) KeepFreedMemory();
  ASSIGN_OR_RETURN(WorkerEnv env, ParseWorkerEnv([](const char* n) { return std::getenv(n); }));
  std::string backend = options.backend;
  if (backend.empty()) {
    const char* from_env = std::getenv("LOCKSTEP_BACKEND");
    backend = from_env != nullptr && *from_env != '\0' ? from_env : "gloo";
  }
  RETURN_IF_ERROR(CheckBackend(backend));
  // Before the store: a bad address fails this rank before it joins.
  ASSIGN_OR_RETURN(DataPlaneAddress data, DataPlaneHost(env, options));
  ASSIGN_OR_RETURN(auto store, OpenStore(env, options.connect_timeout));
  RETURN_IF_ERROR(JoinStore(store.get(), env));
  Logger log("ddp", env.job_id, env.rank);
  const MonoTime start = RealClock()->Now();
  auto comm = Connect(backend, env, data.address, store.get(), options);
  if (!comm.ok()) {
    log.Error("{} communicator of {} ranks (local rank {} of {}, node {} of {}) failed: {}",
              backend, env.world_size, env.local_rank, env.local_world_size, env.node_rank,
              env.num_nodes, comm.status().ToString());
    return comm.status();
  }
  log.Info("connected {} communicator of {} ranks (round {}, store {}, data plane {} from {}) in "
           "{:.3f} s",
           (*comm)->backend(), env.world_size, env.round,
           env.store_address.empty() ? env.master_addr : env.store_address, data.address,
           data.source, ToSeconds(RealClock()->Now() - start));
  if (fenced) log.Debug("fence watchdog on: this worker stops itself if its agent's lease lapses");
  worker_link::MarkBootstrap(worker_link::kBootstrapDone);
  return std::make_unique<ProcessGroup>(std::move(env), std::move(store),
                                        std::shared_ptr<Communicator>(std::move(*comm)));
}

}  // namespace ddp
}  // namespace lockstep
