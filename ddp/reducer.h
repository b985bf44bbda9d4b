// Reducer: bucketed gradient averaging overlapped with backward.
//
// The Reducer owns one flat buffer per bucket (bucket_assignment.h) and a
// post-hook on every parameter's gradient accumulator. During a synchronised
// backward each hook copies its parameter's gradient into the parameter's
// slot of its bucket (or, with gradient_as_bucket_view, the gradient already
// is that slot) and marks the parameter ready.
//
// Bucket-ready ordering rule. A bucket is *complete* when every parameter in
// it is ready. Buckets are *launched* (their allreduce queued on the
// Communicator) strictly in bucket index order: when bucket i completes, it
// is launched if buckets 0..i-1 have been launched, and then every following
// complete bucket is launched too; otherwise it waits for the earlier ones.
// Because every rank computes the same bucket layout and launches in index
// order, every rank issues the same allreduces in the same order (the
// Communicator's cross-process invariant), whatever order gradients arrive
// in locally. Bucket 0 holds the parameters expected first (the last layers,
// reverse registration order), and is small (1 MB), so the first allreduce
// starts early and communication overlaps the rest of backward.
//
// Comm hook. Launching a bucket means handing it to the comm hook
// (comm_hook.h; ReducerOptions::comm_hook), which issues its collectives and
// returns a BucketWork whose result is the reduced bucket. The Reducer knows
// nothing of averaging beyond the hook's prescale_by_world: when set, the
// copy of each gradient into its slot also multiplies it by 1/world (the
// default allreduce hook's choice: one pass instead of two), unless the hook
// allows otherwise (prescale_optional) and the communicator divides while it
// reduces (Communicator::FusedAverage: shm), which saves that pass.
//
// Bucket memory. The bucket buffers come from the communicator when it has
// memory it reduces faster (Communicator::AllocateBucketMemory: shm's
// shared regions, where an allreduce needs no copies through staging
// slots), one allocation for all buckets at each (re)build; otherwise from
// the ordinary allocator.
//
// Own share. A communicator may read part of a bucket's input straight from
// this rank's gradients while it reduces (Communicator::OwnShare: shm, on
// buckets in its bucket memory, reads the slice this rank reduces). When the
// comm hook takes such inputs (CommHook::takes_deferred_inputs: the default
// allreduce) and the copy into the slots is a plain copy (no scaling), a
// gradient's elements inside that share are not copied in; the gradient
// is kept as an InputPiece of the bucket (GradBucket::deferred_inputs)
// until the communicator has read it. Over shm with two ranks that leaves
// half of every gradient uncopied.
//
// Finalisation. The first hook of a backward queues a callback on the
// autograd engine; it runs when backward ends, waits for every launched
// bucket's BucketWork (this wait, continuations included, is the *exposed*
// communication time), copies a result that is not the bucket itself into
// the bucket, and writes the reduced gradients back into param.grad (unless
// they are views already), bucket by bucket in launch order. With
// defer_wait the callback only closes the launches, and the waits happen in
// CompleteStep on the training thread, where each reduced bucket can be
// handed on (to the optimizer) while later ones are still on the wire.
//
// Rebuild. During the first synchronised backward the Reducer records the
// order in which gradients arrived. At the start of the next forward
// (RebuildBucketsIfNeeded) rank 0's recorded order is broadcast and every
// rank re-packs its buckets in that order, once.
//
// Gradient priority (gradient_priority; after DLCP and ByteScheduler).
// Without it buckets go on the wire in index order, so the first layers'
// gradients, computed last, always wait behind every later layer's bucket
// still queued, although the next forward needs them first. With it a
// scheduler thread launches the buckets, one on the wire at a time: before
// each launch (while two or more remain) the ranks allreduce their flags of
// which buckets are complete, and the bucket launched next is, among those
// complete on every rank, the one whose first parameter comes earliest in
// registration order (forward's order); when none is, the lowest-index
// unlaunched bucket, as without priority. Every rank computes the same
// choice from the same reduced flags, so all issue the same collectives in
// the same order. Cost: one small allreduce per bucket but the last, and no
// second bucket queued behind the one on the wire.
//
// Unused parameters. With find_unused_parameters, PrepareForBackward walks
// the autograd graph from the forward outputs; parameters whose accumulator
// is not reached are marked ready when the backward's first hook runs, as
// PyTorch's reducer does (their slot zeroed, or holding the gradient a
// defined param.grad has then, e.g. one accumulated under no_sync), so no
// bucket waits forever. Not at forward: a Forward with no Backward would
// launch collectives, and a zero_grad() between Forward and Backward would
// come after the previous step's gradient was copied. Without the flag, a backward that ends with parameters that
// never became ready fails with an error naming them.
// A parameter whose gradient went into its slot defined (its hook ran, or
// it holds one from no_sync steps or a zero_grad() that kept it) counts as
// used on this rank. After the last bucket is launched the ranks allreduce
// these flags (one float per parameter, one extra collective per step, as
// PyTorch's local_used_map); a parameter no rank used keeps its .grad as it
// was (undefined stays undefined), so the optimizer skips it as it does in
// one process, where before it got a zero gradient that weight decay and
// momentum acted on. A bucket holding a parameter this rank did not use is
// written back once the flags are reduced; the rest need not wait for them.
//
// Devices. Every parameter must be on one device, the communicator's
// (Communicator::device(): the CPU for Gloo, one CUDA device for NCCL); a
// mixed CPU/GPU parameter set is rejected at Create. On CUDA the bucket
// buffers live on the device, and the copies into the buckets, the 1/world
// scaling and the write-back run on the stream current where they run: the
// hooks run on the gradient accumulators' stream (the one current when the
// DDP wrapper was built; the engine orders it after the producing op), and
// finalisation on the streams current when backward() was called. Each
// bucket's collective is ordered after the hook's stream with an event, and
// finalisation waits for each bucket's completion event (the Work) before
// writing back. Build the DDP wrapper under the stream used for forward.
//
// Errors. Public methods return Status. The hooks and the finalisation
// callback run inside torch's backward: the finalisation callback throws
// the step's error as a std::runtime_error out of torch::autograd::backward
// (DistributedDataParallel::Backward turns it into a Status; a hook's own
// exception fails its bucket instead), and it is kept in last_error().
//
// Sample weighting (ReducerOptions::weight_by_samples). Every bucket buffer
// carries two extra elements after the gradient slots, [n, done]: this
// rank's sample count n_r for the step and a flag that it has no data left
// (JoinStep). The copy into a slot multiplies the gradient by n_r instead of
// 1/world, the comm hook (allreduce: a sum) reduces the extras with the
// gradients in the same collective, and finalisation divides the slots by
// the reduced N = sum n_r (by 1 when N is 0). So the result is the gradient
// of the global batch, sum_r n_r g_r / N, whatever each rank's batch size,
// with no extra collective. A joining rank (JoinStep) contributes n = 0 and
// done = 1; every rank reads the reduced [N, done] of its last step
// (last_global_samples, last_done_ranks): done == world means every rank has
// run out of data.
//
// Thread safety: Prepare/Rebuild/CompleteStep are called from the training
// thread; hooks and the callback run on the autograd thread; with
// gradient_priority the scheduler thread runs the comm hooks; state is
// guarded by mu_.
#ifndef LOCKSTEP_DDP_REDUCER_H_
#define LOCKSTEP_DDP_REDUCER_H_

