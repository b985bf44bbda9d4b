// FileStore: a Store over a directory, for processes on one host (tests,
// single-host users starting workers by hand), like PyTorch's FileStore.
//
// Layout: one file per key under `dir` (the namespace directory, e.g.
// "<base>/<job>/<round>"; created if missing). A key's file name is the key
// with every byte outside [A-Za-z0-9._-] percent-encoded; keys whose encoded
// name would exceed kMaxFileNameBytes are named by a 64-bit hash of the key
// (collisions are not detected). Writes go to a temporary file that is then
// renamed over the key's file, so readers never see a partial value.
// Every write (Set, MultiSet, Add, CompareSet, Delete) holds an exclusive
// flock(2) on "<dir>/.lock", so read-modify-writes are atomic across
// processes and a Set is never overwritten by an Add that read before it.
//
// Blocking: Get, Wait and MultiGet poll the directory, starting at
// kFileStoreMinPoll and backing off to kFileStoreMaxPoll, until the keys
// exist or the timeout passes (DeadlineExceeded naming the missing keys);
// a timeout over a year counts as a year, as the gRPC client clamps it.
//
// Thread safety: safe for concurrent use by threads and processes.
// Errors: InvalidArgument (empty/oversized key or value, non-integer value
// under Add), Internal (filesystem errors, with errno text),
// DeadlineExceeded (waits). kMaxKeysPerNamespace is not enforced (a
// directory of files has no cheap count on the write path).
#ifndef LOCKSTEP_RENDEZVOUS_FILE_STORE_H_
#define LOCKSTEP_RENDEZVOUS_FILE_STORE_H_

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "rendezvous/store.h"

namespace lockstep {
namespace rendezvous {

// Poll interval bounds for blocking calls.
inline constexpr std::chrono::microseconds kFileStoreMinPoll{200};
inline constexpr std::chrono::milliseconds kFileStoreMaxPoll{20};
// Longest encoded key used verbatim as a file name.
inline constexpr size_t kMaxFileNameBytes = 200;

class FileStore : public Store {
 public:
  // Opens (creating if needed, with parents) the directory `dir`.
  // Errors: InvalidArgument (empty dir), Internal (cannot create it).
  static StatusOr<std::unique_ptr<FileStore>> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }

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

 private:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}

  std::string PathFor(const std::string& key) const;
  // Reads a key's file; NotFound when absent.
  StatusOr<std::string> ReadKey(const std::string& key) const;
  Status WriteKey(const std::string& key, const std::string& value);

  std::string dir_;
};

}  // namespace rendezvous
}  // namespace lockstep

#endif  // LOCKSTEP_RENDEZVOUS_FILE_STORE_H_
