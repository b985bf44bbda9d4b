#include "rendezvous/store_core.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
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
  // What each write below is charged (store_core.h): a key its key, its
  // value and kStoreKeyOverheadBytes; a namespace, once it holds a key, its
  // name and kStoreNamespaceOverheadBytes.
  const std::string v40(39, 'x');
  const size_t entry = StoreKeyCharge(2, v40.size());  // "k1".."k5" holding v40
  const size_t small = StoreKeyCharge(2, 5);           // "k2" holding "small"
  const size_t ns = StoreNamespaceCharge(3);           // "a/1", "a/2", "b/1", "c/1"
  // Job a: two rounds, then "k2" shrunk to "small" and "k3" added, with 11
  // bytes to spare; the store: that, "b/1" with one entry, and 20 to spare.
  const size_t job_a = 2 * ns + entry + small + entry;
  const size_t per_job = job_a + 11;
  const size_t total = job_a + ns + entry + 20;
  FakeClock clock;
  StoreCore::Options options;
  options.run_expiry_thread = false;
  options.max_bytes_per_job = per_job;
  options.max_bytes_total = total;
  StoreCore core(&clock, options);
  ASSERT_TRUE(core.Set("a/1", "k1", v40).ok());
  ASSERT_TRUE(core.Set("a/2", "k2", v40).ok());  // job a: 2 * (ns + entry) over two rounds
  Status over = core.Set("a/2", "k3", v40);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_NE(over.message().find(absl::StrCat("namespaces of \"a\" hold ", 2 * (ns + entry),
                                             " bytes; Set of store key \"k3\"")),
            std::string::npos)
      << over;
  EXPECT_NE(over.message().find(absl::StrCat("per-job quota of ", per_job, " bytes")),
            std::string::npos)
      << over;
  EXPECT_EQ(core.TryGet("a/2", "k3").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core.MultiSet("a/2", {{"k4", "1"}, {"k5", v40}}).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(core.TryGet("a/2", "k4").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(core.Set("a/2", "k2", "small").ok());  // overwriting shrinks: ns + entry + small
  EXPECT_TRUE(core.Set("a/2", "k3", v40).ok());      // job_a
  // Another job has its own quota, but the total binds: job_a + ns + 2 * entry > total.
  ASSERT_TRUE(core.Set("b/1", "k1", v40).ok());
  Status full = core.Set("b/1", "k2", v40);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find(absl::StrCat("budget of ", total, " bytes")), std::string::npos)
      << full;
  // Deleting a key and dropping a job's namespaces give their bytes back.
  ASSERT_TRUE(*core.Delete("a/2", "k3"));
  EXPECT_TRUE(core.Set("b/1", "k2", v40).ok());
  EXPECT_EQ(core.DeleteNamespacesWithPrefix("a/"), 2);
  // Job b holds ns + 2 * entry; "c/1" takes the rest but for its two small
  // writes below and 3 bytes, too few for the last.
  const size_t c_value = total - (ns + 2 * entry) - ns - StoreKeyCharge(2, 0) -
                         StoreKeyCharge(2, 1) - StoreKeyCharge(1, 1) - 3;
  EXPECT_TRUE(core.Set("c/1", "k1", std::string(c_value, 'y')).ok());
  EXPECT_TRUE(core.CompareSet("c/1", "k2", "", "z").ok());
  EXPECT_EQ(core.Add("c/1", "n", 1).status().code(), absl::StatusCode::kOk);
  EXPECT_EQ(core.CompareSet("c/1", "k3", "", std::string(40, 'w')).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// A namespace's name and each key's bookkeeping cost memory too, and count
// against the quotas: one job's token writing 1-byte values into many
// namespaces with 1,000-byte names was charged 2 bytes each, and so could
// hold ~30 times its quota. Dropping the namespaces (by deleting their keys,
// by prefix, or by closing the job) gives the bytes back.
TEST(StoreCoreLimitTest, NamespaceNamesAndPerKeyOverheadCountAgainstTheQuotas) {
  constexpr size_t kQuota = 64 * 1024;
  FakeClock clock;
  StoreCore::Options options;
  options.run_expiry_thread = false;
  options.max_bytes_per_job = kQuota;
  options.max_bytes_total = kQuota;
  StoreCore core(&clock, options);
  const std::string long_name(1000, 'n');
  auto ns_of = [&](const std::string& job, int i) {
    return absl::StrCat(job, "/", long_name, i);
  };
  // Sets "v" at "k" in fresh namespaces of `job` until one is refused;
  // returns how many were accepted (at most 100).
  auto fill = [&](const std::string& job) {
    for (int i = 0; i < 100; ++i) {
      Status s = core.Set(ns_of(job, i), "k", "v");
      if (s.ok()) continue;
      EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
      EXPECT_NE(s.message().find(absl::StrCat("namespaces of \"", job, "\"")), std::string::npos)
          << s;
      EXPECT_NE(s.message().find(absl::StrCat("quota of ", kQuota, " bytes")), std::string::npos)
          << s;
      EXPECT_NE(s.message().find("key \"k\""), std::string::npos) << s;
      EXPECT_EQ(core.TryGet(ns_of(job, i), "k").status().code(), absl::StatusCode::kNotFound);
      return i;
    }
    return 100;
  };
  const int accepted = fill("job");
  // Each costs at least its namespace's name: 1,000-odd bytes.
  EXPECT_LE(accepted, static_cast<int>(kQuota / 1000)) << "namespace names are not charged";
  // Exactly: the namespace's charge and its key's.
  int fit = 0;
  for (size_t held = 0;; ++fit) {
    held += StoreNamespaceCharge(ns_of("job", fit).size()) + StoreKeyCharge(1, 1);
    if (held > kQuota) break;
  }
  EXPECT_EQ(accepted, fit);
  // Deleting a namespace's last key drops it and gives back all it cost.
  for (int i = 0; i < accepted; ++i) ASSERT_TRUE(*core.Delete(ns_of("job", i), "k"));
  EXPECT_EQ(core.NumNamespaces(), 0);
  EXPECT_EQ(fill("job"), accepted);
  EXPECT_EQ(core.DeleteNamespacesWithPrefix("job/"), accepted);
  EXPECT_EQ(fill("job"), accepted);
  // Closing the job gives the store's budget (here the size of one job's
  // quota, which it holds) back to the others.
  EXPECT_EQ(core.Set(ns_of("other", 0), "k", "v").code(), absl::StatusCode::kResourceExhausted);
  core.CloseJob("job");
  EXPECT_EQ(fill("other"), accepted);
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

// Many waits parked on one key (every rank of a big job waiting for rank
// 0's address), half cancelled (their clients went away), the rest expired
// at once: each runs exactly as promised and nothing is left behind. Each
// removal from the key's waiter index used to scan the whole index under
// the core's lock, so this was quadratic in the number of waits.
TEST_F(StoreCoreTest, ManyWaitsOnOneKeyAreCancelledAndExpiredAndLeaveNothingBehind) {
  constexpr int kWaits = 65536;
  const MonoTime deadline = clock_.Now() + std::chrono::seconds(1);
  std::vector<int> calls(kWaits, 0);
  std::vector<StoreCore::WaitId> ids(kWaits);
  int deadline_exceeded = 0;
  for (int i = 0; i < kWaits; ++i) {
    ids[i] = core_.WaitAsync("job/1", {"rank0-addr"}, deadline, true, [&, i](Result r) {
      ++calls[i];
      if (r.status().code() == absl::StatusCode::kDeadlineExceeded) ++deadline_exceeded;
    });
  }
  ASSERT_EQ(core_.NumPendingWaiters(), kWaits);
  for (int i = 0; i < kWaits; i += 2) ASSERT_TRUE(core_.CancelWait(ids[i]));
  EXPECT_EQ(core_.NumPendingWaiters(), kWaits / 2);
  clock_.Advance(std::chrono::seconds(1));
  EXPECT_EQ(core_.ExpireWaiters(), MonoTime::max());
  EXPECT_EQ(deadline_exceeded, kWaits / 2);
  for (int i = 0; i < kWaits; ++i) ASSERT_EQ(calls[i], i % 2 == 0 ? 0 : 1) << "wait " << i;
  EXPECT_EQ(core_.NumPendingWaiters(), 0);
  EXPECT_EQ(core_.NumNamespaces(), 0);
  // The key's index is empty again: a write completes nobody.
  ASSERT_TRUE(core_.Set("job/1", "rank0-addr", "10.0.0.1:1234").ok());
  for (int i = 0; i < kWaits; ++i) ASSERT_LE(calls[i], 1) << "wait " << i;
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
