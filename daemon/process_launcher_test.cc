#include "daemon/process_launcher.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

namespace lockstep {
namespace daemon {
namespace {

std::string TmpDir() {
  const char* d = std::getenv("TEST_TMPDIR");
  return d ? d : "/tmp";
}

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
  return ExitStatus{-1, -1};
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
  auto p = launcher->Launch(spec);
  ASSERT_TRUE(p.ok()) << p.status();
  ExitStatus e = WaitExit(p->get());
  EXPECT_EQ(e.exit_code, 3);
  EXPECT_EQ(e.signal, 0);
  EXPECT_EQ(Slurp(spec.stdout_path), "out=bar\n" + TmpDir() + "\n77\n");
  EXPECT_EQ(Slurp(spec.stderr_path), "err\n");
}

// Two workers that die 150 ms apart, polled only afterwards (the agent
// polls every 100 ms): the exit times still order them.
TEST(PosixProcessLauncherTest, ExitTimeIsWhenItExitedNotWhenPolled) {
  auto launcher = NewPosixProcessLauncher();
  LaunchSpec spec;
  spec.stdout_path = TmpDir() + "/exit_time.out";
  spec.stderr_path = TmpDir() + "/exit_time.err";
  spec.argv = {"/bin/sh", "-c", "exit 1"};
  auto first = launcher->Launch(spec);
  ASSERT_TRUE(first.ok()) << first.status();
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  auto second = launcher->Launch(spec);
  ASSERT_TRUE(second.ok()) << second.status();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto polled = std::chrono::steady_clock::now();
  ExitStatus b = WaitExit(second->get());
  ExitStatus a = WaitExit(first->get());
  EXPECT_LT(a.exited_at, b.exited_at) << "the first to exit must have the earlier time";
  EXPECT_LT(b.exited_at, polled - std::chrono::milliseconds(100))
      << "the exit time is the poll's, not the exit's";
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
