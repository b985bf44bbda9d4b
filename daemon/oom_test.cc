#include "daemon/oom.h"

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

}  // namespace
}  // namespace daemon
}  // namespace lockstep
