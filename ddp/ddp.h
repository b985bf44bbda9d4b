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
//     ddp->OptimizerStep(opt);  // opt.step(), timed for the step split (progress.h).
//   }
//
// Any module: Create takes a module holder (MyNet, torch::nn::Sequential,
// torch::nn::Linear), a std::shared_ptr to a module or a
// torch::nn::AnyModule, and returns a TypedDistributedDataParallel<M> whose
// Forward takes whatever arguments the module's forward takes and returns
// whatever it returns: a Tensor, std::tuple (e.g. logits and an auxiliary
// output), std::vector, std::map or c10::Dict of tensors, c10::IValue...
//
//   ASSIGN_OR_RETURN(auto ddp, DistributedDataParallel::Create(two_head_net, comm));
//   ASSIGN_OR_RETURN(auto outs, ddp->Forward(x, mask));   // std::tuple<Tensor, Tensor>
//   auto [logits, aux] = outs;
//
//   torch::nn::Sequential seq(torch::nn::Linear(8, 16), torch::nn::ReLU(),
//                             torch::nn::Linear(16, 2));
//   ASSIGN_OR_RETURN(auto seq_ddp, DistributedDataParallel::Create(seq, comm));
//   ASSIGN_OR_RETURN(torch::Tensor out, seq_ddp->Forward(x));
//
// The typed object converts to std::unique_ptr<DistributedDataParallel>;
// through that base class Forward<ReturnType = Tensor>(args...) is
// type-erased (modules with one plain forward, and Sequential), and
// ForwardWith(fn) runs any callable as the forward. find_unused_parameters
// walks the graph from every tensor in the result (OutputTensors below).
//
// Construction broadcasts parameters and buffers from rank 0 (every rank
// starts from rank 0's model) and builds the Reducer (reducer.h) over the
// parameters that require grad (a tensor shared by several modules, as with
// tied weights, is reduced once). A Forward broadcasts buffers from rank 0
// first (broadcast_buffers) when the Forward before it trained (grad
// enabled, not NoSync) or there was none, as PyTorch DDP does; so an
// evaluation pass under NoGradGuard broadcasts once, at its first Forward,
// and ranks with different numbers of evaluation batches do not wait for
// each other. Unless inside a NoSync scope, it prepares the
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

#include <array>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

#include "common/status.h"
#include "ddp/comm_hook.h"
#include "ddp/communicator.h"
#include "ddp/progress.h"
#include "ddp/reducer.h"

