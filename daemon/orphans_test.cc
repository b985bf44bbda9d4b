#include "daemon/orphans.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

namespace lockstep {
namespace daemon {
namespace {

bool Has(const std::vector<pid_t>& pids, pid_t pid) {
  return std::find(pids.begin(), pids.end(), pid) != pids.end();
}

// A child that runs `sleep 30` with a job's variables in its environment.
pid_t StartSleeper() {
  const pid_t pid = ::fork();
  if (pid == 0) {
    char* argv[] = {const_cast<char*>("sleep"), const_cast<char*>("30"), nullptr};
    // A name twice: the first counts, as for getenv.
    char* envp[] = {const_cast<char*>("LOCKSTEP_JOB_ID=j-1"), const_cast<char*>("LOCKSTEP_ROUND=2"),
                    const_cast<char*>("OTHER=x"), const_cast<char*>("LOCKSTEP_JOB_ID=j-later"),
                    nullptr};
    ::execve("/bin/sleep", argv, envp);
    ::_exit(127);
  }
  return pid;
}

TEST(OrphansTest, ChildrenAndTheirEnvironment) {
  const pid_t pid = StartSleeper();
  ASSERT_GT(pid, 0);
  // Until the exec is done the child still has this process's environment.
  std::map<std::string, std::string> env;
  for (int i = 0; i < 200 && env.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    env = EnvironOf(pid, {"LOCKSTEP_JOB_ID", "LOCKSTEP_ROUND", "LOCKSTEP_AGENT"})
              .value_or(std::map<std::string, std::string>());
  }
  EXPECT_TRUE(Has(ChildrenOf(::getpid()), pid));
  EXPECT_TRUE(Has(ChildrenOfByScan(::getpid()), pid));
  EXPECT_EQ(env, (std::map<std::string, std::string>{{"LOCKSTEP_JOB_ID", "j-1"}, {"LOCKSTEP_ROUND", "2"}}));
  EXPECT_EQ(CommOf(pid), "sleep");
  ::kill(pid, SIGKILL);
  // A zombie shows no environment (nothing to tell: not "none of those").
  siginfo_t info;
  ASSERT_EQ(::waitid(P_PID, pid, &info, WEXITED | WNOWAIT), 0);
  EXPECT_FALSE(EnvironOf(pid, {"LOCKSTEP_JOB_ID"}).has_value());
  int st;
  ::waitpid(pid, &st, 0);
  EXPECT_FALSE(Has(ChildrenOf(::getpid()), pid));
  EXPECT_FALSE(Has(ChildrenOfByScan(::getpid()), pid));
  EXPECT_FALSE(EnvironOf(pid, {"LOCKSTEP_JOB_ID"}).has_value());
  EXPECT_EQ(CommOf(pid), "?");
}

// A grandchild in a session of its own, whose parent exits, becomes this
// process's child once it is a subreaper.
TEST(OrphansTest, ASubreaperAdoptsWhatAChildLeftBehind) {
  ASSERT_TRUE(BecomeChildSubreaper());
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    const pid_t grandchild = ::fork();
    if (grandchild == 0) {
      ::setsid();
      char* argv[] = {const_cast<char*>("sleep"), const_cast<char*>("30"), nullptr};
      ::execv("/bin/sleep", argv);
      ::_exit(127);
    }
    (void)!::write(fds[1], &grandchild, sizeof(grandchild));
    ::_exit(0);
  }
  ::close(fds[1]);
  pid_t grandchild = 0;
  ASSERT_EQ(::read(fds[0], &grandchild, sizeof(grandchild)), static_cast<ssize_t>(sizeof(grandchild)));
  ::close(fds[0]);
  int st;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  bool adopted = false;
  for (int i = 0; i < 200 && !adopted; ++i) {
    adopted = Has(ChildrenOf(::getpid()), grandchild) && Has(ChildrenOfByScan(::getpid()), grandchild);
    if (!adopted) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(adopted);
  ::kill(grandchild, SIGKILL);
  EXPECT_EQ(::waitpid(grandchild, &st, 0), grandchild) << "not this process's child to reap";
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
