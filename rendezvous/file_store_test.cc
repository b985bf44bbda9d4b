#include "rendezvous/file_store.h"

#include <stdlib.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "rendezvous/store_conformance.h"

namespace lockstep {
namespace rendezvous {
namespace {

std::string TempDir() {
  std::string base = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
  std::string templ = base + "/file_store_XXXXXX";
  char* made = mkdtemp(templ.data());
  EXPECT_NE(made, nullptr);
  return templ;
}

std::unique_ptr<FileStore> OpenStore(const std::string& dir) {
  auto store = FileStore::Open(dir);
  EXPECT_TRUE(store.ok()) << store.status();
  return std::move(store).value();
}

TEST(FileStoreTest, SetThenGetReturnsValue) {
  auto store = OpenStore(TempDir() + "/job/0");
  ASSERT_TRUE(store->Set("a/b c", std::string("v\0x", 3)).ok());
  auto v = store->Get("a/b c", std::chrono::seconds(1));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, std::string("v\0x", 3));
}

TEST(FileStoreTest, GetReturnsDeadlineExceededNamingKeyWhenNeverSet) {
  auto store = OpenStore(TempDir());
  auto start = std::chrono::steady_clock::now();
  auto v = store->Get("never", std::chrono::milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(v.status())) << v.status();
  EXPECT_NE(v.status().message().find("never"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST(FileStoreTest, WaitWakesWhenAnotherThreadSets) {
  auto store = OpenStore(TempDir());
  std::thread writer([&] { ASSERT_TRUE(store->Set("late", "1").ok()); });
  EXPECT_TRUE(store->Wait({"late"}, std::chrono::seconds(10)).ok());
  writer.join();
}

TEST(FileStoreTest, WaitNamesOnlyMissingKeys) {
  auto store = OpenStore(TempDir());
  ASSERT_TRUE(store->Set("here", "1").ok());
  Status s = store->Wait({"here", "gone"}, std::chrono::milliseconds(30));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s));
  EXPECT_NE(s.message().find("[gone]"), std::string::npos) << s;
}

TEST(FileStoreTest, AddIsAtomicAcrossProcesses) {
  const std::string dir = TempDir();
  constexpr int kProcs = 3, kAdds = 50;
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcs; ++p) {
    pid_t pid = fork();
    if (pid == 0) {
      auto store = FileStore::Open(dir);
      for (int i = 0; i < kAdds; ++i) {
        if (!store.ok() || !(*store)->Add("counter", 1).ok()) _exit(1);
      }
      _exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  auto store = OpenStore(dir);
  auto v = store->Add("counter", 0);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, kProcs * kAdds);
}

// A Set is not lost to an Add that read the key before it: each Set below
// writes a value above anything the Adds can have made from earlier ones, so
// reading less right after it means an Add's write replaced it.
TEST(FileStoreTest, SetIsNotLostToAConcurrentAdd) {
  const std::string dir = TempDir();
  pid_t adder = fork();
  if (adder == 0) {
    // Dies with the test, whichever way the test ends.
    (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
    auto store = FileStore::Open(dir);
    if (!store.ok()) _exit(1);
    while (true) (void)(*store)->Add("counter", 1);
  }
  auto store = OpenStore(dir);
  int lost = 0;
  for (int64_t i = 1; i <= 300 && lost == 0; ++i) {
    const int64_t set = i * 1000000000;
    ASSERT_TRUE(store->Set("counter", std::to_string(set)).ok());
    auto v = store->Get("counter", std::chrono::seconds(1));
    ASSERT_TRUE(v.ok()) << v.status();
    if (std::stoll(*v) < set) {
      ++lost;
      ADD_FAILURE() << "Set " << i << " wrote " << set << ", read back " << *v;
    }
  }
  kill(adder, SIGKILL);
  waitpid(adder, nullptr, 0);
}

TEST(FileStoreTest, AddRejectsNonInteger) {
  auto store = OpenStore(TempDir());
  ASSERT_TRUE(store->Set("x", "abc").ok());
  EXPECT_TRUE(absl::IsInvalidArgument(store->Add("x", 1).status()));
}

TEST(FileStoreTest, CompareSetSwapsOnlyOnMatch) {
  auto store = OpenStore(TempDir());
  auto v = store->CompareSet("k", "", "first");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, "first");
  v = store->CompareSet("k", "wrong", "second");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, "first");
  v = store->CompareSet("k", "first", "second");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, "second");
}

TEST(FileStoreTest, DeleteReportsExistenceAndNumKeysCounts) {
  auto store = OpenStore(TempDir());
  ASSERT_TRUE(store->MultiSet({{"a", "1"}, {"b", "2"}}).ok());
  EXPECT_EQ(*store->NumKeys(), 2);
  EXPECT_TRUE(*store->Delete("a"));
  EXPECT_FALSE(*store->Delete("a"));
  EXPECT_EQ(*store->NumKeys(), 1);
  auto values = store->MultiGet({"b"}, std::chrono::seconds(1));
  ASSERT_TRUE(values.ok());
  EXPECT_EQ(values->at(0), "2");
}

TEST(FileStoreTest, LongKeysAndEmptyKeys) {
  auto store = OpenStore(TempDir());
  std::string long_key(500, '/');
  ASSERT_TRUE(store->Set(long_key, "v").ok());
  EXPECT_EQ(*store->Get(long_key, std::chrono::seconds(1)), "v");
  EXPECT_TRUE(absl::IsInvalidArgument(store->Set("", "v")));
  EXPECT_TRUE(absl::IsInvalidArgument(store->Set(std::string(kMaxKeyBytes + 1, 'a'), "v")));
}

// The shared Store conformance suite: one directory per environment, one
// subdirectory per namespace.
class FileStoreEnv : public StoreConformanceEnv {
 public:
  std::unique_ptr<Store> Open(const std::string& ns) override { return OpenStore(base_ + "/" + ns); }

 private:
  std::string base_ = TempDir();
};

INSTANTIATE_TEST_SUITE_P(FileStore, StoreConformanceTest,
                         ::testing::Values(StoreEnvFactory(
                             [] { return std::make_unique<FileStoreEnv>(); })));

}  // namespace
}  // namespace rendezvous
}  // namespace lockstep