namespace lockstep {
namespace ddp {

// Per-step statistics, for logs, the bench and progress reports.
struct StepStats {
  int64_t step = 0;             // Synchronised steps so far (1-based).
  double forward_ms = 0;        // Forward, including the buffer broadcast.
  // End of forward to end of gradient sync; with overlap_optimizer (whose
  // waits happen in OptimizerStep), autograd's part plus those waits.
  double backward_ms = 0;
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
  // Default true: buffers are broadcast from rank 0 before a forward that
  // follows a training forward (or none), as in PyTorch.
  bool broadcast_buffers = true;
  // Default true: param.grad is a view into its bucket slot, so backward
  // accumulates straight into the bucket and the reduced bucket already is
  // the gradient (no copy in or out; PyTorch DDP's option, off by default
  // there). The view is not an autograd view, so zero_grad() and detach_()
  // work; a gradient replaced or reset to undefined is copied into its slot
  // at the next backward and becomes a view again. Set false to keep
  // gradients in memory of their own.
  bool gradient_as_bucket_view = true;
  // How each bucket is reduced (ddp/comm_hook.h). Default: AllreduceHook(),
  // the average. A built-in by name: CommHookFromName("fp16"); a user hook:
  // CommHook{"name", prescale_by_world, [](GradBucket& b, Communicator& c)
  // { ...; return BucketWork::Of(...); }}.
  CommHook comm_hook = AllreduceHook();
  // Default false. When true, ranks may train with different batch sizes:
  // each rank's gradient is weighted by its step's sample count (what
  // Forward/CountSamples counted since the last synchronised step) and the
  // result is the gradient of the global batch, sum_r n_r g_r / sum_r n_r,
  // not the average over ranks; the counts travel in the gradients'
  // collective (reducer.h "Sample weighting"). Also enables JoinStep and
  // AllDone for uneven inputs. REQUIRES: comm_hook is "allreduce"; the loss
  // is a mean over the rank's batch.
  bool weight_by_samples = false;
  // Bound on every blocking wait on collectives. Default: kDefaultCollectiveTimeout.
  Duration timeout = kDefaultCollectiveTimeout;
  // Called after each synchronised backward once its buckets are reduced:
  // on the autograd thread; with overlap_optimizer on the thread that
  // completes the step (OptimizerStep, the next Forward, or the destructor);
  // in JoinStep on the training thread.
  std::function<void(const StepStats&)> on_step;
  // Default false. When true, the first layers' buckets are not queued on
  // the wire behind later layers' buckets: among the buckets complete on
  // every rank, the one the next forward needs first goes next (DLCP's
  // priority; reducer.h "Gradient priority"). Costs one small allreduce per
  // bucket. With overlap_optimizer, the first layers' parameters are then
  // stepped first. REQUIRES: a host communicator (gloo, shm).
  bool gradient_priority = false;
  // Default false. When true, the optimizer step overlaps the end of the
  // gradients' communication (as PyTorch's DDP optimizer-overlap hooks):
  // Backward returns once backward has launched every bucket, without
  // waiting for them, and OptimizerStep(optimizer) then waits for the
  // buckets in the order they were launched and steps each bucket's
  // parameters as soon as that bucket is reduced, while later buckets are
  // still being reduced. REQUIRES: every synchronised Backward is followed by
  // OptimizerStep before the next Forward (a plain optimizer.step() would
  // read gradients still being reduced; the next Forward then fails with
  // FailedPrecondition), nothing between them reads or changes the
  // gradients (clipping by the global norm needs every bucket: leave this
  // off), and the optimizer updates each parameter from its own gradient and
  // state alone (every torch::optim optimizer but LBFGS, which needs a
  // closure). An optimizer that is not a torch::optim::Optimizer is stepped
  // once, after every bucket.
  bool overlap_optimizer = false;
  // Default false. When true, the next forward overlaps the end of the
  // gradients' communication too (REQUIRES overlap_optimizer): OptimizerStep
  // returns without waiting for any bucket (it steps the optimizer's
  // parameters that DDP does not reduce), and each bucket is waited for and
  // its parameters stepped when the training thread first reaches for
  // them: the first operator there whose input is a parameter or gradient
  // of a bucket not yet done (the next forward's use of a layer, a
  // zero_grad() that zeroes in place) waits for that bucket and those
  // launched before it, steps their parameters, then runs; later buckets
  // stay on the wire while forward computes the first layers. The end of
  // the next forward completes the rest. With gradient_priority the first
  // layers' buckets go on the wire first, so forward starts after them
  // alone. Gradients a program resets to undefined between OptimizerStep
  // and the next forward are used for the step and reset again. How: a
  // thread-local at::RecordFunction callback sees each operator's inputs on
  // that thread while a step is open. REQUIRES (besides overlap_optimizer's):
  // a torch::optim::Optimizer that lives until the step is done; code that
  // reads parameters without an operator (torch::save, data_ptr, a
  // checkpoint) calls CompletePendingStep() first, and so does code that
  // issues collectives of its own on the communicator (with
  // gradient_priority, Backward returns before the scheduler has launched
  // the last buckets, and it launches them during the next forward). A
  // forward on another thread, a JoinStep and a bucket rebuild complete the
  // step before they start; so does a forward of a model with buffers and
  // broadcast_buffers (the broadcast is a collective), which then gains
  // nothing.
  bool overlap_forward = false;
  // Default true: each synchronised step goes to the process's progress
  // sink (ddp/progress.h; under lockstepd, the agent: `lockstep status`).
  bool report_progress = true;
};

// ---------------------------------------------------------------------------
// Forward outputs: where the tensors are.
//
// After forward, find_unused_parameters walks the autograd graph from every
// tensor in the forward's result, so DDP must find them all; a tensor it
// missed would have its parameters marked unused and their gradients
// dropped. OutputTensors<T>::Collect appends the tensors inside a T:
//   torch::Tensor (an undefined one is skipped); std::tuple, std::pair,
//   std::vector, std::array, std::optional/c10::optional, std::map,
//   std::unordered_map and c10::Dict (their values), c10::List, each
//   recursively; c10::IValue (tensor, list, tuple, dict, recursively);
//   arithmetic types, enums and std::string (no tensor).
// Any other output type does not compile (static_assert) until the user
// specialises OutputTensors for it, e.g. for `struct Out { Tensor a, b; }`:
//   template <> struct lockstep::ddp::OutputTensors<Out> {
//     static void Collect(const Out& o, std::vector<torch::Tensor>* out) {
//       out->push_back(o.a);
//       out->push_back(o.b);
//     }
//   };
// ---------------------------------------------------------------------------
template <typename T, typename Enable = void>
struct OutputTensors {
  static_assert(sizeof(T) == 0,
                "DDP cannot find the tensors in this forward output type: return a Tensor, or "
                "tuples, vectors, maps or c10::Dicts of them, or specialise "
                "lockstep::ddp::OutputTensors<T> (see ddp.h)");
};

// Appends the tensors inside `value` to `out` (see OutputTensors).
template <typename T>
void CollectOutputTensors(const T& value, std::vector<torch::Tensor>* out) {
  OutputTensors<T>::Collect(value, out);
}

void CollectIValueTensors(const c10::IValue& value, std::vector<torch::Tensor>* out);

template <>
struct OutputTensors<torch::Tensor> {
  static void Collect(const torch::Tensor& t, std::vector<torch::Tensor>* out) {
    if (t.defined()) out->push_back(t);
  }
};
template <>
struct OutputTensors<c10::IValue> {
  static void Collect(const c10::IValue& v, std::vector<torch::Tensor>* out) {
    CollectIValueTensors(v, out);
  }
};
template <typename T>
struct OutputTensors<T, std::enable_if_t<std::is_arithmetic<T>::value || std::is_enum<T>::value>> {
  static void Collect(const T&, std::vector<torch::Tensor>*) {}
};
template <>
struct OutputTensors<std::string> {
  static void Collect(const std::string&, std::vector<torch::Tensor>*) {}
};
template <typename... Ts>
struct OutputTensors<std::tuple<Ts...>> {
  static void Collect(const std::tuple<Ts...>& t, std::vector<torch::Tensor>* out) {
    std::apply([out](const auto&... e) { (CollectOutputTensors(e, out), ...); }, t);
  }
};
template <typename A, typename B>
struct OutputTensors<std::pair<A, B>> {
  static void Collect(const std::pair<A, B>& p, std::vector<torch::Tensor>* out) {
    CollectOutputTensors(p.first, out);
    CollectOutputTensors(p.second, out);
  }
};
template <typename T, typename Alloc>
struct OutputTensors<std::vector<T, Alloc>> {
  static void Collect(const std::vector<T, Alloc>& v, std::vector<torch::Tensor>* out) {
    for (const auto& e : v) CollectOutputTensors(e, out);
  }
};
template <typename T, size_t N>
struct OutputTensors<std::array<T, N>> {
  static void Collect(const std::array<T, N>& v, std::vector<torch::Tensor>* out) {
    for (const auto& e : v) CollectOutputTensors(e, out);
  }
};
template <typename T>
struct OutputTensors<std::optional<T>> {
  static void Collect(const std::optional<T>& v, std::vector<torch::Tensor>* out) {
    if (v.has_value()) CollectOutputTensors(*v, out);
  }
};
template <typename T>
struct OutputTensors<c10::optional<T>,
                     std::enable_if_t<!std::is_same<c10::optional<T>, std::optional<T>>::value>> {
  static void Collect(const c10::optional<T>& v, std::vector<torch::Tensor>* out) {
    if (v.has_value()) CollectOutputTensors(*v, out);
  }
};
template <typename K, typename V, typename... Rest>
struct OutputTensors<std::map<K, V, Rest...>> {
  static void Collect(const std::map<K, V, Rest...>& m, std::vector<torch::Tensor>* out) {
    for (const auto& kv : m) CollectOutputTensors(kv.second, out);
  }
};
template <typename K, typename V, typename... Rest>
struct OutputTensors<std::unordered_map<K, V, Rest...>> {
  static void Collect(const std::unordered_map<K, V, Rest...>& m,
                      std::vector<torch::Tensor>* out) {
    for (const auto& kv : m) CollectOutputTensors(kv.second, out);
  }
};
template <typename K, typename V>
struct OutputTensors<c10::Dict<K, V>> {
  static void Collect(const c10::Dict<K, V>& d, std::vector<torch::Tensor>* out) {
    for (const auto& e : d) CollectOutputTensors(static_cast<V>(e.value()), out);
  }
};
template <typename T>
struct OutputTensors<c10::List<T>> {
  static void Collect(const c10::List<T>& l, std::vector<torch::Tensor>* out) {
    for (size_t i = 0; i < l.size(); ++i) CollectOutputTensors(static_cast<T>(l.get(i)), out);
  }
};

template <typename ModuleType>
class TypedDistributedDataParallel;

namespace internal {

// The message of `e`, without the C++ backtrace when it is a c10::Error.
std::string ExceptionMessage(const std::exception& e);

// Forward(args) with the return type deduced from the module's forward.
struct DeducedReturn {};

// A forward that torch::nn::AnyModule can hold: one non-template,
// non-overloaded, non-const member function.
template <typename F>
struct IsPlainForward : std::false_type {};
template <typename R, typename C, typename... A>
struct IsPlainForward<R (C::*)(A...)> : std::true_type {};
template <typename Impl, typename = void>
struct HasPlainForward : std::false_type {};
template <typename Impl>
struct HasPlainForward<Impl, std::void_t<decltype(&Impl::forward)>>
    : IsPlainForward<decltype(&Impl::forward)> {};

// The module types Create accepts: a module holder (MyNet, Sequential,
// Linear), a shared_ptr to a module, or an AnyModule. `Impl` is the module
// class (void for AnyModule).
template <typename M, typename = void>
struct ModuleTraits {
  static constexpr bool kSupported = false;
};
template <typename M>
struct ModuleTraits<M, std::enable_if_t<torch::detail::is_module_holder<M>::value>> {
  static constexpr bool kSupported = true;
  using Impl = typename M::ContainedType;
  static std::shared_ptr<Impl> Ptr(const M& m) { return m.is_empty() ? nullptr : m.ptr(); }
  static std::shared_ptr<torch::nn::Module> Root(const M& m) { return Ptr(m); }
};
template <typename I>
struct ModuleTraits<std::shared_ptr<I>,
                    std::enable_if_t<std::is_base_of<torch::nn::Module, I>::value>> {
  static constexpr bool kSupported = true;
  using Impl = I;
  static std::shared_ptr<I> Ptr(const std::shared_ptr<I>& m) { return m; }
  static std::shared_ptr<torch::nn::Module> Root(const std::shared_ptr<I>& m) { return m; }
};
template <>
struct ModuleTraits<torch::nn::AnyModule> {
  static constexpr bool kSupported = true;
  using Impl = void;
  static std::shared_ptr<torch::nn::Module> Root(const torch::nn::AnyModule& m) {
    return m.is_empty() ? nullptr : m.ptr();
  }
};

// The module's forward: m->forward(args...) (holders, shared_ptr) or
// m.forward(args...) (AnyModule, returning a Tensor).
template <typename M, typename... Args>
auto CallForward(M& m, Args&&... args) -> decltype(m->forward(std::forward<Args>(args)...)) {
  return m->forward(std::forward<Args>(args)...);
}
template <typename... Args>
torch::Tensor CallForward(torch::nn::AnyModule& m, Args&&... args) {
  return m.forward(std::forward<Args>(args)...);
}
// The module's templated forward with an explicit return type
// (Sequential, AnyModule).
template <typename R, typename M, typename... Args>
R CallForwardAs(M& m, Args&&... args) {
  return m->template forward<R>(std::forward<Args>(args)...);
}
template <typename R, typename... Args>
R CallForwardAs(torch::nn::AnyModule& m, Args&&... args) {
  return m.template forward<R>(std::forward<Args>(args)...);
}

// The batch size a forward's arguments imply, for samples/s: the first
// dimension of the first argument when it is a tensor, else 0 (unknown).
inline int64_t LeadingBatch() { return 0; }
template <typename First, typename... Rest>
int64_t LeadingBatch(const First& first, const Rest&...) {
  if constexpr (std::is_convertible<const First&, const torch::Tensor&>::value) {
    const torch::Tensor& t = first;
    return t.defined() && t.dim() > 0 ? t.size(0) : 0;
  } else {
    return 0;
  }
}

template <typename R, typename M, typename... Args>
struct ForwardReturn {
  using type = R;
};
template <typename M, typename... Args>
struct ForwardReturn<DeducedReturn, M, Args...> {
  using type = std::decay_t<decltype(CallForward(std::declval<M&>(), std::declval<Args>()...))>;
};

}  // namespace internal

class DistributedDataParallel {
 public:
  // `module`: a module holder (MyNet, torch::nn::Sequential, torch::nn::
  // Linear), a std::shared_ptr to a torch::nn::Module subclass, or a
  // torch::nn::AnyModule. The object returned is typed by the module, so
  // Forward returns what the module's forward returns; it converts to
  // std::unique_ptr<DistributedDataParallel> (whose Forward is type-erased,
  // see below). Blocks on the initial broadcasts.
  // Errors: InvalidArgument (options, no trainable parameter, empty
  // module), the communicator's errors.
  template <typename ModuleType>
  static StatusOr<std::unique_ptr<TypedDistributedDataParallel<ModuleType>>> Create(
      ModuleType module, std::shared_ptr<Communicator> comm, DdpOptions options = {});

