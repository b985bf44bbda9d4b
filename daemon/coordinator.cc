#include "daemon/coordinator.h"

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <google/protobuf/util/message_differencer.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/address.h"
#include "common/ids.h"
#include "daemon/job_env.h"
#include "daemon/job_spec.h"
#include "rendezvous/store.h"

namespace lockstep {
namespace daemon {
namespace {

using google::protobuf::util::MessageDifferencer;

// Collects the names of the top-level fields two messages differ in.
class DifferingFields : public MessageDifferencer::Reporter {
 public:
  void ReportAdded(const google::protobuf::Message&, const google::protobuf::Message&,
                   const std::vector<MessageDifferencer::SpecificField>& path) override {
    Add(path);
  }
  void ReportDeleted(const google::protobuf::Message&, const google::protobuf::Message&,
                     const std::vector<MessageDifferencer::SpecificField>& path) override {
    Add(path);
  }
  void ReportModified(const google::protobuf::Message&, const google::protobuf::Message&,
                      const std::vector<MessageDifferencer::SpecificField>& path) override {
    Add(path);
  }
  const std::set<std::string>& names() const { return names_; }

 private:
  void Add(const std::vector<MessageDifferencer::SpecificField>& path) {
    if (!path.empty() && path[0].field != nullptr) names_.insert("spec." + path[0].field->name());
  }
  std::set<std::string> names_;
};

// Bound on a registering node's hostname: stored, logged and shown by
// `lockstep nodes` (its address: IsDialableAddress).
constexpr size_t kMaxNodeFieldBytes = 256;

// A request id names one submission: sending it again (a retry) returns
// the job it made, but only for the same spec; another spec under it would
// otherwise be dropped without a word.
Status SameSubmission(const v1::Job& job, const v1::JobSpec& full_spec) {
  DifferingFields fields;
  MessageDifferencer differ;
  differ.ReportDifferencesTo(&fields);
  if (differ.Compare(job.spec(), full_spec)) return absl::OkStatus();
  return absl::AlreadyExistsError(absl::StrCat(
      "request_id ", QuoteForError(job.request_id()), " was already used by job ", job.job_id(),
      " with a different spec (", absl::StrJoin(fields.names(), ", "),
      " differ): a request id resubmits only the same spec; use a new request id"));
}

// Submit order (job_order_'s): oldest first, ties by job id.
void SortBySubmitOrder(std::vector<v1::Job>* jobs) {
  std::sort(jobs->begin(), jobs->end(), [](const v1::Job& a, const v1::Job& b) {
    return std::make_pair(a.submitted_unix_ms(), a.job_id()) <
           std::make_pair(b.submitted_unix_ms(), b.job_id());
  });
}

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options, Clock* clock, JobStore* store)
    : options_(std::move(options)),
      clock_(clock),
      store_(store),
      machine_(JobMachineOptions{options_.restart_backoff, options_.max_restart_backoff}, clock),
      nodes_(options_.lease, options_.heartbeat_interval) {
  store_address_ = options_.store_address;
}

void Coordinator::SetStoreAddress(const std::string& address) {
  MutexLock lock(&mu_);
  store_address_ = address;
}

Status Coordinator::Recover() {
  ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, store_->LoadJobs());
  ASSIGN_OR_RETURN(std::vector<v1::NodeInfo> nodes, store_->LoadNodes());
  ASSIGN_OR_RETURN(auto dir_deletions, store_->LoadDirDeletions());
  SortBySubmitOrder(&jobs);
  MutexLock lock(&mu_);
  size_t deletions = 0;
  for (const auto& [node, ids] : dir_deletions) deletions += ids.size();
  deleted_for_node_ = std::move(dir_deletions);
  const MonoTime now = clock_->Now();
  for (auto& job : jobs) {
    std::string id = job.job_id();
    job_order_.push_back(id);
    if (JobMachine::IsTerminal(job.state())) finished_by_time_.emplace(job.finished_unix_ms(), id);
    jobs_[id].current = machine_.Recovered(std::move(job));
  }
  for (const auto& info : nodes) nodes_.Restore(info, now);  // a full lease from now
  (void)nodes_.CompensateStall(now);  // the first tick measures from the reload
  log_.Info("recovered {} jobs, {} nodes and {} job directories still to delete from the job store",
            jobs_.size(), nodes.size(), deletions);
  EvictFinished();
  return absl::OkStatus();
}

void Coordinator::EvictFinished() {
  int finished = 0;
  for (const auto& id : job_order_) {
    if (JobMachine::IsTerminal(jobs_.at(id).current.job.state())) ++finished;
  }
  int excess = finished - std::max(0, options_.finished_jobs_in_memory);
  if (excess <= 0) return;
  std::vector<std::string> kept;
  for (auto& id : job_order_) {
    auto it = jobs_.find(id);
    const v1::Job& job = it->second.current.job;
    if (excess > 0 && JobMachine::IsTerminal(job.state())) {
      --excess;
      evicted_[id] = it->second.version;
      ++evicted_by_state_[job.state()];
      if (!job.request_id().empty()) evicted_requests_[job.request_id()] = id;
      jobs_.erase(it);
    } else {
      kept.push_back(std::move(id));
    }
  }
  job_order_ = std::move(kept);
}

StatusOr<std::pair<v1::Job, int64_t>> Coordinator::FindJob(const std::string& id) const {
  auto it = jobs_.find(id);
  if (it != jobs_.end()) return std::make_pair(it->second.current.job, it->second.version);
  auto evicted = evicted_.find(id);
  if (evicted == evicted_.end()) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  ASSIGN_OR_RETURN(std::optional<v1::Job> job, store_->LoadJob(id));
  if (!job) {
    return absl::DataLossError(absl::StrCat("job ", id, " finished but is missing from the job store"));
  }
  return std::make_pair(std::move(*job), evicted->second);
}

Status Coordinator::Commit(const std::string& id, JobDraft next, Effects* effects,
                          Retry retry) {
  JobEntry& entry = jobs_.at(id);
  JobMachine::MirrorRound(&next.job);
  if (next.job.state() != v1::JOB_STATE_RUNNING) {
    // Health describes a running job: a job that stopped running (however:
    // a node lost, a cancel, a tick) keeps none, nor its tracker entry.
    next.job.clear_health();
    health_.Forget(id);
  }
  const v1::Job& before = entry.current.job;
  const bool changed = !MessageDifferencer::Equals(before, next.job);
  if (changed) {
    Status s = store_->PutJob(next.job);
    if (!s.ok()) {
      // A tick recomputes the same change 10 times a second, and every
      // heartbeat of a node its reports: log it then at most every few
      // seconds.
      const MonoTime now = clock_->Now();
      if (retry == Retry::kNone || !entry.persist_error_logged ||
          now - *entry.persist_error_logged >= kPersistErrorLogInterval) {
        entry.persist_error_logged = now;
        const std::string what =
            next.job.state() != before.state()
                ? absl::StrCat(" (to ", JobMachine::StateName(next.job.state()), ")")
                : "";
        const char* again = retry == Retry::kEveryTick    ? " (retried every tick)"
                            : retry == Retry::kNextReport ? " (made again from the next report)"
                                                          : "";
        log_.WithJob(id).Error("persisting the job failed, change{} discarded{}: {}", what, again,
                               s.ToString());
      }
      return s;
    }
    for (const ChangeLine& line : next.changes) {
      log_.WithJob(id).WithRank(line.rank).Info("{}", line.text);
    }
    const int old_round = before.current_round().number();
    if (next.job.current_round().number() > old_round && old_round > 0) {
      effects->drop_prefixes.push_back(rendezvous::StoreNamespace(id, old_round));
    }
    if (JobMachine::IsTerminal(next.job.state()) && !JobMachine::IsTerminal(before.state())) {
      if (options_.close_store_job) {
        effects->closed_jobs.push_back(id);
      } else {
        effects->drop_prefixes.push_back(id + "/");
      }
      finished_by_time_.emplace(next.job.finished_unix_ms(), id);
    }
  }
  next.changes.clear();
  entry.current = std::move(next);
  if (!changed) return absl::OkStatus();
  ++entry.version;
  for (auto it = watches_.begin(); it != watches_.end();) {
    if (it->second.job_id == id && it->second.after_version < entry.version) {
      effects->notify.push_back({std::move(it->second.cb), {entry.current.job, entry.version}});
      it = watches_.erase(it);
    } else {
      ++it;
    }
  }
  return absl::OkStatus();
}

void Coordinator::Run(Effects* effects) {
  for (auto& [cb, snapshot] : effects->notify) cb(snapshot.first, snapshot.second);
  if (options_.drop_store_prefix) {
    for (const auto& prefix : effects->drop_prefixes) options_.drop_store_prefix(prefix);
  }
  if (options_.close_store_job) {
    for (const auto& id : effects->closed_jobs) options_.close_store_job(id);
  }
  effects->notify.clear();
  effects->drop_prefixes.clear();
  effects->closed_jobs.clear();
}

StatusOr<v1::Job> Coordinator::SubmitJob(const v1::JobSpec& spec, const std::string& request_id) {
  if (!request_id.empty() && !IsSafeId(request_id)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request_id ", QuoteForError(request_id), ": must be [A-Za-z0-9._-]{1,128}"));
  }
  RETURN_IF_ERROR(ValidateJobSpec(spec, options_.allowed_commands));
  RETURN_IF_ERROR(CheckJobEnv(spec, {options_.allowed_env, !options_.allowed_commands.empty()}));
  v1::JobSpec full = spec;
  ApplyJobSpecDefaults(&full);
  Effects effects;
  v1::Job result;
  {
    MutexLock lock(&mu_);
    if (!request_id.empty()) {
      for (const auto& [id, entry] : jobs_) {
        if (entry.current.job.request_id() == request_id) {
          RETURN_IF_ERROR(SameSubmission(entry.current.job, full));
          return entry.current.job;
        }
      }
      auto evicted = evicted_requests_.find(request_id);
      if (evicted != evicted_requests_.end()) {
        ASSIGN_OR_RETURN(auto found, FindJob(evicted->second));
        RETURN_IF_ERROR(SameSubmission(found.first, full));
        return found.first;
      }
    }
    std::string id;
    do {
      id = NewRandomId("j-");
    } while (jobs_.count(id) || evicted_.count(id));
    // No round yet, so no mirror fields to write (Commit writes them).
    JobDraft draft = machine_.NewJob(id, full, request_id);
    Status s = store_->PutJob(draft.job);
    if (!s.ok()) {
      log_.WithJob(id).Error("persisting the submitted job failed, not accepted: {}", s.ToString());
      return s;
    }
    jobs_[id].current = draft;
    job_order_.push_back(id);
    log_.WithJob(id).Info("submitted: {} nodes {}:{} x {} procs, max_restarts {}",
                          absl::StrJoin(spec.command(), " "), full.min_nodes(), full.max_nodes(),
                          full.nproc_per_node(), full.max_restarts());
    // Open the first round at once if nodes are there. The job is accepted
    // (persisted) either way; a failed write here is logged by Commit and
    // the next tick tries again.
    machine_.Advance(&draft, nodes_);
    (void)Commit(id, std::move(draft), &effects);
    result = jobs_.at(id).current.job;
  }
  Run(&effects);
  return result;
}

StatusOr<v1::Job> Coordinator::GetJob(const JobId& id) const {
  MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(auto found, FindJob(id.value()));
  return std::move(found.first);
}

Status Coordinator::CheckStoreOpen(const std::string& job_id) const {
  MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    // Active jobs never leave memory: this one ended long ago, was deleted
    // or never existed.
    return absl::FailedPreconditionError(absl::StrCat("store: no running job ", QuoteForError(job_id),
                                            " (it ended, was deleted or never existed)"));
  }
  const v1::Job& job = it->second.current.job;
  if (JobMachine::IsTerminal(job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("store: job ", QuoteForError(job_id), " has ended (",
                     JobMachine::StateName(job.state()),
                     "): its store takes no more calls"));
  }
  return absl::OkStatus();
}

