#include "ddp/ddp.h"

#include <dlfcn.h>

#include <ATen/record_function.h>
#include <c10/util/Type.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <exception>
#include <map>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "ddp/op_inputs.h"

namespace lockstep {
namespace ddp {
namespace {

double MillisSince(MonoTime start) {
  return std::chrono::duration<double, std::milli>(RealClock()->Now() - start).count();
}

// Before the first collective of DDP's own: every rank must have the same
// model (parameters and buffers: count, dtype, shape, which require grad)
// and the DDP options that decide what goes on the wire (bucket sizes, the
// hook, unused-parameter and sample-weight elements, buffer broadcasts, the
// launch order). Ranks that differ would otherwise run collectives of
// different sizes: shm names that, but Gloo's transport thread aborts the
// process. One allgather of a fixed-size record; a second, of one record per
// tensor, only when the counts agree but the shapes do not, to name the
// first tensor that differs. Every rank sees every record, so every rank
// returns the same error and none is left waiting.
constexpr int64_t kAgreementMagic = 0x4c53444450303032;  // "LSDDP002"

uint64_t Fnv1a(uint64_t h, int64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= static_cast<uint64_t>(v >> (8 * i)) & 0xff;
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t HashString(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = Fnv1a(h, static_cast<unsigned char>(c));
  return h;
}

// What a comm hook's callable is, alike on every rank that runs one
// program: the demangled type it holds ("none" when empty), and for a plain
// function pointer the function itself, since every function of one
// signature has one type. A function is named by its symbol where the
// dynamic linker knows one (dladdr: exported symbols only), otherwise by its
// module's file name and its offset there, which do not depend on where the
// module was loaded.
std::string CallableIdentity(const CommHook::Fn& fn) {
  if (!fn) return "none";
  using Plain = std::shared_ptr<BucketWork> (*)(GradBucket&, Communicator&);
  const Plain* plain = fn.target<Plain>();
  if (plain == nullptr || *plain == nullptr) return c10::demangle(fn.target_type().name());
  const void* address = reinterpret_cast<const void*>(*plain);
  Dl_info info{};
  if (dladdr(address, &info) == 0 || info.dli_fbase == nullptr) {
    return "a plain function (not found in any loaded module)";
  }
  if (info.dli_sname != nullptr && info.dli_saddr == address) {
    return absl::StrCat("function ", c10::demangle(info.dli_sname));
  }
  const char* file = info.dli_fname != nullptr ? info.dli_fname : "?";
  if (const char* slash = std::strrchr(file, '/'); slash != nullptr) file = slash + 1;
  return absl::StrFormat("function at %s+0x%x", file,
                         static_cast<const char*>(address) - static_cast<const char*>(info.dli_fbase));
}

// One tensor: dtype, requires_grad, dims, numel, a hash of its sizes.
constexpr int kTensorFields = 5;
std::array<int64_t, kTensorFields> DescribeTensor(const torch::Tensor& t) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t d : t.sizes()) h = Fnv1a(h, d);
  return {static_cast<int64_t>(t.scalar_type()), t.requires_grad() ? 1 : 0, t.dim(), t.numel(),
          static_cast<int64_t>(h)};
}

struct AgreementField {
  const char* name;
  int64_t value;
  std::string shown;  // How this rank's value is printed.
};

StatusOr<torch::Tensor> GatherRecords(Communicator& comm, const std::vector<int64_t>& mine,
                                      Duration timeout) {
  const int64_t n = static_cast<int64_t>(mine.size());
  torch::Tensor in = torch::tensor(mine, torch::kInt64).to(comm.device());
  torch::Tensor out = torch::empty({comm.world_size() * n}, in.options());
  RETURN_IF_ERROR(comm.AllGather(in, out)->Wait(timeout + kWorkWaitSlack));
  return out.cpu().view({comm.world_size(), n});
}

std::string ShapeOf(const torch::Tensor& t) {
  return absl::StrCat(c10::toString(t.scalar_type()), " [", absl::StrJoin(t.sizes(), ", "), "]",
                      t.requires_grad() ? "" : " (no grad)");
}

Status CheckRanksAgree(Communicator& comm, const std::vector<Reducer::NamedParam>& state,
                       const DdpOptions& options, Duration timeout) {
  const int world = comm.world_size();
  const int me = comm.rank();
  if (world == 1) return absl::OkStatus();
  std::vector<std::array<int64_t, kTensorFields>> tensors;
  uint64_t model_hash = 1469598103934665603ull;
  int64_t with_grad = 0;
  for (const auto& s : state) {
    tensors.push_back(DescribeTensor(s.tensor));
    for (int64_t v : tensors.back()) model_hash = Fnv1a(model_hash, v);
    with_grad += s.tensor.requires_grad() ? 1 : 0;
  }
  const CommHook& hook = options.comm_hook;
  const std::string hook_identity = CallableIdentity(hook.run);
  const auto flag = [](const char* name, bool value) {
    return AgreementField{name, value ? 1 : 0, value ? "true" : "false"};
  };
  const std::vector<AgreementField> fields = {
      {"bucket_cap_mb", static_cast<int64_t>(options.bucket_cap_mb * 1024 * 1024),
       absl::StrCat(options.bucket_cap_mb)},
      flag("find_unused_parameters", options.find_unused_parameters),
      flag("broadcast_buffers", options.broadcast_buffers),
      {"comm hook", static_cast<int64_t>(HashString(hook.name)), absl::StrCat("'", hook.name, "'")},
      // Two callables under one name (a user's hooks are all "custom"
      // unless named): told apart by their types, which are the same
      // across ranks running one program, and plain functions by which
      // function they are (CallableIdentity).
      {"comm hook callable", static_cast<int64_t>(HashString(hook_identity)), hook_identity},
      {"comm hook flags",
       (hook.prescale_by_world ? 1 : 0) | (hook.prescale_optional ? 2 : 0) |
           (hook.takes_deferred_inputs ? 4 : 0) | (hook.sums_weighted_buckets ? 8 : 0),
       absl::StrCat("prescale_by_world ", hook.prescale_by_world, ", prescale_optional ",
                    hook.prescale_optional, ", takes_deferred_inputs ", hook.takes_deferred_inputs,
                    ", sums_weighted_buckets ", hook.sums_weighted_buckets)},
      flag("weight_by_samples", options.weight_by_samples),
      flag("gradient_as_bucket_view", options.gradient_as_bucket_view),
      flag("gradient_priority", options.gradient_priority),
      flag("overlap_optimizer", options.overlap_optimizer),
      flag("overlap_forward", options.overlap_forward),
  };
  std::vector<int64_t> record = {kAgreementMagic, static_cast<int64_t>(state.size()), with_grad,
                                 static_cast<int64_t>(model_hash)};
  for (const auto& f : fields) record.push_back(f.value);
  auto gathered = GatherRecords(comm, record, timeout);
  if (!gathered.ok()) {
    return Annotate(gathered.status(), "DDP: checking that every rank has the same model and options");
  }
  const auto all = gathered->accessor<int64_t, 2>();
  const auto at = [&](int r, size_t i) { return all[r][static_cast<int64_t>(i)]; };
  for (int r = 0; r < world; ++r) {
    if (at(r, 0) != kAgreementMagic) {
      return absl::FailedPreconditionError(absl::StrCat(
          "DDP: rank ", r, " runs another version of the engine (its model check does not match "
          "rank ", me, "'s): build every rank from one lockstep"));
    }
  }
  // The ranks that differ from rank 0, per thing compared.
  const auto differing = [&](size_t i) {
    std::vector<int> ranks;
    for (int r = 1; r < world; ++r) {
      if (at(r, i) != at(0, i)) ranks.push_back(r);
    }
    return ranks;
  };
  const std::string where = absl::StrCat("rank ", me, " of ", world);
  if (auto ranks = differing(1); !ranks.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DDP: every rank must wrap the same model: rank 0 has ", at(0, 1),
        " parameters and buffers, rank ", ranks.front(), " has ", at(ranks.front(), 1),
        " (ranks that differ from rank 0: ", absl::StrJoin(ranks, ", "), "; seen on ", where, ")"));
  }
  std::vector<std::string> options_differ;
  for (size_t f = 0; f < fields.size(); ++f) {
    auto ranks = differing(4 + f);
    if (ranks.empty()) continue;
    options_differ.push_back(absl::StrCat(fields[f].name, " (ranks ", absl::StrJoin(ranks, ", "),
                                          " differ from rank 0; ", fields[f].shown, " here)"));
  }
  const bool model_differs = !differing(2).empty() || !differing(3).empty();
  if (!model_differs && options_differ.empty()) return absl::OkStatus();
  if (!model_differs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DDP: every rank must use the same DDP options, and these differ: ",
        absl::StrJoin(options_differ, "; "), " (seen on ", where, ")"));
  }
  // Same count, different tensors: one record per tensor names the first.
  std::vector<int64_t> per_tensor;
  for (const auto& t : tensors) per_tensor.insert(per_tensor.end(), t.begin(), t.end());
  if (per_tensor.empty()) per_tensor.push_back(0);
  auto described = GatherRecords(comm, per_tensor, timeout);
  if (!described.ok()) {
    return Annotate(described.status(), "DDP: finding the first tensor that differs between ranks");
  }
  const auto desc = described->accessor<int64_t, 2>();
  for (size_t i = 0; i < tensors.size(); ++i) {
    for (int r = 1; r < world; ++r) {
      bool same = true;
      for (int k = 0; k < kTensorFields; ++k) {
        const int64_t col = static_cast<int64_t>(i) * kTensorFields + k;
        same = same && desc[r][col] == desc[0][col];
      }
      if (same) continue;
      const auto field = [&](int rank, int k) {
        return desc[rank][static_cast<int64_t>(i) * kTensorFields + k];
      };
      const auto summary = [&](int rank) {
        return absl::StrCat(c10::toString(static_cast<c10::ScalarType>(field(rank, 0))), ", ",
                            field(rank, 2), " dims, ", field(rank, 3), " elements",
                            field(rank, 1) ? "" : ", no grad");
      };
      return absl::InvalidArgumentError(absl::StrCat(
          "DDP: every rank must wrap the same model: '", state[i].name, "' (tensor ", i + 1, " of ",
          tensors.size(), ") is ", summary(0), " on rank 0 but ", summary(r), " on rank ", r,
          "; here it is ", ShapeOf(state[i].tensor), " (seen on ", where, ")",
          options_differ.empty() ? "" : "; DDP options differ too: ",
          absl::StrJoin(options_differ, "; ")));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "DDP: every rank must wrap the same model, and the parameters' shapes differ between ranks "
      "(seen on ", where, ")"));
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

