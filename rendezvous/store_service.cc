#include "rendezvous/store_service.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <deque>
#include <functional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "rendezvous/grpc_status.h"
#include "rendezvous/refusals.h"

namespace lockstep {
namespace rendezvous {
namespace {

using WaitValues = StatusOr<std::vector<std::string>>;

constexpr char kSessionMethod[] = "/lockstep.v1.StoreService/Session";

const Logger& StoreLog() {
  static const Logger log("store");
  return log;
}

// Logs a refusal (rendezvous/refusals.h) of "StoreService/<method>" on
// namespace `ns`.
void LogIfRefusedOn(const grpc::ServerContextBase& ctx, absl::string_view method,
                    absl::string_view ns, const Status& status) {
  if (!IsRefusal(status)) return;
  // A job's namespaces are "<job>/<round>": the line names that job.
  LogIfRefused(StoreLog(), ctx,
               absl::StrCat("StoreService/", method, " on namespace ", QuoteForError(ns)),
               StoreJobOf(ns), status);
}

}  // namespace

class StoreGrpcService::SessionSlot {
 public:
  SessionSlot(StoreGrpcService* service, std::string job)
      : service_(service), job_(std::move(job)) {}
  ~SessionSlot() { service_->ReleaseSessionSlot(job_); }
  SessionSlot(const SessionSlot&) = delete;
  SessionSlot& operator=(const SessionSlot&) = delete;

 private:
  StoreGrpcService* const service_;
  const std::string job_;
};

StatusOr<Duration> StoreWaitTimeout(int64_t timeout_ms) {
  if (timeout_ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat("store timeout_ms is negative: ", timeout_ms));
  }
  // Compared in milliseconds: converting 2^62 ms to nanoseconds first would
  // overflow into the past (an instant DeadlineExceeded).
  if (timeout_ms >= std::chrono::duration_cast<std::chrono::milliseconds>(kMaxStoreWait).count()) {
    return kMaxStoreWait;
  }
  return std::chrono::milliseconds(timeout_ms);
}

namespace {

// The core deadline of a wait: now + timeout_ms (clamped by
// StoreWaitTimeout), or the RPC's deadline if earlier. InvalidArgument for a
// negative timeout.
StatusOr<MonoTime> WaitDeadline(const StoreCore& core, int64_t timeout_ms,
                                std::chrono::system_clock::time_point rpc_deadline) {
  ASSIGN_OR_RETURN(Duration wait, StoreWaitTimeout(timeout_ms));
  if (rpc_deadline != std::chrono::system_clock::time_point::max()) {
    const auto by_rpc = rpc_deadline - std::chrono::system_clock::now();
    if (by_rpc < std::chrono::duration_cast<std::chrono::system_clock::duration>(wait)) {
      wait = std::max(Duration::zero(), std::chrono::duration_cast<Duration>(by_rpc));
    }
  }
  return core.clock()->Now() + wait;
}

std::vector<std::string> Keys(const google::protobuf::RepeatedPtrField<std::string>& keys) {
  return std::vector<std::string>(keys.begin(), keys.end());
}

std::vector<std::pair<std::string, std::string>> Entries(const v1::StoreMultiSetRequest& request) {
  std::vector<std::pair<std::string, std::string>> entries;
  entries.reserve(request.entries_size());
  for (const auto& entry : request.entries()) entries.emplace_back(entry.key(), entry.value());
  return entries;
}

Status DoAdd(StoreCore* core, const v1::StoreAddRequest& request, v1::StoreAddResponse* out) {
  ASSIGN_OR_RETURN(int64_t value, core->Add(request.namespace_(), request.key(), request.delta()));
  out->set_value(value);
  return absl::OkStatus();
}

Status DoCompareSet(StoreCore* core, const v1::StoreCompareSetRequest& request,
                    v1::StoreCompareSetResponse* out) {
  if (request.expect_absent() && !request.expected().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("CompareSet on store key ", QuoteForError(request.key()),
                                                   ": expect_absent with a non-empty expected"));
  }
  ASSIGN_OR_RETURN(CompareSetResult result,
                   core->CompareSet(request.namespace_(), request.key(), request.expected(),
                                    request.desired(), request.expect_absent()));
  out->set_swapped(result.swapped);
  out->set_current(std::move(result.current));
  return absl::OkStatus();
}

Status DoDelete(StoreCore* core, const v1::StoreDeleteRequest& request,
                v1::StoreDeleteResponse* out) {
  ASSIGN_OR_RETURN(bool deleted, core->Delete(request.namespace_(), request.key()));
  out->set_deleted(deleted);
  return absl::OkStatus();
}

Status DoNumKeys(StoreCore* core, const v1::StoreNumKeysRequest& request,
                 v1::StoreNumKeysResponse* out) {
  ASSIGN_OR_RETURN(int64_t n, core->NumKeys(request.namespace_()));
  out->set_num_keys(n);
  return absl::OkStatus();
}

// A unary RPC that parks in the core until its keys exist: completed from
// the core's callback; a client cancel removes the waiter.
class WaitReactor : public grpc::ServerUnaryReactor {
 public:
  using Fill = std::function<void(std::vector<std::string>&)>;