  // With overlap_forward, waits for an open step's buckets without
  // stepping their parameters (the optimizer may be gone): call
  // CompletePendingStep() after the last OptimizerStep to keep that step.
  virtual ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Runs the module's forward through the base class, for code that holds a
  // DistributedDataParallel* and not the typed object Create returns. The
  // result is `ReturnType` (default Tensor; AnyModule and Sequential rules:
  // a mismatch is an error naming both types). Works for modules with one
  // plain forward (held as an AnyModule) and for torch::nn::Sequential;
  // other modules (a templated or overloaded forward) get
  // FailedPrecondition: use the typed object's Forward or ForwardWith.
  // Errors: those of ForwardWith.
  template <typename ReturnType = torch::Tensor, typename... Args>
  StatusOr<ReturnType> Forward(Args&&... args) {
    if (any_.is_empty() && sequential_.is_empty()) {
      return absl::FailedPreconditionError(
          "DDP: this module's forward is a template or overloaded, so it cannot be called "
          "through DistributedDataParallel*: call Forward on the "
          "TypedDistributedDataParallel that Create returned, or use ForwardWith");
    }
    CountSamples(internal::LeadingBatch(args...));
    return ForwardWith([&]() -> ReturnType {
      if (!any_.is_empty()) return any_.template forward<ReturnType>(std::forward<Args>(args)...);
      return sequential_->template forward<ReturnType>(std::forward<Args>(args)...);
    });
  }

