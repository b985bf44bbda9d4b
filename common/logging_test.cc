#include "common/logging.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

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
  auto& sinks = spdlog::default_logger()->sinks();
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
