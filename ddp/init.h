// InitFromEnv: turns the worker environment (DESIGN.md, "Worker
// environment") into a connected ProcessGroup: the parsed environment, the
// job round's Store and a Communicator.
//
// Variables: LOCKSTEP_JOB_ID, LOCKSTEP_RANK, LOCKSTEP_LOCAL_RANK,
// LOCKSTEP_WORLD_SIZE, LOCKSTEP_LOCAL_WORLD_SIZE, LOCKSTEP_NODE_RANK,
// LOCKSTEP_NUM_NODES, LOCKSTEP_ROUND, LOCKSTEP_RESTART_COUNT, LOCKSTEP_STORE,
// LOCKSTEP_AGENT, LOCKSTEP_NODE_ADDR; each falls back to torchrun's name
// where one exists (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
// GROUP_WORLD_SIZE, TORCHELASTIC_RESTART_COUNT; both names set must agree,
// and the layout must be in range: ParseWorkerEnv). Required: rank and
// world size, and a store.
//
// Store selection (LOCKSTEP_STORE):
//   "file:/some/dir" -> FileStore on "/some/dir/<job>/<round>"
//                       (rendezvous::StoreNamespace()).
//   "host:port"      -> the factory registered with RegisterStoreFactory()
//                       (the gRPC store client lives outside ddp core;
//                       link //ddp:init_from_env_grpc when it exists;
//                       it authenticates with LOCKSTEP_STORE_TOKEN).
// Unset with MASTER_ADDR/MASTER_PORT set (the torchrun habit): the factory
// registered with RegisterMasterStoreFactory() (//ddp:init_from_env_grpc:
// rank 0 serves a store at MASTER_ADDR:MASTER_PORT, every rank connects);
// without one, FailedPrecondition naming LOCKSTEP_STORE.
//
// Thread safety: ParseWorkerEnv is pure; RegisterStoreFactory and
// InitFromEnv may be called from any thread, but InitFromEnv with the nccl
// backend sets NCCL_SOCKET_IFNAME (setenv), which must not race another
// thread's getenv: call it before starting threads that read the
// environment.
#ifndef LOCKSTEP_DDP_INIT_H_
#define LOCKSTEP_DDP_INIT_H_

#include <functional>
#include <memory>
#include <string>

#include "common/clock.h"
#include "common/status.h"
#include "common/worker_env.h"
#include "ddp/communicator.h"
#include "rendezvous/store.h"