// overlap_forward's state (see DeferStep below).

struct DistributedDataParallel::DeferredStep {
  torch::optim::Optimizer* optimizer = nullptr;
  std::thread::id thread;
  // Parameter indices per bucket; each group's parameters split by bucket
  // (parts[b][g]; parts[buckets][g]: those DDP does not reduce).
  std::vector<std::vector<size_t>> layout;
  std::vector<std::vector<std::vector<torch::Tensor>>> parts;
  // The bucket of each parameter and of each gradient it had at
  // OptimizerStep, by TensorImpl.
  std::unordered_map<const c10::TensorImpl*, size_t> bucket_of;
  // Those gradients, kept alive so that no new tensor takes an address in
  // bucket_of while the step is open.
  std::vector<torch::Tensor> grads;
  std::vector<bool> done;     // Per bucket: stepped.
  std::vector<bool> cleared;  // Per parameter: the program reset its gradient.
  bool busy = false;          // Completing: the gate lets operators through.
  StepCounts counts;          // Up to OptimizerStep.
  MonoTime previous_end{};    // The step before ended here;
  MonoTime end{};             // this one at OptimizerStep.
  // Time inside that OptimizerStep (the parameters DDP does not reduce). The
  // buckets are stepped after `end`, in the next forward, whose forward_ms
  // counts them: here they would be counted twice and outgrow the step.
  double optimizer_ms = 0;
};

