// StoreCore: the coordinator's key-value store, as a plain in-memory data
// structure (no gRPC, no sockets). Both the gRPC StoreService and the
// in-process MemoryStore sit on top of it.
//
// Namespaces. Every key lives in a namespace (by convention "<job>/<round>",
// see StoreNamespace() in store.h), so a new round never reads the previous
// round's data. A namespace springs into existence with its first key and is
// dropped as a whole by DeleteNamespace / DeleteNamespacesWithPrefix once a
// round (or a job) is finished.
//
// Waiters. A wait is registered with WaitAsync(ns, keys, deadline, callback)
// and never blocks a thread: the callback runs exactly once, either
//   - from inside the write (Set, Add, CompareSet, MultiSet) that makes the
//     last missing key exist (OK, with the values if asked for),
//   - from ExpireWaiters() once `deadline` has passed on the injected Clock
//     (DeadlineExceeded naming the keys still missing), or
//   - from DeleteNamespace (Aborted: the namespace was dropped under it),
// unless CancelWait() removes it first (then it never runs). Nothing polls:
// the per-key waiter index is consulted only by writes.
//
// Timers. Deadlines are judged on the injected Clock. With
// `Options::run_expiry_thread` (the default) the core owns one thread that
// sleeps until the earliest deadline and calls ExpireWaiters(); with a
// FakeClock, tests turn it off, Advance() the clock and call
// ExpireWaiters() themselves.
//
// Thread safety: every method is safe to call concurrently. Callbacks are
// invoked without the core's lock held, so they may call back into the core;
// they must not block for long (they run on the writer's thread).
#ifndef LOCKSTEP_RENDEZVOUS_STORE_CORE_H_
#define LOCKSTEP_RENDEZVOUS_STORE_CORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "rendezvous/store.h"

namespace lockstep {
namespace rendezvous {

// Store quotas (StoreCore::Options).
inline constexpr size_t kMaxBytesPerJob = 64u << 20;
inline constexpr size_t kMaxBytesTotal = 1u << 30;
// What the byte quotas charge beyond a key's and a namespace's own bytes:
// the memory that holds them, measured with glibc on x86-64. A key's node in
// its namespace's table (two std::string, the next pointer, the cached hash,
// the allocator's header) and its bucket slot: 96 bytes. A namespace's node
// in the table of namespaces (its name's std::string and two tables) and the
// first bucket array of its keys: 304 bytes. Without them 1-byte values in
// namespaces with 1,000-byte names were charged 2 bytes each.
inline constexpr size_t kStoreKeyOverheadBytes = 96;
inline constexpr size_t kStoreNamespaceOverheadBytes = 304;

// What the byte quotas charge for a key holding a value, and for a
// namespace (while it holds keys; one kept only by parked waits is paid for
// by the waiter quotas).
inline constexpr size_t StoreKeyCharge(size_t key_bytes, size_t value_bytes) {
  return key_bytes + value_bytes + kStoreKeyOverheadBytes;
}
inline constexpr size_t StoreNamespaceCharge(size_t name_bytes) {
  return name_bytes + kStoreNamespaceOverheadBytes;
}
// Parked waits (Get, Wait, MultiGet not yet satisfied) one job's namespaces,
// and all namespaces, may hold at once. A job's bootstrap parks a handful
// per rank; each waiter costs about a kilobyte of the coordinator's memory.
inline constexpr size_t kMaxWaitersPerJob = 65536;
inline constexpr size_t kMaxWaitersTotal = 262144;

// Validation shared by every layer (the gRPC shell rejects bad input before
// it reaches the core, with the same messages). InvalidArgument naming the
// key and the limit.
Status ValidateNamespace(const std::string& ns);
Status ValidateKey(const std::string& key);
Status ValidateValue(const std::string& key, const std::string& value);
// (ValidateExpected, CompareSet's `expected`, is in store.h: FileStore
// uses it too.)
Status ValidateKeyList(const std::vector<std::string>& keys);

// Outcome of a CompareSet.
struct CompareSetResult {
  bool swapped = false;
  // The value after the call: `desired` when swapped, else the current value
  // ("" when the key is absent).
  std::string current;
};

class StoreCore {
 public:
  struct Options {
    // Own a thread that fires expired waiters on time. Default: true. Turn it
    // off with a FakeClock and drive ExpireWaiters() from the test.
    bool run_expiry_thread = true;
    // Keys one namespace may hold (ResourceExhausted beyond).
    // Default: kMaxKeysPerNamespace; tests lower it.
    size_t max_keys_per_namespace = kMaxKeysPerNamespace;
    // Bytes the namespaces of one job ("<job>/...": the namespace up to its
    // first '/') may hold together, and all namespaces together
    // (ResourceExhausted beyond, naming the job or the store, the quota and
    // the write). A key counts StoreKeyCharge (its key, its value and
    // kStoreKeyOverheadBytes), a namespace holding keys StoreNamespaceCharge
    // (its name and kStoreNamespaceOverheadBytes). A job's bootstrap needs
    // kilobytes; these bound what a hostile or broken one can take.
    // Defaults: kMaxBytesPerJob, kMaxBytesTotal; tests lower them.
    size_t max_bytes_per_job = kMaxBytesPerJob;
    size_t max_bytes_total = kMaxBytesTotal;
    // Waiters one job and all jobs may have registered at once: a wait over
    // either gets ResourceExhausted naming the quota through its callback.
    // Defaults: kMaxWaitersPerJob, kMaxWaitersTotal; tests lower them.
    size_t max_waiters_per_job = kMaxWaitersPerJob;
    size_t max_waiters_total = kMaxWaitersTotal;
  };