  // One DDP forward around any callable: prepares the step (buffer
  // broadcast, bucket rebuild), runs `fn()`, collects the tensors in its
  // result (OutputTensors) for find_unused_parameters and prepares the
  // Reducer for the following backward. Returns fn's result. For forwards
  // Forward cannot express, e.g.
  //   ddp->ForwardWith([&] { return model->forward_features(x, mask); });
  // REQUIRES: fn runs the module whose parameters this object reduces.
  // Errors: Internal when fn throws (the message included); a previous
  // step's communication error; the buffer broadcast's errors.
  template <typename Fn>
  auto ForwardWith(Fn&& fn) -> StatusOr<std::decay_t<std::invoke_result_t<Fn&>>> {
    using Result = std::decay_t<std::invoke_result_t<Fn&>>;
    static_assert(!std::is_void<Result>::value, "DDP: forward must return its outputs");
    RETURN_IF_ERROR(PreForward());
    std::optional<Result> result;
    try {
      result.emplace(fn());
    } catch (const std::exception& e) {
      return absl::InternalError(
          absl::StrCat("DDP: forward threw: ", internal::ExceptionMessage(e)));
    }
    std::vector<torch::Tensor> outputs;
    // Only the graph walk reads the outputs.
    if (options_.find_unused_parameters) CollectOutputTensors(*result, &outputs);
    RETURN_IF_ERROR(PostForward(outputs));
    return std::move(*result);
  }

