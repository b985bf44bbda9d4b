// Clock interface so time-driven logic (leases, rendezvous timeouts) is
// tested with a fake clock. Liveness is judged only on the observer's
// monotonic clock; wall time is for display and persistence.
#ifndef LOCKSTEP_COMMON_CLOCK_H_
#define LOCKSTEP_COMMON_CLOCK_H_

#include <chrono>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"

namespace lockstep {

using Duration = std::chrono::nanoseconds;
// A point on a monotonic clock (nanoseconds since an arbitrary epoch).
using MonoTime = std::chrono::time_point<std::chrono::steady_clock, Duration>;

// Thread safety: implementations are safe to call from any thread.
class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic time: never goes backwards.
  virtual MonoTime Now() const = 0;
  // Wall-clock time, milliseconds since the Unix epoch. Display only.
  virtual int64_t UnixMillis() const = 0;
};

// The process-wide real clock (steady_clock / system_clock). Never null.
Clock* RealClock();

// A clock that moves only when told. Thread-safe.
class FakeClock : public Clock {
 public:
  explicit FakeClock(int64_t unix_ms = 1'700'000'000'000) : unix_ms_(unix_ms) {}
  MonoTime Now() const override;
  int64_t UnixMillis() const override;
  void Advance(Duration d);

 private:
  mutable Mutex mu_;
  MonoTime now_ ABSL_GUARDED_BY(mu_){Duration(0)};
  int64_t unix_ms_ ABSL_GUARDED_BY(mu_);
};

// Seconds as a double, for flags and display.
inline double ToSeconds(Duration d) {
  return std::chrono::duration<double>(d).count();
}
inline Duration FromSeconds(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}
// Milliseconds from a to b as a double (negative when b is before a).
inline double MillisBetween(MonoTime a, MonoTime b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_CLOCK_H_
