#include "rendezvous/store_core.h"

#include <algorithm>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/ids.h"

namespace lockstep {
namespace rendezvous {
namespace {

// Keys in error messages: at most this many are listed.
constexpr size_t kMaxKeysInMessage = 8;

std::string KeyList(const std::vector<std::string>& keys) {
  std::vector<std::string> shown(keys.begin(),
                                 keys.begin() + std::min(keys.size(), kMaxKeysInMessage));
  std::string out = absl::StrJoin(shown, ", ", [](std::string* out, const std::string& key) {
    out->append(QuoteForError(key));
  });
  if (keys.size() > kMaxKeysInMessage) {
    absl::StrAppend(&out, ", ... (", keys.size(), " keys)");
  }
  return out;
}

}  // namespace

Status ValidateNamespace(const std::string& ns) {
  if (ns.empty()) return absl::InvalidArgumentError("store namespace is empty");
  if (ns.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("store namespace of ", ns.size(),
                                                   " bytes exceeds kMaxKeyBytes=", kMaxKeyBytes));
  }
  return absl::OkStatus();
}

Status ValidateKey(const std::string& key) {
  if (key.empty()) return absl::InvalidArgumentError("store key is empty");
  if (key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("store key ", QuoteForError(key), " of ",
                                                   key.size(), " bytes exceeds kMaxKeyBytes=",
                                                   kMaxKeyBytes));
  }
  return absl::OkStatus();
}

Status ValidateValue(const std::string& key, const std::string& value) {
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("value for store key ", QuoteForError(key), " of ",
                                                   value.size(), " bytes exceeds kMaxValueBytes=",
                                                   kMaxValueBytes));
  }
  return absl::OkStatus();
}

Status ValidateKeyList(const std::vector<std::string>& keys) {
  if (keys.empty()) return absl::InvalidArgumentError("store request names no keys");
  if (keys.size() > kMaxKeysPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat("store request names ", keys.size(),
                                                   " keys, over kMaxKeysPerRequest=",
                                                   kMaxKeysPerRequest));
  }
  for (const std::string& key : keys) RETURN_IF_ERROR(ValidateKey(key));
  return absl::OkStatus();
}

StoreCore::StoreCore(Clock* clock) : StoreCore(clock, Options()) {}

StoreCore::StoreCore(Clock* clock, Options options)
    : clock_(clock), options_(options), incarnation_(NewRandomId("store-")) {
  if (options_.run_expiry_thread) expiry_thread_ = std::thread([this] { ExpiryLoop(); });
}

StoreCore::~StoreCore() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  expiry_cv_.SignalAll();
  if (expiry_thread_.joinable()) expiry_thread_.join();
}

StoreCore::Namespace* StoreCore::FindNamespace(const std::string& ns) {
  auto it = namespaces_.find(ns);
  return it == namespaces_.end() ? nullptr : &it->second;
}

const StoreCore::Namespace* StoreCore::FindNamespace(const std::string& ns) const {
  auto it = namespaces_.find(ns);
  return it == namespaces_.end() ? nullptr : &it->second;
}


Status StoreCore::CheckOpenLocked(const std::string& ns) const {
  const std::string owner = StoreJobOf(ns);
  if (closed_jobs_.count(owner) == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "store: job ", QuoteForError(owner), " has ended: its namespaces were dropped and take no "
      "more writes or waits (namespace ", QuoteForError(ns), ")"));
}

