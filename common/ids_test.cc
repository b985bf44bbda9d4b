#include "common/ids.h"

#include <gtest/gtest.h>

#include <set>
#include <unordered_set>

namespace lockstep {
namespace {

TEST(IdsTest, StrongIdsCompareByValue) {
  EXPECT_EQ(JobId("a"), JobId("a"));
  EXPECT_NE(JobId("a"), JobId("b"));
  EXPECT_LT(Rank(1), Rank(2));
  std::unordered_set<NodeId> nodes{NodeId("n1"), NodeId("n1"), NodeId("n2")};
  EXPECT_EQ(nodes.size(), 2u);
}

TEST(IdsTest, RandomIdsHavePrefixAndDiffer) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    std::string id = NewRandomId("j-");
    EXPECT_EQ(id.rfind("j-", 0), 0u);
    EXPECT_EQ(id.size(), 18u);
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 100u);
}

}  // namespace
}  // namespace lockstep
