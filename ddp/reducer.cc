#include "ddp/reducer.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <stdexcept>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ddp/streaming.h"

namespace lockstep {
namespace ddp {
namespace {

// A plain copy of part of a gradient into its slot (streamed when large).
void CopyIntoSlot(const torch::Tensor& slot, const torch::Tensor& grad) {
  if (slot.numel() == 0 || StreamingScaledCopy(slot, grad, 1.0f)) return;
  slot.copy_(grad);
}

// Post-hook on a gradient accumulator: runs after the gradient of one
// parameter has been accumulated into param.grad.
class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

}  // namespace

StatusOr<std::unique_ptr<Reducer>> Reducer::Create(std::vector<NamedParam> params,
                                                   Communicator* comm, ReducerOptions options) {
  if (comm == nullptr) return absl::InvalidArgumentError("reducer: communicator is null");
  if (params.empty()) return absl::InvalidArgumentError("reducer: no parameters require grad");
  if (!options.comm_hook.run) {
    return absl::InvalidArgumentError(
        absl::StrCat("reducer: comm hook '", options.comm_hook.name, "' has no function"));
  }
  if (options.weight_by_samples && !options.comm_hook.sums_weighted_buckets) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reducer: weight_by_samples needs a comm hook that sums weighted buckets (the "
        "'allreduce' one; CommHook::sums_weighted_buckets), not '",
        options.comm_hook.name, "'"));
  }
  if (options.gradient_priority && !comm->device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reducer: gradient_priority needs a host communicator (gloo, shm), not ",
        comm->backend()));
  }
  if (options.bucket_cap_bytes == 0 || options.first_bucket_cap_bytes == 0) {
    return absl::InvalidArgumentError("reducer: bucket caps must be positive");
  }
  std::unordered_set<const void*> seen;
  for (const auto& p : params) {
    if (!p.tensor.defined() || !p.tensor.requires_grad() || !p.tensor.is_leaf()) {
      return absl::InvalidArgumentError(
          absl::StrCat("reducer: parameter '", p.name, "' is not a leaf requiring grad"));
    }
    if (!seen.insert(p.tensor.unsafeGetTensorImpl()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("reducer: parameter '", p.name, "' is listed twice (tied weights must be "
                                                       "listed once)"));
    }
  }
  RETURN_IF_ERROR(CheckDevices(params, *comm));
  std::unique_ptr<Reducer> reducer(new Reducer(std::move(params), comm, options));
  const size_t n = reducer->params_.size();
  std::vector<size_t> reverse(n);
  for (size_t i = 0; i < n; ++i) reverse[i] = n - 1 - i;
  std::lock_guard<std::mutex> lock(reducer->mu_);
  RETURN_IF_ERROR(Annotate(reducer->BuildBuckets(reverse), "DDP: allocating the buckets"));
  if (options.gradient_priority) {
    reducer->scheduler_ = std::thread([r = reducer.get()] { r->SchedulerLoop(); });
  }
  return reducer;
}

Status Reducer::CheckDevices(const std::vector<NamedParam>& tensors, const Communicator& comm) {
  if (tensors.empty()) return absl::OkStatus();
  // One device for all: buckets are flat buffers on it, and one
  // communicator reduces them.
  const NamedParam& first = tensors.front();
  for (const auto& p : tensors) {
    if (p.tensor.device() != first.tensor.device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DDP: the model is on more than one device ('", first.name, "' on ",
          first.tensor.device().str(), ", '", p.name, "' on ", p.tensor.device().str(),
          "); move the whole model to one device before wrapping it"));
    }
  }
  const c10::Device device = first.tensor.device();
  if (device != comm.device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DDP: the model is on ", device.str(), " but the ", comm.backend(),
        " communicator reduces tensors on ", comm.device().str(),
        device.is_cuda() ? " (use the nccl backend for CUDA models)"
                         : " (use the gloo or shm backend for CPU models)"));
  }
  return absl::OkStatus();
}

Reducer::Reducer(std::vector<NamedParam> params, Communicator* comm, ReducerOptions options)
    : params_(std::move(params)),
      comm_(comm),
      options_(options),
      prescale_(options_.comm_hook.prescale_by_world &&
                !(options_.comm_hook.prescale_optional && comm_->FusedAverage())) {
  const size_t n = params_.size();
  ready_.assign(n, false);
  slot_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i].tensor);
    hook_keys_.push_back(
        acc->add_post_hook(std::make_unique<GradReadyHook>([this, i] { OnGradReady(i); })));
    accumulators_.push_back(std::move(acc));
  }
}

Reducer::~Reducer() {
  // An open step's collectives may still write into the buckets.
  if (step_open()) (void)CompleteStep(nullptr);
  if (scheduler_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      shutdown_ = true;
    }
    cv_.notify_all();
    scheduler_.join();
  }
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