Status StoreCore::CheckRoomLocked(const std::string& ns, const Namespace* space,
                                  size_t new_keys, int64_t added_bytes, absl::string_view op,
                                  const std::string& key) const {
  RETURN_IF_ERROR(CheckOpenLocked(ns));
  size_t have = space == nullptr ? 0 : space->values.size();
  if (have + new_keys > options_.max_keys_per_namespace) {
    return absl::ResourceExhaustedError(absl::StrCat("store namespace ", QuoteForError(ns), " holds ", have,
                                                     " keys; adding ", new_keys,
                                                     " would exceed kMaxKeysPerNamespace=",
                                                     options_.max_keys_per_namespace));
  }
  if (added_bytes <= 0) return absl::OkStatus();
  const std::string owner = StoreJobOf(ns);
  auto held = job_bytes_.find(owner);
  const size_t job = held == job_bytes_.end() ? 0 : held->second;
  const size_t add = static_cast<size_t>(added_bytes);
  // The write, for the messages: built only when one is refused.
  auto what = [&] {
    if (new_keys <= 1) return absl::StrCat(op, " of store key ", QuoteForError(key));
    return absl::StrCat(op, " of ", new_keys, " new store keys (", QuoteForError(key), ", ...)");
  };
  if (job + add > options_.max_bytes_per_job) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "store: the namespaces of ", QuoteForError(owner), " hold ", job, " bytes; ", what(),
        " in namespace ", QuoteForError(ns), " adds ", add, ", over the per-job quota of ",
        options_.max_bytes_per_job, " bytes"));
  }
  if (total_bytes_ + add > options_.max_bytes_total) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "store: all jobs' namespaces hold ", total_bytes_, " bytes; ", what(), " in namespace ",
        QuoteForError(ns), " adds ", add, ", over the store's budget of ", options_.max_bytes_total,
        " bytes"));
  }
  return absl::OkStatus();
}

int64_t StoreCore::WriteDelta(const Namespace* space, const std::string& key, size_t value_size) {
  int64_t delta = static_cast<int64_t>(StoreKeyCharge(key.size(), value_size));
  if (space != nullptr) {
    auto it = space->values.find(key);
    if (it != space->values.end()) {
      delta -= static_cast<int64_t>(StoreKeyCharge(key.size(), it->second.size()));
    }
  }
  return delta;
}

int64_t StoreCore::OpenDelta(const std::string& ns, const Namespace* space) {
  if (space != nullptr && !space->values.empty()) return 0;
  return static_cast<int64_t>(StoreNamespaceCharge(ns.size()));
}

void StoreCore::AccountLocked(const std::string& ns, int64_t delta) {
  if (delta == 0) return;
  namespaces_[ns].bytes += delta;
  const std::string owner = StoreJobOf(ns);
  size_t& job = job_bytes_[owner];
  job += delta;
  if (job == 0) job_bytes_.erase(owner);
  total_bytes_ += delta;
}

void StoreCore::WriteLocked(Namespace& space, const std::string& key, std::string value,
                            Ready* ready) {
  space.values[key] = std::move(value);
  auto it = space.waiters_by_key.find(key);
  if (it == space.waiters_by_key.end()) return;
  std::multiset<WaitId> ids = std::move(it->second);
  space.waiters_by_key.erase(it);
  for (WaitId id : ids) {
    auto w = waiters_.find(id);
    if (w == waiters_.end()) continue;
    if (--w->second.missing == 0) CompleteOrRearmLocked(space, w->second, ready);
  }
}

void StoreCore::CompleteOrRearmLocked(Namespace& space, Waiter& waiter, Ready* ready) {
  size_t total = 0;
  for (const std::string& key : waiter.keys) {
    auto v = space.values.find(key);
    if (v == space.values.end()) {
      // Deleted after it was counted: wait for it again.
      ++waiter.missing;
      space.waiters_by_key[key].insert(waiter.id);
    } else {
      total += v->second.size();
    }
  }
  if (waiter.missing > 0) return;
  if (waiter.want_values && total > kMaxMultiGetBytes) {
    ready->emplace_back(std::move(waiter.callback),
                        absl::ResourceExhaustedError(MultiGetTooLarge(waiter.ns, waiter.keys.size(), total)));
  } else {
    std::vector<std::string> values;
    if (waiter.want_values) {
      values.reserve(waiter.keys.size());
      for (const std::string& key : waiter.keys) values.push_back(space.values.at(key));
    }
    ready->emplace_back(std::move(waiter.callback), std::move(values));
  }
  EraseWaiterLocked(waiter.id);
}

