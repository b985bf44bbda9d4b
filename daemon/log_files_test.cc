#include "daemon/log_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace daemon {
namespace {

class LogFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/log_files_", ::getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_EQ(::mkdir(dir_.c_str(), 0755), 0);
    // What a job must not reach through its log files.
    victim_ = dir_ + "/victim";
    std::ofstream(victim_) << "secret\n";
    ASSERT_EQ(::chmod(victim_.c_str(), 0600), 0);
  }
  static std::string Contents(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  static std::string ReadFd(int fd) {
    std::string out(4096, '\0');
    const ssize_t n = ::read(fd, out.data(), out.size());
    out.resize(n > 0 ? n : 0);
    return out;
  }
  static int Mode(const std::string& path) {
    struct stat st;
    return ::lstat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 07777) : -1;
  }
  std::string dir_, victim_;
};

TEST_F(LogFilesTest, AppendCreatesA0640FileWhateverTheUmask) {
  const mode_t old = ::umask(0);
  const std::string path = dir_ + "/rank-0.stdout";
  StatusOr<int> fd = OpenLogForAppend(path);
  ::umask(old);
  ASSERT_TRUE(fd.ok()) << fd.status();
  ASSERT_EQ(::write(*fd, "a\n", 2), 2);
  ::close(*fd);
  fd = OpenLogForAppend(path);  // again: appends
  ASSERT_TRUE(fd.ok()) << fd.status();
  ASSERT_EQ(::write(*fd, "b\n", 2), 2);
  ::close(*fd);
  EXPECT_EQ(Contents(path), "a\nb\n");
  EXPECT_EQ(Mode(path), 0640);
}

// A job replaced its log file with a symlink, a FIFO or a directory: the
// entry is replaced by a new file; what the link points to is untouched,
// and nothing blocks on the FIFO.
TEST_F(LogFilesTest, AppendReplacesWhatIsNotARegularFileWithoutFollowingIt) {
  const std::string link = dir_ + "/link.stdout";
  ASSERT_EQ(::symlink(victim_.c_str(), link.c_str()), 0);
  const std::string fifo = dir_ + "/fifo.stdout";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0666), 0);
  for (const std::string& path : {link, fifo}) {
    StatusOr<int> fd = OpenLogForAppend(path);
    ASSERT_TRUE(fd.ok()) << path << ": " << fd.status();
    ASSERT_EQ(::write(*fd, "header\n", 7), 7);
    ::close(*fd);
    struct stat st;
    ASSERT_EQ(::lstat(path.c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode)) << path;
    EXPECT_EQ(Contents(path), "header\n") << path;
  }
  EXPECT_EQ(Contents(victim_), "secret\n");
  EXPECT_EQ(Mode(victim_), 0600);
  const std::string subdir = dir_ + "/dir.stdout";
  ASSERT_EQ(::mkdir(subdir.c_str(), 0755), 0);
  StatusOr<int> fd = OpenLogForAppend(subdir);
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(fd.status().message().find(subdir), std::string::npos) << fd.status();
}

TEST_F(LogFilesTest, ReadOpensOnlyARegularFile) {
  const std::string path = dir_ + "/rank-0.stderr";
  std::ofstream(path) << "last line\n";
  StatusOr<int> fd = OpenLogForRead(path);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(ReadFd(*fd), "last line\n");
  ::close(*fd);
  EXPECT_EQ(OpenLogForRead(dir_ + "/none").status().code(), absl::StatusCode::kNotFound);
  const std::string link = dir_ + "/link.stderr";
  ASSERT_EQ(::symlink(victim_.c_str(), link.c_str()), 0);
  fd = OpenLogForRead(link);
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(fd.status().message().find("a symlink"), std::string::npos) << fd.status();
  const std::string fifo = dir_ + "/fifo.stderr";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0666), 0);
  EXPECT_EQ(OpenLogForRead(fifo).status().code(), absl::StatusCode::kFailedPrecondition);
}

// A worker keeps appending through its O_APPEND descriptor: after the
// rotation its output lands after the marker in the emptied file, and what
// was there is in .1; a second rotation replaces .1.
TEST_F(LogFilesTest, RotateMovesTheOutputAsideAndTheWriterGoesOn) {
  const std::string path = dir_ + "/rank-0.stdout";
  StatusOr<int> fd = OpenLogForAppend(path);
  ASSERT_TRUE(fd.ok()) << fd.status();
  ASSERT_EQ(::write(*fd, "one\ntwo\n", 8), 8);
  StatusOr<Rotation> r = RotateLog(path, "=== head");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->kept);
  EXPECT_EQ(r->bytes, 8);
  EXPECT_EQ(Contents(path + ".1"), "one\ntwo\n");
  EXPECT_EQ(Mode(path + ".1"), 0640);
  ASSERT_EQ(::write(*fd, "three\n", 6), 6);
  EXPECT_EQ(Contents(path), "=== head; the earlier output is in rank-0.stdout.1 ===\nthree\n");
  r = RotateLog(path, "=== again");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Contents(path + ".1"), "=== head; the earlier output is in rank-0.stdout.1 ===\nthree\n");
  EXPECT_EQ(Contents(path), "=== again; the earlier output is in rank-0.stdout.1 ===\n");
  ::close(*fd);
  struct stat st;
  EXPECT_NE(::lstat((path + ".1.tmp").c_str(), &st), 0) << "a temporary file was left";
}

