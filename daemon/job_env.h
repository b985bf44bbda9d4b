// JobEnvPolicy: which variables a job's `--env` may set. The job environment
// is an allow-list: the engine's own knobs (kEngineEnv) plus the names the
// operator permits (`lockstepd --allowed-env NAME`, `PREFIX*`, or `*` for
// any name). Variables
// that make a process run code other than its command (the dynamic loader's
// LD_*, glibc's GCONV_PATH and GLIBC_TUNABLES, shell startup files) are
// refused whatever the allow-list says; on a node with --allowed-command so
// are PATH and the interpreters' search paths and option variables
// (PYTHONPATH, NODE_OPTIONS, ...), which would pick or change the program
// the allow-list names. And the worker contract's names (LOCKSTEP_RANK,
// RANK, MASTER_PORT, ...) belong to the agent.
//
// Both the coordinator (on submit) and each agent (before it spawns
// anything, with its own flags) check a spec, as with --allowed-command.
//
// Thread safety: pure functions.
#ifndef LOCKSTEP_DAEMON_JOB_ENV_H_
#define LOCKSTEP_DAEMON_JOB_ENV_H_

#include <string>
#include <vector>

#include "common/status.h"
#include "lockstep/v1/common.pb.h"

namespace lockstep {
namespace daemon {

// Always permitted: the engine's and its libraries' own settings.
inline const std::vector<std::string>& kEngineEnv() {
  static const auto* names = new std::vector<std::string>{
      "LOCKSTEP_BACKEND", "LOCKSTEP_GLOO_HOST", "LOCKSTEP_LOG_LEVEL", "LOCKSTEP_KEEP_FREED_MEMORY",
      "NCCL_*",           "GLOO_*",             "OMP_NUM_THREADS",    "MKL_NUM_THREADS",
      "CUDA_VISIBLE_DEVICES"};
  return *names;
}

struct JobEnvPolicy {
  // Names or `PREFIX*` patterns the operator permits beyond kEngineEnv.
  std::vector<std::string> allowed;
  // The node restricts command[0] (--allowed-command): PATH and the
  // interpreters' variables are refused too.
  bool command_allow_list = false;
};

// OK, or PermissionDenied naming the first variable refused and why
// (a loader variable; not in the allow-list, with the flag that permits it;
// a worker-contract name). InvalidArgument for a malformed pattern.
Status CheckJobEnv(const v1::JobSpec& spec, const JobEnvPolicy& policy);

// InvalidArgument naming a pattern that is not NAME, PREFIX* or * (for the flag).
Status ValidateEnvPatterns(const std::vector<std::string>& patterns);

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_JOB_ENV_H_
