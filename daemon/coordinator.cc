#include "daemon/coordinator.h"

#include <algorithm>

#include <google/protobuf/util/message_differencer.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/address.h"
#include "daemon/job_spec.h"

namespace lockstep {
namespace daemon {
namespace {

bool IsLiveWorker(const v1::WorkerStatus& w) {
  return w.state() == v1::WORKER_STATE_STARTING || w.state() == v1::WORKER_STATE_RUNNING;
}

std::string DescribeExit(const v1::ExitInfo& exit) {
  std::string s = exit.signal() != 0 ? absl::StrCat("killed by signal ", exit.signal())
                                     : absl::StrCat("exited with code ", exit.exit_code());
  if (exit.startup_failure()) absl::StrAppend(&s, " (startup failure: before its first step)");
  if (!exit.message().empty()) absl::StrAppend(&s, ": ", exit.message());
  return s;
}

std::string DescribeFailure(const v1::Failure& f) {
  if (f.rank() >= 0 && f.has_exit()) {
    return absl::StrCat("rank ", f.rank(), " on node ", f.node_id(), " ", DescribeExit(f.exit()),
                        " in round ", f.round());
  }
  return absl::StrCat(f.reason(), " in round ", f.round());
}


}  // namespace

Coordinator::Coordinator(CoordinatorOptions options, Clock* clock, JobStore* store,
                         rendezvous::RendezvousCore* rendezvous)
    : options_(std::move(options)), clock_(clock), store_(store), rendezvous_(rendezvous) {
  store_address_ = options_.store_address;
}

void Coordinator::SetStoreAddress(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  store_address_ = address;
}

bool Coordinator::IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

Status Coordinator::Recover() {
  ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, store_->LoadJobs());
  ASSIGN_OR_RETURN(std::vector<v1::NodeInfo> nodes, store_->LoadNodes());
  std::sort(jobs.begin(), jobs.end(), [](const v1::Job& a, const v1::Job& b) {
    return std::make_pair(a.submitted_unix_ms(), a.job_id()) <
           std::make_pair(b.submitted_unix_ms(), b.job_id());
  });
  std::lock_guard<std::mutex> lock(mu_);
  MonoTime now = clock_->Now();
  for (auto& job : jobs) {
    JobRuntime rt;
    rt.round_opened = now;
    rt.restart_at = now;
    runtime_[job.job_id()] = rt;
    job_order_.push_back(job.job_id());
    jobs_[job.job_id()] = std::move(job);
  }
  for (auto& info : nodes) {
    NodeState node;
    node.info = info;
    node.last_heartbeat = now;  // a full lease from the reload
    node.alive = true;
    node.reported = false;      // unknown until its agent reports
    nodes_[info.node_id()] = std::move(node);
  }
  log_.Info("recovered {} jobs and {} nodes from the job store", jobs_.size(), nodes_.size());
  return absl::OkStatus();
}

void Coordinator::AddEvent(v1::Job* job, const std::string& detail) {
  v1::JobEvent* e = job->add_history();
  e->set_unix_ms(clock_->UnixMillis());
  e->set_state(job->state());
  e->set_round(job->round());
  e->set_detail(detail);
  if (job->history_size() > kMaxHistory) job->mutable_history()->DeleteSubrange(1, 1);
}

void Coordinator::SetState(v1::Job* job, v1::JobState state, const std::string& detail) {
  job->set_state(state);
  job->set_message(detail);
  if (IsTerminal(state)) {
    job->set_finished_unix_ms(clock_->UnixMillis());
    ForgetRendezvous(job->job_id());
  }
  AddEvent(job, detail);
  log_.WithJob(job->job_id())
      .Info("{} round={} restarts={}: {}", v1::JobState_Name(state), job->round(),
            job->restart_count(), detail);
}

Duration Coordinator::BackoffFor(int restart_count) const {
  Duration d = options_.restart_backoff;
  for (int i = 1; i < restart_count && d < options_.max_restart_backoff; ++i) d *= 2;
  return std::min(d, options_.max_restart_backoff);
}

Status Coordinator::CommitJob(const v1::Job& before, v1::Job* job,
                              std::vector<Notification>* notify) {
  if (google::protobuf::util::MessageDifferencer::Equals(before, *job)) return absl::OkStatus();
  Status s = store_->PutJob(*job);
  if (!s.ok()) {
    log_.WithJob(job->job_id()).Error("persisting job failed, change rolled back: {}", s.ToString());
    *job = before;
    return s;
  }
  JobRuntime& rt = runtime_[job->job_id()];
  ++rt.version;
  for (auto it = watches_.begin(); it != watches_.end();) {
    if (it->second.job_id == job->job_id() && it->second.after_version < rt.version) {
      notify->push_back({std::move(it->second.cb), {*job, rt.version}});
      it = watches_.erase(it);
    } else {
      ++it;
    }
  }
  return absl::OkStatus();
}

void Coordinator::Deliver(std::vector<Notification>* notify) {
  for (auto& [cb, snapshot] : *notify) cb(snapshot.first, snapshot.second);
  notify->clear();
}

StatusOr<v1::Job> Coordinator::SubmitJob(const v1::JobSpec& spec, const std::string& request_id) {
  RETURN_IF_ERROR(ValidateJobSpec(spec, options_.allowed_commands));
  std::vector<Notification> notify;
  v1::Job result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!request_id.empty()) {
      for (const auto& [id, job] : jobs_) {
        if (job.request_id() == request_id) return job;
      }
    }
    v1::Job job;
    std::string id;
    do {
      id = NewRandomId("j-");
    } while (jobs_.count(id));
    job.set_job_id(id);
    *job.mutable_spec() = spec;
    ApplyJobSpecDefaults(job.mutable_spec());
    job.set_request_id(request_id);
    job.set_submitted_unix_ms(clock_->UnixMillis());
    job.set_state(v1::JOB_STATE_PENDING);
    job.set_message("waiting for a rendezvous round");
    AddEvent(&job, "submitted");
    RETURN_IF_ERROR(store_->PutJob(job));
    JobRuntime rt;
    rt.round_opened = clock_->Now();
    rt.restart_at = rt.round_opened;
    runtime_[id] = rt;
    jobs_[id] = job;
    job_order_.push_back(id);
    log_.WithJob(id).Info("submitted: {} nodes {}:{} x {} procs, max_restarts {}",
                          absl::StrJoin(spec.command(), " "), job.spec().min_nodes(),
                          job.spec().max_nodes(), job.spec().nproc_per_node(),
                          job.spec().max_restarts());
    // Open the first round at once if nodes are there.
    v1::Job& stored = jobs_[id];
    v1::Job before = stored;
    TickJob(&stored, &notify);
    (void)CommitJob(before, &stored, &notify);
    DrainRendezvous(&notify);
    result = stored;
  }
  Deliver(&notify);
  return result;
}

