#include "daemon/uid_reclaimer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/log_capture.h"
#include "daemon/uid_lease.h"

namespace lockstep {
namespace daemon {
namespace {

// Uids no other test uses.
constexpr uint32_t kUid = 70990;

class UidReclaimerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (files of another uid)";
    root_ = absl::StrCat(::testing::TempDir(), "/reclaimer_", ::getpid(), "_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(root_ + "/tmp");
    std::filesystem::create_directories(root_ + "/state/jobs");
  }
  void TearDown() override {
    if (!root_.empty()) std::filesystem::remove_all(root_);
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
  UidReclaimerOptions Options() const { return {root_ + "/state", {root_ + "/tmp"}, nullptr}; }
  static bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }
  std::string root_;
};

// A uid handed over is pending (its job too) until clean; its lease is
// held until then, and free after.
TEST_F(UidReclaimerTest, HoldsTheUidUntilItIsClean) {
  const std::string file = Leave(kUid);
  UidReclaimer reclaimer(Options());
  reclaimer.Reclaim(Lease(kUid), "j1");
  ASSERT_TRUE(reclaimer.Drain(std::chrono::seconds(10)));
  EXPECT_FALSE(reclaimer.Pending("j1"));
  EXPECT_FALSE(Exists(file));
  EXPECT_TRUE(Free(kUid));
}

// A drain that runs out of time stops the clean under way, drops what is
// queued (the leases with it), says which uids were left, and returns;
// what those uids left stays for the next daemon to clean.
TEST_F(UidReclaimerTest, ADrainPastItsLimitStopsAndSaysWhatWasLeft) {
  const std::string first = Leave(kUid), second = Leave(kUid + 1);
  UidReclaimerOptions options = Options();
  options.before_clean = [](uint32_t) { std::this_thread::sleep_for(std::chrono::milliseconds(500)); };
  LogCapture log;
  UidReclaimer reclaimer(options);
  reclaimer.Reclaim(Lease(kUid), "j1");
  reclaimer.Reclaim(Lease(kUid + 1), "j2");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(reclaimer.Drain(std::chrono::milliseconds(100)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_NE(log.Lines().find(absl::StrCat("gave up cleaning job uids ", kUid, ", ", kUid + 1)),
            std::string::npos)
      << log.Lines();
  EXPECT_FALSE(reclaimer.Pending("j1"));
  EXPECT_FALSE(reclaimer.Pending("j2"));
  EXPECT_TRUE(Exists(first)) << "the clean under way was not stopped";
  EXPECT_TRUE(Exists(second));
  EXPECT_TRUE(Free(kUid));
  EXPECT_TRUE(Free(kUid + 1));
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
