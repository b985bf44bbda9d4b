#include "daemon/process_launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/log_files.h"

namespace lockstep {
namespace daemon {
namespace {

// The instant a child exited, seen by a watcher thread blocked in waitid
// with WNOWAIT (it does not reap: Poll does). Shared, because the detached
// watcher may outlive the Process.
struct ExitWatch {
  std::atomic<int64_t> exited_ns{0};  // steady_clock since epoch; 0 = not yet
};

class PosixProcess : public Process {
 public:
  PosixProcess(pid_t pid, std::function<void()> on_exit)
      : pid_(pid), watch_(std::make_shared<ExitWatch>()) {
    std::thread([pid, watch = watch_, on_exit = std::move(on_exit)] {
      // The instant is read when this thread runs: on a loaded host a
      // plain thread may run milliseconds late, enough to order a killed
      // rank after the peer that failed 5 ms later. Where the agent may
      // (root: CAP_SYS_NICE), the watcher runs at real-time priority and
      // wakes at once; it only waits and reads a clock.
      sched_param rt{};
      rt.sched_priority = 1;
      (void)pthread_setschedparam(pthread_self(), SCHED_FIFO, &rt);
      siginfo_t info{};
      while (::waitid(P_PID, pid, &info, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
      }
      watch->exited_ns.store(std::chrono::steady_clock::now().time_since_epoch().count());
      if (on_exit) on_exit();
    }).detach();
  }
  ~PosixProcess() override {
    if (!exit_) {
      ::kill(-pid_, SIGKILL);
      int st;
      ::waitpid(pid_, &st, 0);
    }
  }
  int64_t pid() const override { return pid_; }

  std::optional<ExitStatus> Poll() override {
    if (exit_) return exit_;
    int st = 0;
    pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == 0) return std::nullopt;
    ExitStatus e;
    if (r < 0) {
      e.exit_code = 255;  // lost (ECHILD): someone else reaped it
    } else if (WIFSIGNALED(st)) {
      e.signal = WTERMSIG(st);
    } else {
      e.exit_code = WEXITSTATUS(st);
    }
    const int64_t seen = watch_->exited_ns.load();
    e.exited_at = seen != 0 ? std::chrono::steady_clock::time_point(
                                  std::chrono::steady_clock::duration(seen))
                            : std::chrono::steady_clock::now();
    ::kill(-pid_, SIGKILL);  // stragglers left in the group
    exit_ = e;
    return exit_;
  }

  void SignalGroup(int sig) override {
    if (!exit_) ::kill(-pid_, sig);
  }

