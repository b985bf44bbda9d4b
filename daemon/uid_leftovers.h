// What a job's uid leaves on the host besides processes: files in the
// shared temporary dirs (/tmp, /var/tmp, /dev/shm, /dev/mqueue) and System V
// shared memory, semaphores and message queues. When the agent returns a
// job's uid (--job-uids) the next job given that uid would own all of it
// (it could read the first job's data) and /dev/shm and shared memory hold
// RAM until reboot; systemd's DynamicUser= removes the same with
// RemoveIPC=. These functions remove what one uid owns, as root.
//
// The entries of those dirs that the uid owns are removed, whole (a
// directory with what it holds, whoever owns that), and so are the uid's
// entries inside world-writable directories of others there (a shared 1777
// dir in /tmp), to 8 levels, on the same file system: the uid can create
// entries only where it may write, its own dirs and those open to every
// user (its gid is its own; ACLs aside). Other users' directories are
// not walked, so the work stays that of listing those dirs and the shared
// ones plus what the job made (the agent does it on a thread of its own,
// cleaner.h). The removal never follows a symlink: every step is
// relative to an open directory (openat, O_NOFOLLOW, unlinkat), so a path
// swapped for a link while it runs leads nowhere; and it removes trees of
// any depth with one directory open at a time.
//
// Thread safety: pure functions of the file system and the kernel's IPC
// tables.
#ifndef LOCKSTEP_DAEMON_UID_LEFTOVERS_H_
#define LOCKSTEP_DAEMON_UID_LEFTOVERS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace lockstep {
namespace daemon {

// The dirs the agent cleans by default.
std::vector<std::string> DefaultLeftoverDirs();

struct Leftovers {
  int entries = 0;  // files, dirs, links and the like removed (whole trees count once)
  int64_t files = 0;  // everything removed, each file and dir of a tree counted
  int ipc = 0;      // System V objects removed
  std::vector<std::string> errors;  // what could not be removed, and why
};

// Removes every entry of each of `dirs` that `uid` owns (with what it
// holds), and its entries inside the world-writable dirs of others there
// (see above), except the dirs in `keep` (the daemon's state dir, which may
// be one of /tmp's entries: its job dirs are the daemon's to handle), and
// every System V shared memory segment, semaphore set and message queue
// `uid` owns or created. A dir in `dirs` or `keep` that does not exist is
// skipped. The uid should have no process left (the agent kills them
// first), or it could make more. `stop`, if given, is looked at between
// entries: once it is true the removal ends where it is (an error says so)
// and what is left stays.
Leftovers RemoveUidLeftovers(uint32_t uid, const std::vector<std::string>& dirs,
                             const std::vector<std::string>& keep,
                             const std::atomic<bool>* stop = nullptr);

// The owner of each entry of `dir` (not followed through symlinks), by
// name; empty if it cannot be listed. The agent's look at its job dirs.
std::map<std::string, uint32_t> EntryOwners(const std::string& dir);

// Removes `path` and all it holds, to any depth, never through a symlink
// (its parent is opened, then every step is relative to an open
// directory). A path that does not exist is no error. `stop` as above.
Leftovers RemoveTree(const std::string& path, const std::atomic<bool>* stop = nullptr);

// Gives what `from` owns of `path` and all it holds to `uid`:`gid` (a
// returned uid's job dir, to root), to any depth and never through a
// symlink (a link itself changes owner), with one directory open at a
// time: a job dir deeper than PATH_MAX changes owner all the way down (a
// path-based walk, nftw and lchown, fails on every entry whose path is
// longer). What others own stays theirs: a hard link the job made to
// another's file (where fs.protected_hardlinks is off) does not hand that
// file to `uid`. `files` counts what changed owner; `stop` as above.
Leftovers ChownTree(const std::string& path, uint32_t from, uint32_t uid, uint32_t gid,
                    const std::atomic<bool>* stop = nullptr);

// Whether RemoveUidLeftovers(uid, dirs, keep) would find anything: an entry
// it would remove, or a System V object `uid` owns or created. What it
// finds is not removed.
bool HasUidLeftovers(uint32_t uid, const std::vector<std::string>& dirs,
                     const std::vector<std::string>& keep);

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_UID_LEFTOVERS_H_