StatusOr<std::pair<v1::Job, int64_t>> Coordinator::GetJobVersion(const JobId& id) const {
  MutexLock lock(&mu_);
  return FindJob(id.value());
}

StatusOr<int64_t> Coordinator::WatchOnce(const JobId& id, int64_t after_version, JobCallback cb) {
  v1::Job snapshot;
  int64_t version;
  {
    MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(auto found, FindJob(id.value()));
    version = found.second;
    if (version <= after_version) {
      // (A finished job never changes again: such a watch waits for Unwatch.)
      int64_t handle = next_watch_++;
      watches_[handle] = Watch{id.value(), after_version, std::move(cb)};
      return handle;
    }
    snapshot = std::move(found.first);
  }
  cb(snapshot, version);
  return 0;
}

bool Coordinator::Unwatch(int64_t handle) {
  MutexLock lock(&mu_);
  return watches_.erase(handle) > 0;
}

StatusOr<std::vector<v1::Job>> Coordinator::ListJobs(const std::vector<v1::JobState>& states) const {
  auto wanted = [&](const v1::Job& job) {
    return states.empty() || std::find(states.begin(), states.end(), job.state()) != states.end();
  };
  MutexLock lock(&mu_);
  std::vector<v1::Job> out;
  bool finished_wanted = states.empty();
  for (v1::JobState s : states) finished_wanted = finished_wanted || JobMachine::IsTerminal(s);
  if (!evicted_.empty() && finished_wanted) {
    // Some finished jobs live only in the store: list from it, in submit
    // order, with the in-memory (newer) copy of each job that has one.
    ASSIGN_OR_RETURN(std::vector<v1::Job> stored, store_->LoadJobs());
    SortBySubmitOrder(&stored);
    for (auto& job : stored) {
      auto it = jobs_.find(job.job_id());
      if (it != jobs_.end()) job = it->second.current.job;
      if (wanted(job)) out.push_back(std::move(job));
    }
    return out;
  }
  for (const auto& id : job_order_) {
    const v1::Job& job = jobs_.at(id).current.job;
    if (wanted(job)) out.push_back(job);
  }
  return out;
}

