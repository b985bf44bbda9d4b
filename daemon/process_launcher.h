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
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace lockstep {
namespace daemon {

struct LaunchSpec {
  // argv[0] without a '/' is looked up as execvp does, in the PATH of `env`
  // (default /bin:/usr/bin), not the agent's; a relative path with a '/' is
  // taken from working_dir.
  std::vector<std::string> argv;
  std::vector<std::string> env;   // the complete environment, "KEY=VALUE"
  std::string working_dir;        // empty: inherit
  // The agent made working_dir for this job: with run_as, it is given to
  // the worker's user so the worker can write its own working directory.
  // Never set for a directory the job spec named.
  bool own_working_dir = false;
  // Opened O_APPEND|O_CREAT, mode 0640, never through a symlink: a
  // non-regular entry there is replaced by a new file (log_files.h).
  std::string stdout_path;
  std::string stderr_path;
  // Written to each log file once it is open, before the process starts
  // (the agent's "=== lockstep: job ... ===" line).
  std::string log_header;
  int64_t max_open_files = 0;     // RLIMIT_NOFILE; 0 = inherit
  int64_t max_address_space = 0;  // RLIMIT_AS bytes; 0 = inherit
  int64_t max_cpu_seconds = 0;    // RLIMIT_CPU; 0 = inherit
  int64_t max_processes = 0;      // RLIMIT_NPROC (the uid's processes and threads); 0 = inherit
  std::string run_as;             // user name or uid; empty = the agent's user
  // Nonzero: run as this uid with gid the same number and no supplementary
  // groups, with no passwd entry needed (a job's own uid, lockstepd
  // --job-uids). Takes precedence over run_as.
  uint32_t run_as_uid = 0;
  // Descriptors the worker inherits under the same numbers (the caller
  // opens them O_CLOEXEC; the child clears the flag on these only).
  std::vector<int> inherit_fds;
  // Called once, from a watcher thread, the moment the process exits (so
  // the caller can report it at once instead of at its next poll). Must be
  // thread-safe and must not block.
  std::function<void()> on_exit;
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
  // Starts the process. Every error names the program (argv[0]) and what
  // was wrong. Two kinds (IsPermanentLaunchError tells them apart):
  //  - permanent, the same on every try:
  //    InvalidArgument: empty argv.
  //    NotFound: exec ENOENT (with the PATH searched, or the note that the
  //      file exists and its interpreter does not), the working dir is
  //      missing, run_as names no user.
  //    PermissionDenied: exec or chdir EACCES/EPERM, run_as is root or a
  //      user the agent cannot switch to, a resource limit above the hard
  //      limit.
  //    FailedPrecondition: any other exec or chdir error that a retry
  //      cannot change (ENOEXEC, ENOTDIR, ELOOP, ENAMETOOLONG, EISDIR,
  //      E2BIG, EINVAL, ELIBBAD).
  //  - transient, Unavailable: the node is short of something for now
  //    (fork, pipe, the log files, the user database, ENOMEM/EAGAIN/EMFILE
  //    at exec).
  virtual StatusOr<std::unique_ptr<Process>> Launch(const LaunchSpec& spec) = 0;
};

// True for the codes Launch uses for a launch that cannot succeed on retry
// (InvalidArgument, NotFound, PermissionDenied, FailedPrecondition); false
// for OK and for Unavailable and any other code.
bool IsPermanentLaunchError(const Status& status);

// The fork/exec launcher described above.
std::unique_ptr<ProcessLauncher> NewPosixProcessLauncher();

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_PROCESS_LAUNCHER_H_
