#include "rendezvous/store_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "lockstep/v1/store.grpc.pb.h"
#include "rendezvous/grpc_status.h"
#include "rendezvous/store_core.h"

namespace lockstep {
namespace rendezvous {
namespace {

using SteadyTime = std::chrono::steady_clock::time_point;

// Longest wait a client passes on (keeps deadline arithmetic from overflowing).
constexpr Duration kMaxWait = std::chrono::hours(24 * 365);

std::chrono::system_clock::time_point ToSystem(SteadyTime t) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             t - std::chrono::steady_clock::now());
}

// One StoreService.Session stream: writers serialise on write_mu_, a reader
// thread hands each result to the caller waiting for its id. Once broken, it
// stays broken; the client replaces it.
class Session {
 public:
  Session(v1::StoreService::Stub* stub, const std::string& address) : address_(address) {
    stream_ = stub->Session(&ctx_);
    reader_ = std::thread([this] { ReadLoop(); });
  }

  ~Session() {
    ctx_.TryCancel();
    reader_.join();
  }

  bool broken() {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_;
  }

  // Sends `op` and waits for its result until `deadline`. Transport errors:
  // Unavailable (stream broken; *sent says whether the op may have reached
  // the server), DeadlineExceeded (no reply in time).
  StatusOr<v1::StoreOpResult> Call(const v1::StoreOp& op, SteadyTime deadline, bool* sent) {
    Pending pending;
    *sent = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (broken_) return broken_status_;
      pending_[op.id()] = &pending;
    }
    bool written;
    {
      std::lock_guard<std::mutex> lock(write_mu_);
      written = stream_->Write(op);
    }
    *sent = written;
    std::unique_lock<std::mutex> lock(mu_);
    if (!written && !pending.done) {
      pending_.erase(op.id());
      return broken_ ? broken_status_ : absl::UnavailableError(absl::StrCat(
                                            "store server at ", address_, ": stream closed"));
    }
    if (!pending.cv.wait_until(lock, deadline, [&] { return pending.done; })) {
      pending_.erase(op.id());
      return absl::DeadlineExceededError(
          absl::StrCat("store server at ", address_, " did not answer op ", op.id(), " in time"));
    }
    return std::move(pending.result);
  }

 private:
  struct Pending {
    std::condition_variable cv;
    bool done = false;
    StatusOr<v1::StoreOpResult> result;
  };

  void ReadLoop() {
    v1::StoreOpResult result;
    while (stream_->Read(&result)) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = pending_.find(result.id());
      if (it == pending_.end()) continue;  // its caller gave up
      it->second->result = std::move(result);
      it->second->done = true;
      it->second->cv.notify_one();
      pending_.erase(it);
    }
    grpc::Status finished;
    {
      std::lock_guard<std::mutex> lock(write_mu_);
      finished = stream_->Finish();
    }
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = true;
    broken_status_ = absl::UnavailableError(
        absl::StrCat("store server at ", address_, ": stream broken: ",
                     finished.ok() ? "closed by server" : finished.error_message()));
    for (auto& [id, pending] : pending_) {
      pending->result = broken_status_;
      pending->done = true;
      pending->cv.notify_one();
    }
    pending_.clear();
  }

  const std::string address_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::StoreOp, v1::StoreOpResult>> stream_;
  std::mutex write_mu_;
  std::mutex mu_;
  std::unordered_map<uint64_t, Pending*> pending_;  // GUARDED_BY(mu_)
  bool broken_ = false;                             // GUARDED_BY(mu_)
  Status broken_status_;                            // GUARDED_BY(mu_)
  std::thread reader_;
};

class GrpcStore : public Store {
 public:
  GrpcStore(std::string address, std::string ns, StoreClientOptions options)
      : address_(std::move(address)), ns_(std::move(ns)), options_(options) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kStoreMaxMessageBytes);
    args.SetMaxSendMessageSize(kStoreMaxMessageBytes);
    // Our own TCP connection, not one shared with other clients in-process.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    int backoff_ms = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(options.initial_backoff).count());
    int max_backoff_ms = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(options.max_backoff).count());
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::max(backoff_ms, 1));
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, std::max(backoff_ms, 1));
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, std::max(max_backoff_ms, 1));
    channel_ = grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args);
    stub_ = v1::StoreService::NewStub(channel_);
  }

  ~GrpcStore() override {
    std::lock_guard<std::mutex> lock(session_mu_);
    session_.reset();
  }

  Status Connect(Duration timeout) {
    SteadyTime deadline = std::chrono::steady_clock::now() + std::min(timeout, kMaxWait);
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
    wait = std::clamp(wait, Duration::zero(), kMaxWait);
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

  // The live session, reconnecting if there is none or it broke.
  StatusOr<std::shared_ptr<Session>> AcquireSession(SteadyTime deadline) {
    std::lock_guard<std::mutex> lock(session_mu_);
    if (session_ != nullptr && !session_->broken()) return session_;
    session_.reset();
    if (!channel_->WaitForConnected(ToSystem(deadline))) {
      return absl::UnavailableError(
          absl::StrCat("store server at ", address_, " is not reachable"));
    }
    session_ = std::make_shared<Session>(stub_.get(), address_);
    return session_;
  }

  const std::string address_;
  const std::string ns_;
  const StoreClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::StoreService::Stub> stub_;
  std::atomic<uint64_t> next_id_{1};
  std::mutex session_mu_;
  std::shared_ptr<Session> session_;  // GUARDED_BY(session_mu_)
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