Status Reducer::BuildBuckets(const std::vector<size_t>& order) {
  std::vector<BucketParam> infos;
  for (const auto& p : params_) {
    infos.push_back(BucketParam{p.tensor.nbytes(), static_cast<int>(p.tensor.scalar_type())});
  }
  auto assignment = AssignBuckets(infos, order, options_.first_bucket_cap_bytes,
                                  options_.bucket_cap_bytes);
  torch::NoGradGuard no_grad;
  std::vector<Bucket> buckets(assignment.size());
  // Each bucket's place in one block of bucket memory, 64-byte aligned.
  std::vector<int64_t> starts(assignment.size());
  int64_t block_bytes = 0;
  const int64_t extras = options_.weight_by_samples ? 2 : 0;
  for (size_t b = 0; b < assignment.size(); ++b) {
    Bucket& bucket = buckets[b];
    bucket.params = assignment[b];
    for (size_t i : bucket.params) bucket.grad_numel += params_[i].tensor.numel();
    const auto& first = params_[bucket.params.front()].tensor;
    starts[b] = block_bytes;
    block_bytes += ((bucket.grad_numel + extras) * static_cast<int64_t>(first.element_size()) + 63) /
                   64 * 64;
  }
  // (No trainable parameter has an element: nothing to reduce, no memory.)
  torch::Tensor block;
  if (block_bytes > 0) {
    ASSIGN_OR_RETURN(block, comm_->AllocateBucketMemory(block_bytes, torch::kByte));
  }
  comm_memory_ = block.defined();
  for (size_t b = 0; b < assignment.size(); ++b) {
    Bucket& bucket = buckets[b];
    const auto& first = params_[bucket.params.front()].tensor;
    const int64_t numel = bucket.grad_numel + extras;
    // On the parameters' device: on CUDA the copies, the scaling and the
    // write-back below all run on the current (compute) stream, and the
    // communicator orders its own stream after it (communicator.h).
    if (block.defined()) {
      bucket.buffer = block.narrow(0, starts[b], numel * static_cast<int64_t>(first.element_size()))
                          .view(first.scalar_type());
    } else {
      bucket.buffer = torch::zeros(
          {numel}, torch::TensorOptions().dtype(first.scalar_type()).device(first.device()));
    }
    int64_t offset = 0;
    for (size_t pos = 0; pos < bucket.params.size(); ++pos) {
      const size_t i = bucket.params[pos];
      const auto& t = params_[i].tensor;
      // An alias of the slot that is not an autograd view, so optimizers may
      // detach_() a gradient that lives in the bucket.
      torch::Tensor slot = bucket.buffer.narrow(0, offset, t.numel()).view(t.sizes());
      bucket.views.push_back(torch::empty({0}, bucket.buffer.options())
                                 .set_(bucket.buffer.storage(), slot.storage_offset(),
                                       slot.sizes(), slot.strides()));
      bucket.offsets.push_back(offset);
      offset += t.numel();
      slot_[i] = {b, pos};
      if (options_.gradient_as_bucket_view) {
        torch::Tensor& grad = params_[i].tensor.mutable_grad();
        if (grad.defined()) {
          bucket.views[pos].copy_(grad);
          grad = bucket.views[pos];
        }
      }
    }
    bucket.pending = bucket.params.size();
    // Only a plain copy can be left to the communicator: the gradients are
    // read as they are.
    if (options_.comm_hook.takes_deferred_inputs && !prescale_ && !options_.weight_by_samples) {
      bucket.share = comm_->OwnShare(bucket.buffer);
    }
  }
  buckets_ = std::move(buckets);
  priority_.assign(buckets_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    priority_[b] = *std::min_element(buckets_[b].params.begin(), buckets_[b].params.end());
  }
  return absl::OkStatus();
}

bool Reducer::buckets_in_comm_memory() const {
  std::lock_guard<std::mutex> lock(mu_);
  return comm_memory_;
}

std::vector<std::vector<size_t>> Reducer::bucket_indices() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::vector<size_t>> out;
  for (const auto& b : buckets_) out.push_back(b.params);
  return out;
}

size_t Reducer::bucket_of(size_t param) const {
  std::lock_guard<std::mutex> lock(mu_);
  return slot_.at(param).first;
}

ReducerStepStats Reducer::last_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ReducerStepStats out = last_stats_;
  // Read from the Works: a device collective may start or finish after
  // finalisation took its snapshot.
  for (size_t b = 0; b < last_works_.size() && b < out.bucket_comm_start.size(); ++b) {
    if (last_works_[b] == nullptr) continue;
    out.bucket_comm_start[b] = last_works_[b]->started_at();
    out.bucket_comm_end[b] = last_works_[b]->finished_at();
  }
  return out;
}

Status Reducer::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

int64_t Reducer::last_global_samples() const { return LastCount(0); }

int64_t Reducer::last_done_ranks() const { return LastCount(1); }

int64_t Reducer::LastCount(int64_t index) const {
  torch::Tensor counts;
  std::shared_ptr<Work> work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    counts = last_counts_;
    work = last_counts_work_;
  }
  if (!counts.defined()) return 0;
  // On a device the step ended on a stream wait: the counts are read once
  // their collective has ended on the host's clock, and not at all if it
  // failed after that wait was queued (aborted with the bucket half
  // written): 0, so a loop does not stop on "every rank done" that was never
  // reduced; its next step fails with the collective's error.
  if (work != nullptr && !work->Wait(options_.timeout).ok()) return 0;
  return counts[index].item<int64_t>();
}

