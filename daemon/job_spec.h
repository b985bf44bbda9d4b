// Validation and defaults for JobSpec, shared by the coordinator (on
// submit) and the agent (defence in depth before it spawns anything).
#ifndef LOCKSTEP_DAEMON_JOB_SPEC_H_
#define LOCKSTEP_DAEMON_JOB_SPEC_H_

#include <string>
#include <vector>

#include "common/status.h"
#include "lockstep/v1/common.pb.h"

namespace lockstep {
namespace daemon {

// Default: SIGTERM-to-SIGKILL grace when the spec leaves stop_grace_s 0.
inline constexpr double kDefaultStopGraceSeconds = 10.0;
// Default: how long an open round waits for more than min nodes.
inline constexpr double kDefaultLastCallSeconds = 2.0;
// Limits on a spec, so one submit cannot exhaust the coordinator.
inline constexpr int kMaxNodes = 1024;
inline constexpr int kMaxProcPerNode = 256;
inline constexpr int kMaxRestarts = 1000;

// Returns InvalidArgument naming the field ("spec.command", "spec.nodes",
// "spec.nproc_per_node", ...) for a bad spec, including a relative
// command[0] with a '/' ("./train") unless working_dir is absolute;
// PermissionDenied when `allowed_commands` is non-empty and command[0] is
// not in it, or when run_as names root.
Status ValidateJobSpec(const v1::JobSpec& spec, const std::vector<std::string>& allowed_commands);

// Fills defaults (max_nodes = min_nodes when 0, stop grace, last call).
// REQUIRES: ValidateJobSpec(spec) is OK.
void ApplyJobSpecDefaults(v1::JobSpec* spec);

// True if `id` is a safe path component for job ids ([A-Za-z0-9._-], not
// "." or ".."), so ids can name directories under the state dir.
bool IsSafeId(const std::string& id);

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_JOB_SPEC_H_
