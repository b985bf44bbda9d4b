#include "common/worker_link.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace lockstep {
namespace worker_link {
namespace {

// Forks a child that exports `env` (the descriptors stay open across fork),
// runs `body` and exits 0; returns the raw wait status.
template <typename F>
int RunChild(const std::vector<std::pair<std::string, std::string>>& env, F body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);  // a worker leads its own group, as under the agent
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    body();
    ::_exit(0);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  return st;
}

TEST(FencePageTest, WorkersCanReadTheDeadlineButNeverMoveIt) {
  FencePage fence;
  ASSERT_TRUE(fence.Create().ok());
  fence.SetDeadline(42);
  EXPECT_EQ(fence.deadline(), 42);
  // What a worker can do with the inherited descriptor: read, not write.
  void* ro = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fence.fd(), 0);
  ASSERT_NE(ro, MAP_FAILED);
  EXPECT_EQ(*static_cast<const int64_t*>(ro), 42);
  ::munmap(ro, 4096);
  EXPECT_EQ(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fence.fd(), 0), MAP_FAILED);
  EXPECT_EQ(::ftruncate(fence.fd(), 8192), -1);
}

TEST(FencePageTest, AWorkerKillsItsGroupOnceTheDeadlinePassesEvenIfNobodyStopsIt) {
  FencePage fence;
  ASSERT_TRUE(fence.Create().ok());
  // Renewed: the worker keeps running past its own 300 ms of work.
  fence.SetDeadline(MonotonicNowNs() + int64_t{10} * 1000000000);
  int fd_flags = ::fcntl(fence.fd(), F_GETFD);
  ::fcntl(fence.fd(), F_SETFD, fd_flags & ~FD_CLOEXEC);
  const std::string fd = std::to_string(fence.fd());
  int st = RunChild({{kFenceFdEnv, fd}}, [] {
    if (!StartFenceWatchdog()) ::_exit(3);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  });
  ASSERT_TRUE(WIFEXITED(st)) << st;
  EXPECT_EQ(WEXITSTATUS(st), 0);

  // Not renewed (the agent is frozen): the worker, which would run for
  // 30 s, is killed within a few polls of the deadline.
  fence.SetDeadline(MonotonicNowNs() + int64_t{200} * 1000000);
  const auto t0 = std::chrono::steady_clock::now();
  st = RunChild({{kFenceFdEnv, fd}}, [] {
    StartFenceWatchdog();
    std::this_thread::sleep_for(std::chrono::seconds(30));
  });
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(WIFSIGNALED(st)) << st;
  EXPECT_EQ(WTERMSIG(st), SIGKILL);
  EXPECT_LT(took, 10.0);
}

TEST(FencePageTest, NoDescriptorNoWatchdog) {
  int st = RunChild({}, [] {
    ::unsetenv(kFenceFdEnv);
    if (StartFenceWatchdog()) ::_exit(3);
  });
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0);
}

