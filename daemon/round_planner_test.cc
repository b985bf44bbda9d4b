#include "daemon/round_planner.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace daemon {
namespace {

using Action = RoundPlan::Action;
using Ids = std::vector<std::string>;

RoundPlanInput Input(Ids previous, Ids eligible, int min_nodes, int max_nodes,
                     bool last_call_passed = false, int nproc = 2) {
  RoundPlanInput in;
  in.previous = std::move(previous);
  in.eligible = std::move(eligible);
  in.min_nodes = min_nodes;
  in.max_nodes = max_nodes;
  in.nproc_per_node = nproc;
  in.last_call_passed = last_call_passed;
  return in;
}

TEST(RoundPlannerTest, WaitsForNodesBelowMinEvenAfterTheLastCall) {
  RoundPlan plan = PlanRound(Input({}, {"a"}, 2, 3, /*last_call_passed=*/true));
  EXPECT_EQ(plan.action, Action::kWaitForNodes);
  EXPECT_TRUE(plan.node_ids.empty());
  EXPECT_EQ(plan.world_size, 0);
}

TEST(RoundPlannerTest, MinNodesWaitForTheLastCallThenClose) {
  EXPECT_EQ(PlanRound(Input({}, {"a", "b"}, 2, 3)).action, Action::kWaitForLastCall);
  RoundPlan plan = PlanRound(Input({}, {"a", "b"}, 2, 3, /*last_call_passed=*/true));
  EXPECT_EQ(plan.action, Action::kClose);
  EXPECT_EQ(plan.node_ids, (Ids{"a", "b"}));
  EXPECT_EQ(plan.world_size, 4);
}

TEST(RoundPlannerTest, ClosesAtOnceWhenMaxNodesAreEligible) {
  RoundPlan plan = PlanRound(Input({}, {"a", "b", "c"}, 1, 3, /*last_call_passed=*/false, 4));
  EXPECT_EQ(plan.action, Action::kClose);
  EXPECT_EQ(plan.node_ids, (Ids{"a", "b", "c"}));
  EXPECT_EQ(plan.world_size, 12);
}

TEST(RoundPlannerTest, NewNodesTakeRanksByNodeId) {
  RoundPlan plan = PlanRound(Input({}, {"n1", "n2", "n3"}, 3, 3));
  EXPECT_EQ(plan.node_ids, (Ids{"n1", "n2", "n3"}));
}

TEST(RoundPlannerTest, SurvivorsKeepTheirRelativeOrderBeforeNewNodes) {
  // Round 1 ran [c, a, d]; d is gone, b and e are new.
  RoundPlan plan = PlanRound(Input({"c", "a", "d"}, {"a", "b", "c", "e"}, 1, 4, true));
  EXPECT_EQ(plan.action, Action::kClose);
  EXPECT_EQ(plan.node_ids, (Ids{"c", "a", "b", "e"}));
  EXPECT_EQ(plan.world_size, 8);
}

TEST(RoundPlannerTest, CapAtMaxNodesKeepsSurvivorsOverNewNodes) {
  RoundPlan plan = PlanRound(Input({"z", "y"}, {"a", "b", "y", "z"}, 1, 3));
  EXPECT_EQ(plan.action, Action::kClose);
  EXPECT_EQ(plan.node_ids, (Ids{"z", "y", "a"}));
  EXPECT_EQ(plan.world_size, 6);
}

TEST(RoundPlannerTest, SameMembershipGivesTheSamePlan) {
  RoundPlanInput in = Input({"b", "a"}, {"a", "b", "c"}, 2, 3);
  RoundPlan first = PlanRound(in);
  RoundPlan second = PlanRound(in);
  EXPECT_EQ(first.node_ids, second.node_ids);
  EXPECT_EQ(first.node_ids, (Ids{"b", "a", "c"}));
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