StatusOr<v1::Job> Coordinator::GetJob(const JobId& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id.value());
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", id.value(), " not found"));
  return it->second;
}

StatusOr<std::pair<v1::Job, int64_t>> Coordinator::GetJobVersion(const JobId& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id.value());
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", id.value(), " not found"));
  return std::make_pair(it->second, runtime_.at(id.value()).version);
}

StatusOr<int64_t> Coordinator::WatchOnce(const JobId& id, int64_t after_version, JobCallback cb) {
  v1::Job snapshot;
  int64_t version;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(id.value());
    if (it == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("job ", id.value(), " not found"));
    }
    version = runtime_.at(id.value()).version;
    if (version <= after_version) {
      int64_t handle = next_watch_++;
      watches_[handle] = Watch{id.value(), after_version, std::move(cb)};
      return handle;
    }
    snapshot = it->second;
  }
  cb(snapshot, version);
  return 0;
}

bool Coordinator::Unwatch(int64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  return watches_.erase(handle) > 0;
}

std::vector<v1::Job> Coordinator::ListJobs(const std::vector<v1::JobState>& states) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::Job> out;
  for (const auto& id : job_order_) {
    const v1::Job& job = jobs_.at(id);
    if (states.empty() || std::find(states.begin(), states.end(), job.state()) != states.end()) {
      out.push_back(job);
    }
  }
  return out;
}

