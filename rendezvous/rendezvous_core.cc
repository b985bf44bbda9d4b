#include "rendezvous/rendezvous_core.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "rendezvous/store.h"

namespace lockstep {
namespace rendezvous {
namespace {

std::string RoundName(const JobId& job_id, int round) {
  return absl::StrCat("job ", job_id.value(), " round ", round);
}

}  // namespace

RendezvousCore::RendezvousCore(Clock* clock) : RendezvousCore(clock, Options()) {}

RendezvousCore::RendezvousCore(Clock* clock, Options options) : clock_(clock), options_(options) {
  if (options_.run_timer_thread) timer_thread_ = std::thread([this] { TimerLoop(); });
}

RendezvousCore::~RendezvousCore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  timer_cv_.notify_all();
  if (timer_thread_.joinable()) timer_thread_.join();
}

RendezvousCore::Job* RendezvousCore::FindJob(const JobId& job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

const RendezvousCore::Job* RendezvousCore::FindJob(const JobId& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

void RendezvousCore::RunReady(Ready* ready) {
  for (auto& work : *ready) work();
  ready->clear();
}

namespace {
// Binds a join callback to its outcome, for RunReady.
std::function<void()> Bind(RendezvousCore::JoinCallback callback,
                           StatusOr<RendezvousResult> result) {
  return [callback = std::move(callback), result = std::move(result)]() mutable {
    callback(std::move(result));
  };
}
}  // namespace

void RendezvousCore::SetRoundClosedListener(RoundClosedListener listener) {
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = listener ? std::make_shared<RoundClosedListener>(std::move(listener)) : nullptr;
}

RendezvousCore::JoinCallback RendezvousCore::TakeJoinLocked(JoinId id) {
  auto it = joins_.find(id);
  if (it == joins_.end()) return nullptr;
  JoinCallback callback = std::move(it->second.callback);
  if (it->second.deadline_it != join_deadlines_.end()) join_deadlines_.erase(it->second.deadline_it);
  joins_.erase(it);
  return callback;
}

void RendezvousCore::FailJoinLocked(JoinId id, Status status, Ready* ready) {
  JoinCallback callback = TakeJoinLocked(id);
  if (callback) ready->push_back(Bind(std::move(callback), std::move(status)));
}

void RendezvousCore::NotifyTimerLocked(MonoTime deadline) {
  if (deadline < timer_wake_) {
    timer_wake_ = deadline;
    timer_cv_.notify_all();
  }
}

Status RendezvousCore::CreateJob(const RendezvousJobConfig& config) {
  const std::string& id = config.job_id.value();
  if (config.job_id.empty()) return absl::InvalidArgumentError("rendezvous job id is empty");
  if (config.min_nodes < 1 || config.max_nodes < config.min_nodes ||
      config.max_nodes > kMaxNodesPerJob) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous job ", id, ": nodes ", config.min_nodes, ":", config.max_nodes,
        " invalid (need 1 <= min_nodes <= max_nodes <= kMaxNodesPerJob=", kMaxNodesPerJob, ")"));
  }
  if (config.nproc_per_node < 1) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous job ", id, ": nproc_per_node ",
                                                   config.nproc_per_node, " must be >= 1"));
  }
  if (config.last_call_timeout < Duration::zero() || config.join_timeout <= Duration::zero()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous job ", id, ": last_call_timeout must be >= 0 and join_timeout > 0"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (const Job* existing = FindJob(config.job_id)) {
    const RendezvousJobConfig& c = existing->config;
    bool same = c.min_nodes == config.min_nodes && c.max_nodes == config.max_nodes &&
                c.nproc_per_node == config.nproc_per_node &&
                c.last_call_timeout == config.last_call_timeout &&
                c.join_timeout == config.join_timeout && c.master_address == config.master_address;
    if (same) return absl::OkStatus();
    return absl::AlreadyExistsError(
        absl::StrCat("rendezvous job ", id, " already exists with a different config"));
  }
  Job& job = jobs_[config.job_id];
  job.config = config;
  log_.WithJob(id).Info("rendezvous created: nodes {}:{}, nproc_per_node {}, round 1 open",
                        config.min_nodes, config.max_nodes, config.nproc_per_node);
  return absl::OkStatus();
}

