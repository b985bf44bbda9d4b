#include "daemon/fence_guard.h"

#include <dirent.h>
#include <grp.h>
#include <fcntl.h>
#include <signal.h>
#include <linux/capability.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <cstdlib>
#include <functional>
#include <optional>
#include <vector>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/worker_link.h"

namespace lockstep {
namespace daemon {
namespace {

using std::chrono::milliseconds;

// A pid no process can have (above any pid_max): listing it is harmless.
constexpr pid_t kNoSuchPid = 2000000000;

// A child leading a process group of two: `sh` and a background `sleep`.
pid_t StartGroup() {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::execl("/bin/sh", "sh", "-c", "sleep 30 & exec sleep 30", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // either side may run first
  return pid;
}

// Gone, or a zombie nobody reaped (nothing runs).
bool Ended(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  if (text.empty()) return true;
  const size_t paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'Z';
}

// Whether a process of group `pgid` still runs (zombies do not count).
bool GroupLives(pid_t pgid) {
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return false;
  bool lives = false;
  while (dirent* e = ::readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid > 0 && ::getpgid(pid) == pgid && !Ended(pid)) lives = true;
  }
  ::closedir(proc);
  return lives;
}

bool WaitFor(const std::function<bool()>& done, milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return true;
}

// The guard's stderr goes to a file for the test (its fd 2 is the one the
// test process had at the fork).
class FenceGuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    log_path_ = std::string(tmp ? tmp : "/tmp") + "/guard-" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".err";
    ASSERT_TRUE(fence_.Create().ok());
    const int fd = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    const int saved = ::dup(2);
    ::dup2(fd, 2);
    auto guard = FenceGuard::Start(&fence_);
    ::dup2(saved, 2);
    ::close(saved);
    ::close(fd);
    ASSERT_TRUE(guard.ok()) << guard.status().ToString();
    guard_ = *std::move(guard);
  }

  std::string GuardLog() const {
    std::ifstream in(log_path_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  void PassDeadline() { fence_.SetDeadline(worker_link::MonotonicNowNs() - 1000000); }

  std::string log_path_;
  worker_link::FencePage fence_;
  std::unique_ptr<FenceGuard> guard_;
};

TEST_F(FenceGuardTest, KillsTheListedGroupsOncePastTheDeadlineAndNoOthers) {
  const pid_t listed = StartGroup();
  const pid_t forgotten = StartGroup();
  const pid_t never_listed = StartGroup();
  FenceGuard::Entry entry = guard_->Watch(listed, "j-frozen", 3, 7);
  ASSERT_TRUE(entry.guarded());
  {
    FenceGuard::Entry gone = guard_->Watch(forgotten, "j-frozen", 4, 7);
    ASSERT_TRUE(gone.guarded());
  }  // forgotten here
  // No deadline yet (the agent has not registered), then one ahead: nothing.
  std::this_thread::sleep_for(milliseconds(200));
  fence_.SetDeadline(worker_link::MonotonicNowNs() + 60LL * 1000000000);
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_FALSE(Ended(listed));
  EXPECT_EQ(entry.KilledNs(), 0);

  const int64_t passed_at = worker_link::MonotonicNowNs();
  PassDeadline();
  int st = 0;
  ASSERT_EQ(::waitpid(listed, &st, 0), listed);
  ASSERT_TRUE(WIFSIGNALED(st));
  EXPECT_EQ(WTERMSIG(st), SIGKILL);
  // The group's other member (the background sleep) went with it.
  EXPECT_TRUE(WaitFor([&] { return !GroupLives(listed); }, milliseconds(2000)));
  EXPECT_GE(entry.KilledNs(), passed_at);
  EXPECT_LE(entry.KilledNs(), worker_link::MonotonicNowNs());
  EXPECT_TRUE(WaitFor([&] { return GuardLog().find('\n') != std::string::npos; }, milliseconds(2000)));
  const std::string line = GuardLog();
  // The daemon's line format, its UTC time now (within a few seconds).
  EXPECT_NE(line.find(" E [fence-guard] job=j-frozen rank=3 SIGKILLed process group " +
                      std::to_string(listed) + " (round 7), "),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("fence deadline"), std::string::npos) << line;
  std::tm tm{};
  int ms = -1;
  ASSERT_EQ(std::sscanf(line.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ ", &tm.tm_year, &tm.tm_mon,
                        &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms),
            7)
      << line;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  EXPECT_LE(std::llabs(static_cast<long long>(::timegm(&tm)) - static_cast<long long>(::time(nullptr))), 5)
      << line;
  EXPECT_GE(ms, 0);
  EXPECT_LT(ms, 1000);

  // Killed once per listing; the forgotten and the unlisted groups live on.
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_FALSE(Ended(forgotten));
  EXPECT_FALSE(Ended(never_listed));
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1) << line;

  // A new listing past the deadline (an agent that went on launching while
  // cut off) is killed too; one after a renewal is not.
  fence_.SetDeadline(worker_link::MonotonicNowNs() + 60LL * 1000000000);
  FenceGuard::Entry renewed = guard_->Watch(forgotten, "j-frozen", 4, 8);
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_FALSE(Ended(forgotten));
  EXPECT_EQ(renewed.KilledNs(), 0);
  PassDeadline();
  ASSERT_EQ(::waitpid(forgotten, &st, 0), forgotten);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  EXPECT_NE(renewed.KilledNs(), 0);
  EXPECT_FALSE(Ended(never_listed));

  ::kill(-never_listed, SIGKILL);
  ::waitpid(never_listed, &st, 0);
}

// A worker its agent killed at the deadline, not yet reaped (a zombie), was
// not the guard's to kill: it is not stamped and not named.
TEST_F(FenceGuardTest, AWorkerAlreadyDeadIsNotClaimed) {
  const pid_t pid = StartGroup();
  FenceGuard::Entry entry = guard_->Watch(pid, "j-dead", 0, 1);
  ::kill(pid, SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return Ended(pid); }, milliseconds(2000)));
  PassDeadline();
  std::this_thread::sleep_for(milliseconds(500));
  EXPECT_EQ(entry.KilledNs(), 0);
  EXPECT_EQ(GuardLog(), "");
  // Its group's other member (the background sleep) went all the same.
  EXPECT_TRUE(WaitFor([&] { return !GroupLives(pid); }, milliseconds(2000)));
  ::waitpid(pid, nullptr, 0);
}