namespace lockstep {
namespace ddp {

// The parsed worker environment and its parser: the worker contract,
// common/worker_env.h (one parser for every reader).
using ::lockstep::ParseWorkerEnv;
using ::lockstep::WorkerEnv;

// Makes a Store bound to `ns` for a "host:port" address.
using StoreFactory = std::function<StatusOr<std::unique_ptr<rendezvous::Store>>(
    const std::string& address, const std::string& ns, Duration timeout)>;
// Installs the factory for "host:port" addresses (last call wins).
void RegisterStoreFactory(StoreFactory factory);

// Makes a Store for the MASTER_ADDR/MASTER_PORT habit (env.master_addr).
using MasterStoreFactory = std::function<StatusOr<std::unique_ptr<rendezvous::Store>>(
    const WorkerEnv& env, const std::string& ns, Duration timeout)>;
void RegisterMasterStoreFactory(MasterStoreFactory factory);

// Opens the store named by env.store_address, namespaced "<job>/<round>".
// Errors: FailedPrecondition (no store configured, or no factory for
// host:port), InvalidArgument (malformed address; MASTER_PORT without
// MASTER_ADDR where rank 0's store would be used), the store's errors
// (//ddp:init_from_env_grpc's for MASTER_ADDR: DeadlineExceeded when rank
// 0's store did not come up, or MASTER_ADDR did not resolve, within
// `timeout`, each said).
StatusOr<std::unique_ptr<rendezvous::Store>> OpenStore(const WorkerEnv& env, Duration timeout);

// Registers this rank in its job round's store before any bootstrap: the
// store records the world size the first rank brings, and each rank may join
// once. So a rank of another job (two hand-started jobs on one
// MASTER_ADDR:MASTER_PORT) or a second owner of a rank fails here, naming
// the store, the job and the rank, before it can touch anyone's collectives.
// Errors: FailedPrecondition (another world size), AlreadyExists (the rank
// joined already), the store's errors.
Status JoinStore(rendezvous::Store* store, const WorkerEnv& env);

struct InitOptions {
  // Collective timeout. Default: kDefaultCollectiveTimeout.
  Duration timeout = kDefaultCollectiveTimeout;
  // Waiting for every rank to connect. Default: rendezvous::kDefaultStoreTimeout.
  Duration connect_timeout = rendezvous::kDefaultStoreTimeout;
  // Address the data plane (Gloo, the shm+gloo leaders, NCCL's bootstrap)
  // binds: an address or a host name that resolves (else InitFromEnv
  // fails with InvalidArgument). Default: LOCKSTEP_GLOO_HOST if set, else
  // the rule of ddp/data_plane.h (the address of GLOO_SOCKET_IFNAME's
  // interface, else the node's own address: LOCKSTEP_NODE_ADDR from the
  // agent, else the route to MASTER_ADDR or the store, else 127.0.0.1).
  std::string gloo_hostname;
  // "gloo" (CPU tensors, any hosts), "shm" (CPU tensors, every rank on one
  // host: shared memory, no sockets) or "nccl" (CUDA tensors; the rank
  // drives CUDA device local_rank). Default: LOCKSTEP_BACKEND if set, else
  // "gloo".
  std::string backend;
  // Calls KeepFreedMemory() (below). Default: true.
  bool keep_freed_memory = true;
};

// Tells glibc's malloc to keep freed memory in the process instead of
// returning it to the kernel (M_MMAP_THRESHOLD and M_TRIM_THRESHOLD raised
// to ~2 GB). A training step frees and re-allocates the same large blocks
// (gradients, activations, buckets) every iteration; with the defaults each
// one is a fresh mmap that page-faults in again, which on the development
// VMs cost more than the arithmetic (bench/README.md). The cost: freed
// memory is not given back while the process runs. Process-wide; idempotent.
// Does nothing when LOCKSTEP_KEEP_FREED_MEMORY=0. Returns whether both
// settings were applied. Training programs that do not
// call InitFromEnv (the --local baseline) call it themselves.
bool KeepFreedMemory();

// Sets how many threads this process's CPU kernels use: LibTorch's
// intra-op pool (at::set_num_threads) and, when the BLAS LibTorch calls is
// OpenBLAS, OpenBLAS's own pool, which at::set_num_threads does not reach.
// (Debian's LibTorch calls the pthreads OpenBLAS, which otherwise starts one
// thread per core whatever torch::set_num_threads said, unless
// OMP_NUM_THREADS or OPENBLAS_NUM_THREADS was set at start: two ranks on two
// cores then ran four BLAS threads yielding to each other, bench/README.md.)
// Returns OpenBLAS's thread count afterwards, or 0 when no OpenBLAS is loaded.
// Process-wide. Errors: InvalidArgument for threads < 1.
StatusOr<int> SetIntraOpThreads(int threads);

// Owns the store and the communicator; the communicator uses the store,
// so keep the ProcessGroup alive as long as anything uses communicator().
class ProcessGroup {
 public:
  ProcessGroup(WorkerEnv env, std::unique_ptr<rendezvous::Store> store,
               std::shared_ptr<Communicator> communicator)
      : env_(std::move(env)), store_(std::move(store)), communicator_(std::move(communicator)) {}
  const WorkerEnv& env() const { return env_; }
  rendezvous::Store& store() const { return *store_; }
  const std::shared_ptr<Communicator>& communicator() const { return communicator_; }

 private:
  WorkerEnv env_;
  std::unique_ptr<rendezvous::Store> store_;
  std::shared_ptr<Communicator> communicator_;  // Destroyed before store_.
};

// Parses the process environment, opens the store and connects the
// communicator of the chosen backend (GlooCommunicator, ShmCommunicator, or
// NcclCommunicator on device local_rank). Blocks until all ranks connect; each bootstrap
// phase (the store, the ranks' arrival, the communicator's mesh, the verdict) waits at most
// connect_timeout, so a failing bootstrap can take a few times it.
// Errors: InvalidArgument naming an unknown backend, a malformed
// environment (ParseWorkerEnv) or a data-plane address that does not
// resolve (ddp/data_plane.h), each before the store is opened; the
// communicators' errors (NCCL in a build without it: Unimplemented saying how to build it).
StatusOr<std::unique_ptr<ProcessGroup>> InitFromEnv(InitOptions options = {});

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_INIT_H_
