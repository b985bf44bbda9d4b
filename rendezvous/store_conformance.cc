#include "rendezvous/store_conformance.h"

#include <atomic>
#include <chrono>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace lockstep {
namespace rendezvous {

using std::chrono::milliseconds;
using std::chrono::seconds;

void StoreConformanceTest::SetUp() {
  env_ = GetParam()();
  store_ = env_->Open("conformance/1");
}

TEST_P(StoreConformanceTest, SetThenGetReturnsValue) {
  ASSERT_TRUE(store_->Set("k", "v").ok());
  auto got = store_->Get("k", seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v");
}

TEST_P(StoreConformanceTest, SetOverwritesValue) {
  ASSERT_TRUE(store_->Set("k", "one").ok());
  ASSERT_TRUE(store_->Set("k", "two").ok());
  EXPECT_EQ(*store_->Get("k", seconds(5)), "two");
}

TEST_P(StoreConformanceTest, BinaryValuesRoundTrip) {
  std::string value("a\0b\xff\x01", 5);
  ASSERT_TRUE(store_->Set("bin", value).ok());
  EXPECT_EQ(*store_->Get("bin", seconds(5)), value);
  ASSERT_TRUE(store_->Set("empty", "").ok());
  EXPECT_EQ(*store_->Get("empty", seconds(5)), "");
}

TEST_P(StoreConformanceTest, GetBlocksUntilAnotherClientSetsTheKey) {
  std::unique_ptr<Store> writer = env_->Open("conformance/1");
  std::thread t([&] {
    // The reader is (very likely) already waiting; either order must work.
    ASSERT_TRUE(writer->Set("late", "arrived").ok());
  });
  auto got = store_->Get("late", seconds(10));
  t.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "arrived");
}

TEST_P(StoreConformanceTest, GetReturnsDeadlineExceededWhenKeyNeverSet) {
  auto start = std::chrono::steady_clock::now();
  auto got = store_->Get("never", milliseconds(100));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
  EXPECT_NE(got.status().message().find("never"), std::string::npos) << got.status();
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(90));
}

// Duration::max() means "no timeout": it must not overflow a deadline into
// the past (an instant DeadlineExceeded) but wait for the write.
TEST_P(StoreConformanceTest, WaitsWithTheLargestTimeoutReturnOnceTheKeyIsSet) {
  std::unique_ptr<Store> writer = env_->Open("conformance/1");
  auto set_later = [&](const std::string& key) {
    return std::thread([&writer, key] {
      std::this_thread::sleep_for(milliseconds(50));  // the reader is waiting by then
      ASSERT_TRUE(writer->Set(key, "arrived").ok());
    });
  };
  std::thread get_setter = set_later("late-get");
  auto got = store_->Get("late-get", Duration::max());
  get_setter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "arrived");
  std::thread wait_setter = set_later("late-wait");
  Status waited = store_->Wait({"late-wait"}, Duration::max());
  wait_setter.join();
  EXPECT_TRUE(waited.ok()) << waited;
}

TEST_P(StoreConformanceTest, AddStartsFromZeroAndReturnsNewValue) {
  EXPECT_EQ(*store_->Add("n", 3), 3);
  EXPECT_EQ(*store_->Add("n", -1), 2);
  EXPECT_EQ(*store_->Get("n", seconds(5)), "2");
}

TEST_P(StoreConformanceTest, AddOnNonIntegerValueIsInvalidArgument) {
  ASSERT_TRUE(store_->Set("text", "hello").ok());
  auto added = store_->Add("text", 1);
  EXPECT_EQ(added.status().code(), absl::StatusCode::kInvalidArgument) << added.status();
  EXPECT_NE(added.status().message().find("text"), std::string::npos);
  EXPECT_EQ(*store_->Get("text", seconds(5)), "hello");
}