StatusOr<v1::Job> Coordinator::CancelJob(const JobId& id) {
  std::vector<Notification> notify;
  v1::Job result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(id.value());
    if (it == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("job ", id.value(), " not found"));
    }
    v1::Job& job = it->second;
    if (IsTerminal(job.state())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id.value(), " already finished as ", v1::JobState_Name(job.state())));
    }
    v1::Job before = job;
    SetState(&job, v1::JOB_STATE_CANCELLED, "cancelled by user");
    RETURN_IF_ERROR(CommitJob(before, &job, &notify));
    result = job;
  }
  Deliver(&notify);
  return result;
}

void Coordinator::HandleFailure(v1::Job* job, const v1::Failure& failure, bool counts) {
  std::string what = DescribeFailure(failure);
  if (!counts) {
    job->set_rescale_count(job->rescale_count() + 1);
    runtime_[job->job_id()].restart_at = clock_->Now();
    SetState(job, v1::JOB_STATE_RESTARTING, absl::StrCat("membership change: ", what));
    return;
  }
  if (!job->has_first_failure() || job->first_failure().round() != job->round()) {
    *job->mutable_first_failure() = failure;
  }
  if (job->restart_count() >= job->spec().max_restarts()) {
    SetState(job, v1::JOB_STATE_FAILED,
             absl::StrCat(DescribeFailure(job->first_failure()), "; restart budget spent (",
                          job->restart_count(), " of max_restarts ", job->spec().max_restarts(),
                          ")"));
    return;
  }
  job->set_restart_count(job->restart_count() + 1);
  Duration backoff = BackoffFor(job->restart_count());
  runtime_[job->job_id()].restart_at = clock_->Now() + backoff;
  SetState(job, v1::JOB_STATE_RESTARTING,
           absl::StrCat("restart ", job->restart_count(), " of ", job->spec().max_restarts(),
                        " after ", what, " (backoff ", ToSeconds(backoff), "s)"));
}

