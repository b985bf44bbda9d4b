#include "daemon/cleaner.h"

#include <grp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/log_capture.h"
#include "daemon/uid_lease.h"

namespace lockstep {
namespace daemon {
namespace {

// Uids no other test uses.
constexpr uint32_t kUid = 70990;

class CleanerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (files of another uid)";
    root_ = absl::StrCat(::testing::TempDir(), "/cleaner_", ::getpid(), "_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(root_ + "/tmp");
    std::filesystem::create_directories(root_ + "/state/jobs");
  }
  void TearDown() override {
    if (root_.empty()) return;
    std::filesystem::remove_all(root_);
    // Whatever a failed test left running as the uids (the fork bomb).
    for (uint32_t uid : {kUid, kUid + 1}) {
      const pid_t child = ::fork();
      if (child == 0) {
        if (::setgroups(0, nullptr) == 0 && ::setgid(uid) == 0 && ::setuid(uid) == 0) ::kill(-1, SIGKILL);
        ::_exit(0);
      }
      if (child > 0) ::waitpid(child, nullptr, 0);
    }
  }
  // A file of `uid`'s in the leftover dir.
  std::string Leave(uint32_t uid) {
    const std::string path = absl::StrCat(root_, "/tmp/left-", uid);
    std::ofstream(path) << "data\n";
    EXPECT_EQ(::chown(path.c_str(), uid, uid), 0);
    return path;
  }
  UidLease Lease(uint32_t uid) {
    auto lease = UidLeases(root_ + "/leases", kUid, kUid + 1).Take(uid);
    EXPECT_TRUE(lease.ok()) << lease.status();
    return lease.ok() ? *std::move(lease) : UidLease();
  }
  bool Free(uint32_t uid) { return UidLeases(root_ + "/leases", kUid, kUid + 1).Take(uid).ok(); }
  CleanerOptions Options() const { return {root_ + "/state", {root_ + "/tmp"}, nullptr}; }
  static bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }
  std::string root_;
};

// A uid handed over is pending (its job too) until clean; its lease is
// held until then, and free after.
TEST_F(CleanerTest, HoldsTheUidUntilItIsClean) {
  const std::string file = Leave(kUid);
  Cleaner cleaner(Options());
  cleaner.Reclaim(Lease(kUid), "j1");
  ASSERT_TRUE(cleaner.Drain(std::chrono::seconds(10)));
  EXPECT_FALSE(cleaner.Pending("j1"));
  EXPECT_FALSE(Exists(file));
  EXPECT_TRUE(Free(kUid));
}

// The job dir goes to root once its uid's leftovers are gone: a hard link
// the job made in /tmp to a file of its dir is removed, not given to root
// with the file (where it would stay, readable by the next job).
TEST_F(CleanerTest, RemovesLinksOutOfTheJobDirBeforeGivingItToRoot) {
  const std::string dir = root_ + "/state/jobs/j1";
  ASSERT_EQ(::mkdir(dir.c_str(), 0750), 0);
  std::ofstream(dir + "/weights") << "secret\n";
  ASSERT_EQ(::chown(dir.c_str(), kUid, kUid), 0);
  ASSERT_EQ(::chown((dir + "/weights").c_str(), kUid, kUid), 0);
  const std::string link = root_ + "/tmp/weights-link";
  ASSERT_EQ(::link((dir + "/weights").c_str(), link.c_str()), 0);
  Cleaner cleaner(Options());
  cleaner.Reclaim(Lease(kUid), "j1");
  ASSERT_TRUE(cleaner.Drain(std::chrono::seconds(10)));
  EXPECT_FALSE(Exists(link)) << "the link in the leftover dir went to root with the job dir";
  struct stat st;
  ASSERT_EQ(::stat((dir + "/weights").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
}

// A drain that runs out of time stops the clean under way, drops what is
// queued (the leases with it), says which uids were left, and returns;
// what those uids left stays for the next daemon to clean.
TEST_F(CleanerTest, ADrainPastItsLimitStopsAndSaysWhatWasLeft) {
  const std::string first = Leave(kUid), second = Leave(kUid + 1);
  CleanerOptions options = Options();
  options.before_clean = [](const std::string&) { std::this_thread::sleep_for(std::chrono::milliseconds(500)); };
  LogCapture log;
  Cleaner cleaner(options);
  cleaner.Reclaim(Lease(kUid), "j1");
  cleaner.Reclaim(Lease(kUid + 1), "j2");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(cleaner.Drain(std::chrono::milliseconds(100)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_NE(log.Lines().find(absl::StrCat("gave up cleaning uid ", kUid, ", uid ", kUid + 1)),
            std::string::npos)
      << log.Lines();
  EXPECT_FALSE(cleaner.Pending("j1"));
  EXPECT_FALSE(cleaner.Pending("j2"));
  EXPECT_TRUE(Exists(first)) << "the clean under way was not stopped";
  EXPECT_TRUE(Exists(second));
  EXPECT_TRUE(Free(kUid));
  EXPECT_TRUE(Free(kUid + 1));
}

// The uid's processes that are not zombies.
std::vector<pid_t> LiveProcessesOf(uint32_t uid) {
  std::vector<pid_t> live;
  for (pid_t pid : ProcessesOfUid(uid)) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    if (close != std::string::npos && line.size() > close + 2 && line[close + 2] != 'Z') {
      live.push_back(pid);
    }
  }
  return live;
}

// A fork bomb of the uid's (every process forking two more, up to its
// RLIMIT_NPROC of 200) is gone once its uid is reclaimed: killed at once as
// that uid, which no listing of pids, each killed in turn, can promise.
TEST_F(CleanerTest, KillsAForkBombOfTheUid) {
  ASSERT_TRUE(LiveProcessesOf(kUid).empty()) << "uid " << kUid << " is in use on this machine";
  // The bomb's orphans become this process's children, reaped here: zombies
  // left to an init that reaps late would still count against the uid's
  // RLIMIT_NPROC in the next run.
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  auto reap_all = [] {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
  };
  const pid_t bomb = ::fork();
  ASSERT_GE(bomb, 0);
  if (bomb == 0) {
    struct rlimit rl = {200, 200};
    if (::setrlimit(RLIMIT_NPROC, &rl) != 0 || ::setsid() < 0 || ::setgroups(0, nullptr) != 0 ||
        ::setgid(kUid) != 0 || ::setuid(kUid) != 0) {
      ::_exit(1);
    }
    ::execl("/bin/sh", "sh", "-c", "b() { b & b & wait; }; b", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  size_t most = 0;  // its population comes and goes
  while (most < 40 && std::chrono::steady_clock::now() < until) {
    most = std::max(most, LiveProcessesOf(kUid).size());
    reap_all();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(most, 40u) << "the bomb did not go off";
  LogCapture log;
  Cleaner cleaner(Options());
  cleaner.Reclaim(Lease(kUid), "j1");
  ASSERT_TRUE(cleaner.Drain(std::chrono::seconds(10)));
  ::waitpid(bomb, nullptr, 0);
  // Killed processes take a moment to finish exiting; survivors would go on
  // forking.
  const auto gone_by = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!LiveProcessesOf(kUid).empty() && std::chrono::steady_clock::now() < gone_by) {
    reap_all();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(LiveProcessesOf(kUid).empty()) << LiveProcessesOf(kUid).size() << " left";
  reap_all();
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  EXPECT_NE(log.Lines().find(absl::StrCat("still running as uid ", kUid)), std::string::npos)
      << log.Lines();
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
