#include "rendezvous/memory_store.h"

#include <chrono>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/mutex.h"

namespace lockstep {
namespace rendezvous {

MemoryStore::MemoryStore() : MemoryStore(std::make_shared<StoreCore>(), "default") {}

MemoryStore::MemoryStore(std::shared_ptr<StoreCore> core, std::string ns)
    : core_(std::move(core)), ns_(std::move(ns)) {}

Status MemoryStore::Set(const std::string& key, const std::string& value) {
  return core_->Set(ns_, key, value);
}

StatusOr<std::string> MemoryStore::Get(const std::string& key, Duration timeout) {
  ASSIGN_OR_RETURN(std::vector<std::string> values, BlockingWait({key}, timeout, true));
  return std::move(values[0]);
}

StatusOr<int64_t> MemoryStore::Add(const std::string& key, int64_t delta) {
  return core_->Add(ns_, key, delta);
}

StatusOr<std::string> MemoryStore::CompareSet(const std::string& key, const std::string& expected,
                                              const std::string& desired) {
  ASSIGN_OR_RETURN(CompareSetResult result, core_->CompareSet(ns_, key, expected, desired));
  return std::move(result.current);
}

StatusOr<bool> MemoryStore::Delete(const std::string& key) { return core_->Delete(ns_, key); }

Status MemoryStore::Wait(const std::vector<std::string>& keys, Duration timeout) {
  return BlockingWait(keys, timeout, false).status();
}

StatusOr<int64_t> MemoryStore::NumKeys() { return core_->NumKeys(ns_); }

StatusOr<std::vector<std::string>> MemoryStore::MultiGet(const std::vector<std::string>& keys,
                                                         Duration timeout) {
  return BlockingWait(keys, timeout, true);
}

Status MemoryStore::MultiSet(const std::vector<std::pair<std::string, std::string>>& entries) {
  return core_->MultiSet(ns_, entries);
}

StatusOr<std::vector<std::string>> MemoryStore::BlockingWait(const std::vector<std::string>& keys,
                                                             Duration timeout, bool want_values) {
  // The core's deadline is left open (max): this thread keeps real time
  // itself, so the store works the same on a core driven by a FakeClock.
  struct Slot {
    Mutex mu;
    CondVar cv;
    std::optional<StatusOr<std::vector<std::string>>> result ABSL_GUARDED_BY(mu);
  };
  auto slot = std::make_shared<Slot>();
  StoreCore::WaitId id = core_->WaitAsync(
      ns_, keys, MonoTime::max(), want_values,
      [slot](StatusOr<std::vector<std::string>> result) {
        MutexLock lock(&slot->mu);
        slot->result = std::move(result);
        slot->cv.SignalAll();
      });
  bool done = false;
  {
    MutexLock lock(&slot->mu);
    const auto start = std::chrono::steady_clock::now();
    while (!slot->result.has_value()) {
      Duration left = timeout - (std::chrono::steady_clock::now() - start);
      if (left <= Duration::zero()) break;
      slot->cv.WaitWithTimeout(&slot->mu, left);
    }
    done = slot->result.has_value();
  }
  if (!done && core_->CancelWait(id)) {
    return absl::DeadlineExceededError(
        absl::StrCat("store keys not set in namespace '", ns_, "' within ", ToSeconds(timeout),
                     " s: ", absl::StrJoin(core_->MissingKeys(ns_, keys), ", ")));
  }
  // Not cancelled: the callback has run, or is running on another thread.
  MutexLock lock(&slot->mu);
  while (!slot->result.has_value()) slot->cv.Wait(&slot->mu);
  return std::move(*slot->result);
}

}  // namespace rendezvous
}  // namespace lockstep