void StoreCore::EraseWaiterLocked(WaitId id, bool unindex) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return;
  Waiter& waiter = it->second;
  if (waiter.deadline_it != deadlines_.end()) deadlines_.erase(waiter.deadline_it);
  // Drop the waiter from the per-key index, so a client that keeps timing
  // out on a key nobody writes does not grow it: O(log n) per key in an
  // index of n waiters, so expiring or cancelling all n is O(n log n).
  Namespace* space = unindex && waiter.missing > 0 ? FindNamespace(waiter.ns) : nullptr;
  if (space != nullptr) {
    for (const std::string& key : waiter.keys) {
      auto entry = space->waiters_by_key.find(key);
      if (entry == space->waiters_by_key.end()) continue;
      entry->second.erase(id);
      if (entry->second.empty()) space->waiters_by_key.erase(entry);
    }
  }
  auto owner = job_waiters_.find(StoreJobOf(waiter.ns));
  if (owner != job_waiters_.end() && --owner->second == 0) job_waiters_.erase(owner);
  waiters_.erase(it);
}

Status StoreCore::CheckWaiterRoomLocked(const std::string& ns) const {
  RETURN_IF_ERROR(CheckOpenLocked(ns));
  const std::string owner = StoreJobOf(ns);
  auto held = job_waiters_.find(owner);
  const size_t job = held == job_waiters_.end() ? 0 : held->second;
  if (job >= options_.max_waiters_per_job) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "store: job ", QuoteForError(owner), " already has ", job,
        " waits parked (Get/Wait/MultiGet); kMaxWaitersPerJob=", options_.max_waiters_per_job));
  }
  if (waiters_.size() >= options_.max_waiters_total) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "store: ", waiters_.size(), " waits parked in all; kMaxWaitersTotal=",
        options_.max_waiters_total));
  }
  return absl::OkStatus();
}

void StoreCore::MaybeDropEmptyLocked(const std::string& ns) {
  auto it = namespaces_.find(ns);
  if (it == namespaces_.end() || !it->second.values.empty()) return;
  // Kept while a waiter waits in it: every index entry is a live waiter's
  // (EraseWaiterLocked removes a waiter's entries with it).
  if (!it->second.waiters_by_key.empty()) return;
  namespaces_.erase(it);
}

void StoreCore::RunReady(Ready* ready) {
  for (auto& [callback, result] : *ready) callback(std::move(result));
  ready->clear();
}

Status StoreCore::Set(const std::string& ns, const std::string& key, std::string value) {
  RETURN_IF_ERROR(ValidateNamespace(ns));
  RETURN_IF_ERROR(ValidateKey(key));
  RETURN_IF_ERROR(ValidateValue(key, value));
  Ready ready;
  {
    MutexLock lock(&mu_);
    Namespace* space = FindNamespace(ns);
    bool exists = space != nullptr && space->values.count(key) > 0;
    const int64_t delta = WriteDelta(space, key, value.size()) + OpenDelta(ns, space);
    RETURN_IF_ERROR(CheckRoomLocked(ns, space, exists ? 0 : 1, delta, "Set", key));
    WriteLocked(namespaces_[ns], key, std::move(value), &ready);
    AccountLocked(ns, delta);
  }
  RunReady(&ready);
  return absl::OkStatus();
}

StatusOr<std::string> StoreCore::TryGet(const std::string& ns, const std::string& key) const {
  RETURN_IF_ERROR(ValidateNamespace(ns));
  RETURN_IF_ERROR(ValidateKey(key));
  MutexLock lock(&mu_);
  const Namespace* space = FindNamespace(ns);
  if (space != nullptr) {
    auto it = space->values.find(key);
    if (it != space->values.end()) return it->second;
  }
  return absl::NotFoundError(absl::StrCat("store key ", QuoteForError(key),
                                          " not found in namespace ", QuoteForError(ns)));
}