namespace {
Status OpenStepError() {
  return absl::FailedPreconditionError(
      "DDP: the previous synchronised backward was never completed: with overlap_optimizer, "
      "call OptimizerStep(optimizer) after every Backward (a plain optimizer.step() would read "
      "gradients still being reduced)");
}
}  // namespace

Status Reducer::PreviousStepErrorLocked() {
  if (!error_.ok()) return error_;
  // The previous step's collectives, when backward's end only queued a
  // stream wait on them: one that has failed since fails what comes next.
  for (size_t b = 0; b < last_works_.size(); ++b) {
    if (last_works_[b] == nullptr) continue;
    Status s = last_works_[b]->status();
    if (!s.ok()) {
      error_ = Annotate(s, absl::StrCat("DDP: gradient allreduce of bucket ", b,
                                        " in the previous step failed"));
      return error_;
    }
  }
  return absl::OkStatus();
}

Status Reducer::PreviousStepError() {
  std::lock_guard<std::mutex> lock(mu_);
  return PreviousStepErrorLocked();
}

Status Reducer::BeginStepLocked(std::unique_lock<std::mutex>& lock) {
  if (!error_.ok()) return error_;
  if (step_open_) return error_ = OpenStepError();
  if (expect_sync_ && !launch_order_.empty()) {
    // A backward that launched buckets and never finished (it threw, in a
    // hook of the program's, say): its collectives may still write into
    // the buckets this step fills, and the ranks may have launched
    // different numbers of them, so later collectives would pair wrongly.
    return error_ = absl::FailedPreconditionError(absl::StrCat(
               "DDP: the previous backward launched ", launch_order_.size(), " of ",
               buckets_.size(),
               " gradient buckets and did not finish (it threw?): the ranks' collectives are out "
               "of step, so this DDP object cannot go on (PyTorch: \"Expected to have finished "
               "reduction in the prior iteration\"); restart the worker"));
  }
  RETURN_IF_ERROR(PreviousStepErrorLocked());
  if (options_.gradient_priority && scheduled_step_ != step_seq_) {
    // A step that never finalised (no gradient reached DDP): its scheduling
    // is abandoned.
    (void)AwaitScheduledLocked(lock, /*abort=*/true);
  }
  launch_order_.clear();
  finished_ = 0;
  finish_status_ = absl::OkStatus();
  finish_waited_ = Duration{};
  step_aborted_ = false;
  expect_sync_ = true;
  finalizer_queued_ = false;
  stats_ = ReducerStepStats{};
  stats_.forward_end = RealClock()->Now();
  stats_.bucket_launched.assign(buckets_.size(), MonoTime{});
  stats_.bucket_comm_start.assign(buckets_.size(), MonoTime{});
  stats_.bucket_comm_end.assign(buckets_.size(), MonoTime{});
  if (options_.find_unused_parameters) {
    used_here_.assign(params_.size(), 0);
    used_counts_ = torch::Tensor();
    used_work_.reset();
    used_known_ = false;
  }
  ++step_seq_;  // Wakes the scheduler (gradient_priority) once buckets are ready.
  return absl::OkStatus();
}

Status Reducer::JoinStep() {
  Status scheduled;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!options_.weight_by_samples) {
      return absl::FailedPreconditionError(
          "DDP: JoinStep needs weight_by_samples (a joined rank contributes weight 0)");
    }
    Status s = BeginStepLocked(lock);
    if (!s.ok()) return s;
    local_samples_ = 0;
    // A first step that is a join still records an order (the current
    // layout), so this rank takes part in the rebuild broadcast with the
    // others; only rank 0's order is used.
    if (!rebuilt_ && !have_arrival_order_) {
      arrival_order_.clear();
      for (const auto& b : buckets_) {
        arrival_order_.insert(arrival_order_.end(), b.params.begin(), b.params.end());
      }
    }
    torch::NoGradGuard no_grad;
    std::fill(ready_.begin(), ready_.end(), true);
    for (auto& b : buckets_) {
      b.work.reset();
      b.pending = 0;
      b.buffer.zero_();
      b.buffer[b.grad_numel + 1].fill_(1);
    }
    LaunchCompleteBucketsLocked();
    expect_sync_ = false;
    stats_.backward_end = RealClock()->Now();
    scheduled = AwaitScheduledLocked(lock, /*abort=*/false);
  }
  // Blocks, whatever defer_wait says: the caller steps right after.
  return FinishBuckets(scheduled, nullptr);
}

