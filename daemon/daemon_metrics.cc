#include "daemon/daemon_metrics.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>

#include <atomic>
#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/agent.h"
#include "daemon/coordinator.h"
#include "daemon/job_machine.h"

namespace lockstep {
namespace daemon {
namespace {

using google::protobuf::FieldDescriptor;

bool IsLive(v1::JobState s) {
  return s == v1::JOB_STATE_PENDING || s == v1::JOB_STATE_RENDEZVOUS ||
         s == v1::JOB_STATE_RUNNING || s == v1::JOB_STATE_RESTARTING;
}


bool IsNumeric(const FieldDescriptor* f) {
  if (f->is_repeated()) return false;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT:
    case FieldDescriptor::CPPTYPE_BOOL:
      return true;
    default:
      return false;
  }
}

double NumericValue(const google::protobuf::Message& m, const FieldDescriptor* f) {
  const google::protobuf::Reflection* r = m.GetReflection();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: return r->GetInt32(m, f);
    case FieldDescriptor::CPPTYPE_INT64: return static_cast<double>(r->GetInt64(m, f));
    case FieldDescriptor::CPPTYPE_UINT32: return r->GetUInt32(m, f);
    case FieldDescriptor::CPPTYPE_UINT64: return static_cast<double>(r->GetUInt64(m, f));
    case FieldDescriptor::CPPTYPE_DOUBLE: return r->GetDouble(m, f);
    case FieldDescriptor::CPPTYPE_FLOAT: return r->GetFloat(m, f);
    case FieldDescriptor::CPPTYPE_BOOL: return r->GetBool(m, f) ? 1 : 0;
    default: return 0;
  }
}

bool Recent(const v1::Job& job, int64_t now_unix_ms) {
  if (IsLive(job.state())) return true;
  const int64_t window_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(kRecentJobWindow).count();
  return job.finished_unix_ms() > 0 && now_unix_ms - job.finished_unix_ms() <= window_ms;
}

MetricFamily Family(std::string name, std::string help, MetricType type = MetricType::kGauge) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

// Canonical names of grpc::StatusCode values, as gRPC spells them.
const char* const kCodeNames[] = {
    "OK",        "CANCELLED",          "UNKNOWN",           "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED", "NOT_FOUND",  "ALREADY_EXISTS",    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL",       "UNAVAILABLE",       "DATA_LOSS",
    "UNAUTHENTICATED"};

}  // namespace

std::pair<std::string, double> RankMetricName(const std::string& field) {
  std::string name = field;
  double scale = 1;
  if (absl::EndsWith(name, "_ms")) {
    name = name.substr(0, name.size() - 3) + "_seconds";
    scale = 0.001;
  } else if (absl::EndsWith(name, "_per_s")) {
    name += "econd";  // _per_s -> _per_second
  }
  return {"lockstep_rank_" + name, scale};
}

void AppendRankMetrics(const std::vector<v1::Job>& jobs, std::vector<MetricFamily>* out) {
  const google::protobuf::Descriptor* d = v1::RankProgress::descriptor();
  struct Field {
    const FieldDescriptor* field;
    double scale;
    size_t index;  // into *out
  };
  std::vector<Field> fields;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    // reported_mono_ns is an agent's steady clock: a number of no meaning here.
    if (f->name() == "rank" || f->name() == "reported_mono_ns" || !IsNumeric(f)) continue;
    auto [name, scale] = RankMetricName(f->name());
    fields.push_back({f, scale, out->size()});
    out->push_back(Family(
        name, absl::StrCat("RankProgress.", f->name(), " last reported by each rank of a running job",
                           scale != 1 ? " (converted from milliseconds)" : "")));
  }
  for (const v1::Job& job : jobs) {
    if (job.state() != v1::JOB_STATE_RUNNING) continue;
    for (const v1::WorkerStatus& w : job.workers()) {
      if (w.round() != job.round() || !w.has_progress()) continue;
      const Labels labels = {{"job_id", job.job_id()},
                             {"rank", std::to_string(w.rank())},
                             {"node", w.node_id()}};
      for (const Field& f : fields) {
        (*out)[f.index].Add(labels, NumericValue(w.progress(), f.field) * f.scale);
      }
    }
  }
}