// Shared by the object and its thread's callback list: the object may go
// (or complete its step from another thread) while the list still holds it.
struct DistributedDataParallel::Gate {
  std::atomic<DistributedDataParallel*> ddp{nullptr};  // Null: closed.
  std::thread::id thread;
};

// One thread-local at::RecordFunction callback per thread with an open
// gate; it hands each operator's input tensors to the gates' objects.
struct GateCallbacks {
  using Gate = DistributedDataParallel::Gate;
  static thread_local std::vector<std::shared_ptr<Gate>> gates;
  static thread_local at::CallbackHandle handle;
  static thread_local bool running;

  static std::unique_ptr<at::ObserverContext> OnOperator(const at::RecordFunction& fn) {
    if (running || gates.empty()) return nullptr;
    running = true;
    thread_local std::vector<const c10::TensorImpl*> inputs;
    inputs.clear();
    OpInputTensors(fn, &inputs);
    // The list only changes in Add and Prune, never from in here (a step
    // that closes meanwhile only clears its gate's pointer).
    for (size_t k = 0; k < gates.size() && !inputs.empty(); ++k) {
      if (DistributedDataParallel* ddp = gates[k]->ddp.load()) ddp->BeforeOperator(inputs);
    }
    running = false;
    return nullptr;
  }