  // loss.backward(), with errors as Status (a missing gradient names the
  // parameter; a communication failure names the missing ranks). A CPU
  // loss's value goes into the step's progress report.
  Status Backward(const torch::Tensor& loss);

  // Adds `n` samples to this step's count, for progress (samples/s) and
  // weight_by_samples. Forward counts the first dimension of its first
  // argument itself when that is a tensor; code using ForwardWith, whose
  // first argument is not the batch, or whose batch is not the leading
  // dimension, calls this instead (with weight_by_samples: before
  // ForwardWith returns; a synchronised forward with no sample counted is
  // FailedPrecondition, since its gradient would get weight 0).
  void CountSamples(int64_t n) { samples_pending_ += n; }

  // Uneven inputs (as PyTorch's Join): a rank with no data left calls
  // JoinStep instead of forward and backward, so it keeps joining the
  // collectives the other ranks' steps issue, with weight 0 and a "done"
  // flag in the same collective. Its param.grad receives the other ranks'
  // global-batch gradient, so an optimizer step keeps its model in step.
  // AllDone() is true once the last step's reduced flags say every rank
  // joined (that step's gradient is zero: skip the optimizer and stop):
  //   for (;;) {
  //     if (have_batch) { forward; RETURN_IF_ERROR(ddp->Backward(loss)); }
  //     else { RETURN_IF_ERROR(ddp->JoinStep()); if (ddp->AllDone()) break; }
  //     opt.step();
  //   }
  // Blocks on the step's collectives (the rebuild and buffer broadcasts
  // too; on CUDA, as Backward, only the current stream waits for them, and
  // AllDone waits on the host for the counts' collective: false if it
  // failed, whose error the next step returns). Errors: FailedPrecondition
  // without weight_by_samples; the communicator's.
  Status JoinStep();
  bool AllDone() const;
  // weight_by_samples: the reduced sum of the ranks' samples in the last
  // synchronised step (0 before the first).
  int64_t last_global_samples() const { return reducer_->last_global_samples(); }