void Coordinator::ApplyReport(NodeState* node, const v1::AgentJobReport& report,
                              std::vector<Notification>* notify) {
  auto it = jobs_.find(report.job_id());
  if (it == jobs_.end()) return;
  v1::Job& job = it->second;
  if (report.round() != job.round()) return;  // stale round: fenced off
  const auto& ids = job.node_ids();
  auto pos = std::find(ids.begin(), ids.end(), node->info.node_id());
  if (pos == ids.end()) return;  // not a participant of this round
  int node_rank = pos - ids.begin();
  int nproc = job.spec().nproc_per_node();
  v1::Job before = job;
  if (node_rank == 0 && report.master_port() > 0 && job.master_port() == 0) {
    job.set_master_port(report.master_port());
  }
  for (const v1::WorkerStatus& w : report.workers()) {
    if (w.rank() < node_rank * nproc || w.rank() >= (node_rank + 1) * nproc) continue;
    v1::WorkerStatus* slot = nullptr;
    for (auto& existing : *job.mutable_workers()) {
      if (existing.rank() == w.rank()) slot = &existing;
    }
    if (slot == nullptr) slot = job.add_workers();
    *slot = w;
    slot->set_node_id(node->info.node_id());
    slot->set_round(job.round());
  }
  std::sort(job.mutable_workers()->begin(), job.mutable_workers()->end(),
            [](const v1::WorkerStatus& a, const v1::WorkerStatus& b) { return a.rank() < b.rank(); });

  if (job.state() == v1::JOB_STATE_RENDEZVOUS && job.workers_size() == job.world_size()) {
    SetState(&job, v1::JOB_STATE_RUNNING,
             absl::StrCat("all ", job.world_size(), " ranks started on ", ids.size(), " nodes"));
  }
  if (job.state() == v1::JOB_STATE_RENDEZVOUS || job.state() == v1::JOB_STATE_RUNNING) {
    const v1::WorkerStatus* failed = nullptr;
    const v1::WorkerStatus* stopped = nullptr;
    int succeeded = 0;
    for (const auto& w : job.workers()) {
      if (w.state() == v1::WORKER_STATE_EXITED) {
        if (w.exit().exit_code() != 0 || w.exit().signal() != 0) {
          // The root cause is the earliest exit (a peer's death makes the
          // others fail a moment later), then the lowest rank.
          if (!failed || w.exit().exited_unix_ms() < failed->exit().exited_unix_ms()) failed = &w;
        } else {
          ++succeeded;
        }
      } else if (w.state() == v1::WORKER_STATE_STOPPED && !stopped) {
        stopped = &w;
      }
    }
    const v1::WorkerStatus* culprit = failed ? failed : stopped;
    if (culprit) {
      v1::Failure f;
      f.set_rank(culprit->rank());
      f.set_node_id(culprit->node_id());
      *f.mutable_exit() = culprit->exit();
      f.set_round(job.round());
      f.set_reason(failed ? "worker exited" : "worker stopped by its agent (lease lost)");
      if (!failed) {
        f.mutable_exit()->set_message("stopped by its agent (could not renew its lease)");
      }
      HandleFailure(&job, f, /*counts=*/true);
    } else if (succeeded == job.world_size() && job.world_size() > 0) {
      SetState(&job, v1::JOB_STATE_SUCCEEDED,
               absl::StrCat("all ", job.world_size(), " ranks exited 0"));
    }
  }
  (void)CommitJob(before, &job, notify);
}

void Coordinator::DeclareDead(NodeState* node, const std::string& reason,
                              std::vector<Notification>* notify) {
  node->alive = false;
  node->live_jobs.clear();
  log_.Warn("node {} declared dead: {}", node->info.node_id(), reason);
  for (const auto& id : job_order_) {
    v1::Job& job = jobs_.at(id);
    JobRuntime& rt = runtime_[id];
    if (rt.rendezvous_created && rt.joined.erase(node->info.node_id())) {
      (void)rendezvous_->MarkNodesDead(JobId(id), {NodeId(node->info.node_id())});
    }
    if (job.state() != v1::JOB_STATE_RENDEZVOUS && job.state() != v1::JOB_STATE_RUNNING) continue;
    const auto& ids = job.node_ids();
    auto pos = std::find(ids.begin(), ids.end(), node->info.node_id());
    if (pos == ids.end()) continue;
    v1::Job before = job;
    v1::Failure f;
    f.set_rank(-1);
    f.set_node_id(node->info.node_id());
    f.set_round(job.round());
    f.set_reason(absl::StrCat("node ", node->info.node_id(), " lost: ", reason));
    HandleFailure(&job, f, /*counts=*/true);
    (void)CommitJob(before, &job, notify);
  }
}