StatusOr<int64_t> StoreCore::Add(const std::string& ns, const std::string& key, int64_t delta) {
  RETURN_IF_ERROR(ValidateNamespace(ns));
  RETURN_IF_ERROR(ValidateKey(key));
  Ready ready;
  int64_t result = 0;
  {
    MutexLock lock(&mu_);
    Namespace* space = FindNamespace(ns);
    int64_t current = 0;
    const std::string* old = nullptr;
    if (space != nullptr) {
      auto it = space->values.find(key);
      if (it != space->values.end()) old = &it->second;
    }
    if (old != nullptr && !absl::SimpleAtoi(*old, &current)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Add on store key ", QuoteForError(key), ": its value is not an integer (", old->size(), " bytes)"));
    }
    if (__builtin_add_overflow(current, delta, &result)) {
      return absl::OutOfRangeError(absl::StrCat("Add on store key ", QuoteForError(key), ": ", current, " + ",
                                                delta, " overflows int64"));
    }
    std::string value = std::to_string(result);
    const int64_t delta = WriteDelta(space, key, value.size()) + OpenDelta(ns, space);
    RETURN_IF_ERROR(CheckRoomLocked(ns, space, old == nullptr ? 1 : 0, delta, "Add", key));
    WriteLocked(namespaces_[ns], key, std::move(value), &ready);
    AccountLocked(ns, delta);
  }
  RunReady(&ready);
  return result;
}

StatusOr<CompareSetResult> StoreCore::CompareSet(const std::string& ns, const std::string& key,
                                                 const std::string& expected,
                                                 std::string desired, bool only_if_absent) {
  RETURN_IF_ERROR(ValidateNamespace(ns));
  RETURN_IF_ERROR(ValidateKey(key));
  RETURN_IF_ERROR(ValidateExpected(key, expected));
  RETURN_IF_ERROR(ValidateValue(key, desired));
  Ready ready;
  CompareSetResult result;
  {
    MutexLock lock(&mu_);
    Namespace* space = FindNamespace(ns);
    const std::string* old = nullptr;
    if (space != nullptr) {
      auto it = space->values.find(key);
      if (it != space->values.end()) old = &it->second;
    }
    bool swap = old == nullptr ? expected.empty() : !only_if_absent && *old == expected;
    if (!swap) {
      result.current = old == nullptr ? std::string() : *old;
      return result;
    }
    const int64_t delta = WriteDelta(space, key, desired.size()) + OpenDelta(ns, space);
    RETURN_IF_ERROR(
        CheckRoomLocked(ns, space, old == nullptr ? 1 : 0, delta, "CompareSet", key));
    result.swapped = true;
    result.current = desired;
    WriteLocked(namespaces_[ns], key, std::move(desired), &ready);
    AccountLocked(ns, delta);
  }
  RunReady(&ready);
  return result;
}

StatusOr<bool> StoreCore::Delete(const std::string& ns, const std::string& key) {
  RETURN_IF_ERROR(ValidateNamespace(ns));
  RETURN_IF_ERROR(ValidateKey(key));
  MutexLock lock(&mu_);
  Namespace* space = FindNamespace(ns);
  if (space == nullptr) return false;
  auto it = space->values.find(key);
  const bool erased = it != space->values.end();
  if (erased) {
    int64_t delta = -static_cast<int64_t>(StoreKeyCharge(key.size(), it->second.size()));
    space->values.erase(it);
    // Its last key: the namespace's own charge goes too.
    if (space->values.empty()) delta -= static_cast<int64_t>(StoreNamespaceCharge(ns.size()));
    AccountLocked(ns, delta);
  }
  MaybeDropEmptyLocked(ns);
  return erased;
}

StatusOr<int64_t> StoreCore::NumKeys(const std::string& ns) const {
  RETURN_IF_ERROR(ValidateNamespace(ns));
  MutexLock lock(&mu_);
  const Namespace* space = FindNamespace(ns);
  return space == nullptr ? 0 : static_cast<int64_t>(space->values.size());
}