TEST_F(FenceGuardTest, RunsInAProcessGroupOfItsOwnAndEndsWithItsOwner) {
  const pid_t pid = guard_->pid();
  ASSERT_GT(pid, 0);
  // A stop sent to the agent's process group does not reach the guard.
  EXPECT_EQ(::getpgid(pid), pid);
  EXPECT_NE(::getpgid(pid), ::getpgrp());
  EXPECT_FALSE(Ended(pid));
  std::string name;
  EXPECT_TRUE(WaitFor(
      [&] {
        std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
        std::getline(comm, name);
        return name == FenceGuard::kProcessName;
      },
      milliseconds(2000)))
      << "its name: " << name;
  // It holds none of its owner's descriptors (SetUp's copy of stderr, open
  // at the fork), only stdio and its pipe.
  auto high_fds = [pid] {
    std::vector<int> fds;
    DIR* dir = ::opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
    if (dir == nullptr) return fds;
    while (dirent* e = ::readdir(dir)) {
      const int fd = std::atoi(e->d_name);
      if (fd >= 3) fds.push_back(fd);
    }
    ::closedir(dir);
    return fds;
  };
  EXPECT_TRUE(WaitFor([&] { return high_fds().size() == 1; }, milliseconds(2000)))
      << "the guard holds descriptors 3 and up: " << high_fds().size();
  guard_.reset();
  EXPECT_TRUE(Ended(pid));

  // An owner that dies without destroying its guard (kill -9): the guard
  // sees its pipe close and ends.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t owner = ::fork();
  if (owner == 0) {
    worker_link::FencePage page;
    if (!page.Create().ok()) ::_exit(1);
    auto guard = FenceGuard::Start(&page);
    if (!guard.ok()) ::_exit(2);
    const pid_t g = (*guard)->pid();
    (void)!::write(fds[1], &g, sizeof(g));
    ::pause();
    ::_exit(0);
  }
  ::close(fds[1]);
  pid_t orphan = -1;
  ASSERT_EQ(::read(fds[0], &orphan, sizeof(orphan)), static_cast<ssize_t>(sizeof(orphan)));
  ::close(fds[0]);
  EXPECT_FALSE(Ended(orphan));
  ::kill(owner, SIGKILL);
  ::waitpid(owner, nullptr, 0);
  EXPECT_TRUE(WaitFor([&] { return Ended(orphan); }, milliseconds(2000)))
      << "the guard of a killed owner still runs";
}

