#include "daemon/cleaner.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
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
  CleanerOptions Options() const {
    CleanerOptions options;
    options.state_dir = root_ + "/state";
    options.leftover_dirs = {root_ + "/tmp"};
    return options;
  }
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

// A fork bomb of the uid's (every process forking without end, up to its
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
    // Each process stops forking and exits 20 s after the bomb began (the
    // deadline is copied with the memory), so a run that fails to kill it
    // leaves no bomb behind.
    ::execl("/usr/bin/perl", "perl", "-e", "my $end = time + 20; fork while time < $end",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Every process forks again at once whether its last fork failed or
  // not, so the bomb stays at its cap, any place freed taken at once, until
  // it is killed. (A `b() { b & b & wait; }` bomb of dash's dies out
  // within a second or so at its cap, a dash that cannot fork exiting: a
  // slow run of this test, under TSan, saw too little of it; bash's retries
  // sleep, and a kill per pid outran them.)
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  size_t live = 0;
  while (live < 100 && std::chrono::steady_clock::now() < until) {
    live = LiveProcessesOf(kUid).size();
    reap_all();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(live, 100u) << "the bomb did not go off";
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

// Acquire hands out the lowest free uid that is clean. One with an earlier
// job's leftovers is cleaned instead; when no clean one is free, it waits
// for that clean and takes the uid then.
TEST_F(CleanerTest, AcquireCleansAUidLeftUncleanAndTakesItOnceNoneIsFree) {
  const std::string stale = Leave(kUid);
  UidLease held = Lease(kUid + 1);  // the other uid of the range: a running job's
  LogCapture log;
  Cleaner cleaner(Options());
  cleaner.Acquire("j1", UidLeases(root_ + "/leases", kUid, kUid + 1));
  ASSERT_TRUE(cleaner.Drain(std::chrono::seconds(10)));
  auto found = cleaner.TakeAcquired();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].first, "j1");
  ASSERT_TRUE(found[0].second.ok()) << found[0].second.status() << "\n" << log.Lines();
  EXPECT_EQ(found[0].second->uid(), kUid);
  EXPECT_FALSE(Exists(stale)) << "handed out with an earlier job's file";
  EXPECT_NE(log.Lines().find(absl::StrCat("no clean uid free: waiting for uid(s) ", kUid, " to be cleaned")),
            std::string::npos)
      << log.Lines();
  EXPECT_TRUE(cleaner.TakeAcquired().empty());
}

// A search that waits for a clean gives up after uid_clean_wait, naming
// the uid still being cleaned; the clean goes on.
TEST_F(CleanerTest, AcquireWaitsForACleanOnlySoLong) {
  const std::string stale = Leave(kUid);
  UidLease held = Lease(kUid + 1);
  std::mutex mu;
  std::condition_variable cv;
  bool holding = true;
  CleanerOptions options = Options();
  options.uid_clean_wait = std::chrono::milliseconds(300);
  options.before_clean = [&](const std::string& what) {
    if (what != absl::StrCat("uid ", kUid)) return;
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return !holding; });
  };
  Cleaner cleaner(options);
  cleaner.Acquire("j1", UidLeases(root_ + "/leases", kUid, kUid + 1));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::vector<std::pair<std::string, absl::StatusOr<UidLease>>> found;
  while (found.empty() && std::chrono::steady_clock::now() < until) {
    found = cleaner.TakeAcquired();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(found.size(), 1u) << "the search never gave up";
  ASSERT_FALSE(found[0].second.ok());
  EXPECT_NE(found[0].second.status().message().find(
                absl::StrCat("s for uid(s) ", kUid, " to be cleaned, and they still are")),
            std::string::npos)
      << found[0].second.status();
  EXPECT_TRUE(Exists(stale)) << "the held clean ran";
  {
    std::lock_guard<std::mutex> lock(mu);
    holding = false;
  }
  cv.notify_all();
  ASSERT_TRUE(cleaner.Drain(std::chrono::seconds(10)));
  EXPECT_FALSE(Exists(stale));
}

