#include "client/standalone.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace lockstep {
namespace client {
namespace {

bool IsExecutable(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The last `n` lines of the daemon's log, for an error message.
std::string LogTail(const std::string& path, int n) {
  std::vector<std::string> lines = absl::StrSplit(ReadFile(path), '\n', absl::SkipEmpty());
  if (lines.size() > static_cast<size_t>(n)) lines.erase(lines.begin(), lines.end() - n);
  return lines.empty() ? "(empty)" : absl::StrJoin(lines, "\n  ");
}

std::string ExitText(int wstatus) {
  if (WIFSIGNALED(wstatus)) return absl::StrCat("killed by signal ", WTERMSIG(wstatus));
  return absl::StrCat("exited with code ", WEXITSTATUS(wstatus));
}

}  // namespace

StatusOr<std::string> FindLockstepd(const std::string& flag) {
  if (!flag.empty()) {
    if (!IsExecutable(flag)) {
      return absl::NotFoundError(absl::StrCat("--lockstepd ", flag, ": not an executable file"));
    }
    return flag;
  }
  std::vector<std::string> tried;
  auto consider = [&](const std::string& path) {
    tried.push_back(path);
    return IsExecutable(path);
  };
  if (const char* env = std::getenv("LOCKSTEPD"); env && *env) {
    if (consider(env)) return std::string(env);
  }
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    self[n] = '\0';
    std::string dir(self);
    dir.resize(dir.rfind('/'));
    for (const std::string& p : {dir + "/lockstepd", dir + "/../daemon/lockstepd"}) {
      if (consider(p)) return p;
    }
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view d : absl::StrSplit(path ? path : "", ':', absl::SkipEmpty())) {
    const std::string p = absl::StrCat(d, "/lockstepd");
    if (IsExecutable(p)) return p;
  }
  tried.push_back("lockstepd on PATH");
  return absl::NotFoundError(absl::StrCat("cannot find lockstepd to start (tried ",
                                          absl::StrJoin(tried, ", "),
                                          "); pass --lockstepd PATH or set LOCKSTEPD"));
}

StatusOr<std::unique_ptr<StandaloneDaemon>> StandaloneDaemon::Start(Options options) {
  std::string dir = options.state_dir;
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = absl::StrCat(tmp && *tmp ? tmp : "/tmp", "/lockstep-run-XXXXXX");
    if (::mkdtemp(pattern.data()) == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("cannot make a state dir ", pattern, ": ", std::strerror(errno)));
    }
    dir = pattern;
  } else if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::UnavailableError(
        absl::StrCat("cannot make the state dir ", dir, ": ", std::strerror(errno)));
  }
  const std::string address_file = dir + "/address";
  ::unlink(address_file.c_str());  // a previous run's
  std::vector<std::string> args = {options.lockstepd,
                                   "--coordinator",
                                   "--listen=127.0.0.1:0",
                                   "--state-dir=" + dir,
                                   "--address-file=" + address_file,
                                   // The user is this daemon's operator: a job may set any
                                   // variable but the loader's and the engine's contract.
                                   "--allowed-env=*",
                                   // One job of the user's own, as torchrun runs it: its
                                   // workers run as the user (a root lockstepd would
                                   // otherwise give the job a uid of its own, which could
                                   // not reach this 0700 state dir or a program in $HOME).
                                   "--job-uids=off"};
  args.insert(args.end(), options.extra_args.begin(), options.extra_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string log_path = dir + "/lockstepd.log";
  int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (log_fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot open ", log_path, ": ", std::strerror(errno)));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(log_fd);
    return absl::UnavailableError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // Only async-signal-safe calls until exec.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);  // the CLI died before prctl
    int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, 0);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(log_fd);
  std::unique_ptr<StandaloneDaemon> daemon(new StandaloneDaemon(pid, dir));
  const auto deadline = std::chrono::steady_clock::now() + options.start_timeout;
  while (true) {
    std::string address(absl::StripAsciiWhitespace(ReadFile(address_file)));
    if (!address.empty()) {
      daemon->address_ = address;
      return daemon;
    }
    int wstatus = 0;
    if (::waitpid(pid, &wstatus, WNOHANG) == pid) {
      daemon->pid_ = -1;
      return absl::UnavailableError(absl::StrCat("lockstepd ", ExitText(wstatus),
                                                 " before serving; its log ", log_path,
                                                 " ends:\n  ", LogTail(log_path, 5)));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "lockstepd (pid ", pid, ") did not serve within ", options.start_timeout.count() / 1000,
          " s; its log ", log_path, " ends:\n  ", LogTail(log_path, 5)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

StandaloneDaemon::~StandaloneDaemon() { (void)Stop(); }

Status StandaloneDaemon::Stop(std::chrono::milliseconds grace) {
  if (pid_ <= 0) return absl::OkStatus();
  const pid_t pid = pid_;
  pid_ = -1;
  ::kill(pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &wstatus, 0);
      return absl::DeadlineExceededError(absl::StrCat(
          "lockstepd (pid ", pid, ") did not exit within ", grace.count() / 1000,
          " s of SIGTERM and was killed; its log: ", log_path()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("lockstepd ", ExitText(wstatus), " on stop; its log: ", log_path()));
}

void TakeLines(std::string* partial, const std::string& data,
               const std::function<void(const std::string& line)>& each) {
  *partial += data;
  size_t start = 0;
  for (size_t nl; (nl = partial->find('\n', start)) != std::string::npos; start = nl + 1) {
    each(partial->substr(start, nl - start));
  }
  partial->erase(0, start);
}

void RankLogTail::Poll(bool final_poll) {
  DIR* d = ::opendir(dir_.c_str());
  if (d == nullptr) return;  // no worker started yet
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) {
    absl::string_view name = e->d_name;
    if (absl::StartsWith(name, "rank-") &&
        (absl::EndsWith(name, ".stdout") || absl::EndsWith(name, ".stderr"))) {
      names.emplace_back(name);
    }
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    absl::string_view rank_text = name;
    const bool is_stderr = absl::ConsumeSuffix(&rank_text, ".stderr");
    if (!is_stderr) absl::ConsumeSuffix(&rank_text, ".stdout");
    absl::ConsumePrefix(&rank_text, "rank-");
    int rank = 0;
    if (!absl::SimpleAtoi(rank_text, &rank)) continue;
    File& f = files_[name];
    std::ifstream in(dir_ + "/" + name, std::ios::binary);
    if (!in) continue;
    in.seekg(f.offset);
    std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    f.offset += static_cast<int64_t>(chunk.size());
    TakeLines(&f.partial, chunk, [&](const std::string& line) { sink_(rank, is_stderr, line); });
    if (final_poll && !f.partial.empty()) {
      sink_(rank, is_stderr, f.partial);
      f.partial.clear();
    }
  }
}

}  // namespace client
}  // namespace lockstep
