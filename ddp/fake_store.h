// FakeStore: a test-only in-memory Store shared by ranks running as threads.
// Not the production in-memory store (that lives in //rendezvous); this one
// exists so ddp tests need no store server. Thread-safe; waits block on a
// condition variable with a deadline.
#ifndef LOCKSTEP_DDP_FAKE_STORE_H_
#define LOCKSTEP_DDP_FAKE_STORE_H_

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rendezvous/store.h"

namespace lockstep {
namespace ddp {

class FakeStore : public rendezvous::Store {
 public:
  Status Set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      data_[key] = value;
    }
    cv_.notify_all();
    return absl::OkStatus();
  }
  StatusOr<std::string> Get(const std::string& key, Duration timeout) override {
    RETURN_IF_ERROR(Wait({key}, timeout));
    std::lock_guard<std::mutex> lock(mu_);
    return data_.at(key);
  }
  StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    int64_t value = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = data_.find(key);
      if (it != data_.end() && !absl::SimpleAtoi(it->second, &value)) {
        return absl::InvalidArgumentError(absl::StrCat("key '", key, "' is not an integer"));
      }
      value += delta;
      data_[key] = std::to_string(value);
    }
    cv_.notify_all();
    return value;
  }
  StatusOr<std::string> CompareSet(const std::string& key, const std::string& expected,
                                   const std::string& desired) override {
    std::string result;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = data_.find(key);
      const bool matches = it == data_.end() ? expected.empty() : it->second == expected;
      if (!matches) return it->second;
      data_[key] = desired;
    }
    cv_.notify_all();
    return desired;
  }
  StatusOr<bool> Delete(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    return data_.erase(key) > 0;
  }
  Status Wait(const std::vector<std::string>& keys, Duration timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    std::vector<std::string> missing;
    auto all_present = [&] {
      missing.clear();
      for (const auto& k : keys) {
        if (data_.count(k) == 0) missing.push_back(k);
      }
      return missing.empty();
    };
    if (cv_.wait_for(lock, timeout, all_present)) return absl::OkStatus();
    return absl::DeadlineExceededError(
        absl::StrCat("timed out waiting for keys [", absl::StrJoin(missing, ", "), "]"));
  }
  StatusOr<int64_t> NumKeys() override {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(data_.size());
  }
  StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                              Duration timeout) override {
    RETURN_IF_ERROR(Wait(keys, timeout));
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto& k : keys) out.push_back(data_.at(k));
    return out;
  }
  Status MultiSet(const std::vector<std::pair<std::string, std::string>>& entries) override {
    for (const auto& [k, v] : entries) RETURN_IF_ERROR(Set(k, v));
    return absl::OkStatus();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
};

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_FAKE_STORE_H_