 private:
  pid_t pid_;
  std::shared_ptr<ExitWatch> watch_;
  std::optional<ExitStatus> exit_;
};

struct User {
  uid_t uid;
  gid_t gid;
  std::vector<gid_t> groups;
  std::string name;
};

StatusOr<User> LookupUser(const std::string& who) {
  struct passwd pw, *result = nullptr;
  std::vector<char> buf(16384);
  uint32_t numeric;
  int rc;
  if (absl::SimpleAtoi(who, &numeric)) {
    rc = getpwuid_r(numeric, &pw, buf.data(), buf.size(), &result);
  } else {
    rc = getpwnam_r(who.c_str(), &pw, buf.data(), buf.size(), &result);
  }
  if (rc != 0) {
    // The user database could not be read (an NSS backend such as LDAP is
    // down): that may pass, unlike a user that does not exist.
    return absl::UnavailableError(
        absl::StrCat("run_as: cannot look up user \"", who, "\": ", std::strerror(rc)));
  }
  if (result == nullptr) {
    return absl::NotFoundError(absl::StrCat("run_as: no such user \"", who, "\""));
  }
  User u{pw.pw_uid, pw.pw_gid, {}, pw.pw_name};
  int n = 64;
  u.groups.resize(n);
  if (getgrouplist(pw.pw_name, pw.pw_gid, u.groups.data(), &n) < 0) {
    u.groups.resize(n);
    getgrouplist(pw.pw_name, pw.pw_gid, u.groups.data(), &n);
  }
  u.groups.resize(n);
  return u;
}

// Where a forked child failed, reported with errno through the pipe
// (redirecting and inheriting descriptors report 1).
enum ChildStage : int {
  kRedirect = 1,
  kChdir = 2,
  kNoFileLimit = 3,
  kAddressSpaceLimit = 4,
  kCpuLimit = 5,
  kSwitchUser = 6,
  kExec = 7,
  kProcessLimit = 8,
};

// What execvp searches when the environment has no PATH (glibc's CS_PATH).
constexpr char kDefaultSearchPath[] = "/bin:/usr/bin";

// Errors for which execvp's PATH search moves on to the next directory.
bool SkippedInPathSearch(int err) {
  return err == EACCES || err == ENOENT || err == ENOTDIR || err == ESTALE || err == ENODEV ||
         err == ETIMEDOUT;
}

// The code for a failed chdir or exec (the header lists which are
// permanent): the path, its mode or its format are wrong, and a retry finds
// them as they are; anything else is the node being short of something.
absl::StatusCode PathErrorCode(int err) {
  switch (err) {
    case ENOENT:
      return absl::StatusCode::kNotFound;
    case EACCES:
    case EPERM:
      return absl::StatusCode::kPermissionDenied;
    case ENOEXEC:
    case ENOTDIR:
    case ELOOP:
    case ENAMETOOLONG:
    case EISDIR:
    case E2BIG:
    case EINVAL:
    case ELIBBAD:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kUnavailable;
  }
}

// Launch's error for a child that failed at `stage` with errno `err`.
// `search_path` is the PATH searched when argv[0] has no '/'; `uid` the
// user the worker was to run as.
Status ChildFailure(const LaunchSpec& spec, const std::string& search_path, uid_t uid,
                    int stage, int err) {
  const std::string& program = spec.argv[0];
  const bool searched = program.find('/') == std::string::npos;
  std::string what, hint;
  absl::StatusCode code = absl::StatusCode::kUnavailable;
  switch (stage) {
    case kRedirect:
      what = "redirecting stdin, stdout and stderr";
      break;
    case kChdir:
      what = absl::StrCat("chdir to working dir ", spec.working_dir);
      code = PathErrorCode(err);
      if (err == EACCES) hint = absl::StrCat(" (uid ", uid, " cannot enter it)");
      break;
    case kNoFileLimit:
      what = absl::StrCat("setrlimit RLIMIT_NOFILE to ", spec.max_open_files);
      break;
    case kAddressSpaceLimit:
      what = absl::StrCat("setrlimit RLIMIT_AS to ", spec.max_address_space);
      break;
    case kCpuLimit:
      what = absl::StrCat("setrlimit RLIMIT_CPU to ", spec.max_cpu_seconds);
      break;
    case kProcessLimit:
      what = absl::StrCat("setrlimit RLIMIT_NPROC to ", spec.max_processes);
      break;
    case kSwitchUser:
      what = absl::StrCat("switching to user \"", spec.run_as, "\"");
      break;
    case kExec: {
      what = absl::StrCat("exec \"", program, "\"");
      code = PathErrorCode(err);
      if (searched && err == ENOENT) {
        hint = absl::StrCat(" (not found in PATH=", search_path, "; give an absolute path)");
      } else if (searched && err == EACCES) {
        hint = absl::StrCat(" (found in PATH=", search_path, " but not executable by uid ", uid,
                            ")");
      } else if (err == ENOENT) {
        // execve says ENOENT too when the file is there but the
        // interpreter its #! line or ELF header names is not.
        std::string path = program[0] == '/' || spec.working_dir.empty()
                               ? program
                               : absl::StrCat(spec.working_dir, "/", program);
        struct stat st;
        if (::stat(path.c_str(), &st) == 0) {
          hint = " (the file exists: the interpreter its #! line or ELF header names is missing)";
        } else if (program[0] != '/') {
          hint = absl::StrCat(" (relative to the working dir ",
                              spec.working_dir.empty() ? "of the agent" : spec.working_dir, ")");
        }
      } else if (err == EACCES) {
        hint = absl::StrCat(" (uid ", uid,
                            " cannot execute it: check its mode, the x bits of its directories "
                            "and noexec mounts)");
      } else if (err == ENOEXEC) {
        hint = " (not a format this machine runs: another architecture, or a damaged file)";
      }
      break;
    }
  }
  if (stage >= kNoFileLimit && stage <= kSwitchUser) {
    // EPERM: a limit above the agent's hard limit, or a user it may not
    // become, on every try; EAGAIN (the user is at RLIMIT_NPROC) may pass.
    if (err == EPERM) code = absl::StatusCode::kPermissionDenied;
    if (err == EINVAL) code = absl::StatusCode::kFailedPrecondition;
  }
  return Status(code, absl::StrCat("launch ", program, ": ", what, ": ", std::strerror(err), hint));
}

class PosixProcessLauncher : public ProcessLauncher {
 public:
  StatusOr<std::unique_ptr<Process>> Launch(const LaunchSpec& spec) override {
    if (spec.argv.empty() || spec.argv[0].empty()) {
      return absl::InvalidArgumentError("launch: empty command");
    }
    const std::string context = absl::StrCat("launch ", spec.argv[0]);
    std::optional<User> user;
    if (spec.run_as_uid != 0) {
      user = User{spec.run_as_uid, spec.run_as_uid, {}, absl::StrCat("uid ", spec.run_as_uid)};
      if (::geteuid() != 0) {
        return absl::PermissionDeniedError(absl::StrCat(
            context, ": run as uid ", spec.run_as_uid, ": the agent runs as uid ", ::geteuid(),
            " and cannot switch users (run lockstepd as root)"));
      }
    } else if (!spec.run_as.empty()) {
      auto found = LookupUser(spec.run_as);
      if (!found.ok()) return Annotate(found.status(), context);
      user = *std::move(found);
      if (user->uid == 0) {
        return absl::PermissionDeniedError(absl::StrCat(
            context, ": run_as \"", spec.run_as, "\": workers never run as root"));
      }
      if (::geteuid() != 0 && ::geteuid() != user->uid) {
        return absl::PermissionDeniedError(absl::StrCat(
            context, ": run_as \"", spec.run_as, "\": the agent runs as uid ", ::geteuid(),
            " and cannot switch users (run lockstepd as root to use run_as)"));
      }
    }
    const uid_t worker_uid = user ? user->uid : ::geteuid();
    // execvpe would search the agent's PATH; the worker's is the one its
    // owner set. The candidates are built here: the child may only make
    // async-signal-safe calls.
    const bool search = spec.argv[0].find('/') == std::string::npos;
    std::string search_path = kDefaultSearchPath;
    for (const auto& e : spec.env) {
      if (e.rfind("PATH=", 0) == 0) search_path = e.substr(5);
    }
    std::vector<std::string> exec_paths;
    if (search) {
      for (absl::string_view dir : absl::StrSplit(search_path, ':')) {
        exec_paths.push_back(dir.empty() ? "./" + spec.argv[0]
                                         : absl::StrCat(dir, "/", spec.argv[0]));
      }
    } else {
      exec_paths.push_back(spec.argv[0]);
    }
    std::vector<char*> argv;
    for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);

