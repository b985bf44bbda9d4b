#include "daemon/round_planner.h"

#include <algorithm>
#include <set>

namespace lockstep {
namespace daemon {

RoundPlan PlanRound(const RoundPlanInput& input) {
  RoundPlan plan;
  const int eligible = static_cast<int>(input.eligible.size());
  if (eligible < input.min_nodes) return plan;
  if (eligible < input.max_nodes && !input.last_call_passed) {
    plan.action = RoundPlan::Action::kWaitForLastCall;
    return plan;
  }
  plan.action = RoundPlan::Action::kClose;
  const std::set<std::string> pool(input.eligible.begin(), input.eligible.end());
  std::set<std::string> taken;
  for (const auto& node : input.previous) {  // survivors, in their previous order
    if (pool.count(node) && taken.insert(node).second) plan.node_ids.push_back(node);
  }
  for (const auto& node : input.eligible) {  // then new nodes, by id
    if (taken.insert(node).second) plan.node_ids.push_back(node);
  }
  if (static_cast<int>(plan.node_ids.size()) > input.max_nodes) {
    plan.node_ids.resize(input.max_nodes);
  }
  plan.world_size = static_cast<int>(plan.node_ids.size()) * input.nproc_per_node;
  return plan;
}

}  // namespace daemon
}  // namespace lockstep