// A guard process that was killed is reaped and told (Ended); the one
// Restart starts guards the same listings.
TEST_F(FenceGuardTest, AGuardStartedAgainGuardsTheSameListings) {
  const pid_t listed = StartGroup();
  FenceGuard::Entry entry = guard_->Watch(listed, "j-again", 1, 2);
  EXPECT_EQ(guard_->Ended(), std::nullopt);
  const pid_t first = guard_->pid();
  ::kill(first, SIGKILL);
  std::optional<std::string> ended;
  ASSERT_TRUE(WaitFor([&] { return (ended = guard_->Ended()).has_value(); }, milliseconds(2000)));
  EXPECT_EQ(*ended, "killed by signal 9");
  EXPECT_TRUE(Ended(first));
  ASSERT_TRUE(guard_->Restart().ok());
  EXPECT_NE(guard_->pid(), first);
  EXPECT_EQ(guard_->Ended(), std::nullopt);
  PassDeadline();
  int st = 0;
  ASSERT_EQ(::waitpid(listed, &st, 0), listed);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  EXPECT_NE(entry.KilledNs(), 0);
}

// The pid a file holds (written by a shell's `echo $! > file`), once it is
// there; -1 after 5 s.
pid_t PidIn(const std::string& path) {
  pid_t pid = -1;
  WaitFor(
      [&] {
        std::ifstream in(path);
        std::string line;
        if (!std::getline(in, line) || line.empty()) return false;
        pid = static_cast<pid_t>(std::atoi(line.c_str()));
        return pid > 0;
      },
      milliseconds(5000));
  return pid;
}

pid_t ParentOf(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream rest(text.substr(paren + 2));
  char state;
  pid_t ppid = -1;
  rest >> state >> ppid;
  return ppid;
}

