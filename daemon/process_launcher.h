// ProcessLauncher: the OS boundary for starting and stopping workers, so
// the agent core is tested against real processes or a fake.
//
// The POSIX launcher forks and execs each worker as the leader of its own
// process group (signals go to the whole group, so helpers a worker starts
// are stopped with it), with stdin from /dev/null, stdout/stderr appended
// to files, the given working dir, resource limits and user. The child gets
// PR_SET_PDEATHSIG(SIGKILL): if the thread that launched it dies (the agent
// is killed with -9), the worker dies too and is never orphaned. Launch
// must therefore be called from a thread that lives as long as the agent.
//
// Thread safety: Launch may be called from one thread at a time; a Process
// is used by one thread at a time.
#ifndef LOCKSTEP_DAEMON_PROCESS_LAUNCHER_H_
#define LOCKSTEP_DAEMON_PROCESS_LAUNCHER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace lockstep {
namespace daemon {

struct LaunchSpec {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH if it has no '/'
  std::vector<std::string> env;   // the complete environment, "KEY=VALUE"
  std::string working_dir;        // empty: inherit
  std::string stdout_path;        // opened O_APPEND|O_CREAT, mode 0640
  std::string stderr_path;
  int64_t max_open_files = 0;     // RLIMIT_NOFILE; 0 = inherit
  int64_t max_address_space = 0;  // RLIMIT_AS bytes; 0 = inherit
  int64_t max_cpu_seconds = 0;    // RLIMIT_CPU; 0 = inherit
  std::string run_as;             // user name or uid; empty = the agent's user
};

struct ExitStatus {
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;     // terminating signal
  // When it exited, on the real monotonic clock: a watcher thread per
  // process sees the exit at once (waitid with WNOWAIT), however late Poll
  // is called. Default-constructed (epoch) when unknown.
  std::chrono::steady_clock::time_point exited_at;
};

class Process {
 public:
  virtual ~Process() = default;
  virtual int64_t pid() const = 0;
  // Non-blocking: reaps the process if it exited and returns how; nullopt
  // while it runs. Once it returned a value it keeps returning it. After
  // the leader exits, stragglers in its group get SIGKILL.
  virtual std::optional<ExitStatus> Poll() = 0;
  // Sends `sig` to the whole process group (no-op once reaped).
  virtual void SignalGroup(int sig) = 0;
};

class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;
  // Starts the process. Errors: InvalidArgument (empty argv), NotFound /
  // PermissionDenied (exec failed, naming the program and errno text;
  // run_as names root or a user the agent cannot switch to), Unavailable
  // (fork or file errors naming the path).
  virtual StatusOr<std::unique_ptr<Process>> Launch(const LaunchSpec& spec) = 0;
};

// The fork/exec launcher described above.
std::unique_ptr<ProcessLauncher> NewPosixProcessLauncher();

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_PROCESS_LAUNCHER_H_
