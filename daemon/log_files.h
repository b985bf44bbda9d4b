// Workers' log files, opened by a root agent inside a job dir that the
// job's uid owns. The worker may have replaced a file there with a symlink
// (to /etc/shadow, say), a FIFO or a directory; root must then neither read
// nor write nor chown what that points to, nor block on it. These opens
// never follow a symlink in the last component (the dirs above it are the
// daemon's, which workers cannot change), never block, and accept only a
// regular file.
#ifndef LOCKSTEP_DAEMON_LOG_FILES_H_
#define LOCKSTEP_DAEMON_LOG_FILES_H_

#include <cstdint>
#include <functional>
#include <string>

#include "common/mutex.h"
#include "common/status.h"

namespace lockstep {
namespace daemon {

// For appending (O_APPEND, close-on-exec, blocking writes), mode 0640
// whatever the umask. Creates the file if missing; what is there and is not
// a regular file (a symlink, a FIFO, a socket) is unlinked first and a new
// file made in its place. Unavailable naming the path when that fails.
StatusOr<int> OpenLogForAppend(const std::string& path);

// What RotateLog did.
struct Rotation {
  int64_t bytes = 0;     // what `path` held
  bool kept = false;     // copied to `path`.1; else dropped
  std::string why_lost;  // when not kept: why `path`.1 could not be written
  // Kept: what the worker wrote while the copy ran (the copy stops at the
  // size `path` had when the rotation began), dropped and said in the marker.
  int64_t dropped = 0;
};

// Rotates a log file that its worker keeps appending to (through an
// O_APPEND descriptor, as OpenLogForAppend gives): copies what `path` holds
// to `path`.1 (made anew, mode 0640, replacing an earlier one, whatever that
// was), empties `path`, then appends a line: `marker_head` followed by
// "; the earlier output is in <name>.1 ===" or, when the copy could not be
// written (the disk full, say), "; the earlier output was dropped (<why>)
// ===": the file is emptied either way, since a log that keeps growing would
// fill the disk. Copy then truncate, as logrotate's copytruncate: what the
// worker writes between the end of the copy and the truncation is lost
// (the marker says how much, " (N bytes written while it was copied were
// dropped)", when it saw it). The copy takes what `path` held when the
// rotation began, no more: one that chased a worker writing as fast as it
// copies would not end, and would fill the disk. A file with other names
// (a hard link) is neither rotated, read nor appended to (it is replaced).
// Nothing is followed through a symlink: `path` must be a regular file
// (FailedPrecondition naming it otherwise; nothing changed); a symlink at
// `path`.1 is replaced, never written through. Unavailable naming the path
// when `path` cannot be emptied.
//
// With `readers`, the emptying (truncation and marker) and `emptied` (told
// what was kept) run under it, and only when the file is emptied: a reader
// that holds it while it reads sees the file and what `emptied` recorded
// agree (the Agent's log generations).
StatusOr<Rotation> RotateLog(const std::string& path, const std::string& marker_head,
                             Mutex* readers = nullptr,
                             const std::function<void(const Rotation&)>& emptied = nullptr);

// For reading (close-on-exec). NotFound when there is no file;
// FailedPrecondition naming the path when it is not a regular file (nothing
// is read through a symlink).
StatusOr<int> OpenLogForRead(const std::string& path);

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_LOG_FILES_H_