// A worker's helpers that left its process group (setsid; a double fork,
// adopted by the agent as their subreaper) are killed with it, once each,
// when they carry this agent's LOCKSTEP_AGENT; another agent's, and a
// process outside the agent's tree, are not.
TEST_F(FenceGuardTest, HelpersThatLeftTheWorkersGroupAreKilledWithIt) {
  const std::string agent = "10.9.0.1:7001";
  guard_->SetAgent(agent);
  const std::string dir = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp");
  const std::string env_agent = "LOCKSTEP_AGENT=" + agent;
  // Outside the agent's tree, with its marker (an orphan adopted by
  // someone else: this process is not a subreaper yet).
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t middle = ::fork();
  if (middle == 0) {
    const pid_t outside = ::fork();
    if (outside == 0) {
      ::setsid();
      char* envp[] = {const_cast<char*>(env_agent.c_str()), nullptr};
      ::execle("/bin/sleep", "sleep", "30", static_cast<char*>(nullptr), envp);
      ::_exit(127);
    }
    (void)!::write(fds[1], &outside, sizeof(outside));
    ::_exit(0);
  }
  ::close(fds[1]);
  pid_t outside = -1;
  ASSERT_EQ(::read(fds[0], &outside, sizeof(outside)), static_cast<ssize_t>(sizeof(outside)));
  ::close(fds[0]);
  ::waitpid(middle, nullptr, 0);
  ASSERT_TRUE(WaitFor([&] { return ParentOf(outside) != middle; }, milliseconds(2000)));
  ASSERT_NE(ParentOf(outside), ::getpid());

  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  const std::string script =
      "setsid sleep 30 & echo $! > " + dir + "/child.pid; "
      "(setsid sleep 30 & echo $! > " + dir + "/adopted.pid) & "
      "LOCKSTEP_AGENT=10.9.0.2:7001 setsid sleep 30 & echo $! > " + dir + "/other.pid; "
      "exec sleep 30";
  const pid_t worker = ::fork();
  if (worker == 0) {
    ::setpgid(0, 0);
    char* envp[] = {const_cast<char*>(env_agent.c_str()),
                    const_cast<char*>("LOCKSTEP_JOB_ID=j-helpers"),
                    const_cast<char*>("LOCKSTEP_RANK=2"), const_cast<char*>("LOCKSTEP_ROUND=5"),
                    const_cast<char*>("PATH=/usr/bin:/bin"), nullptr};
    ::execle("/bin/sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr), envp);
    ::_exit(127);
  }
  ::setpgid(worker, worker);
  const pid_t child = PidIn(dir + "/child.pid");
  const pid_t adopted = PidIn(dir + "/adopted.pid");
  const pid_t other = PidIn(dir + "/other.pid");
  ASSERT_GT(child, 0);
  ASSERT_GT(adopted, 0);
  ASSERT_GT(other, 0);
  // Each left the worker's group (once `setsid` has run: the shell writes
  // $! as soon as it forks, before the child calls setsid; read at once,
  // the group was sometimes still the worker's); the double-forked one is
  // this process's.
  EXPECT_TRUE(WaitFor([&] { return ::getpgid(child) != worker && ::getpgid(adopted) != worker; },
                      milliseconds(2000)))
      << "the helpers did not leave the worker's group";
  EXPECT_TRUE(WaitFor([&] { return ParentOf(adopted) == ::getpid(); }, milliseconds(2000)));
  FenceGuard::Entry entry = guard_->Watch(worker, "j-helpers", 2, 5);

  PassDeadline();
  int st = 0;
  ASSERT_EQ(::waitpid(worker, &st, 0), worker);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  EXPECT_TRUE(WaitFor([&] { return Ended(child) && Ended(adopted); }, milliseconds(2000)))
      << "a helper outside the worker's group runs on past the fence";
  std::this_thread::sleep_for(milliseconds(500));
  EXPECT_FALSE(Ended(other)) << "another agent's helper was killed";
  EXPECT_FALSE(Ended(outside)) << "a process outside the agent's tree was killed";
  const std::string log = GuardLog();
  for (const pid_t helper : {child, adopted}) {
    EXPECT_NE(log.find(" E [fence-guard] job=j-helpers rank=2 SIGKILLed pid " +
                       std::to_string(helper) +
                       " (sleep and its process group), which round 5's workers started outside "
                       "their process group (setsid or a double fork), "),
              std::string::npos)
        << log;
  }
  // The group's line and one per helper, each said once.
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 3) << log;

  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  ::kill(-other, SIGKILL);
  ::kill(-outside, SIGKILL);
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
}

// Until the agent says what its workers carry, no helper is looked for.
TEST_F(FenceGuardTest, WithoutTheAgentsMarkerOnlyTheListedGroupsAreKilled) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  const std::string dir = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp");
  const std::string script = "setsid sleep 30 & echo $! > " + dir + "/unmarked.pid; exec sleep 30";
  const pid_t worker = ::fork();
  if (worker == 0) {
    ::setpgid(0, 0);
    char* envp[] = {const_cast<char*>("LOCKSTEP_AGENT="), const_cast<char*>("PATH=/usr/bin:/bin"),
                    nullptr};
    ::execle("/bin/sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr), envp);
    ::_exit(127);
  }
  ::setpgid(worker, worker);
  const pid_t helper = PidIn(dir + "/unmarked.pid");
  ASSERT_GT(helper, 0);
  FenceGuard::Entry entry = guard_->Watch(worker, "j-unmarked", 0, 1);
  PassDeadline();
  ASSERT_EQ(::waitpid(worker, nullptr, 0), worker);
  std::this_thread::sleep_for(milliseconds(500));
  EXPECT_FALSE(Ended(helper));
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  ::kill(-helper, SIGKILL);
  while (::waitpid(-1, nullptr, WNOHANG) >= 0) {
    if (Ended(helper)) break;
    std::this_thread::sleep_for(milliseconds(10));
  }
}

