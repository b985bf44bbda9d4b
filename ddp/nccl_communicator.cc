#include "ddp/nccl_communicator.h"

#include <torch/cuda.h>

#include "absl/strings/str_cat.h"
#include "common/worker_link.h"
#include "ddp/missing_ranks.h"

#ifdef LOCKSTEP_WITH_NCCL
#include <ATen/Functions.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <deque>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>
#ifdef LOCKSTEP_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif
#endif

namespace lockstep {
namespace ddp {

#ifndef LOCKSTEP_WITH_NCCL

bool NcclCompiledIn() { return false; }
int CudaDeviceCount() { return 0; }

std::string NcclUnavailableReason() {
  return "built without NCCL (build with bazel --config=cuda, or the CMake build in "
         "ddp/CMakeLists.txt on a machine with CUDA and NCCL)";
}

struct NcclCommunicator::Impl {
  int rank = 0;
  int world_size = 0;
};

StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(rendezvous::Store*, int,
                                                                     int, NcclOptions) {
  return absl::UnimplementedError(absl::StrCat("nccl: ", NcclUnavailableReason()));
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclCommunicator::~NcclCommunicator() = default;
int NcclCommunicator::rank() const { return impl_->rank; }
int NcclCommunicator::world_size() const { return impl_->world_size; }
c10::Device NcclCommunicator::device() const { return c10::Device(c10::DeviceType::CUDA, 0); }

namespace {
std::shared_ptr<Work> NotBuilt() {
  return Work::Failed(absl::UnimplementedError(absl::StrCat("nccl: ", NcclUnavailableReason())));
}
}  // namespace

std::shared_ptr<Work> NcclCommunicator::AllReduce(at::Tensor, ReduceOp) { return NotBuilt(); }
std::shared_ptr<Work> NcclCommunicator::Broadcast(at::Tensor, int) { return NotBuilt(); }
std::shared_ptr<Work> NcclCommunicator::AllGather(at::Tensor, at::Tensor) { return NotBuilt(); }
std::shared_ptr<Work> NcclCommunicator::Barrier() { return NotBuilt(); }

#else  // LOCKSTEP_WITH_NCCL

namespace {

Status CudaError(cudaError_t err, const char* what) {
  return absl::InternalError(
      absl::StrCat("nccl: ", what, ": CUDA error ", cudaGetErrorName(err), ": ",
                   cudaGetErrorString(err)));
}

#define LOCKSTEP_CUDA_OK(call)                                  \
  do {                                                          \
    const cudaError_t lockstep_cuda_err = (call);               \
    if (lockstep_cuda_err != cudaSuccess) {                     \
      return CudaError(lockstep_cuda_err, #call);               \
    }                                                           \
  } while (0)

// NCCL's message for `result` plus its last detailed error, if any.
std::string NcclMessage(ncclResult_t result, ncclComm_t comm) {
  std::string msg = ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') absl::StrAppend(&msg, " (", last, ")");
  return msg;
}

Status NcclError(ncclResult_t result, ncclComm_t comm, const std::string& what) {
  const std::string msg = absl::StrCat("nccl: ", what, ": ", NcclMessage(result, comm));
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(msg);
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// Restores the calling thread's CUDA device on scope exit.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) (void)cudaSetDevice(device);
  }
  ~DeviceScope() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

// Whether this LibTorch's c10::Stream has native_handle() (added in 2026,
// after 2.10): detected, not guessed from the version number.
template <typename S, typename = void>
struct HasNativeHandle : std::false_type {};
template <typename S>
struct HasNativeHandle<S, std::void_t<decltype(std::declval<const S&>().native_handle())>>
    : std::true_type {};

template <typename S>
StatusOr<cudaStream_t> NativeStream(const S& stream) {
  if constexpr (HasNativeHandle<S>::value) {
    return static_cast<cudaStream_t>(stream.native_handle());
  } else {
#ifdef LOCKSTEP_TORCH_CUDA
    // Linked with libc10_cuda (the CMake build against a CUDA LibTorch).
    return c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, stream).stream();
#else
    // Only libc10 is linked (bazel --config=cuda): the default CUDA stream
    // (id 0) is the legacy default stream; any other needs libc10_cuda.
    if (stream.id() == 0) return static_cast<cudaStream_t>(nullptr);
    return absl::UnimplementedError(
        "nccl: a non-default torch CUDA stream is current; this build cannot resolve it (needs "
        "a LibTorch with c10::Stream::native_handle, or the CMake build linking libc10_cuda)");
#endif
  }
}

// The stream torch queues work on for `device` in this thread: what
// produced the tensor, and what will consume it. The device-generic
// interface lives in libc10, so this links against any LibTorch.
StatusOr<cudaStream_t> CurrentTorchStream(const c10::Device& device) {
  try {
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    return NativeStream(impl.getStream(device));
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(
        absl::StrCat("nccl: LibTorch cannot give the current CUDA stream: ", e.what()));
  }
}

StatusOr<ncclDataType_t> ToNcclType(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kChar:
      return ncclInt8;
    case at::kByte:
    case at::kBool:
      return ncclUint8;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("nccl does not support dtype ", c10::toString(type)));
  }
}

bool IsFloating(at::ScalarType type) {
  return type == at::kFloat || type == at::kDouble || type == at::kHalf || type == at::kBFloat16;
}

}  // namespace

bool NcclCompiledIn() { return true; }

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // Clear the sticky "no driver" error.
    return 0;
  }
  return n;
}