Status StoreCore::MultiSet(const std::string& ns,
                           std::vector<std::pair<std::string, std::string>> entries) {
  RETURN_IF_ERROR(ValidateNamespace(ns));
  if (entries.empty()) return absl::InvalidArgumentError("MultiSet names no keys");
  if (entries.size() > kMaxKeysPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat("MultiSet names ", entries.size(),
                                                   " keys, over kMaxKeysPerRequest=",
                                                   kMaxKeysPerRequest));
  }
  for (const auto& [key, value] : entries) {
    RETURN_IF_ERROR(ValidateKey(key));
    RETURN_IF_ERROR(ValidateValue(key, value));
  }
  Ready ready;
  {
    MutexLock lock(&mu_);
    Namespace* space = FindNamespace(ns);
    size_t new_keys = 0;
    int64_t delta = OpenDelta(ns, space);
    // A key named twice: its last value wins and is the only one written, so
    // no waiter completes on a value this MultiSet then overwrites.
    std::unordered_map<std::string, size_t> last;  // key -> index of its last entry
    for (size_t i = 0; i < entries.size(); ++i) last[entries[i].first] = i;
    for (const auto& [key, i] : last) {
      if (space == nullptr || space->values.count(key) == 0) ++new_keys;
      delta += WriteDelta(space, key, entries[i].second.size());
    }
    RETURN_IF_ERROR(CheckRoomLocked(ns, space, new_keys, delta, "MultiSet", entries[0].first));
    Namespace& target = namespaces_[ns];
    for (size_t i = 0; i < entries.size(); ++i) {
      auto& [key, value] = entries[i];
      if (last[key] == i) WriteLocked(target, key, std::move(value), &ready);
    }
    AccountLocked(ns, delta);
  }
  RunReady(&ready);
  return absl::OkStatus();
}

StoreCore::WaitId StoreCore::WaitAsync(const std::string& ns, const std::vector<std::string>& keys,
                                       MonoTime deadline, bool want_values,
                                       WaitCallback callback) {
  Status valid = ValidateNamespace(ns);
  if (valid.ok()) valid = ValidateKeyList(keys);
  Ready ready;
  WaitId id = 0;
  {
    MutexLock lock(&mu_);
    id = next_wait_id_++;
    if (valid.ok()) valid = CheckWaiterRoomLocked(ns);
    if (!valid.ok()) {
      ready.emplace_back(std::move(callback), valid);
    } else {
      ++job_waiters_[StoreJobOf(ns)];
      Namespace& space = namespaces_[ns];
      Waiter& waiter = waiters_[id];
      waiter.id = id;
      waiter.ns = ns;
      waiter.keys = keys;
      waiter.deadline = deadline;
      waiter.want_values = want_values;
      waiter.callback = std::move(callback);
      waiter.deadline_it = deadlines_.end();
      for (const std::string& key : keys) {
        if (space.values.count(key) == 0) {
          ++waiter.missing;
          space.waiters_by_key[key].insert(id);
        }
      }
      if (waiter.missing == 0) {
        CompleteOrRearmLocked(space, waiter, &ready);
        MaybeDropEmptyLocked(ns);
      } else if (deadline <= clock_->Now()) {
        std::vector<std::string> missing;
        for (const std::string& key : keys) {
          if (space.values.count(key) == 0) missing.push_back(key);
        }
        ready.emplace_back(std::move(waiter.callback),
                           absl::DeadlineExceededError(absl::StrCat(
                               "store keys not set in namespace ", QuoteForError(ns),
                               " before the deadline: ", KeyList(missing))));
        EraseWaiterLocked(id);
        MaybeDropEmptyLocked(ns);
      } else if (deadline != MonoTime::max()) {
        bool earliest = deadlines_.empty() || deadline < deadlines_.begin()->first;
        waiter.deadline_it = deadlines_.emplace(deadline, id);
        if (earliest) expiry_cv_.SignalAll();
      }
    }
  }
  RunReady(&ready);
  return id;
}

bool StoreCore::CancelWait(WaitId id) {
  MutexLock lock(&mu_);
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return false;
  std::string ns = it->second.ns;
  EraseWaiterLocked(id);
  MaybeDropEmptyLocked(ns);
  return true;
}