Status Reducer::PrepareForBackward(const std::vector<torch::Tensor>& outputs,
                                   int64_t local_samples) {
  std::unique_lock<std::mutex> lock(mu_);
  // LibTorch drops a parameter's gradient accumulator, where this reducer's
  // hook sits, when its data changes dtype or device (Module::to after
  // Create): no hook would run, and every rank would train on its own
  // gradients without a word.
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].tensor.requires_grad()) {
      // Frozen after Create (requires_grad false has no accumulator): with
      // find_unused_parameters it is unused (its old accumulator is in no
      // graph); without, DDP would wait for a gradient that never comes.
      if (!options_.find_unused_parameters) {
        return absl::FailedPreconditionError(absl::StrCat(
            "DDP: parameter ", params_[i].name,
            " no longer requires grad (frozen after Create), so its gradient bucket would never "
            "be complete: freeze parameters before creating DDP, or set "
            "find_unused_parameters = true"));
      }
      continue;
    }
    if (torch::autograd::impl::grad_accumulator(params_[i].tensor) != accumulators_[i]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "DDP: parameter ", params_[i].name, " is no longer the one DDP was created over (now ",
          c10::toString(params_[i].tensor.scalar_type()), " on ", params_[i].tensor.device().str(),
          "): the module was moved or converted (to()) after Create, so its gradients would not "
          "be reduced; convert the module first, then create DDP over it"));
    }
  }
  RETURN_IF_ERROR(BeginStepLocked(lock));
  std::fill(ready_.begin(), ready_.end(), false);
  unused_.clear();
  taken_as_unused_.assign(params_.size(), false);
  local_samples_ = local_samples;
  // What each gradient is multiplied by on its way into its slot, this step.
  slot_scale_ = options_.weight_by_samples ? static_cast<double>(local_samples)
                : prescale_                 ? 1.0 / comm_->world_size()
                                            : 1.0;
  if (slot_scale_ != 1.0) slot_scale_tensor_ = at::scalar_tensor(slot_scale_, at::kDouble);
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.work.reset();
    b.deferred.clear();
    if (options_.weight_by_samples) {
      torch::NoGradGuard no_grad;
      b.buffer[b.grad_numel].fill_(local_samples);
      b.buffer[b.grad_numel + 1].fill_(0);
    }
  }
  if (!options_.find_unused_parameters) return absl::OkStatus();
  // Walk the autograd graph from the outputs; accumulators not reached
  // belong to parameters unused in this step.
  std::unordered_set<const torch::autograd::Node*> reached;
  std::vector<torch::autograd::Node*> stack;
  for (const auto& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    auto fn = out.grad_fn();
    if (fn == nullptr) continue;
    if (reached.insert(fn.get()).second) stack.push_back(fn.get());
  }
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    for (const auto& edge : node->next_edges()) {
      if (edge.function && reached.insert(edge.function.get()).second) {
        stack.push_back(edge.function.get());
      }
    }
  }
  // Marked ready by the backward's first hook, as PyTorch's reducer does,
  // not here: a Forward with no Backward (a validation pass) would
  // otherwise launch collectives, and the gradient copied would be the one
  // .grad holds now, before the zero_grad() a step may still make.
  for (size_t i = 0; i < params_.size(); ++i) {
    if (reached.count(accumulators_[i].get()) == 0) unused_.push_back(i);
  }
  return absl::OkStatus();
}

void Reducer::OnGradReady(size_t index) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!expect_sync_) return;  // no_sync, or a backward not prepared by forward.
  if (const torch::Tensor& grad = params_[index].tensor.grad(); grad.defined() && grad.is_sparse()) {
    // Buckets are dense; reading a sparse gradient's data pointer threw an
    // error that named neither the parameter nor why.
    if (error_.ok()) {
      error_ = absl::FailedPreconditionError(absl::StrCat(
          "DDP: parameter ", params_[index].name,
          " has a sparse gradient (an Embedding or EmbeddingBag with sparse=true): DDP reduces "
          "dense gradients only; make it dense (sparse=false)"));
    }
    throw std::runtime_error(std::string(error_.message()));
  }
  if (!finalizer_queued_) {
    finalizer_queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { Finalize(); });
  }
  if (!unused_.empty()) {
    // The first hook of this backward: the parameters its forward did not
    // reach are ready now.
    std::vector<size_t> unused;
    unused.swap(unused_);
    for (size_t i : unused) {
      if (i != index) taken_as_unused_[i] = true;
      MarkReadyLocked(i);
    }
  } else if (taken_as_unused_[index]) {
    // Its gradient came after its slot went out as unused: reducing on
    // would give this rank's own gradient, or none, without a word.
    if (error_.ok()) {
      error_ = absl::FailedPreconditionError(absl::StrCat(
          "DDP: parameter ", params_[index].name,
          " got a gradient after find_unused_parameters had taken it as unused: it is not "
          "reached from the outputs of the last Forward before this Backward (two Forwards "
          "before one Backward, or part of the model run outside Forward?); run the whole "
          "model in one Forward per Backward (PyTorch: \"Expected to mark a variable ready only "
          "once\")"));
    }
    throw std::runtime_error(std::string(error_.message()));
  }
  MarkReadyLocked(index);
}

