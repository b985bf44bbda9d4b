// MemoryStore: the Store interface over an in-process StoreCore, bound to one
// namespace. For ranks-as-threads tests and single-process tools: share one
// StoreCore (or one MemoryStore) among the threads playing ranks.
//
//   auto core = std::make_shared<StoreCore>();
//   MemoryStore rank0(core, "job-1/1"), rank1(core, "job-1/1");
//
// Thread safety: safe for concurrent use (the core is). Blocking calls (Get,
// Wait, MultiGet) park the calling thread on a condition variable until the
// write that satisfies them or until `timeout` passes on the real steady
// clock (whatever Clock the core runs on); then DeadlineExceeded names the
// keys still missing.
#ifndef LOCKSTEP_RENDEZVOUS_MEMORY_STORE_H_
#define LOCKSTEP_RENDEZVOUS_MEMORY_STORE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "rendezvous/store.h"
#include "rendezvous/store_core.h"

namespace lockstep {
namespace rendezvous {

class MemoryStore : public Store {
 public:
  // A fresh private core on the real clock, namespace "default".
  MemoryStore();
  // REQUIRES: core != nullptr; ns valid (non-empty, <= kMaxKeyBytes).
  MemoryStore(std::shared_ptr<StoreCore> core, std::string ns);

  Status Set(const std::string& key, const std::string& value) override;
  StatusOr<std::string> Get(const std::string& key, Duration timeout) override;
  StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  StatusOr<std::string> CompareSet(const std::string& key, const std::string& expected,
                                   const std::string& desired) override;
  StatusOr<bool> Delete(const std::string& key) override;
  Status Wait(const std::vector<std::string>& keys, Duration timeout) override;
  StatusOr<int64_t> NumKeys() override;
  StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                              Duration timeout) override;
  Status MultiSet(const std::vector<std::pair<std::string, std::string>>& entries) override;

  const std::shared_ptr<StoreCore>& core() const { return core_; }
  const std::string& ns() const { return ns_; }

 private:
  StatusOr<std::vector<std::string>> BlockingWait(const std::vector<std::string>& keys,
                                                  Duration timeout, bool want_values);

  std::shared_ptr<StoreCore> core_;
  std::string ns_;
};

}  // namespace rendezvous
}  // namespace lockstep

#endif  // LOCKSTEP_RENDEZVOUS_MEMORY_STORE_H_