  // Continues the step count at `step` (steps already done, e.g. restored
  // from a checkpoint): the next synchronised step is step + 1.
  void ResumeAt(int64_t step) { steps_ = step; }

  // Runs optimizer.step() as the step's optimizer phase, so progress reports
  // split the step into data, forward, backward, communication and optimizer
  // (ddp/progress.h): its time is the step's optimizer_ms, its return the
  // step's end, and the time from there to the next forward the next step's
  // data_ms. Call it once per step, after the synchronised backward:
  //   RETURN_IF_ERROR(ddp->Backward(loss));
  //   ddp->OptimizerStep(opt);
  // Once a program calls it, each step is reported when it returns (rather
  // than at the end of backward). Returns what optimizer.step() returns.
  // With overlap_optimizer it also completes the step's communication,
  // stepping bucket by bucket (see DdpOptions; it then returns an undefined
  // tensor), and a communication error is returned by the next Forward;
  // what the optimizer throws is rethrown after every bucket was waited for.
  template <typename Optimizer>
  auto OptimizerStep(Optimizer& optimizer) -> decltype(optimizer.step()) {
    const MonoTime start = RealClock()->Now();
    // overlap_forward: a step still open from the last OptimizerStep (no
    // forward since) is done first; its error goes to the next Forward.
    CompleteDeferred(-1);
    ReleaseGate();
    if (reducer_->step_open()) {
      if constexpr (std::is_base_of<torch::optim::Optimizer, Optimizer>::value) {
        if (options_.overlap_forward) {
          DeferStep(optimizer, start);
          return {};
        }
        const double waited_ms = StepOverlapped(optimizer);
        EndOptimizerStep(start, waited_ms);
        return {};
      } else {
        // No way to step a subset: every bucket first.
        if (!reducer_->CompleteStep(nullptr).ok()) {
          if constexpr (std::is_void<decltype(optimizer.step())>::value) {
            return;
          } else {
            return {};
          }
        }
      }
    }
    if constexpr (std::is_void<decltype(optimizer.step())>::value) {
      optimizer.step();
      EndOptimizerStep(start);
    } else {
      auto result = optimizer.step();
      EndOptimizerStep(start);
      return result;
    }
  }

  // overlap_forward: completes the step OptimizerStep left open, waiting
  // for its remaining buckets and stepping their parameters. OK and nothing
  // done when none is open. Errors: the step's communication error (the
  // next Forward returns it too).
  Status CompletePendingStep();

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

  std::shared_ptr<torch::nn::Module> module() const { return root_; }
  std::vector<torch::Tensor> parameters() const { return root_->parameters(); }
  Communicator& communicator() const { return *comm_; }
  const Reducer& reducer() const { return *reducer_; }
  // The last synchronised step (all zero before the first), read from the
  // reducer each time: device collectives may finish after backward returns.
  StepStats last_stats() const;

 protected:
  // `any`: the module as an AnyModule, or empty when it cannot be one;
  // `sequential`: the module when it is a Sequential, else empty.
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> root, torch::nn::AnyModule any,
                          torch::nn::Sequential sequential, std::shared_ptr<Communicator> comm,
                          DdpOptions options)
      : root_(std::move(root)),
        any_(std::move(any)),
        sequential_(std::move(sequential)),
        comm_(std::move(comm)),
        options_(std::move(options)) {}