void Reducer::MarkReadyLocked(size_t index) {
  if (ready_[index]) return;
  ready_[index] = true;
  if (!rebuilt_ && !have_arrival_order_) arrival_order_.push_back(index);
  const auto [b, pos] = slot_[index];
  Bucket& bucket = buckets_[b];
  torch::Tensor& view = bucket.views[pos];
  torch::Tensor& grad = params_[index].tensor.mutable_grad();
  {
    // With a prescaling hook (the default average) the slot receives
    // grad / world_size here, and the hook then sums. (at::mul_out into the
    // slot once page-faulted on fresh memory every step, before workers
    // kept freed memory (init.h KeepFreedMemory); it no longer does.)
    torch::NoGradGuard no_grad;
    if (grad.defined()) {
      if (options_.find_unused_parameters) used_here_[index] = 1;
      if (grad.data_ptr() != view.data_ptr()) {
        // The part of the slot in the bucket's own share, if any.
        const int64_t start = bucket.offsets[pos], end = start + view.numel();
        const int64_t from = std::max(start, bucket.share.first);
        const int64_t to = std::min(end, bucket.share.second);
        if (from < to && grad.is_contiguous() && grad.sizes() == view.sizes() &&
            grad.scalar_type() == view.scalar_type()) {
          // The communicator reads [from, to) from the gradient itself;
          // the rest is copied in (slot_scale_ is 1 here, see BuildBuckets).
          const torch::Tensor flat_grad = grad.view(-1), flat_slot = view.view(-1);
          CopyIntoSlot(flat_slot.narrow(0, 0, from - start), flat_grad.narrow(0, 0, from - start));
          CopyIntoSlot(flat_slot.narrow(0, to - start, end - to),
                       flat_grad.narrow(0, to - start, end - to));
          bucket.deferred.push_back({from, flat_grad.narrow(0, from - start, to - from)});
          stats_.bytes_read_in_place += (to - from) * static_cast<int64_t>(view.element_size());
        } else if (StreamingScaledCopy(view, grad, static_cast<float>(slot_scale_))) {
          // One pass: the scaling rides on the copy. Large float32 gradients
          // stream into the slot (ddp/streaming.h): nothing reads the slot
          // again before the bucket is complete.
        } else if (slot_scale_ != 1.0) {
          at::mul_out(view, grad, slot_scale_tensor_);
        } else {
          view.copy_(grad);
        }
        if (options_.gradient_as_bucket_view) grad = view;
      } else if (slot_scale_ != 1.0) {
        view.mul_(slot_scale_);
      }
    } else {
      view.zero_();
    }
  }
  if (--bucket.pending == 0) LaunchCompleteBucketsLocked();
}

void Reducer::LaunchCompleteBucketsLocked() {
  if (options_.gradient_priority) {
    cv_.notify_all();  // The scheduler launches.
    return;
  }
  // In index order: the next bucket to launch is the count launched.
  for (size_t b = launch_order_.size(); b < buckets_.size() && buckets_[b].pending == 0;
       b = launch_order_.size()) {
    LaunchLocked(b);
  }
}

void Reducer::LaunchLocked(size_t b) {
  Bucket& bucket = buckets_[b];
  GradBucket view;
  view.index = b;
  view.buffer = bucket.buffer;
  view.param_indices = bucket.params;
  view.offsets = bucket.offsets;
  for (size_t i : bucket.params) view.numels.push_back(params_[i].tensor.numel());
  view.slots = bucket.views;
  view.prescaled = prescale_ && !options_.weight_by_samples;
  view.weighted = options_.weight_by_samples;
  // The communicator holds the gradients from here until it has read them.
  view.deferred_inputs = std::move(bucket.deferred);
  bucket.deferred.clear();
  try {
    bucket.work = options_.comm_hook.run(view, *comm_);
  } catch (const std::exception& e) {
    bucket.work = BucketWork::Failed(absl::InternalError(absl::StrCat(
        "comm hook '", options_.comm_hook.name, "' threw on bucket ", b, ": ", e.what())));
  }
  if (bucket.work == nullptr) {
    bucket.work = BucketWork::Failed(absl::InternalError(absl::StrCat(
        "comm hook '", options_.comm_hook.name, "' returned no work for bucket ", b)));
  }
  stats_.bucket_launched[b] = RealClock()->Now();
  launch_order_.push_back(b);
  if (options_.find_unused_parameters && launch_order_.size() == buckets_.size()) {
    LaunchUsedFlagsLocked();
  }
  cv_.notify_all();  // FinishBuckets may wait for this launch (defer_launches).
}

void Reducer::LaunchUsedFlagsLocked() {
  torch::NoGradGuard no_grad;
  torch::Tensor flags = torch::empty({static_cast<int64_t>(params_.size())}, torch::kFloat);
  float* f = flags.data_ptr<float>();
  for (size_t i = 0; i < params_.size(); ++i) f[i] = used_here_[i];
  used_counts_ = flags.to(comm_->device());
  used_work_ = comm_->AllReduce(used_counts_, ReduceOp::kSum);
}

bool Reducer::NeedsUsedFlagsLocked(size_t b) const {
  if (!options_.find_unused_parameters || used_known_) return false;
  for (size_t i : buckets_[b].params) {
    if (!used_here_[i]) return true;
  }
  return false;
}