Status RendezvousCore::RemoveJob(const JobId& job_id) {
  Ready ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Job* job = FindJob(job_id);
    if (job == nullptr) {
      return absl::NotFoundError(absl::StrCat("unknown rendezvous job ", job_id.value()));
    }
    Status removed = absl::AbortedError(
        absl::StrCat("rendezvous job ", job_id.value(), " was removed"));
    for (auto* members : {&job->participants, &job->waiting}) {
      for (auto& [node, member] : *members) {
        if (member.join_id != 0) FailJoinLocked(member.join_id, removed, &ready);
      }
    }
    jobs_.erase(job_id);
  }
  RunReady(&ready);
  return absl::OkStatus();
}

StatusOr<int> RendezvousCore::OpenNextRound(const JobId& job_id) {
  Ready ready;
  int round;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Job* job = FindJob(job_id);
    if (job == nullptr) {
      return absl::NotFoundError(absl::StrCat("unknown rendezvous job ", job_id.value()));
    }
    std::map<NodeId, Member> carried;
    if (job->phase == RoundPhase::kClosed) {
      job->previous_ranks.clear();
      for (size_t rank = 0; rank < job->ranked.size(); ++rank) {
        job->previous_ranks[job->ranked[rank]] = static_cast<int>(rank);
      }
    } else {
      carried = std::move(job->participants);
    }
    for (auto& [node, member] : job->waiting) carried[node] = std::move(member);
    job->participants = std::move(carried);
    job->waiting.clear();
    job->ranked.clear();
    job->departed.clear();
    job->last_call_deadline.reset();
    job->master_address.clear();
    job->phase = RoundPhase::kOpen;
    round = ++job->round;
    log_.WithJob(job_id.value())
        .Info("rendezvous round {} open ({} node(s) carried over)", round,
              job->participants.size());
    MaybeCloseLocked(*job, &ready);
  }
  RunReady(&ready);
  return round;
}

Status RendezvousCore::CloseRound(const JobId& job_id) {
  Ready ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Job* job = FindJob(job_id);
    if (job == nullptr) {
      return absl::NotFoundError(absl::StrCat("unknown rendezvous job ", job_id.value()));
    }
    if (job->phase == RoundPhase::kClosed) return absl::OkStatus();
    if (static_cast<int>(job->participants.size()) < job->config.min_nodes) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot close ", RoundName(job_id, job->round), ": ", job->participants.size(),
          " node(s) joined, min_nodes is ", job->config.min_nodes));
    }
    CloseLocked(*job, &ready);
  }
  RunReady(&ready);
  return absl::OkStatus();
}

void RendezvousCore::RemoveMemberLocked(Job& job, const NodeId& node_id, const Status& why,
                                        Ready* ready) {
  auto waiting = job.waiting.find(node_id);
  if (waiting != job.waiting.end()) {
    if (waiting->second.join_id != 0) FailJoinLocked(waiting->second.join_id, why, ready);
    job.waiting.erase(waiting);
  }
  auto participant = job.participants.find(node_id);
  if (participant == job.participants.end()) return;
  if (job.phase == RoundPhase::kClosed) {
    if (std::find(job.departed.begin(), job.departed.end(), node_id) == job.departed.end()) {
      job.departed.push_back(node_id);
      log_.WithJob(job.config.job_id.value())
          .Warn("node {} departed from closed rendezvous round {}", node_id.value(), job.round);
    }
    return;
  }
  if (participant->second.join_id != 0) FailJoinLocked(participant->second.join_id, why, ready);
  job.participants.erase(participant);
  MaybeCloseLocked(job, ready);
}

