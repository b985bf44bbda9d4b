#include "daemon/uid_leftovers.h"

#include <fcntl.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace daemon {
namespace {

// A uid no test runs jobs as (the job uids are 70000-70999).
constexpr uid_t kUid = 64999;

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

class UidLeftoversTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (chown, System V objects of another uid)";
    root_ = absl::StrCat(::testing::TempDir(), "/leftovers_", ::getpid(), "_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_EQ(::mkdir(root_.c_str(), 0755), 0);
  }
  // A file at `path` owned by `uid`.
  static void File(const std::string& path, uid_t uid) {
    std::ofstream(path) << "data\n";
    ASSERT_EQ(::lchown(path.c_str(), uid, uid), 0) << path;
  }
  static void Dir(const std::string& path, uid_t uid, mode_t mode) {
    ASSERT_EQ(::mkdir(path.c_str(), mode), 0) << path;
    ASSERT_EQ(::chmod(path.c_str(), mode), 0) << path;
    ASSERT_EQ(::lchown(path.c_str(), uid, uid), 0) << path;
  }
  // Under the dir `top`, a chain of `depth` dirs named "d", each with a
  // file "f", made one open directory at a time (the paths pass PATH_MAX):
  // the dirs owned by `dir_owner`, level i's file by file_owner(i).
  static void Chain(const std::string& top, int depth, uid_t dir_owner,
                    const std::function<uid_t(int level)>& file_owner) {
    int fd = ::open(top.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(fd, 0) << top;
    for (int i = 0; i < depth; ++i) {
      ASSERT_EQ(::mkdirat(fd, "d", 0755), 0) << "level " << i;
      ASSERT_EQ(::fchownat(fd, "d", dir_owner, dir_owner, AT_SYMLINK_NOFOLLOW), 0);
      const int file = ::openat(fd, "f", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      ASSERT_GE(file, 0);
      ASSERT_EQ(::fchown(file, file_owner(i), file_owner(i)), 0);
      ::close(file);
      const int sub = ::openat(fd, "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      ASSERT_GE(sub, 0);
      ::close(fd);
      fd = sub;
    }
    ::close(fd);
  }
  std::string root_;
};

// What the uid owns in the dir goes, whole, and so does what it put in a
// world-writable dir of another's there; what others own stays, and so does
// what the uid owns inside another's dir it could not write (not looked
// for); a symlink is removed, never followed.
TEST_F(UidLeftoversTest, RemovesWhatTheUidOwnsAndNothingElse) {
  const std::string tmp = root_ + "/tmp", outside = root_ + "/outside";
  Dir(tmp, 0, 01777);
  Dir(outside, 0, 0755);
  File(tmp + "/mine", kUid);
  File(tmp + "/roots", 0);
  Dir(tmp + "/mydir", kUid, 0777);
  File(tmp + "/mydir/put-there-by-root", 0);
  Dir(tmp + "/shared", 0, 01777);
  File(tmp + "/shared/mine-too", kUid);
  File(tmp + "/shared/others", 1);
  Dir(tmp + "/shared/deeper", 1, 01777);
  Dir(tmp + "/shared/deeper/mydir", kUid, 0700);
  File(tmp + "/shared/deeper/mydir/f", kUid);
  Dir(tmp + "/private", 1, 0755);
  File(tmp + "/private/chowned-to-the-uid", kUid);
  // A link the uid made to a root file, and a root-owned link to a dir
  // outside holding a file of the uid's: neither target is touched.
  File(outside + "/victim", 0);
  ASSERT_EQ(::symlink((outside + "/victim").c_str(), (tmp + "/link").c_str()), 0);
  ASSERT_EQ(::lchown((tmp + "/link").c_str(), kUid, kUid), 0);
  File(outside + "/uids-file-elsewhere", kUid);
  ASSERT_EQ(::symlink(outside.c_str(), (tmp + "/shared/to-outside").c_str()), 0);

  // A daemon's state dir there that the uid owns (as a non-root daemon's
  // would be, were it the uid's): kept.
  Dir(tmp + "/state", kUid, 0711);
  File(tmp + "/state/coordinator.db", kUid);

  EXPECT_TRUE(HasUidLeftovers(kUid, {root_ + "/does-not-exist", tmp}, {tmp + "/state"}));
  EXPECT_FALSE(HasUidLeftovers(kUid, {outside + "/none"}, {}));
  const Leftovers got =
      RemoveUidLeftovers(kUid, {tmp, root_ + "/does-not-exist"}, {tmp + "/state"});
  // What is left of the uid's there is inside the state dir (kept) or
  // inside others' dirs (not looked for).
  EXPECT_FALSE(HasUidLeftovers(kUid, {tmp}, {tmp + "/state"}));
  EXPECT_TRUE(HasUidLeftovers(kUid, {tmp}, {})) << "the state dir is the uid's here";
  EXPECT_TRUE(got.errors.empty()) << got.errors.front();
  EXPECT_EQ(got.entries, 5) << "mine, mydir (whole), link, shared/mine-too, shared/deeper/mydir";
  EXPECT_EQ(got.ipc, 0);
  EXPECT_TRUE(Exists(tmp + "/state/coordinator.db")) << "the state dir was removed";
  for (const char* gone : {"/mine", "/mydir", "/link", "/shared/mine-too", "/shared/deeper/mydir"}) {
    EXPECT_FALSE(Exists(tmp + gone)) << gone;
  }
  for (const char* kept : {"/roots", "/shared", "/shared/others", "/shared/to-outside",
                           "/shared/deeper", "/private/chowned-to-the-uid"}) {
    EXPECT_TRUE(Exists(tmp + kept)) << kept;
  }
  EXPECT_TRUE(Exists(outside + "/victim"));
  EXPECT_TRUE(Exists(outside + "/uids-file-elsewhere")) << "found through a symlink";
}

// A tree of any depth goes (a job makes one deeper than the descriptors a
// process may hold with `mkdir -p`), with the files at every level and
// whoever owns them; the uid is then clean.
TEST_F(UidLeftoversTest, RemovesATreeOfAnyDepth) {
  const std::string tmp = root_ + "/tmp";
  Dir(tmp, 0, 01777);
  Dir(tmp + "/deep", kUid, 0755);
  constexpr int kDepth = 3000;  // past 1024 descriptors, and past PATH_MAX as a path
  Chain(tmp + "/deep", kDepth, 0, [](int i) { return i % 3 ? kUid : 0; });
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(HasUidLeftovers(kUid, {tmp}, {}));
  const Leftovers got = RemoveUidLeftovers(kUid, {tmp}, {});
  EXPECT_TRUE(got.errors.empty()) << got.errors.front();
  EXPECT_EQ(got.entries, 1);
  EXPECT_FALSE(Exists(tmp + "/deep"));
  EXPECT_FALSE(HasUidLeftovers(kUid, {tmp}, {}));
}

// RemoveTree (a deleted job's dir): all of it, files counted, never
// through a symlink; a path that is not there is no error.
TEST_F(UidLeftoversTest, RemoveTreeRemovesAllOfADirButNothingALinkPointsTo) {
  const std::string job = root_ + "/job", outside = root_ + "/outside";
  Dir(job, 0, 0755);
  Dir(job + "/ckpt", kUid, 0700);
  File(job + "/ckpt/step-1", kUid);
  File(job + "/rank-0.stdout", 0);
  Dir(outside, 0, 0755);
  File(outside + "/keep", 0);
  ASSERT_EQ(::symlink(outside.c_str(), (job + "/ckpt/to-outside").c_str()), 0);
  const Leftovers got = RemoveTree(job);
  EXPECT_TRUE(got.errors.empty()) << got.errors.front();
  EXPECT_EQ(got.entries, 1);
  EXPECT_EQ(got.files, 5) << "job, ckpt, step-1, rank-0.stdout, the link";
  EXPECT_FALSE(Exists(job));
  EXPECT_TRUE(Exists(outside + "/keep")) << "removed through a symlink";
  const Leftovers none = RemoveTree(root_ + "/not-there");
  EXPECT_TRUE(none.errors.empty()) << none.errors.front();
  EXPECT_EQ(none.entries, 0);
}

// ChownTree (a returned uid's job dir, to root): what the uid owns at every
// level of a tree deeper than PATH_MAX, links themselves but never what
// they point to, nor another's file hard-linked there.
TEST_F(UidLeftoversTest, ChownTreeGivesAllOfADirAwayToAnyDepthButNothingALinkPointsTo) {
  const std::string job = root_ + "/job", outside = root_ + "/outside";
  Dir(job, kUid, 0750);
  Dir(outside, kUid, 0755);
  File(outside + "/not-the-jobs", kUid);
  ASSERT_EQ(::symlink(outside.c_str(), (job + "/to-outside").c_str()), 0);
  ASSERT_EQ(::lchown((job + "/to-outside").c_str(), kUid, kUid), 0);
  constexpr int kDepth = 3000;  // past PATH_MAX as a path: lchown(path) fails there
  Chain(job, kDepth, kUid, [](int) { return kUid; });
  ASSERT_FALSE(HasFailure());
  // Another's file, hard-linked into the job dir: stays the other's.
  File(outside + "/others", 1);
  ASSERT_EQ(::link((outside + "/others").c_str(), (job + "/linked-others").c_str()), 0);
  const Leftovers got = ChownTree(job, kUid, 0, 0);
  EXPECT_TRUE(got.errors.empty()) << got.errors.front();
  EXPECT_EQ(got.files, 2 + 2 * kDepth) << "job, the link, and a dir and a file per level";
  struct stat others;
  ASSERT_EQ(::stat((outside + "/others").c_str(), &others), 0);
  EXPECT_EQ(others.st_uid, 1u) << "another's file, hard-linked into the job dir, was given away";
  // Down again, checking every level's owner.
  int fd = ::open(job.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  struct stat st;
  ASSERT_EQ(::fstat(fd, &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  for (int i = 0; i < kDepth; ++i) {
    ASSERT_EQ(::fstatat(fd, "f", &st, 0), 0);
    ASSERT_EQ(st.st_uid, 0u) << "level " << i << "'s file is still the uid's";
    const int sub = ::openat(fd, "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(sub, 0);
    ::close(fd);
    fd = sub;
    ASSERT_EQ(::fstat(fd, &st), 0);
    ASSERT_EQ(st.st_uid, 0u) << "level " << i << "'s dir is still the uid's";
  }
  ::close(fd);
  ASSERT_EQ(::lstat((job + "/to-outside").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u) << "the link itself";
  ASSERT_EQ(::stat((outside + "/not-the-jobs").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kUid) << "changed through a symlink";
  ASSERT_EQ(::stat(outside.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kUid) << "changed through a symlink";
  const Leftovers none = ChownTree(root_ + "/not-there", kUid, 0, 0);
  EXPECT_TRUE(none.errors.empty()) << none.errors.front();
  EXPECT_EQ(none.files, 0);
}

// System V objects the uid owns, or created and gave away, are removed;
// root's stay.
TEST_F(UidLeftoversTest, RemovesTheUidsSystemVObjects) {
  auto give = [](int shmid, uid_t uid) {
    struct shmid_ds ds;
    ASSERT_EQ(::shmctl(shmid, IPC_STAT, &ds), 0);
    ds.shm_perm.uid = uid;
    ASSERT_EQ(::shmctl(shmid, IPC_SET, &ds), 0);
  };
  const int owned = ::shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0600);
  ASSERT_GE(owned, 0);
  give(owned, kUid);
  const int roots = ::shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0600);
  ASSERT_GE(roots, 0);
  const int sem = ::semget(IPC_PRIVATE, 1, IPC_CREAT | 0600);
  ASSERT_GE(sem, 0);
  struct semid_ds sds;
  union {
    int val;
    struct semid_ds* buf;
  } arg;
  arg.buf = &sds;
  ASSERT_EQ(::semctl(sem, 0, IPC_STAT, arg), 0);
  sds.sem_perm.uid = kUid;
  ASSERT_EQ(::semctl(sem, 0, IPC_SET, arg), 0);
  const int msg = ::msgget(IPC_PRIVATE, IPC_CREAT | 0600);
  ASSERT_GE(msg, 0);
  struct msqid_ds mds;
  ASSERT_EQ(::msgctl(msg, IPC_STAT, &mds), 0);
  mds.msg_perm.uid = kUid;
  ASSERT_EQ(::msgctl(msg, IPC_SET, &mds), 0);
  // Made by the uid itself, then given to root.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    int id = -1;
    if (::setresgid(kUid, kUid, kUid) == 0 && ::setresuid(kUid, kUid, kUid) == 0) {
      id = ::shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0600);
      struct shmid_ds ds;
      if (id >= 0 && ::shmctl(id, IPC_STAT, &ds) == 0) {
        ds.shm_perm.uid = 0;
        (void)::shmctl(id, IPC_SET, &ds);
      }
    }
    (void)!::write(fds[1], &id, sizeof(id));
    ::_exit(0);
  }
  ::close(fds[1]);
  int created = -1;
  ASSERT_EQ(::read(fds[0], &created, sizeof(created)), static_cast<ssize_t>(sizeof(created)));
  ::close(fds[0]);
  int st;
  ::waitpid(child, &st, 0);
  ASSERT_GE(created, 0);

  EXPECT_TRUE(HasUidLeftovers(kUid, {}, {})) << "its System V objects";
  const Leftovers got = RemoveUidLeftovers(kUid, {}, {});
  EXPECT_TRUE(got.errors.empty()) << got.errors.front();
  EXPECT_EQ(got.ipc, 4);
  EXPECT_FALSE(HasUidLeftovers(kUid, {}, {}));
  struct shmid_ds ds;
  EXPECT_NE(::shmctl(owned, IPC_STAT, &ds), 0);
  EXPECT_NE(::shmctl(created, IPC_STAT, &ds), 0) << "created by the uid, given to root";
  EXPECT_NE(::msgctl(msg, IPC_STAT, &mds), 0);
  EXPECT_NE(::semctl(sem, 0, IPC_STAT, arg), 0);
  EXPECT_EQ(::shmctl(roots, IPC_STAT, &ds), 0) << "root's segment was removed";
  ::shmctl(roots, IPC_RMID, nullptr);
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
