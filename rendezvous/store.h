// Store: the key-value interface workers and agents bootstrap through
// (Gloo pair addresses, NCCL unique ids, barriers). Plain C++, no gRPC, so
// //ddp can depend on it.
//
// A Store object is bound to one namespace (by convention "<job>/<round>",
// see StoreNamespace()): keys written in one round are never visible in
// another. Implementations: an in-memory store (tests, ranks as threads),
// a file store (processes on one host), and the gRPC client to the
// coordinator's StoreService (//rendezvous:store_client).
//
// Thread safety: every implementation is safe for concurrent use.
// Blocking: Get, Wait and MultiGet block until the keys exist or `timeout`
// passes; a waiter is woken by the write that satisfies it.
// Errors: DeadlineExceeded (timeout; the message names the missing keys),
// InvalidArgument (empty/oversized key or value), Unavailable (server down),
// ResourceExhausted (namespace key limit).
#ifndef LOCKSTEP_RENDEZVOUS_STORE_H_
#define LOCKSTEP_RENDEZVOUS_STORE_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status.h"

namespace lockstep {
namespace rendezvous {

// Default for blocking store calls when the caller has no better bound.
inline constexpr std::chrono::seconds kDefaultStoreTimeout{300};

// Limits every implementation enforces (InvalidArgument / ResourceExhausted).
inline constexpr size_t kMaxKeyBytes = 1024;
inline constexpr size_t kMaxValueBytes = 16 * 1024 * 1024;
// At most this many keys in one Wait / MultiGet / MultiSet request
// (InvalidArgument beyond).
inline constexpr size_t kMaxKeysPerRequest = 65536;
inline constexpr size_t kMaxKeysPerNamespace = 1 << 20;
// The longest a store wait parks (a year): every store, and the gRPC
// service's timeout_ms, count a longer timeout as this.
inline constexpr Duration kMaxStoreWait = std::chrono::hours(24 * 365);
// The values one MultiGet returns together: one answer, which must fit one
// gRPC message (64 MiB, rendezvous/grpc_limits.h) with its framing
// (ResourceExhausted beyond, naming the total; nothing is copied first, so a
// MultiGet naming one 16 MiB key 65,536 times costs no memory).
inline constexpr size_t kMaxMultiGetBytes = 60 * 1024 * 1024;

// Metadata a Session stream opens with: the job ("<job>" of "<job>/...") its
// ops will use, so the server can check the stream's token before it keeps
// anything for the stream. A "-bin" key: any bytes, base64 on the wire.
inline constexpr char kStoreJobMetadata[] = "lockstep-store-job-bin";

// CompareSet's `expected` no value can equal (over kMaxValueBytes):
// InvalidArgument naming the key, in every store.
inline Status ValidateExpected(const std::string& key, const std::string& expected) {
  if (expected.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CompareSet on store key ", QuoteForError(key), ": expected value of ", expected.size(),
        " bytes exceeds kMaxValueBytes=", kMaxValueBytes));
  }
  return absl::OkStatus();
}

// The message of a MultiGet refused for kMaxMultiGetBytes; `where` names
// the namespace or directory.
inline std::string MultiGetTooLarge(const std::string& where, size_t keys, size_t total_bytes) {
  return absl::StrCat("MultiGet of ", keys, " keys in ", QuoteForError(where), ": their values total ",
                      total_bytes, " bytes, more than one answer carries (kMaxMultiGetBytes, ",
                      kMaxMultiGetBytes, "); get them in smaller groups");
}

// The job a namespace belongs to: "<job>" of "<job>/<round>" (the quotas,
// the Session caps and tokens go by it).
inline std::string StoreJobOf(absl::string_view ns) {
  return std::string(ns.substr(0, ns.find('/')));
}

// "<job>/<round>": the namespace a job's round uses.
inline std::string StoreNamespace(const std::string& job_id, int round) {
  return job_id + "/" + std::to_string(round);
}

class Store {
 public:
  virtual ~Store() = default;

  virtual Status Set(const std::string& key, const std::string& value) = 0;

  // Blocks until `key` exists or `timeout` passes (DeadlineExceeded).
  virtual StatusOr<std::string> Get(const std::string& key, Duration timeout) = 0;

  // Atomically adds `delta` to the integer stored at `key` (missing = 0;
  // stored as decimal text) and returns the new value. InvalidArgument if
  // the current value is not an integer.
  virtual StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;

  // Sets `key` to `desired` if its current value equals `expected`, or if
  // it is absent and `expected` is empty. Returns the value after the call
  // (== desired when swapped).
  virtual StatusOr<std::string> CompareSet(const std::string& key, const std::string& expected,
                                           const std::string& desired) = 0;

  // Returns whether the key existed.
  virtual StatusOr<bool> Delete(const std::string& key) = 0;

  // Blocks until every key exists or `timeout` passes (DeadlineExceeded
  // naming the keys still missing).
  virtual Status Wait(const std::vector<std::string>& keys, Duration timeout) = 0;

  virtual StatusOr<int64_t> NumKeys() = 0;

  // Blocks like Wait, then returns the values in the order of `keys`.
  virtual StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                                      Duration timeout) = 0;

  virtual Status MultiSet(const std::vector<std::pair<std::string, std::string>>& entries) = 0;

  // Not OK once this store is known to have lost what it held (a store
  // server that restarted under this client, rendezvous/store_client.h),
  // saying so: keys waited for since may never come, and no rank is to
  // blame for that. OK for stores that cannot lose keys.
  virtual Status Lost() const { return absl::OkStatus(); }
};

// A Store that passes every op to `inner` (not owned; must outlive it): the
// base of a store that changes a few ops of another and leaves the rest.
class ForwardingStore : public Store {
 public:
  explicit ForwardingStore(Store* inner) : inner_(inner) {}
  Status Set(const std::string& k, const std::string& v) override { return inner_->Set(k, v); }
  StatusOr<std::string> Get(const std::string& k, Duration t) override { return inner_->Get(k, t); }
  StatusOr<int64_t> Add(const std::string& k, int64_t d) override { return inner_->Add(k, d); }
  StatusOr<std::string> CompareSet(const std::string& k, const std::string& e,
                                   const std::string& d) override {
    return inner_->CompareSet(k, e, d);
  }
  StatusOr<bool> Delete(const std::string& k) override { return inner_->Delete(k); }
  Status Wait(const std::vector<std::string>& keys, Duration t) override {
    return inner_->Wait(keys, t);
  }
  StatusOr<int64_t> NumKeys() override { return inner_->NumKeys(); }
  StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                              Duration t) override {
    return inner_->MultiGet(keys, t);
  }
  Status MultiSet(const std::vector<std::pair<std::string, std::string>>& e) override {
    return inner_->MultiSet(e);
  }
  Status Lost() const override { return inner_->Lost(); }

 private:
  Store* const inner_;
};

}  // namespace rendezvous
}  // namespace lockstep

#endif  // LOCKSTEP_RENDEZVOUS_STORE_H_
