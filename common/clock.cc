#include "common/clock.h"

namespace lockstep {
namespace {

class SystemClock : public Clock {
 public:
  MonoTime Now() const override {
    return std::chrono::time_point_cast<Duration>(std::chrono::steady_clock::now());
  }
  int64_t UnixMillis() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace

Clock* RealClock() {
  static SystemClock* clock = new SystemClock();
  return clock;
}

MonoTime FakeClock::Now() const {
  MutexLock lock(&mu_);
  return now_;
}

int64_t FakeClock::UnixMillis() const {
  MutexLock lock(&mu_);
  return unix_ms_;
}

void FakeClock::Advance(Duration d) {
  MutexLock lock(&mu_);
  now_ += d;
  unix_ms_ += std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

}  // namespace lockstep
