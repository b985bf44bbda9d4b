// Comm hooks: what the Reducer does with a full bucket.
//
// The Reducer copies gradients into buckets and launches buckets in index
// order (reducer.h); *how* a bucket is reduced across ranks is the comm
// hook's choice, in the spirit of c10d's register_comm_hook. A hook is given
// the bucket (its flat buffer, the parameters in it with their offsets, its
// index) and the communicator, issues collectives, and returns a BucketWork:
// a future whose result is the reduced bucket. At the end of backward the
// Reducer waits for each bucket's BucketWork and writes its result back into
// the gradients (or, with gradient_as_bucket_view, the result already is the
// gradients' storage).
//
// Built-in hooks (CommHookFromName names them; ddp/README.md "Comm hooks"):
//   allreduce  average: grad/world fused into the copy, then a sum allreduce
//              (the default); on a communicator that averages in its
//              reduction (shm: FusedAverage), an unscaled bucket and kAvg,
//              with the communicator's own share read from the gradients
//              (takes_deferred_inputs).
//   fp16/bf16  average on a half-precision wire: grad/world fused into the
//              copy (so the sum cannot overflow where the average does not),
//              cast to float16/bfloat16, sum allreduce, cast back. Half the
//              bytes of a float32 bucket.
//   adasum     Adasum (Maleki et al.; Horovod): per parameter, a pairwise
//              tree of Combine (below) over the ranks' gradients, computed
//              by every rank from an allgather of the bucket.
//
// Contract for a hook (built-in or user):
// - It runs on the autograd thread (the training thread in JoinStep; the
//   Reducer's scheduler thread with gradient_priority) with the Reducer's
//   lock held, once per bucket per synchronised backward, buckets in index
//   order (gradient_priority: the order the ranks agreed). It must not call
//   back into the Reducer or the DDP object.
// - Cross-process invariant (communicator.h): every rank's hook must issue
//   the same collectives, in the same order, for the same bucket; and all of
//   them before it returns (a collective issued later, from a continuation,
//   could interleave with the next bucket's differently on each rank).
// - It may overwrite bucket.buffer (the gradients' slots) at will. The
//   result must be a tensor with the buffer's numel and dtype, on its device;
//   returning the buffer itself avoids a copy.
// - Errors: return BucketWork::Failed(status) (or a Work that fails); an
//   exception thrown by the hook is caught and fails the step the same way.
//
// Thread safety: a BucketWork's accessors may be called from any thread;
// Wait must not be called from two threads at once (the Reducer calls it
// from the autograd thread only).
#ifndef LOCKSTEP_DDP_COMM_HOOK_H_
#define LOCKSTEP_DDP_COMM_HOOK_H_

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "ddp/communicator.h"

namespace lockstep {
namespace ddp {

// One bucket as a hook sees it.
struct GradBucket {
  size_t index = 0;   // Bucket index (the launch order too, unless gradient_priority reorders).
  at::Tensor buffer;  // Flat, one dtype, on the communicator's device.
  // Per parameter in the bucket, in buffer order: the parameter's index in
  // the Reducer's parameter list, where its slot starts in `buffer`
  // (elements) and how many elements it has. `slots[i]` is that slot,
  // shaped like the parameter (an alias of `buffer`).
  std::vector<size_t> param_indices;
  std::vector<int64_t> offsets;
  std::vector<int64_t> numels;
  std::vector<at::Tensor> slots;
  // True when the Reducer has already divided each gradient by the world
  // size while copying it in (CommHook::prescale_by_world).
  bool prescaled = false;
  // True with weight_by_samples: each slot holds n_r x grad and the
  // bucket's last two elements [n, done]; the hook must sum.
  bool weighted = false;
  // Only for a hook with takes_deferred_inputs: parts of the buffer that
  // hold nothing yet, whose input is still in the gradients (reducer.h "Own
  // share"). The hook must reduce the buffer with
  // Communicator::AllReduceFrom(buffer, op, deferred_inputs).
  std::vector<InputPiece> deferred_inputs;
};

// The future a hook returns: one communicator Work (its collective) and, if
// the reduction needs it, a continuation that runs after the Work completes
// and produces the result (a cast back, the Adasum tree). The continuation
// runs inside Wait, on the waiting thread (for the Reducer: the end of
// backward), after Work::WaitStream, so on CUDA it is queued on the caller's
// current stream behind the collective.
class BucketWork {
 public:
  using Continuation = std::function<StatusOr<at::Tensor>()>;