StatusOr<v1::Job> Coordinator::CancelJob(const JobId& id) {
  Effects effects;
  v1::Job result;
  {
    MutexLock lock(&mu_);
    auto it = jobs_.find(id.value());
    if (it == jobs_.end()) {
      // Out of memory means finished long enough ago (or never submitted).
      ASSIGN_OR_RETURN(auto found, FindJob(id.value()));
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id.value(), " already finished as ", JobMachine::StateName(found.first.state())));
    }
    JobDraft draft = it->second.current;
    if (JobMachine::IsTerminal(draft.job.state())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id.value(), " already finished as ", JobMachine::StateName(draft.job.state())));
    }
    machine_.Cancel(&draft);
    RETURN_IF_ERROR(Commit(id.value(), std::move(draft), &effects));
    result = it->second.current.job;
  }
  Run(&effects);
  return result;
}

StatusOr<v1::Job> Coordinator::DeleteJob(const JobId& id) {
  MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(auto found, FindJob(id.value()));
  const v1::Job& job = found.first;
  if (!JobMachine::IsTerminal(job.state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", id.value(), " is ", JobMachine::StateName(job.state()),
        ": only a finished job can be deleted (cancel it first)"));
  }
  RETURN_IF_ERROR(DeleteLocked(job, "on request"));
  return job;
}

