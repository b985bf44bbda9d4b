#include "rendezvous/memory_store.h"

#include "rendezvous/store_conformance.h"

namespace lockstep {
namespace rendezvous {
namespace {

class MemoryEnv : public StoreConformanceEnv {
 public:
  std::unique_ptr<Store> Open(const std::string& ns) override {
    return std::make_unique<MemoryStore>(core_, ns);
  }

 private:
  std::shared_ptr<StoreCore> core_ = std::make_shared<StoreCore>();
};

INSTANTIATE_TEST_SUITE_P(Memory, StoreConformanceTest,
                         ::testing::Values(StoreEnvFactory([] {
                           return std::unique_ptr<StoreConformanceEnv>(new MemoryEnv());
                         })));

TEST(MemoryStoreTest, DefaultConstructedStoreWorksAlone) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("k", "v").ok());
  EXPECT_EQ(*store.Get("k", std::chrono::seconds(1)), "v");
  EXPECT_EQ(store.ns(), "default");
}

TEST(MemoryStoreTest, TimedOutGetLeavesNoWaiterBehind) {
  auto core = std::make_shared<StoreCore>();
  MemoryStore store(core, "ns");
  EXPECT_FALSE(store.Get("k", std::chrono::milliseconds(5)).ok());
  EXPECT_EQ(core->NumPendingWaiters(), 0);
}

}  // namespace
}  // namespace rendezvous
}  // namespace lockstep