  // Receives OK and, when asked for, the values in the order of the keys; or
  // DeadlineExceeded / Aborted (see the file comment).
  using WaitCallback = std::function<void(StatusOr<std::vector<std::string>>)>;
  using WaitId = uint64_t;

  // `clock` is not owned and must outlive the core. Default: RealClock().
  explicit StoreCore(Clock* clock = RealClock());
  StoreCore(Clock* clock, Options options);
  // REQUIRES: no thread is inside a method. Pending waiters are dropped
  // without their callbacks running.
  ~StoreCore();

  StoreCore(const StoreCore&) = delete;
  StoreCore& operator=(const StoreCore&) = delete;

  // Random, fixed for this core's life: a client that sees another one
  // knows the store restarted and lost what it held (store_service.h).
  const std::string& incarnation() const { return incarnation_; }

  // Errors for every write: InvalidArgument (bad namespace/key/value),
  // ResourceExhausted (the namespace already holds kMaxKeysPerNamespace keys).
  Status Set(const std::string& ns, const std::string& key, std::string value);

  // Never blocks. NotFound naming the key if it is absent.
  StatusOr<std::string> TryGet(const std::string& ns, const std::string& key) const;

  // Adds `delta` to the decimal integer at `key` (missing = 0) and returns the
  // new value. InvalidArgument if the value is not an integer, OutOfRange on
  // int64 overflow.
  StatusOr<int64_t> Add(const std::string& ns, const std::string& key, int64_t delta);

  // Swaps `key` to `desired` if its value equals `expected`; when the key is
  // absent it swaps only if `expected` is empty. With `only_if_absent`
  // (store.proto's expect_absent) it swaps only when the key is absent,
  // whatever its value, even "". REQUIRES: `expected` is empty then.
  StatusOr<CompareSetResult> CompareSet(const std::string& ns, const std::string& key,
                                        const std::string& expected, std::string desired,
                                        bool only_if_absent = false);

  // Returns whether the key existed.
  StatusOr<bool> Delete(const std::string& ns, const std::string& key);

  StatusOr<int64_t> NumKeys(const std::string& ns) const;

  // All-or-nothing: either every entry is written or none (the first bad
  // entry's error is returned).
  Status MultiSet(const std::string& ns, std::vector<std::pair<std::string, std::string>> entries);

  // Registers a waiter for `keys` in `ns` (see the file comment). If the keys
  // all exist already the callback runs inline, before WaitAsync returns.
  // With `want_values` the OK result carries the values (MultiGet/Get); else
  // it is empty (Wait). Bad input is reported through the callback too
  // (InvalidArgument), so callers have one path. Returns an id for CancelWait.
  WaitId WaitAsync(const std::string& ns, const std::vector<std::string>& keys, MonoTime deadline,
                   bool want_values, WaitCallback callback);

  // Removes a pending waiter. Returns true if it was pending (its callback
  // will never run), false if it already ran or is running right now on
  // another thread.
  bool CancelWait(WaitId id);

  // Keys of `keys` absent from `ns` right now, for error messages.
  std::vector<std::string> MissingKeys(const std::string& ns,
                                       const std::vector<std::string>& keys) const;

  // Fires DeadlineExceeded for every waiter whose deadline is <= Now().
  // Returns the earliest deadline still pending (MonoTime::max() if none).
  MonoTime ExpireWaiters();

  // Drops a namespace and all its keys; its pending waiters get Aborted.
  // Returns whether it existed (held keys or waiters).
  bool DeleteNamespace(const std::string& ns);
  // Drops every namespace starting with `prefix` ("job-1/" drops all rounds
  // of job-1). Returns how many were dropped.
  int DeleteNamespacesWithPrefix(const std::string& prefix);
  // The job has ended: drops its namespaces ("<job>" and "<job>/...", as
  // DeleteNamespacesWithPrefix) and refuses every later write or wait in
  // them with FailedPrecondition naming the job (a worker or a token that
  // outlived the job would otherwise fill namespaces nobody drops again).
  // Reads answer as for absent keys. Kept for the life of the core.
  void CloseJob(const std::string& job);

