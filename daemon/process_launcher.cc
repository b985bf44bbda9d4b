#include "daemon/process_launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

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
  explicit PosixProcess(pid_t pid) : pid_(pid), watch_(std::make_shared<ExitWatch>()) {
    std::thread([pid, watch = watch_] {
      siginfo_t info{};
      while (::waitid(P_PID, pid, &info, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
      }
      watch->exited_ns.store(std::chrono::steady_clock::now().time_since_epoch().count());
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
  if (rc != 0 || result == nullptr) {
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

class PosixProcessLauncher : public ProcessLauncher {
 public:
  StatusOr<std::unique_ptr<Process>> Launch(const LaunchSpec& spec) override {
    if (spec.argv.empty() || spec.argv[0].empty()) {
      return absl::InvalidArgumentError("launch: empty command");
    }
    std::optional<User> user;
    if (!spec.run_as.empty()) {
      ASSIGN_OR_RETURN(user, LookupUser(spec.run_as));
      if (user->uid == 0) {
        return absl::PermissionDeniedError(
            absl::StrCat("run_as \"", spec.run_as, "\": workers never run as root"));
      }
      if (::geteuid() != 0 && ::geteuid() != user->uid) {
        return absl::PermissionDeniedError(absl::StrCat(
            "run_as \"", spec.run_as, "\": the agent runs as uid ", ::geteuid(),
            " and cannot switch users (run lockstepd as root to use run_as)"));
      }
    }
    std::vector<char*> argv;
    for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);

    auto open_out = [](const std::string& path) -> StatusOr<int> {
      if (path.empty()) return ::open("/dev/null", O_WRONLY | O_CLOEXEC);
      int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
      if (fd < 0) {
        return absl::UnavailableError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
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
      return absl::UnavailableError(absl::StrCat("pipe: ", std::strerror(errno)));
    }
    if (user && user->uid != ::geteuid()) {
      // The files belong to the worker's user so it can reopen them.
      for (const std::string* path : {&spec.stdout_path, &spec.stderr_path}) {
        if (path->empty() || ::chown(path->c_str(), user->uid, user->gid) == 0) continue;
        int err = errno;
        for (int fd : {out_fd, err_fd, null_fd, pipefd[0], pipefd[1]}) ::close(fd);
        return absl::PermissionDeniedError(absl::StrCat("cannot give log file ", *path,
                                                        " to uid ", user->uid, ": ",
                                                        std::strerror(err)));
      }
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
      return absl::UnavailableError(absl::StrCat("fork: ", std::strerror(err)));
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
      if (!spec.working_dir.empty() && ::chdir(spec.working_dir.c_str()) != 0) fail(2);
      struct rlimit rl;
      if (spec.max_open_files > 0) {
        rl.rlim_cur = rl.rlim_max = spec.max_open_files;
        if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) fail(3);
      }
      if (spec.max_address_space > 0) {
        rl.rlim_cur = rl.rlim_max = spec.max_address_space;
        if (::setrlimit(RLIMIT_AS, &rl) != 0) fail(3);
      }
      if (spec.max_cpu_seconds > 0) {
        rl.rlim_cur = rl.rlim_max = spec.max_cpu_seconds;
        if (::setrlimit(RLIMIT_CPU, &rl) != 0) fail(3);
      }
      if (user && user->uid != ::geteuid()) {
        if (::setgroups(user->groups.size(), user->groups.data()) != 0) fail(4);
        if (::setgid(user->gid) != 0) fail(4);
        if (::setuid(user->uid) != 0) fail(4);
      }
      ::execvpe(argv[0], argv.data(), envp.data());
      fail(5);
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
      static const char* kStage[] = {"", "redirecting output", "chdir to working dir",
                                     "setrlimit", "switching user", "exec"};
      std::string what = absl::StrCat("launch ", spec.argv[0], ": ", kStage[msg[0]],
                                       msg[0] == 2 ? " " + spec.working_dir : "", ": ",
                                       std::strerror(msg[1]));
      if (msg[1] == ENOENT) return absl::NotFoundError(what);
      if (msg[1] == EACCES || msg[1] == EPERM) return absl::PermissionDeniedError(what);
      return absl::UnavailableError(what);
    }
    return std::unique_ptr<Process>(new PosixProcess(pid));
  }
};

}  // namespace

std::unique_ptr<ProcessLauncher> NewPosixProcessLauncher() {
  return std::make_unique<PosixProcessLauncher>();
}

}  // namespace daemon
}  // namespace lockstep
