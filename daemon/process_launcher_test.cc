#include "daemon/process_launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace daemon {
namespace {

std::string TmpDir() {
  const char* d = std::getenv("TEST_TMPDIR");
  return d ? d : "/tmp";
}

// A directory every user can reach (under /tmp: the test's own tmpdir may
// sit below directories only root can enter), removed with its contents
// when the object goes.
class ReachableDir {
 public:
  ReachableDir() {
    char templ[] = "/tmp/launcher_test.XXXXXX";
    if (::mkdtemp(templ) != nullptr) path_ = templ;
    if (!path_.empty()) ::chmod(path_.c_str(), 0755);
  }
  ~ReachableDir() {
    if (!path_.empty()) std::filesystem::remove_all(path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ExitStatus WaitExit(Process* p, std::chrono::seconds limit = std::chrono::seconds(10)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto e = p->Poll()) return *e;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "process " << p->pid() << " did not exit";
  ExitStatus lost;
  lost.exit_code = lost.signal = -1;
  return lost;
}

// Only the listed descriptors cross exec (the fence and status pages); the
// exit callback fires on its own, before anyone polls.
TEST(PosixProcessLauncherTest, InheritsOnlyListedDescriptorsAndReportsTheExitAtOnce) {
  auto launcher = NewPosixProcessLauncher();
  const int listed = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const int other = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(listed, 0);
  ASSERT_GE(other, 0);
  const std::string out = ::testing::TempDir() + "/inherit.out";
  std::remove(out.c_str());
  std::atomic<int> exits{0};
  LaunchSpec spec;
  spec.argv = {"/bin/sh", "-c",
               "test -e /proc/self/fd/" + std::to_string(listed) + " && echo listed; test -e "
               "/proc/self/fd/" + std::to_string(other) + " && echo other; exit 0"};
  spec.stdout_path = out;
  spec.inherit_fds = {listed};
  spec.on_exit = [&exits] { exits.fetch_add(1); };
  auto proc = launcher->Launch(spec);
  ASSERT_TRUE(proc.ok()) << proc.status();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (exits.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(exits.load(), 1) << "on_exit fired without a Poll";
  EXPECT_EQ(WaitExit(proc->get()).exit_code, 0);
  std::ifstream in(out);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "listed\n");
  // The agent's own descriptors keep close-on-exec.
  EXPECT_EQ(::fcntl(listed, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  ::close(listed);
  ::close(other);
}

TEST(PosixProcessLauncherTest, RunsWithEnvWorkingDirAndCapturedOutput) {
  auto launcher = NewPosixProcessLauncher();
  LaunchSpec spec;
  spec.argv = {"/bin/sh", "-c", "echo out=$FOO; pwd; echo err >&2; ulimit -n; exit 3"};
  spec.env = {"FOO=bar", "PATH=/usr/bin:/bin"};
  spec.working_dir = TmpDir();
  spec.stdout_path = TmpDir() + "/launch.out";
  spec.stderr_path = TmpDir() + "/launch.err";
  spec.max_open_files = 77;
  spec.log_header = "=== header ===\n";
  ::unlink(spec.stdout_path.c_str());
  ::unlink(spec.stderr_path.c_str());
  auto p = launcher->Launch(spec);
  ASSERT_TRUE(p.ok()) << p.status();
  ExitStatus e = WaitExit(p->get());
  EXPECT_EQ(e.exit_code, 3);
  EXPECT_EQ(e.signal, 0);
  EXPECT_EQ(Slurp(spec.stdout_path), "=== header ===\nout=bar\n" + TmpDir() + "\n77\n");
  EXPECT_EQ(Slurp(spec.stderr_path), "=== header ===\nerr\n");
}

// Two workers, the second launched only once the first was seen to exit,
// both polled only afterwards (the agent polls every 100 ms): the exit
// times still order them, and each is the instant the watcher saw the exit
// (on_exit runs right after it is taken), not the poll's.
TEST(PosixProcessLauncherTest, ExitTimeIsWhenItExitedNotWhenPolled) {
  auto launcher = NewPosixProcessLauncher();
  LaunchSpec spec;
  spec.stdout_path = TmpDir() + "/exit_time.out";
  spec.stderr_path = TmpDir() + "/exit_time.err";
  spec.argv = {"/bin/sh", "-c", "exit 1"};
  auto exits = std::make_shared<std::atomic<int>>(0);
  spec.on_exit = [exits] { ++*exits; };
  // Waits until `n` exits were seen; returns when the test saw the n-th.
  const auto seen = [&](int n, const char* who) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (exits->load() < n && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_GE(exits->load(), n) << "the " << who << " worker's exit was not seen in 10 s";
    return std::chrono::steady_clock::now();
  };
  auto first = launcher->Launch(spec);
  ASSERT_TRUE(first.ok()) << first.status();
  const auto seen_a = seen(1, "first");
  auto second = launcher->Launch(spec);
  ASSERT_TRUE(second.ok()) << second.status();
  const auto seen_b = seen(2, "second");
  ASSERT_FALSE(::testing::Test::HasFailure());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ExitStatus b = WaitExit(second->get());
  ExitStatus a = WaitExit(first->get());
  EXPECT_LT(a.exited_at, b.exited_at) << "the first to exit must have the earlier time";
  EXPECT_LE(a.exited_at, seen_a) << "the exit time is the poll's, not the exit's";
  EXPECT_LE(b.exited_at, seen_b) << "the exit time is the poll's, not the exit's";
}

TEST(PosixProcessLauncherTest, ExecFailureIsAnErrorNamingTheProgram) {
  auto launcher = NewPosixProcessLauncher();
  LaunchSpec spec;
  spec.argv = {"/nonexistent/train"};
  auto p = launcher->Launch(spec);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(p.status().message().find("/nonexistent/train"), std::string::npos);

  spec.argv = {"/bin/true"};
  spec.working_dir = "/nonexistent-dir";
  p = launcher->Launch(spec);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("/nonexistent-dir"), std::string::npos);
}

// Writes `text` to `path` with `mode`; returns the path.
std::string WriteFile(const std::string& path, const std::string& text, mode_t mode) {
  ::unlink(path.c_str());
  std::ofstream(path) << text;
  ::chmod(path.c_str(), mode);
  return path;
}

Status LaunchError(LaunchSpec spec) {
  auto p = NewPosixProcessLauncher()->Launch(spec);
  return p.ok() ? absl::OkStatus() : p.status();
}

TEST(PosixProcessLauncherTest, MissingProgramIsNotFoundAndPermanent) {
  LaunchSpec spec;
  spec.argv = {"/nonexistent/train"};
  Status st = LaunchError(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(st.message(),
            "launch /nonexistent/train: exec \"/nonexistent/train\": No such file or directory");
  EXPECT_TRUE(IsPermanentLaunchError(st));
}

TEST(PosixProcessLauncherTest, BareNameMissingFromTheWorkersPathSaysWhichPath) {
  LaunchSpec spec;
  spec.argv = {"no-such-program-lockstep"};
  spec.env = {"PATH=/usr/bin:/bin"};
  Status st = LaunchError(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(st.message(),
            "launch no-such-program-lockstep: exec \"no-such-program-lockstep\": No such file or "
            "directory (not found in PATH=/usr/bin:/bin; give an absolute path)");
}

// The lookup uses the PATH the worker gets, not the agent's own.
TEST(PosixProcessLauncherTest, BareNameIsLookedUpInTheWorkersPath) {
  std::string dir = TmpDir() + "/worker-bin";
  ::mkdir(dir.c_str(), 0755);
  WriteFile(dir + "/lockstep-tool", "#!/bin/sh\nexit 7\n", 0755);
  LaunchSpec spec;
  spec.argv = {"lockstep-tool"};
  spec.env = {"PATH=/nonexistent:" + dir};
  auto p = NewPosixProcessLauncher()->Launch(spec);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(WaitExit(p->get()).exit_code, 7);
}

TEST(PosixProcessLauncherTest, FileWithoutExecuteBitIsPermissionDenied) {
  LaunchSpec spec;
  spec.argv = {WriteFile(TmpDir() + "/not-executable", "#!/bin/sh\nexit 0\n", 0644)};
  Status st = LaunchError(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(st.message().find("launch " + spec.argv[0] + ": exec \"" + spec.argv[0] +
                              "\": Permission denied (uid "),
            std::string::npos)
      << st;
  EXPECT_TRUE(IsPermanentLaunchError(st));
}

// execve says ENOENT for a file that exists when its interpreter does not.
TEST(PosixProcessLauncherTest, MissingInterpreterIsNotFoundAndSaysTheFileExists) {
  LaunchSpec spec;
  spec.argv = {WriteFile(TmpDir() + "/bad-shebang", "#!/nonexistent/interp\n", 0755)};
  Status st = LaunchError(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(st.message().find("the file exists: the interpreter"), std::string::npos) << st;
}

TEST(PosixProcessLauncherTest, BadPathShapesAreFailedPrecondition) {
  LaunchSpec spec;
  spec.argv = {"/etc/passwd/train"};  // a file used as a directory
  Status st = LaunchError(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.message(), "launch /etc/passwd/train: exec \"/etc/passwd/train\": Not a directory");
  EXPECT_TRUE(IsPermanentLaunchError(st));

  std::string a = TmpDir() + "/loop-a", b = TmpDir() + "/loop-b";
  ::unlink(a.c_str());
  ::unlink(b.c_str());
  ASSERT_EQ(::symlink(b.c_str(), a.c_str()), 0);
  ASSERT_EQ(::symlink(a.c_str(), b.c_str()), 0);
  spec.argv = {a};
  st = LaunchError(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("Too many levels of symbolic links"), std::string::npos) << st;
}

// The working dir is entered as the worker's user: one it may not enter is
// refused (it was entered as root, before the switch).
TEST(PosixProcessLauncherTest, WorkingDirTheUserCannotEnterIsPermissionDenied) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to switch users";
  ReachableDir base;
  ASSERT_FALSE(base.path().empty());
  const std::string dir = base.path() + "/root-only";
  ::mkdir(dir.c_str(), 0700);
  ASSERT_EQ(::chmod(dir.c_str(), 0700), 0);
  ASSERT_EQ(::chown(dir.c_str(), 0, 0), 0);
  LaunchSpec spec;
  spec.argv = {"/bin/true"};
  spec.working_dir = dir;
  spec.run_as = "nobody";
  Status st = LaunchError(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_EQ(st.message(), absl::StrCat("launch /bin/true: chdir to working dir ", dir,
                                       ": Permission denied (uid 65534 cannot enter it)"));
}

TEST(PosixProcessLauncherTest, MissingWorkingDirIsNotFoundNamingIt) {
  LaunchSpec spec;
  spec.argv = {"/bin/true"};
  spec.working_dir = "/nonexistent-dir";
  Status st = LaunchError(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(st.message(),
            "launch /bin/true: chdir to working dir /nonexistent-dir: No such file or directory");
  EXPECT_TRUE(IsPermanentLaunchError(st));

  spec.working_dir = "/etc/passwd";
  st = LaunchError(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("chdir to working dir /etc/passwd: Not a directory"),
            std::string::npos)
      << st;
}

TEST(PosixProcessLauncherTest, UnknownUserIsNotFoundNamingTheProgramAndUser) {
  LaunchSpec spec;
  spec.argv = {"/bin/true"};
  spec.run_as = "no-such-user-lockstep";
  Status st = LaunchError(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(st.message(), "launch /bin/true: run_as: no such user \"no-such-user-lockstep\"");
  EXPECT_TRUE(IsPermanentLaunchError(st));
}

// Above fs.nr_open, which binds root too.
TEST(PosixProcessLauncherTest, LimitAboveTheHardLimitIsPermissionDeniedNamingIt) {
  LaunchSpec spec;
  spec.argv = {"/bin/true"};
  spec.max_open_files = int64_t{1} << 40;
  Status st = LaunchError(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(st.message().find("launch /bin/true: setrlimit RLIMIT_NOFILE to 1099511627776"),
            std::string::npos)
      << st;
}

// The node's own files failing may pass: the job gets its restarts.
TEST(PosixProcessLauncherTest, UnopenableLogFileIsUnavailableAndTransient) {
  LaunchSpec spec;
  spec.argv = {"/bin/true"};
  spec.stdout_path = "/nonexistent-dir/out.log";
  Status st = LaunchError(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(st.message(),
            "launch /bin/true: open log file /nonexistent-dir/out.log: No such file or directory");
  EXPECT_FALSE(IsPermanentLaunchError(st));
}

TEST(IsPermanentLaunchErrorTest, OnlyTheDocumentedCodesArePermanent) {
  EXPECT_TRUE(IsPermanentLaunchError(absl::InvalidArgumentError("x")));
  EXPECT_TRUE(IsPermanentLaunchError(absl::NotFoundError("x")));
  EXPECT_TRUE(IsPermanentLaunchError(absl::PermissionDeniedError("x")));
  EXPECT_TRUE(IsPermanentLaunchError(absl::FailedPreconditionError("x")));
  EXPECT_FALSE(IsPermanentLaunchError(absl::UnavailableError("x")));
  EXPECT_FALSE(IsPermanentLaunchError(absl::InternalError("x")));
  EXPECT_FALSE(IsPermanentLaunchError(absl::OkStatus()));
}

TEST(PosixProcessLauncherTest, RefusesRoot) {
  auto launcher = NewPosixProcessLauncher();
  LaunchSpec spec;
  spec.argv = {"/bin/true"};
  spec.run_as = "root";
  EXPECT_EQ(launcher->Launch(spec).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST(PosixProcessLauncherTest, RunsAsAnotherUserWhenRoot) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to switch users";
  auto launcher = NewPosixProcessLauncher();
  LaunchSpec spec;
  spec.argv = {"/bin/sh", "-c", "id -u"};
  spec.env = {"PATH=/usr/bin:/bin"};
  spec.stdout_path = TmpDir() + "/id.out";
  ::unlink(spec.stdout_path.c_str());
  spec.run_as = "nobody";
  auto p = launcher->Launch(spec);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(WaitExit(p->get()).exit_code, 0);
  EXPECT_EQ(Slurp(spec.stdout_path), "65534\n");
}

// A job's own uid needs no passwd entry: gid the same number, no groups.
TEST(PosixProcessLauncherTest, RunsAsABareUidWhenRoot) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to switch users";
  auto launcher = NewPosixProcessLauncher();
  LaunchSpec spec;
  spec.argv = {"/bin/sh", "-c", "echo $(id -u) $(id -g) $(id -G)"};
  spec.env = {"PATH=/usr/bin:/bin"};
  spec.stdout_path = TmpDir() + "/bare.out";
  ::unlink(spec.stdout_path.c_str());
  spec.run_as = "nobody";  // Ignored: run_as_uid wins.
  spec.run_as_uid = 61999;
  auto p = launcher->Launch(spec);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(WaitExit(p->get()).exit_code, 0);
  EXPECT_EQ(Slurp(spec.stdout_path), "61999 61999 61999\n");
}

// A worker dies with the thread that launched it (PR_SET_PDEATHSIG), the
// agent's, whether or not it runs as another user: changing uids clears the
// parent-death signal, so the launcher sets it after the switch. (Before
// that, every worker of a root agent outlived a kill -9 of its daemon.)
TEST(PosixProcessLauncherTest, AWorkerDiesWithTheThreadThatLaunchedItAsAnyUser) {
  auto launcher = NewPosixProcessLauncher();
  struct Case {
    const char* label;
    std::string run_as;
    uint32_t uid;
  };
  std::vector<Case> cases;
  if (::geteuid() == 0) {
    cases = {{"run_as nobody", "nobody", 0}, {"a bare job uid", "", 61998}};
  } else {
    cases = {{"the launcher's own user", "", 0}};
  }
  for (const Case& c : cases) {
    LaunchSpec spec;
    spec.argv = {"/bin/sleep", "60"};
    spec.env = {"PATH=/usr/bin:/bin"};
    spec.stdout_path = TmpDir() + "/pdeath.out";
    spec.run_as = c.run_as;
    spec.run_as_uid = c.uid;
    StatusOr<std::unique_ptr<Process>> p = absl::UnknownError("not launched");
    std::thread([&] { p = launcher->Launch(spec); }).join();  // the launching thread ends
    ASSERT_TRUE(p.ok()) << c.label << ": " << p.status();
    EXPECT_EQ(WaitExit(p->get()).signal, SIGKILL) << c.label << ": outlived its launching thread";
  }
}

// max_processes is the uid's RLIMIT_NPROC: a worker of a uid of its own
// with a limit of 3 runs two children beside itself, and its third fork
// fails (a fork bomb stops there, not at the host's pid table).
// Without the limit the same script prints "done" and exits 0.
TEST(PosixProcessLauncherTest, MaxProcessesBoundsTheUidsForks) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to switch users";
  auto launcher = NewPosixProcessLauncher();
  LaunchSpec spec;
  spec.argv = {"/bin/sh", "-c",
               "grep 'Max processes' /proc/self/limits; sleep 1 & sleep 1 & sleep 1 & wait; echo done"};
  spec.env = {"PATH=/usr/bin:/bin"};
  spec.stdout_path = TmpDir() + "/nproc.out";
  spec.stderr_path = TmpDir() + "/nproc.err";
  ::unlink(spec.stdout_path.c_str());
  ::unlink(spec.stderr_path.c_str());
  spec.run_as_uid = 61996;  // no other process runs as it
  spec.max_processes = 3;
  auto p = launcher->Launch(spec);
  ASSERT_TRUE(p.ok()) << p.status();
  // dash gives up on a fork that fails: exit 2.
  EXPECT_EQ(WaitExit(p->get()).exit_code, 2);
  const std::string out = Slurp(spec.stdout_path), err = Slurp(spec.stderr_path);
  EXPECT_NE(out.find("Max processes             3                    3"), std::string::npos) << out;
  EXPECT_EQ(out.find("done"), std::string::npos) << out;
  EXPECT_NE(err.find("Cannot fork"), std::string::npos) << "the third child was not refused: " << err;
}

// The job dir the agent made is the worker's to write (its cwd); a working
// dir the job spec named keeps its owner.
TEST(PosixProcessLauncherTest, RunAsOwnsTheWorkingDirTheAgentMade) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to switch users";
  auto launcher = NewPosixProcessLauncher();
  ReachableDir base;
  ASSERT_FALSE(base.path().empty());
  for (bool own : {true, false}) {
    SCOPED_TRACE(own);
    std::string dir = base.path() + (own ? "/own-dir" : "/spec-dir");
    ::mkdir(dir.c_str(), 0755);
    ASSERT_EQ(::chown(dir.c_str(), 0, 0), 0);
    LaunchSpec spec;
    spec.argv = {"/bin/sh", "-c", "echo written > out.txt"};
    spec.env = {"PATH=/usr/bin:/bin"};
    spec.working_dir = dir;
    spec.own_working_dir = own;
    spec.stdout_path = dir + ".stdout";
    spec.stderr_path = dir + ".stderr";
    spec.run_as = "nobody";
    auto p = launcher->Launch(spec);
    ASSERT_TRUE(p.ok()) << p.status();
    const int code = WaitExit(p->get()).exit_code;
    if (own) {
      EXPECT_EQ(code, 0);
    } else {
      EXPECT_NE(code, 0);  // The shell cannot create out.txt.
    }
    struct stat st;
    ASSERT_EQ(::stat(dir.c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, own ? 65534u : 0u);
    EXPECT_EQ(Slurp(dir + "/out.txt"), own ? "written\n" : "");
  }
}

TEST(PosixProcessLauncherTest, SignalGroupStopsHelpersToo) {
  auto launcher = NewPosixProcessLauncher();
  LaunchSpec spec;
  std::string pidfile = TmpDir() + "/helper.pid";
  ::unlink(pidfile.c_str());
  spec.argv = {"/bin/sh", "-c", "sleep 60 & echo $! > " + pidfile + "; wait"};
  spec.env = {"PATH=/usr/bin:/bin"};
  auto p = launcher->Launch(spec);
  ASSERT_TRUE(p.ok());
  pid_t helper = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (helper == 0 && std::chrono::steady_clock::now() < deadline) {
    std::ifstream(pidfile) >> helper;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_NE(helper, 0);
  (*p)->SignalGroup(SIGTERM);
  ExitStatus e = WaitExit(p->get());
  EXPECT_EQ(e.signal, SIGTERM);
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (::kill(helper, 0) == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_NE(::kill(helper, 0), 0) << "helper " << helper << " survived";
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
