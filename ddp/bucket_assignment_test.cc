#include "ddp/bucket_assignment.h"

#include <numeric>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace ddp {
namespace {

using ::testing::ElementsAre;

std::vector<size_t> Reversed(size_t n) {
  std::vector<size_t> order(n);
  std::iota(order.rbegin(), order.rend(), 0);
  return order;
}

TEST(AssignBucketsTest, FirstBucketClosesAtFirstCapThenLaterCap) {
  // Ten 400-byte params in reverse order, first cap 1000, cap 2000.
  std::vector<BucketParam> params(10, BucketParam{400, 0});
  auto buckets = AssignBuckets(params, Reversed(10), 1000, 2000);
  EXPECT_THAT(buckets, ElementsAre(ElementsAre(9, 8, 7), ElementsAre(6, 5, 4, 3, 2),
                                   ElementsAre(1, 0)));
}

TEST(AssignBucketsTest, ParameterLargerThanCapSitsAlone) {
  std::vector<BucketParam> params = {{10, 0}, {5000, 0}, {10, 0}};
  auto buckets = AssignBuckets(params, Reversed(3), 100, 100);
  EXPECT_THAT(buckets, ElementsAre(ElementsAre(2, 1), ElementsAre(0)));
}

TEST(AssignBucketsTest, DtypesNeverShareABucketAndOrderFollowsFirstMember) {
  std::vector<BucketParam> params = {{8, 1}, {4, 0}, {8, 1}, {4, 0}};
  auto buckets = AssignBuckets(params, {3, 2, 1, 0}, 1000, 1000);
  EXPECT_THAT(buckets, ElementsAre(ElementsAre(3, 1), ElementsAre(2, 0)));
}

TEST(AssignBucketsTest, FollowsAGivenArrivalOrder) {
  std::vector<BucketParam> params(4, BucketParam{100, 0});
  auto buckets = AssignBuckets(params, {1, 3, 0, 2}, 150, 1000);
  EXPECT_THAT(buckets, ElementsAre(ElementsAre(1, 3), ElementsAre(0, 2)));
}

}  // namespace
}  // namespace ddp
}  // namespace lockstep