Status Reducer::AwaitUsedFlags() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!options_.find_unused_parameters || used_known_) return absl::OkStatus();
  // Launched with the last bucket; with gradient_priority the scheduler may
  // not have got there yet, or may have stopped (an error) before it.
  cv_.wait(lock, [&] {
    return used_work_ != nullptr || !options_.gradient_priority || scheduled_step_ == step_seq_;
  });
  if (used_work_ == nullptr) {
    return absl::InternalError(
        "DDP: the used-parameter flags were never reduced (not every bucket was launched)");
  }
  std::shared_ptr<Work> work = used_work_;
  torch::Tensor counts = used_counts_;
  lock.unlock();
  RETURN_IF_ERROR(Annotate(work->Wait(options_.timeout + kWorkWaitSlack),
                           "DDP: reducing which parameters each rank used"));
  const torch::Tensor host = counts.cpu();
  const float* c = host.data_ptr<float>();
  lock.lock();
  any_rank_used_.assign(params_.size(), 0);
  for (size_t i = 0; i < params_.size(); ++i) any_rank_used_[i] = c[i] > 0;
  used_known_ = true;
  return absl::OkStatus();
}

void Reducer::SchedulerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return shutdown_ || scheduled_step_ != step_seq_; });
    if (shutdown_) return;
    const uint64_t step = step_seq_;
    const size_t n = buckets_.size();
    while (launch_order_.size() < n && !step_aborted_ && !shutdown_) {
      // The first unlaunched bucket (the order without priority) unless the
      // ranks agree that a bucket needed earlier by forward is ready on all
      // of them: an allreduce of this rank's ready flags.
      std::vector<bool> launched(n, false);
      for (size_t b : launch_order_) launched[b] = true;
      size_t choice = n;
      for (size_t b = 0; b < n && choice == n; ++b) {
        if (!launched[b]) choice = b;
      }
      if (n - launch_order_.size() >= 2) {
        torch::Tensor flags = torch::zeros({static_cast<int64_t>(n)}, torch::kFloat);
        float* f = flags.data_ptr<float>();
        for (size_t b = 0; b < n; ++b) f[b] = !launched[b] && buckets_[b].pending == 0 ? 1 : 0;
        lock.unlock();
        Status s = comm_->AllReduce(flags, ReduceOp::kSum)->Wait(options_.timeout + kWorkWaitSlack);
        lock.lock();
        if (!s.ok()) {
          schedule_error_ = Annotate(s, "DDP: agreeing on the next bucket to reduce");
          break;
        }
        ++stats_.priority_agreements;
        const float everywhere = static_cast<float>(comm_->world_size());
        for (size_t b = 0; b < n; ++b) {
          if (!launched[b] && f[b] == everywhere && priority_[b] < priority_[choice]) choice = b;
        }
      }
      cv_.wait(lock, [&] { return shutdown_ || step_aborted_ || buckets_[choice].pending == 0; });
      if (shutdown_ || step_aborted_) break;
      LaunchLocked(choice);
      if (launch_order_.size() == n) break;
      // One bucket on the wire at a time: the next choice is made when it
      // is done, from what is ready then.
      std::shared_ptr<Work> work = buckets_[choice].work->work();
      lock.unlock();
      if (work != nullptr) (void)work->Wait(options_.timeout + kWorkWaitSlack);
      lock.lock();
    }
    scheduled_step_ = step;
    cv_.notify_all();
  }
}

Status Reducer::AwaitScheduledLocked(std::unique_lock<std::mutex>& lock, bool abort) {
  if (!options_.gradient_priority) return absl::OkStatus();
  if (abort) step_aborted_ = true;
  cv_.notify_all();
  cv_.wait(lock, [&] { return scheduled_step_ == step_seq_; });
  Status s = schedule_error_;
  schedule_error_ = absl::OkStatus();
  return s;
}

void Reducer::Finalize() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!expect_sync_) return;
  expect_sync_ = false;
  finalizer_queued_ = false;
  stats_.backward_end = RealClock()->Now();
  // Every hook of this backward has run: a bucket still incomplete never
  // will be.
  size_t incomplete = buckets_.size();
  for (size_t b = 0; b < buckets_.size() && incomplete == buckets_.size(); ++b) {
    if (buckets_[b].pending > 0) incomplete = b;
  }
  Status status;
  if (incomplete < buckets_.size()) {
    std::vector<std::string> missing;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!ready_[i]) missing.push_back(params_[i].name);
    }
    status = absl::FailedPreconditionError(absl::StrCat(
        "DDP: parameters [", absl::StrJoin(missing, ", "),
        "] received no gradient in this backward, so bucket ", incomplete, " of ",
        buckets_.size(),
        " was never reduced. If the model does not use every parameter in every step, "
        "set find_unused_parameters = true."));
  }
  if (options_.defer_wait && options_.defer_launches && status.ok()) {
    // The scheduler launches the rest; CompleteStep waits for each launch.
    step_open_ = true;
    return;
  }
  Status scheduled = AwaitScheduledLocked(lock, /*abort=*/!status.ok());
  if (status.ok()) status = scheduled;
  if (options_.defer_wait && status.ok()) {
    // CompleteStep waits, on the training thread.
    step_open_ = true;
    return;
  }
  lock.unlock();
  status = FinishBuckets(status, nullptr);
  if (!status.ok()) throw std::runtime_error(std::string(status.message()));
}

