#include "rendezvous/store_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <thread>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "lockstep/v1/store.grpc.pb.h"
#include "rendezvous/grpc_limits.h"
#include "rendezvous/grpc_status.h"
#include "rendezvous/store_core.h"
#include "rendezvous/tls.h"

namespace lockstep {
namespace rendezvous {
namespace {

using SteadyTime = std::chrono::steady_clock::time_point;

// Longest wait a client passes on (keeps deadline arithmetic from overflowing).

// Room an op must leave under kMaxGrpcMessageBytes for the fields Run sets
// after checking its size: the id and a wait's timeout_ms (a tag and a
// varint of at most 10 bytes each).
constexpr size_t kOpHeadroomBytes = 64;

// An op gRPC would refuse to send (over kMaxGrpcMessageBytes) is refused
// here instead, naming its size and the limit: sent, it would end the whole
// Session and fail every other caller's op in flight on it.
Status CheckMessageSize(const v1::StoreOp& op, const char* what, const std::string& key) {
  const size_t size = op.ByteSizeLong();
  if (size + kOpHeadroomBytes <= static_cast<size_t>(kMaxGrpcMessageBytes)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, " (first store key '", key, "') is ", size,
      " bytes encoded, over gRPC's message limit kMaxGrpcMessageBytes=", kMaxGrpcMessageBytes,
      " less ", kOpHeadroomBytes, " bytes of headroom; nothing was sent"));
}

std::chrono::system_clock::time_point ToSystem(SteadyTime t) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             t - std::chrono::steady_clock::now());
}

// One StoreService.Session stream on its own completion queue. There is no
// reader thread: a caller waiting for its result becomes the *poller* (one at
// a time) and drives the queue with AsyncNext until its own deadline,
// handing other callers' results to them; the rest (*followers*) wait on cv_
// until their result arrives or the poller role is free. With one operation
// in flight, the calling thread sends and receives itself: no thread hop,
// which is most of the cost of a round trip on a small machine.
//
// Outstanding gRPC operations: at most one Read (always re-posted), one
// Write (more ops queue in write_queue_), then one Finish. Once broken, a
// session stays broken; the client replaces it.
class Session {
 public:
  // `token`: when not empty, sent as `authorization: Bearer <token>`.
  // `ns`: the namespace the ops use; its job is named at open
  // (kStoreJobMetadata) so the server checks the token before it keeps the
  // stream.
  Session(v1::StoreService::Stub* stub, const std::string& address, const std::string& token,
          const std::string& ns)
      : address_(address) {
    if (!token.empty()) ctx_.AddMetadata("authorization", "Bearer " + token);
    ctx_.AddMetadata(kStoreJobMetadata, StoreJobOf(ns));
    stream_ = stub->PrepareAsyncSession(&ctx_, &cq_);
    MutexLock lock(&mu_);
    stream_->StartCall(&start_tag_);
    start_outstanding_ = true;
    stream_->Read(&incoming_, &read_tag_);
    read_outstanding_ = true;
  }