StatusOr<v1::RegisterNodeResponse> Coordinator::RegisterNode(const v1::RegisterNodeRequest& req) {
  if (!IsSafeId(req.node_id())) {
    return absl::InvalidArgumentError(
        absl::StrCat("node_id \"", req.node_id(), "\": must be [A-Za-z0-9._-]{1,128}"));
  }
  if (req.incarnation().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("node ", req.node_id(), ": empty incarnation"));
  }
  std::vector<Notification> notify;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = nodes_.find(req.node_id());
    NodeState* node;
    if (it == nodes_.end()) {
      node = &nodes_[req.node_id()];
      node->info.set_node_id(req.node_id());
    } else {
      node = &it->second;
      if (node->info.incarnation() != req.incarnation()) {
        DeclareDead(node, absl::StrCat("agent restarted (incarnation ", node->info.incarnation(),
                                       " replaced by ", req.incarnation(), ")"),
                    &notify);
      }
    }
    v1::NodeInfo info = node->info;
    info.set_hostname(req.hostname());
    info.set_agent_address(req.agent_address());
    info.set_incarnation(req.incarnation());
    info.set_registered_unix_ms(clock_->UnixMillis());
    Status s = store_->PutNode(info);
    if (!s.ok()) {
      if (node->info.incarnation().empty()) nodes_.erase(req.node_id());
      return s;
    }
    node->info = info;
    node->alive = true;
    node->last_heartbeat = clock_->Now();
    node->reported = true;
    node->live_jobs.clear();
    for (const auto& report : req.jobs()) {
      for (const auto& w : report.workers()) {
        if (IsLiveWorker(w)) node->live_jobs.insert(report.job_id());
      }
    }
    for (const auto& report : req.jobs()) ApplyReport(node, report, &notify);
    log_.Info("node {} registered: address {} incarnation {}", req.node_id(), req.agent_address(),
              req.incarnation());
  }
  Deliver(&notify);
  v1::RegisterNodeResponse resp;
  resp.set_lease_s(ToSeconds(options_.lease));
  resp.set_heartbeat_interval_s(ToSeconds(options_.heartbeat_interval));
  return resp;
}

StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(const v1::HeartbeatRequest& req) {
  std::vector<Notification> notify;
  v1::HeartbeatResponse resp;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = nodes_.find(req.node_id());
    if (it == nodes_.end()) {
      return absl::NotFoundError(absl::StrCat("node ", req.node_id(), " is not registered"));
    }
    NodeState* node = &it->second;
    if (node->info.incarnation() != req.incarnation()) {
      return absl::AbortedError(absl::StrCat("node ", req.node_id(), ": stale incarnation ",
                                             req.incarnation(), " (current ",
                                             node->info.incarnation(), ")"));
    }
    node->last_heartbeat = clock_->Now();
    if (!node->alive) {
      log_.Info("node {} is heartbeating again", req.node_id());
      node->alive = true;
    }
    node->reported = true;
    node->live_jobs.clear();
    for (const auto& report : req.jobs()) {
      for (const auto& w : report.workers()) {
        if (IsLiveWorker(w)) node->live_jobs.insert(report.job_id());
      }
    }
    for (const auto& report : req.jobs()) ApplyReport(node, report, &notify);
    std::set<std::string> started;
    for (auto& cmd : CommandsFor(*node)) {
      started.insert(cmd.job_id());
      *resp.add_commands() = std::move(cmd);
    }
    for (const auto& report : req.jobs()) {
      if (started.count(report.job_id())) continue;
      v1::AgentCommand* stop = resp.add_commands();
      stop->set_kind(v1::AgentCommand::KIND_STOP);
      stop->set_job_id(report.job_id());
      stop->set_round(report.round());
      auto job = jobs_.find(report.job_id());
      if (job != jobs_.end()) *stop->mutable_spec() = job->second.spec();
    }
    resp.set_lease_s(ToSeconds(options_.lease));
  }
  Deliver(&notify);
  return resp;
}

std::vector<v1::AgentCommand> Coordinator::CommandsFor(const NodeState& node) const {
  std::vector<v1::AgentCommand> out;
  if (!node.alive) return out;
  for (const auto& id : job_order_) {
    const v1::Job& job = jobs_.at(id);
    if (job.state() != v1::JOB_STATE_RENDEZVOUS && job.state() != v1::JOB_STATE_RUNNING) continue;
    const auto& ids = job.node_ids();
    auto pos = std::find(ids.begin(), ids.end(), node.info.node_id());
    if (pos == ids.end()) continue;
    // Node rank 0 picks MASTER_PORT; the others wait until it reported it.
    if (pos != ids.begin() && job.master_port() == 0) continue;
    v1::AgentCommand cmd;
    cmd.set_kind(v1::AgentCommand::KIND_START);
    cmd.set_job_id(id);
    cmd.set_round(job.round());
    *cmd.mutable_spec() = job.spec();
    *cmd.mutable_assignment() = AssignmentFor(job, pos - ids.begin());
    out.push_back(std::move(cmd));
  }
  return out;
}