std::string NcclUnavailableReason() {
  if (CudaDeviceCount() == 0) return "no CUDA device is visible (no driver or no GPU)";
  if (!torch::cuda::is_available()) {
    return "LibTorch was built without CUDA (e.g. Debian's), so it cannot make CUDA tensors";
  }
  return "";
}

// One queued collective, owned by the watchdog until its "done" event fires.
struct Pending {
  uint64_t seq = 0;
  const char* name = "";
  std::shared_ptr<Work> work;
  std::vector<at::Tensor> keep_alive;
  cudaEvent_t start = nullptr;
  cudaEvent_t done = nullptr;
  bool started = false;
  MonoTime deadline{};
};

struct NcclCommunicator::Impl : std::enable_shared_from_this<NcclCommunicator::Impl> {
  rendezvous::Store* store = nullptr;
  int rank = 0;
  int world_size = 0;
  int device = 0;
  NcclOptions options;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;

  // Issue lock: collectives are queued on the NCCL stream in call order.
  std::mutex issue_mu;
  uint64_t next_seq = 0;  // GUARDED_BY(issue_mu)

  std::mutex mu;  // Guards everything below.
  std::condition_variable cv;
  std::deque<Pending> pending;
  std::vector<cudaEvent_t> free_events;
  Status broken;  // Set once: after it, every call fails.
  bool aborted = false;
  bool stopping = false;
  std::thread watchdog;

  ~Impl();
  StatusOr<cudaEvent_t> TakeEvent();      // REQUIRES: mu held.
  void ReturnEvent(cudaEvent_t e);        // REQUIRES: mu held.
  std::shared_ptr<Work> Issue(const char* name, std::vector<at::Tensor> tensors,
                              const std::function<ncclResult_t(cudaStream_t)>& call);
  void WatchdogLoop();
  // Aborts the communicator and fails every pending Work. REQUIRES: mu and
  // issue_mu held (no NCCL call may run concurrently with the abort).
  void AbortLocked(const Status& why);
  // Takes the locks in order (issue_mu, then mu) and aborts.
  // REQUIRES: `lock` holds mu; it holds mu again on return.
  void Abort(std::unique_lock<std::mutex>& lock, const Status& why);
  // Why collective #seq failed (`what`: how), after publishing this rank's
  // failure and waiting a grace for the others': the ranks that did not
  // publish did not arrive. Marks the first of them lost (none: -1) in the
  // worker's status page.
  Status Diagnose(uint64_t seq, const char* name, const std::string& what, bool timed_out);
};

