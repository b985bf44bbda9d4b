#include "rendezvous/store_core.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "gtest/gtest.h"

namespace lockstep {
namespace rendezvous {
namespace {

using Result = StatusOr<std::vector<std::string>>;

class StoreCoreTest : public ::testing::Test {
 protected:
  StoreCore::Options FakeOptions() {
    StoreCore::Options options;
    options.run_expiry_thread = false;
    return options;
  }
  FakeClock clock_;
  StoreCore core_{&clock_, FakeOptions()};
};

// Records the single callback result of a waiter.
struct Recorder {
  std::optional<Result> result;
  int calls = 0;
  StoreCore::WaitCallback Callback() {
    return [this](Result r) {
      ++calls;
      result = std::move(r);
    };
  }
};

TEST_F(StoreCoreTest, SetThenTryGetReturnsValue) {
  ASSERT_TRUE(core_.Set("ns", "k", "v").ok());
  EXPECT_EQ(*core_.TryGet("ns", "k"), "v");
}

TEST_F(StoreCoreTest, TryGetOfMissingKeyIsNotFoundNamingKey) {
  auto got = core_.TryGet("ns", "absent");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(got.status().message().find("absent"), std::string::npos);
}

TEST_F(StoreCoreTest, WaiterIsWokenByTheWriteThatCompletesIt) {
  Recorder rec;
  core_.WaitAsync("ns", {"a", "b"}, clock_.Now() + std::chrono::seconds(10), true,
                  rec.Callback());
  ASSERT_TRUE(core_.Set("ns", "a", "1").ok());
  EXPECT_EQ(rec.calls, 0);
  ASSERT_TRUE(core_.Set("ns", "b", "2").ok());
  ASSERT_EQ(rec.calls, 1);
  ASSERT_TRUE(rec.result->ok());
  EXPECT_EQ(**rec.result, (std::vector<std::string>{"1", "2"}));
  EXPECT_EQ(core_.NumPendingWaiters(), 0);
}

TEST_F(StoreCoreTest, WaitOnExistingKeysRunsCallbackInline) {
  ASSERT_TRUE(core_.Set("ns", "a", "1").ok());
  Recorder rec;
  core_.WaitAsync("ns", {"a"}, clock_.Now(), false, rec.Callback());
  ASSERT_EQ(rec.calls, 1);
  EXPECT_TRUE(rec.result->ok());
  EXPECT_TRUE(rec.result->value().empty());  // want_values = false
}

TEST_F(StoreCoreTest, AddAndCompareSetAndMultiSetAlsoWakeWaiters) {
  Recorder add, cas, multi;
  MonoTime deadline = clock_.Now() + std::chrono::seconds(1);
  core_.WaitAsync("ns", {"counter"}, deadline, true, add.Callback());
  core_.WaitAsync("ns", {"cas"}, deadline, true, cas.Callback());
  core_.WaitAsync("ns", {"m1", "m2"}, deadline, true, multi.Callback());
  ASSERT_TRUE(core_.Add("ns", "counter", 5).ok());
  ASSERT_TRUE(core_.CompareSet("ns", "cas", "", "x").ok());
  ASSERT_TRUE(core_.MultiSet("ns", {{"m1", "a"}, {"m2", "b"}}).ok());
  EXPECT_EQ(add.result->value()[0], "5");
  EXPECT_EQ(cas.result->value()[0], "x");
  EXPECT_EQ(multi.result->value(), (std::vector<std::string>{"a", "b"}));
}

// MultiSet is all-or-nothing for waiters too: a key named twice completes
// its waiters with the value that stays, never the one overwritten within
// the call. Found by //tests/fuzz:store_fuzzer.
TEST_F(StoreCoreTest, MultiSetNamingAKeyTwiceWakesWaitersWithTheLastValue) {
  Recorder rec;
  core_.WaitAsync("ns", {"k"}, clock_.Now() + std::chrono::seconds(1), true, rec.Callback());
  ASSERT_TRUE(core_.MultiSet("ns", {{"k", "first"}, {"j", "x"}, {"k", "last"}}).ok());
  ASSERT_EQ(rec.calls, 1);
  ASSERT_TRUE(rec.result->ok());
  EXPECT_EQ(**rec.result, (std::vector<std::string>{"last"}));
  EXPECT_EQ(*core_.TryGet("ns", "k"), "last");
  EXPECT_EQ(*core_.NumKeys("ns"), 2);
}

// store.proto's expect_absent: set only if missing, also when the key
// holds "" (which an empty `expected` alone would match). Found by
// //tests/fuzz:store_fuzzer.
TEST_F(StoreCoreTest, CompareSetOnlyIfAbsentNeverSwapsAnExistingKey) {
  auto first = core_.CompareSet("ns", "leader", "", "", /*only_if_absent=*/true);
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(first->swapped);
  auto second = core_.CompareSet("ns", "leader", "", "rank1", /*only_if_absent=*/true);
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->swapped);
  EXPECT_EQ(second->current, "");
  EXPECT_EQ(*core_.TryGet("ns", "leader"), "");
  auto plain = core_.CompareSet("ns", "leader", "", "rank2");
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->swapped) << "without it, \"\" matches an empty expected";
}

TEST_F(StoreCoreTest, ExpireWaitersFiresDeadlineExceededNamingMissingKeysOnlyAfterDeadline) {
  Recorder rec;
  core_.WaitAsync("ns", {"present", "missing"}, clock_.Now() + std::chrono::seconds(2), false,
                  rec.Callback());
  ASSERT_TRUE(core_.Set("ns", "present", "1").ok());
  clock_.Advance(std::chrono::seconds(1));
  EXPECT_EQ(core_.ExpireWaiters(), MonoTime(std::chrono::seconds(2)));
  EXPECT_EQ(rec.calls, 0);
  clock_.Advance(std::chrono::seconds(1));
  EXPECT_EQ(core_.ExpireWaiters(), MonoTime::max());
  ASSERT_EQ(rec.calls, 1);
  EXPECT_EQ(rec.result->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(rec.result->status().message().find("missing"), std::string::npos);
  EXPECT_EQ(rec.result->status().message().find("present"), std::string::npos);
}

TEST_F(StoreCoreTest, WaitWithPastDeadlineOnMissingKeyFailsAtOnce) {
  Recorder rec;
  core_.WaitAsync("ns", {"k"}, clock_.Now(), false, rec.Callback());
  ASSERT_EQ(rec.calls, 1);
  EXPECT_EQ(rec.result->status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(StoreCoreTest, CancelledWaiterNeverRuns) {
  Recorder rec;
  auto id = core_.WaitAsync("ns", {"k"}, clock_.Now() + std::chrono::seconds(1), false,
                            rec.Callback());
  EXPECT_TRUE(core_.CancelWait(id));
  EXPECT_FALSE(core_.CancelWait(id));
  ASSERT_TRUE(core_.Set("ns", "k", "v").ok());
  clock_.Advance(std::chrono::seconds(5));
  core_.ExpireWaiters();
  EXPECT_EQ(rec.calls, 0);
  EXPECT_EQ(core_.NumPendingWaiters(), 0);
}

TEST_F(StoreCoreTest, RepeatedlyTimedOutWaitsLeaveNothingBehind) {
  for (int i = 0; i < 100; ++i) {
    Recorder rec;
    core_.WaitAsync("ns", {"never"}, clock_.Now() + std::chrono::seconds(1), false,
                    rec.Callback());
    clock_.Advance(std::chrono::seconds(1));
    core_.ExpireWaiters();
    ASSERT_EQ(rec.calls, 1);
  }
  EXPECT_EQ(core_.NumPendingWaiters(), 0);
  EXPECT_EQ(core_.NumNamespaces(), 0);
}

TEST_F(StoreCoreTest, KeyDeletedAfterBeingCountedIsAwaitedAgain) {
  Recorder rec;
  core_.WaitAsync("ns", {"a", "b"}, MonoTime::max(), true, rec.Callback());
  ASSERT_TRUE(core_.Set("ns", "a", "1").ok());
  ASSERT_TRUE(core_.Delete("ns", "a").ok());
  ASSERT_TRUE(core_.Set("ns", "b", "2").ok());
  EXPECT_EQ(rec.calls, 0);
  ASSERT_TRUE(core_.Set("ns", "a", "3").ok());
  ASSERT_EQ(rec.calls, 1);
  EXPECT_EQ(rec.result->value(), (std::vector<std::string>{"3", "2"}));
}

TEST_F(StoreCoreTest, NamespacesAreIsolated) {
  ASSERT_TRUE(core_.Set("job/1", "k", "round1").ok());
  EXPECT_EQ(core_.TryGet("job/2", "k").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*core_.NumKeys("job/2"), 0);
  EXPECT_EQ(*core_.NumKeys("job/1"), 1);
}

TEST_F(StoreCoreTest, DeleteNamespaceDropsKeysAndAbortsItsWaiters) {
  ASSERT_TRUE(core_.Set("job/1", "k", "v").ok());
  Recorder rec;
  core_.WaitAsync("job/1", {"never"}, MonoTime::max(), false, rec.Callback());
  EXPECT_TRUE(core_.DeleteNamespace("job/1"));
  ASSERT_EQ(rec.calls, 1);
  EXPECT_EQ(rec.result->status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(*core_.NumKeys("job/1"), 0);
  EXPECT_FALSE(core_.DeleteNamespace("job/1"));
}

TEST_F(StoreCoreTest, DeleteNamespacesWithPrefixDropsEveryRoundOfAJob) {
  ASSERT_TRUE(core_.Set("job/1", "k", "v").ok());
  ASSERT_TRUE(core_.Set("job/2", "k", "v").ok());
  ASSERT_TRUE(core_.Set("other/1", "k", "v").ok());
  EXPECT_EQ(core_.DeleteNamespacesWithPrefix("job/"), 2);
  EXPECT_EQ(core_.NumNamespaces(), 1);
}

// An ended job's namespaces go and stay gone: a worker or token that
// outlived the job cannot fill them again (nobody would drop them).
TEST_F(StoreCoreTest, AClosedJobsNamespacesTakeNoMoreWritesOrWaits) {
  ASSERT_TRUE(core_.Set("job/1", "k", "v").ok());
  ASSERT_TRUE(core_.Set("jobx/1", "k", "v").ok());
  // The bare job name is a namespace the job's token opens too.
  ASSERT_TRUE(core_.Set("job", "k", "v").ok());
  Recorder parked;
  core_.WaitAsync("job/1", {"never"}, MonoTime::max(), false, parked.Callback());
  core_.CloseJob("job");
  ASSERT_EQ(parked.calls, 1);
  EXPECT_EQ(parked.result->status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(core_.NumNamespaces(), 1);  // jobx's
  auto refused = [](const Status& s) {
    return s.code() == absl::StatusCode::kFailedPrecondition &&
           s.message().find("job \"job\" has ended") != absl::string_view::npos;
  };
  EXPECT_PRED1(refused, core_.Set("job/1", "k", "v"));
  EXPECT_PRED1(refused, core_.Set("job/2", "k", "v"));  // a round not seen before
  EXPECT_PRED1(refused, core_.Set("job", "k", "v"));
  EXPECT_PRED1(refused, core_.Add("job/1", "n", 1).status());
  EXPECT_PRED1(refused, core_.CompareSet("job/1", "k", "", "v").status());
  EXPECT_PRED1(refused, core_.MultiSet("job/1", {{"a", "1"}}));
  Recorder wait;
  core_.WaitAsync("job/1", {"k"}, MonoTime::max(), false, wait.Callback());
  ASSERT_EQ(wait.calls, 1);
  EXPECT_PRED1(refused, wait.result->status());
  EXPECT_EQ(core_.TryGet("job/1", "k").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_.NumNamespaces(), 1);
  EXPECT_EQ(core_.NumPendingWaiters(), 0);
  // Another job, even one whose name starts the same, is untouched.
  EXPECT_TRUE(core_.Set("jobx/1", "k2", "v").ok());
  EXPECT_TRUE(core_.Set("jo/1", "k", "v").ok());
}

TEST_F(StoreCoreTest, AddOnNonIntegerIsInvalidArgumentNamingKey) {
  ASSERT_TRUE(core_.Set("ns", "text", "hello").ok());
  auto added = core_.Add("ns", "text", 1);
  EXPECT_EQ(added.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(added.status().message().find("text"), std::string::npos);
}

TEST_F(StoreCoreTest, AddOverflowIsOutOfRange) {
  ASSERT_TRUE(core_.Add("ns", "n", INT64_MAX).ok());
  EXPECT_EQ(core_.Add("ns", "n", 1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST_F(StoreCoreTest, CompareSetOnAbsentKeyWithNonEmptyExpectedDoesNotSwap) {
  auto result = core_.CompareSet("ns", "k", "old", "new");
  ASSERT_TRUE(result.ok());
  EXPECT_FALSE(result->swapped);
  EXPECT_EQ(result->current, "");
  EXPECT_EQ(core_.TryGet("ns", "k").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(StoreCoreTest, LimitsAreInvalidArgumentNamingTheLimit) {
  EXPECT_EQ(core_.Set("ns", "", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(core_.Set("", "k", "v").code(), absl::StatusCode::kInvalidArgument);
  Status big_key = core_.Set("ns", std::string(kMaxKeyBytes + 1, 'k'), "v");
  EXPECT_EQ(big_key.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big_key.message().find("kMaxKeyBytes"), std::string::npos);
  Status big_value = core_.Set("ns", "k", std::string(kMaxValueBytes + 1, 'v'));
  EXPECT_EQ(big_value.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big_value.message().find("kMaxValueBytes"), std::string::npos);
  Recorder rec;
  core_.WaitAsync("ns", {}, MonoTime::max(), false, rec.Callback());
  EXPECT_EQ(rec.result->status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StoreCoreLimitTest, NamespaceKeyLimitIsResourceExhaustedButOverwritesStillWork) {
  FakeClock clock;
  StoreCore::Options options;
  options.run_expiry_thread = false;
  options.max_keys_per_namespace = 2;
  StoreCore core(&clock, options);
  ASSERT_TRUE(core.Set("ns", "a", "1").ok());
  ASSERT_TRUE(core.Set("ns", "b", "1").ok());
  Status full = core.Set("ns", "c", "1");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("ns"), std::string::npos);
  EXPECT_TRUE(core.Set("ns", "a", "2").ok());
  EXPECT_EQ(core.Add("ns", "c", 1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(core.MultiSet("ns", {{"a", "3"}, {"d", "1"}}).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(*core.TryGet("ns", "a"), "2");  // MultiSet is all-or-nothing
  EXPECT_TRUE(core.Set("other", "c", "1").ok());
}

// Bytes are counted per job ("<job>/..." across its rounds) and in all:
// a write past either quota is ResourceExhausted naming it and changes
// nothing; overwrites, deletes and dropped namespaces give bytes back.
TEST(StoreCoreLimitTest, ByteQuotasPerJobAndInAll) {
  FakeClock clock;
  StoreCore::Options options;
  options.run_expiry_thread = false;
  options.max_bytes_per_job = 100;
  options.max_bytes_total = 150;
  StoreCore core(&clock, options);
  const std::string v40(39, 'x');  // key "k1" + 39 bytes = 41 bytes
  ASSERT_TRUE(core.Set("a/1", "k1", v40).ok());
  ASSERT_TRUE(core.Set("a/2", "k2", v40).ok());  // job a: 82 bytes over two rounds
  Status over = core.Set("a/2", "k3", v40);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_NE(over.message().find("namespaces of \"a\" hold 82 bytes"), std::string::npos) << over;
  EXPECT_NE(over.message().find("per-job quota of 100 bytes"), std::string::npos) << over;
  EXPECT_EQ(core.TryGet("a/2", "k3").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core.MultiSet("a/2", {{"k4", "1"}, {"k5", v40}}).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(core.TryGet("a/2", "k4").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(core.Set("a/2", "k2", "small").ok());  // overwriting shrinks: 41 + 7
  EXPECT_TRUE(core.Set("a/2", "k3", v40).ok());      // 89
  // Another job has its own quota, but the total binds: 89 + 41 + 41 > 150.
  ASSERT_TRUE(core.Set("b/1", "k1", v40).ok());
  Status full = core.Set("b/1", "k2", v40);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("budget of 150 bytes"), std::string::npos) << full;
  // Deleting a key and dropping a job's namespaces give their bytes back.
  ASSERT_TRUE(*core.Delete("a/2", "k3"));
  EXPECT_TRUE(core.Set("b/1", "k2", v40).ok());
  EXPECT_EQ(core.DeleteNamespacesWithPrefix("a/"), 2);
  EXPECT_TRUE(core.Set("c/1", "k1", std::string(58, 'y')).ok());  // 60 + 82 <= 150
  EXPECT_TRUE(core.CompareSet("c/1", "k2", "", "z").ok());
  EXPECT_EQ(core.Add("c/1", "n", 1).status().code(), absl::StatusCode::kOk);
  EXPECT_EQ(core.CompareSet("c/1", "k3", "", std::string(40, 'w')).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// Parked waits are counted per job and in all: one over either is
// ResourceExhausted naming the quota, through its callback; a cancelled,
// completed or expired wait gives its place back.
TEST(StoreCoreLimitTest, ParkedWaitQuotasPerJobAndInAll) {
  FakeClock clock;
  StoreCore::Options options;
  options.run_expiry_thread = false;
  options.max_waiters_per_job = 2;
  options.max_waiters_total = 3;
  StoreCore core(&clock, options);
  const MonoTime later = clock.Now() + std::chrono::seconds(10);
  Recorder a1, a2, a3, b1, b2;
  const StoreCore::WaitId id1 = core.WaitAsync("a/1", {"x"}, later, false, a1.Callback());
  core.WaitAsync("a/2", {"y"}, later, false, a2.Callback());  // job a: 2 over two rounds
  core.WaitAsync("a/1", {"z"}, later, false, a3.Callback());
  ASSERT_TRUE(a3.result.has_value());
  EXPECT_EQ(a3.result->status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(a3.result->status().message().find("kMaxWaitersPerJob=2"), std::string::npos)
      << a3.result->status();
  EXPECT_EQ(core.NumPendingWaiters(), 2);
  core.WaitAsync("b/1", {"x"}, later, false, b1.Callback());  // job b: its own quota
  EXPECT_FALSE(b1.result.has_value());
  core.WaitAsync("b/1", {"w"}, later, false, b2.Callback());  // but 3 in all
  ASSERT_TRUE(b2.result.has_value());
  EXPECT_NE(b2.result->status().message().find("kMaxWaitersTotal=3"), std::string::npos)
      << b2.result->status();
  // A cancelled wait and a completed one give their places back.
  ASSERT_TRUE(core.CancelWait(id1));
  ASSERT_TRUE(core.Set("a/2", "y", "1").ok());
  ASSERT_TRUE(a2.result.has_value());
  EXPECT_TRUE(a2.result->ok());
  Recorder a4, a5;
  core.WaitAsync("a/1", {"x"}, later, false, a4.Callback());
  core.WaitAsync("a/1", {"v"}, later, false, a5.Callback());
  EXPECT_FALSE(a4.result.has_value());
  EXPECT_FALSE(a5.result.has_value());
  EXPECT_EQ(core.NumPendingWaiters(), 3);
  // Expired waits too.
  clock.Advance(std::chrono::seconds(11));
  core.ExpireWaiters();
  EXPECT_EQ(core.NumPendingWaiters(), 0);
  Recorder b3;
  core.WaitAsync("b/1", {"x"}, clock.Now() + std::chrono::seconds(1), false, b3.Callback());
  EXPECT_FALSE(b3.result.has_value());
}

TEST(StoreCoreExpiryThreadTest, ExpiryThreadFiresDeadlineOnRealClock) {
  StoreCore core;
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Result> result;
  core.WaitAsync("ns", {"k"}, RealClock()->Now() + std::chrono::milliseconds(20), false,
                 [&](Result r) {
                   std::lock_guard<std::mutex> lock(mu);
                   result = std::move(r);
                   cv.notify_all();
                 });
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return result.has_value(); }));
  EXPECT_EQ(result->status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(StoreCoreConcurrencyTest, ConcurrentAddsAreAtomic) {
  StoreCore core;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) ASSERT_TRUE(core.Add("ns", "n", 1).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*core.TryGet("ns", "n"), "8000");
}

}  // namespace
}  // namespace rendezvous
}  // namespace lockstep