v1::RoundAssignment Coordinator::AssignmentFor(const v1::Job& job, int node_rank) const {
  v1::RoundAssignment a;
  a.set_job_id(job.job_id());
  a.set_round(job.round());
  a.set_node_rank(node_rank);
  a.set_num_nodes(job.node_ids_size());
  a.set_world_size(job.world_size());
  a.set_nproc_per_node(job.spec().nproc_per_node());
  *a.mutable_node_ids() = job.node_ids();
  auto first = nodes_.find(job.node_ids(0));
  if (first != nodes_.end()) a.set_master_addr(HostOfAddress(first->second.info.agent_address()));
  a.set_master_port(job.master_port());
  a.set_store_address(store_address_);
  a.set_store_namespace(absl::StrCat(job.job_id(), "/", job.round()));
  a.set_restart_count(job.restart_count());
  return a;
}

std::vector<v1::NodeInfo> Coordinator::ListNodes() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::NodeInfo> out;
  MonoTime now = clock_->Now();
  for (const auto& [id, node] : nodes_) {
    v1::NodeInfo info = node.info;
    info.set_alive(node.alive);
    info.set_last_heartbeat_age_s(ToSeconds(now - node.last_heartbeat));
    for (const auto& job_id : job_order_) {
      const v1::Job& job = jobs_.at(job_id);
      if (IsTerminal(job.state())) continue;
      if (std::find(job.node_ids().begin(), job.node_ids().end(), id) != job.node_ids().end()) {
        info.add_job_ids(job_id);
      }
    }
    out.push_back(std::move(info));
  }
  return out;
}

std::vector<std::string> Coordinator::EligibleNodes(const v1::Job& job) const {
  std::vector<std::string> out;  // nodes_ is ordered: sorted node ids
  for (const auto& [id, node] : nodes_) {
    if (node.alive && node.reported && !node.live_jobs.count(job.job_id())) out.push_back(id);
  }
  return out;
}

