// Validation and defaults for JobSpec, shared by the coordinator (on
// submit) and the agent (defence in depth before it spawns anything).
#ifndef LOCKSTEP_DAEMON_JOB_SPEC_H_
#define LOCKSTEP_DAEMON_JOB_SPEC_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/ids.h"
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

// The whole spec, serialized (256 KiB). A spec rides in every heartbeat
// response of each node that runs it and in every ListJobs/GetJob answer,
// so it stays far below rendezvous::kMaxGrpcMessageBytes (64 MiB): 256
// specs of the largest size still fit one message.
inline constexpr size_t kMaxJobSpecBytes = 256 * 1024;
// Per-field size limits, in bytes (the total above still applies).
inline constexpr size_t kMaxJobNameBytes = 256;
inline constexpr size_t kMaxPathBytes = 4096;    // command[0], working_dir (PATH_MAX)
inline constexpr size_t kMaxRunAsBytes = 256;    // a user name or uid
inline constexpr size_t kMaxArgBytes = 128 * 1024;  // one argv or env string (MAX_ARG_STRLEN)
inline constexpr int kMaxArgs = 4096;            // command entries
inline constexpr int kMaxEnvEntries = 1024;
inline constexpr size_t kMaxEnvNameBytes = 256;
// Durations, in seconds: finite, >= 0 and at most these.
inline constexpr double kMaxStopGraceSeconds = 3600.0;              // an hour
inline constexpr double kMaxLastCallSeconds = 86400.0;              // a day
inline constexpr double kMaxJoinTimeoutSeconds = 365 * 86400.0;     // a year; 0 = no limit
// Resource limits: 0 = inherit, else at most these.
inline constexpr int64_t kMaxOpenFilesLimit = int64_t{1} << 20;      // Linux's default nr_open
inline constexpr int64_t kMaxAddressSpaceLimit = int64_t{1} << 50;   // 1 PiB
inline constexpr int64_t kMaxCpuSecondsLimit = int64_t{365} * 86400; // a year
inline constexpr int64_t kMaxProcessesLimit = int64_t{1} << 22;      // Linux's PID_MAX_LIMIT
// lockstepd --max-processes: a job uid's processes and threads on a node
// unless the job asks for fewer; the shipped units' LimitNPROC.
inline constexpr int64_t kDefaultMaxJobProcesses = 8192;

// Returns InvalidArgument naming the field ("spec.command", "spec.nodes",
// "spec.nproc_per_node", ...) and quoting at most a short prefix of the bad
// value (QuoteForError) for a bad spec: over kMaxJobSpecBytes (naming its
// size; measured with ApplyJobSpecDefaults' fields filled in, as agents get
// it) or a field over its limit above; a NUL anywhere; a newline or other
// control character in name, working_dir, run_as or command[0]; an env name
// not [A-Za-z_][A-Za-z0-9_]*; a duration not finite, negative or over its
// maximum; a resource limit negative or over its maximum; a relative
// command[0] with a '/' ("./train") unless working_dir is absolute;
// PermissionDenied when `allowed_commands` is non-empty and command[0] is
// not in it, or when run_as names root ("root", or digits that read as uid
// 0: "0", "00", " 0", as the agent's user lookup reads them).
Status ValidateJobSpec(const v1::JobSpec& spec, const std::vector<std::string>& allowed_commands);

// A string field of a request: at most `max_bytes`, no NUL; with
// `single_line`, no control characters at all (newline, ESC, ...).
// InvalidArgument "<field>: ..." naming the limit or the character, the
// value quoted short and escaped.
Status CheckString(const std::string& field, const std::string& value, size_t max_bytes,
                   bool single_line);

// Whether a run_as (a job's, or lockstepd --run-as) names root: "root", or
// digits that read as uid 0.
bool NamesRoot(const std::string& run_as);

// Fills defaults (max_nodes = min_nodes when 0, stop grace, last call).
// REQUIRES: ValidateJobSpec(spec) is OK.
void ApplyJobSpecDefaults(v1::JobSpec* spec);

// True if `name` is a variable name: [A-Za-z_][A-Za-z0-9_]*.
bool IsEnvName(const std::string& name);

// IsSafeId (common/ids.h): a job id that can name a directory under the
// state dir.
using ::lockstep::IsSafeId;

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_JOB_SPEC_H_
