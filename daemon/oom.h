// Whether the kernel's OOM killer killed a worker. A worker killed by
// SIGKILL that its agent did not send was killed by the worker itself, by
// another process, or by the kernel for want of memory (the host's, or a
// memory cgroup's limit: a container's, a systemd unit's MemoryMax=).
// Only the kernel log says which: the OOM killer writes "Out of memory:
// Killed process <pid> (<comm>) ..." ("Memory cgroup out of memory: ..."
// for a cgroup's limit) just before it sends the signal. The agent reads
// /dev/kmsg, which needs root or kernel.dmesg_restrict=0, so that `status`
// can say "out of memory" as Kubernetes says OOMKilled.
//
// Where the kernel log cannot be read (the shipped systemd units, whose
// sandbox leaves /dev/kmsg out; most containers), the worker's memory
// cgroup says it instead: the kernel counts
// every process its OOM killer kills in the victim's memory cgroup
// ("oom_kill N" in memory.events on cgroup v2, memory.oom_control on v1).
// The agent notes each worker's memory cgroup and its count while the
// worker lives; a SIGKILL it did not send, with the count risen since, is
// taken as the OOM killer's (one kill counted is given to one worker).
//
// Thread safety: pure functions of their arguments, the kernel log, /proc
// and the cgroup file system.
#ifndef LOCKSTEP_DAEMON_OOM_H_
#define LOCKSTEP_DAEMON_OOM_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace lockstep {
namespace daemon {

// Kernel log times (the printk clock) and CLOCK_MONOTONIC may drift apart
// by this much; a record up to this much before a worker's launch still
// counts as after it.
inline constexpr int64_t kKernelLogSlackNs = int64_t{10} * 1000 * 1000 * 1000;

// One /dev/kmsg record, "<prio>,<seq>,<time us>,<flags>[,...];<text>":
// its time (microseconds on the kernel's clock since boot) and text; false
// for anything else (a continuation line " KEY=value", garbage).
bool ParseKmsgRecord(absl::string_view record, int64_t* time_us, std::string* text);

// Whether `text` is the OOM killer's record of killing `pid`.
bool IsOomKillOf(absl::string_view text, pid_t pid);

// The OOM killer's record of killing `pid` at or after `since_mono_ns`
// (the worker's launch, CLOCK_MONOTONIC, less kKernelLogSlackNs: a pid used
// before is not mistaken for it), read from `kmsg` (a /dev/kmsg-like
// device that returns one record per read, or a file of records, one per
// line); nullopt when there is none or the log cannot be read.
// `*readable` (if given) says whether `kmsg` could be read at all: where it
// cannot, nullopt says nothing.
std::optional<std::string> FindOomKill(pid_t pid, int64_t since_mono_ns,
                                       const std::string& kmsg = "/dev/kmsg",
                                       bool* readable = nullptr);

// The file in which the kernel counts the OOM kills of a memory cgroup.
struct OomCounter {
  std::string cgroup;  // as /proc/<pid>/cgroup names it ("/system.slice/x.service")
  std::string file;    // <root>/<cgroup>/memory.events (v2) or <root>/memory/<cgroup>/memory.oom_control (v1)
};

// The OOM counter of the memory cgroup that `proc_cgroup` (the text of
// /proc/<pid>/cgroup) puts its process in, under `cgroup_root`: the v1
// memory hierarchy's line where there is one, else the v2 line ("0::").
// Where that file does not exist and the cgroup lies within the one that
// `self_proc_cgroup` (this process's /proc/self/cgroup) names, the path
// below this process's cgroup is tried from the root: a container on
// cgroup v1 without a cgroup namespace mounts its own cgroup there while
// /proc names the host's path.
std::optional<OomCounter> OomCounterOf(absl::string_view proc_cgroup,
                                       const std::string& cgroup_root = "/sys/fs/cgroup",
                                       absl::string_view self_proc_cgroup = "");

// The same for a live process; nullopt once it has exited (a zombie shows
// the root cgroup on v1 hierarchies).
std::optional<OomCounter> OomCounterOfPid(pid_t pid);

// The "oom_kill N" count in `file`; nullopt when it cannot be read or has
// none (a kernel before 4.13, or a v2 cgroup without the memory controller).
std::optional<int64_t> ReadOomKills(const std::string& file);

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_OOM_H_
