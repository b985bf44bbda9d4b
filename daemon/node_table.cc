#include "daemon/node_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace daemon {

NodeTable::NodeTable(Duration lease, Duration heartbeat_interval)
    : lease_(lease), heartbeat_interval_(heartbeat_interval) {}

std::set<std::string> NodeTable::LiveJobs(const Reports& reports) {
  std::set<std::string> out;
  for (const auto& report : reports) {
    for (const auto& w : report.workers()) {
      if (w.state() == v1::WORKER_STATE_STARTING || w.state() == v1::WORKER_STATE_RUNNING) {
        out.insert(report.job_id());
      }
    }
  }
  return out;
}

void NodeTable::Restore(const v1::NodeInfo& info, MonoTime now) {
  Node& node = nodes_[info.node_id()];
  node.info = info;
  node.last_heartbeat = now;
  node.alive = true;
  node.reported = false;
  node.live_jobs.clear();
  node.started_since_report.clear();
}

void NodeTable::Register(const v1::NodeInfo& info, MonoTime now, const Reports& reports) {
  Node& node = nodes_[info.node_id()];
  node.info = info;
  node.last_heartbeat = now;
  node.alive = true;
  node.reported = true;
  node.live_jobs = LiveJobs(reports);
  node.started_since_report.clear();
  node.clock_offset.reset();  // perhaps another host under the same node id
}

MonoTime NodeTable::PlaceAgentInstant(const std::string& node_id, MonoTime receipt,
                                      int64_t sent_mono_ns) {
  if (sent_mono_ns <= 0) return receipt;
  Node& node = nodes_.at(node_id);
  const Duration bound = receipt.time_since_epoch() - std::chrono::nanoseconds(sent_mono_ns);
  Duration offset = bound;
  if (node.clock_offset) {
    const auto aged = std::chrono::duration_cast<Duration>(
        (receipt - node.clock_offset_at) * kClockDriftAllowance);
    offset = std::min(bound, *node.clock_offset + std::max(Duration::zero(), aged));
  }
  node.clock_offset = offset;
  node.clock_offset_at = receipt;
  // offset <= bound, so the sum is at most `receipt`, and no overflow.
  return std::max(MonoTime(std::chrono::duration_cast<MonoTime::duration>(
                      std::chrono::nanoseconds(sent_mono_ns) + offset)),
                  receipt - kMaxAgentClockSpan);
}

Status NodeTable::CheckIncarnation(const std::string& node_id,
                                   const std::string& incarnation) const {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) {
    return absl::NotFoundError(absl::StrCat("node ", QuoteForError(node_id), " is not registered"));
  }
  // A registered node's id is a safe id (Coordinator::RegisterNode);
  // incarnations are any bytes.
  if (it->second.info.incarnation() != incarnation) {
    return absl::AbortedError(absl::StrCat("node ", node_id, ": stale incarnation ",
                                           QuoteForError(incarnation), " (current ",
                                           QuoteForError(it->second.info.incarnation()), ")"));
  }
  return absl::OkStatus();
}

bool NodeTable::Renew(const std::string& node_id, MonoTime now, const Reports& reports) {
  Node& node = nodes_.at(node_id);
  const bool was_dead = !node.alive;
  node.last_heartbeat = std::max(node.last_heartbeat, now);
  node.alive = true;
  node.reported = true;
  node.live_jobs = LiveJobs(reports);
  // The agent sends a heartbeat only after it applied the last answer: this
  // report shows what those starts began (a start still waiting there, for
  // a uid say, begins only if this answer starts it again).
  node.started_since_report.clear();
  return was_dead;
}

std::optional<Duration> NodeTable::CompensateStall(MonoTime now) {
  std::optional<Duration> gap;
  if (last_tick_ && now - *last_tick_ > 2 * heartbeat_interval_) {
    gap = now - *last_tick_;
    for (auto& [id, node] : nodes_) {
      node.last_heartbeat = std::min(node.last_heartbeat + *gap, std::max(node.last_heartbeat, now));
    }
  }
  last_tick_ = now;
  return gap;
}

std::vector<NodeTable::Expired> NodeTable::ExpireLeases(MonoTime now) {
  std::vector<Expired> out;
  for (auto& [id, node] : nodes_) {
    if (node.alive && now - node.last_heartbeat > lease_) {
      node.alive = false;
      node.dead_reason = absl::StrCat("no heartbeat for ", ToSeconds(now - node.last_heartbeat),
                                      "s (lease ", ToSeconds(lease_), "s)");
      out.push_back({id, node.dead_reason});
    }
  }
  return out;
}

const v1::NodeInfo* NodeTable::Find(const std::string& node_id) const {
  auto it = nodes_.find(node_id);
  return it == nodes_.end() ? nullptr : &it->second.info;
}

bool NodeTable::Alive(const std::string& node_id) const {
  auto it = nodes_.find(node_id);
  return it != nodes_.end() && it->second.alive;
}

std::string NodeTable::DeathReason(const std::string& node_id) const {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return "not registered";
  return it->second.alive ? "" : it->second.dead_reason;
}

MonoTime NodeTable::FenceDeadline(const std::string& node_id) const {
  return nodes_.at(node_id).last_heartbeat + lease_ + lease_ / 4 + kFenceMargin;
}

void NodeTable::NoteStarted(const std::string& node_id, const std::string& job_id) {
  nodes_.at(node_id).started_since_report.insert(job_id);
}

bool NodeTable::OwnersGone(const std::string& node_id, const std::string& job_id,
                           MonoTime now) const {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return true;
  const Node& node = it->second;
  if (node.reported && !node.live_jobs.count(job_id) && !node.started_since_report.count(job_id)) {
    return true;
  }
  return !node.alive && now >= FenceDeadline(node_id);
}

std::vector<std::string> NodeTable::Eligible(const std::string& job_id) const {
  std::vector<std::string> out;  // nodes_ is ordered by node id
  for (const auto& [id, node] : nodes_) {
    if (node.alive && node.reported && !node.live_jobs.count(job_id)) out.push_back(id);
  }
  return out;
}

std::vector<v1::NodeInfo> NodeTable::List(MonoTime now) const {
  std::vector<v1::NodeInfo> out;
  for (const auto& [id, node] : nodes_) {
    v1::NodeInfo info = node.info;
    info.set_alive(node.alive);
    info.set_last_heartbeat_age_s(ToSeconds(now - node.last_heartbeat));
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace daemon
}  // namespace lockstep
