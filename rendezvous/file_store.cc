#include "rendezvous/file_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <cctype>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace lockstep {
namespace rendezvous {
namespace {

Status ErrnoStatus(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

Status CheckKey(const std::string& key) {
  if (key.empty()) return absl::InvalidArgumentError("store key is empty");
  if (key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("store key ", QuoteForError(key), " of ",
                                                   key.size(), " bytes exceeds kMaxKeyBytes (",
                                                   kMaxKeyBytes, ")"));
  }
  return absl::OkStatus();
}

// As StoreCore's ValidateKeyList: 1..kMaxKeysPerRequest valid keys.
Status CheckKeyCount(size_t keys) {
  if (keys == 0) return absl::InvalidArgumentError("store request names no keys");
  if (keys > kMaxKeysPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat("store request names ", keys,
                                                   " keys, over kMaxKeysPerRequest (",
                                                   kMaxKeysPerRequest, ")"));
  }
  return absl::OkStatus();
}

Status CheckValue(const std::string& key, const std::string& value) {
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("value for key '", key, "' of ", value.size(),
                                                   " bytes exceeds kMaxValueBytes (", kMaxValueBytes, ")"));
  }
  return absl::OkStatus();
}

Status MakeDirs(const std::string& dir) {
  std::string path;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || (dir[i] == '/' && i > 0)) {
      path = dir.substr(0, i);
      if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) return ErrnoStatus("mkdir", path);
    }
  }
  return absl::OkStatus();
}

// Exclusive flock on "<dir>/.lock" for the life of the object.
class DirLock {
 public:
  explicit DirLock(const std::string& dir) {
    path_ = dir + "/.lock";
    fd_ = open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      status_ = ErrnoStatus("open", path_);
      return;
    }
    while (flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) {
        status_ = ErrnoStatus("flock", path_);
        return;
      }
    }
  }
  ~DirLock() {
    if (fd_ >= 0) close(fd_);  // Releases the lock.
  }
  const Status& status() const { return status_; }

 private:
  std::string path_;
  int fd_ = -1;
  Status status_;
};

// Longest wait a poll keeps a deadline for (a year): longer timeouts, up to
// Duration::max(), are clamped to it, as the gRPC client does, so now +
// timeout cannot overflow into the past.

// Polls `ready` until it returns true or the deadline passes.
template <typename Fn>
bool PollUntil(Duration timeout, Fn ready) {
  const auto deadline = std::chrono::steady_clock::now() + std::min(timeout, kMaxStoreWait);
  Duration sleep = kFileStoreMinPoll;
  while (true) {
    if (ready()) return true;
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<Duration>(sleep, deadline - now));
    sleep = std::min<Duration>(sleep * 2, kFileStoreMaxPoll);
  }
}

}  // namespace

StatusOr<std::unique_ptr<FileStore>> FileStore::Open(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("file store directory is empty");
  RETURN_IF_ERROR(MakeDirs(dir));
  return std::unique_ptr<FileStore>(new FileStore(dir));
}

std::string FileStore::PathFor(const std::string& key) const {
  static const char kHex[] = "0123456789abcdef";
  std::string name = "k_";
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '.' || c == '_' || c == '-') {
      name.push_back(static_cast<char>(c));
    } else {
      name.push_back('%');
      name.push_back(kHex[c >> 4]);
      name.push_back(kHex[c & 15]);
    }
  }
  if (name.size() > kMaxFileNameBytes) {
    name = absl::StrCat("h_", std::hash<std::string>()(key));
  }
  return dir_ + "/" + name;
}

StatusOr<std::string> FileStore::ReadKey(const std::string& key) const {
  const std::string path = PathFor(key);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("key '", key, "' not found"));
    return ErrnoStatus("open", path);
  }
  std::string out;
  char buf[64 * 1024];
  while (true) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      Status s = ErrnoStatus("read", path);
      close(fd);
      return s;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

Status FileStore::WriteKey(const std::string& key, const std::string& value) {
  const std::string path = PathFor(key);
  // A name no other writer has, made exclusively: writers in other pid
  // namespaces (containers sharing the directory) can have this one's pid,
  // and two of them writing one temp file would publish a mix.
  std::string tmp = absl::StrCat(dir_, "/.tmp.XXXXXX");
  int fd = mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("mkostemp", tmp);
  (void)fchmod(fd, 0644);  // as the keys were before: readable by the job's other users
  size_t done = 0;
  while (done < value.size()) {
    ssize_t n = write(fd, value.data() + done, value.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      Status s = ErrnoStatus("write", tmp);
      close(fd);
      unlink(tmp.c_str());
      return s;
    }
    done += static_cast<size_t>(n);
  }
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = ErrnoStatus("rename", path);
    unlink(tmp.c_str());
    return s;
  }
  return absl::OkStatus();
}

Status FileStore::Set(const std::string& key, const std::string& value) {
  RETURN_IF_ERROR(CheckKey(key));
  RETURN_IF_ERROR(CheckValue(key, value));
  // Under the lock as Add and CompareSet are: their read-then-write would
  // otherwise put back what they read over this value.
  DirLock lock(dir_);
  RETURN_IF_ERROR(lock.status());
  return WriteKey(key, value);
}