 private:
  // Validates, broadcasts the initial state and builds the Reducer.
  Status Init();
  Status PreForward();
  Status PostForward(const std::vector<torch::Tensor>& outputs);
  void OnReducerStep();
  StepStats MakeStats(const ReducerStepStats& r) const;
  // overlap_optimizer: completes the open step, stepping each reduced
  // bucket's parameters (then the optimizer's other parameters). Returns
  // the ms it waited on buckets (0 when the step failed).
  double StepOverlapped(torch::optim::Optimizer& optimizer);
  // overlap_forward: leaves the step open with `optimizer` to step each
  // bucket when it is needed, and starts gating this thread's operators.
  // `start`: when OptimizerStep was called (from there to its return is the
  // step's optimizer_ms).
  void DeferStep(torch::optim::Optimizer& optimizer, MonoTime start);
  // The gate: an operator on the training thread is about to read `inputs`.
  void BeforeOperator(const std::vector<const c10::TensorImpl*>& inputs);
  // Completes the deferred step through bucket `through` (-1: all of it).
  // A failure (the communication's, or the optimizer's) is kept in
  // deferred_error_ for CompletePendingStep.
  void CompleteDeferred(int through);
  // Steps the parameters of bucket `b` (b == buckets: those DDP does not
  // reduce) with the deferred step's optimizer.
  void StepDeferredPart(size_t b);
  // Takes this thread's operators out of the gate once no step is open.
  void ReleaseGate();
  // Step timing (see progress.h for the split). `waited_ms` of the time
  // since `start` was spent waiting on buckets (overlap_optimizer): exposed
  // communication, not optimizer time.
  void EndOptimizerStep(MonoTime start, double waited_ms = 0);
  // What a step counted for its progress report, up to its end.
  struct StepCounts {
    int64_t samples = 0;
    double loss = 0;
    bool loss_known = true;
    double forward_ms = 0;
    double data_ms = 0;
  };
  StepCounts CurrentCounts() const;
  // Reports the step ending at `end` and makes it the last step's end.
  void FinishStep(StepProgress p, MonoTime end);
  // Reports a step that ran from `previous_end` to `end`.
  void ReportStep(StepProgress p, MonoTime previous_end, MonoTime end);
  void RecordBucketWaits(const ReducerStepStats& r);
  void OnBucketWait(int bucket);
  void SetCollective(bool active, int bucket, const char* op);

  std::shared_ptr<torch::nn::Module> root_;
  torch::nn::AnyModule any_;
  torch::nn::Sequential sequential_{nullptr};
  std::shared_ptr<Communicator> comm_;
  DdpOptions options_;
  std::unique_ptr<Reducer> reducer_;
  std::vector<torch::Tensor> buffers_;
  bool require_sync_ = true;
  // PyTorch's require_forward_param_sync: buffers are broadcast before a
  // Forward only when the one before trained (grad enabled, not NoSync), or
  // there was none. Set by PostForward.
  bool sync_buffers_ = true;
  bool BroadcastsBuffers() const {
    return options_.broadcast_buffers && !buffers_.empty() && sync_buffers_;
  }
  bool sync_pending_ = false;
  MonoTime forward_start_{};
  double forward_ms_ = 0;
  double synced_forward_ms_ = 0;  // forward_ms_ of the last synchronised step.
  int64_t steps_ = 0;             // Synchronised steps.
  // Progress (null: not reported) and what the current step has seen.
  std::shared_ptr<ProgressSink> progress_;
  int64_t samples_pending_ = 0;
  double loss_pending_ = 0;
  bool loss_known_ = true;
  MonoTime last_step_end_{};
  MonoTime first_forward_start_{};   // First forward since last_step_end_.
  bool forward_seen_ = false;        // first_forward_start_ is set.
  bool optimizer_marked_ = false;    // OptimizerStep ends steps.
  bool step_pending_ = false;        // pending_ waits for OptimizerStep.
  StepProgress pending_;
  // Per step, per bucket: launch to completion (kWaitWindowSteps newest).
  std::vector<std::vector<double>> bucket_waits_;
  bool waiting_ = false;             // In the end-of-backward bucket wait.
  std::chrono::steady_clock::time_point wait_since_{};
  // overlap_forward: the step OptimizerStep left open (ddp.cc), and the
  // state its thread's operator callback shares with this object.
  struct DeferredStep;
  struct Gate;
  std::shared_ptr<DeferredStep> deferred_;  // Sole owner (shared_ptr: an incomplete type here).
  std::shared_ptr<Gate> gate_;
  Status deferred_error_;
  friend struct GateCallbacks;
};

// What DistributedDataParallel::Create returns: the same object, typed by
// the module so that Forward returns whatever the module's forward returns.
// Thread safety and contracts: those of DistributedDataParallel.
template <typename ModuleType>
class TypedDistributedDataParallel final : public DistributedDataParallel {
 public:
  // Runs the module's forward with `args` (any number, any types the
  // forward takes) and returns its result, whatever its type: a Tensor, a
  // tuple, a vector, a dict... (see OutputTensors for the types whose
  // tensors find_unused_parameters can see). For a module with a templated
  // forward, `ReturnType` picks its return type as in
  // torch::nn::Sequential::forward<ReturnType>:
  //   ASSIGN_OR_RETURN(auto out, ddp->Forward(x, mask));   // any module
  //   ASSIGN_OR_RETURN(auto pair, seq_ddp->Forward<std::tuple<Tensor, Tensor>>(x));
  // Errors: those of ForwardWith.
  template <typename ReturnType = internal::DeducedReturn, typename... Args>
  StatusOr<typename internal::ForwardReturn<ReturnType, ModuleType, Args&&...>::type> Forward(
      Args&&... args) {
    using Result = typename internal::ForwardReturn<ReturnType, ModuleType, Args&&...>::type;
    this->CountSamples(internal::LeadingBatch(args...));
    return ForwardWith([&]() -> Result {
      if constexpr (std::is_same<ReturnType, internal::DeducedReturn>::value) {
        return internal::CallForward(module_, std::forward<Args>(args)...);
      } else {
        return internal::CallForwardAs<ReturnType>(module_, std::forward<Args>(args)...);
      }
    });
  }

