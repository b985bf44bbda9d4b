#include "ddp/ddp.h"

#include <exception>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace ddp {
namespace {

double MillisSince(MonoTime start) {
  return std::chrono::duration<double, std::milli>(RealClock()->Now() - start).count();
}

double MillisBetween(MonoTime a, MonoTime b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

Status BroadcastCoalesced(Communicator& comm, const std::vector<torch::Tensor>& tensors, int root,
                          Duration timeout, size_t chunk_bytes) {
  torch::NoGradGuard no_grad;
  // Group by dtype, keeping order, and cut into chunks.
  std::map<int, std::vector<std::vector<torch::Tensor>>> chunks;
  std::map<int, size_t> chunk_fill;
  for (const auto& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    const int key = static_cast<int>(t.scalar_type());
    auto& list = chunks[key];
    if (list.empty() || chunk_fill[key] + t.nbytes() > chunk_bytes) {
      list.emplace_back();
      chunk_fill[key] = 0;
    }
    list.back().push_back(t);
    chunk_fill[key] += t.nbytes();
  }
  for (auto& [key, list] : chunks) {
    for (auto& chunk : list) {
      std::vector<torch::Tensor> flat;
      for (const auto& t : chunk) flat.push_back(t.detach().reshape({-1}));
      torch::Tensor buffer = torch::cat(flat);
      // A stream wait on a device communicator: forward queues behind the
      // broadcast without the host waiting for the GPU.
      RETURN_IF_ERROR(comm.Broadcast(buffer, root)->WaitStream(timeout + kWorkWaitSlack));
      int64_t offset = 0;
      for (auto& t : chunk) {
        t.detach().copy_(buffer.narrow(0, offset, t.numel()).view(t.sizes()));
        offset += t.numel();
      }
    }
  }
  return absl::OkStatus();
}

namespace internal {

std::string ExceptionMessage(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  return c10_error ? c10_error->what_without_backtrace() : e.what();
}

}  // namespace internal

void CollectIValueTensors(const c10::IValue& value, std::vector<torch::Tensor>* out) {
  if (value.isTensor()) {
    const torch::Tensor& t = value.toTensor();
    if (t.defined()) out->push_back(t);
  } else if (value.isList()) {  // Tensor lists included.
    for (const c10::IValue& e : value.toListRef()) CollectIValueTensors(e, out);
  } else if (value.isTuple()) {
    for (const c10::IValue& e : value.toTupleRef().elements()) CollectIValueTensors(e, out);
  } else if (value.isGenericDict()) {
    for (const auto& e : value.toGenericDict()) CollectIValueTensors(e.value(), out);
  }
}

Status DistributedDataParallel::Init() {
  if (root_ == nullptr) return absl::InvalidArgumentError("DDP: the module is empty (null)");
  if (comm_ == nullptr) return absl::InvalidArgumentError("DDP: communicator is null");
  if (!(options_.bucket_cap_mb > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("DDP: bucket_cap_mb must be positive, got ", options_.bucket_cap_mb));
  }

  // Parameters requiring grad, each storage once (tied weights), in
  // registration order; `state` is every parameter and buffer, named.
  std::vector<Reducer::NamedParam> params;
  std::vector<Reducer::NamedParam> state;
  std::unordered_set<const void*> seen;
  for (const auto& item : root_->named_parameters(/*recurse=*/true)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    state.push_back({item.key(), item.value()});
    if (item.value().requires_grad()) params.push_back({item.key(), item.value()});
  }
  for (const auto& item : root_->named_buffers(/*recurse=*/true)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    state.push_back({item.key(), item.value()});
    buffers_.push_back(item.value());
  }
  // Before any collective: a model split across devices (or on the wrong
  // one for this backend) gets an error naming the tensors.
  RETURN_IF_ERROR(Reducer::CheckDevices(state, *comm_));
  std::vector<torch::Tensor> state_tensors;
  for (const auto& s : state) state_tensors.push_back(s.tensor);
  const DdpOptions& opts = options_;
  RETURN_IF_ERROR(Annotate(BroadcastCoalesced(*comm_, state_tensors, 0, opts.timeout),
                           "DDP: broadcasting initial parameters and buffers from rank 0"));
  ReducerOptions reducer_options;
  reducer_options.bucket_cap_bytes = static_cast<size_t>(opts.bucket_cap_mb * 1024 * 1024);
  reducer_options.first_bucket_cap_bytes =
      std::min(kDefaultFirstBucketCapBytes, reducer_options.bucket_cap_bytes);
  reducer_options.find_unused_parameters = opts.find_unused_parameters;
  reducer_options.gradient_as_bucket_view = opts.gradient_as_bucket_view;
  reducer_options.comm_hook = opts.comm_hook;
  reducer_options.weight_by_samples = opts.weight_by_samples;
  reducer_options.timeout = opts.timeout;
  reducer_options.defer_wait = opts.overlap_optimizer;
  reducer_options.gradient_priority = opts.gradient_priority;
  DistributedDataParallel* self = this;
  reducer_options.on_step = [self](const ReducerStepStats&) { self->OnReducerStep(); };
  reducer_options.on_wait = [self](int bucket) { self->OnBucketWait(bucket); };
  ASSIGN_OR_RETURN(reducer_, Reducer::Create(std::move(params), comm_.get(), reducer_options));
  if (opts.report_progress) progress_ = AcquireProgressSink();
  last_step_end_ = RealClock()->Now();
  return absl::OkStatus();
}

Status DistributedDataParallel::PreForward() {
  forward_start_ = RealClock()->Now();
  if (!forward_seen_) {
    forward_seen_ = true;
    first_forward_start_ = forward_start_;
  }
  RETURN_IF_ERROR(reducer_->last_error());
  // The rebuild's and the buffers' broadcasts block on every peer.
  SetCollective(true, -1, "broadcast");
  Status s = reducer_->RebuildBucketsIfNeeded();
  if (s.ok() && options_.broadcast_buffers && !buffers_.empty()) {
    s = Annotate(BroadcastCoalesced(*comm_, buffers_, 0, options_.timeout),
                 "DDP: broadcasting buffers from rank 0");
  }
  SetCollective(false, -1, "");
  return s;
}

void DistributedDataParallel::SetCollective(bool active, int bucket, const char* op) {
  if (progress_ == nullptr) return;
  CollectiveState c;
  if (active) {
    c.active = true;
    c.step = steps_ + 1;
    c.bucket = bucket;
    c.op = op;
    c.since = std::chrono::steady_clock::now();
    if (bucket >= 0) {
      // One wait from its first bucket on: `since` stays at its start.
      if (!waiting_) wait_since_ = c.since;
      waiting_ = true;
      c.since = wait_since_;
    }
  } else {
    waiting_ = false;
  }
  progress_->SetCollective(c);
}

void DistributedDataParallel::OnBucketWait(int bucket) {
  if (bucket >= 0) {
    SetCollective(true, bucket, "allreduce");
  } else if (waiting_) {
    SetCollective(false, -1, "");
  }
}

void DistributedDataParallel::RecordBucketWaits(const ReducerStepStats& r) {
  // Launch to completion per bucket; a bucket whose completion is not known
  // yet (a device collective still running) counts as 0.
  std::vector<double> waits(r.bucket_launched.size(), 0.0);
  for (size_t b = 0; b < waits.size() && b < r.bucket_comm_end.size(); ++b) {
    if (r.bucket_comm_end[b].time_since_epoch().count() == 0) continue;
    waits[b] = std::max(0.0, MillisBetween(r.bucket_launched[b], r.bucket_comm_end[b]));
  }
  if (bucket_waits_.size() == static_cast<size_t>(kWaitWindowSteps)) {
    bucket_waits_.erase(bucket_waits_.begin());
  }
  bucket_waits_.push_back(std::move(waits));
}

Status DistributedDataParallel::PostForward(const std::vector<torch::Tensor>& outputs) {
  forward_ms_ = MillisSince(forward_start_);
  if (!require_sync_ || !torch::GradMode::is_enabled()) return absl::OkStatus();
  if (options_.weight_by_samples && samples_pending_ <= 0) {
    return absl::FailedPreconditionError(
        "DDP: weight_by_samples, but no sample was counted for this step (Forward counts the "
        "first dimension of its first argument when that is a tensor; otherwise, and with "
        "ForwardWith, call CountSamples(n) first). A rank with no data left calls JoinStep()");
  }
  return reducer_->PrepareForBackward(outputs, samples_pending_);
}

Status DistributedDataParallel::JoinStep() {
  if (!options_.weight_by_samples) {
    return absl::FailedPreconditionError(
        "DDP: JoinStep needs DdpOptions::weight_by_samples (a joined rank has weight 0)");
  }
  RETURN_IF_ERROR(PreForward());
  forward_ms_ = MillisSince(forward_start_);
  return reducer_->JoinStep();
}

bool DistributedDataParallel::AllDone() const {
  return reducer_->last_done_ranks() >= comm_->world_size();
}

StepStats DistributedDataParallel::MakeStats(const ReducerStepStats& r) const {
  StepStats s;
  s.step = steps_;
  s.forward_ms = synced_forward_ms_;
  s.backward_ms = r.backward_ms;
  s.comm_exposed_ms = r.comm_exposed_ms;
  s.bytes_reduced = r.bytes_reduced;
  s.buckets = r.buckets;
  s.reducer = r;
  return s;
}

void DistributedDataParallel::OnReducerStep() {
  ++steps_;
  synced_forward_ms_ = forward_ms_;
  if (progress_ != nullptr) {
    const MonoTime now = RealClock()->Now();
    const ReducerStepStats r = reducer_->last_stats();
    RecordBucketWaits(r);
    StepProgress p;
    p.step = steps_;
    p.samples = samples_pending_;
    if (loss_known_) p.loss = loss_pending_;
    p.forward_ms = synced_forward_ms_;
    p.backward_ms = r.backward_ms;
    p.exposed_comm_ms = r.comm_exposed_ms;
    p.bytes_reduced = r.bytes_reduced;
    p.buckets = r.buckets;
    p.data_ms =
        forward_seen_ ? std::max(0.0, MillisBetween(last_step_end_, first_forward_start_)) : 0;
    size_t buckets = 0;
    for (const auto& w : bucket_waits_) buckets = std::max(buckets, w.size());
    p.bucket_wait_ms.assign(buckets, 0.0);
    for (size_t b = 0; b < buckets; ++b) {
      int n = 0;
      for (const auto& w : bucket_waits_) {
        if (b < w.size()) {
          p.bucket_wait_ms[b] += w[b];
          ++n;
        }
      }
      if (n > 0) p.bucket_wait_ms[b] /= n;
    }
    p.wait_steps = static_cast<int>(bucket_waits_.size());
    if (optimizer_marked_) {
      pending_ = std::move(p);
      step_pending_ = true;
    } else {
      FinishStep(std::move(p), now);
    }
  }
  samples_pending_ = 0;
  loss_pending_ = 0;
  loss_known_ = true;
  if (options_.on_step) options_.on_step(MakeStats(reducer_->last_stats()));
}

void DistributedDataParallel::FinishStep(StepProgress p, MonoTime end) {
  // Wall clock from the previous step's end: data loading, the optimizer
  // and everything else the program does per step count.
  p.step_ms = std::max(0.0, MillisBetween(last_step_end_, end));
  p.samples_per_s = p.step_ms > 0 ? p.samples * 1000.0 / p.step_ms : 0;
  last_step_end_ = end;
  forward_seen_ = false;
  progress_->Report(p);
}

double DistributedDataParallel::StepOverlapped(torch::optim::Optimizer& optimizer) {
  // Which bucket each parameter is in, and each group's parameters split by
  // bucket (parts[b][g]; parts[buckets][g]: those DDP does not reduce).
  std::unordered_map<const c10::TensorImpl*, size_t> bucket_of;
  const std::vector<std::vector<size_t>> layout = reducer_->bucket_indices();
  for (size_t b = 0; b < layout.size(); ++b) {
    for (size_t i : layout[b]) bucket_of[reducer_->params()[i].tensor.unsafeGetTensorImpl()] = b;
  }
  auto& groups = optimizer.param_groups();
  std::vector<std::vector<torch::Tensor>> all(groups.size());
  std::vector<std::vector<std::vector<torch::Tensor>>> parts(
      layout.size() + 1, std::vector<std::vector<torch::Tensor>>(groups.size()));
  for (size_t g = 0; g < groups.size(); ++g) {
    all[g] = groups[g].params();
    for (const torch::Tensor& p : all[g]) {
      auto it = bucket_of.find(p.unsafeGetTensorImpl());
      parts[it == bucket_of.end() ? layout.size() : it->second][g].push_back(p);
    }
  }
  // The optimizer sees one part at a time; its state is keyed by tensor, so
  // stepping the parts one after another is one step of the whole.
  std::exception_ptr thrown;
  auto step_part = [&](size_t b) {
    if (thrown) return;
    bool any = false;
    for (size_t g = 0; g < groups.size(); ++g) {
      groups[g].params() = parts[b][g];
      any = any || !parts[b][g].empty();
    }
    try {
      if (any) optimizer.step();
    } catch (...) {
      thrown = std::current_exception();
    }
  };
  const Status s = reducer_->CompleteStep(step_part);
  if (s.ok()) step_part(layout.size());
  for (size_t g = 0; g < groups.size(); ++g) groups[g].params() = std::move(all[g]);
  if (thrown) std::rethrow_exception(thrown);
  return s.ok() ? reducer_->last_stats().comm_exposed_ms : 0;
}

void DistributedDataParallel::EndOptimizerStep(MonoTime start, double waited_ms) {
  if (progress_ == nullptr) return;
  const MonoTime end = RealClock()->Now();
  if (step_pending_) {
    step_pending_ = false;
    pending_.optimizer_ms = std::max(0.0, MillisBetween(start, end) - waited_ms);
    FinishStep(std::move(pending_), end);
  } else {
    // The first call (that step went out at the end of backward), or a
    // second optimizer step without a synchronised backward: the step now
    // ends here.
    optimizer_marked_ = true;
    last_step_end_ = end;
    forward_seen_ = false;
  }
}

StepStats DistributedDataParallel::last_stats() const {
  return steps_ > 0 ? MakeStats(reducer_->last_stats()) : StepStats{};
}

Status DistributedDataParallel::Backward(const torch::Tensor& loss) {
  if (progress_ != nullptr) {
    // A CPU scalar costs nothing to read; a device one would make the host
    // wait for the GPU, so its value stays unknown.
    if (loss.defined() && loss.numel() == 1 && loss.device().is_cpu()) {
      loss_pending_ += loss.detach().item<double>();
    } else {
      loss_known_ = false;
    }
  }
  try {
    loss.backward();
  } catch (const std::exception& e) {
    Status reducer_error = reducer_->last_error();
    if (!reducer_error.ok()) return reducer_error;
    return absl::InternalError(
        absl::StrCat("DDP: backward threw: ", internal::ExceptionMessage(e)));
  }
  return reducer_->last_error();
}

}  // namespace ddp
}  // namespace lockstep