StatusOr<std::string> FileStore::Get(const std::string& key, Duration timeout) {
  RETURN_IF_ERROR(CheckKey(key));
  StatusOr<std::string> result = absl::NotFoundError("");
  bool found = PollUntil(timeout, [&] {
    result = ReadKey(key);
    return result.ok() || !absl::IsNotFound(result.status());
  });
  if (!found) {
    return absl::DeadlineExceededError(absl::StrCat("timed out after ", ToSeconds(timeout),
                                                    " s waiting for key '", key, "' in ", dir_));
  }
  return result;
}

StatusOr<int64_t> FileStore::Add(const std::string& key, int64_t delta) {
  RETURN_IF_ERROR(CheckKey(key));
  DirLock lock(dir_);
  RETURN_IF_ERROR(lock.status());
  int64_t value = 0;
  StatusOr<std::string> current = ReadKey(key);
  if (current.ok()) {
    if (!absl::SimpleAtoi(*current, &value)) {
      return absl::InvalidArgumentError(absl::StrCat("store key ", QuoteForError(key), " holds ",
                                                     QuoteForError(*current), ", not an integer"));
    }
  } else if (!absl::IsNotFound(current.status())) {
    return current.status();
  }
  if (__builtin_add_overflow(value, delta, &value)) {
    return absl::OutOfRangeError(absl::StrCat("store key ", QuoteForError(key), ": ", *current,
                                              " + ", delta, " overflows int64"));
  }
  RETURN_IF_ERROR(WriteKey(key, std::to_string(value)));
  return value;
}

StatusOr<std::string> FileStore::CompareSet(const std::string& key, const std::string& expected,
                                            const std::string& desired) {
  RETURN_IF_ERROR(CheckKey(key));
  RETURN_IF_ERROR(ValidateExpected(key, expected));
  RETURN_IF_ERROR(CheckValue(key, desired));
  DirLock lock(dir_);
  RETURN_IF_ERROR(lock.status());
  StatusOr<std::string> current = ReadKey(key);
  if (!current.ok() && !absl::IsNotFound(current.status())) return current.status();
  const bool matches = current.ok() ? *current == expected : expected.empty();
  // Not swapped: the current value, "" for an absent key (as StoreCore).
  if (!matches) return current.ok() ? *std::move(current) : std::string();
  RETURN_IF_ERROR(WriteKey(key, desired));
  return desired;
}

StatusOr<bool> FileStore::Delete(const std::string& key) {
  RETURN_IF_ERROR(CheckKey(key));
  DirLock lock(dir_);
  RETURN_IF_ERROR(lock.status());
  const std::string path = PathFor(key);
  if (unlink(path.c_str()) == 0) return true;
  if (errno == ENOENT) return false;
  return ErrnoStatus("unlink", path);
}

Status FileStore::Wait(const std::vector<std::string>& keys, Duration timeout) {
  RETURN_IF_ERROR(CheckKeyCount(keys.size()));
  for (const auto& key : keys) RETURN_IF_ERROR(CheckKey(key));
  std::vector<std::string> missing;
  bool done = PollUntil(timeout, [&] {
    missing.clear();
    for (const auto& key : keys) {
      if (access(PathFor(key).c_str(), F_OK) != 0) missing.push_back(key);
    }
    return missing.empty();
  });
  if (done) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat("timed out after ", ToSeconds(timeout),
                                                  " s waiting for keys [",
                                                  absl::StrJoin(missing, ", "), "] in ", dir_));
}

StatusOr<int64_t> FileStore::NumKeys() {
  DIR* d = opendir(dir_.c_str());
  if (d == nullptr) return ErrnoStatus("opendir", dir_);
  int64_t n = 0;
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] == 'k' || e->d_name[0] == 'h') {
      if (e->d_name[1] == '_') ++n;
    }
  }
  closedir(d);
  return n;
}

StatusOr<std::vector<std::string>> FileStore::MultiGet(const std::vector<std::string>& keys,
                                                       Duration timeout) {
  RETURN_IF_ERROR(Wait(keys, timeout));
  std::vector<std::string> values;
  values.reserve(keys.size());
  size_t total = 0;
  for (const auto& key : keys) {
    ASSIGN_OR_RETURN(std::string v, ReadKey(key));
    total += v.size();
    if (total > kMaxMultiGetBytes) {
      // Read no further: the rest need not be in memory to know.
      for (size_t i = values.size() + 1; i < keys.size(); ++i) {
        struct stat st {};
        if (::stat(PathFor(keys[i]).c_str(), &st) == 0) total += static_cast<size_t>(st.st_size);
      }
      return absl::ResourceExhaustedError(MultiGetTooLarge(dir_, keys.size(), total));
    }
    values.push_back(std::move(v));
  }
  return values;
}

Status FileStore::MultiSet(const std::vector<std::pair<std::string, std::string>>& entries) {
  RETURN_IF_ERROR(CheckKeyCount(entries.size()));
  for (const auto& [key, value] : entries) {
    RETURN_IF_ERROR(CheckKey(key));
    RETURN_IF_ERROR(CheckValue(key, value));
  }
  DirLock lock(dir_);
  RETURN_IF_ERROR(lock.status());
  for (const auto& [key, value] : entries) RETURN_IF_ERROR(WriteKey(key, value));
  return absl::OkStatus();
}

}  // namespace rendezvous
}  // namespace lockstep