bool Reducer::step_open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return step_open_;
}

Status Reducer::CompleteStep(const BucketDone& on_bucket, int through) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!step_open_) return error_;
  }
  return FinishBuckets(absl::OkStatus(), on_bucket, through);
}

std::vector<size_t> Reducer::pending_buckets() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!step_open_) return {};
  std::vector<bool> done(buckets_.size(), false);
  for (size_t k = 0; k < finished_; ++k) done[launch_order_[k]] = true;
  std::vector<size_t> pending;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!done[b]) pending.push_back(b);
  }
  return pending;
}

bool Reducer::rebuild_pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !rebuilt_ && have_arrival_order_;
}

Status Reducer::FinishBuckets(Status status, const BucketDone& on_bucket, int through) {
  std::unique_lock<std::mutex> lock(mu_);
  // In the order the wire took them, from the first not yet done.
  size_t k = finished_;
  if (through >= 0) {
    const auto done_end = launch_order_.begin() + static_cast<std::ptrdiff_t>(k);
    if (std::find(launch_order_.begin(), done_end, static_cast<size_t>(through)) != done_end) {
      return finish_status_;
    }
  }
  if (!status.ok() && finish_status_.ok()) finish_status_ = status;
  status = finish_status_;
  // defer_launches: the scheduler may still be launching this step's
  // buckets; the k-th is awaited when the loop reaches it.
  const bool launching = options_.gradient_priority && scheduled_step_ != step_seq_;
  std::vector<size_t> order = launch_order_;
  std::vector<std::shared_ptr<BucketWork>> works;
  for (size_t b : order) works.push_back(buckets_[b].work);
  lock.unlock();
  // Wait for every launched bucket, even when failing, so no allreduce is
  // left writing into gradients. On a device communicator the wait is queued
  // on the current stream (an event), so the write-back below and whatever
  // the caller queues next run after the collective without the host waiting
  // for the GPU; a collective that fails later is reported by the next
  // PrepareForBackward. Host-side communicators block here.
  // The hooks' continuations (a cast back, the Adasum tree) run inside
  // BucketWork::Wait, here. Each bucket is written back (and handed to
  // `on_bucket`) as soon as it is reduced, while later ones may still be on
  // the wire.
  Duration waited{};
  bool stopped = false;
  for (; !stopped; ++k) {
    if (k >= works.size()) {
      if (!launching) break;
      lock.lock();
      const MonoTime wait_start = RealClock()->Now();
      cv_.wait(lock, [&] { return launch_order_.size() > k || scheduled_step_ == step_seq_; });
      waited += RealClock()->Now() - wait_start;
      const bool more = launch_order_.size() > k;
      if (more) {
        order = launch_order_;
        for (size_t j = works.size(); j < order.size(); ++j) works.push_back(buckets_[order[j]].work);
      }
      lock.unlock();
      if (!more) break;  // The scheduler stopped (an error) or launched all.
    }
    const size_t b = order[k];
    const std::shared_ptr<Work>& collective = works[k]->work();
    if (options_.on_wait && collective && !collective->IsCompleted()) {
      options_.on_wait(static_cast<int>(b));
    }
    const MonoTime wait_start = RealClock()->Now();
    StatusOr<at::Tensor> r = works[k]->Wait(options_.timeout + kWorkWaitSlack);
    waited += RealClock()->Now() - wait_start;
    if (!r.ok()) {
      if (status.ok()) status = Annotate(r.status(), "DDP: gradient allreduce failed");
      continue;
    }
    if (!status.ok()) continue;
    bool needs_flags = false;
    if (options_.find_unused_parameters) {
      lock.lock();
      needs_flags = NeedsUsedFlagsLocked(b);
      lock.unlock();
    }
    if (needs_flags) {
      status = AwaitUsedFlags();
      if (!status.ok()) continue;
    }
    lock.lock();
    status = WriteBackLocked(b, *r);
    lock.unlock();
    if (status.ok() && on_bucket) on_bucket(b);
    stopped = status.ok() && through >= 0 && b == static_cast<size_t>(through);
  }
  if (options_.on_wait) options_.on_wait(-1);
  lock.lock();
  finished_ = k;
  finish_waited_ += waited;
  if (!status.ok() && finish_status_.ok()) finish_status_ = status;
  if (stopped && (k < launch_order_.size() || (launching && scheduled_step_ != step_seq_))) {
    return absl::OkStatus();  // Stopped after `through`; more to come.
  }
  if (launching) {
    Status scheduled = AwaitScheduledLocked(lock, /*abort=*/!status.ok());
    if (status.ok()) status = scheduled;
  }
  if (status.ok() && options_.find_unused_parameters && !used_known_) {
    // No bucket needed the flags (every parameter used here): their
    // collective is still awaited, so that it cannot fail unseen or
    // outlive its tensor.
    lock.unlock();
    status = AwaitUsedFlags();
    lock.lock();
  }
  step_open_ = false;
  if (!status.ok()) {
    if (error_.ok()) error_ = status;
    return status;
  }
  if (!rebuilt_ && !have_arrival_order_ && arrival_order_.size() == params_.size()) {
    have_arrival_order_ = true;
  }
  stats_.buckets = static_cast<int>(buckets_.size());
  stats_.launch_order.assign(order.begin(), order.end());
  stats_.comm_exposed_ms = std::chrono::duration<double, std::milli>(finish_waited_).count();
  // Without defer_wait the step finishes in backward's finalisation: from
  // forward's end to now. With it the waits come later, in CompleteStep,
  // between the caller's own work (an optimizer stepping the buckets done,
  // the next forward): backward is then autograd up to finalisation plus
  // those waits, so that it does not also count that work.
  stats_.backward_ms =
      options_.defer_wait
          ? MillisBetween(stats_.forward_end, stats_.backward_end) + stats_.comm_exposed_ms
          : MillisBetween(stats_.forward_end, RealClock()->Now());
  last_stats_ = stats_;
  last_works_.assign(buckets_.size(), nullptr);
  for (size_t j = 0; j < works.size(); ++j) last_works_[order[j]] = works[j]->work();
  ReducerStepStats done = stats_;
  lock.unlock();
  if (options_.on_step) options_.on_step(done);
  return absl::OkStatus();
}