Status Coordinator::DeleteLocked(const v1::Job& job, absl::string_view why) {
  const std::string id = job.job_id();
  // Every node may hold the job's directory from some round: tell them all
  // (at their next heartbeat, even across a coordinator restart).
  std::vector<std::string> dir_on_nodes;
  for (const auto& node : nodes_.List(clock_->Now())) {
    const auto pending = deleted_for_node_.find(node.node_id());
    if (pending == deleted_for_node_.end() || pending->second.size() < kMaxPendingDeletesPerNode) {
      dir_on_nodes.push_back(node.node_id());
    }
  }
  Status s = store_->DeleteJob(id, dir_on_nodes);
  if (!s.ok()) {
    log_.WithJob(id).Error("deleting the job from the job store failed, job kept: {}", s.ToString());
    return s;
  }
  jobs_.erase(id);
  job_order_.erase(std::remove(job_order_.begin(), job_order_.end(), id), job_order_.end());
  if (evicted_.erase(id) > 0) --evicted_by_state_[job.state()];
  if (!job.request_id().empty()) evicted_requests_.erase(job.request_id());
  ForgetFinished(job.finished_unix_ms(), id);
  for (const auto& node : dir_on_nodes) deleted_for_node_[node].insert(id);
  log_.WithJob(id).Info("job deleted {} (it had {}); its directory goes from {} node(s)", std::string(why),
                        JobMachine::StateName(job.state()), dir_on_nodes.size());
  return absl::OkStatus();
}