StatusOr<bool> RendezvousCore::MarkNodesDead(const JobId& job_id,
                                             const std::vector<NodeId>& node_ids) {
  Ready ready;
  bool broken = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Job* job = FindJob(job_id);
    if (job == nullptr) {
      return absl::NotFoundError(absl::StrCat("unknown rendezvous job ", job_id.value()));
    }
    for (const NodeId& node : node_ids) {
      if (job->phase == RoundPhase::kClosed && job->participants.count(node) > 0) broken = true;
      RemoveMemberLocked(*job, node,
                         absl::AbortedError(absl::StrCat("node ", node.value(), " was marked dead in ",
                                                         RoundName(job_id, job->round))),
                         &ready);
    }
  }
  RunReady(&ready);
  return broken;
}

StatusOr<RendezvousState> RendezvousCore::GetState(const JobId& job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Job* job = FindJob(job_id);
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown rendezvous job ", job_id.value()));
  }
  return StateLocked(*job);
}

RendezvousState RendezvousCore::StateLocked(const Job& job) const {
  RendezvousState state;
  state.job_id = job.config.job_id;
  state.round = job.round;
  state.phase = job.phase;
  state.min_nodes = job.config.min_nodes;
  state.max_nodes = job.config.max_nodes;
  if (job.phase == RoundPhase::kClosed) {
    state.participants = job.ranked;
  } else {
    for (const auto& [node, member] : job.participants) state.participants.push_back(node);
  }
  for (const auto& [node, member] : job.waiting) state.waiting.push_back(node);
  state.departed = job.departed;
  state.last_call_deadline = job.last_call_deadline;
  return state;
}

RendezvousCore::JoinId RendezvousCore::Join(const JoinRequest& request, MonoTime deadline,
                                            JoinCallback callback) {
  Ready ready;
  JoinId id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_join_id_++;
    auto fail = [&](Status status) { ready.push_back(Bind(std::move(callback), std::move(status))); };
    Job* job = FindJob(request.job_id);
    if (request.node_id.empty()) {
      fail(absl::InvalidArgumentError("rendezvous join names no node id"));
    } else if (job == nullptr) {
      fail(absl::NotFoundError(absl::StrCat("unknown rendezvous job ", request.job_id.value())));
    } else if (request.nproc_per_node != 0 &&
               request.nproc_per_node != job->config.nproc_per_node) {
      fail(absl::InvalidArgumentError(absl::StrCat(
          "node ", request.node_id.value(), " joins job ", request.job_id.value(),
          " with nproc_per_node ", request.nproc_per_node, " but the job runs ",
          job->config.nproc_per_node, " per node")));
    } else if (request.round != 0 && request.round < job->round) {
      fail(absl::AbortedError(absl::StrCat("node ", request.node_id.value(), " joins stale ",
                                           RoundName(request.job_id, request.round),
                                           ": the job is at round ", job->round)));
    } else if (request.round > job->round) {
      fail(absl::FailedPreconditionError(
          absl::StrCat(RoundName(request.job_id, request.round),
                       " is not open yet: the job is at round ", job->round)));
    } else if (job->phase == RoundPhase::kClosed && job->participants.count(request.node_id) > 0 &&
               std::find(job->departed.begin(), job->departed.end(), request.node_id) ==
                   job->departed.end()) {
      const auto& ranked = job->ranked;
      int rank = static_cast<int>(std::find(ranked.begin(), ranked.end(), request.node_id) -
                                  ranked.begin());
      ready.push_back(Bind(std::move(callback), ResultLocked(*job, rank)));
    } else {
      if (deadline == MonoTime::max()) deadline = clock_->Now() + job->config.join_timeout;
      auto& members = job->phase == RoundPhase::kClosed ? job->waiting : job->participants;
      Member& member = members[request.node_id];
      if (member.join_id != 0) {
        FailJoinLocked(member.join_id,
                       absl::AbortedError(absl::StrCat(
                           "join of node ", request.node_id.value(), " to ",
                           RoundName(request.job_id, job->round),
                           " was superseded by a newer join of the same node")),
                       &ready);
      }
      member.incarnation = request.incarnation;
      member.address = request.address;
      member.join_id = id;
      PendingJoin& pending = joins_[id];
      pending.job_id = request.job_id;
      pending.node_id = request.node_id;
      pending.callback = std::move(callback);
      pending.deadline_it = join_deadlines_.emplace(deadline, id);
      NotifyTimerLocked(deadline);
      if (job->phase == RoundPhase::kOpen) MaybeCloseLocked(*job, &ready);
    }
  }
  RunReady(&ready);
  return id;
}