void AppendJobMetrics(const std::vector<v1::Job>& jobs, int64_t now_unix_ms,
                      std::vector<MetricFamily>* out,
                      const std::map<v1::JobState, int64_t>& left_memory) {
  std::map<v1::JobState, int64_t> by_state;
  for (int s = v1::JobState_MIN; s <= v1::JobState_MAX; ++s) {
    if (v1::JobState_IsValid(s) && s != v1::JOB_STATE_UNSPECIFIED) by_state[v1::JobState(s)] = 0;
  }
  MetricFamily restarts = Family("lockstep_job_restarts_total",
                                 "Restarts of a live or recently finished job (failure-driven "
                                 "rounds, counted against --max-restarts)",
                                 MetricType::kCounter);
  MetricFamily world = Family("lockstep_job_world_size",
                              "World size of the current round of a live or recently finished job");
  MetricFamily state = Family("lockstep_job_state",
                              "1 for the current state of a live or recently finished job "
                              "(labels job_id, state)");
  for (const auto& [s, n] : left_memory) by_state[s] += n;
  for (const v1::Job& job : jobs) {
    ++by_state[job.state()];
    if (!Recent(job, now_unix_ms)) continue;
    state.Add({{"job_id", job.job_id()}, {"state", JobMachine::StateName(job.state())}}, 1);
    restarts.Add({{"job_id", job.job_id()}}, job.restart_count());
    world.Add({{"job_id", job.job_id()}}, job.world_size());
  }
  MetricFamily states = Family("lockstep_jobs", "Jobs in the coordinator's table, by state");
  for (const auto& [state, n] : by_state) states.Add({{"state", JobMachine::StateName(state)}}, n);
  out->push_back(std::move(states));
  out->push_back(std::move(state));
  out->push_back(std::move(restarts));
  out->push_back(std::move(world));
}

void AppendNodeMetrics(const std::vector<v1::NodeInfo>& nodes, std::vector<MetricFamily>* out) {
  int alive = 0;
  for (const v1::NodeInfo& n : nodes) alive += n.alive() ? 1 : 0;
  MetricFamily a = Family("lockstep_nodes_alive", "Nodes whose lease is current");
  a.Add({}, alive);
  MetricFamily k = Family("lockstep_nodes_known", "Nodes the coordinator knows, alive or not");
  k.Add({}, static_cast<double>(nodes.size()));
  out->push_back(std::move(a));
  out->push_back(std::move(k));
}

MetricsRegistry::Collector CoordinatorCollector(const Coordinator* coordinator) {
  return [coordinator](std::vector<MetricFamily>* out) {
    // From memory only: a scrape never reads the job store.
    const Coordinator::JobsSummary jobs = coordinator->SummarizeJobs();
    const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
    AppendJobMetrics(jobs.in_memory, now_ms, out, jobs.left_memory_by_state);
    AppendNodeMetrics(coordinator->ListNodes(), out);
    AppendRankMetrics(jobs.in_memory, out);
  };
}

void WorkerExitCounter::Count(const v1::WorkerStatus& worker) {
  std::string outcome = "failed";
  if (worker.state() == v1::WORKER_STATE_STOPPED) {
    outcome = "stopped";
  } else if (worker.exit().exit_code() == 0 && worker.exit().signal() == 0) {
    outcome = "succeeded";
  } else if (worker.exit().oom_killed()) {
    outcome = "oom_killed";
  }
  MutexLock lock(&mu_);
  by_outcome_[outcome] += 1;
}

void WorkerExitCounter::AppendTo(std::vector<MetricFamily>* out) const {
  MetricFamily f = Family("lockstep_agent_worker_exits_total",
                          "Worker exits this agent reaped, by outcome (succeeded, failed, "
                          "oom_killed, stopped)",
                          MetricType::kCounter);
  MutexLock lock(&mu_);
  for (const char* o : {"succeeded", "failed", "oom_killed", "stopped"}) {
    auto it = by_outcome_.find(o);
    f.Add({{"outcome", o}}, it == by_outcome_.end() ? 0 : it->second);
  }
  out->push_back(std::move(f));
}