std::vector<std::string> StoreCore::MissingKeys(const std::string& ns,
                                                const std::vector<std::string>& keys) const {
  MutexLock lock(&mu_);
  const Namespace* space = FindNamespace(ns);
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    if (space == nullptr || space->values.count(key) == 0) missing.push_back(key);
  }
  return missing;
}

MonoTime StoreCore::ExpireWaiters() {
  Ready ready;
  MonoTime next = MonoTime::max();
  {
    MutexLock lock(&mu_);
    MonoTime now = clock_->Now();
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      WaitId id = deadlines_.begin()->second;
      auto w = waiters_.find(id);
      Waiter& waiter = w->second;
      std::vector<std::string> missing;
      const Namespace* space = FindNamespace(waiter.ns);
      for (const std::string& key : waiter.keys) {
        if (space == nullptr || space->values.count(key) == 0) missing.push_back(key);
      }
      ready.emplace_back(std::move(waiter.callback),
                         absl::DeadlineExceededError(absl::StrCat(
                             "store keys not set in namespace ", QuoteForError(waiter.ns),
                             " before the deadline: ", KeyList(missing))));
      std::string ns = waiter.ns;
      EraseWaiterLocked(id);
      MaybeDropEmptyLocked(ns);
    }
    if (!deadlines_.empty()) next = deadlines_.begin()->first;
  }
  RunReady(&ready);
  return next;
}

int StoreCore::DeleteNamespaceLocked(const std::string& ns, Ready* ready) {
  auto it = namespaces_.find(ns);
  if (it == namespaces_.end()) return 0;
  for (auto& [key, ids] : it->second.waiters_by_key) {
    for (WaitId id : ids) {
      auto w = waiters_.find(id);
      if (w == waiters_.end()) continue;
      ready->emplace_back(std::move(w->second.callback),
                          absl::AbortedError(absl::StrCat("store namespace ", QuoteForError(ns),
                                                          " was deleted while waiting for ",
                                                          QuoteForError(key))));
      EraseWaiterLocked(id, /*unindex=*/false);  // the whole index goes below
    }
  }
  AccountLocked(ns, -static_cast<int64_t>(it->second.bytes));
  namespaces_.erase(it);
  return 1;
}

bool StoreCore::DeleteNamespace(const std::string& ns) {
  Ready ready;
  int dropped = 0;
  {
    MutexLock lock(&mu_);
    dropped = DeleteNamespaceLocked(ns, &ready);
  }
  RunReady(&ready);
  return dropped > 0;
}

int StoreCore::DeleteNamespacesWithPrefix(const std::string& prefix) {
  Ready ready;
  int dropped = 0;
  {
    MutexLock lock(&mu_);
    std::vector<std::string> names;
    for (auto it = namespaces_.lower_bound(prefix);
         it != namespaces_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
      names.push_back(it->first);
    }
    for (const std::string& ns : names) dropped += DeleteNamespaceLocked(ns, &ready);
  }
  RunReady(&ready);
  return dropped;
}

void StoreCore::CloseJob(const std::string& job) {
  {
    MutexLock lock(&mu_);
    closed_jobs_.insert(job);
  }
  // Its rounds' ("<job>/<n>"), and the bare "<job>" a job's token opens too.
  DeleteNamespace(job);
  DeleteNamespacesWithPrefix(job + "/");
}

int64_t StoreCore::NumNamespaces() const {
  MutexLock lock(&mu_);
  return namespaces_.size();
}

int64_t StoreCore::NumPendingWaiters() const {
  MutexLock lock(&mu_);
  return waiters_.size();
}

void StoreCore::ExpiryLoop() {
  mu_.Lock();
  while (!stopping_) {
    if (deadlines_.empty()) {
      expiry_cv_.Wait(&mu_);
      continue;
    }
    Duration until = deadlines_.begin()->first - clock_->Now();
    if (until > Duration::zero()) {
      expiry_cv_.WaitWithTimeout(&mu_, until);
      continue;
    }
    mu_.Unlock();  // ExpireWaiters takes the lock and runs callbacks without it
    ExpireWaiters();
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace rendezvous
}  // namespace lockstep