bool RendezvousCore::CancelJoin(JoinId id) {
  Ready ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = joins_.find(id);
    if (it == joins_.end()) return false;
    JobId job_id = it->second.job_id;
    NodeId node_id = it->second.node_id;
    TakeJoinLocked(id);
    Job* job = FindJob(job_id);
    if (job != nullptr) {
      auto w = job->waiting.find(node_id);
      if (w != job->waiting.end() && w->second.join_id == id) job->waiting.erase(w);
      auto p = job->participants.find(node_id);
      if (job->phase == RoundPhase::kOpen && p != job->participants.end() &&
          p->second.join_id == id) {
        job->participants.erase(p);
        MaybeCloseLocked(*job, &ready);
      }
    }
  }
  RunReady(&ready);
  return true;
}

Status RendezvousCore::Leave(const JobId& job_id, const NodeId& node_id, int round) {
  Ready ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Job* job = FindJob(job_id);
    if (job == nullptr) {
      return absl::NotFoundError(absl::StrCat("unknown rendezvous job ", job_id.value()));
    }
    if (round != 0 && round < job->round) {
      return absl::AbortedError(absl::StrCat("node ", node_id.value(), " leaves stale ",
                                             RoundName(job_id, round), ": the job is at round ",
                                             job->round));
    }
    if (round > job->round) {
      return absl::FailedPreconditionError(absl::StrCat(
          RoundName(job_id, round), " is not open yet: the job is at round ", job->round));
    }
    RemoveMemberLocked(*job, node_id,
                       absl::AbortedError(absl::StrCat("node ", node_id.value(), " left ",
                                                       RoundName(job_id, job->round))),
                       &ready);
  }
  RunReady(&ready);
  return absl::OkStatus();
}

void RendezvousCore::MaybeCloseLocked(Job& job, Ready* ready) {
  if (job.phase != RoundPhase::kOpen) return;
  int n = static_cast<int>(job.participants.size());
  if (n >= job.config.max_nodes) {
    CloseLocked(job, ready);
  } else if (n >= job.config.min_nodes) {
    if (!job.last_call_deadline) {
      job.last_call_deadline = clock_->Now() + job.config.last_call_timeout;
      NotifyTimerLocked(*job.last_call_deadline);
    }
    if (job.config.last_call_timeout == Duration::zero()) CloseLocked(job, ready);
  } else {
    job.last_call_deadline.reset();
  }
}

void RendezvousCore::CloseLocked(Job& job, Ready* ready) {
  // Rank assignment (see the header): survivors keep their previous rank
  // when it fits; free ranks go to the other survivors, then new nodes.
  const int n = static_cast<int>(job.participants.size());
  std::vector<NodeId> slots(n);
  std::vector<bool> taken(n, false);
  std::vector<std::pair<int, NodeId>> survivors;
  std::vector<NodeId> fill;
  for (const auto& [node, member] : job.participants) {
    auto prev = job.previous_ranks.find(node);
    if (prev != job.previous_ranks.end()) survivors.emplace_back(prev->second, node);
  }
  std::sort(survivors.begin(), survivors.end());
  for (const auto& [rank, node] : survivors) {
    if (rank < n && !taken[rank]) {
      slots[rank] = node;
      taken[rank] = true;
    } else {
      fill.push_back(node);
    }
  }
  for (const auto& [node, member] : job.participants) {  // map: by node id
    if (job.previous_ranks.count(node) == 0) fill.push_back(node);
  }
  size_t next = 0;
  for (int rank = 0; rank < n; ++rank) {
    if (!taken[rank]) slots[rank] = fill[next++];
  }
  job.ranked = std::move(slots);
  job.phase = RoundPhase::kClosed;
  job.last_call_deadline.reset();
  job.departed.clear();
  job.master_address = job.config.master_address.empty()
                           ? job.participants[job.ranked[0]].address
                           : job.config.master_address;
  for (int rank = 0; rank < n; ++rank) {
    Member& member = job.participants[job.ranked[rank]];
    if (member.join_id == 0) continue;
    JoinCallback callback = TakeJoinLocked(member.join_id);
    member.join_id = 0;
    if (callback) ready->push_back(Bind(std::move(callback), ResultLocked(job, rank)));
  }
  if (listener_ != nullptr) {
    ready->push_back([listener = listener_, state = StateLocked(job)] { (*listener)(state); });
  }
  log_.WithJob(job.config.job_id.value())
      .Info("rendezvous round {} closed: {} node(s), world size {}", job.round, n,
            n * job.config.nproc_per_node);
}

