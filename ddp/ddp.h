// DistributedDataParallel: data-parallel training of any torch::nn::Module,
// the C++ counterpart of torch.nn.parallel.DistributedDataParallel.
//
//   ASSIGN_OR_RETURN(auto group, lockstep::ddp::InitFromEnv());
//   auto model = MyNet();
//   ASSIGN_OR_RETURN(auto ddp, DistributedDataParallel::Create(model, group->communicator()));
//   torch::optim::SGD opt(model->parameters(), 0.01);
//   for (...) {
//     opt.zero_grad();
//     ASSIGN_OR_RETURN(torch::Tensor out, ddp->Forward(x));
//     RETURN_IF_ERROR(ddp->Backward(loss_fn(out, y)));  // Gradients are averaged.
//     opt.step();
//   }
//
// Construction broadcasts parameters and buffers from rank 0 (every rank
// starts from rank 0's model) and builds the Reducer (reducer.h) over the
// parameters that require grad (a tensor shared by several modules, as with
// tied weights, is reduced once). Each Forward broadcasts buffers from rank 0
// first (broadcast_buffers) and, unless inside a NoSync scope, prepares the
// Reducer so the following backward averages gradients across ranks,
// overlapping the allreduces with backward. Backward may be Backward(loss)
// or loss.backward(); the latter throws c10/std exceptions on failure.
//
// Every rank must call Create, Forward and Backward the same number of times
// in the same order (the Communicator's invariant).
//
// Errors: Status from Create/Forward/Backward; a communicator error (a peer
// missing past the timeout, a transport error) leaves the object unusable:
// see ddp/README.md "Errors" for the rebuild policy.
// Thread safety: one training thread per object.
#ifndef LOCKSTEP_DDP_DDP_H_
#define LOCKSTEP_DDP_DDP_H_

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "ddp/communicator.h"
#include "ddp/reducer.h"

namespace lockstep {
namespace ddp {

// Per-step statistics, for logs, the bench and progress reports.
struct StepStats {
  int64_t step = 0;             // Synchronised steps so far (1-based).
  double forward_ms = 0;        // Forward, including the buffer broadcast.
  double backward_ms = 0;       // End of forward to end of gradient sync.
  double comm_exposed_ms = 0;   // Time backward's end waited on buckets.
  int64_t bytes_reduced = 0;
  int buckets = 0;
  ReducerStepStats reducer;     // Timestamps per bucket.
};

struct DdpOptions {
  // Default 25 (MB); the first bucket is kDefaultFirstBucketCapBytes.
  double bucket_cap_mb = 25;
  // Default false: see reducer.h "Unused parameters".
  bool find_unused_parameters = false;
  // Default true: buffers are broadcast from rank 0 before every forward.
  bool broadcast_buffers = true;
  // Default false: param.grad as views into the buckets (saves a copy).
  bool gradient_as_bucket_view = false;
  // Bound on every blocking wait on collectives. Default: kDefaultCollectiveTimeout.
  Duration timeout = kDefaultCollectiveTimeout;
  // Called on the autograd thread after each synchronised backward.
  std::function<void(const StepStats&)> on_step;
};

class DistributedDataParallel {
 public:
  // `module`: a module holder (MyNet, torch::nn::Sequential) or shared_ptr
  // to a module with a forward method. Blocks on the initial broadcasts.
  // Errors: InvalidArgument (options, no trainable parameter), the
  // communicator's errors.
  template <typename ModuleType>
  static StatusOr<std::unique_ptr<DistributedDataParallel>> Create(
      ModuleType module, std::shared_ptr<Communicator> comm, DdpOptions options = {}) {
    torch::nn::AnyModule any(std::move(module));
    return CreateImpl(std::move(any), std::move(comm), std::move(options));
  }

  // Runs the module's forward with the given arguments (see class comment).
  template <typename... Args>
  StatusOr<torch::Tensor> Forward(Args&&... args) {
    RETURN_IF_ERROR(PreForward());
    torch::Tensor out;
    try {
      out = module_.forward(std::forward<Args>(args)...);
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("DDP: forward threw: ", e.what()));
    }
    RETURN_IF_ERROR(PostForward({out}));
    return out;
  }

  // loss.backward(), with errors as Status (a missing gradient names the
  // parameter; a communication failure names the missing ranks).
  Status Backward(const torch::Tensor& loss);

  // RAII: while alive, Forward does not prepare synchronisation, so the
  // following backward only accumulates local gradients; the next
  // synchronised backward reduces the accumulated sum.
  class NoSyncScope {
   public:
    explicit NoSyncScope(DistributedDataParallel* ddp) : ddp_(ddp) { ddp_->require_sync_ = false; }
    ~NoSyncScope() { ddp_->require_sync_ = true; }
    NoSyncScope(const NoSyncScope&) = delete;
    NoSyncScope& operator=(const NoSyncScope&) = delete;

   private:
    DistributedDataParallel* ddp_;
  };
  NoSyncScope NoSync() { return NoSyncScope(this); }

  std::shared_ptr<torch::nn::Module> module() const { return module_.ptr(); }
  std::vector<torch::Tensor> parameters() const { return module_.ptr()->parameters(); }
  Communicator& communicator() const { return *comm_; }
  const Reducer& reducer() const { return *reducer_; }
  // The last synchronised step (all zero before the first), read from the
  // reducer each time: device collectives may finish after backward returns.
  StepStats last_stats() const;

 private:
  DistributedDataParallel(torch::nn::AnyModule module, std::shared_ptr<Communicator> comm,
                          DdpOptions options)
      : module_(std::move(module)), comm_(std::move(comm)), options_(std::move(options)) {}
  static StatusOr<std::unique_ptr<DistributedDataParallel>> CreateImpl(
      torch::nn::AnyModule module, std::shared_ptr<Communicator> comm, DdpOptions options);
  Status PreForward();
  Status PostForward(const std::vector<torch::Tensor>& outputs);
  void OnReducerStep();
  StepStats MakeStats(const ReducerStepStats& r) const;

  torch::nn::AnyModule module_;
  std::shared_ptr<Communicator> comm_;
  DdpOptions options_;
  std::unique_ptr<Reducer> reducer_;
  std::vector<torch::Tensor> buffers_;
  bool require_sync_ = true;
  bool sync_pending_ = false;
  MonoTime forward_start_{};
  double forward_ms_ = 0;
  double synced_forward_ms_ = 0;  // forward_ms_ of the last synchronised step.
  int64_t steps_ = 0;             // Synchronised steps.
};

// Broadcasts `tensors` from `root` in place, packed per dtype into flat
// buffers of at most `chunk_bytes` (one collective per chunk). With a
// host-side communicator it blocks up to `timeout` per chunk; with a device
// one (NCCL) the copies back are queued on the current stream behind the
// broadcast and the host does not wait. All ranks must pass the same shapes
// and dtypes.
Status BroadcastCoalesced(Communicator& comm, const std::vector<torch::Tensor>& tensors, int root,
                          Duration timeout, size_t chunk_bytes = 64u << 20);

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_DDP_H_