  // Namespaces holding keys or waiters; for status pages and tests.
  int64_t NumNamespaces() const;
  int64_t NumPendingWaiters() const;

  Clock* clock() const { return clock_; }

 private:
  struct Waiter {
    WaitId id;
    std::string ns;
    std::vector<std::string> keys;
    size_t missing = 0;  // keys not yet seen written since registration
    MonoTime deadline;
    bool want_values = false;
    WaitCallback callback;
    // Entry in deadlines_, or deadlines_.end() when the deadline is max().
    std::multimap<MonoTime, WaitId>::iterator deadline_it;
  };
  struct Namespace {
    std::unordered_map<std::string, std::string> values;
    // What it counts against the quotas: StoreNamespaceCharge(ns) while it
    // holds keys, plus StoreKeyCharge of each key.
    size_t bytes = 0;
    // Waiters still missing a key, indexed by that key; ordered, so one is
    // removed in O(log n) (a waiter waiting on a key twice is there twice).
    std::unordered_map<std::string, std::multiset<WaitId>> waiters_by_key;
  };
  // A callback ready to run once the lock is released.
  using Ready = std::vector<std::pair<WaitCallback, StatusOr<std::vector<std::string>>>>;

  Namespace* FindNamespace(const std::string& ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const Namespace* FindNamespace(const std::string& ns) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores `value`; collects waiters this write completes. REQUIRES: inputs
  // validated, room checked.
  void WriteLocked(Namespace& space, const std::string& key, std::string value, Ready* ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `new_keys` more keys and `added_bytes` more bytes fit in `ns`
  // (keys per namespace, bytes per job, bytes in all). `op` ("Set") and
  // `key` (the first one written) name the write in the messages.
  Status CheckRoomLocked(const std::string& ns, const Namespace* space, size_t new_keys,
                         int64_t added_bytes, absl::string_view op, const std::string& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether one more waiter of `ns` fits (per job, in all).
  // FailedPrecondition when `ns` belongs to a closed job (CloseJob).
  Status CheckOpenLocked(const std::string& ns) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status CheckWaiterRoomLocked(const std::string& ns) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What writing `value_size` bytes at `key` changes the byte count by
  // (StoreKeyCharge; the namespace's own charge is OpenDelta's).
  static int64_t WriteDelta(const Namespace* space, const std::string& key, size_t value_size);
  // What a write that gives `ns` keys adds for the namespace itself:
  // StoreNamespaceCharge when it holds none yet, else 0.
  static int64_t OpenDelta(const std::string& ns, const Namespace* space);
  // Adds `delta` bytes to `ns` (which exists), its job and the total.
  void AccountLocked(const std::string& ns, int64_t delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Re-checks a waiter whose missing count reached zero (a key may have been
  // deleted since it was counted); queues it if all keys exist.
  void CompleteOrRearmLocked(Namespace& space, Waiter& waiter, Ready* ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets a waiter (and, with `unindex`, its per-key index entries).
  void EraseWaiterLocked(WaitId id, bool unindex = true) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeDropEmptyLocked(const std::string& ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int DeleteNamespaceLocked(const std::string& ns, Ready* ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs callbacks collected under the lock; called without it.
  static void RunReady(Ready* ready);
  void ExpiryLoop() ABSL_LOCKS_EXCLUDED(mu_);

  Clock* const clock_;
  const Options options_;
  const std::string incarnation_;

  mutable Mutex mu_;
  std::map<std::string, Namespace> namespaces_ ABSL_GUARDED_BY(mu_);
  // Bytes held per job ("<job>" of "<job>/..."), and in all.
  std::unordered_map<std::string, size_t> job_bytes_ ABSL_GUARDED_BY(mu_);
  std::unordered_set<std::string> closed_jobs_ ABSL_GUARDED_BY(mu_);  // CloseJob
  size_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::unordered_map<WaitId, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  // Registered waiters per job (the quota owner of their namespace).
  std::unordered_map<std::string, size_t> job_waiters_ ABSL_GUARDED_BY(mu_);
  std::multimap<MonoTime, WaitId> deadlines_ ABSL_GUARDED_BY(mu_);
  WaitId next_wait_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Signalled when the earliest deadline moves earlier, and at stop.
  CondVar expiry_cv_;
  std::thread expiry_thread_;
};

}  // namespace rendezvous
}  // namespace lockstep

#endif  // LOCKSTEP_RENDEZVOUS_STORE_CORE_H_
