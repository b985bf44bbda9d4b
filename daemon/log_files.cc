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
