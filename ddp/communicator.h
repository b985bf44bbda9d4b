// Communicator: asynchronous collectives over the ranks of one job round.
//
// The interface the Reducer and the DDP wrapper talk to. Implementations:
// GlooCommunicator (CPU, TCP; gloo_communicator.h), ShmCommunicator (CPU,
// ranks on one host, shared memory; shm_communicator.h) and NcclCommunicator
// (CUDA; nccl_communicator.h).
//
// Cross-process invariant (read this before issuing collectives): every rank
// issues the same collectives, with the same sizes and dtypes, in the same
// order. Collectives carry no tags visible to callers: the n-th collective
// issued on one rank is matched with the n-th on every other rank. The
// Reducer keeps this invariant by launching buckets strictly in bucket index
// order; anything else that issues collectives must do the same.
//
// Tensors: flat (any shape, but contiguous), dense, on the communicator's
// device() (the CPU for Gloo; one CUDA device for NCCL). The collective reads
// and writes the tensor's storage in place asynchronously: the caller must
// leave its contents alone until the Work completes (implementations keep the
// tensor alive themselves). CUDA collectives are ordered after the work
// already queued on the caller's current stream, and complete when their own
// stream reaches them (see nccl_communicator.h).
//
// Errors are never thrown: a call that cannot run returns a Work that is
// already completed with the error. Codes: InvalidArgument (bad tensor),
// DeadlineExceeded (a peer did not arrive within the timeout; the message
// names the missing ranks; also how Gloo reports a peer that died, whose
// connection reset, since that peer never reports), Unavailable (a transport
// error every rank reported, or shm's peer process that exited),
// FailedPrecondition (the communicator already failed).
// After any transport error or timeout the communicator is unusable: every
// later collective fails with FailedPrecondition, and the job must rebuild it
// through a new rendezvous round (see ddp/README.md, "Errors").
//
// Thread safety: all methods may be called from any thread; collectives are
// queued in call order (callers on several threads must order their calls
// themselves to keep the invariant above).
#ifndef LOCKSTEP_DDP_COMMUNICATOR_H_
#define LOCKSTEP_DDP_COMMUNICATOR_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace lockstep {
namespace ddp {

// Default end-to-end timeout of one collective.
inline constexpr std::chrono::seconds kDefaultCollectiveTimeout{300};

// Slack callers add to the collective timeout when they Wait on a Work: the
// collective's own timeout (which names the missing ranks) must fire first.
inline constexpr std::chrono::seconds kWorkWaitSlack{10};

enum class ReduceOp {
  kSum,
  kAvg,  // Sum divided by the world size (floating-point dtypes only).
};

// The handle of one queued collective.
// Thread safety: all methods are thread-safe.
class Work {
 public:
  Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Blocks until the collective completes or `timeout` passes. Returns the
  // collective's status, or DeadlineExceeded if the wait timed out (the
  // collective itself keeps running and has its own timeout).
  Status Wait(Duration timeout = kDefaultCollectiveTimeout);

  // Orders the caller's current stream after the collective without blocking
  // the host (CUDA collectives: an event wait on the stream). For host-side
  // collectives it is Wait(timeout). Errors that happen later still reach
  // the Work's status and the communicator (it aborts, see each backend).
  Status WaitStream(Duration timeout = kDefaultCollectiveTimeout);

  bool IsCompleted() const;

  // The final status; OK while still pending.
  Status status() const;

  // When the communicator thread started running it / completed it (zero
  // time point when it has not yet).
  MonoTime started_at() const;
  MonoTime finished_at() const;

  // For implementations.
  void MarkStarted();
  void Finish(Status status);
  static std::shared_ptr<Work> Failed(Status status);
  // Installs what WaitStream does instead of a host wait. Set before the
  // Work is handed out.
  void SetStreamWaiter(std::function<Status()> waiter) { stream_waiter_ = std::move(waiter); }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;       // GUARDED_BY(mu_)
  Status status_;           // GUARDED_BY(mu_)
  MonoTime started_at_{};   // GUARDED_BY(mu_)
  MonoTime finished_at_{};  // GUARDED_BY(mu_)
  std::function<Status()> stream_waiter_;  // Immutable once handed out.
};

// Part of an allreduce's input that is not in the tensor (AllReduceFrom):
// the elements [offset, offset + source.numel()) of the flattened tensor are
// read from `source` instead.
struct InputPiece {
  int64_t offset = 0;
  at::Tensor source;  // Contiguous, with the tensor's dtype and device.
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Short name for logs and stats: "gloo", "nccl", "fake".
  virtual std::string backend() const = 0;
  // Where collective tensors must live. Default: the CPU.
  virtual c10::Device device() const { return c10::Device(c10::DeviceType::CPU); }