  static void Add(const std::shared_ptr<Gate>& gate) {
    if (std::find(gates.begin(), gates.end(), gate) == gates.end()) gates.push_back(gate);
    if (handle == 0) {
      handle = at::addThreadLocalCallback(at::RecordFunctionCallback(&OnOperator)
                                              .needsInputs(true)
                                              .scopes({at::RecordScope::FUNCTION}));
    }
  }

  // Drops the closed gates; the callback goes with the last one. Never
  // from inside OnOperator.
  static void Prune() {
    gates.erase(std::remove_if(gates.begin(), gates.end(),
                               [](const std::shared_ptr<Gate>& g) { return g->ddp.load() == nullptr; }),
                gates.end());
    if (gates.empty() && handle != 0) {
      at::removeCallback(handle);
      handle = 0;
    }
  }
};

thread_local std::vector<std::shared_ptr<DistributedDataParallel::Gate>> GateCallbacks::gates;
thread_local at::CallbackHandle GateCallbacks::handle = 0;
thread_local bool GateCallbacks::running = false;

Status DistributedDataParallel::Init() {
  if (root_ == nullptr) return absl::InvalidArgumentError("DDP: the module is empty (null)");
  if (comm_ == nullptr) return absl::InvalidArgumentError("DDP: communicator is null");
  if (options_.overlap_forward && !options_.overlap_optimizer) {
    return absl::InvalidArgumentError(
        "DDP: overlap_forward needs overlap_optimizer (the next forward overlaps the "
        "communication that OptimizerStep would otherwise wait for)");
  }
  // At most 1 TiB: the cap is cast to bytes.
  if (!(options_.bucket_cap_mb > 0) || !(options_.bucket_cap_mb <= 1024 * 1024)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DDP: bucket_cap_mb must be positive and at most 1048576 (1 TiB), got ",
        options_.bucket_cap_mb));
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
  RETURN_IF_ERROR(CheckRanksAgree(*comm_, state, opts, opts.timeout));
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
  reducer_options.defer_launches = opts.overlap_forward;
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
  if (deferred_ != nullptr &&
      (deferred_->thread != std::this_thread::get_id() || reducer_->rebuild_pending() ||
       BroadcastsBuffers())) {
    // No gate on this thread, a re-pack of the buckets, or a broadcast that
    // must not interleave with gradient_priority's launches: the step first.
    RETURN_IF_ERROR(CompletePendingStep());
  }
  // Before the broadcasts, which would fail on a communicator that aborted
  // since, with its error and not the step's.
  RETURN_IF_ERROR(reducer_->PreviousStepError());
  // The rebuild's and the buffers' broadcasts block on every peer.
  SetCollective(true, -1, "broadcast");
  Status s = reducer_->RebuildBucketsIfNeeded();
  if (s.ok() && BroadcastsBuffers()) {
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
  // overlap_forward: what forward did not reach of the open step.
  const Status pending = CompletePendingStep();
  forward_ms_ = MillisSince(forward_start_);
  sync_buffers_ = require_sync_ && torch::GradMode::is_enabled();
  RETURN_IF_ERROR(pending);
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
  sync_buffers_ = true;  // it stands for the training Forward the others run
  RETURN_IF_ERROR(CompletePendingStep());
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
  // overlap_forward: the step OptimizerStep left open ends now, in a later
  // forward; it reports what was counted up to that OptimizerStep.
  const DeferredStep* late = deferred_.get();
  ++steps_;
  synced_forward_ms_ = late ? late->counts.forward_ms : forward_ms_;
  if (progress_ != nullptr) {
    const MonoTime now = RealClock()->Now();
    const ReducerStepStats r = reducer_->last_stats();
    RecordBucketWaits(r);
    const StepCounts counts = late ? late->counts : CurrentCounts();
    StepProgress p;
    p.step = steps_;
    p.samples = counts.samples;
    if (counts.loss_known) p.loss = counts.loss;
    p.forward_ms = synced_forward_ms_;
    p.backward_ms = r.backward_ms;
    p.exposed_comm_ms = r.comm_exposed_ms;
    if (late) {
      // Its waits ran after it ended, inside the next forward, which counts
      // them (forward_ms is taken after CompletePendingStep): here they
      // would be counted twice, and its parts would outgrow its step.
      p.backward_ms = std::max(0.0, r.backward_ms - r.comm_exposed_ms);
      p.exposed_comm_ms = 0;
    }
    p.bytes_reduced = r.bytes_reduced;
    p.buckets = r.buckets;
    p.data_ms = counts.data_ms;
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
    if (late) {
      // The step ended when OptimizerStep returned (DeferStep moved
      // last_step_end_ there); its optimizer time is that call's.
      p.optimizer_ms = late->optimizer_ms;
      ReportStep(std::move(p), late->previous_end, late->end);
    } else if (optimizer_marked_) {
      pending_ = std::move(p);
      step_pending_ = true;
    } else {
      FinishStep(std::move(p), now);
    }
  }
  if (!late) {
    samples_pending_ = 0;
    loss_pending_ = 0;
    loss_known_ = true;
  }
  if (options_.on_step) options_.on_step(MakeStats(reducer_->last_stats()));
}

