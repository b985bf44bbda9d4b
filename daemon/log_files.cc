#include "daemon/log_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace daemon {
namespace {

constexpr mode_t kLogMode = 0640;

// fd if it is a regular file with this one name (then made blocking
// again), else -1 with the fd closed and errno EINVAL, or EMLINK for a file
// with other names: a hard link the job made in its dir to a file it could
// not otherwise touch (where fs.protected_hardlinks is off), which the agent
// would chmod, hand to the job's uid, rotate and serve.
int RegularOrClose(int fd) {
  struct stat st;
  const bool stated = ::fstat(fd, &st) == 0;
  if (!stated || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
    const bool linked = stated && S_ISREG(st.st_mode) && st.st_nlink > 1;
    ::close(fd);
    errno = linked ? EMLINK : EINVAL;
    return -1;
  }
  const int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

// What an open of a log file that RegularOrClose refused found there.
std::string LinkText(int err) {
  switch (err) {
    case ELOOP: return "a symlink";
    case EMLINK: return "a hard link to a file with other names";
    case EINVAL: return "not a regular file";
    default: return std::strerror(err);
  }
}

}  // namespace

StatusOr<int> OpenLogForAppend(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for writing with no reader would block.
  constexpr int kFlags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
  int fd = ::open(path.c_str(), kFlags, kLogMode);
  if (fd >= 0) fd = RegularOrClose(fd);
  if (fd < 0 && errno != EACCES && errno != ENOENT) {
    // A symlink (ELOOP), a FIFO or socket (ENXIO, EINVAL), a directory
    // (EISDIR), a hard link (EMLINK) put there by the job: replaced by a
    // file of its own.
    if (::unlink(path.c_str()) == 0 || errno == ENOENT) {
      fd = ::open(path.c_str(), kFlags | O_EXCL, kLogMode);
      if (fd >= 0) fd = RegularOrClose(fd);
    }
  }
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("open log file ", path, ": ", LinkText(errno)));
  }
  if (::fchmod(fd, kLogMode) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("chmod log file ", path, ": ", std::strerror(err)));
  }
  return fd;
}

namespace {

// Copies the first `limit` bytes of `src` (fewer if it is shorter) to a
// new file `to` (made with O_EXCL, never through a symlink); the bytes
// copied, or the failing step and errno's text. Bounded: a worker that
// keeps writing would otherwise keep the copy going, and fill the disk.
StatusOr<int64_t> CopyLog(int src, const std::string& to, int64_t limit) {
  const int dst = ::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, kLogMode);
  if (dst < 0) return absl::UnavailableError(absl::StrCat("create ", to, ": ", std::strerror(errno)));
  auto fail = [&](const char* what) {
    const int err = errno;
    ::close(dst);
    return absl::UnavailableError(absl::StrCat(what, " ", to, ": ", std::strerror(err)));
  };
  int64_t copied = 0;
  std::string buf(1 << 20, '\0');
  while (copied < limit) {
    const size_t want = static_cast<size_t>(std::min<int64_t>(buf.size(), limit - copied));
    const ssize_t n = ::pread(src, buf.data(), want, copied);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("read for");
    if (n == 0) break;
    for (ssize_t done = 0; done < n;) {
      const ssize_t w = ::write(dst, buf.data() + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return fail("write");
      done += w;
    }
    copied += n;
  }
  if (::fchmod(dst, kLogMode) != 0) return fail("chmod");
  if (::close(dst) != 0) {
    return absl::UnavailableError(absl::StrCat("close ", to, ": ", std::strerror(errno)));
  }
  return copied;
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

StatusOr<Rotation> RotateLog(const std::string& path, const std::string& marker_head,
                             Mutex* readers, const std::function<void(const Rotation&)>& emptied) {
  int src = ::open(path.c_str(), O_RDWR | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (src >= 0) src = RegularOrClose(src);
  if (src < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("log file ", path, " not rotated: ", LinkText(errno)));
  }
  const std::string previous = path + ".1";
  const std::string tmp = previous + ".tmp";
  Rotation r;
  struct stat st;
  r.bytes = ::fstat(src, &st) == 0 ? st.st_size : 0;
  ::unlink(tmp.c_str());  // a leftover, or a symlink the job planted
  StatusOr<int64_t> copied = CopyLog(src, tmp, r.bytes);
  // rename replaces whatever is named `previous`, a symlink included, and
  // never writes through it.
  if (copied.ok() && ::rename(tmp.c_str(), previous.c_str()) != 0) {
    copied = absl::UnavailableError(absl::StrCat("rename to ", previous, ": ", std::strerror(errno)));
  }
  if (copied.ok()) {
    r.kept = true;
    r.bytes = *copied;
  } else {
    ::unlink(tmp.c_str());
    r.why_lost = std::string(copied.status().message());
  }
  // Empties the file and writes the marker; then `emptied`.
  auto empty = [&]() -> Status {
    // What the worker wrote while the copy ran is not in it.
    if (r.kept && ::fstat(src, &st) == 0 && st.st_size > r.bytes) r.dropped = st.st_size - r.bytes;
    if (::ftruncate(src, 0) != 0) {
      return absl::UnavailableError(
          absl::StrCat("rotating log file ", path, ": truncate: ", std::strerror(errno)));
    }
    const std::string marker =
        r.kept ? absl::StrCat(marker_head, "; the earlier output is in ", BaseName(previous),
                              r.dropped > 0 ? absl::StrCat(" (", r.dropped, " bytes written while it was copied were dropped)") : "",
                              " ===\n")
               : absl::StrCat(marker_head, "; the earlier output was dropped (", r.why_lost, ") ===\n");
    (void)!::write(src, marker.data(), marker.size());
    if (emptied) emptied(r);
    return absl::OkStatus();
  };
  Status emptying;
  if (readers != nullptr) {
    MutexLock lock(readers);
    emptying = empty();
  } else {
    emptying = empty();
  }
  ::close(src);
  if (!emptying.ok()) return emptying;
  return r;
}

StatusOr<int> OpenLogForRead(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0 && errno == ENOENT) {
    return absl::NotFoundError(absl::StrCat("no log file ", path));
  }
  if (fd >= 0) fd = RegularOrClose(fd);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "log file ", path, " is not a regular file of its own (", LinkText(errno), "): not read"));
  }
  return fd;
}

}  // namespace daemon
}  // namespace lockstep