  WaitReactor(StoreCore* core, grpc::CallbackServerContext* ctx, const std::string& ns,
              const std::vector<std::string>& keys, int64_t timeout_ms, bool want_values,
              Fill fill)
      : core_(core) {
    auto deadline = WaitDeadline(*core, timeout_ms, ctx->deadline());
    if (!deadline.ok()) {
      Finish(ToGrpcStatus(deadline.status()));
      return;
    }
    id_ = core_->WaitAsync(ns, keys, *deadline, want_values,
                           [this, fill = std::move(fill)](WaitValues result) {
                             if (result.ok()) fill(*result);
                             Finish(ToGrpcStatus(result.status()));
                           });
  }

  void OnCancel() override {
    if (id_ != 0 && core_->CancelWait(id_)) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "store wait cancelled by the client"));
    }
  }
  void OnDone() override { delete this; }

 private:
  StoreCore* const core_;
  StoreCore::WaitId id_ = 0;  // set in the constructor, before gRPC binds us
};

// One client's long-lived stream. Operations are read one at a time and
// executed at once; results are written in completion order (ids let the
// client match them). Blocking operations park in the core and write their
// result from the core's callback.
//
// Lifetime: Finish is called once reads are over (client done or gone, or
// bytes that are no StoreOp), no waiter of this stream can still call back,
// and the write queue is drained; OnDone, after Finish, deletes the reactor.
//
// Ops arrive as bytes and are parsed here (see "Malformed ops" in the
// header); results are serialized here as they are written.
class SessionReactor : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  SessionReactor(StoreCore* core, const StoreAuthorizer* authorizer,
                 grpc::CallbackServerContext* ctx,
                 std::unique_ptr<StoreGrpcService::SessionSlot> slot, size_t max_queued,
                 RateLimiter* refused_op_log)
      : core_(core), authorizer_(authorizer), ctx_(ctx), slot_(std::move(slot)),
        max_queued_(std::max<size_t>(max_queued, 1)), refused_op_log_(refused_op_log) {
    StartRead(&read_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      CancelWaits();
      return;
    }
    if (!grpc::SerializationTraits<v1::StoreOp>::Deserialize(&read_, &op_).ok()) {
      {
        MutexLock lock(&mu_);
        finish_status_ = grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("malformed request: bytes sent on ", kSessionMethod,
                         " do not parse as ", v1::StoreOp::descriptor()->full_name(),
                         "; the stream ends"));
      }
      CancelWaits();
      return;
    }
    Execute(op_);
    {
      // A client that does not read its results: stop taking ops until the
      // queue drains (OnWriteDone resumes), rather than queue without end.
      MutexLock lock(&mu_);
      if (queue_.size() >= max_queued_) {
        read_paused_ = true;
        return;
      }
    }
    StartRead(&read_);
  }

  void OnWriteDone(bool ok) override {
    mu_.Lock();
    if (!ok) {
      write_failed_ = true;
      queue_.clear();
    }
    // Paused reads resume once half the queue is written (or the client is
    // gone: the read then fails and ends the stream). Finish cannot come
    // first: it needs the reads over, and none is posted while paused.
    const bool resume = read_paused_ && queue_.size() <= max_queued_ / 2;
    if (resume) read_paused_ = false;
    if (queue_.empty()) {
      writing_ = false;
      MaybeFinishLocked();
      if (resume) StartRead(&read_);
      return;
    }
    v1::StoreOpResult next = std::move(queue_.front());
    queue_.pop_front();
    mu_.Unlock();
    if (resume) StartRead(&read_);
    Write(next);
  }

  void OnDone() override { delete this; }

 private:
  // `op` is the reactor's read buffer: values are moved out of it.
  void Execute(v1::StoreOp& op) {
    v1::StoreOpResult result;
    result.set_id(op.id());
    Status status = AuthorizeOp(op);
    if (!status.ok()) {
      LogRefusedOp(op, status);
      Complete(std::move(result), status);
      return;
    }
    switch (op.op_case()) {
      case v1::StoreOp::kSet:
        status = core_->Set(op.set().namespace_(), op.set().key(),
                            std::move(*op.mutable_set()->mutable_value()));
        break;
      case v1::StoreOp::kAdd:
        status = DoAdd(core_, op.add(), result.mutable_add());
        break;
      case v1::StoreOp::kCompareSet:
        status = DoCompareSet(core_, op.compare_set(), result.mutable_compare_set());
        break;
      case v1::StoreOp::kDelete:
        status = DoDelete(core_, op.delete_(), result.mutable_delete_());
        break;
      case v1::StoreOp::kNumKeys:
        status = DoNumKeys(core_, op.num_keys(), result.mutable_num_keys());
        break;
      case v1::StoreOp::kMultiSet:
        status = core_->MultiSet(op.multi_set().namespace_(), Entries(op.multi_set()));
        break;
      case v1::StoreOp::kGet:
        StartWait(op.id(), op.get().namespace_(), {op.get().key()}, op.get().timeout_ms(),
                  v1::StoreOp::kGet);
        return;
      case v1::StoreOp::kWait:
        StartWait(op.id(), op.wait().namespace_(), Keys(op.wait().keys()), op.wait().timeout_ms(),
                  v1::StoreOp::kWait);
        return;
      case v1::StoreOp::kMultiGet:
        StartWait(op.id(), op.multi_get().namespace_(), Keys(op.multi_get().keys()),
                  op.multi_get().timeout_ms(), v1::StoreOp::kMultiGet);
        return;
      case v1::StoreOp::OP_NOT_SET:
        status = absl::InvalidArgumentError(
            absl::StrCat("store op ", op.id(), " carries no operation"));
        break;
    }
    if (!status.ok()) result.clear_result();
    LogRefusedOp(op, status);
    Complete(std::move(result), status);
  }

  // A refused op is logged at most every 10 s over all of the service's
  // Session streams (StoreGrpcService::refused_op_log_).
  void LogRefusedOp(const v1::StoreOp& op, const Status& status) const {
    if (IsRefusal(status) && refused_op_log_->Allow()) {
      LogIfRefusedOn(*ctx_, "Session", OpNamespace(op), status);
    }
  }

  // The namespace an op names; ops without one are checked against "".
  static const std::string& OpNamespace(const v1::StoreOp& op) {
    static const std::string kNone;
    switch (op.op_case()) {
      case v1::StoreOp::kSet: return op.set().namespace_();
      case v1::StoreOp::kAdd: return op.add().namespace_();
      case v1::StoreOp::kCompareSet: return op.compare_set().namespace_();
      case v1::StoreOp::kDelete: return op.delete_().namespace_();
      case v1::StoreOp::kNumKeys: return op.num_keys().namespace_();
      case v1::StoreOp::kMultiSet: return op.multi_set().namespace_();
      case v1::StoreOp::kGet: return op.get().namespace_();
      case v1::StoreOp::kWait: return op.wait().namespace_();
      case v1::StoreOp::kMultiGet: return op.multi_get().namespace_();
      case v1::StoreOp::OP_NOT_SET: break;
    }
    return kNone;
  }

  Status AuthorizeOp(const v1::StoreOp& op) const {
    if (authorizer_ == nullptr || !*authorizer_) return absl::OkStatus();
    if (op.op_case() == v1::StoreOp::OP_NOT_SET) return absl::OkStatus();
    return (*authorizer_)(ctx_->client_metadata(), OpNamespace(op));
  }

  void StartWait(uint64_t op_id, const std::string& ns, const std::vector<std::string>& keys,
                 int64_t timeout_ms, v1::StoreOp::OpCase kind) {
    auto deadline = WaitDeadline(*core_, timeout_ms, ctx_->deadline());
    v1::StoreOpResult result;
    result.set_id(op_id);
    if (!deadline.ok()) {
      Complete(std::move(result), deadline.status());
      return;
    }
    uint64_t seq;
    {
      MutexLock lock(&mu_);
      seq = next_seq_++;
      waits_[seq] = 0;
    }
    StoreCore::WaitId id = core_->WaitAsync(
        ns, keys, *deadline, kind != v1::StoreOp::kWait,
        [this, seq, op_id, kind](WaitValues values) {
          v1::StoreOpResult result;
          result.set_id(op_id);
          if (values.ok()) {
            if (kind == v1::StoreOp::kGet) {
              result.mutable_get()->set_value(std::move((*values)[0]));
            } else if (kind == v1::StoreOp::kMultiGet) {
              for (std::string& v : *values) result.mutable_multi_get()->add_values(std::move(v));
            }
          }
          mu_.Lock();
          waits_.erase(seq);
          EnqueueLocked(std::move(result), values.status());
        });
    MutexLock lock(&mu_);
    auto it = waits_.find(seq);
    if (it != waits_.end()) it->second = id;
  }

  // The client is done or gone: cancel its parked waits (their results
  // could not be delivered), then finish once nothing is in flight.
  void CancelWaits() {
    std::vector<std::pair<uint64_t, StoreCore::WaitId>> waits;
    {
      MutexLock lock(&mu_);
      reads_done_ = true;
      waits.assign(waits_.begin(), waits_.end());
    }
    for (const auto& [seq, id] : waits) {
      if (core_->CancelWait(id)) {
        MutexLock lock(&mu_);
        waits_.erase(seq);
      }
    }
    mu_.Lock();
    MaybeFinishLocked();
  }

  void Complete(v1::StoreOpResult result, const Status& status) {
    mu_.Lock();
    EnqueueLocked(std::move(result), status);
  }

  // Queues a result and starts writing if idle. Releases mu_.
  void EnqueueLocked(v1::StoreOpResult result, const Status& status) ABSL_UNLOCK_FUNCTION(mu_) {
    result.set_store_incarnation(core_->incarnation());
    if (!status.ok()) {
      result.set_code(static_cast<int32_t>(status.code()));
      result.set_message(std::string(status.message()));
    }
    if (write_failed_) {
      MaybeFinishLocked();
      return;
    }
    if (writing_) {
      queue_.push_back(std::move(result));
      mu_.Unlock();
      return;
    }
    writing_ = true;
    mu_.Unlock();
    Write(result);
  }

  // Serializes `result` into current_ and writes it. REQUIRES: this thread
  // set writing_ (current_ is free).
  void Write(const v1::StoreOpResult& result) {
    bool own_buffer = false;
    current_.Clear();  // the last write's bytes
    // Results are bounded (kMaxValueBytes, kMaxMultiGetBytes), far under
    // protobuf's 2 GiB, the only way serializing one fails.
    const grpc::Status serialized =
        grpc::SerializationTraits<v1::StoreOpResult>::Serialize(result, &current_, &own_buffer);
    assert(serialized.ok());
    (void)serialized;
    StartWrite(&current_);
  }

  // Finishes the stream if nothing is left to do. Releases mu_.
  void MaybeFinishLocked() ABSL_UNLOCK_FUNCTION(mu_) {
    bool finish = reads_done_ && waits_.empty() && !writing_ && queue_.empty() && !finished_;
    if (finish) finished_ = true;
    const grpc::Status status = finish_status_;
    mu_.Unlock();
    if (finish) Finish(status);
  }

  StoreCore* const core_;
  const StoreAuthorizer* const authorizer_;  // the service's; may hold no function
  grpc::CallbackServerContext* const ctx_;
  const std::unique_ptr<StoreGrpcService::SessionSlot> slot_;  // released with the reactor
  const size_t max_queued_;  // results queued before reads pause
  RateLimiter* const refused_op_log_;  // the service's; outlives every stream
  // The read in progress and the op parsed from it; only touched by the read
  // chain.
  grpc::ByteBuffer read_;
  v1::StoreOp op_;

  Mutex mu_;
  std::unordered_map<uint64_t, StoreCore::WaitId> waits_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<v1::StoreOpResult> queue_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer current_;  // the write in flight; owned by whoever set writing_
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // What the stream ends with: OK, or INVALID_ARGUMENT for bytes that are no
  // StoreOp.
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);
};