NcclCommunicator::Impl::~Impl() {
  {
    std::unique_lock<std::mutex> lock(mu);
    // Let queued collectives finish (each bounded by its own timeout).
    cv.wait(lock, [this] { return pending.empty(); });
    stopping = true;
  }
  cv.notify_all();
  if (watchdog.joinable()) watchdog.join();
  DeviceScope scope(device);
  if (comm != nullptr) {
    if (aborted) {
      // ncclCommAbort already freed it.
    } else {
      // Non-blocking mode: finalize may return ncclInProgress; poll it down,
      // bounded, then free. A peer that never finalizes leaves us aborting.
      ncclResult_t r = ncclCommFinalize(comm);
      const MonoTime deadline = RealClock()->Now() + options.connect_timeout;
      while (r == ncclInProgress || r == ncclSuccess) {
        ncclResult_t state = ncclSuccess;
        if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) break;
        if (state != ncclInProgress) {
          r = state;
          break;
        }
        if (RealClock()->Now() > deadline) {
          r = ncclInProgress;
          break;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      if (r == ncclSuccess) {
        (void)ncclCommDestroy(comm);
      } else {
        (void)ncclCommAbort(comm);
      }
    }
  }
  for (cudaEvent_t e : free_events) (void)cudaEventDestroy(e);
  if (stream != nullptr) (void)cudaStreamDestroy(stream);
}

StatusOr<cudaEvent_t> NcclCommunicator::Impl::TakeEvent() {
  if (!free_events.empty()) {
    cudaEvent_t e = free_events.back();
    free_events.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  LOCKSTEP_CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void NcclCommunicator::Impl::ReturnEvent(cudaEvent_t e) {
  if (e != nullptr) free_events.push_back(e);
}

std::shared_ptr<Work> NcclCommunicator::Impl::Issue(
    const char* name, std::vector<at::Tensor> tensors,
    const std::function<ncclResult_t(cudaStream_t)>& call) {
  auto compute = CurrentTorchStream(c10::Device(c10::DeviceType::CUDA, device));
  if (!compute.ok()) return Work::Failed(compute.status());
  // The communicator's device from here on: an event belongs to the device
  // current when it is created, and recording it on another device's stream
  // fails (a rank of local rank 1 called from a thread whose current device
  // is 0, the default: nothing in the engine calls cudaSetDevice).
  DeviceScope scope(device);
  std::lock_guard<std::mutex> issue_lock(issue_mu);
  Pending p;
  p.name = name;
  p.keep_alive = std::move(tensors);
  cudaEvent_t ready = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!broken.ok()) {
      return Work::Failed(absl::FailedPreconditionError(absl::StrCat(
          "nccl ", name, " on rank ", rank, ": the communicator failed earlier: ",
          broken.message())));
    }
    auto r = TakeEvent();
    auto s = TakeEvent();
    auto d = TakeEvent();
    if (!r.ok() || !s.ok() || !d.ok()) {
      if (r.ok()) ReturnEvent(*r);
      if (s.ok()) ReturnEvent(*s);
      if (d.ok()) ReturnEvent(*d);
      return Work::Failed(!r.ok() ? r.status() : !s.ok() ? s.status() : d.status());
    }
    ready = *r;
    p.start = *s;
    p.done = *d;
  }
  p.seq = next_seq++;
  p.work = std::make_shared<Work>();
  // (1) After the producer: the NCCL stream waits for the caller's stream.
  cudaError_t err = cudaEventRecord(ready, *compute);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(stream, ready, 0);
  // (2) start event, the collective, done event.
  if (err == cudaSuccess) err = cudaEventRecord(p.start, stream);
  Status status;
  if (err != cudaSuccess) {
    status = CudaError(err, "ordering the NCCL stream after the caller's stream");
  } else {
    ncclResult_t result = call(stream);
    if (result == ncclInProgress) {
      // Non-blocking mode: the call is still being queued; wait until the
      // communicator is ready again, bounded by the collective timeout.
      const MonoTime deadline = RealClock()->Now() + options.timeout;
      do {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
        if (ncclCommGetAsyncError(comm, &result) != ncclSuccess) break;
      } while (result == ncclInProgress && RealClock()->Now() < deadline);
    }
    if (result != ncclSuccess) {
      status = NcclError(result, comm, absl::StrCat(name, " #", p.seq, " on rank ", rank));
    } else if ((err = cudaEventRecord(p.done, stream)) != cudaSuccess) {
      status = CudaError(err, "recording the NCCL done event");
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  ReturnEvent(ready);  // Reusable at once: a record replaces the captured work.
  if (!status.ok()) {
    ReturnEvent(p.start);
    ReturnEvent(p.done);
    AbortLocked(status);
    return Work::Failed(status);
  }
  // WaitStream: the caller's stream waits for "done", the host does not.
  // The done event goes back to the pool only together with the Work's
  // completion (both under mu), so a Work still pending owns its event.
  const int dev = device;
  cudaEvent_t done = p.done;
  std::weak_ptr<Work> weak_work = p.work;
  std::weak_ptr<Impl> weak_self = weak_from_this();
  p.work->SetStreamWaiter([dev, done, weak_work, weak_self]() -> Status {
    auto w = weak_work.lock();
    if (w == nullptr) return Status();
    if (w->IsCompleted()) return w->status();
    auto self = weak_self.lock();
    if (self == nullptr) return w->status();
    std::lock_guard<std::mutex> lock(self->mu);
    if (w->IsCompleted()) return w->status();
    auto consumer = CurrentTorchStream(c10::Device(c10::DeviceType::CUDA, dev));
    if (!consumer.ok()) return consumer.status();
    DeviceScope scope(dev);
    const cudaError_t e = cudaStreamWaitEvent(*consumer, done, 0);
    return e == cudaSuccess ? Status() : CudaError(e, "cudaStreamWaitEvent on the done event");
  });
  p.deadline = RealClock()->Now() + options.timeout;
  std::shared_ptr<Work> work = p.work;
  pending.push_back(std::move(p));
  cv.notify_all();
  return work;
}

Status NcclCommunicator::Impl::Diagnose(uint64_t seq, const char* name, const std::string& what,
                                        bool timed_out) {
  const Duration grace = std::min<Duration>(options.timeout / 5, std::chrono::seconds(5));
  Status store_error;
  const std::vector<int> missing =
      ReportAndFindMissing(store, absl::StrCat(options.key_prefix, "/failed/", seq, "/"), rank,
                           world_size, grace, &store_error);
  const std::string head = absl::StrCat("nccl ", name, " #", seq, " on rank ", rank, " ", what);
  // A peer is gone, stuck or unreachable either way: this rank's failure
  // follows another's (as the Gloo communicator marks a transport error).
  worker_link::MarkPeerLost(missing.empty() ? -1 : missing.front());
  if (!store_error.ok()) {
    return absl::UnavailableError(absl::StrCat(
        head, "; the store could not tell which ranks reached it: ", store_error.message(),
        "; communicator aborted"));
  }
  if (!missing.empty()) {
    return absl::DeadlineExceededError(absl::StrCat(
        head, ": ranks ", FormatRanks(missing), " did not arrive; communicator aborted"));
  }
  const std::string every = absl::StrCat(head, "; every rank reached it; communicator aborted");
  return timed_out ? absl::DeadlineExceededError(every) : absl::UnavailableError(every);
}

void NcclCommunicator::Impl::Abort(std::unique_lock<std::mutex>& lock, const Status& why) {
  lock.unlock();
  std::lock_guard<std::mutex> issue_lock(issue_mu);
  lock.lock();
  AbortLocked(why);
}

void NcclCommunicator::Impl::AbortLocked(const Status& why) {
  if (broken.ok()) broken = why;
  if (!aborted && comm != nullptr) {
    aborted = true;
    (void)ncclCommAbort(comm);  // Unblocks the kernels still waiting on peers.
  }
  for (Pending& p : pending) {
    p.work->Finish(why);
    ReturnEvent(p.start);
    ReturnEvent(p.done);
  }
  pending.clear();
  cv.notify_all();
}

void NcclCommunicator::Impl::WatchdogLoop() {
  (void)cudaSetDevice(device);
  std::unique_lock<std::mutex> lock(mu);
  while (true) {
    cv.wait(lock, [this] { return stopping || !pending.empty(); });
    if (pending.empty()) return;  // Stopping and drained.
    // Asynchronous NCCL errors (a peer vanished, a remote abort).
    if (!aborted) {
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess &&
          async != ncclInProgress) {
        // Usually a peer that vanished (a remote or system error on its
        // connection): found as Diagnose finds a peer that never arrived.
        const uint64_t seq = pending.front().seq;
        const char* name = pending.front().name;
        const std::string what =
            absl::StrCat("failed: asynchronous NCCL error: ", NcclMessage(async, comm));
        lock.unlock();
        Status why = Diagnose(seq, name, what, /*timed_out=*/false);  // Store round trips: no lock.
        lock.lock();
        Abort(lock, why);
        continue;
      }
    }
    // Collectives complete in queue order on one stream: look at the head.
    Pending& head = pending.front();
    if (!head.started && cudaEventQuery(head.start) == cudaSuccess) {
      head.started = true;
      head.work->MarkStarted();
    }
    const cudaError_t q = cudaEventQuery(head.done);
    if (q == cudaSuccess) {
      if (!head.started) head.work->MarkStarted();
      // Completion and the events' return to the pool happen together.
      head.work->Finish(absl::OkStatus());
      ReturnEvent(head.start);
      ReturnEvent(head.done);
      pending.pop_front();  // Drops the tensors: the GPU is done with them.
      cv.notify_all();
      continue;
    }
    if (q != cudaErrorNotReady) {
      Abort(lock, CudaError(q, "polling the NCCL done event"));
      continue;
    }
    if (RealClock()->Now() > head.deadline) {
      const uint64_t seq = head.seq;
      const char* name = head.name;
      lock.unlock();
      Status why = Diagnose(
          seq, name, absl::StrCat("did not complete within ", ToSeconds(options.timeout), " s"),
          /*timed_out=*/true);  // Store round trips: no lock.
      lock.lock();
      Abort(lock, why);
      continue;
    }
    lock.unlock();
    std::this_thread::sleep_for(options.poll_interval);
    lock.lock();
  }
}

StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(rendezvous::Store* store,
                                                                     int rank, int world_size,
                                                                     NcclOptions options) {
  if (store == nullptr) return absl::InvalidArgumentError("nccl: store is null");
  RETURN_IF_ERROR(CheckRank("nccl", rank, world_size));
  const int count = CudaDeviceCount();
  if (count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("nccl: rank ", rank, ": no CUDA device is visible"));
  }
  auto impl = std::make_shared<Impl>();
  impl->store = store;
  impl->rank = rank;
  impl->world_size = world_size;
  impl->options = options;
  if (options.device < 0) {
    LOCKSTEP_CUDA_OK(cudaGetDevice(&impl->device));
  } else if (options.device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: rank ", rank, ": device ",
                                                   options.device, " does not exist (", count,
                                                   " visible)"));
  } else {
    impl->device = options.device;
  }
  DeviceScope scope(impl->device);

  // Unique id: rank 0 creates and publishes it; the others read it.
  ncclUniqueId id;
  const std::string id_key = options.key_prefix + "/unique_id";
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return NcclError(r, nullptr, "ncclGetUniqueId");
    RETURN_IF_ERROR(Annotate(
        store->Set(id_key, std::string(reinterpret_cast<const char*>(&id), sizeof(id))),
        "nccl: publishing the unique id"));
  } else {
    Status published = WaitForRanks(
        store, {{0, id_key}}, options.connect_timeout,
        absl::StrCat("nccl: rank ", rank, " waiting for rank 0's NCCL unique id"), options.progress);
    auto value = published.ok() ? store->Get(id_key, std::chrono::seconds(5))
                                : StatusOr<std::string>(published);
    if (!value.ok()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "nccl: rank ", rank, ": rank 0 did not publish the NCCL unique id within ",
          ToSeconds(options.connect_timeout), " s (", value.status().message(), ")"));
    }
    if (value->size() != sizeof(id)) {
      return absl::InvalidArgumentError(absl::StrCat("nccl: unique id in the store has ",
                                                     value->size(), " bytes, expected ",
                                                     sizeof(id)));
    }
    std::memcpy(&id, value->data(), sizeof(id));
  }
  const std::string arrived = options.key_prefix + "/arrived/";
  RETURN_IF_ERROR(Annotate(store->Set(arrived + std::to_string(rank), "1"),
                           "nccl: publishing arrival"));

  // Non-blocking init, so a rank that never arrives is a timeout, not a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&impl->comm, world_size, id, rank, &config);
  const MonoTime deadline = RealClock()->Now() + options.connect_timeout;
  while (r == ncclInProgress) {
    if (RealClock()->Now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (ncclCommGetAsyncError(impl->comm, &r) != ncclSuccess) break;
  }
  if (r != ncclSuccess) {
    const bool timed_out = r == ncclInProgress;
    Status error = timed_out ? Status() : NcclError(r, impl->comm, "ncclCommInitRankConfig");
    if (impl->comm != nullptr) {
      (void)ncclCommAbort(impl->comm);
      impl->comm = nullptr;
    }
    if (!timed_out) return error;
    Status store_error;
    const std::vector<int> missing = ReportAndFindMissing(store, arrived, rank, world_size,
                                                          std::chrono::seconds(0), &store_error);
    if (!missing.empty()) worker_link::MarkPeerLost(missing.front());
    return absl::DeadlineExceededError(absl::StrCat(
        "nccl: rank ", rank, " could not build the communicator of ", world_size,
        " ranks within ", ToSeconds(options.connect_timeout), " s",
        !store_error.ok()
            ? absl::StrCat(": the store could not tell which ranks arrived: ",
                           store_error.message())
        : missing.empty() ? std::string(": every rank arrived; NCCL bootstrap stalled")
                          : absl::StrCat(": ranks ", FormatRanks(missing), " never arrived")));
  }
  int lowest = 0, highest = 0;
  LOCKSTEP_CUDA_OK(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
  LOCKSTEP_CUDA_OK(cudaStreamCreateWithPriority(&impl->stream, cudaStreamNonBlocking, highest));
  Impl* raw = impl.get();
  impl->watchdog = std::thread([raw] { raw->WatchdogLoop(); });
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(std::move(impl)));
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclCommunicator::~NcclCommunicator() = default;
int NcclCommunicator::rank() const { return impl_->rank; }
int NcclCommunicator::world_size() const { return impl_->world_size; }
c10::Device NcclCommunicator::device() const {
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(impl_->device));
}