  ~Session() {
    ctx_.TryCancel();
    {
      MutexLock lock(&mu_);
      while (start_outstanding_ || read_outstanding_ || write_outstanding_ ||
             finish_outstanding_) {
        void* tag;
        bool ok;
        mu_.Unlock();
        bool got = cq_.Next(&tag, &ok);
        mu_.Lock();
        if (!got) break;
        HandleLocked(tag, ok);
      }
    }
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  bool broken() {
    MutexLock lock(&mu_);
    return broken_ || closing_;
  }

  // Sends `op` and waits for its result until `deadline`. Transport errors:
  // Unavailable (stream broken; *sent says whether the op may have reached
  // the server), DeadlineExceeded (no reply in time).
  StatusOr<v1::StoreOpResult> Call(const v1::StoreOp& op, SteadyTime deadline, bool* sent) {
    Pending pending;
    MutexLock lock(&mu_);
    *sent = false;
    // Take in completions that arrived while nobody polled (a server that
    // went away since the last call), so such an op is not sent into a dead
    // stream and reported as maybe-applied.
    while (!polling_ && !broken_) {
      void* tag;
      bool ok;
      auto status = cq_.AsyncNext(&tag, &ok, std::chrono::system_clock::time_point());
      if (status != grpc::CompletionQueue::GOT_EVENT) break;
      HandleLocked(tag, ok);
    }
    if (closing_ && !broken_) {
      // The stream ended; its final status (a refusal says why) is on its way.
      DrainUntilBrokenLocked(deadline);
    }
    if (broken_ || closing_) return broken_ ? broken_status_ : ClosingStatusLocked();
    pending_[op.id()] = &pending;
    if (write_outstanding_ || start_outstanding_) {  // StartCall shares the write op set
      write_queue_.push_back(op);
    } else {
      stream_->Write(op, &write_tag_);
      write_outstanding_ = true;
    }
    *sent = true;
    while (!pending.done) {
      if (!polling_) {
        if (!PollOnceLocked(deadline) && !pending.done) break;
      } else if (cv_.WaitWithDeadline(&mu_, deadline) && !pending.done && polling_) {
        break;  // timed out, still waiting on another caller's poll
      }
    }
    if (!pending.done) {
      pending_.erase(op.id());
      // Unavailable, not DeadlineExceeded: that is the server's answer for
      // keys that never came, which callers act on (a rank that never
      // arrived); a server that does not answer says nothing of any rank.
      return absl::UnavailableError(
          absl::StrCat("store server at ", address_, " did not answer op ", op.id(), " in time"));
    }
    return std::move(pending.result);
  }

 private:
  // An op awaiting its result; on the caller's stack, touched under mu_.
  struct Pending {
    bool done = false;
    StatusOr<v1::StoreOpResult> result;
  };

  void HandleLocked(void* tag, bool ok) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (tag == &start_tag_) {
      start_outstanding_ = false;
      if (!ok) {
        BreakLocked("could not start the stream");
      } else if (!write_queue_.empty()) {
        stream_->Write(write_queue_.front(), &write_tag_);
        write_queue_.pop_front();
        write_outstanding_ = true;
      }
    } else if (tag == &read_tag_) {
      read_outstanding_ = false;
      if (ok) {
        auto it = pending_.find(incoming_.id());
        if (it != pending_.end()) {  // else its caller gave up
          it->second->result = std::move(incoming_);
          it->second->done = true;
          pending_.erase(it);
        }
        incoming_.Clear();
        stream_->Read(&incoming_, &read_tag_);
        read_outstanding_ = true;
      } else {
        CloseLocked();
      }
    } else if (tag == &write_tag_) {
      write_outstanding_ = false;
      if (!ok) {
        CloseLocked();
      } else if (!write_queue_.empty() && !broken_ && !closing_) {
        stream_->Write(write_queue_.front(), &write_tag_);
        write_queue_.pop_front();
        write_outstanding_ = true;
      }
    } else if (tag == &finish_tag_) {
      finish_outstanding_ = false;
      if (closing_ && !broken_) {
        BreakLocked(FinalStatusLocked());
      } else if (!finish_status_.ok()) {
        broken_status_ = absl::UnavailableError(absl::StrCat(
            "store server at ", address_, ": stream broken: ", finish_status_.error_message()));
      }
    }
    MaybeFinishLocked();
  }