DistributedDataParallel::StepCounts DistributedDataParallel::CurrentCounts() const {
  StepCounts c;
  c.samples = samples_pending_;
  c.loss = loss_pending_;
  c.loss_known = loss_known_;
  c.forward_ms = forward_ms_;
  c.data_ms =
      forward_seen_ ? std::max(0.0, MillisBetween(last_step_end_, first_forward_start_)) : 0;
  return c;
}

void DistributedDataParallel::FinishStep(StepProgress p, MonoTime end) {
  // Wall clock from the previous step's end: data loading, the optimizer
  // and everything else the program does per step count.
  const MonoTime previous_end = last_step_end_;
  last_step_end_ = end;
  forward_seen_ = false;
  ReportStep(std::move(p), previous_end, end);
}

void DistributedDataParallel::ReportStep(StepProgress p, MonoTime previous_end, MonoTime end) {
  p.step_ms = std::max(0.0, MillisBetween(previous_end, end));
  p.samples_per_s = p.step_ms > 0 ? p.samples * 1000.0 / p.step_ms : 0;
  progress_->Report(p);
}

namespace {

// Each of the optimizer's groups split by the Reducer's buckets:
// parts[b][g] for bucket b, parts[buckets][g] the parameters DDP does not
// reduce.
using BucketParts = std::vector<std::vector<std::vector<torch::Tensor>>>;
BucketParts SplitByBucket(const Reducer& reducer, torch::optim::Optimizer& optimizer) {
  const std::vector<std::vector<size_t>> layout = reducer.bucket_indices();
  std::unordered_map<const c10::TensorImpl*, size_t> bucket_of;
  for (size_t b = 0; b < layout.size(); ++b) {
    for (size_t i : layout[b]) bucket_of[reducer.params()[i].tensor.unsafeGetTensorImpl()] = b;
  }
  auto& groups = optimizer.param_groups();
  BucketParts parts(layout.size() + 1, std::vector<std::vector<torch::Tensor>>(groups.size()));
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const torch::Tensor& p : groups[g].params()) {
      auto it = bucket_of.find(p.unsafeGetTensorImpl());
      parts[it == bucket_of.end() ? layout.size() : it->second][g].push_back(p);
    }
  }
  return parts;
}