#include <torch/torch.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "ddp/bucket_assignment.h"
#include "ddp/comm_hook.h"
#include "ddp/communicator.h"

namespace lockstep {
namespace ddp {

struct ReducerOptions {
  // Default: kDefaultBucketCapBytes / kDefaultFirstBucketCapBytes.
  size_t bucket_cap_bytes = kDefaultBucketCapBytes;
  size_t first_bucket_cap_bytes = kDefaultFirstBucketCapBytes;
  // Default: false (see "Unused parameters" above).
  bool find_unused_parameters = false;
  // param.grad becomes a view into its bucket: no copy back after allreduce.
  // Default: true (DdpOptions::gradient_as_bucket_view).
  bool gradient_as_bucket_view = true;
  // Bound on the end-of-backward wait for buckets. Default: collective timeout.
  Duration timeout = kDefaultCollectiveTimeout;
  // How each bucket is reduced (comm_hook.h). Default: AllreduceHook(), the
  // average. REQUIRES: comm_hook.run set.
  CommHook comm_hook = AllreduceHook();
  // Default: false. Weight each rank's gradient by its sample count (see
  // "Sample weighting"). REQUIRES: the comm hook sums ("allreduce").
  bool weight_by_samples = false;
  // Default: false. DLCP-style gradient priority (see "Gradient priority").
  // REQUIRES: a host communicator (gloo, shm).
  bool gradient_priority = false;
  // Default: false. When true, the end of a synchronised backward does not
  // wait for the buckets: the step stays open until CompleteStep, which waits
  // for them one by one (see "Deferred completion").
  bool defer_wait = false;
  // Default: false. With defer_wait and gradient_priority, the end of
  // backward does not wait for the scheduler to launch the last buckets
  // either (it launches one when the one on the wire is done): CompleteStep
  // waits for each launch in turn. REQUIRES: no collective of the caller's
  // own while the step is open (the scheduler's would interleave with it).
  bool defer_launches = false;
  // Called at the end of each successful finalisation, on the autograd
  // thread (with defer_wait: CompleteStep's), with no Reducer lock held.
  std::function<void(const struct ReducerStepStats&)> on_step;
  // Called on the thread that waits for the buckets (the autograd thread;
  // with defer_wait, CompleteStep's; in JoinStep, the training thread), with
  // no Reducer lock held, when finalisation starts waiting on bucket `b` (b >= 0) and with -1 when the
  // waits are over (for hang reports: where a rank is blocked). Must not block.
  std::function<void(int bucket)> on_wait;
};

// What one synchronised backward did, with timestamps for overlap analysis.
struct ReducerStepStats {
  // End of forward to end of finalisation; with defer_wait, end of forward
  // to finalisation's start plus comm_exposed_ms (the waits, in CompleteStep).
  double backward_ms = 0;
  // Finalisation's host wait on buckets. With a device communicator (NCCL)
  // finalisation queues a stream wait instead, so this is near zero and the
  // GPU-side wait is not in it.
  double comm_exposed_ms = 0;
  // Bytes this rank handed to collectives for the buckets (the comm hooks'
  // BucketWork::wire_bytes): the buckets' size for allreduce, half of it for
  // fp16/bf16 on float32 gradients.
  int64_t bytes_reduced = 0;
  // Bytes of gradients not copied into the buckets: the communicator read
  // them from the gradients themselves (see "Own share" above).
  int64_t bytes_read_in_place = 0;
  int buckets = 0;
  MonoTime forward_end{};       // PrepareForBackward.
  MonoTime backward_end{};      // Finalisation callback starts.
  // Indexed by bucket, like the two below.
  std::vector<MonoTime> bucket_launched;    // Reducer queued the allreduce.
  // When the communicator started / finished each bucket's collective (for
  // NCCL: when its watchdog saw the start / done event complete on the GPU).
  // Zero until then; last_stats() fills in what has happened since.
  std::vector<MonoTime> bucket_comm_start;
  std::vector<MonoTime> bucket_comm_end;
  // The buckets in the order they were launched.
  std::vector<size_t> launch_order;
  // gradient_priority: the agreements on the next bucket this step.
  int priority_agreements = 0;
};

class Reducer {
 public:
  struct NamedParam {
    std::string name;
    torch::Tensor tensor;  // requires_grad, distinct storage per entry.
  };

