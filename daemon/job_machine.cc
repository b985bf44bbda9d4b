#include "daemon/job_machine.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "daemon/round_planner.h"

namespace lockstep {
namespace daemon {
namespace {

constexpr char kWorkerExited[] = "worker exited";
constexpr char kWorkerStopped[] = "worker stopped by its agent (lease lost)";
// Failure.waiting_ranks gave up waiting for this rank (proto/common.proto).
constexpr char kDidNotArrive[] = "did not arrive";

bool Failed(const v1::WorkerStatus& w) {
  return w.state() == v1::WORKER_STATE_EXITED &&
         (w.exit().exit_code() != 0 || w.exit().signal() != 0);
}

std::string DescribeExit(const v1::ExitInfo& exit) {
  std::string s = exit.signal() != 0 ? absl::StrCat("killed by signal ", exit.signal())
                                     : absl::StrCat("exited with code ", exit.exit_code());
  if (exit.oom_killed()) absl::StrAppend(&s, " (out of memory: the kernel's OOM killer)");
  if (exit.startup_failure()) absl::StrAppend(&s, " (startup failure: died in the engine's bootstrap)");
  if (exit.launch_error()) absl::StrAppend(&s, " (launch error: not retried)");
  if (!exit.message().empty()) absl::StrAppend(&s, ": ", exit.message());
  return s;
}

std::string DescribeFailure(const v1::Failure& f) {
  if (f.rank() >= 0 && f.waiting_ranks_size() > 0) {
    return absl::StrCat("rank ", f.rank(), " on node ", f.node_id(),
                        " did not arrive: rank", f.waiting_ranks_size() > 1 ? "s " : " ",
                        absl::StrJoin(f.waiting_ranks(), ", "),
                        " gave up waiting for it (hung, stopped or cut off) in round ", f.round());
  }
  if (f.rank() >= 0 && f.has_exit()) {
    return absl::StrCat("rank ", f.rank(), " on node ", f.node_id(), " ", DescribeExit(f.exit()),
                        " in round ", f.round());
  }
  return absl::StrCat(f.reason(), " in round ", f.round());
}

// What a job short of nodes waits for: "waiting for nodes: 1 of 2
// registered and alive (needs --nodes 2:4, join timeout 30s)". `have`: the
// nodes that could join (NodeTable::Eligible).
std::string WaitingForNodes(const v1::JobSpec& spec, int have) {
  const std::string nodes = spec.min_nodes() == spec.max_nodes()
                                ? absl::StrCat(spec.min_nodes())
                                : absl::StrCat(spec.min_nodes(), ":", spec.max_nodes());
  return absl::StrCat("waiting for nodes: ", have, " of ", spec.min_nodes(),
                      " registered and alive (needs --nodes ", nodes,
                      spec.join_timeout_s() > 0 ? absl::StrCat(", join timeout ", spec.join_timeout_s(), "s")
                                                : "",
                      ")");
}

std::string BudgetSpent(const v1::Job& job) {
  return absl::StrCat(DescribeFailure(job.first_failure()), "; restart budget spent (",
                      job.restart_count(), " of max_restarts ", job.spec().max_restarts(), ")");
}

// The node `rank` runs on in the current round ("" when out of range).
std::string NodeOfRank(const v1::Job& job, int rank) {
  for (const auto& w : job.workers()) {
    if (w.rank() == rank && !w.node_id().empty()) return w.node_id();
  }
  const int nproc = job.spec().nproc_per_node();
  const auto& nodes = job.current_round().node_ids();
  if (nproc > 0 && rank >= 0 && rank / nproc < nodes.size()) return nodes[rank / nproc];
  return "";
}

v1::Failure WorkerFailure(const v1::WorkerStatus& w, int round, const char* reason) {
  v1::Failure f;
  f.set_rank(w.rank());
  f.set_node_id(w.node_id());
  *f.mutable_exit() = w.exit();
  f.set_round(round);
  f.set_reason(reason);
  return f;
}

}  // namespace

JobMachine::JobMachine(JobMachineOptions options, Clock* clock)
    : options_(options), clock_(clock) {}

bool JobMachine::IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

std::string JobMachine::StateName(v1::JobState state) {
  absl::string_view name = v1::JobState_Name(state);
  absl::ConsumePrefix(&name, "JOB_STATE_");
  return std::string(name);
}

int JobMachine::NodeRank(const v1::Job& job, const std::string& node_id) {
  if (!job.current_round().closed()) return -1;
  const auto& ids = job.current_round().node_ids();
  auto pos = std::find(ids.begin(), ids.end(), node_id);
  return pos == ids.end() ? -1 : static_cast<int>(pos - ids.begin());
}

void JobMachine::MirrorRound(v1::Job* job) {
  const v1::Round& r = job->current_round();
  job->set_round(r.number());
  job->set_world_size(r.world_size());
  *job->mutable_node_ids() = r.node_ids();
  job->set_master_port(r.master_port());
}

JobDraft JobMachine::NewJob(const std::string& job_id, const v1::JobSpec& spec,
                            const std::string& request_id) const {
  JobDraft d;
  d.job.set_job_id(job_id);
  *d.job.mutable_spec() = spec;
  d.job.set_request_id(request_id);
  d.job.set_submitted_unix_ms(clock_->UnixMillis());
  d.job.set_state(v1::JOB_STATE_PENDING);
  d.job.set_message("waiting for nodes");  // Advance says how many
  AddEvent(&d.job, "submitted");
  d.rt.waiting_since = clock_->Now();
  d.rt.restart_at = d.rt.waiting_since;
  return d;
}

JobDraft JobMachine::Recovered(v1::Job job) const {
  JobDraft d;
  if (!job.has_current_round() && job.round() > 0) {  // persisted before current_round
    v1::Round* r = job.mutable_current_round();
    r->set_number(job.round());
    r->set_closed(job.node_ids_size() > 0);
    *r->mutable_node_ids() = job.node_ids();
    r->set_world_size(job.world_size());
    r->set_master_port(job.master_port());
  }
  job.mutable_current_round()->set_last_call_deadline_unix_ms(0);
  d.job = std::move(job);
  d.rt.waiting_since = clock_->Now();
  d.rt.restart_at = d.rt.waiting_since;
  return d;
}

void JobMachine::AddEvent(v1::Job* job, const std::string& detail) const {
  v1::JobEvent* e = job->add_history();
  e->set_unix_ms(clock_->UnixMillis());
  e->set_state(job->state());
  e->set_round(job->current_round().number());
  e->set_detail(detail);
  e->set_restart_count(job->restart_count());
  if (job->history_size() > kMaxHistory) job->mutable_history()->DeleteSubrange(1, 1);
}

void JobMachine::SetState(JobDraft* d, v1::JobState state, const std::string& detail,
                          int rank) const {
  v1::Job* job = &d->job;
  job->set_state(state);
  job->set_message(detail);
  if (IsTerminal(state)) job->set_finished_unix_ms(clock_->UnixMillis());
  AddEvent(job, detail);
  d->changes.push_back({rank, absl::StrCat(StateName(state), " round=", job->current_round().number(),
                                           " restarts=", job->restart_count(), ": ", detail)});
}

Duration JobMachine::BackoffFor(int restart_count) const {
  Duration d = options_.restart_backoff;
  for (int i = 1; i < restart_count && d < options_.max_restart_backoff; ++i) d *= 2;
  return std::min(d, options_.max_restart_backoff);
}

MonoTime JobMachine::ExitInstant(const v1::ExitInfo& exit, MonoTime receipt,
                                 int64_t sent_mono_ns) const {
  // How long before `receipt` the worker exited, at most kMaxAgentClockSpan
  // either way (the readings are the agent's; node_table.h).
  auto placed = [receipt](std::chrono::nanoseconds ago) {
    return receipt - std::clamp<Duration>(ago, -kMaxAgentClockSpan, kMaxAgentClockSpan);
  };
  if (exit.exited_mono_ns() > 0 && sent_mono_ns > 0) {
    // Both on the agent's steady clock: how long before sending it exited.
    // The request's network delay is not known and counts as zero, so
    // exits of different nodes are ordered to within the difference of
    // their delays. (Both positive: the difference cannot overflow.)
    return placed(std::chrono::nanoseconds(sent_mono_ns - exit.exited_mono_ns()));
  }
  if (exit.exited_unix_ms() > 0) {
    // Wall clocks of different hosts agree only as well as they are synced;
    // a time ahead of ours is kept as is, so the order among one node's
    // exits survives. Clamped in milliseconds, before the conversion to
    // nanoseconds could overflow.
    const int64_t span_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(kMaxAgentClockSpan).count();
    const int64_t ago_ms = std::clamp<int64_t>(clock_->UnixMillis() - exit.exited_unix_ms(), -span_ms, span_ms);
    return placed(std::chrono::milliseconds(ago_ms));
  }
  return receipt;
}

void JobMachine::HandleFailure(JobDraft* d, const v1::Failure& failure, bool counts) const {
  v1::Job* job = &d->job;
  if (failure.exit().launch_error()) {
    const v1::JobSpec& spec = job->spec();
    const int others = job->current_round().node_ids_size() - 1;
    if (spec.min_nodes() < spec.max_nodes() && others >= spec.min_nodes() &&
        !failure.node_id().empty()) {
      // Elastic, and enough nodes without this one: it is left out (a node
      // that joined without the program, say), not the whole job failed.
      // Not counted, as a membership change; once per node incarnation.
      d->rt.launch_failed_on[failure.node_id()] = "";
      if (!job->has_first_failure() || job->first_failure().round() != job->current_round().number()) {
        *job->mutable_first_failure() = failure;
      }
      job->set_rescale_count(job->rescale_count() + 1);
      d->rt.restart_at = clock_->Now();
      SetState(d, v1::JOB_STATE_RESTARTING,
               absl::StrCat("rank ", failure.rank(), " on node ", failure.node_id(),
                            " could not be launched: ", failure.exit().message(), "; node ",
                            failure.node_id(), " left out of the job (restart its lockstepd once "
                            "fixed), which goes on with the other ", others),
               failure.rank());
      return;
    }
    // The program, its working dir or its user is wrong the same way on
    // every try: a restart would only spend the budget and the backoff.
    *job->mutable_first_failure() = failure;
    SetState(d, v1::JOB_STATE_FAILED,
             absl::StrCat("rank ", failure.rank(), " on node ", failure.node_id(),
                          " could not be launched: ", failure.exit().message(),
                          "; not retried (a restart cannot fix a launch error)"),
             failure.rank());
    return;
  }
  const std::string what = DescribeFailure(failure);
  if (!counts) {
    job->set_rescale_count(job->rescale_count() + 1);
    d->rt.restart_at = clock_->Now();
    SetState(d, v1::JOB_STATE_RESTARTING, absl::StrCat("membership change: ", what));
    return;
  }
  if (!job->has_first_failure() || job->first_failure().round() != job->current_round().number()) {
    *job->mutable_first_failure() = failure;
  }
  if (job->restart_count() >= job->spec().max_restarts()) {
    SetState(d, v1::JOB_STATE_FAILED, BudgetSpent(*job), job->first_failure().rank());
    return;
  }
  job->set_restart_count(job->restart_count() + 1);
  const Duration backoff = BackoffFor(job->restart_count());
  d->rt.restart_at = clock_->Now() + backoff;
  SetState(d, v1::JOB_STATE_RESTARTING,
           absl::StrCat("restart ", job->restart_count(), " of ", job->spec().max_restarts(),
                        " after ", what, " (backoff ", ToSeconds(backoff), "s)"),
           failure.rank());
}

void JobMachine::AttributeFailures(JobDraft* d) const {
  v1::Job* job = &d->job;
  const int round = job->current_round().number();
  if (!job->has_first_failure() || job->first_failure().round() != round) return;
  std::vector<std::pair<MonoTime, const v1::WorkerStatus*>> failed;
  const MonoTime now = clock_->Now();
  for (const auto& w : job->workers()) {
    if (!Failed(w)) continue;
    auto at = d->rt.exit_at.find(w.rank());
    failed.push_back({at != d->rt.exit_at.end() ? at->second : ExitInstant(w.exit(), now, 0), &w});
  }
  // A rank whose engine said it lost a peer (ExitInfo.peer_lost) follows
  // another's failure whatever the clocks say: the others come first, and
  // among equals the earlier exit.
  std::sort(failed.begin(), failed.end(), [](const auto& a, const auto& b) {
    return std::make_tuple(a.second->exit().peer_lost(), a.first, a.second->rank()) <
           std::make_tuple(b.second->exit().peer_lost(), b.first, b.second->rank());
  });
  v1::Failure first = job->first_failure();
  if ((first.reason() == kWorkerExited || first.reason() == kDidNotArrive) &&
      !first.exit().launch_error() && !failed.empty()) {
    // The root cause: the earliest exit that did not follow a lost peer; or,
    // when every exit did and the first names the rank it waited for, that
    // rank if it has not failed on its own (it hung, froze or never started
    // the engine, and is stopped with the job). A named rank that failed
    // having lost a peer itself was waiting too: the chain of named ranks
    // is followed to its end (rank 1 waited for 0, 0 for 2, 2 for 3: rank
    // 3), as far as it does not come back on itself.
    const v1::WorkerStatus& front = *failed.front().second;
    v1::Failure cause = WorkerFailure(front, round, kWorkerExited);
    // The failed ranks, and whom each that lost a peer named.
    std::set<int> failed_ranks;
    std::map<int, int> named;
    for (const auto& [at, w] : failed) {
      failed_ranks.insert(w->rank());
      if (w->exit().peer_lost() && w->exit().has_lost_peer()) named[w->rank()] = w->exit().lost_peer();
    }
    // Where the chain from `rank`'s named rank ends; -1: it named none, or
    // the chain comes back on itself.
    auto chain_end = [&](int rank) {
      std::set<int> seen;
      for (auto it = named.find(rank); it != named.end(); it = named.find(rank)) {
        if (!seen.insert(rank).second) return -1;
        rank = it->second;
      }
      return seen.empty() ? -1 : rank;
    };
    const int end = chain_end(front.rank());
    const int lost = end >= 0 ? end : front.exit().has_lost_peer() ? front.exit().lost_peer() : -1;
    const bool lost_failed = failed_ranks.count(lost) > 0;
    if (front.exit().peer_lost() && lost >= 0 && lost < job->current_round().world_size() &&
        !lost_failed) {
      cause = v1::Failure();
      cause.set_rank(lost);
      cause.set_node_id(NodeOfRank(*job, lost));
      cause.set_round(round);
      cause.set_reason(kDidNotArrive);
      for (const auto& [at, w] : failed) {
        if (chain_end(w->rank()) == lost) cause.add_waiting_ranks(w->rank());
      }
    }
    if (cause.rank() != first.rank() || cause.reason() != first.reason()) {
      const int was = first.rank();
      const bool was_peer_lost = first.exit().peer_lost();
      const std::string was_described = DescribeFailure(first);
      first = cause;
      *job->mutable_first_failure() = first;
      std::string why;
      if (was == first.rank()) {
        why = " (its own exit, reported after its peers gave up waiting for it)";
      } else if (was_peer_lost && !first.exit().peer_lost()) {
        why = absl::StrCat(" (rank ", was, " lost a peer)");
      } else {
        why = absl::StrCat(", which exited before rank ", was);
      }
      const std::string event =
          absl::StrCat("first failure is rank ", first.rank(), why, ": ", DescribeFailure(first));
      AddEvent(job, event);
      d->changes.push_back({first.rank(), event});
      // The state's message named the rank that gave up: name the cause.
      std::string message = job->message();
      if (absl::StrReplaceAll({{was_described, DescribeFailure(first)}}, &message) > 0) {
        job->set_message(message);
      }
    }
  }
  const std::string after = first.rank() >= 0
                                ? absl::StrCat("after rank ", first.rank(), " failed")
                                : absl::StrCat("after node ", first.node_id(), " was lost");
  job->clear_consequences();
  for (const auto& [at, w] : failed) {
    if (w->rank() == first.rank()) continue;
    v1::Failure* c = job->add_consequences();
    *c = WorkerFailure(*w, round, "");
    c->set_reason(after);
  }
}

void JobMachine::ApplyReport(JobDraft* d, const std::string& node_id,
                             const v1::AgentJobReport& report, MonoTime receipt,
                             int64_t sent_mono_ns) const {
  v1::Job* job = &d->job;
  v1::Round* round = job->mutable_current_round();
  if (report.round() != round->number()) return;  // another round: fenced off
  const int node_rank = NodeRank(*job, node_id);
  if (node_rank < 0) return;  // not a participant of this round
  const int nproc = job->spec().nproc_per_node();
  if (node_rank == 0 && report.master_port() > 0 && round->master_port() == 0) {
    round->set_master_port(report.master_port());
  }
  for (const v1::WorkerStatus& w : report.workers()) {
    if (w.rank() < node_rank * nproc || w.rank() >= (node_rank + 1) * nproc) continue;
    v1::WorkerStatus* slot = nullptr;
    for (auto& existing : *job->mutable_workers()) {
      if (existing.rank() == w.rank()) slot = &existing;
    }
    if (slot == nullptr) slot = job->add_workers();
    *slot = w;
    slot->set_node_id(node_id);
    slot->set_round(round->number());
    if (Failed(w) && !d->rt.exit_at.count(w.rank())) {
      d->rt.exit_at[w.rank()] = ExitInstant(w.exit(), receipt, sent_mono_ns);
    }
  }
  std::sort(job->mutable_workers()->begin(), job->mutable_workers()->end(),
            [](const v1::WorkerStatus& a, const v1::WorkerStatus& b) { return a.rank() < b.rank(); });

  switch (job->state()) {
    case v1::JOB_STATE_RESTARTING:
    case v1::JOB_STATE_FAILED:
      // Reports of the round that already failed: consequences, never a
      // change of state.
      AttributeFailures(d);
      return;
    case v1::JOB_STATE_RENDEZVOUS:
    case v1::JOB_STATE_RUNNING:
      break;
    default:
      return;
  }
  if (job->state() == v1::JOB_STATE_RENDEZVOUS && job->workers_size() == round->world_size()) {
    SetState(d, v1::JOB_STATE_RUNNING,
             absl::StrCat("all ", round->world_size(), " ranks started on ",
                          round->node_ids_size(), " nodes"));
  }
  const v1::WorkerStatus* earliest = nullptr;
  const v1::WorkerStatus* stopped = nullptr;
  int succeeded = 0;
  auto instant = [&](const v1::WorkerStatus& w) {
    auto at = d->rt.exit_at.find(w.rank());
    return std::make_pair(at != d->rt.exit_at.end() ? at->second : receipt, w.rank());
  };
  for (const auto& w : job->workers()) {
    if (Failed(w)) {
      if (!earliest || instant(w) < instant(*earliest)) earliest = &w;
    } else if (w.state() == v1::WORKER_STATE_EXITED) {
      ++succeeded;
    } else if (w.state() == v1::WORKER_STATE_STOPPED && !stopped) {
      stopped = &w;
    }
  }
  if (earliest) {
    HandleFailure(d, WorkerFailure(*earliest, round->number(), kWorkerExited), /*counts=*/true);
    AttributeFailures(d);
  } else if (stopped) {
    v1::Failure f = WorkerFailure(*stopped, round->number(), kWorkerStopped);
    f.mutable_exit()->set_message("stopped by its agent (could not renew its lease)");
    HandleFailure(d, f, /*counts=*/true);
    AttributeFailures(d);
  } else if (succeeded == round->world_size() && round->world_size() > 0) {
    SetState(d, v1::JOB_STATE_SUCCEEDED,
             absl::StrCat("all ", round->world_size(), " ranks exited 0"));
  }
}

void JobMachine::NodeLost(JobDraft* d, const std::string& node_id,
                          const std::string& reason) const {
  v1::Job* job = &d->job;
  if (job->state() != v1::JOB_STATE_RENDEZVOUS && job->state() != v1::JOB_STATE_RUNNING) return;
  if (NodeRank(*job, node_id) < 0) return;
  v1::Failure f;
  f.set_rank(-1);
  f.set_node_id(node_id);
  f.set_round(job->current_round().number());
  f.set_reason(absl::StrCat("node ", node_id, " lost: ", reason));
  HandleFailure(d, f, /*counts=*/true);
  AttributeFailures(d);
}

void JobMachine::Cancel(JobDraft* d) const {
  SetState(d, v1::JOB_STATE_CANCELLED, "cancelled by user");
}

void JobMachine::OpenNextRound(JobDraft* d) const {
  v1::Job* job = &d->job;
  const v1::Round& old = job->current_round();
  v1::Round next;
  next.set_number(old.number() + 1);
  next.set_opened_unix_ms(clock_->UnixMillis());
  *next.mutable_previous_node_ids() = old.closed() ? old.node_ids() : old.previous_node_ids();
  *job->mutable_current_round() = std::move(next);
  job->clear_workers();
  job->clear_consequences();
  d->rt.waiting_since = clock_->Now();
  d->rt.last_call_deadline.reset();
  d->rt.exit_at.clear();
  const v1::JobSpec& spec = job->spec();
  SetState(d, v1::JOB_STATE_RENDEZVOUS,
           absl::StrCat("round ", job->current_round().number(), " opened: waiting for ",
                        spec.min_nodes(), "..", spec.max_nodes(), " nodes"));
}

std::vector<std::string> JobMachine::EligibleFor(JobDraft* d, const NodeTable& nodes) const {
  std::vector<std::string> out = nodes.Eligible(d->job.job_id());
  auto& left_out = d->rt.launch_failed_on;
  for (auto it = left_out.begin(); it != left_out.end();) {
    const v1::NodeInfo* info = nodes.Find(it->first);
    const std::string now = info != nullptr ? info->incarnation() : "";
    if (it->second.empty()) it->second = now;  // the incarnation the launch failed on
    if (it->second != now) {
      it = left_out.erase(it);  // back as another: eligible again
      continue;
    }
    out.erase(std::remove(out.begin(), out.end(), it->first), out.end());
    ++it;
  }
  return out;
}

void JobMachine::PlanOpenRound(JobDraft* d, const NodeTable& nodes) const {
  v1::Job* job = &d->job;
  v1::Round* round = job->mutable_current_round();
  const v1::JobSpec& spec = job->spec();
  const MonoTime now = clock_->Now();
  RoundPlanInput in;
  in.previous.assign(round->previous_node_ids().begin(), round->previous_node_ids().end());
  in.eligible = EligibleFor(d, nodes);
  in.min_nodes = spec.min_nodes();
  in.max_nodes = spec.max_nodes();
  in.nproc_per_node = spec.nproc_per_node();
  in.last_call_passed = spec.last_call_timeout_s() <= 0 ||
                        (d->rt.last_call_deadline && now >= *d->rt.last_call_deadline);
  const RoundPlan plan = PlanRound(in);
  switch (plan.action) {
    case RoundPlan::Action::kWaitForNodes:
      d->rt.last_call_deadline.reset();
      round->set_last_call_deadline_unix_ms(0);
      job->set_message(absl::StrCat("round ", round->number(), " ",
                                    WaitingForNodes(spec, static_cast<int>(in.eligible.size()))));
      if (spec.join_timeout_s() > 0 && now - d->rt.waiting_since >= FromSeconds(spec.join_timeout_s())) {
        SetState(d, v1::JOB_STATE_FAILED,
                 absl::StrCat("rendezvous round ", round->number(), ": fewer than min ",
                              spec.min_nodes(), " nodes within join timeout ",
                              spec.join_timeout_s(), "s"));
      }
      return;
    case RoundPlan::Action::kWaitForLastCall:
      // MIN nodes are here: a join timeout counts from when they no longer are.
      d->rt.waiting_since = now;
      if (!d->rt.last_call_deadline) {
        const Duration last_call = FromSeconds(spec.last_call_timeout_s());
        d->rt.last_call_deadline = now + last_call;
        round->set_last_call_deadline_unix_ms(
            clock_->UnixMillis() +
            std::chrono::duration_cast<std::chrono::milliseconds>(last_call).count());
      }
      return;
    case RoundPlan::Action::kClose:
      break;
  }
  d->rt.last_call_deadline.reset();
  round->set_last_call_deadline_unix_ms(0);
  round->set_closed(true);
  for (const auto& id : plan.node_ids) round->add_node_ids(id);
  round->set_world_size(plan.world_size);
  AddEvent(job, absl::StrCat("round ", round->number(), " closed: nodes [",
                             absl::StrJoin(plan.node_ids, ", "), "], world size ",
                             plan.world_size));
  job->set_message(absl::StrCat("round ", round->number(), " closed; starting ",
                                plan.world_size, " workers"));
}

void JobMachine::Advance(JobDraft* d, const NodeTable& nodes) const {
  v1::Job* job = &d->job;
  const v1::JobSpec& spec = job->spec();
  const MonoTime now = clock_->Now();
  switch (job->state()) {
    case v1::JOB_STATE_PENDING: {
      const int have = static_cast<int>(EligibleFor(d, nodes).size());
      if (have < spec.min_nodes()) {
        job->set_message(WaitingForNodes(spec, have));
        if (spec.join_timeout_s() > 0 &&
            now - d->rt.waiting_since >= FromSeconds(spec.join_timeout_s())) {
          SetState(d, v1::JOB_STATE_FAILED,
                   absl::StrCat("no rendezvous: fewer than min ", spec.min_nodes(),
                                " nodes within join timeout ", spec.join_timeout_s(), "s"));
        }
        return;
      }
      OpenNextRound(d);
      PlanOpenRound(d, nodes);
      return;
    }
    case v1::JOB_STATE_RESTARTING:
      if (now < d->rt.restart_at) return;
      // The gate: no participant may still run a worker of the old round.
      for (const auto& id : job->current_round().node_ids()) {
        if (!nodes.OwnersGone(id, job->job_id(), now)) return;
      }
      OpenNextRound(d);
      PlanOpenRound(d, nodes);
      return;
    case v1::JOB_STATE_RENDEZVOUS:
    case v1::JOB_STATE_RUNNING:
      if (!job->current_round().closed()) {
        PlanOpenRound(d, nodes);
        return;
      }
      // A participant whose lease expired: the round failed.
      for (const auto& id : job->current_round().node_ids()) {
        if (!nodes.Alive(id)) {
          NodeLost(d, id, nodes.DeathReason(id));
          return;
        }
      }
      if (job->state() == v1::JOB_STATE_RENDEZVOUS) return;
      break;
    default:
      return;
  }
  // RUNNING: elastic scale-up when another node could join.
  const v1::Round& round = job->current_round();
  if (round.node_ids_size() >= spec.max_nodes()) return;
  for (const auto& id : EligibleFor(d, nodes)) {
    if (std::find(round.node_ids().begin(), round.node_ids().end(), id) != round.node_ids().end()) {
      continue;
    }
    v1::Failure f;
    f.set_rank(-1);
    f.set_node_id(id);
    f.set_round(round.number());
    f.set_reason(absl::StrCat("node ", id, " joined (", round.node_ids_size(), " of max ",
                              spec.max_nodes(), " nodes)"));
    HandleFailure(d, f, /*counts=*/false);
    return;
  }
}

}  // namespace daemon
}  // namespace lockstep
