#include "daemon/uid_lease.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;

// A range no account on a build machine has (checked in each test).
constexpr uint32_t kFirst = 70900;

class UidLeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    root_ = absl::StrCat(tmp ? tmp : "/tmp", "/uid-lease-", ::getpid(), "-",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    dir_ = root_ + "/run/job-uids";
  }
  std::string root_;
  std::string dir_;
};

TEST_F(UidLeaseTest, TwoDaemonsNeverShareAUidAndAFreedOneComesBack) {
  // Two lockstepds on one host are two UidLeases over the same dir.
  UidLeases a(dir_, kFirst, kFirst + 2);
  UidLeases b(dir_, kFirst, kFirst + 2);
  auto a1 = a.Acquire();
  ASSERT_TRUE(a1.ok()) << a1.status();
  auto b1 = b.Acquire();
  ASSERT_TRUE(b1.ok()) << b1.status();
  auto a2 = a.Acquire();
  ASSERT_TRUE(a2.ok()) << a2.status();
  EXPECT_EQ(a1->uid(), kFirst);
  EXPECT_EQ(b1->uid(), kFirst + 1);
  EXPECT_EQ(a2->uid(), kFirst + 2);
  auto none = b.Acquire();
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(none.status().message(), HasSubstr("no free uid for this job in 70900-70902: 3 leased"));

  *b1 = UidLease();  // job on b ends
  auto again = a.Acquire();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->uid(), kFirst + 1);
}

TEST_F(UidLeaseTest, ALeaseDiesWithItsProcess) {
  // A daemon that crashes (here: a child killed with SIGKILL) frees its
  // uids without anyone cleaning up.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto lease = UidLeases(dir_, kFirst, kFirst).Acquire();
    char c = lease.ok() ? '1' : '0';
    (void)!::write(ready[1], &c, 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, '1') << "the child could not lease uid " << kFirst;
  UidLeases here(dir_, kFirst, kFirst);
  auto taken = here.Acquire();
  ASSERT_FALSE(taken.ok());
  EXPECT_THAT(taken.status().message(), HasSubstr("1 leased to running jobs"));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  auto freed = here.Acquire();
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(freed->uid(), kFirst);
}

TEST_F(UidLeaseTest, AUidNamedInTheUserDatabaseIsNeverHandedOut) {
  // uid 0 is root on every machine.
  auto r = UidLeases(dir_, 0, 0).Acquire();
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("1 named in the user database"));
}

TEST_F(UidLeaseTest, AUidWithProcessesButNoLeaseIsSkipped) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to start a process of another uid";
  const uint32_t busy = kFirst + 50;
  ASSERT_TRUE(ProcessesOfUid(busy).empty()) << "uid " << busy << " is in use on this machine";
  // What a daemonized helper left by a dead lockstepd looks like.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char c = ::setgid(busy) == 0 && ::setuid(busy) == 0 ? '1' : '0';
    (void)!::write(ready[1], &c, 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, '1');
  auto r = UidLeases(dir_, busy, busy + 1).Acquire();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->uid(), busy + 1);
  auto none = UidLeases(dir_, busy, busy).Acquire();
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("1 with processes no lockstepd leases"));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
}

// A uid an earlier job left unclean is not handed out: its lease goes to
// the caller to clean, held (no other daemon can take it meanwhile), and the
// next clean uid is handed out; once cleaned and dropped it comes back.
TEST_F(UidLeaseTest, AnUncleanUidIsHandedBackToBeCleanedNotOut) {
  UidLeases leases(dir_, kFirst, kFirst + 2);
  bool first_unclean = true;
  auto unclean = [&](uint32_t uid) { return uid == kFirst && first_unclean; };
  std::vector<UidLease> to_clean;
  auto got = leases.Acquire(unclean, &to_clean);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->uid(), kFirst + 1);
  ASSERT_EQ(to_clean.size(), 1u);
  EXPECT_EQ(to_clean[0].uid(), kFirst);
  EXPECT_TRUE(to_clean[0].held());
  // Being cleaned: another daemon's Acquire skips it as held.
  auto other = UidLeases(dir_, kFirst, kFirst).Acquire();
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(other.status().message(), HasSubstr("1 leased to running jobs or being cleaned"));
  // Every uid left is unclean: none is handed out, and the message says so.
  std::vector<UidLease> more;
  auto none = leases.Acquire([](uint32_t) { return true; }, &more);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(),
              HasSubstr("1 with an earlier job's files or IPC objects left"));
  EXPECT_EQ(more.size(), 1u);
  more.clear();
  // Cleaned and dropped: the lowest uid is free and clean again.
  first_unclean = false;
  to_clean.clear();
  auto again = leases.Acquire(unclean, &to_clean);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->uid(), kFirst);
  EXPECT_TRUE(to_clean.empty());
}

TEST(UserSwitchCapabilitiesTest, AProcessWithoutCapabilitiesLacksAllFour) {
  const std::string all = "CAP_SETUID, CAP_SETGID, CAP_CHOWN, CAP_KILL";
  if (::geteuid() != 0) {
    EXPECT_EQ(MissingUserSwitchCapabilities(), all);
    return;
  }
  EXPECT_EQ(MissingUserSwitchCapabilities(), "") << "root here is expected to hold them";
  // As another uid a process has no effective capabilities at all.
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::string missing = ::setresgid(65534, 65534, 65534) == 0 &&
                                  ::setresuid(65534, 65534, 65534) == 0
                              ? MissingUserSwitchCapabilities()
                              : "setresuid failed";
    (void)!::write(out[1], missing.data(), missing.size());
    ::_exit(0);
  }
  ::close(out[1]);
  char buf[256];
  ssize_t n = ::read(out[0], buf, sizeof(buf));
  ::waitpid(child, nullptr, 0);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, n), all);
}

TEST_F(UidLeaseTest, ADirOthersMayWriteOrASymlinkIsRefused) {
  UidLeases leases(dir_, kFirst, kFirst);
  ASSERT_TRUE(leases.Prepare().ok());
  struct stat st;
  ASSERT_EQ(::stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);

  ASSERT_EQ(::chmod(dir_.c_str(), 0770), 0);
  absl::Status open = leases.Prepare();
  EXPECT_EQ(open.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(open.message(), HasSubstr("no access for others"));
  EXPECT_THAT(open.message(), HasSubstr("mode 0770"));
  EXPECT_FALSE(leases.Acquire().ok());

  const std::string link = root_ + "/link";
  ASSERT_EQ(::symlink(dir_.c_str(), link.c_str()), 0);
  absl::Status sym = UidLeases(link, kFirst, kFirst).Prepare();
  EXPECT_THAT(sym.message(), HasSubstr("is not a directory (a symlink is refused)"));
  EXPECT_THAT(UidLeases("relative/dir", kFirst, kFirst).Prepare().message(),
              HasSubstr("not an absolute path"));
}

}  // namespace
}  // namespace lockstep