  // Builds buckets in reverse parameter order and installs the hooks.
  // `comm` must outlive the Reducer. Errors: InvalidArgument (no parameters,
  // a parameter not requiring grad, parameters on more than one device or not
  // on the communicator's device, or a parameter listed twice).
  static StatusOr<std::unique_ptr<Reducer>> Create(std::vector<NamedParam> params,
                                                   Communicator* comm, ReducerOptions options);
  ~Reducer();

  // InvalidArgument unless every tensor is on one device, the communicator's;
  // the message names the tensors (or the backend) involved.
  static Status CheckDevices(const std::vector<NamedParam>& tensors, const Communicator& comm);

  // Deferred completion (defer_wait). After a synchronised backward whose
  // every bucket was launched, step_open() is true until CompleteStep, which
  // waits for the buckets in the order they were launched, writes each one's
  // gradients back as soon as it is reduced and then calls on_bucket(bucket)
  // on the calling thread, while later buckets may still be on the wire
  // (DDP's overlap_optimizer steps the bucket's parameters there). A failure stops the callbacks; the
  // remaining buckets are still waited for. Returns the step's error (also
  // kept in last_error()); when no step is open, nothing is done and
  // last_error() is returned (OK unless an earlier step failed).
  // With `through` a bucket index, CompleteStep stops once that bucket is
  // done (waiting for the buckets launched before it, in launch order) and
  // the step stays open for the rest; it returns at once when that bucket is
  // already done. After a failure it waits for every bucket, as without
  // `through`. (DDP's overlap_forward completes the buckets a forward needs
  // as it reaches them.)
  using BucketDone = std::function<void(size_t bucket)>;
  Status CompleteStep(const BucketDone& on_bucket, int through = -1);
  bool step_open() const;
  // The open step's buckets not yet done, launched or not (empty when no
  // step is open).
  std::vector<size_t> pending_buckets() const;
  // True when the next RebuildBucketsIfNeeded will re-pack the buckets.
  bool rebuild_pending() const;