void Coordinator::TickJob(v1::Job* job, std::vector<Notification>* notify) {
  JobRuntime& rt = runtime_[job->job_id()];
  MonoTime now = clock_->Now();
  const v1::JobSpec& spec = job->spec();
  switch (job->state()) {
    case v1::JOB_STATE_PENDING:
    case v1::JOB_STATE_RESTARTING: {
      if (job->state() == v1::JOB_STATE_PENDING &&
          static_cast<int>(EligibleNodes(*job).size()) < spec.min_nodes()) {
        if (spec.join_timeout_s() > 0 && now - rt.round_opened >= FromSeconds(spec.join_timeout_s())) {
          SetState(job, v1::JOB_STATE_FAILED,
                   absl::StrCat("no rendezvous: fewer than min ", spec.min_nodes(),
                                " nodes within join timeout ", spec.join_timeout_s(), "s"));
        }
        return;
      }
      if (job->state() == v1::JOB_STATE_RESTARTING) {
        if (now < rt.restart_at) return;
        for (const auto& id : job->node_ids()) {
          auto node = nodes_.find(id);
          if (node == nodes_.end()) continue;  // never an agent: nothing to stop
          if (node->second.alive &&
              (!node->second.reported || node->second.live_jobs.count(job->job_id()))) {
            return;
          }
        }
      }
      Status opened = EnsureRendezvousRound(*job, job->round() + 1);
      if (!opened.ok()) {
        log_.WithJob(job->job_id()).Error("cannot open rendezvous round {}: {}", job->round() + 1,
                                          opened.ToString());
        return;
      }
      job->set_round(job->round() + 1);
      job->set_master_port(0);
      job->clear_node_ids();
      job->clear_workers();
      job->set_world_size(0);
      rt.round_opened = now;
      rt.joined.clear();
      SetState(job, v1::JOB_STATE_RENDEZVOUS,
               absl::StrCat("round ", job->round(), " opened: waiting for ", spec.min_nodes(),
                            "..", spec.max_nodes(), " nodes"));
      [[fallthrough]];
    }
    case v1::JOB_STATE_RENDEZVOUS: {
      if (job->node_ids_size() > 0) return;  // closed: waiting for the ranks to start
      Status ready = EnsureRendezvousRound(*job, job->round());
      if (!ready.ok()) {
        log_.WithJob(job->job_id()).Error("rendezvous round {}: {}", job->round(), ready.ToString());
        return;
      }
      // Join every eligible node on its behalf; the core closes the round.
      for (const auto& id : EligibleNodes(*job)) {
        if (rt.joined.count(id)) continue;
        rt.joined.insert(id);
        rendezvous::JoinRequest req;
        req.job_id = JobId(job->job_id());
        req.node_id = NodeId(id);
        req.incarnation = Incarnation(nodes_.at(id).info.incarnation());
        req.nproc_per_node = spec.nproc_per_node();
        req.round = job->round();
        req.address = nodes_.at(id).info.agent_address();
        std::string job_id = job->job_id();
        rendezvous_->Join(req, MonoTime::max(),
                          [this, job_id, id](StatusOr<rendezvous::RendezvousResult> r) {
                            std::lock_guard<std::mutex> lock(events_mu_);
                            events_.push_back({job_id, id, std::move(r)});
                          });
      }
      if (spec.join_timeout_s() > 0 && now - rt.round_opened >= FromSeconds(spec.join_timeout_s())) {
        SetState(job, v1::JOB_STATE_FAILED,
                 absl::StrCat("rendezvous round ", job->round(), ": fewer than min ",
                              spec.min_nodes(), " nodes within join timeout ",
                              spec.join_timeout_s(), "s"));
      }
      return;
    }
    case v1::JOB_STATE_RUNNING:
      break;
    default:
      return;
  }
  // RUNNING: elastic scale-up when a new node could join.
  if (job->node_ids_size() >= spec.max_nodes()) return;
  for (const auto& id : EligibleNodes(*job)) {
    if (std::find(job->node_ids().begin(), job->node_ids().end(), id) != job->node_ids().end()) {
      continue;
    }
    v1::Failure f;
    f.set_rank(-1);
    f.set_node_id(id);
    f.set_round(job->round());
    f.set_reason(absl::StrCat("node ", id, " joined (", job->node_ids_size(), " of max ",
                              spec.max_nodes(), " nodes)"));
    HandleFailure(job, f, /*counts=*/false);
    return;
  }
}

void Coordinator::Tick() {
  std::vector<Notification> notify;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rendezvous_->AdvanceTimers();
    DrainRendezvous(&notify);
    MonoTime now = clock_->Now();
    for (auto& [id, node] : nodes_) {
      if (node.alive && now - node.last_heartbeat > options_.lease) {
        DeclareDead(&node,
                    absl::StrCat("no heartbeat for ", ToSeconds(now - node.last_heartbeat),
                                 "s (lease ", ToSeconds(options_.lease), "s)"),
                    &notify);
      }
    }
    for (const auto& id : job_order_) {
      v1::Job& job = jobs_.at(id);
      if (IsTerminal(job.state())) continue;
      v1::Job before = job;
      TickJob(&job, &notify);
      (void)CommitJob(before, &job, &notify);
    }
    DrainRendezvous(&notify);  // rounds that closed inline during the joins
  }
  Deliver(&notify);
}