  // The read or a write failed: the stream is over. Its pending ops wait
  // for the server's final status, which Finish fetches, so a stream the
  // server refused (a bad token, a limit) fails them with the reason and
  // its code, not a bare "stream closed".
  void CloseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    closing_ = true;
    write_queue_.clear();
  }

  // What the server finished a closed stream with: a refusal keeps its code
  // (the client does not retry those); anything else is Unavailable.
  Status FinalStatusLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    switch (finish_status_.error_code()) {
      case grpc::StatusCode::UNAUTHENTICATED:
      case grpc::StatusCode::PERMISSION_DENIED:
      case grpc::StatusCode::RESOURCE_EXHAUSTED:
      case grpc::StatusCode::INVALID_ARGUMENT:
      case grpc::StatusCode::FAILED_PRECONDITION:
        return Status(static_cast<absl::StatusCode>(finish_status_.error_code()),
                      absl::StrCat("store server at ", address_, " refused the session: ",
                                   finish_status_.error_message()));
      case grpc::StatusCode::OK:
        return absl::UnavailableError(absl::StrCat("store server at ", address_, ": stream closed"));
      default:
        return absl::UnavailableError(absl::StrCat(
            "store server at ", address_, ": stream broken: ", finish_status_.error_message()));
    }
  }

  Status ClosingStatusLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return absl::UnavailableError(
        absl::StrCat("store server at ", address_, ": stream closed, no final status in time"));
  }

  // Takes the poller role and waits for one completion until `deadline`,
  // with mu_ released meanwhile; false when none came. REQUIRES: !polling_.
  bool PollOnceLocked(SteadyTime deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    polling_ = true;
    mu_.Unlock();
    void* tag;
    bool ok;
    auto status = cq_.AsyncNext(&tag, &ok, ToSystem(deadline));
    mu_.Lock();
    polling_ = false;
    const bool got = status == grpc::CompletionQueue::GOT_EVENT;
    if (got) HandleLocked(tag, ok);
    cv_.SignalAll();  // results handed over, and the poller role is free
    return got;
  }

  // Polls the queue (when no other caller does) until the stream's final
  // status has arrived or `deadline` passes.
  void DrainUntilBrokenLocked(SteadyTime deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!broken_ && std::chrono::steady_clock::now() < deadline) {
      if (!polling_) {
        if (!PollOnceLocked(deadline)) return;
      } else {
        cv_.WaitWithDeadline(&mu_, deadline);
      }
    }
  }

  void BreakLocked(const char* why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    BreakLocked(absl::UnavailableError(absl::StrCat("store server at ", address_, ": ", why)));
  }
  void BreakLocked(Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!broken_) {
      broken_ = true;
      broken_status_ = std::move(status);
    }
    for (auto& [id, pending] : pending_) {
      pending->result = broken_status_;
      pending->done = true;
    }
    pending_.clear();
    write_queue_.clear();
  }

  // Finish once the read side is over and nothing else is outstanding.
  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if ((broken_ || closing_) && !finish_called_ && !start_outstanding_ && !read_outstanding_ &&
        !write_outstanding_) {
      finish_called_ = true;
      finish_outstanding_ = true;
      stream_->Finish(&finish_status_, &finish_tag_);
    }
  }

  const std::string address_;
  grpc::ClientContext ctx_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::ClientAsyncReaderWriterInterface<v1::StoreOp, v1::StoreOpResult>> stream_;
  // Tags: their addresses identify completions.
  char start_tag_ = 0, read_tag_ = 0, write_tag_ = 0, finish_tag_ = 0;

  Mutex mu_;
  CondVar cv_;  // a result was handed over, or the poller role is free
  std::unordered_map<uint64_t, Pending*> pending_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::StoreOp> write_queue_ ABSL_GUARDED_BY(mu_);
  v1::StoreOpResult incoming_;  // the posted Read's target
  grpc::Status finish_status_;
  bool polling_ ABSL_GUARDED_BY(mu_) = false;
  bool start_outstanding_ ABSL_GUARDED_BY(mu_) = false;
  bool read_outstanding_ ABSL_GUARDED_BY(mu_) = false;
  bool write_outstanding_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_outstanding_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  // The stream is over but its final status has not arrived yet.
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  Status broken_status_ ABSL_GUARDED_BY(mu_);
};

