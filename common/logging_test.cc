#include "common/logging.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <fcntl.h>
#include <unistd.h>

#include <ctime>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

namespace lockstep {
namespace {

TEST(LoggingTest, ParseLogLevelAcceptsKnownNamesAndNamesTheBadOne) {
  EXPECT_EQ(*ParseLogLevel("DEBUG"), spdlog::level::debug);
  EXPECT_EQ(*ParseLogLevel("warn"), spdlog::level::warn);
  auto bad = ParseLogLevel("loud");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'loud'"), std::string::npos);
}

TEST(LoggingTest, EveryLineCarriesComponentJobAndRank) {
  ASSERT_TRUE(InitLogging("info").ok());
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  sink->set_pattern("%v");
  auto& sinks = LockstepLogger()->sinks();
  sinks.push_back(sink);
  Logger log("agent", "j-1", 3);
  log.Info("worker exited code={}", 7);
  log.Debug("not shown at info");
  Logger("store").WithJob("j-2").WithRank(0).Warn("slow");
  sinks.pop_back();
  EXPECT_EQ(out.str(),
            "[agent] job=j-1 rank=3 worker exited code=7\n"
            "[store] job=j-2 rank=0 slow\n");
}

// The process's log lines (stderr) carry UTC with its zone: the same
// instant reads the same on every host and beside the CLI's times.
TEST(LoggingTest, LinesCarryUtcTimestampsWithTheZone) {
  ASSERT_TRUE(InitLogging("info").ok());
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/stderr.log";
  fflush(stderr);
  const int saved = ::dup(2);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ::dup2(fd, 2);
  const std::time_t before = std::time(nullptr);
  Logger("clock").Warn("what time is it");
  LockstepLogger()->flush();
  ::dup2(saved, 2);
  ::close(fd);
  ::close(saved);
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  std::smatch m;
  ASSERT_TRUE(std::regex_match(
      line, m,
      std::regex(R"((\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):\d\d\.\d{3}Z W \[clock\] .*what time is it)")))
      << line;
  std::tm utc{};
  gmtime_r(&before, &utc);
  // The hour is UTC's (a line logged across an hour boundary may be one later).
  const int hour = std::stoi(m[4]);
  EXPECT_TRUE(hour == utc.tm_hour || hour == (utc.tm_hour + 1) % 24) << line;
}

TEST(LoggingTest, InitLoggingRejectsUnknownLevel) {
  EXPECT_EQ(InitLogging("chatty").code(), absl::StatusCode::kInvalidArgument);
}

TEST(LoggingTest, RateLimiterLetsOneEventPerInterval) {
  RateLimiter limiter(std::chrono::hours(1));
  EXPECT_TRUE(limiter.Allow());
  EXPECT_FALSE(limiter.Allow());
  RateLimiter fast(std::chrono::nanoseconds(1));
  EXPECT_TRUE(fast.Allow());
  std::this_thread::sleep_for(std::chrono::microseconds(10));
  EXPECT_TRUE(fast.Allow());
}

}  // namespace
}  // namespace lockstep