Status Coordinator::EnsureRendezvousRound(const v1::Job& job, int round) {
  JobRuntime& rt = runtime_[job.job_id()];
  JobId id(job.job_id());
  if (!rt.rendezvous_created) {
    rendezvous::RendezvousJobConfig config;
    config.job_id = id;
    config.min_nodes = job.spec().min_nodes();
    config.max_nodes = job.spec().max_nodes();
    config.nproc_per_node = job.spec().nproc_per_node();
    config.last_call_timeout = FromSeconds(job.spec().last_call_timeout_s());
    Status s = rendezvous_->CreateJob(config);
    if (s.code() == absl::StatusCode::kAlreadyExists) {
      (void)rendezvous_->RemoveJob(id);
      s = rendezvous_->CreateJob(config);
    }
    RETURN_IF_ERROR(s);
    rt.rendezvous_created = true;
    rt.joined.clear();
  }
  ASSIGN_OR_RETURN(rendezvous::RendezvousState state, rendezvous_->GetState(id));
  while (state.round < round) {
    ASSIGN_OR_RETURN(state.round, rendezvous_->OpenNextRound(id));
    rt.joined.clear();
  }
  if (state.round != round) {
    return absl::InternalError(absl::StrCat("job ", job.job_id(), ": rendezvous is at round ",
                                            state.round, ", coordinator at ", round));
  }
  return absl::OkStatus();
}

void Coordinator::ForgetRendezvous(const std::string& job_id) {
  JobRuntime& rt = runtime_[job_id];
  if (!rt.rendezvous_created) return;
  rt.rendezvous_created = false;
  rt.joined.clear();
  (void)rendezvous_->RemoveJob(JobId(job_id));
}

void Coordinator::DrainRendezvous(std::vector<Notification>* notify) {
  std::vector<RendezvousEvent> events;
  {
    std::lock_guard<std::mutex> lock(events_mu_);
    events.swap(events_);
  }
  for (auto& e : events) {
    auto it = jobs_.find(e.job_id);
    if (it == jobs_.end()) continue;
    v1::Job& job = it->second;
    if (!e.result.ok()) {
      // Withdrawn (dead, timed out, superseded): join again if still eligible.
      runtime_[e.job_id].joined.erase(e.node_id);
      log_.WithJob(e.job_id).Debug("rendezvous join of node {} ended: {}", e.node_id,
                                   e.result.status().ToString());
      continue;
    }
    const rendezvous::RendezvousResult& r = *e.result;
    if (job.state() != v1::JOB_STATE_RENDEZVOUS || job.round() != r.round ||
        job.node_ids_size() > 0) {
      continue;  // stale round, or this close was already applied
    }
    v1::Job before = job;
    std::string unknown;
    for (const auto& n : r.node_ids) {
      if (!nodes_.count(n.value())) unknown = n.value();
    }
    if (!unknown.empty()) {
      // Joined through RendezvousService without being an agent here: no
      // one would start its ranks. Drop it and run another round.
      (void)rendezvous_->MarkNodesDead(JobId(e.job_id), {NodeId(unknown)});
      for (const auto& n : r.node_ids) job.add_node_ids(n.value());
      v1::Failure f;
      f.set_rank(-1);
      f.set_node_id(unknown);
      f.set_round(job.round());
      f.set_reason(absl::StrCat("round ", job.round(), " included node ", unknown,
                                ", which is not a registered agent"));
      HandleFailure(&job, f, /*counts=*/false);
      (void)CommitJob(before, &job, notify);
      continue;
    }
    for (const auto& n : r.node_ids) job.add_node_ids(n.value());
    job.set_world_size(r.world_size);
    std::vector<std::string> names(job.node_ids().begin(), job.node_ids().end());
    AddEvent(&job, absl::StrCat("round ", job.round(), " closed: nodes [", absl::StrJoin(names, ", "),
                                "], world size ", job.world_size()));
    job.set_message(absl::StrCat("round ", job.round(), " closed; starting ", job.world_size(),
                                 " workers"));
    (void)CommitJob(before, &job, notify);
  }
}

}  // namespace daemon
}  // namespace lockstep