  // The module as given to Create.
  const ModuleType& typed_module() const { return module_; }

 private:
  friend class DistributedDataParallel;
  TypedDistributedDataParallel(ModuleType module, torch::nn::AnyModule any,
                               torch::nn::Sequential sequential,
                               std::shared_ptr<Communicator> comm, DdpOptions options)
      : DistributedDataParallel(internal::ModuleTraits<ModuleType>::Root(module), std::move(any),
                                std::move(sequential), std::move(comm), std::move(options)),
        module_(std::move(module)) {}

  ModuleType module_;
};

template <typename ModuleType>
StatusOr<std::unique_ptr<TypedDistributedDataParallel<ModuleType>>>
DistributedDataParallel::Create(ModuleType module, std::shared_ptr<Communicator> comm,
                                DdpOptions options) {
  using Traits = internal::ModuleTraits<ModuleType>;
  static_assert(Traits::kSupported,
                "DDP: Create takes a module holder (MyNet, torch::nn::Sequential), a "
                "std::shared_ptr to a torch::nn::Module subclass, or a torch::nn::AnyModule");
  torch::nn::AnyModule any;
  torch::nn::Sequential sequential{nullptr};
  if constexpr (std::is_same<ModuleType, torch::nn::AnyModule>::value) {
    any = module;
  } else if constexpr (std::is_same<typename Traits::Impl, torch::nn::SequentialImpl>::value) {
    sequential = torch::nn::Sequential(Traits::Ptr(module));
  } else if constexpr (internal::HasPlainForward<typename Traits::Impl>::value) {
    if (auto ptr = Traits::Ptr(module)) any = torch::nn::AnyModule(std::move(ptr));
  }
  std::unique_ptr<TypedDistributedDataParallel<ModuleType>> ddp(
      new TypedDistributedDataParallel<ModuleType>(std::move(module), std::move(any),
                                                   std::move(sequential), std::move(comm),
                                                   std::move(options)));
  RETURN_IF_ERROR(ddp->Init());
  return ddp;
}

// Broadcasts `tensors` from `root` in place, packed per dtype into flat
// buffers of at most `chunk_bytes` (one collective per chunk; a tensor
// larger than that is one buffer of its own size). With a
// host-side communicator it blocks up to `timeout` per chunk; with a device
// one (NCCL) the copies back are queued on the current stream behind the
// broadcast and the host does not wait. All ranks must pass the same shapes
// and dtypes.
Status BroadcastCoalesced(Communicator& comm, const std::vector<torch::Tensor>& tensors, int root,
                          Duration timeout, size_t chunk_bytes = 64u << 20);

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_DDP_H_
