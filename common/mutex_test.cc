#include "common/mutex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

namespace lockstep {
namespace {

using std::chrono::milliseconds;

TEST(MutexTest, CounterUnderMutexLockCountsEveryIncrement) {
  Mutex mu;
  long count = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        MutexLock lock(&mu);
        ++count;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  MutexLock lock(&mu);
  EXPECT_EQ(count, 40000);
}

TEST(MutexTest, TryLockFailsWhileAnotherThreadHoldsTheLock) {
  Mutex mu;
  mu.Lock();
  bool taken = false;
  std::thread([&] {
    if (mu.TryLock()) {
      taken = true;
      mu.Unlock();
    }
  }).join();
  EXPECT_FALSE(taken);
  mu.AssertHeld();
  mu.Unlock();
  if (mu.TryLock()) {
    mu.Unlock();
  } else {
    ADD_FAILURE() << "TryLock failed on a free mutex";
  }
}

TEST(CondVarTest, WaitReturnsAfterAnotherThreadSetsTheConditionAndSignals) {
  // Ping-pong: the producer fills the box, the consumer empties it.
  Mutex mu;
  CondVar cv;
  bool full = false;
  int box = 0;
  std::thread producer([&] {
    for (int i = 1; i <= 1000; ++i) {
      MutexLock lock(&mu);
      while (full) cv.Wait(&mu);
      box = i;
      full = true;
      cv.SignalAll();
    }
  });
  long sum = 0;
  for (int i = 1; i <= 1000; ++i) {
    MutexLock lock(&mu);
    while (!full) cv.Wait(&mu);
    EXPECT_EQ(box, i);
    sum += box;
    full = false;
    cv.SignalAll();
  }
  producer.join();
  EXPECT_EQ(sum, 1000 * 1001 / 2);
}

TEST(CondVarTest, WaitWithTimeoutReportsTheTimeoutWhenNobodySignals) {
  Mutex mu;
  CondVar cv;
  MutexLock lock(&mu);
  auto start = std::chrono::steady_clock::now();
  bool timed_out = false;
  // Spurious wakeups may return early: wait until the timeout is reported.
  while (!timed_out) timed_out = cv.WaitWithTimeout(&mu, milliseconds(20));
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(20));
  EXPECT_TRUE(cv.WaitWithTimeout(&mu, milliseconds(-5)));
  EXPECT_TRUE(cv.WaitWithDeadline(&mu, std::chrono::steady_clock::now() - milliseconds(1)));
}

// A waiter and the thread that wakes it: once the waiter has marked itself
// `waiting` (under `mu`, which it then holds until its wait releases it),
// the signaller sets `ready` and wakes it, with Signal or SignalAll. So the
// wakeup always reaches a thread inside a wait, never one still on its way.
struct WakeOnceWaiting {
  explicit WakeOnceWaiting(bool signal_all)
      : signaller([this, signal_all] {
          while (true) {
            {
              MutexLock lock(&mu);
              if (waiting) {
                ready = true;
                if (signal_all) {
                  cv.SignalAll();
                } else {
                  cv.Signal();
                }
                return;
              }
            }
            std::this_thread::yield();
          }
        }) {}
  ~WakeOnceWaiting() { signaller.join(); }

  Mutex mu;
  CondVar cv;
  bool waiting ABSL_GUARDED_BY(mu) = false;
  bool ready ABSL_GUARDED_BY(mu) = false;
  std::thread signaller;
};

TEST(CondVarTest, SignalWakesATimedWaiterBeforeItsTimeout) {
  WakeOnceWaiting w(/*signal_all=*/false);
  MutexLock lock(&w.mu);
  w.waiting = true;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!w.ready && !w.cv.WaitWithDeadline(&w.mu, deadline)) {
  }
  EXPECT_TRUE(w.ready);
  EXPECT_LT(std::chrono::steady_clock::now(), deadline);
}

TEST(CondVarTest, AnEndlessTimeoutWaitsForTheSignal) {
  WakeOnceWaiting w(/*signal_all=*/true);
  MutexLock lock(&w.mu);
  w.waiting = true;
  while (!w.ready) EXPECT_FALSE(w.cv.WaitWithTimeout(&w.mu, std::chrono::nanoseconds::max()));
}

}  // namespace
}  // namespace lockstep
