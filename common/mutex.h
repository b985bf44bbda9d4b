// Mutex, MutexLock, CondVar: the project's lock types, annotated for clang's
// -Wthread-safety (bazel build --config=thread-safety) and visible to
// ThreadSanitizer (--config=tsan).
//
//   mutable Mutex mu_;
//   std::map<JobId, Job> jobs_ ABSL_GUARDED_BY(mu_);
//   void ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
//   ...
//   MutexLock lock(&mu_);
//   while (!ready_) cv_.Wait(&mu_);
//
// Why not absl::Mutex directly: Debian's libabsl is not built with TSan, so
// absl::Mutex's lock and unlock happen inside uninstrumented code and TSan
// never sees them: every access guarded by an absl::Mutex is reported as a
// data race (tried: two threads incrementing a counter under absl::MutexLock,
// built with -fsanitize=thread against Debian's absl, gives 6-8 reports per
// run). So in a TSan build (detected from the compiler) these types sit on
// std::mutex / std::condition_variable, whose pthread calls TSan intercepts;
// otherwise on absl::Mutex / absl::CondVar. The API is the subset both offer,
// the same in both builds, so code that compiles in one compiles in the other.
// No Await/Condition: a condition evaluated by absl on another thread would
// be invisible to TSan again; loop on CondVar::Wait instead.
//
// Thread safety: Mutex and CondVar are safe to use from any thread.
// Blocking: Lock and the CondVar waits block; waits may wake spuriously, so
// callers re-check their condition in a loop. Never sleep or make an RPC
// while holding a Mutex.
#ifndef LOCKSTEP_COMMON_MUTEX_H_
#define LOCKSTEP_COMMON_MUTEX_H_

#include <chrono>

#include "absl/base/thread_annotations.h"

#if defined(__SANITIZE_THREAD__)
#define LOCKSTEP_MUTEX_USE_STD 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LOCKSTEP_MUTEX_USE_STD 1
#endif
#endif

#if defined(LOCKSTEP_MUTEX_USE_STD)
#include <condition_variable>
#include <mutex>
#else
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#endif

namespace lockstep {

class CondVar;

// A non-reentrant exclusive lock.
class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  // The wrappers themselves are not analysed: the analysis sees the inner
  // lock as a capability of its own.
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void Unlock() ABSL_UNLOCK_FUNCTION() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // True if the lock was taken.
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Crashes if the calling thread does not hold the lock (absl build; a no-op
  // in the TSan build). Tells the analysis that the lock is held.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() ABSL_NO_THREAD_SAFETY_ANALYSIS;

 private:
  friend class CondVar;
#if defined(LOCKSTEP_MUTEX_USE_STD)
  std::mutex mu_;
#else
  mutable absl::Mutex mu_;
#endif
};

// Holds `mu` for its scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable used with one Mutex at a time.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Releases `mu`, waits for a Signal/SignalAll (or a spurious wakeup), and
  // takes `mu` again before returning.
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // As Wait, for at most `timeout` (<= 0: does not block for a signal).
  // Returns true if the timeout passed without a wakeup.
  bool WaitWithTimeout(Mutex* mu, std::chrono::nanoseconds timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // As WaitWithTimeout, until `deadline` on std::chrono::steady_clock (real
  // time, not an injected Clock).
  bool WaitWithDeadline(Mutex* mu, std::chrono::steady_clock::time_point deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return WaitWithTimeout(mu, deadline - std::chrono::steady_clock::now());
  }
  // Wakes one waiter / every waiter. The caller may or may not hold the Mutex.
  void Signal();
  void SignalAll();

 private:
  // Longer timeouts wait without one (the standard library's deadline
  // arithmetic overflows near Duration::max()).
  static constexpr std::chrono::hours kLongestTimedWait{24 * 365};
#if defined(LOCKSTEP_MUTEX_USE_STD)
  std::condition_variable cv_;
#else
  absl::CondVar cv_;
#endif
};

#if defined(LOCKSTEP_MUTEX_USE_STD)

inline void Mutex::Lock() { mu_.lock(); }
inline void Mutex::Unlock() { mu_.unlock(); }
inline bool Mutex::TryLock() { return mu_.try_lock(); }
inline void Mutex::AssertHeld() const {}

inline void CondVar::Wait(Mutex* mu) {
  std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
  cv_.wait(lock);
  lock.release();  // still held: the caller owns it
}

inline bool CondVar::WaitWithTimeout(Mutex* mu, std::chrono::nanoseconds timeout) {
  if (timeout > kLongestTimedWait) {
    Wait(mu);
    return false;
  }
  std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
  bool timed_out = cv_.wait_for(lock, timeout) == std::cv_status::timeout;
  lock.release();
  return timed_out;
}

inline void CondVar::Signal() { cv_.notify_one(); }
inline void CondVar::SignalAll() { cv_.notify_all(); }

#else

inline void Mutex::Lock() { mu_.Lock(); }
inline void Mutex::Unlock() { mu_.Unlock(); }
inline bool Mutex::TryLock() { return mu_.TryLock(); }
inline void Mutex::AssertHeld() const { mu_.AssertHeld(); }

inline void CondVar::Wait(Mutex* mu) { cv_.Wait(&mu->mu_); }

inline bool CondVar::WaitWithTimeout(Mutex* mu, std::chrono::nanoseconds timeout) {
  if (timeout > kLongestTimedWait) {
    Wait(mu);
    return false;
  }
  return cv_.WaitWithTimeout(&mu->mu_, absl::FromChrono(timeout));
}

inline void CondVar::Signal() { cv_.Signal(); }
inline void CondVar::SignalAll() { cv_.SignalAll(); }

#endif

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_MUTEX_H_
