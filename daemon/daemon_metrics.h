// What lockstepd exports on /metrics: collectors over the coordinator and
// the agent, read at scrape time, and the counters kept between scrapes
// (worker exits, RPCs). daemon/README.md "Metrics" lists every name.
//
// Labels: a job is `job_id`, never `job`: Prometheus gives every series
// its scrape job's name as `job` and would rename ours to exported_job.
//
// Cardinality: per-job series exist only for live jobs (PENDING to
// RESTARTING) and jobs that finished within kRecentJobWindow; per-rank
// series only for RUNNING jobs, from their current round's workers. RPC
// series are bounded by kMaxRpcMethods.
//
// Rank metrics come from v1::RankProgress by protobuf reflection: every
// singular numeric field (int32/64, uint32/64, float, double, bool) except
// `rank` becomes lockstep_rank_<field> with labels job_id, rank, node. A field
// named *_ms is exported as *_seconds (value / 1000), *_per_s as
// *_per_second; other names are kept. So fields added to RankProgress
// appear without code here.
//
// Thread safety: collectors read the coordinator and agent through their
// thread-safe public calls; RpcStats and WorkerExitCounter are
// thread-safe.
#ifndef LOCKSTEP_DAEMON_DAEMON_METRICS_H_
#define LOCKSTEP_DAEMON_DAEMON_METRICS_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "daemon/metrics.h"
#include "lockstep/v1/common.pb.h"

namespace lockstep {
namespace daemon {

class Agent;
class Coordinator;

// Default: how long a finished job keeps its per-job series.
inline constexpr Duration kRecentJobWindow = std::chrono::minutes(10);
// Distinct gRPC method labels kept; later ones are counted as "other".
inline constexpr int kMaxRpcMethods = 64;

// lockstep_rank_<field>: the exported name and scale of one RankProgress
// field ("forward_ms" -> {"lockstep_rank_forward_seconds", 0.001}).
std::pair<std::string, double> RankMetricName(const std::string& field);

// Appends the rank families (one per numeric RankProgress field, all
// present even when `jobs` has no progress) for the RUNNING jobs in `jobs`.
void AppendRankMetrics(const std::vector<v1::Job>& jobs, std::vector<MetricFamily>* out);

// lockstep_jobs{state}, lockstep_job_state{job_id, state} (1),
// lockstep_job_restarts_total{job_id}, lockstep_job_world_size{job_id}:
// every state of lockstep_jobs gets a sample (0 if none);
// per-job series as the cardinality rule above, judged at `now_unix_ms`.
// lockstep_jobs counts `jobs` plus `left_memory` (finished jobs the
// coordinator keeps only in its store, by state).
void AppendJobMetrics(const std::vector<v1::Job>& jobs, int64_t now_unix_ms,
                      std::vector<MetricFamily>* out,
                      const std::map<v1::JobState, int64_t>& left_memory = {});

// lockstep_nodes_alive, lockstep_nodes_known.
void AppendNodeMetrics(const std::vector<v1::NodeInfo>& nodes, std::vector<MetricFamily>* out);

// A coordinator's collector: jobs (Coordinator::SummarizeJobs: from memory,
// never the job store, so a scrape costs the same with 10 or 10,000
// finished jobs), nodes and rank progress. `coordinator` must outlive the
// registry.
MetricsRegistry::Collector CoordinatorCollector(const Coordinator* coordinator);

// Worker exits an agent reaped, by outcome: "succeeded" (exit code 0),
// "failed" (non-zero or a signal, not sent by the agent), "oom_killed"
// (failed so by the kernel's OOM killer, not counted as failed too),
// "stopped" (stopped by the agent: cancel, restart, shutdown).
class WorkerExitCounter {
 public:
  void Count(const v1::WorkerStatus& worker);
  void AppendTo(std::vector<MetricFamily>* out) const;

 private:
  mutable Mutex mu_;
  std::map<std::string, double> by_outcome_ ABSL_GUARDED_BY(mu_);
};

// An agent's collector: lockstep_agent_workers_running (STARTING or
// RUNNING workers), lockstep_agent_jobs and the exit counter. Both must
// outlive the registry.
MetricsRegistry::Collector AgentCollector(const Agent* agent, const WorkerExitCounter* exits);

// RPC latency and outcome by method: lockstep_rpc_duration_seconds
// (histogram, label method) and lockstep_rpcs_total{method, code}.
class RpcStats {
 public:
  // `method` is gRPC's full name ("/lockstep.v1.CoordinatorService/GetJob");
  // `code` a canonical code name ("OK", "NOT_FOUND").
  void Record(const std::string& method, const std::string& code, double seconds);
  void AppendTo(std::vector<MetricFamily>* out) const;

 private:
  mutable Mutex mu_;
  std::map<std::string, std::unique_ptr<Histogram>> latency_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, double> calls_ ABSL_GUARDED_BY(mu_);
};

// "OK", "NOT_FOUND" for grpc::StatusCode values; the number if unknown.
std::string GrpcCodeName(int code);

// lockstep_build_info{version} = 1.
MetricsRegistry::Collector ProcessCollector(const std::string& version);

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_DAEMON_METRICS_H_