// In a container the agent is its pid namespace's init (the Kubernetes
// agent pod's lockstepd is pid 1): its tree is every process there, and its
// workers' helpers are killed all the same. Run in a pid namespace of its
// own (with its own /proc), as that namespace's pid 1; the exit code says
// how it went.
int HelperOfPidOneAgent(const std::string& dir) {
  if (::getpid() != 1) return 10;
  worker_link::FencePage fence;
  if (!fence.Create().ok()) return 11;
  auto guard = FenceGuard::Start(&fence);
  if (!guard.ok()) return 12;
  (*guard)->SetAgent("10.9.0.1:7001");
  const std::string pid_file = dir + "/pid-one-helper.pid";
  const std::string script = "setsid sleep 30 & echo $! > " + pid_file + "; exec sleep 30";
  const pid_t worker = ::fork();
  if (worker == 0) {
    ::setpgid(0, 0);
    char* envp[] = {const_cast<char*>("LOCKSTEP_AGENT=10.9.0.1:7001"),
                    const_cast<char*>("LOCKSTEP_JOB_ID=j-pid1"),
                    const_cast<char*>("PATH=/usr/bin:/bin"), nullptr};
    ::execle("/bin/sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr), envp);
    ::_exit(127);
  }
  ::setpgid(worker, worker);
  const pid_t helper = PidIn(pid_file);
  if (helper <= 0) return 13;
  FenceGuard::Entry entry = (*guard)->Watch(worker, "j-pid1", 0, 1);
  fence.SetDeadline(worker_link::MonotonicNowNs() - 1000000);
  if (::waitpid(worker, nullptr, 0) != worker) return 14;
  // The helper is this process's child now (pid 1 adopts orphans): reaped
  // here once killed.
  const bool gone = WaitFor(
      [&] { return ::waitpid(helper, nullptr, WNOHANG) == helper || ::kill(helper, 0) != 0; },
      milliseconds(3000));
  return gone ? 0 : 1;
}

TEST(FenceGuardPidOneTest, AnAgentThatIsItsNamespacesInitHasItsWorkersHelpersKilled) {
  const std::string dir =
      std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp");
  constexpr int kNoNamespace = 77;
  const pid_t outer = ::fork();
  if (outer == 0) {
    if (::unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) ::_exit(kNoNamespace);
    const pid_t init = ::fork();
    if (init == 0) {
      if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
          ::mount("proc", "/proc", "proc", 0, nullptr) != 0) {
        ::_exit(kNoNamespace);
      }
      ::_exit(HelperOfPidOneAgent(dir));
    }
    int st = 0;
    if (init < 0 || ::waitpid(init, &st, 0) != init) ::_exit(98);
    ::_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 99);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(outer, &st, 0), outer);
  ASSERT_TRUE(WIFEXITED(st));
  if (WEXITSTATUS(st) == kNoNamespace) GTEST_SKIP() << "no pid and mount namespace here";
  EXPECT_EQ(WEXITSTATUS(st), 0)
      << "1: the helper outlived the fence; 10-14: the scenario could not be set up";
}

// Keeps only the capabilities the shipped lockstepd-agent unit grants
// (deploy/systemd; the agent pod grants fewer): no CAP_SYS_PTRACE, so
// another uid's /proc/PID/environ cannot be read. False if refused.
bool KeepTheUnitsCapabilities() {
  const uint64_t keep = (1ULL << CAP_SETUID) | (1ULL << CAP_SETGID) | (1ULL << CAP_CHOWN) |
                        (1ULL << CAP_FOWNER) | (1ULL << CAP_DAC_OVERRIDE) |
                        (1ULL << CAP_DAC_READ_SEARCH) | (1ULL << CAP_KILL) |
                        (1ULL << CAP_SYS_NICE);
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  data[0].effective = data[0].permitted = static_cast<uint32_t>(keep);
  data[1].effective = data[1].permitted = static_cast<uint32_t>(keep >> 32);
  return ::syscall(SYS_capset, &header, data) == 0;
}