class GrpcStore : public Store {
 public:
  GrpcStore(std::string address, std::string ns, StoreClientOptions options)
      : address_(std::move(address)), ns_(std::move(ns)), options_(options) {
    grpc::ChannelArguments args = LockstepChannelArguments();
    // Our own TCP connection, not one shared with other clients in-process.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    int backoff_ms = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(options.initial_backoff).count());
    int max_backoff_ms = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(options.max_backoff).count());
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::max(backoff_ms, 1));
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, std::max(backoff_ms, 1));
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, std::max(max_backoff_ms, 1));
    channel_ = grpc::CreateCustomChannel(address_, LockstepChannelCredentials(), args);
    stub_ = v1::StoreService::NewStub(channel_);
  }

  ~GrpcStore() override {
    std::shared_ptr<Session> session;  // drained outside the lock
    MutexLock lock(&session_mu_);
    session = std::move(session_);
  }

  Status Connect(Duration timeout) {
    SteadyTime deadline = std::chrono::steady_clock::now() + std::min(timeout, kMaxStoreWait);
    return AcquireSession(deadline).status();
  }

  Status Set(const std::string& key, const std::string& value) override {
    RETURN_IF_ERROR(ValidateKey(key));
    RETURN_IF_ERROR(ValidateValue(key, value));
    v1::StoreOp op;
    auto* set = op.mutable_set();
    set->set_namespace_(ns_);
    set->set_key(key);
    set->set_value(value);
    return Run(op, Duration::zero(), /*idempotent=*/true, nullptr, "Set", key).status();
  }

  StatusOr<std::string> Get(const std::string& key, Duration timeout) override {
    RETURN_IF_ERROR(ValidateKey(key));
    v1::StoreOp op;
    op.mutable_get()->set_namespace_(ns_);
    op.mutable_get()->set_key(key);
    ASSIGN_OR_RETURN(v1::StoreOpResult result,
                     Run(op, timeout, true,
                         [](v1::StoreOp& o, int64_t ms) { o.mutable_get()->set_timeout_ms(ms); },
                         "Get", key));
    return std::move(*result.mutable_get()->mutable_value());
  }

  StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    RETURN_IF_ERROR(ValidateKey(key));
    v1::StoreOp op;
    op.mutable_add()->set_namespace_(ns_);
    op.mutable_add()->set_key(key);
    op.mutable_add()->set_delta(delta);
    ASSIGN_OR_RETURN(v1::StoreOpResult result,
                     Run(op, Duration::zero(), /*idempotent=*/false, nullptr, "Add", key));
    return result.add().value();
  }

  StatusOr<std::string> CompareSet(const std::string& key, const std::string& expected,
                                   const std::string& desired) override {
    RETURN_IF_ERROR(ValidateKey(key));
    RETURN_IF_ERROR(ValidateExpected(key, expected));
    RETURN_IF_ERROR(ValidateValue(key, desired));
    v1::StoreOp op;
    auto* cas = op.mutable_compare_set();
    cas->set_namespace_(ns_);
    cas->set_key(key);
    cas->set_expected(expected);
    cas->set_desired(desired);
    ASSIGN_OR_RETURN(v1::StoreOpResult result,
                     Run(op, Duration::zero(), /*idempotent=*/false, nullptr, "CompareSet", key));
    return std::move(*result.mutable_compare_set()->mutable_current());
  }

  StatusOr<bool> Delete(const std::string& key) override {
    RETURN_IF_ERROR(ValidateKey(key));
    v1::StoreOp op;
    op.mutable_delete_()->set_namespace_(ns_);
    op.mutable_delete_()->set_key(key);
    ASSIGN_OR_RETURN(v1::StoreOpResult result,
                     Run(op, Duration::zero(), true, nullptr, "Delete", key));
    return result.delete_().deleted();
  }

  Status Wait(const std::vector<std::string>& keys, Duration timeout) override {
    RETURN_IF_ERROR(ValidateKeyList(keys));
    v1::StoreOp op;
    op.mutable_wait()->set_namespace_(ns_);
    for (const auto& key : keys) op.mutable_wait()->add_keys(key);
    return Run(op, timeout, true,
               [](v1::StoreOp& o, int64_t ms) { o.mutable_wait()->set_timeout_ms(ms); }, "Wait",
               keys[0])
        .status();
  }

  StatusOr<int64_t> NumKeys() override {
    v1::StoreOp op;
    op.mutable_num_keys()->set_namespace_(ns_);
    ASSIGN_OR_RETURN(v1::StoreOpResult result,
                     Run(op, Duration::zero(), true, nullptr, "NumKeys", ""));
    return result.num_keys().num_keys();
  }

  StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                              Duration timeout) override {
    RETURN_IF_ERROR(ValidateKeyList(keys));
    v1::StoreOp op;
    op.mutable_multi_get()->set_namespace_(ns_);
    for (const auto& key : keys) op.mutable_multi_get()->add_keys(key);
    ASSIGN_OR_RETURN(
        v1::StoreOpResult result,
        Run(op, timeout, true,
            [](v1::StoreOp& o, int64_t ms) { o.mutable_multi_get()->set_timeout_ms(ms); },
            "MultiGet", keys[0]));
    auto* values = result.mutable_multi_get()->mutable_values();
    return std::vector<std::string>(std::make_move_iterator(values->begin()),
                                    std::make_move_iterator(values->end()));
  }

  Status MultiSet(const std::vector<std::pair<std::string, std::string>>& entries) override {
    if (entries.empty()) return absl::InvalidArgumentError("MultiSet names no keys");
    v1::StoreOp op;
    op.mutable_multi_set()->set_namespace_(ns_);
    for (const auto& [key, value] : entries) {
      RETURN_IF_ERROR(ValidateKey(key));
      RETURN_IF_ERROR(ValidateValue(key, value));
      auto* entry = op.mutable_multi_set()->add_entries();
      entry->set_key(key);
      entry->set_value(value);
    }
    return Run(op, Duration::zero(), true, nullptr, "MultiSet", entries[0].first).status();
  }

 private:
  using SetTimeout = std::function<void(v1::StoreOp&, int64_t)>;

  // Sends `op` until it gets an answer or its deadline passes: now + `wait`
  // (the server-side blocking time, 0 for non-blocking ops) + rpc_timeout.
  // Reconnects with backoff when the stream breaks (see the header).
  StatusOr<v1::StoreOpResult> Run(v1::StoreOp& op, Duration wait, bool idempotent,
                                  const SetTimeout& set_timeout, const char* what,
                                  const std::string& key) {
    RETURN_IF_ERROR(CheckMessageSize(op, what, key));
    wait = std::clamp(wait, Duration::zero(), kMaxStoreWait);
    SteadyTime start = std::chrono::steady_clock::now();
    SteadyTime wait_deadline = start + wait;
    SteadyTime deadline = wait_deadline + options_.rpc_timeout;
    Duration backoff = options_.initial_backoff;
    while (true) {
      op.set_id(next_id_.fetch_add(1));
      if (set_timeout) {
        auto remaining = std::chrono::ceil<std::chrono::milliseconds>(
            wait_deadline - std::chrono::steady_clock::now());
        set_timeout(op, std::max<int64_t>(remaining.count(), 0));
      }
      StatusOr<std::shared_ptr<Session>> session = AcquireSession(deadline);
      Status failure;
      if (session.ok()) {
        bool sent = false;
        StatusOr<v1::StoreOpResult> result = (*session)->Call(op, deadline, &sent);
        if (result.ok()) {
          NoteIncarnation(result->store_incarnation());
          if (result->code() == 0) return result;
          return StatusFromCode(result->code(), result->message());
        }
        failure = result.status();
        bool retry = failure.code() == absl::StatusCode::kUnavailable && (idempotent || !sent);
        if (!retry) {
          if (failure.code() == absl::StatusCode::kUnavailable) {
            return absl::UnavailableError(absl::StrCat(
                what, " on store key '", key, "' may or may not have been applied: ",
                failure.message()));
          }
          return failure;
        }
      } else {
        failure = session.status();
      }
      if (std::chrono::steady_clock::now() + backoff >= deadline) return failure;
      std::this_thread::sleep_for(backoff);  // backoff between reconnects, not a condition wait
      backoff = std::min(backoff * 2, options_.max_backoff);
    }
  }

  Status Lost() const override {
    MutexLock lock(&incarnation_mu_);
    return lost_;
  }

  void NoteIncarnation(const std::string& seen) {
    if (seen.empty()) return;  // an older server
    MutexLock lock(&incarnation_mu_);
    if (incarnation_.empty()) {
      incarnation_ = seen;
    } else if (seen != incarnation_ && lost_.ok()) {
      lost_ = absl::FailedPreconditionError(absl::StrCat(
          "the store at ", address_, " restarted (", incarnation_, ", now ", QuoteForError(seen),
          "): every key written before is gone (its coordinator, or the job's rank 0, restarted)"));
    }
  }

  // The live session, reconnecting if there is none or it broke. One caller
  // reconnects at a time, without holding session_mu_ while it waits for the
  // channel; the others wait for it no longer than their own deadline.
  StatusOr<std::shared_ptr<Session>> AcquireSession(SteadyTime deadline) {
    std::shared_ptr<Session> old;  // dropped outside the lock
    {
      MutexLock lock(&session_mu_);
      while (reconnecting_) {
        if (session_cv_.WaitWithDeadline(&session_mu_, deadline) && reconnecting_) {
          return absl::UnavailableError(
              absl::StrCat("store server at ", address_, ": still reconnecting"));
        }
      }
      if (session_ != nullptr && !session_->broken()) return session_;
      old = std::move(session_);
      reconnecting_ = true;
    }
    old.reset();
    std::shared_ptr<Session> fresh;
    if (channel_->WaitForConnected(ToSystem(deadline))) {
      fresh = std::make_shared<Session>(stub_.get(), address_, options_.token, ns_);
    }
    MutexLock lock(&session_mu_);
    reconnecting_ = false;
    session_cv_.SignalAll();
    if (fresh == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("store server at ", address_, " is not reachable"));
    }
    session_ = fresh;
    return fresh;
  }

  const std::string address_;
  const std::string ns_;
  const StoreClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::StoreService::Stub> stub_;
  std::atomic<uint64_t> next_id_{1};
  // The server's incarnation as this client first saw it, and once another
  // answers (the server restarted, every key gone), what Lost() says.
  mutable Mutex incarnation_mu_;
  std::string incarnation_ ABSL_GUARDED_BY(incarnation_mu_);
  Status lost_ ABSL_GUARDED_BY(incarnation_mu_);
  Mutex session_mu_;
  CondVar session_cv_;  // signalled when a reconnect ends
  std::shared_ptr<Session> session_ ABSL_GUARDED_BY(session_mu_);
  bool reconnecting_ ABSL_GUARDED_BY(session_mu_) = false;
};

}  // namespace

StatusOr<std::unique_ptr<Store>> ConnectStore(const std::string& address, const std::string& ns,
                                              Duration connect_timeout) {
  StoreClientOptions options;
  options.connect_timeout = connect_timeout;
  return ConnectStore(address, ns, options);
}

StatusOr<std::unique_ptr<Store>> ConnectStore(const std::string& address, const std::string& ns,
                                              const StoreClientOptions& options) {
  RETURN_IF_ERROR(ValidateNamespace(ns));
  if (address.empty()) return absl::InvalidArgumentError("store address is empty");
  auto store = std::make_unique<GrpcStore>(address, ns, options);
  RETURN_IF_ERROR(store->Connect(options.connect_timeout));
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace rendezvous
}  // namespace lockstep
