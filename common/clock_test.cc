#include "common/clock.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace {

TEST(ClockTest, FakeClockMovesOnlyWhenAdvanced) {
  FakeClock clock(1000);
  MonoTime t0 = clock.Now();
  EXPECT_EQ(clock.Now(), t0);
  clock.Advance(std::chrono::milliseconds(1500));
  EXPECT_EQ(clock.Now() - t0, std::chrono::milliseconds(1500));
  EXPECT_EQ(clock.UnixMillis(), 2500);
}

TEST(ClockTest, RealClockIsMonotonic) {
  MonoTime a = RealClock()->Now();
  MonoTime b = RealClock()->Now();
  EXPECT_LE(a, b);
  EXPECT_GT(RealClock()->UnixMillis(), 1'600'000'000'000);
}

TEST(ClockTest, SecondsConversionRoundTrips) {
  EXPECT_DOUBLE_EQ(ToSeconds(FromSeconds(2.5)), 2.5);
}

}  // namespace
}  // namespace lockstep
