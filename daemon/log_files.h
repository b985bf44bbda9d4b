// Workers' log files, opened by a root agent inside a job dir that the
// job's uid owns. The worker may have replaced a file there with a symlink
// (to /etc/shadow, say), a FIFO or a directory; root must then neither read
// nor write nor chown what that points to, nor block on it. These opens
// never follow a symlink in the last component (the dirs above it are the
// daemon's, which workers cannot change), never block, and accept only a
// regular file.
#ifndef LOCKSTEP_DAEMON_LOG_FILES_H_
#define LOCKSTEP_DAEMON_LOG_FILES_H_

#include <string>

#include "common/status.h"

namespace lockstep {
namespace daemon {

// For appending (O_APPEND, close-on-exec, blocking writes), mode 0640
// whatever the umask. Creates the file if missing; what is there and is not
// a regular file (a symlink, a FIFO, a socket) is unlinked first and a new
// file made in its place. Unavailable naming the path when that fails.
StatusOr<int> OpenLogForAppend(const std::string& path);

// For reading (close-on-exec). NotFound when there is no file;
// FailedPrecondition naming the path when it is not a regular file (nothing
// is read through a symlink).
StatusOr<int> OpenLogForRead(const std::string& path);

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_LOG_FILES_H_
