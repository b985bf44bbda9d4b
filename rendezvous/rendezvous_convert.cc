#include "rendezvous/rendezvous_convert.h"

namespace lockstep {
namespace rendezvous {

v1::RendezvousResult ToProto(const RendezvousResult& result) {
  v1::RendezvousResult proto;
  proto.set_job_id(result.job_id.value());
  proto.set_round(result.round);
  proto.set_node_rank(result.node_rank);
  proto.set_num_nodes(result.num_nodes);
  proto.set_world_size(result.world_size);
  proto.set_nproc_per_node(result.nproc_per_node);
  proto.set_store_namespace(result.store_namespace);
  for (const NodeId& node : result.node_ids) proto.add_node_ids(node.value());
  proto.set_master_address(result.master_address);
  return proto;
}

RendezvousResult FromProto(const v1::RendezvousResult& proto) {
  RendezvousResult result;
  result.job_id = JobId(proto.job_id());
  result.round = proto.round();
  result.node_rank = proto.node_rank();
  result.num_nodes = proto.num_nodes();
  result.world_size = proto.world_size();
  result.nproc_per_node = proto.nproc_per_node();
  result.store_namespace = proto.store_namespace();
  for (const std::string& node : proto.node_ids()) result.node_ids.emplace_back(node);
  result.master_address = proto.master_address();
  return result;
}

v1::JoinRendezvousRequest ToProto(const JoinRequest& request) {
  v1::JoinRendezvousRequest proto;
  proto.set_job_id(request.job_id.value());
  proto.set_node_id(request.node_id.value());
  proto.set_incarnation(request.incarnation.value());
  proto.set_nproc_per_node(request.nproc_per_node);
  proto.set_round(request.round);
  proto.set_address(request.address);
  return proto;
}

JoinRequest FromProto(const v1::JoinRendezvousRequest& proto) {
  JoinRequest request;
  request.job_id = JobId(proto.job_id());
  request.node_id = NodeId(proto.node_id());
  request.incarnation = Incarnation(proto.incarnation());
  request.nproc_per_node = proto.nproc_per_node();
  request.round = proto.round();
  request.address = proto.address();
  return request;
}

v1::GetRendezvousStateResponse ToProto(const RendezvousState& state) {
  v1::GetRendezvousStateResponse proto;
  proto.set_round(state.round);
  proto.set_closed(state.phase == RoundPhase::kClosed);
  for (const NodeId& node : state.waiting) proto.add_waiting_node_ids(node.value());
  for (const NodeId& node : state.participants) proto.add_participant_node_ids(node.value());
  for (const NodeId& node : state.departed) proto.add_departed_node_ids(node.value());
  proto.set_min_nodes(state.min_nodes);
  proto.set_max_nodes(state.max_nodes);
  return proto;
}

RendezvousState FromProto(const v1::GetRendezvousStateResponse& proto) {
  RendezvousState state;
  state.round = proto.round();
  state.phase = proto.closed() ? RoundPhase::kClosed : RoundPhase::kOpen;
  for (const std::string& node : proto.waiting_node_ids()) state.waiting.emplace_back(node);
  for (const std::string& node : proto.participant_node_ids()) {
    state.participants.emplace_back(node);
  }
  for (const std::string& node : proto.departed_node_ids()) state.departed.emplace_back(node);
  state.min_nodes = proto.min_nodes();
  state.max_nodes = proto.max_nodes();
  return state;
}

}  // namespace rendezvous
}  // namespace lockstep