void Coordinator::ForgetFinished(int64_t finished_unix_ms, const std::string& id) {
  auto [first, last] = finished_by_time_.equal_range(finished_unix_ms);
  for (auto it = first; it != last; ++it) {
    if (it->second == id) {
      finished_by_time_.erase(it);
      return;
    }
  }
}

void Coordinator::SweepRetention() {
  if (options_.finished_job_retention <= Duration::zero()) return;
  const int64_t cutoff =
      clock_->UnixMillis() -
      std::chrono::duration_cast<std::chrono::milliseconds>(options_.finished_job_retention).count();
  const std::vector<std::pair<int64_t, std::string>> expired(
      finished_by_time_.begin(), finished_by_time_.upper_bound(cutoff));
  for (const auto& [finished_ms, id] : expired) {
    auto found = FindJob(id);
    if (!found.ok()) {
      // Gone already (or unreadable): forget it rather than retry forever.
      log_.WithJob(id).Warn("retention: cannot read the job, not deleted: {}",
                            found.status().ToString());
      ForgetFinished(finished_ms, id);
      continue;
    }
    if (!DeleteLocked(found->first, "by retention").ok()) return;  // retried on the next sweep
  }
}

Status Coordinator::NodeLost(const std::string& node_id, const std::string& reason,
                             Effects* effects) {
  Status first_error;
  for (const auto& id : job_order_) {
    const JobDraft& current = jobs_.at(id).current;
    if (JobMachine::NodeRank(current.job, node_id) < 0) continue;
    JobDraft draft = current;
    machine_.NodeLost(&draft, node_id, reason);
    Status s = Commit(id, std::move(draft), effects);
    if (first_error.ok()) first_error = s;
  }
  return first_error;
}

Status Coordinator::ApplyReports(const std::string& node_id, const NodeTable::Reports& reports,
                                 int64_t sent_mono_ns, Effects* effects) {
  Status first_error;
  // When the agent sent this, on our clock: its exits are placed from there.
  const MonoTime receipt = nodes_.PlaceAgentInstant(node_id, clock_->Now(), sent_mono_ns);
  for (const auto& report : reports) {
    auto it = jobs_.find(report.job_id());
    if (it == jobs_.end()) continue;
    JobDraft draft = it->second.current;
    machine_.ApplyReport(&draft, node_id, report, receipt, sent_mono_ns);
    health_.Update(&draft.job, node_id, report, receipt, sent_mono_ns, clock_->Now());
    Status s = Commit(report.job_id(), std::move(draft), effects, Retry::kNextReport);
    if (first_error.ok()) first_error = s;
  }
  return first_error;
}

StatusOr<v1::RegisterNodeResponse> Coordinator::RegisterNode(const v1::RegisterNodeRequest& req) {
  if (!IsSafeId(req.node_id())) {
    return absl::InvalidArgumentError(
        absl::StrCat("node_id ", QuoteForError(req.node_id()), ": must be [A-Za-z0-9._-]{1,128}"));
  }
  if (!IsSafeId(req.incarnation())) {
    return absl::InvalidArgumentError(absl::StrCat("node ", req.node_id(), ": incarnation ",
                                                   QuoteForError(req.incarnation()),
                                                   ": must be [A-Za-z0-9._-]{1,128}"));
  }
  if (!IsDialableAddress(req.agent_address())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node ", req.node_id(), ": agent_address ", QuoteForError(req.agent_address()),
        ": must be host:port or [v6]:port (a port in 1-65535, at most ", kMaxAddressBytes,
        " bytes)"));
  }
  RETURN_IF_ERROR(CheckString(absl::StrCat("node ", req.node_id(), ": hostname"), req.hostname(),
                              kMaxNodeFieldBytes, /*single_line=*/true));
  Effects effects;
  Status s, reports;
  {
    MutexLock lock(&mu_);
    s = RegisterLocked(req, &effects, &reports);
  }
  Run(&effects);
  RETURN_IF_ERROR(s);
  v1::RegisterNodeResponse resp;
  resp.set_lease_s(ToSeconds(options_.lease));
  resp.set_heartbeat_interval_s(ToSeconds(options_.heartbeat_interval));
  if (!reports.ok()) resp.set_reports_not_applied(reports.ToString());  // as in Heartbeat
  return resp;
}

