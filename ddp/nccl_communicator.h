// NcclCommunicator: the Communicator over NCCL, for CUDA tensors.
//
// Built for real only with CUDA (bazel --config=cuda, or the CMake build in
// ddp/CMakeLists.txt with NCCL found; both define LOCKSTEP_WITH_NCCL). In a
// CPU-only build the class exists and Create returns Unimplemented, so code
// that picks a backend at run time compiles everywhere. The header names no
// CUDA or NCCL type.
//
// Bootstrap. Rank 0 creates the NCCL unique id and publishes it in the Store
// ("<key_prefix>/unique_id"); every rank publishes "<key_prefix>/arrived/<r>"
// and then initialises its communicator in NCCL's non-blocking mode, polling
// for completion until `connect_timeout`. On timeout the error names the
// ranks that never arrived and the half-built communicator is aborted.
//
// Streams. Each communicator owns one high-priority CUDA stream. A
// collective is queued from the calling thread:
//   1. an event is recorded on the caller's current (torch) stream for the
//      tensor's device, and the NCCL stream waits on it: the collective runs
//      after whatever produced the tensor;
//   2. the NCCL call is issued on the NCCL stream, between a "start" and a
//      "done" event;
//   3. a watchdog thread polls the events: the Work is marked started when
//      "start" completes and finished when "done" completes, so Work::Wait
//      returns once the GPU finished the collective, and started_at /
//      finished_at bracket the GPU's execution (to the polling interval).
//      Work::WaitStream instead makes the caller's current stream wait on
//      "done" without blocking the host.
// The Work keeps the tensors alive until "done" completes, so the caching
// allocator cannot hand their memory to anyone while NCCL still uses it.
//
// Errors. The watchdog also polls ncclCommGetAsyncError. A collective not
// done within `timeout`, or an asynchronous NCCL error (a peer's connection
// lost, a remote abort), aborts the communicator (ncclCommAbort, which
// unblocks its kernels): the pending Works fail, the message names the ranks
// that never reached the collective where the store can tell, and every later
// call fails with FailedPrecondition. A lost peer becomes an error, not a
// hang. As with Gloo, the job then rebuilds the communicator in a new
// rendezvous round.
//
// Devices. One communicator drives one CUDA device (`options.device`, default
// the current device); NCCL refuses two ranks of one communicator on the
// same device.
//
// Thread safety: thread-safe (see Communicator); collectives are issued in
// call order under one lock.
#ifndef LOCKSTEP_DDP_NCCL_COMMUNICATOR_H_
#define LOCKSTEP_DDP_NCCL_COMMUNICATOR_H_

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"
#include "ddp/communicator.h"
#include "ddp/missing_ranks.h"
#include "rendezvous/store.h"

namespace lockstep {
namespace ddp {

struct NcclOptions {
  // CUDA device index; -1 means the calling thread's current device.
  int device = -1;
  // End-to-end timeout of every collective. Default: kDefaultCollectiveTimeout.
  Duration timeout = kDefaultCollectiveTimeout;
  // How long Create waits for the unique id and for NCCL's own bootstrap.
  // Default: rendezvous::kDefaultStoreTimeout.
  Duration connect_timeout = rendezvous::kDefaultStoreTimeout;
  // Store key prefix; communicators sharing a store namespace need distinct
  // prefixes. Default: "nccl".
  std::string key_prefix = "nccl";
  // How often the watchdog polls pending collectives. Default: 50 us (the
  // resolution of the Work timestamps; the thread sleeps when idle).
  std::chrono::microseconds poll_interval{50};
  // Told every few seconds whom the bootstrap still waits for. Default:
  // none (InitFromEnv logs it).
  ProgressLog progress;
};

// True when this binary was built with NCCL (LOCKSTEP_WITH_NCCL).
bool NcclCompiledIn();

// Number of CUDA devices the CUDA runtime sees; 0 when built without CUDA or
// when no driver or device is present.
int CudaDeviceCount();

// Why GPU tests must skip here, or "" when NCCL and a CUDA device are there
// and LibTorch itself can make CUDA tensors.
std::string NcclUnavailableReason();

class NcclCommunicator : public Communicator {
 public:
  // Errors: Unimplemented (built without NCCL), InvalidArgument (rank/world/
  // device), FailedPrecondition (no CUDA device), DeadlineExceeded naming the
  // ranks that never arrived, Unavailable/Internal (NCCL or CUDA errors, with
  // NCCL's message). `store` must outlive the communicator.
  static StatusOr<std::unique_ptr<NcclCommunicator>> Create(rendezvous::Store* store, int rank,
                                                           int world_size,
                                                           NcclOptions options = {});
  ~NcclCommunicator() override;

  int rank() const override;
  int world_size() const override;
  std::string backend() const override { return "nccl"; }
  c10::Device device() const override;

  // Dtypes: float32, float64, float16, bfloat16, int8, uint8, int32, int64
  // (kAvg: floating dtypes; NCCL's own average).
  std::shared_ptr<Work> AllReduce(at::Tensor tensor, ReduceOp op) override;
  std::shared_ptr<Work> Broadcast(at::Tensor tensor, int root) override;
  std::shared_ptr<Work> AllGather(at::Tensor input, at::Tensor output) override;
  // A one-element allreduce on the device; completes when the GPU ran it.
  std::shared_ptr<Work> Barrier() override;

  struct Impl;  // CUDA/NCCL state; defined only with LOCKSTEP_WITH_NCCL.

 private:
  explicit NcclCommunicator(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;  // Shared with the Works' stream waiters.
};

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_NCCL_COMMUNICATOR_H_