// A rotation copies what the log held when it began: with writers going on
// as fast as it copies, a copy to the end never ended (3.2 GB of .1 with a
// 1 MiB cap) and could fill the disk. What they wrote meanwhile is dropped,
// and the marker says how much.
TEST_F(LogFilesTest, RotatingALogThatKeepsGrowingCopiesWhatItHeldWhenItBegan) {
  const std::string path = dir_ + "/rank-0.stdout";
  StatusOr<int> fd = OpenLogForAppend(path);
  ASSERT_TRUE(fd.ok()) << fd.status();
  std::atomic<bool> stop{false};
  constexpr int64_t kBudget = int64_t{96} << 20;  // per writer
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t) {
    writers.emplace_back([&] {
      const std::string chunk(256 << 10, 'w');
      for (int64_t done = 0; done < kBudget && !stop.load(); done += chunk.size()) {
        if (::write(*fd, chunk.data(), chunk.size()) <= 0) return;
      }
    });
  }
  struct stat st;
  while (::stat(path.c_str(), &st) == 0 && st.st_size < (4 << 20)) std::this_thread::yield();
  StatusOr<Rotation> r = RotateLog(path, "=== head");
  stop = true;
  for (auto& w : writers) w.join();
  ::close(*fd);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->kept);
  ASSERT_EQ(::stat((path + ".1").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, r->bytes);
  EXPECT_LT(r->bytes, int64_t{48} << 20) << "the copy chased the writers";
  // The marker follows whatever the writers appended after the truncation.
  const std::string now = Contents(path);
  const std::string marker =
      r->dropped > 0
          ? absl::StrCat("=== head; the earlier output is in rank-0.stdout.1 (", r->dropped,
                         " bytes written while it was copied were dropped) ===\n")
          : "=== head; the earlier output is in rank-0.stdout.1 ===\n";
  EXPECT_NE(now.find(marker), std::string::npos) << marker;
}

// A hard link the job made in its dir to a file it could not otherwise
// touch (possible where fs.protected_hardlinks is off): replaced when the
// log is opened for the next worker, never read, rotated or chmodded.
TEST_F(LogFilesTest, AHardLinkAtTheLogsNameIsReplacedNeverUsed) {
  const std::string path = dir_ + "/rank-0.stdout";
  ASSERT_EQ(::link(victim_.c_str(), path.c_str()), 0);
  StatusOr<int> rd = OpenLogForRead(path);
  EXPECT_EQ(rd.status().code(), absl::StatusCode::kFailedPrecondition) << rd.status();
  EXPECT_NE(rd.status().message().find("a hard link"), std::string::npos) << rd.status();
  StatusOr<Rotation> r = RotateLog(path, "=== head");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_EQ(Contents(victim_), "secret\n");

  StatusOr<int> fd = OpenLogForAppend(path);
  ASSERT_TRUE(fd.ok()) << fd.status();
  ASSERT_EQ(::write(*fd, "out\n", 4), 4);
  ::close(*fd);
  EXPECT_EQ(Contents(path), "out\n");
  EXPECT_EQ(Contents(victim_), "secret\n");
  EXPECT_EQ(Mode(victim_), 0600) << "the victim was chmodded through the link";
  struct stat st;
  ASSERT_EQ(::stat(victim_.c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 1u);
}

// The job owns the dir: a symlink at the log's name is not rotated (nor
// read), and symlinks at .1 or its temporary name are replaced, never
// written through.
TEST_F(LogFilesTest, RotateFollowsNoSymlink) {
  const std::string link = dir_ + "/link.stdout";
  ASSERT_EQ(::symlink(victim_.c_str(), link.c_str()), 0);
  StatusOr<Rotation> r = RotateLog(link, "=== x");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("a symlink"), std::string::npos) << r.status();

  const std::string path = dir_ + "/rank-1.stderr";
  std::ofstream(path) << "output\n";
  ASSERT_EQ(::symlink(victim_.c_str(), (path + ".1").c_str()), 0);
  ASSERT_EQ(::symlink(victim_.c_str(), (path + ".1.tmp").c_str()), 0);
  r = RotateLog(path, "=== x");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->kept);
  struct stat st;
  ASSERT_EQ(::lstat((path + ".1").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(Contents(path + ".1"), "output\n");
  EXPECT_EQ(Contents(victim_), "secret\n");
  EXPECT_EQ(Mode(victim_), 0600);
}

// .1 cannot be made (here a directory stands at its temporary name's
// place and cannot be unlinked; on a full disk the copy fails alike): the
// log is emptied anyway, and its marker says the output was dropped and why.
TEST_F(LogFilesTest, RotateEmptiesTheLogWhenTheCopyCannotBeWritten) {
  const std::string path = dir_ + "/rank-2.stdout";
  std::ofstream(path) << "lots of output\n";
  ASSERT_EQ(::mkdir((path + ".1.tmp").c_str(), 0755), 0);
  StatusOr<Rotation> r = RotateLog(path, "=== full");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->kept);
  EXPECT_EQ(r->bytes, 15);
  EXPECT_NE(r->why_lost.find("create " + path + ".1.tmp: File exists"), std::string::npos) << r->why_lost;
  EXPECT_EQ(Contents(path), absl::StrCat("=== full; the earlier output was dropped (", r->why_lost, ") ===\n"));
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