MetricsRegistry::Collector AgentCollector(const Agent* agent, const WorkerExitCounter* exits) {
  return [agent, exits](std::vector<MetricFamily>* out) {
    int running = 0;
    const std::vector<v1::AgentJobReport> reports = agent->ListWorkers("");
    for (const v1::AgentJobReport& r : reports) {
      for (const v1::WorkerStatus& w : r.workers()) {
        running += w.state() == v1::WORKER_STATE_STARTING || w.state() == v1::WORKER_STATE_RUNNING;
      }
    }
    MetricFamily workers = Family("lockstep_agent_workers_running",
                                  "Worker processes this agent runs (starting or running)");
    workers.Add({}, running);
    MetricFamily jobs = Family("lockstep_agent_jobs", "Jobs this agent holds workers or state for");
    jobs.Add({}, static_cast<double>(reports.size()));
    out->push_back(std::move(workers));
    out->push_back(std::move(jobs));
    exits->AppendTo(out);
    const Cleaner::Backlog backlog = agent->CleanerBacklog();
    MetricFamily lanes = Family("lockstep_agent_cleaner_backlog",
                                "The agent's file work queued or under way, by lane: clean (job "
                                "uids returned, deleted jobs' dirs), rotate (logs), find_uid");
    lanes.Add({{"lane", "clean"}}, backlog.clean);
    lanes.Add({{"lane", "rotate"}}, backlog.rotate);
    lanes.Add({{"lane", "find_uid"}}, backlog.find_uid);
    out->push_back(std::move(lanes));
    MetricFamily unclean = Family("lockstep_agent_job_uids_unclean",
                                  "Job uids this agent could not clean, left alone (no job is given "
                                  "them) until tried again");
    unclean.Add({}, backlog.unclean_uids);
    out->push_back(std::move(unclean));
    const Agent::GuardState guard = agent->FenceGuardState();
    MetricFamily up = Family("lockstep_agent_fence_guard_up",
                             "1 while the agent's fence guard runs (it kills a frozen agent's "
                             "workers at the fence deadline)");
    up.Add({}, guard.up ? 1 : 0);
    out->push_back(std::move(up));
    MetricFamily restarts = Family("lockstep_agent_fence_guard_restarts_total",
                                   "Fence guard processes that ended and were started again",
                                   MetricType::kCounter);
    restarts.Add({}, static_cast<double>(guard.restarts));
    out->push_back(std::move(restarts));
  };
}

void RpcStats::Record(const std::string& method, const std::string& code, double seconds) {
  MutexLock lock(&mu_);
  std::string key = method;
  if (latency_.count(key) == 0 && static_cast<int>(latency_.size()) >= kMaxRpcMethods) {
    key = "other";
  }
  auto& h = latency_[key];
  if (!h) h = std::make_unique<Histogram>(DefaultLatencyBuckets());
  h->Observe(seconds);
  calls_[{key, code}] += 1;
}

void RpcStats::AppendTo(std::vector<MetricFamily>* out) const {
  MetricFamily latency = Family("lockstep_rpc_duration_seconds",
                                "gRPC server handling time by method, from the call's arrival "
                                "to its status being sent (long polls included)",
                                MetricType::kHistogram);
  MetricFamily calls = Family("lockstep_rpcs_total",
                              "gRPC calls served, by method and status code", MetricType::kCounter);
  MutexLock lock(&mu_);
  for (const auto& [method, h] : latency_) h->AppendTo({{"method", method}}, &latency);
  for (const auto& [key, n] : calls_) calls.Add({{"method", key.first}, {"code", key.second}}, n);
  out->push_back(std::move(latency));
  out->push_back(std::move(calls));
}

std::string GrpcCodeName(int code) {
  if (code >= 0 && code < static_cast<int>(sizeof(kCodeNames) / sizeof(kCodeNames[0]))) {
    return kCodeNames[code];
  }
  return std::to_string(code);
}

MetricsRegistry::Collector ProcessCollector(const std::string& version) {
  return [version](std::vector<MetricFamily>* out) {
    MetricFamily info = Family("lockstep_build_info", "Always 1; label version is lockstepd's");
    info.Add({{"version", version}}, 1);
    out->push_back(std::move(info));
  };
}

}  // namespace daemon
}  // namespace lockstep