Status Coordinator::RegisterLocked(const v1::RegisterNodeRequest& req, Effects* effects,
                                   Status* reports) {
  const v1::NodeInfo* known = nodes_.Find(req.node_id());
  v1::NodeInfo info;
  if (known) info = *known;
  if (known && known->incarnation() != req.incarnation()) {
    // Its old workers died with the old agent (PDEATHSIG). Fail their
    // rounds first: if a write fails, so does the registration, and the
    // agent's retry fails the rounds that are left.
    const std::string reason = absl::StrCat("agent restarted (incarnation ", known->incarnation(),
                                            " replaced by ", req.incarnation(), ")");
    RETURN_IF_ERROR(NodeLost(req.node_id(), reason, effects));
    log_.Warn("node {} declared dead: {}", req.node_id(), reason);
  }
  info.set_node_id(req.node_id());
  info.set_hostname(req.hostname());
  info.set_agent_address(req.agent_address());
  info.set_incarnation(req.incarnation());
  info.set_registered_unix_ms(clock_->UnixMillis());
  Status s = store_->PutNode(info);
  if (!s.ok()) {
    log_.Error("persisting the registration of node {} failed, not registered: {}", req.node_id(),
               s.ToString());
    return s;
  }
  nodes_.Register(info, clock_->Now(), req.jobs());
  log_.Info("node {} registered: address {} incarnation {}", req.node_id(), req.agent_address(),
            req.incarnation());
  *reports = ApplyReports(req.node_id(), req.jobs(), req.sent_mono_ns(), effects);
  return absl::OkStatus();
}

StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(const v1::HeartbeatRequest& req) {
  Effects effects;
  Status error;
  v1::HeartbeatResponse resp;
  {
    MutexLock lock(&mu_);
    RETURN_IF_ERROR(nodes_.CheckIncarnation(req.node_id(), req.incarnation()));
    if (nodes_.Renew(req.node_id(), clock_->Now(), req.jobs())) {
      log_.Info("node {} is heartbeating again", req.node_id());
    }
    error = ApplyReports(req.node_id(), req.jobs(), req.sent_mono_ns(), &effects);
    std::set<std::string> started;
    std::map<std::string, int> reported_round;
    for (const auto& report : req.jobs()) reported_round[report.job_id()] = report.round();
    for (auto& cmd : CommandsFor(req.node_id())) {
      started.insert(cmd.job_id());
      // A start of a round the node already runs (or ran) begins nothing.
      if (reported_round[cmd.job_id()] < cmd.round()) nodes_.NoteStarted(req.node_id(), cmd.job_id());
      *resp.add_commands() = std::move(cmd);
    }
    for (const auto& report : req.jobs()) {
      if (started.count(report.job_id())) continue;
      v1::AgentCommand* stop = resp.add_commands();
      stop->set_kind(v1::AgentCommand::KIND_STOP);
      stop->set_job_id(report.job_id());
      stop->set_round(report.round());
      auto job = jobs_.find(report.job_id());
      if (job != jobs_.end()) *stop->mutable_spec() = job->second.current.job.spec();
    }
    resp.set_lease_s(ToSeconds(options_.lease));
    auto deleted = deleted_for_node_.find(req.node_id());
    if (deleted != deleted_for_node_.end()) {
      std::vector<std::string> done;
      if (req.acks_deleted_job_ids()) {
        // Repeated until acknowledged: a response lost on the way loses
        // nothing, and a job the node still runs is removed once it ends.
        for (const auto& id : req.removed_job_ids()) {
          if (deleted->second.erase(id) > 0) done.push_back(id);
        }
        for (const auto& id : deleted->second) resp.add_deleted_job_ids(id);
      } else {
        // An agent that does not acknowledge hears of each deletion once.
        for (const auto& id : deleted->second) {
          resp.add_deleted_job_ids(id);
          done.push_back(id);
        }
        deleted->second.clear();
      }
      if (deleted->second.empty()) deleted_for_node_.erase(deleted);
      // Not fatal: a restarted coordinator sends them again, and the agent
      // acknowledges an absent directory at once.
      const Status cleared = done.empty() ? Status() : store_->ClearDirDeletions(req.node_id(), done);
      if (!cleared.ok()) {
        log_.Warn("node {}: forgetting {} directory deletions it acknowledged: {}", req.node_id(),
                  done.size(), cleared.ToString());
      }
    }
  }
  Run(&effects);
  // The lease is renewed whatever became of the reports: an agent that
  // cannot be told so stops its workers when the lease runs out, so a
  // failing job store would stop every job on every node.
  if (!error.ok()) resp.set_reports_not_applied(error.ToString());
  return resp;
}