  // In place: `tensor` becomes the elementwise sum (or average) over ranks.
  // Dtypes: float32, float64, float16, bfloat16, int32, int64 (kAvg: the
  // floating ones). Half-precision sums round to the dtype after every
  // addition (the comm hooks fp16/bf16 rely on this: comm_hook.h).
  virtual std::shared_ptr<Work> AllReduce(at::Tensor tensor, ReduceOp op) = 0;

  // In place: every rank's `tensor` becomes root's. Any dtype.
  // REQUIRES: 0 <= root < world_size().
  virtual std::shared_ptr<Work> Broadcast(at::Tensor tensor, int root) = 0;

  // `output` (numel == world_size * input.numel, same dtype) receives every
  // rank's `input` in rank order.
  virtual std::shared_ptr<Work> AllGather(at::Tensor input, at::Tensor output) = 0;

  // Completes once every rank has entered the barrier.
  virtual std::shared_ptr<Work> Barrier() = 0;

  // Memory for gradient buckets that this communicator reduces faster than
  // ordinary memory: `numel` zeroed elements of `dtype` on device(). (shm:
  // memory inside a segment every rank maps, so an allreduce of a tensor in
  // it reads and writes the peers' copies in place, with no copy through
  // staging slots.) Collective: every rank calls it with the same arguments
  // in the same order, relative to its other calls. Returns an undefined
  // tensor when the communicator has no such memory (the default) or could
  // not get it on every rank; the caller then allocates ordinary memory.
  // Errors: what leaves the ranks unable to agree (a store failure), and
  // InvalidArgument for numel < 1 (shm).
  virtual StatusOr<at::Tensor> AllocateBucketMemory(int64_t numel, at::ScalarType dtype) {
    (void)numel;
    (void)dtype;
    return at::Tensor();
  }

  // True when AllReduce(kAvg) costs no more than kSum (the division rides
  // on the reduction), so the Reducer need not divide each gradient by the
  // world size first. Default: false.
  virtual bool FusedAverage() const { return false; }

  // The elements [first, second) of `tensor` whose input only this rank
  // reads, while the allreduce runs (shm, a tensor in bucket memory: the
  // slice this rank reduces). A caller may leave them out of the tensor and
  // pass their sources to AllReduceFrom, saving the copy in. Default: none,
  // {0, 0}.
  virtual std::pair<int64_t, int64_t> OwnShare(const at::Tensor& tensor) const {
    (void)tensor;
    return {0, 0};
  }

  // AllReduce(tensor, op), with the input of the elements each piece covers
  // read from the piece's source rather than from `tensor`: the result is
  // what copying the sources in and then reducing would give, and lands in
  // all of `tensor` as usual. The sources are only read, and are kept alive
  // until the Work completes. Errors as AllReduce, and InvalidArgument for a
  // piece outside the tensor, overlapping another, or of another dtype,
  // device or layout. Default: copies the pieces in on the calling thread,
  // then AllReduce. (shm reads the pieces inside its own share in place.)
  virtual std::shared_ptr<Work> AllReduceFrom(at::Tensor tensor, ReduceOp op,
                                              std::vector<InputPiece> pieces);
};

// Argument checks shared by the implementations, made before anything is
// queued. Each returns InvalidArgument naming what was wrong.

// `t` is a defined, dense, contiguous tensor on `device`; `what` names it.
Status CheckCollectiveTensor(const at::Tensor& t, const char* what,
                             c10::Device device = c10::Device(c10::DeviceType::CPU));
// `rank` is in [0, world_size) and world_size >= 1 (Create); `backend`
// prefixes the message.
Status CheckRank(const char* backend, int rank, int world_size);
// `root` is a rank of the world.
Status CheckBroadcastRoot(int root, int world_size);
// Both tensors pass CheckCollectiveTensor, with the same dtype, and `output`
// holds world_size x input.numel() elements.
Status CheckAllGather(const at::Tensor& input, const at::Tensor& output, int world_size,
                      c10::Device device = c10::Device(c10::DeviceType::CPU));
// The pieces of AllReduceFrom: each a contiguous tensor of `tensor`'s dtype
// and device inside its elements, none overlapping another. Sorts them by
// offset.
Status CheckInputPieces(const at::Tensor& tensor, std::vector<InputPiece>& pieces);
// Copies every piece's source into its place in `tensor`.
void CopyInputPieces(const at::Tensor& tensor, const std::vector<InputPiece>& pieces);
// The CPU communicators' allreduce: a CPU tensor of float, double, float16,
// bfloat16, int32 or int64; kAvg on floating dtypes only.
Status CheckCpuAllReduce(const at::Tensor& t, ReduceOp op);

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_COMMUNICATOR_H_
