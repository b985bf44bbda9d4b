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
// Thread safety: pure functions of their arguments and the kernel log.
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
std::optional<std::string> FindOomKill(pid_t pid, int64_t since_mono_ns,
                                       const std::string& kmsg = "/dev/kmsg");

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_OOM_H_