Status Reducer::WriteBackLocked(size_t b, const torch::Tensor& result) {
  Bucket& bucket = buckets_[b];
  const torch::Tensor& buffer = bucket.buffer;
  if (!result.defined() || result.numel() != buffer.numel() ||
      result.scalar_type() != buffer.scalar_type() || result.device() != buffer.device()) {
    const std::string got =
        result.defined()
            ? absl::StrCat(result.numel(), " elements of ", c10::toString(result.scalar_type()),
                           " on ", result.device().str())
            : std::string("an undefined tensor");
    return absl::InternalError(absl::StrCat(
        "DDP: comm hook '", options_.comm_hook.name, "' returned ", got, " for bucket ", b,
        ", which holds ", buffer.numel(), " elements of ", c10::toString(buffer.scalar_type()),
        " on ", buffer.device().str()));
  }
  torch::NoGradGuard no_grad;
  if (result.data_ptr() != buffer.data_ptr()) buffer.copy_(result.view_as(buffer));
  if (options_.weight_by_samples) {
    // sum_r n_r g_r / N; N = 0 (every rank joining) leaves the zeros.
    const torch::Tensor counts = buffer.narrow(0, bucket.grad_numel, 2);
    buffer.narrow(0, 0, bucket.grad_numel).div_(counts.narrow(0, 0, 1).clamp_min(1));
    if (b == 0) {
      last_counts_ = counts.to(torch::kLong);
      last_counts_work_ = bucket.work->work();
    }
  }
  for (size_t pos = 0; pos < bucket.params.size(); ++pos) {
    const size_t i = bucket.params[pos];
    // No rank used it: its .grad stays as it was (see "Unused parameters").
    if (options_.find_unused_parameters && !used_here_[i] && !any_rank_used_[i]) continue;
    torch::Tensor& grad = params_[i].tensor.mutable_grad();
    const torch::Tensor& view = bucket.views[pos];
    if (!grad.defined()) {
      grad = options_.gradient_as_bucket_view ? view : view.clone();
    } else if (grad.data_ptr() != view.data_ptr()) {
      grad.copy_(view);
    }
  }
  stats_.bytes_reduced += bucket.work->wire_bytes();
  stats_.bucket_comm_start[b] = bucket.work->work()->started_at();
  stats_.bucket_comm_end[b] = bucket.work->work()->finished_at();
  return absl::OkStatus();
}

Status Reducer::RebuildBucketsIfNeeded() {
  std::vector<size_t> order;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (rebuilt_ || !have_arrival_order_) return absl::OkStatus();
    // A re-pack moves every gradient: not while a step is open.
    if (step_open_) return error_ = OpenStepError();
    order = arrival_order_;
  }
  const int64_t n = static_cast<int64_t>(params_.size());
  torch::Tensor wire = torch::empty({n}, torch::kLong);
  if (comm_->rank() == 0) {
    int64_t* out = wire.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int64_t>(order[i]);
  }
  torch::Tensor on_device = wire.to(comm_->device());
  RETURN_IF_ERROR(Annotate(comm_->Broadcast(on_device, 0)->Wait(options_.timeout + kWorkWaitSlack),
                           "DDP: broadcasting the bucket order"));
  if (!on_device.is_same(wire)) wire = on_device.cpu();
  std::vector<bool> seen(n, false);
  const int64_t* data = wire.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (data[i] < 0 || data[i] >= n || seen[data[i]]) {
      return absl::InternalError("DDP: rank 0's bucket order is not a permutation");
    }
    seen[data[i]] = true;
    order[i] = static_cast<size_t>(data[i]);
  }
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(Annotate(BuildBuckets(order), "DDP: re-packing the buckets"));
  rebuilt_ = true;
  return absl::OkStatus();
}

}  // namespace ddp
}  // namespace lockstep
