#include "daemon/oom.h"

#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace daemon {
namespace {

TEST(OomTest, ParsesKmsgRecords) {
  int64_t t = 0;
  std::string text;
  ASSERT_TRUE(ParseKmsgRecord("3,1842,23169524638,-;Memory cgroup out of memory: Killed process "
                              "1356 (python3) total-vm:323768kB\n SUBSYSTEM=memory\n",
                              &t, &text));
  EXPECT_EQ(t, 23169524638);
  EXPECT_EQ(text, "Memory cgroup out of memory: Killed process 1356 (python3) total-vm:323768kB");
  ASSERT_TRUE(ParseKmsgRecord("6,7,100,c,caller=T12;x", &t, &text)) << "extra fields before ';'";
  EXPECT_EQ(text, "x");
  EXPECT_FALSE(ParseKmsgRecord(" SUBSYSTEM=memory", &t, &text));
  EXPECT_FALSE(ParseKmsgRecord("no fields here", &t, &text));
  EXPECT_FALSE(ParseKmsgRecord("a,b,c,d;text", &t, &text));
  EXPECT_FALSE(ParseKmsgRecord("", &t, &text));
}

TEST(OomTest, TellsTheOomKillOfOnePid) {
  EXPECT_TRUE(IsOomKillOf("Out of memory: Killed process 42 (train) total-vm:1kB", 42));
  EXPECT_TRUE(IsOomKillOf("Memory cgroup out of memory: Killed process 42 (train)", 42));
  EXPECT_FALSE(IsOomKillOf("Out of memory: Killed process 421 (train)", 42));
  EXPECT_FALSE(IsOomKillOf("Out of memory: Killed process 4 (train)", 42));
  EXPECT_FALSE(IsOomKillOf("oom_reaper: reaped process 42 (train), now anon-rss:0kB", 42));
}

// A kernel log as a file of records: the pid's OOM kill before the launch
// (its pid used by another process then) does not count; after it, it does;
// another pid's never.
TEST(OomTest, FindsTheKillAfterTheLaunchOnly) {
  const std::string log = absl::StrCat(::testing::TempDir(), "/kmsg_", ::getpid());
  const int64_t second_us = 1000 * 1000;
  {
    std::ofstream out(log);
    out << "3,1," << 100 * second_us << ",-;Out of memory: Killed process 42 (old) total-vm:1kB\n"
        << " SUBSYSTEM=memory\n"
        << "6,2," << 200 * second_us << ",-;eth0: link up\n"
        << "3,3," << 300 * second_us << ",-;Out of memory: Killed process 43 (other)\n"
        << "3,4," << 301 * second_us << ",-;Memory cgroup out of memory: Killed process 42 (train) x\n";
  }
  const int64_t ns = 1000;
  auto found = FindOomKill(42, 250 * second_us * ns, log);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(*found, "Memory cgroup out of memory: Killed process 42 (train) x");
  // Launched after the kill (beyond the slack): not this worker's.
  EXPECT_FALSE(FindOomKill(42, 320 * second_us * ns, log).has_value());
  // Within the slack before it: counted.
  EXPECT_TRUE(FindOomKill(42, 305 * second_us * ns, log).has_value());
  EXPECT_FALSE(FindOomKill(44, 0, log).has_value());
  EXPECT_FALSE(FindOomKill(42, 0, log + ".none").has_value());
}

// Whether the kernel log could be read at all: only then does "no record"
// mean "not the OOM killer".
TEST(OomTest, SaysWhetherTheKernelLogCouldBeRead) {
  const std::string log = absl::StrCat(::testing::TempDir(), "/kmsg_readable_", ::getpid());
  std::ofstream(log) << "6,1,5,-;nothing of interest\n";
  bool readable = false;
  EXPECT_FALSE(FindOomKill(77, 0, log, &readable));
  EXPECT_TRUE(readable);
  EXPECT_FALSE(FindOomKill(77, 0, log + ".missing", &readable));
  EXPECT_FALSE(readable);
  readable = true;
  EXPECT_FALSE(FindOomKill(77, 0, "", &readable)) << "an empty path: the log is not read";
  EXPECT_FALSE(readable);
}

// /proc/<pid>/cgroup to the file counting the OOM kills of the process's
// memory cgroup: the v1 memory hierarchy's where it has one (possibly
// sharing a line with other controllers), else the v2 line.
TEST(OomTest, FindsTheOomCounterOfTheMemoryCgroup) {
  auto v2 = OomCounterOf("0::/system.slice/lockstepd-agent.service\n", "/cg");
  ASSERT_TRUE(v2);
  EXPECT_EQ(v2->cgroup, "/system.slice/lockstepd-agent.service");
  EXPECT_EQ(v2->file, "/cg/system.slice/lockstepd-agent.service/memory.events");
  auto pod = OomCounterOf("0::/\n", "/cg");  // a container's own cgroup namespace
  ASSERT_TRUE(pod);
  EXPECT_EQ(pod->file, "/cg/memory.events");
  auto v1 = OomCounterOf("9:name=systemd:/\n5:cpuacct,memory:/process_api/ab:c\n0::/\n", "/cg");
  ASSERT_TRUE(v1);
  EXPECT_EQ(v1->cgroup, "/process_api/ab:c");
  EXPECT_EQ(v1->file, "/cg/memory/process_api/ab:c/memory.oom_control");
  EXPECT_FALSE(OomCounterOf("4:cpu:/x\n", "/cg")) << "no memory hierarchy, no v2 line";
  EXPECT_EQ(OomCounterOf("5:memory:/\n", "/cg")->file, "/cg/memory/memory.oom_control");
  EXPECT_FALSE(OomCounterOf("", "/cg"));
  auto self = OomCounterOfPid(::getpid());
  ASSERT_TRUE(self) << "this process's own /proc/self/cgroup";
  EXPECT_FALSE(OomCounterOfPid(-1));
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, child, &info, WEXITED | WNOWAIT), 0);
  EXPECT_FALSE(OomCounterOfPid(child)) << "a zombie";
  ::waitpid(child, nullptr, 0);
}