std::shared_ptr<Work> NcclCommunicator::AllReduce(at::Tensor tensor, ReduceOp op) {
  Status s = CheckCollectiveTensor(tensor, "allreduce", device());
  if (!s.ok()) return Work::Failed(s);
  auto type = ToNcclType(tensor.scalar_type());
  if (!type.ok() || tensor.scalar_type() == at::kBool) {
    return Work::Failed(absl::InvalidArgumentError(absl::StrCat(
        "nccl allreduce does not support dtype ", c10::toString(tensor.scalar_type()))));
  }
  if (op == ReduceOp::kAvg && !IsFloating(tensor.scalar_type())) {
    return Work::Failed(absl::InvalidArgumentError("allreduce average needs a floating dtype"));
  }
  const ncclRedOp_t nccl_op = op == ReduceOp::kAvg ? ncclAvg : ncclSum;
  void* data = tensor.data_ptr();
  const size_t count = static_cast<size_t>(tensor.numel());
  ncclComm_t comm = impl_->comm;
  const ncclDataType_t t = *type;
  return impl_->Issue("allreduce", {tensor}, [=](cudaStream_t stream) {
    return ncclAllReduce(data, data, count, t, nccl_op, comm, stream);
  });
}

std::shared_ptr<Work> NcclCommunicator::Broadcast(at::Tensor tensor, int root) {
  Status s = CheckCollectiveTensor(tensor, "broadcast", device());
  if (s.ok()) s = CheckBroadcastRoot(root, impl_->world_size);
  if (!s.ok()) return Work::Failed(s);
  auto type = ToNcclType(tensor.scalar_type());
  if (!type.ok()) return Work::Failed(type.status());
  void* data = tensor.data_ptr();
  const size_t count = static_cast<size_t>(tensor.numel());
  ncclComm_t comm = impl_->comm;
  const ncclDataType_t t = *type;
  return impl_->Issue("broadcast", {tensor}, [=](cudaStream_t stream) {
    return ncclBroadcast(data, data, count, t, root, comm, stream);
  });
}

std::shared_ptr<Work> NcclCommunicator::AllGather(at::Tensor input, at::Tensor output) {
  if (Status s = CheckAllGather(input, output, impl_->world_size, device()); !s.ok()) {
    return Work::Failed(s);
  }
  auto type = ToNcclType(input.scalar_type());
  if (!type.ok()) return Work::Failed(type.status());
  const void* in = input.data_ptr();
  void* out = output.data_ptr();
  const size_t count = static_cast<size_t>(input.numel());
  ncclComm_t comm = impl_->comm;
  const ncclDataType_t t = *type;
  return impl_->Issue("allgather", {input, output}, [=](cudaStream_t stream) {
    return ncclAllGather(in, out, count, t, comm, stream);
  });
}

std::shared_ptr<Work> NcclCommunicator::Barrier() {
  at::Tensor token;
  try {
    token = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(device()));
  } catch (const std::exception& e) {
    return Work::Failed(absl::FailedPreconditionError(
        absl::StrCat("nccl barrier: cannot allocate on ", device().str(), ": ", e.what())));
  }
  return AllReduce(token, ReduceOp::kSum);
}

#endif  // LOCKSTEP_WITH_NCCL

}  // namespace ddp
}  // namespace lockstep