// One optimizer step over `part` (its parameters per group) alone: the
// groups are narrowed to it, then restored, also when step() throws. The
// optimizer's state is keyed by tensor, so stepping the parts one after
// another is one step of the whole.
void StepPart(torch::optim::Optimizer& optimizer,
              const std::vector<std::vector<torch::Tensor>>& part) {
  bool any = false;
  for (const auto& params : part) any = any || !params.empty();
  if (!any) return;
  auto& groups = optimizer.param_groups();
  std::vector<std::vector<torch::Tensor>> all(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    all[g] = std::move(groups[g].params());
    groups[g].params() = part[g];
  }
  auto restore = [&] {
    for (size_t g = 0; g < groups.size(); ++g) groups[g].params() = std::move(all[g]);
  };
  try {
    optimizer.step();
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

}  // namespace

double DistributedDataParallel::StepOverlapped(torch::optim::Optimizer& optimizer) {
  const BucketParts parts = SplitByBucket(*reducer_, optimizer);
  std::exception_ptr thrown;
  auto step_part = [&](size_t b) {
    if (thrown) return;
    try {
      StepPart(optimizer, parts[b]);
    } catch (...) {
      thrown = std::current_exception();
    }
  };
  const Status s = reducer_->CompleteStep(step_part);
  if (s.ok()) step_part(parts.size() - 1);
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

// ---------------------------------------------------------------------------
// overlap_forward: the step OptimizerStep leaves open, and the gate.

DistributedDataParallel::~DistributedDataParallel() {
  if (gate_ != nullptr) {
    gate_->ddp.store(nullptr);
    if (gate_->thread == std::this_thread::get_id() && !GateCallbacks::running) {
      GateCallbacks::Prune();
    }
  }
  // An open step's buckets are waited for (not stepped) here, while the
  // members its end reports to are alive; the Reducer's destructor would
  // run after them.
  if (reducer_ != nullptr && reducer_->step_open()) (void)reducer_->CompleteStep(nullptr);
}

void DistributedDataParallel::DeferStep(torch::optim::Optimizer& optimizer, MonoTime start) {
  auto d = std::make_shared<DeferredStep>();
  d->optimizer = &optimizer;
  d->thread = std::this_thread::get_id();
  d->layout = reducer_->bucket_indices();
  d->parts = SplitByBucket(*reducer_, optimizer);
  const size_t buckets = d->layout.size();
  const auto& params = reducer_->params();
  for (size_t b = 0; b < buckets; ++b) {
    for (size_t i : d->layout[b]) {
      const torch::Tensor& param = params[i].tensor;
      d->bucket_of[param.unsafeGetTensorImpl()] = b;
      if (param.grad().defined()) {
        d->bucket_of[param.grad().unsafeGetTensorImpl()] = b;
        d->grads.push_back(param.grad());
      }
    }
  }
  d->done.assign(buckets, false);
  d->cleared.assign(params.size(), false);
  // The step's counts end here; the next forward counts for the next step.
  d->counts = CurrentCounts();
  samples_pending_ = 0;
  loss_pending_ = 0;
  loss_known_ = true;
  deferred_ = std::move(d);
  // The parameters DDP does not reduce have their final gradients now.
  StepDeferredPart(buckets);
  deferred_->previous_end = last_step_end_;
  deferred_->end = RealClock()->Now();
  deferred_->optimizer_ms = MillisBetween(start, deferred_->end);
  last_step_end_ = deferred_->end;
  forward_seen_ = false;
  if (gate_ != nullptr && gate_->thread != std::this_thread::get_id()) {
    gate_->ddp.store(nullptr);  // Left in another thread's list, closed.
    gate_ = nullptr;
  }
  if (gate_ == nullptr) {
    gate_ = std::make_shared<Gate>();
    gate_->thread = std::this_thread::get_id();
  }
  gate_->ddp.store(this);
  GateCallbacks::Add(gate_);
}

void DistributedDataParallel::StepDeferredPart(size_t b) {
  DeferredStep& d = *deferred_;
  if (!deferred_error_.ok()) return;  // The optimizer failed: no more steps.
  try {
    StepPart(*d.optimizer, d.parts[b]);
  } catch (const std::exception& e) {
    deferred_error_ = absl::InternalError(
        absl::StrCat("DDP: the optimizer threw while stepping bucket ", b, " (overlap_forward): ",
                     internal::ExceptionMessage(e)));
  }
  if (b >= d.layout.size()) return;
  d.done[b] = true;
  for (size_t i : d.layout[b]) {
    if (d.cleared[i]) reducer_->params()[i].tensor.mutable_grad().reset();
  }
}

void DistributedDataParallel::BeforeOperator(const std::vector<const c10::TensorImpl*>& inputs) {
  for (const c10::TensorImpl* impl : inputs) {
    if (deferred_ == nullptr || deferred_->busy) return;
    auto it = deferred_->bucket_of.find(impl);
    if (it != deferred_->bucket_of.end() && !deferred_->done[it->second]) {
      CompleteDeferred(static_cast<int>(it->second));
    }
  }
}

void DistributedDataParallel::CompleteDeferred(int through) {
  if (deferred_ == nullptr || deferred_->busy) return;
  DeferredStep& d = *deferred_;
  d.busy = true;
  // A gradient the program reset since OptimizerStep (zero_grad to
  // undefined) is written back for the step, then reset again.
  const auto& params = reducer_->params();
  for (size_t b : reducer_->pending_buckets()) {
    for (size_t i : d.layout[b]) d.cleared[i] = !params[i].tensor.grad().defined();
  }
  const Status s =
      reducer_->CompleteStep([this](size_t b) { StepDeferredPart(b); }, through);
  d.busy = false;
  if (!s.ok() && deferred_error_.ok()) deferred_error_ = s;
  if (!reducer_->step_open()) {
    deferred_.reset();
    if (gate_ != nullptr) gate_->ddp.store(nullptr);
  }
}

Status DistributedDataParallel::CompletePendingStep() {
  CompleteDeferred(-1);
  ReleaseGate();
  Status s = std::move(deferred_error_);
  deferred_error_ = absl::OkStatus();
  return s;
}

void DistributedDataParallel::ReleaseGate() {
  if (gate_ != nullptr && gate_->ddp.load() == nullptr &&
      gate_->thread == std::this_thread::get_id() && !GateCallbacks::running) {
    GateCallbacks::Prune();
  }
}

Status DistributedDataParallel::Backward(const torch::Tensor& loss) {
  // overlap_forward: a backward with no DDP forward since OptimizerStep
  // would accumulate into buckets still on the wire.
  if (deferred_ != nullptr) RETURN_IF_ERROR(CompletePendingStep());
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