// The "oom_kill N" line of memory.events (v2) and memory.oom_control (v1).
TEST(OomTest, ReadsTheOomKillCount) {
  const std::string dir = ::testing::TempDir();
  const std::string v2 = absl::StrCat(dir, "/events_", ::getpid());
  std::ofstream(v2) << "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n";
  EXPECT_EQ(ReadOomKills(v2), 2);
  const std::string v1 = absl::StrCat(dir, "/oom_control_", ::getpid());
  std::ofstream(v1) << "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n";
  EXPECT_EQ(ReadOomKills(v1), 7);
  const std::string none = absl::StrCat(dir, "/old_kernel_", ::getpid());
  std::ofstream(none) << "oom_kill_disable 0\nunder_oom 0\n";
  EXPECT_FALSE(ReadOomKills(none));
  EXPECT_FALSE(ReadOomKills(dir + "/not-there"));
}

// A container on cgroup v1 without a cgroup namespace: /proc names the
// host's path (/docker/<id>/...) while the hierarchy's root is the
// container's own cgroup. The path below this process's cgroup is taken
// from that root, and only where the direct one does not exist.
TEST(OomTest, FindsTheCounterOfAContainerThatMountsItsOwnCgroup) {
  const std::string root = absl::StrCat(::testing::TempDir(), "/cgroot_", ::getpid());
  ASSERT_EQ(::system(absl::StrCat("mkdir -p ", root, "/memory/job && touch ", root,
                                  "/memory/memory.oom_control ", root, "/memory/job/memory.oom_control")
                         .c_str()),
            0);
  const std::string self = "4:memory:/docker/abc\n";
  auto own = OomCounterOf("4:memory:/docker/abc\n", root, self);
  ASSERT_TRUE(own);
  EXPECT_EQ(own->cgroup, "/docker/abc");
  EXPECT_EQ(own->file, root + "/memory/memory.oom_control");
  auto below = OomCounterOf("4:memory:/docker/abc/job\n", root, self);
  ASSERT_TRUE(below);
  EXPECT_EQ(below->file, root + "/memory/job/memory.oom_control");
  // Not below this process's cgroup, nor found: the direct path, which
  // reads as no count.
  auto elsewhere = OomCounterOf("4:memory:/docker/other\n", root, self);
  ASSERT_TRUE(elsewhere);
  EXPECT_EQ(elsewhere->file, root + "/memory/docker/other/memory.oom_control");
  EXPECT_FALSE(ReadOomKills(elsewhere->file));
  EXPECT_EQ(OomCounterOf("4:memory:/docker/abcd\n", root, self)->file,
            root + "/memory/docker/abcd/memory.oom_control")
      << "/docker/abcd is not below /docker/abc";
  // Where the direct path exists it wins (a host, or a namespaced container).
  ASSERT_EQ(::system(absl::StrCat("mkdir -p ", root, "/memory/docker/abc/job && touch ", root,
                                  "/memory/docker/abc/job/memory.oom_control")
                         .c_str()),
            0);
  EXPECT_EQ(OomCounterOf("4:memory:/docker/abc/job\n", root, self)->file,
            root + "/memory/docker/abc/job/memory.oom_control");
  // cgroup v2 the same way.
  ASSERT_EQ(::system(absl::StrCat("touch ", root, "/memory.events").c_str()), 0);
  EXPECT_EQ(OomCounterOf("0::/system.slice/docker-abc.scope\n", root,
                         "0::/system.slice/docker-abc.scope\n")
                ->file,
            root + "/memory.events");
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