  // Called after forward when the coming backward must synchronise.
  // `outputs` are the forward outputs (used with find_unused_parameters).
  // Returns the error of the previous step if it failed, including a device
  // collective of that step that failed after its backward returned. (One
  // whose abort is still under way fails this step's first launch instead:
  // the communicator refuses new collectives once it is aborting.)
  // With weight_by_samples, `local_samples` is this rank's n_r for the step
  // (ignored otherwise).
  Status PrepareForBackward(const std::vector<torch::Tensor>& outputs,
                            int64_t local_samples = 0);

  // One synchronised step without data (weight_by_samples only): every
  // bucket is reduced with zero gradients, n = 0 and done = 1, and the
  // reduced average (the other ranks' global-batch gradient) is written into
  // param.grad, so an optimizer step keeps this rank's model in step.
  // Called from the training thread instead of forward and backward; blocks
  // until the buckets are reduced (bounded by the timeout).
  // Errors: FailedPrecondition without weight_by_samples; the communicator's.
  Status JoinStep();

  // The reduced [N, done] of the last finalised step (weight_by_samples;
  // 0 before the first). On CUDA: waits on the host for that collective
  // (bounded by the timeout) and reads the device; 0 if it failed.
  int64_t last_global_samples() const;
  int64_t last_done_ranks() const;

  // Called before forward; broadcasts rank 0's arrival order and re-packs
  // buckets after the first synchronised backward (once). Blocks on one
  // broadcast, bounded by the timeout. OK with nothing to do, also while a
  // step is open; a re-pack due while one is open is FailedPrecondition.
  Status RebuildBucketsIfNeeded();