RendezvousResult RendezvousCore::ResultLocked(const Job& job, int node_rank) const {
  RendezvousResult result;
  result.job_id = job.config.job_id;
  result.round = job.round;
  result.node_rank = node_rank;
  result.num_nodes = static_cast<int>(job.ranked.size());
  result.nproc_per_node = job.config.nproc_per_node;
  result.world_size = result.num_nodes * result.nproc_per_node;
  result.store_namespace = StoreNamespace(job.config.job_id.value(), job.round);
  result.node_ids = job.ranked;
  result.master_address = job.master_address;
  return result;
}

MonoTime RendezvousCore::AdvanceTimers() {
  Ready ready;
  MonoTime next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    next = AdvanceTimersLocked(&ready);
  }
  RunReady(&ready);
  return next;
}

MonoTime RendezvousCore::AdvanceTimersLocked(Ready* ready_out) {
  Ready& ready = *ready_out;
  MonoTime next = MonoTime::max();
  {
    MonoTime now = clock_->Now();
    // Last calls first: when a close and a join timeout fall due together,
    // the close wins.
    for (auto& [job_id, job] : jobs_) {
      if (job.phase == RoundPhase::kOpen && job.last_call_deadline &&
          *job.last_call_deadline <= now) {
        CloseLocked(job, &ready);
      }
    }
    while (!join_deadlines_.empty() && join_deadlines_.begin()->first <= now) {
      JoinId id = join_deadlines_.begin()->second;
      const PendingJoin& pending = joins_.at(id);
      JobId job_id = pending.job_id;
      NodeId node_id = pending.node_id;
      Job* job = FindJob(job_id);
      std::string counts =
          job == nullptr ? std::string()
                         : absl::StrCat(": ", job->participants.size(), " node(s) joined, min ",
                                        job->config.min_nodes, ", max ", job->config.max_nodes);
      FailJoinLocked(id,
                     absl::DeadlineExceededError(absl::StrCat(
                         "node ", node_id.value(), ": ",
                         RoundName(job_id, job == nullptr ? 0 : job->round),
                         " did not close before the join timeout", counts)),
                     &ready);
      if (job != nullptr) {
        auto w = job->waiting.find(node_id);
        if (w != job->waiting.end() && w->second.join_id == id) job->waiting.erase(w);
        auto p = job->participants.find(node_id);
        if (job->phase == RoundPhase::kOpen && p != job->participants.end() &&
            p->second.join_id == id) {
          job->participants.erase(p);
          MaybeCloseLocked(*job, &ready);
        }
      }
    }
    if (!join_deadlines_.empty()) next = join_deadlines_.begin()->first;
    for (const auto& [job_id, job] : jobs_) {
      if (job.phase == RoundPhase::kOpen && job.last_call_deadline) {
        next = std::min(next, *job.last_call_deadline);
      }
    }
  }
  return next;
}

void RendezvousCore::TimerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    Ready ready;
    // Computed under the same lock as timer_wake_, so a Join registering an
    // earlier deadline afterwards always notifies us.
    MonoTime next = AdvanceTimersLocked(&ready);
    timer_wake_ = next;
    if (!ready.empty()) {
      lock.unlock();
      RunReady(&ready);
      lock.lock();
      continue;
    }
    if (next == MonoTime::max()) {
      timer_cv_.wait(lock);
    } else {
      timer_cv_.wait_for(lock, next - clock_->Now());
    }
  }
}

}  // namespace rendezvous
}  // namespace lockstep