// A uid whose leftovers cannot be removed (an immutable file) is left
// alone for kUncleanRetry: not handed out, and not cleaned again at every
// job start; the next uid is.
TEST_F(CleanerTest, AUidThatCannotBeCleanedIsLeftAloneForAWhile) {
  const std::string stuck = Leave(kUid);
  const int fd = ::open(stuck.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  int flags = 0;
  const bool immutable = ::ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0 &&
                         (flags |= FS_IMMUTABLE_FL, ::ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0);
  ::close(fd);
  if (!immutable) GTEST_SKIP() << "this file system has no immutable files";
  struct Unfreeze {
    std::string path;
    ~Unfreeze() {
      const int f = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      int fl = 0;
      if (f >= 0 && ::ioctl(f, FS_IOC_GETFLAGS, &fl) == 0) {
        fl &= ~FS_IMMUTABLE_FL;
        (void)::ioctl(f, FS_IOC_SETFLAGS, &fl);
      }
      if (f >= 0) ::close(f);
    }
  } unfreeze{stuck};
  LogCapture log;
  Cleaner cleaner(Options());
  cleaner.Reclaim(Lease(kUid), "j1");
  ASSERT_TRUE(cleaner.Drain(std::chrono::seconds(10)));
  EXPECT_NE(log.Lines().find(absl::StrCat("uid ", kUid, " could not be cleaned")), std::string::npos)
      << log.Lines();
  EXPECT_EQ(cleaner.Stats().unclean_uids, 1);
  const UidLeases leases(root_ + "/leases", kUid, kUid + 1);
  cleaner.Acquire("j2", leases);
  ASSERT_TRUE(cleaner.Drain(std::chrono::seconds(10)));
  auto found = cleaner.TakeAcquired();
  ASSERT_EQ(found.size(), 1u);
  ASSERT_TRUE(found[0].second.ok()) << found[0].second.status();
  EXPECT_EQ(found[0].second->uid(), kUid + 1);
  // With the other uid taken, none is free; the stuck one is not tried.
  cleaner.Acquire("j3", leases);
  ASSERT_TRUE(cleaner.Drain(std::chrono::seconds(10)));
  found = cleaner.TakeAcquired();
  ASSERT_EQ(found.size(), 1u);
  ASSERT_FALSE(found[0].second.ok());
  EXPECT_NE(found[0].second.status().message().find("1 with an earlier job's files or IPC objects left"),
            std::string::npos)
      << found[0].second.status();
  const std::string lines = log.Lines();
  size_t tries = 0;
  for (size_t at = 0; (at = lines.find(absl::StrCat("could not remove what uid ", kUid), at)) !=
                      std::string::npos;
       ++at) {
    ++tries;
  }
  EXPECT_EQ(tries, 1u) << "cleaned again within kUncleanRetry: " << lines;
  EXPECT_EQ(lines.find(absl::StrCat("uid ", kUid, " still owns")), std::string::npos) << lines;
}

// Each kind of work has a lane: a log rotation runs, and a uid is found,
// while a uid's clean is held (a job that left millions of files).
TEST_F(CleanerTest, ARotationAndAUidSearchDoNotWaitBehindAClean) {
  std::mutex mu;
  std::condition_variable cv;
  bool holding = true;
  CleanerOptions options = Options();
  options.before_clean = [&](const std::string& what) {
    if (what != absl::StrCat("uid ", kUid)) return;
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return !holding; });
  };
  Cleaner cleaner(options);
  cleaner.Reclaim(Lease(kUid), "j1");
  std::atomic<bool> rotated{false};
  ASSERT_TRUE(cleaner.Run("j2", "rank-0.stdout", [&] { rotated = true; }));
  cleaner.Acquire("j3", UidLeases(root_ + "/leases", kUid, kUid + 1));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::vector<std::pair<std::string, absl::StatusOr<UidLease>>> found;
  while ((!rotated || found.empty()) && std::chrono::steady_clock::now() < until) {
    for (auto& f : cleaner.TakeAcquired()) found.push_back(std::move(f));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(rotated) << "the rotation waited behind the clean";
  ASSERT_EQ(found.size(), 1u) << "the uid search waited behind the clean";
  ASSERT_TRUE(found[0].second.ok()) << found[0].second.status();
  EXPECT_EQ(found[0].second->uid(), kUid + 1) << "given the uid being cleaned";
  EXPECT_TRUE(cleaner.Pending("j1"));
  cleaner.RemoveJobDir("j4", root_ + "/state/jobs/j4");  // queued behind the held clean
  Cleaner::Backlog backlog = cleaner.Stats();
  EXPECT_EQ(backlog.clean, 2);
  EXPECT_EQ(backlog.rotate, 0);
  EXPECT_EQ(backlog.find_uid, 0);
  {
    std::lock_guard<std::mutex> lock(mu);
    holding = false;
  }
  cv.notify_all();
  ASSERT_TRUE(cleaner.Drain(std::chrono::seconds(10)));
  EXPECT_FALSE(cleaner.Pending("j1"));
  backlog = cleaner.Stats();
  EXPECT_EQ(backlog.clean, 0);
  EXPECT_EQ(backlog.unclean_uids, 0);
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