TEST(StatusPageTest, EachWorkerMarksItsOwnSlot) {
  StatusPage page;
  ASSERT_TRUE(page.Create(3).ok());
  ::fcntl(page.fd(), F_SETFD, 0);
  const std::string fd = std::to_string(page.fd());
  RunChild({{kStatusFdEnv, fd}, {"LOCKSTEP_LOCAL_RANK", "1"}},
           [] { MarkBootstrap(kBootstrapBegun); });
  RunChild({{kStatusFdEnv, fd}, {"LOCKSTEP_LOCAL_RANK", "2"}}, [] {
    MarkBootstrap(kBootstrapBegun);
    MarkBootstrap(kBootstrapDone);
  });
  EXPECT_EQ(page.Get(0), kNotStarted);
  EXPECT_EQ(page.Get(1), kBootstrapBegun);
  EXPECT_EQ(page.Get(2), kBootstrapDone);
  EXPECT_EQ(page.Get(3), kNotStarted);  // out of range
  // A local rank past the page is ignored, not a crash.
  int st = RunChild({{kStatusFdEnv, fd}, {"LOCKSTEP_LOCAL_RANK", "100000"}},
                    [] { MarkBootstrap(kBootstrapBegun); });
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

TEST(StatusPageTest, APeerLostMarkNamesTheRankWaitedForWhenKnown) {
  StatusPage page;
  ASSERT_TRUE(page.Create(3).ok());
  ::fcntl(page.fd(), F_SETFD, 0);
  const std::string fd = std::to_string(page.fd());
  RunChild({{kStatusFdEnv, fd}, {"LOCKSTEP_LOCAL_RANK", "0"}}, [] {
    MarkBootstrap(kBootstrapDone);
    MarkPeerLost(5);
  });
  RunChild({{kStatusFdEnv, fd}, {"LOCKSTEP_LOCAL_RANK", "1"}}, [] { MarkPeerLost(); });
  RunChild({{kStatusFdEnv, fd}, {"LOCKSTEP_LOCAL_RANK", "2"}}, [] { MarkPeerLost(0); });
  EXPECT_TRUE(IsPeerLost(page.Get(0)));
  EXPECT_EQ(LostPeer(page.Get(0)), 5);
  EXPECT_TRUE(IsPeerLost(page.Get(1)));
  EXPECT_EQ(LostPeer(page.Get(1)), -1);  // not known
  EXPECT_TRUE(IsPeerLost(page.Get(2)));
  EXPECT_EQ(LostPeer(page.Get(2)), 0);
  for (int32_t other : {kNotStarted, kBootstrapBegun, kBootstrapDone}) {
    EXPECT_FALSE(IsPeerLost(other));
    EXPECT_EQ(LostPeer(other), -1);
  }
}

TEST(StatusPageTest, AWorkerStampsWhenItBeganToEndOnItsOwn) {
  StatusPage page;
  ASSERT_TRUE(page.Create(4).ok());
  ::fcntl(page.fd(), F_SETFD, 0);
  const std::string fd = std::to_string(page.fd());
  const int64_t before = MonotonicNowNs();
  // Slot 0 calls exit(): the handler MarkBootstrap registered stamps it.
  RunChild({{kStatusFdEnv, fd}, {"LOCKSTEP_LOCAL_RANK", "0"}}, [] {
    MarkBootstrap(kBootstrapDone);
    std::exit(0);
  });
  // Slot 1 gives up on a lost peer, and the stamp is then, not at its later exit().
  RunChild({{kStatusFdEnv, fd}, {"LOCKSTEP_LOCAL_RANK", "1"}}, [] {
    MarkBootstrap(kBootstrapDone);
    MarkPeerLost(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::exit(3);
  });
  // Slot 2 ends with _exit (no handlers) and never lost a peer: no stamp.
  RunChild({{kStatusFdEnv, fd}, {"LOCKSTEP_LOCAL_RANK", "2"}},
           [] { MarkBootstrap(kBootstrapDone); });
  // Slot 3: a child forked from the worker shares its page and its atexit
  // handlers; the child's exit() is not the worker's end.
  RunChild({{kStatusFdEnv, fd}, {"LOCKSTEP_LOCAL_RANK", "3"}}, [] {
    MarkBootstrap(kBootstrapDone);
    const pid_t child = ::fork();
    if (child == 0) std::exit(0);
    ::waitpid(child, nullptr, 0);
  });
  const int64_t after = MonotonicNowNs();
  EXPECT_GT(page.EndedNs(0), before);
  EXPECT_LT(page.EndedNs(0), after);
  const int64_t gave_up = page.EndedNs(1);
  EXPECT_GT(gave_up, before);
  EXPECT_LT(gave_up, after - int64_t{150} * 1000000) << "stamped at exit, not at giving up";
  EXPECT_EQ(page.EndedNs(2), 0);
  EXPECT_EQ(page.EndedNs(3), 0) << "a forked child's exit stamped its parent's slot";
  EXPECT_EQ(page.EndedNs(4), 0);  // out of range
  EXPECT_EQ(page.EndedNs(-1), 0);
}

}  // namespace
}  // namespace worker_link
}  // namespace lockstep