TEST_P(StoreConformanceTest, AddOverflowIsOutOfRangeAndChangesNothing) {
  ASSERT_TRUE(store_->Set("big", std::to_string(std::numeric_limits<int64_t>::max() - 1)).ok());
  EXPECT_EQ(*store_->Add("big", 1), std::numeric_limits<int64_t>::max());
  auto over = store_->Add("big", 1);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kOutOfRange) << over.status();
  EXPECT_NE(over.status().message().find("big"), std::string::npos) << over.status();
  EXPECT_EQ(*store_->Get("big", seconds(5)), std::to_string(std::numeric_limits<int64_t>::max()));
  ASSERT_TRUE(store_->Set("small", std::to_string(std::numeric_limits<int64_t>::min())).ok());
  EXPECT_EQ(store_->Add("small", -1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST_P(StoreConformanceTest, TooManyKeysInOneRequestIsInvalidArgumentNamingTheLimit) {
  std::vector<std::string> keys(kMaxKeysPerRequest + 1);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = "k" + std::to_string(i);
  Status wait = store_->Wait(keys, milliseconds(10));
  EXPECT_EQ(wait.code(), absl::StatusCode::kInvalidArgument) << wait;
  EXPECT_NE(wait.message().find("kMaxKeysPerRequest"), std::string::npos) << wait;
  auto get = store_->MultiGet(keys, milliseconds(10));
  EXPECT_EQ(get.status().code(), absl::StatusCode::kInvalidArgument) << get.status();
  std::vector<std::pair<std::string, std::string>> entries;
  for (const auto& k : keys) entries.emplace_back(k, "v");
  Status set = store_->MultiSet(entries);
  EXPECT_EQ(set.code(), absl::StatusCode::kInvalidArgument) << set;
  EXPECT_NE(set.message().find("kMaxKeysPerRequest"), std::string::npos) << set;
  EXPECT_EQ(*store_->NumKeys(), 0) << "nothing of a refused MultiSet is written";
}

// One invalid entry among valid ones: InvalidArgument, and none of them is
// written, wherever the invalid one stands (a store that wrote entry by
// entry as it checked them would have written those before it).
TEST_P(StoreConformanceTest, MultiSetWithAnInvalidEntryWritesNothing) {
  ASSERT_TRUE(store_->Set("a", "old").ok());
  const std::pair<std::string, std::string> invalid[] = {
      {"", "an empty key"},
      {std::string(kMaxKeyBytes + 1, 'k'), "a key over kMaxKeyBytes"},
      {"big", std::string(kMaxValueBytes + 1, 'v')},  // a value over kMaxValueBytes
  };
  for (const auto& bad : invalid) {
    for (size_t at = 0; at < 3; ++at) {
      std::vector<std::pair<std::string, std::string>> entries = {{"a", "new"}, {"b", "new"}};
      entries.insert(entries.begin() + at, bad);
      const std::string which =
          "invalid entry " + std::to_string(&bad - invalid) + " at " + std::to_string(at);
      Status set = store_->MultiSet(entries);
      EXPECT_EQ(set.code(), absl::StatusCode::kInvalidArgument) << which << ": " << set;
      EXPECT_EQ(*store_->NumKeys(), 1) << which;
      EXPECT_EQ(*store_->Get("a", seconds(5)), "old") << which;
    }
  }
}

TEST_P(StoreConformanceTest, ConcurrentAddsFromManyClientsAreAtomic) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      std::unique_ptr<Store> client = env_->Open("conformance/1");
      for (int i = 0; i < 50; ++i) ASSERT_TRUE(client->Add("counter", 1).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*store_->Get("counter", seconds(5)), "200");
}

TEST_P(StoreConformanceTest, CompareSetSwapsOnlyWhenExpectedMatches) {
  EXPECT_EQ(*store_->CompareSet("k", "", "first"), "first");  // absent + empty: create
  EXPECT_EQ(*store_->CompareSet("k", "wrong", "second"), "first");
  EXPECT_EQ(*store_->CompareSet("k", "first", "second"), "second");
  EXPECT_EQ(*store_->Get("k", seconds(5)), "second");
}

// An absent key matches only an empty `expected`: anything else leaves it
// absent and returns "" (the value of an absent key).
TEST_P(StoreConformanceTest, CompareSetOnAbsentKeyWithNonEmptyExpectedReturnsEmptyAndCreatesNothing) {
  auto got = store_->CompareSet("absent", "x", "y");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "");
  EXPECT_EQ(store_->Get("absent", milliseconds(10)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(*store_->NumKeys(), 0);
}

// No value can be over kMaxValueBytes, so an `expected` that is cannot be
// meant: InvalidArgument naming the limit, and nothing changes.
TEST_P(StoreConformanceTest, CompareSetWithAnOversizedExpectedIsInvalidArgumentNamingTheLimit) {
  ASSERT_TRUE(store_->Set("k", "v").ok());
  auto got = store_->CompareSet("k", std::string(kMaxValueBytes + 1, 'e'), "d");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
  EXPECT_NE(got.status().message().find("kMaxValueBytes"), std::string::npos) << got.status();
  EXPECT_EQ(*store_->Get("k", seconds(5)), "v");
}

TEST_P(StoreConformanceTest, DeleteReportsWhetherKeyExisted) {
  ASSERT_TRUE(store_->Set("k", "v").ok());
  EXPECT_TRUE(*store_->Delete("k"));
  EXPECT_FALSE(*store_->Delete("k"));
  EXPECT_EQ(store_->Get("k", milliseconds(10)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST_P(StoreConformanceTest, WaitReturnsOnceEveryKeyIsSet) {
  std::unique_ptr<Store> writer = env_->Open("conformance/1");
  std::thread t([&] {
    ASSERT_TRUE(writer->Set("a", "1").ok());
    ASSERT_TRUE(writer->Set("b", "2").ok());
  });
  Status waited = store_->Wait({"a", "b"}, seconds(10));
  t.join();
  EXPECT_TRUE(waited.ok()) << waited;
}

TEST_P(StoreConformanceTest, WaitDeadlineExceededNamesMissingKeys) {
  ASSERT_TRUE(store_->Set("here", "1").ok());
  Status waited = store_->Wait({"here", "gone"}, milliseconds(50));
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded) << waited;
  EXPECT_NE(waited.message().find("gone"), std::string::npos) << waited;
}

TEST_P(StoreConformanceTest, NumKeysCountsKeysOfThisNamespaceOnly) {
  std::unique_ptr<Store> other = env_->Open("conformance/2");
  ASSERT_TRUE(store_->Set("a", "1").ok());
  ASSERT_TRUE(store_->Set("b", "1").ok());
  ASSERT_TRUE(other->Set("c", "1").ok());
  EXPECT_EQ(*store_->NumKeys(), 2);
  EXPECT_EQ(*other->NumKeys(), 1);
}

TEST_P(StoreConformanceTest, NamespacesDoNotSeeEachOthersKeys) {
  std::unique_ptr<Store> next_round = env_->Open("conformance/2");
  ASSERT_TRUE(store_->Set("addr", "old").ok());
  EXPECT_EQ(next_round->Get("addr", milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST_P(StoreConformanceTest, MultiSetThenMultiGetReturnsValuesInKeyOrder) {
  ASSERT_TRUE(store_->MultiSet({{"x", "1"}, {"y", "2"}, {"z", "3"}}).ok());
  auto got = store_->MultiGet({"z", "x", "y"}, seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (std::vector<std::string>{"3", "1", "2"}));
}

TEST_P(StoreConformanceTest, MultiGetBlocksUntilAllKeysExist) {
  std::unique_ptr<Store> writer = env_->Open("conformance/1");
  std::thread t([&] { ASSERT_TRUE(writer->MultiSet({{"p", "1"}, {"q", "2"}}).ok()); });
  auto got = store_->MultiGet({"p", "q"}, seconds(10));
  t.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (std::vector<std::string>{"1", "2"}));
}

// One MultiGet answer carries at most kMaxMultiGetBytes of values; past
// that it is refused naming the total, before anything is copied (a MultiGet
// naming one 16 MiB key 65,536 times would otherwise take a TiB).
TEST_P(StoreConformanceTest, AMultiGetLargerThanOneAnswerIsRefusedNamingItsTotal) {
  ASSERT_TRUE(store_->Set("big", std::string(kMaxValueBytes, 'b')).ok());
  auto three = store_->MultiGet({"big", "big", "big"}, seconds(30));
  ASSERT_TRUE(three.ok()) << three.status();
  ASSERT_EQ(three->size(), 3u);
  EXPECT_EQ((*three)[2].size(), kMaxValueBytes);
  three = StatusOr<std::vector<std::string>>(std::vector<std::string>());  // free 48 MiB

  std::vector<std::string> keys(kMaxKeysPerRequest, "big");
  auto all = store_->MultiGet(keys, seconds(30));
  ASSERT_EQ(all.status().code(), absl::StatusCode::kResourceExhausted) << all.status();
  EXPECT_NE(all.status().message().find(absl::StrCat(
                "MultiGet of ", kMaxKeysPerRequest, " keys in ")),
            std::string::npos)
      << all.status();
  EXPECT_NE(all.status().message().find(absl::StrCat(
                ": their values total ", kMaxKeysPerRequest * kMaxValueBytes,
                " bytes, more than one answer carries (kMaxMultiGetBytes, ")),
            std::string::npos)
      << all.status();
  // The store goes on.
  auto one = store_->Get("big", seconds(5));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->size(), kMaxValueBytes);
}

TEST_P(StoreConformanceTest, EmptyKeyIsInvalidArgument) {
  EXPECT_EQ(store_->Set("", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Get("", milliseconds(10)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Add("", 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(StoreConformanceTest, OversizedKeyIsInvalidArgumentNamingTheLimit) {
  Status set = store_->Set(std::string(kMaxKeyBytes + 1, 'k'), "v");
  EXPECT_EQ(set.code(), absl::StatusCode::kInvalidArgument) << set;
  EXPECT_NE(set.message().find("kMaxKeyBytes"), std::string::npos) << set;
}

TEST_P(StoreConformanceTest, OversizedValueIsInvalidArgumentNamingTheLimit) {
  Status set = store_->Set("big", std::string(kMaxValueBytes + 1, 'v'));
  EXPECT_EQ(set.code(), absl::StatusCode::kInvalidArgument) << set;
  EXPECT_NE(set.message().find("kMaxValueBytes"), std::string::npos) << set;
}

TEST_P(StoreConformanceTest, ValueAtTheSizeLimitIsAccepted) {
  std::string value(kMaxValueBytes, 'v');
  ASSERT_TRUE(store_->Set("max", value).ok());
  auto got = store_->Get("max", seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), kMaxValueBytes);
}

TEST_P(StoreConformanceTest, ManyConcurrentWaitersAreAllWokenBySet) {
  constexpr int kWaiters = 16;
  std::atomic<int> woken{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&] {
      std::unique_ptr<Store> client = env_->Open("conformance/1");
      if (client->Get("go", seconds(10)).ok()) ++woken;
    });
  }
  ASSERT_TRUE(store_->Set("go", "1").ok());
  for (auto& t : threads) t.join();
  EXPECT_EQ(woken.load(), kWaiters);
}

}  // namespace rendezvous
}  // namespace lockstep