    // The job's uid owns the job dir: a log file there may have been
    // replaced by a symlink, which root must not follow (log_files.h).
    auto open_out = [&context, &spec](const std::string& path) -> StatusOr<int> {
      if (path.empty()) return ::open("/dev/null", O_WRONLY | O_CLOEXEC);
      StatusOr<int> fd = OpenLogForAppend(path);
      if (!fd.ok()) return absl::UnavailableError(absl::StrCat(context, ": ", fd.status().message()));
      if (!spec.log_header.empty()) {
        (void)!::write(*fd, spec.log_header.data(), spec.log_header.size());
      }
      return fd;
    };
    ASSIGN_OR_RETURN(int out_fd, open_out(spec.stdout_path));
    auto err_fd_or = open_out(spec.stderr_path);
    if (!err_fd_or.ok()) {
      ::close(out_fd);
      return err_fd_or.status();
    }
    int err_fd = *err_fd_or;
    int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    int pipefd[2];
    if (::pipe2(pipefd, O_CLOEXEC) != 0) {
      ::close(out_fd);
      ::close(err_fd);
      ::close(null_fd);
      return absl::UnavailableError(absl::StrCat(context, ": pipe: ", std::strerror(errno)));
    }
    if (user && user->uid != ::geteuid()) {
      // The files, and the job dir the agent made as the working dir, belong
      // to the worker's user so it can reopen them and write its cwd. Given
      // through the descriptors just opened, never by path: a path in a dir
      // the job owns may have become a symlink since.
      const int dir_fd = spec.own_working_dir && !spec.working_dir.empty()
                             ? ::open(spec.working_dir.c_str(),
                                      O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                             : -2;
      const int dir_err = errno;
      const std::string* paths[] = {&spec.stdout_path, &spec.stderr_path, &spec.working_dir};
      const int fds[] = {spec.stdout_path.empty() ? -2 : out_fd,
                         spec.stderr_path.empty() ? -2 : err_fd, dir_fd};
      for (int i = 0; i < 3; ++i) {
        if (fds[i] == -2 || (fds[i] >= 0 && ::fchown(fds[i], user->uid, user->gid) == 0)) continue;
        int err = fds[i] == -1 ? dir_err : errno;
        if (dir_fd >= 0) ::close(dir_fd);
        for (int fd : {out_fd, err_fd, null_fd, pipefd[0], pipefd[1]}) ::close(fd);
        // The node's log dir, not the job's program, is at fault.
        return absl::UnavailableError(absl::StrCat(context, ": cannot give ", *paths[i],
                                                   " to uid ", user->uid, ": ",
                                                   std::strerror(err)));
      }
      if (dir_fd >= 0) ::close(dir_fd);
    }
    pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) {
      int err = errno;
      ::close(out_fd);
      ::close(err_fd);
      ::close(null_fd);
      ::close(pipefd[0]);
      ::close(pipefd[1]);
      return absl::UnavailableError(absl::StrCat(context, ": fork: ", std::strerror(err)));
    }
    if (pid == 0) {
      // Child: async-signal-safe calls only.
      auto fail = [&](int stage) {
        int msg[2] = {stage, errno};
        (void)!::write(pipefd[1], msg, sizeof(msg));
        ::_exit(127);
      };
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      sigset_t all;
      sigemptyset(&all);
      ::sigprocmask(SIG_SETMASK, &all, nullptr);
      for (int sig = 1; sig < NSIG; ++sig) {
        if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
      }
      if (::dup2(null_fd, 0) < 0 || ::dup2(out_fd, 1) < 0 || ::dup2(err_fd, 2) < 0) fail(1);
      for (int fd : spec.inherit_fds) {
        if (::fcntl(fd, F_SETFD, 0) != 0) fail(1);
      }
      if (spec.own_working_dir && !spec.working_dir.empty() &&
          ::chdir(spec.working_dir.c_str()) != 0) {
        fail(kChdir);
      }
      struct rlimit rl;
      if (spec.max_open_files > 0) {
        rl.rlim_cur = rl.rlim_max = spec.max_open_files;
        if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) fail(kNoFileLimit);
      }
      if (spec.max_address_space > 0) {
        rl.rlim_cur = rl.rlim_max = spec.max_address_space;
        if (::setrlimit(RLIMIT_AS, &rl) != 0) fail(kAddressSpaceLimit);
      }
      if (spec.max_cpu_seconds > 0) {
        rl.rlim_cur = rl.rlim_max = spec.max_cpu_seconds;
        if (::setrlimit(RLIMIT_CPU, &rl) != 0) fail(kCpuLimit);
      }
      if (spec.max_processes > 0) {
        rl.rlim_cur = rl.rlim_max = spec.max_processes;
        if (::setrlimit(RLIMIT_NPROC, &rl) != 0) fail(kProcessLimit);
      }
      if (user && user->uid != ::geteuid()) {
        if (::setgroups(user->groups.size(), user->groups.data()) != 0) fail(kSwitchUser);
        if (::setgid(user->gid) != 0) fail(kSwitchUser);
        if (::setuid(user->uid) != 0) fail(kSwitchUser);
        // Changing the effective uid or gid clears the parent-death signal
        // (prctl(2)): set it again, or a worker of a job uid would outlive
        // a killed agent.
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) ::_exit(127);
      }
      // A working dir the spec named is entered as the worker's user: one it
      // may not enter is refused, not entered with root's rights (which kept
      // the worker there, and told a job whether any path on the node
      // existed). The job dir the agent made (now the worker's) is entered
      // before the switch, above: its parents, the agent's state dir, need
      // not be open to the worker.
      if (!spec.own_working_dir && !spec.working_dir.empty() &&
          ::chdir(spec.working_dir.c_str()) != 0) {
        fail(kChdir);
      }
      // execvp's search: a directory where the program is missing or
      // denied moves on to the next; any other error stops it. Each
      // candidate has a '/', so execvpe only adds its fallback of running a
      // file without #! through /bin/sh.
      int err = ENOENT;
      bool denied = false;
      for (const std::string& path : exec_paths) {
        ::execvpe(path.c_str(), argv.data(), envp.data());
        err = errno;
        denied = denied || err == EACCES;
        if (!search || !SkippedInPathSearch(err)) break;
      }
      errno = search && SkippedInPathSearch(err) ? (denied ? EACCES : ENOENT) : err;
      fail(kExec);
    }
    ::setpgid(pid, pid);  // also from the parent: no race with SignalGroup
    ::close(pipefd[1]);
    ::close(out_fd);
    ::close(err_fd);
    ::close(null_fd);
    int msg[2];
    ssize_t n;
    do {
      n = ::read(pipefd[0], msg, sizeof(msg));
    } while (n < 0 && errno == EINTR);
    ::close(pipefd[0]);
    if (n == static_cast<ssize_t>(sizeof(msg))) {
      int st;
      ::waitpid(pid, &st, 0);
      return ChildFailure(spec, search_path, worker_uid, msg[0], msg[1]);
    }
    return std::unique_ptr<Process>(new PosixProcess(pid, spec.on_exit));
  }
};

}  // namespace

bool IsPermanentLaunchError(const Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kFailedPrecondition:
      return true;
    default:
      return false;
  }
}

std::unique_ptr<ProcessLauncher> NewPosixProcessLauncher() {
  return std::make_unique<PosixProcessLauncher>();
}

}  // namespace daemon
}  // namespace lockstep
