#include "daemon/log_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace daemon {
namespace {

constexpr mode_t kLogMode = 0640;

// fd if it is a regular file (then made blocking again), else -1 with the
// fd closed and errno EINVAL.
int RegularOrClose(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    errno = EINVAL;
    return -1;
  }
  const int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

}  // namespace

StatusOr<int> OpenLogForAppend(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for writing with no reader would block.
  constexpr int kFlags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
  int fd = ::open(path.c_str(), kFlags, kLogMode);
  if (fd >= 0) fd = RegularOrClose(fd);
  if (fd < 0 && errno != EACCES && errno != ENOENT) {
    // A symlink (ELOOP), a FIFO or socket (ENXIO, EINVAL), a directory
    // (EISDIR) put there by the job: replaced by a file of its own.
    if (::unlink(path.c_str()) == 0 || errno == ENOENT) {
      fd = ::open(path.c_str(), kFlags | O_EXCL, kLogMode);
      if (fd >= 0) fd = RegularOrClose(fd);
    }
  }
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("open log file ", path, ": ", std::strerror(errno),
                     errno == EINVAL ? " (not a regular file)" : ""));
  }
  if (::fchmod(fd, kLogMode) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("chmod log file ", path, ": ", std::strerror(err)));
  }
  return fd;
}

namespace {

// Copies all of `src` to a new file `to` (made with O_EXCL, never through a
// symlink); the bytes copied, or the failing step and errno's text.
StatusOr<int64_t> CopyLog(int src, const std::string& to) {
  const int dst = ::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, kLogMode);
  if (dst < 0) return absl::UnavailableError(absl::StrCat("create ", to, ": ", std::strerror(errno)));
  auto fail = [&](const char* what) {
    const int err = errno;
    ::close(dst);
    return absl::UnavailableError(absl::StrCat(what, " ", to, ": ", std::strerror(err)));
  };
  int64_t copied = 0;
  std::string buf(1 << 20, '\0');
  while (true) {
    const ssize_t n = ::pread(src, buf.data(), buf.size(), copied);
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

StatusOr<Rotation> RotateLog(const std::string& path, const std::string& marker_head) {
  int src = ::open(path.c_str(), O_RDWR | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (src >= 0) src = RegularOrClose(src);
  if (src < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "log file ", path, " not rotated: ",
        errno == ELOOP ? "a symlink" : errno == EINVAL ? "not a regular file" : std::strerror(errno)));
  }
  const std::string previous = path + ".1";
  const std::string tmp = previous + ".tmp";
  Rotation r;
  struct stat st;
  r.bytes = ::fstat(src, &st) == 0 ? st.st_size : 0;
  ::unlink(tmp.c_str());  // a leftover, or a symlink the job planted
  StatusOr<int64_t> copied = CopyLog(src, tmp);
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
  if (::ftruncate(src, 0) != 0) {
    const int err = errno;
    ::close(src);
    return absl::UnavailableError(
        absl::StrCat("rotating log file ", path, ": truncate: ", std::strerror(err)));
  }
  const std::string marker =
      r.kept ? absl::StrCat(marker_head, "; the earlier output is in ", BaseName(previous), " ===\n")
             : absl::StrCat(marker_head, "; the earlier output was dropped (", r.why_lost, ") ===\n");
  (void)!::write(src, marker.data(), marker.size());
  ::close(src);
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
        "log file ", path, " is not a regular file (",
        errno == ELOOP ? "a symlink" : std::strerror(errno), "): not read"));
  }
  return fd;
}

}  // namespace daemon
}  // namespace lockstep