  // The result is `result` once `work` has completed. `wire_bytes`: bytes
  // this rank handed to collectives for the bucket (bytes_reduced in the
  // step stats). REQUIRES: work != nullptr.
  static std::shared_ptr<BucketWork> Of(std::shared_ptr<Work> work, at::Tensor result,
                                        int64_t wire_bytes);
  // The result is what `then()` returns, run once after `work` completes.
  static std::shared_ptr<BucketWork> Then(std::shared_ptr<Work> work, Continuation then,
                                          int64_t wire_bytes);
  // The same for a continuation that reads the collective's result on the
  // host (Adasum's coefficients): Wait waits on the host for the collective
  // to have ended (Work::Wait) where Then only orders the caller's stream
  // after it on a device, so a collective that fails after that order was
  // taken (a peer lost, the communicator aborted with the output half
  // written) fails the bucket instead of feeding `then` its output.
  static std::shared_ptr<BucketWork> ThenOnHost(std::shared_ptr<Work> work, Continuation then,
                                                int64_t wire_bytes);
  // Already failed; `Wait` returns `status`.
  static std::shared_ptr<BucketWork> Failed(Status status);

  // Waits for the collective (Work::WaitStream: a stream wait on CUDA, a
  // host wait otherwise; a host wait for ThenOnHost; at most `timeout`),
  // then runs the continuation once.
  // Returns the reduced bucket, or the first error. Later calls return the
  // same result.
  StatusOr<at::Tensor> Wait(Duration timeout);

  // The underlying collective, for its status and timestamps.
  const std::shared_ptr<Work>& work() const { return work_; }
  int64_t wire_bytes() const { return wire_bytes_; }

 private:
  BucketWork(std::shared_ptr<Work> work, at::Tensor result, Continuation then, int64_t wire_bytes,
             bool host_wait)
      : work_(std::move(work)),
        then_(std::move(then)),
        wire_bytes_(wire_bytes),
        host_wait_(host_wait),
        result_(std::move(result)) {}

  const std::shared_ptr<Work> work_;
  const Continuation then_;
  const int64_t wire_bytes_;
  const bool host_wait_;
  // Written by Wait only (one waiter at a time, see above).
  bool waited_ = false;
  Status status_;
  at::Tensor result_;
};

// A comm hook: a plain callable plus what the Reducer should fuse for it.
struct CommHook {
  using Fn = std::function<std::shared_ptr<BucketWork>(GradBucket& bucket, Communicator& comm)>;
  // For logs and errors: "allreduce", "fp16", "bf16", "adasum", or the
  // user's.
  std::string name = "custom";
  // Default: false. When true the Reducer multiplies each gradient by
  // 1/world while copying it into the bucket (no extra pass over the bucket),
  // so the bucket holds grad/world when `run` sees it.
  bool prescale_by_world = false;
  Fn run;
  // Default: false. When true, prescale_by_world is only a preference: on a
  // communicator whose FusedAverage() is true the Reducer copies gradients
  // unscaled and `run` sees bucket.prescaled false, and must then average
  // itself (AllReduce kAvg: the division rides on the reduction).
  bool prescale_optional = false;
  // Default: false. True for a hook that hands GradBucket::deferred_inputs
  // to AllReduceFrom; the Reducer then may leave the communicator's own
  // share of a bucket uncopied (reducer.h "Own share"). A hook without it
  // always sees a complete buffer.
  bool takes_deferred_inputs = false;
  // Default: false. True for a hook that, given a bucket with `weighted`
  // set, allreduces the buffer with a plain sum in its own dtype (every
  // element, the sample count included): what weight_by_samples needs.
  // The Reducer refuses weight_by_samples with a hook without it (whatever
  // its name). AllreduceHook sets it.
  bool sums_weighted_buckets = false;
};

// The built-in hooks (see the top of this file).
CommHook AllreduceHook();
CommHook Fp16CompressHook();
CommHook Bf16CompressHook();
CommHook AdasumHook();

// "allreduce", "fp16", "bf16" or "adasum"; InvalidArgument naming the
// choices otherwise.
StatusOr<CommHook> CommHookFromName(const std::string& name);

// Adasum's pairwise rule, for two gradients of one parameter:
//   Combine(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b
// Orthogonal a and b give a + b; identical ones give a. A zero vector's
// coefficient is 1 (its term is zero anyway). Writes the result into `a`.
// The dot products are accumulated in double.
// REQUIRES: a and b have the same numel and dtype, on one device.
void AdasumCombineInto(at::Tensor a, const at::Tensor& b);

// The Adasum tree over the rows of `grads` ([world, n]: one row per rank,
// each row one parameter's gradient), in place; the result is left in row 0.
// With P the largest power of two <= world, each remainder rank r >= P is
// first folded into rank r - P (row r-P = Combine(row r-P, row r)); then the
// P rows are combined pairwise at distances 1, 2, 4, ... (recursive
// halving's pairing): row i = Combine(row i, row i+d) for every i that is a
// multiple of 2d. For a power-of-two world this is Horovod's tree.
void AdasumTreeInPlace(at::Tensor grads);

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_COMM_HOOK_H_