// A Session refused when it opened: finished at once, holding nothing.
class RefusedSession : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit RefusedSession(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// A unary reactor finished at once with `status`, a refusal logged.
grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx, absl::string_view method,
                                 absl::string_view ns, const Status& status) {
  LogIfRefusedOn(*ctx, method, ns, status);
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

Status StoreGrpcService::Authorize(const grpc::CallbackServerContext& ctx,
                                   absl::string_view ns) const {
  if (!authorizer_) return absl::OkStatus();
  return authorizer_(ctx.client_metadata(), ns);
}

#define LOCKSTEP_STORE_AUTHORIZE(method, ns)                             \
  do {                                                                   \
    Status auth_status = Authorize(*ctx, (ns));                          \
    if (!auth_status.ok()) return Answer(ctx, (method), (ns), auth_status); \
  } while (0)

grpc::ServerUnaryReactor* StoreGrpcService::Set(grpc::CallbackServerContext* ctx,
                                                const v1::StoreSetRequest* request,
                                                v1::StoreSetResponse* response) {
  LOCKSTEP_STORE_AUTHORIZE("Set", request->namespace_());
  return Answer(ctx, "Set", request->namespace_(),
                core_->Set(request->namespace_(), request->key(), request->value()));
}

grpc::ServerUnaryReactor* StoreGrpcService::Get(grpc::CallbackServerContext* ctx,
                                                const v1::StoreGetRequest* request,
                                                v1::StoreGetResponse* response) {
  LOCKSTEP_STORE_AUTHORIZE("Get", request->namespace_());
  return new WaitReactor(core_, ctx, request->namespace_(), {request->key()},
                         request->timeout_ms(), true,
                         [response](std::vector<std::string>& values) {
                           response->set_value(std::move(values[0]));
                         });
}

grpc::ServerUnaryReactor* StoreGrpcService::Add(grpc::CallbackServerContext* ctx,
                                                const v1::StoreAddRequest* request,
                                                v1::StoreAddResponse* response) {
  LOCKSTEP_STORE_AUTHORIZE("Add", request->namespace_());
  return Answer(ctx, "Add", request->namespace_(), DoAdd(core_, *request, response));
}

grpc::ServerUnaryReactor* StoreGrpcService::CompareSet(grpc::CallbackServerContext* ctx,
                                                       const v1::StoreCompareSetRequest* request,
                                                       v1::StoreCompareSetResponse* response) {
  LOCKSTEP_STORE_AUTHORIZE("CompareSet", request->namespace_());
  return Answer(ctx, "CompareSet", request->namespace_(),
                DoCompareSet(core_, *request, response));
}

grpc::ServerUnaryReactor* StoreGrpcService::Delete(grpc::CallbackServerContext* ctx,
                                                   const v1::StoreDeleteRequest* request,
                                                   v1::StoreDeleteResponse* response) {
  LOCKSTEP_STORE_AUTHORIZE("Delete", request->namespace_());
  return Answer(ctx, "Delete", request->namespace_(), DoDelete(core_, *request, response));
}

grpc::ServerUnaryReactor* StoreGrpcService::Wait(grpc::CallbackServerContext* ctx,
                                                 const v1::StoreWaitRequest* request,
                                                 v1::StoreWaitResponse* response) {
  LOCKSTEP_STORE_AUTHORIZE("Wait", request->namespace_());
  return new WaitReactor(core_, ctx, request->namespace_(), Keys(request->keys()),
                         request->timeout_ms(), false, [](std::vector<std::string>&) {});
}

grpc::ServerUnaryReactor* StoreGrpcService::NumKeys(grpc::CallbackServerContext* ctx,
                                                    const v1::StoreNumKeysRequest* request,
                                                    v1::StoreNumKeysResponse* response) {
  LOCKSTEP_STORE_AUTHORIZE("NumKeys", request->namespace_());
  return Answer(ctx, "NumKeys", request->namespace_(), DoNumKeys(core_, *request, response));
}

grpc::ServerUnaryReactor* StoreGrpcService::MultiGet(grpc::CallbackServerContext* ctx,
                                                     const v1::StoreMultiGetRequest* request,
                                                     v1::StoreMultiGetResponse* response) {
  LOCKSTEP_STORE_AUTHORIZE("MultiGet", request->namespace_());
  return new WaitReactor(core_, ctx, request->namespace_(), Keys(request->keys()),
                         request->timeout_ms(), true,
                         [response](std::vector<std::string>& values) {
                           for (std::string& v : values) response->add_values(std::move(v));
                         });
}

grpc::ServerUnaryReactor* StoreGrpcService::MultiSet(grpc::CallbackServerContext* ctx,
                                                     const v1::StoreMultiSetRequest* request,
                                                     v1::StoreMultiSetResponse* response) {
  LOCKSTEP_STORE_AUTHORIZE("MultiSet", request->namespace_());
  return Answer(ctx, "MultiSet", request->namespace_(),
                core_->MultiSet(request->namespace_(), Entries(*request)));
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StoreGrpcService::Session(
    grpc::CallbackServerContext* ctx) {
  std::string job;
  auto it = ctx->client_metadata().find(kStoreJobMetadata);
  if (it != ctx->client_metadata().end()) job.assign(it->second.data(), it->second.size());
  // The job is "<job>" of what the client names ("<job>/..." too), as
  // authorization reads it; its stream cap counts under that name, so a
  // job's token naming "<job>/1", "<job>/2", ... gets no slot per name.
  job = StoreJobOf(job);
  // Checked as the job's namespaces ("<job>/*"): each op is checked again
  // against its own namespace.
  const std::string ns = job.empty() ? job : job + "/*";
  Status status = Authorize(*ctx, ns);
  if (!status.ok()) {
    LogIfRefusedOn(*ctx, "Session", ns, status);
    return new RefusedSession(ToGrpcStatus(status));
  }
  auto slot = AcquireSessionSlot(job);
  if (!slot.ok()) {
    LogIfRefusedOn(*ctx, "Session", ns, slot.status());
    return new RefusedSession(ToGrpcStatus(slot.status()));
  }
  return new SessionReactor(core_, &authorizer_, ctx, std::move(*slot), limits_.max_queued_results,
                            &refused_op_log_);
}

StatusOr<std::unique_ptr<StoreGrpcService::SessionSlot>> StoreGrpcService::AcquireSessionSlot(
    const std::string& job) {
  MutexLock lock(&sessions_mu_);
  int& of_job = sessions_by_job_[job];
  if (of_job >= limits_.max_sessions_per_job) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "store: job ", QuoteForError(job), " already has ", of_job,
        " Session streams open; kMaxSessionsPerJob=", limits_.max_sessions_per_job));
  }
  if (sessions_ >= limits_.max_sessions) {
    if (of_job == 0) sessions_by_job_.erase(job);
    return absl::ResourceExhaustedError(absl::StrCat(
        "store: ", sessions_, " Session streams open in all; kMaxSessions=", limits_.max_sessions));
  }
  ++of_job;
  ++sessions_;
  return std::make_unique<SessionSlot>(this, job);
}

void StoreGrpcService::ReleaseSessionSlot(const std::string& job) {
  MutexLock lock(&sessions_mu_);
  auto it = sessions_by_job_.find(job);
  if (it != sessions_by_job_.end() && --it->second <= 0) sessions_by_job_.erase(it);
  --sessions_;
}

int StoreGrpcService::NumSessions() const {
  MutexLock lock(&sessions_mu_);
  return sessions_;
}

#undef LOCKSTEP_STORE_AUTHORIZE

}  // namespace rendezvous
}  // namespace lockstep