  // Bucket layout (parameter indices per bucket), for tests and logs.
  std::vector<std::vector<size_t>> bucket_indices() const;
  // The bucket holding parameter `param` (an index into params()).
  size_t bucket_of(size_t param) const;
  // Whether the buckets live in the communicator's bucket memory (see
  // "Bucket memory"), for tests and the bench.
  bool buckets_in_comm_memory() const;
  ReducerStepStats last_stats() const;
  // last_error, or the failure of a collective of the previous step that
  // failed after backward's end queued only a stream wait on it (CUDA):
  // DDP checks it before forward's broadcasts.
  Status PreviousStepError();
  Status last_error() const;
  const std::vector<NamedParam>& params() const { return params_; }

 private:
  int64_t LastCount(int64_t index) const;  // [N, done][index], as above
  Status PreviousStepErrorLocked();  // REQUIRES: mu_ held

  struct Bucket {
    torch::Tensor buffer;               // Flat, one dtype (+ [n, done], see above).
    int64_t grad_numel = 0;             // Elements before the extras.
    std::vector<size_t> params;         // Indices into params_.
    std::vector<torch::Tensor> views;   // Slot of each param, shaped like it.
    std::vector<int64_t> offsets;       // Start of each slot in buffer.
    size_t pending = 0;
    std::shared_ptr<BucketWork> work;   // The comm hook's, once launched.
    // The elements the communicator reads from this rank's own gradients
    // (Communicator::OwnShare; empty unless the hook takes deferred inputs
    // and the copy is plain), and, this step, the gradients' pieces there.
    std::pair<int64_t, int64_t> share{0, 0};
    std::vector<InputPiece> deferred;
  };

  Reducer(std::vector<NamedParam> params, Communicator* comm, ReducerOptions options);
  // Lays out the buckets in `order` and allocates their memory (collective
  // when the communicator has bucket memory). REQUIRES: mu_ held.
  Status BuildBuckets(const std::vector<size_t>& order);
  void OnGradReady(size_t index);                       // Hook entry point.
  void MarkReadyLocked(size_t index);
  void LaunchCompleteBucketsLocked();
  void LaunchLocked(size_t bucket);  // Hands the bucket to the comm hook.
  // gradient_priority: the thread that launches the buckets.
  void SchedulerLoop();
  // gradient_priority: waits until the scheduler is done with this step
  // (told to stop launching when `abort`); returns its error. A no-op
  // without priority.
  Status AwaitScheduledLocked(std::unique_lock<std::mutex>& lock, bool abort);
  // What every step starts with (PrepareForBackward, JoinStep): the sticky
  // error or a failed collective of the previous step, else a fresh step
  // (nothing launched, sync expected, stats reset). `lock` holds mu_.
  Status BeginStepLocked(std::unique_lock<std::mutex>& lock);
  void Finalize();  // The autograd callback: throws on failure.
  // Waits for the launched buckets not yet done and writes them back (see
  // CompleteStep), stopping after bucket `through` (>= 0) when all is well;
  // once every bucket is done, finalises the step. Records and returns the
  // first error, `status` first when not OK.
  Status FinishBuckets(Status status, const BucketDone& on_bucket, int through = -1);
  // Checks the hook's result for bucket `b` and writes it into param.grad.
  Status WriteBackLocked(size_t b, const torch::Tensor& result);
  // find_unused_parameters: allreduces this step's used flags; called when
  // the last bucket is launched, so every rank issues it in the same place.
  void LaunchUsedFlagsLocked();
  // find_unused_parameters: whether bucket `b` holds a parameter this rank
  // did not use this step (its write-back needs the reduced flags).
  bool NeedsUsedFlagsLocked(size_t b) const;
  // Waits for the used flags' allreduce (and, with gradient_priority, for
  // its launch) and records them; OK at once once recorded. Takes mu_.
  Status AwaitUsedFlags();

  std::vector<NamedParam> params_;
  Communicator* const comm_;
  const ReducerOptions options_;
  // The copy into a slot divides by the world size (see "Comm hook").
  const bool prescale_;
  // Keeps each accumulator (and with it our hook) alive; see DESIGN.md.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;