// Run in a child holding the unit's capabilities: a worker of job uid
// 60123 leaves a helper in a session of its own, whose environment the
// guard cannot read. Without the node's job uids the guard leaves it; told
// them, it kills it. The exit code says how it went.
int HelperOfAJobUid() {
  constexpr uint32_t kUid = 60123;
  if (!KeepTheUnitsCapabilities()) return 77;
  worker_link::FencePage fence;
  if (!fence.Create().ok()) return 11;
  auto guard = FenceGuard::Start(&fence);
  if (!guard.ok()) return 12;
  (*guard)->SetAgent("10.9.0.1:7001");
  int out[2];
  if (::pipe(out) != 0) return 13;
  const pid_t worker = ::fork();
  if (worker == 0) {
    ::setpgid(0, 0);
    ::dup2(out[1], 1);
    if (::setgroups(0, nullptr) != 0 || ::setgid(kUid) != 0 || ::setuid(kUid) != 0) ::_exit(126);
    char* envp[] = {const_cast<char*>("LOCKSTEP_AGENT=10.9.0.1:7001"),
                    const_cast<char*>("PATH=/usr/bin:/bin"), nullptr};
    ::execle("/bin/sh", "sh", "-c",
             "setsid sleep 30 </dev/null >/dev/null 2>&1 & echo $!; exec sleep 30 >/dev/null",
             static_cast<char*>(nullptr), envp);
    ::_exit(127);
  }
  ::setpgid(worker, worker);
  ::close(out[1]);
  char buf[32] = {};
  if (::read(out[0], buf, sizeof(buf) - 1) <= 0) return 14;
  const pid_t helper = static_cast<pid_t>(std::atoi(buf));
  if (helper <= 0) return 15;
  // The premise: its environment is closed to this process.
  const int fd = ::open(("/proc/" + std::to_string(helper) + "/environ").c_str(), O_RDONLY);
  if (fd >= 0) {
    char probe[1];
    const bool readable = ::read(fd, probe, 1) > 0;
    ::close(fd);
    if (readable) return 78;
  }
  FenceGuard::Entry entry = (*guard)->Watch(worker, "j-uid", 0, 1);
  fence.SetDeadline(worker_link::MonotonicNowNs() - 1000000);
  if (::waitpid(worker, nullptr, 0) != worker) return 16;
  std::this_thread::sleep_for(milliseconds(1500));  // the guard's sweeps end
  if (::kill(helper, 0) != 0) return 2;  // killed though nothing told the guard its uid
  (*guard)->SetJobUids(60000, 60999);
  fence.SetDeadline(worker_link::MonotonicNowNs() - 1000000);  // a new deadline: a new sweep
  const bool gone = WaitFor(
      [&] { return ::waitpid(helper, nullptr, WNOHANG) == helper || ::kill(helper, 0) != 0; },
      milliseconds(3000));
  if (!gone) ::kill(helper, SIGKILL);
  return gone ? 0 : 1;
}

// Where the agent cannot read its workers' environment (another uid's,
// without CAP_SYS_PTRACE, as the shipped unit and pod run it), a helper
// running as one of the node's job uids is killed by its uid.
TEST(FenceGuardUidTest, AHelperWhoseEnvironmentIsClosedIsKilledByItsJobUid) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (a job uid)";
  const pid_t child = ::fork();
  if (child == 0) {
    // Orphans are this child's (it is the agent): a subreaper.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    ::_exit(HelperOfAJobUid());
  }
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  ASSERT_TRUE(WIFEXITED(st));
  if (WEXITSTATUS(st) == 77) GTEST_SKIP() << "capabilities cannot be dropped here";
  if (WEXITSTATUS(st) == 78) GTEST_SKIP() << "this kernel lets the process read the environment anyway";
  EXPECT_EQ(WEXITSTATUS(st), 0) << "1: the helper outlived the fence with its uid known; 2: it "
                                   "was killed without; 11-16: the scenario could not be set up";
}

TEST_F(FenceGuardTest, ListsAsManyWorkersAsItHasSlots) {
  std::vector<FenceGuard::Entry> entries;
  for (int i = 0; i < FenceGuard::kSlots; ++i) {
    entries.push_back(guard_->Watch(kNoSuchPid, "j-many", i, 1));
    ASSERT_TRUE(entries.back().guarded()) << i;
  }
  EXPECT_FALSE(guard_->Watch(kNoSuchPid, "j-many", -1, 1).guarded());
  entries.erase(entries.begin() + 10);  // frees a slot
  FenceGuard::Entry again = guard_->Watch(kNoSuchPid, "j-many", -1, 1);
  EXPECT_TRUE(again.guarded());
  // Nothing listed exists: nothing is killed and nothing is said.
  PassDeadline();
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(GuardLog(), "");
  EXPECT_EQ(again.KilledNs(), 0);
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
