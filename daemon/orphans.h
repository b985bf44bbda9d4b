// Processes a worker left behind. A worker's descendants that left its
// process group (setsid, a daemon's double fork) outlive the agent's kill
// of the group, and keep what they hold (a port, GPU memory, files) into
// the next round and past the job. With the agent a child subreaper
// (PR_SET_CHILD_SUBREAPER) such a process becomes the agent's child when
// its parent dies; the agent finds it among its children, tells it from
// its workers, and reads the job and round it belongs to from its
// environment (LOCKSTEP_JOB_ID, LOCKSTEP_ROUND, LOCKSTEP_AGENT, which every
// worker's descendants inherit unless they clear them), as HTCondor's procd
// tracks a job's processes by an inherited environment marker.
//
// Thread safety: pure functions of /proc.
#ifndef LOCKSTEP_DAEMON_ORPHANS_H_
#define LOCKSTEP_DAEMON_ORPHANS_H_

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace lockstep {
namespace daemon {

// Makes this process the child subreaper of its descendants; false (errno
// set) where the kernel refuses.
bool BecomeChildSubreaper();

// Every process's pid, from /proc, ascending.
std::vector<pid_t> AllPids();

// The pids whose parent is `parent`: from its threads' /proc children lists
// where the kernel has them, else from every process's /proc/<pid>/stat.
std::vector<pid_t> ChildrenOf(pid_t parent);
// The same from every process's /proc/<pid>/stat alone: ChildrenOf's way on
// a kernel without children lists.
std::vector<pid_t> ChildrenOfByScan(pid_t parent);

// The values of `names` in /proc/<pid>/environ (the environment the process
// was started with; the first entry of a name, as getenv reads it); a name
// that is not there is absent. None when the file
// cannot be read or reads empty: a zombie, a process gone, another uid's
// without privilege, or one in the middle of an execve (the kernel shows no
// environment until the new program's is set up), which a later read sees.
std::optional<std::map<std::string, std::string>> EnvironOf(pid_t pid,
                                                            const std::vector<std::string>& names);

// The process's command name (/proc/<pid>/comm), or "?".
std::string CommOf(pid_t pid);

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_ORPHANS_H_