  mutable std::mutex mu_;
  std::vector<Bucket> buckets_;                   // GUARDED_BY(mu_)
  std::vector<std::pair<size_t, size_t>> slot_;   // param -> (bucket, position)
  std::vector<bool> ready_;                       // GUARDED_BY(mu_)
  // This step's launches, in order (without priority, bucket index order).
  std::vector<size_t> launch_order_;              // GUARDED_BY(mu_)
  // gradient_priority: each bucket's rank in the order forward needs them
  // (its first parameter's registration index), the scheduler and its state.
  std::vector<size_t> priority_;                  // GUARDED_BY(mu_)
  std::thread scheduler_;
  std::condition_variable cv_;
  uint64_t step_seq_ = 0;                         // GUARDED_BY(mu_); steps begun.
  uint64_t scheduled_step_ = 0;                   // GUARDED_BY(mu_); the scheduler's last.
  bool step_aborted_ = false;                     // GUARDED_BY(mu_)
  bool shutdown_ = false;                         // GUARDED_BY(mu_)
  Status schedule_error_;                         // GUARDED_BY(mu_)
  bool step_open_ = false;                        // GUARDED_BY(mu_); see defer_wait.
  // The step's buckets done so far (a prefix of launch_order_), the first
  // error among them and the time spent waiting on them.
  size_t finished_ = 0;                           // GUARDED_BY(mu_)
  Status finish_status_;                          // GUARDED_BY(mu_)
  Duration finish_waited_{};                      // GUARDED_BY(mu_)
  bool expect_sync_ = false;                      // GUARDED_BY(mu_)
  // Parameters this step's forward did not reach (find_unused_parameters),
  // until the backward's first hook marks them ready. GUARDED_BY(mu_)
  std::vector<size_t> unused_;
  // Those the first hook marked ready without a gradient: one whose own
  // hook comes later was used after all (outside this Forward). GUARDED_BY(mu_)
  std::vector<bool> taken_as_unused_;
  bool finalizer_queued_ = false;                 // GUARDED_BY(mu_)
  bool rebuilt_ = false;                          // GUARDED_BY(mu_)
  bool comm_memory_ = false;                      // GUARDED_BY(mu_)
  std::vector<size_t> arrival_order_;             // GUARDED_BY(mu_)
  bool have_arrival_order_ = false;               // GUARDED_BY(mu_)
  Status error_;                                  // GUARDED_BY(mu_)
  ReducerStepStats stats_;                        // GUARDED_BY(mu_)
  ReducerStepStats last_stats_;                   // GUARDED_BY(mu_)
  // The last finalised step's, by bucket (null: not launched).
  std::vector<std::shared_ptr<Work>> last_works_;  // GUARDED_BY(mu_)
  // weight_by_samples: this step's n_r, and the reduced
  // [N, done] of the last finalised step (undefined before).
  int64_t local_samples_ = 0;                     // GUARDED_BY(mu_)
  // This step's factor for the copy into a slot (1/world, n_r or 1), and
  // it as a CPU scalar tensor for mul_out (set in PrepareForBackward).
  double slot_scale_ = 1.0;                       // GUARDED_BY(mu_)
  torch::Tensor slot_scale_tensor_;               // GUARDED_BY(mu_)
  // find_unused_parameters: this step's used flags by parameter (a defined
  // gradient went into its slot), their allreduce (sums on every rank's
  // device), and whether the sums have been read into any_rank_used_.
  std::vector<uint8_t> used_here_;                // GUARDED_BY(mu_)
  torch::Tensor used_counts_;                     // GUARDED_BY(mu_)
  std::shared_ptr<Work> used_work_;               // GUARDED_BY(mu_)
  bool used_known_ = false;                       // GUARDED_BY(mu_)
  std::vector<uint8_t> any_rank_used_;            // GUARDED_BY(mu_)
  torch::Tensor last_counts_;                     // GUARDED_BY(mu_)
  std::shared_ptr<Work> last_counts_work_;        // GUARDED_BY(mu_): its collective
};

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_REDUCER_H_