std::vector<v1::AgentCommand> Coordinator::CommandsFor(const std::string& node_id) const {
  std::vector<v1::AgentCommand> out;
  if (!nodes_.Alive(node_id)) return out;
  for (const auto& id : job_order_) {
    const v1::Job& job = jobs_.at(id).current.job;
    if (job.state() != v1::JOB_STATE_RENDEZVOUS && job.state() != v1::JOB_STATE_RUNNING) continue;
    const int node_rank = JobMachine::NodeRank(job, node_id);
    if (node_rank < 0) continue;
    // Node rank 0 picks MASTER_PORT; the others wait until it reported it.
    if (node_rank > 0 && job.current_round().master_port() == 0) continue;
    v1::AgentCommand cmd;
    cmd.set_kind(v1::AgentCommand::KIND_START);
    cmd.set_job_id(id);
    cmd.set_round(job.current_round().number());
    *cmd.mutable_spec() = job.spec();
    *cmd.mutable_assignment() = AssignmentFor(job, node_rank);
    out.push_back(std::move(cmd));
  }
  return out;
}

v1::RoundAssignment Coordinator::AssignmentFor(const v1::Job& job, int node_rank) const {
  const v1::Round& round = job.current_round();
  v1::RoundAssignment a;
  a.set_job_id(job.job_id());
  a.set_round(round.number());
  a.set_node_rank(node_rank);
  a.set_num_nodes(round.node_ids_size());
  a.set_world_size(round.world_size());
  a.set_nproc_per_node(job.spec().nproc_per_node());
  *a.mutable_node_ids() = round.node_ids();
  if (const v1::NodeInfo* first = nodes_.Find(round.node_ids(0))) {
    a.set_master_addr(HostOfAddress(first->agent_address()));
  }
  a.set_master_port(round.master_port());
  a.set_store_address(store_address_);
  a.set_store_namespace(rendezvous::StoreNamespace(job.job_id(), round.number()));
  a.set_restart_count(job.restart_count());
  return a;
}

Coordinator::JobsSummary Coordinator::SummarizeJobs() const {
  MutexLock lock(&mu_);
  JobsSummary out;
  out.in_memory.reserve(job_order_.size());
  for (const auto& id : job_order_) out.in_memory.push_back(jobs_.at(id).current.job);
  out.left_memory_by_state = evicted_by_state_;
  return out;
}

std::vector<v1::NodeInfo> Coordinator::ListNodes() const {
  MutexLock lock(&mu_);
  std::vector<v1::NodeInfo> out = nodes_.List(clock_->Now());
  for (auto& info : out) {
    for (const auto& job_id : job_order_) {
      const v1::Job& job = jobs_.at(job_id).current.job;
      if (JobMachine::IsTerminal(job.state())) continue;
      const auto& ids = job.current_round().node_ids();
      if (std::find(ids.begin(), ids.end(), info.node_id()) != ids.end()) info.add_job_ids(job_id);
    }
  }
  return out;
}

void Coordinator::Tick() {
  Effects effects;
  {
    MutexLock lock(&mu_);
    const MonoTime now = clock_->Now();
    if (std::optional<Duration> gap = nodes_.CompensateStall(now)) {
      log_.Warn("the coordinator did not run for {}s (stopped or starved): every node's lease is "
                "extended by that much",
                ToSeconds(*gap));
    }
    for (const auto& expired : nodes_.ExpireLeases(now)) {
      log_.Warn("node {} declared dead: {}", expired.node_id, expired.reason);
    }
    // Advance fails the rounds of dead nodes too: level-triggered, so a
    // failed write is retried on the next tick.
    for (const auto& id : job_order_) {
      const JobDraft& current = jobs_.at(id).current;
      if (JobMachine::IsTerminal(current.job.state())) continue;
      JobDraft draft = current;
      machine_.Advance(&draft, nodes_);
      (void)Commit(id, std::move(draft), &effects, Retry::kEveryTick);
    }
    EvictFinished();
    if (now >= next_retention_sweep_) {
      SweepRetention();
      next_retention_sweep_ = now + kRetentionSweepInterval;
    }
  }
  Run(&effects);
}

}  // namespace daemon
}  // namespace lockstep
