// RoundPlanner: when a job's open rendezvous round closes, and which node
// gets which node rank. A pure function of its input: no clock, no I/O, no
// state, so the same membership always gives the same plan.
//
// Words used here and in job_machine.h:
//   round        one attempt to run the job; numbered 1, 2, ... and recorded
//                in Job.current_round. It is *open* while it waits for
//                nodes and *closed* once its node ranks are fixed.
//   eligible     the nodes that could take part now: alive, reporting, and
//                running no worker of the job (the caller decides).
//   previous     the participants of the job's last closed round, in their
//                node-rank order.
//   survivors    previous participants that are eligible again.
//   last call    once min_nodes are eligible (and fewer than max_nodes), the
//                round stays open for the spec's last_call_timeout_s more, so
//                late nodes can still join; the caller keeps that clock.
//
// Close rule: close at once when max_nodes are eligible; close when at
// least min_nodes are eligible and the last call has passed; otherwise wait.
//
// Node-rank order: survivors first, in their previous relative order, then
// new nodes by node id; at most max_nodes (survivors are kept over new
// nodes). Ranks are gap-free: node rank = position in the list, world size
// = nodes * nproc_per_node, and a worker's global rank = node_rank *
// nproc_per_node + local_rank.
//
// Thread safety: PlanRound is a pure function.
#ifndef LOCKSTEP_DAEMON_ROUND_PLANNER_H_
#define LOCKSTEP_DAEMON_ROUND_PLANNER_H_

#include <string>
#include <vector>

namespace lockstep {
namespace daemon {

struct RoundPlanInput {
  // Participants of the last closed round, in node-rank order (empty for
  // the first round).
  std::vector<std::string> previous;
  // Nodes that could join now, sorted by node id, without duplicates.
  std::vector<std::string> eligible;
  int min_nodes = 1;  // REQUIRES: 1 <= min_nodes <= max_nodes
  int max_nodes = 1;
  int nproc_per_node = 1;  // REQUIRES: >= 1
  // True once the last call ran out (the caller's clock). A spec with no
  // last call (last_call_timeout_s 0) passes true.
  bool last_call_passed = false;
};

struct RoundPlan {
  enum class Action {
    kWaitForNodes,     // fewer than min_nodes eligible: no last call runs
    kWaitForLastCall,  // min_nodes or more, fewer than max: the last call runs
    kClose,            // close now with `node_ids`
  };
  Action action = Action::kWaitForNodes;
  // kClose: the participants in node-rank order, and their world size.
  std::vector<std::string> node_ids;
  int world_size = 0;
};

RoundPlan PlanRound(const RoundPlanInput& input);

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_ROUND_PLANNER_H_
