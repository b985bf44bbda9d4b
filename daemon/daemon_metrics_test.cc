#include "daemon/daemon_metrics.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace lockstep {
namespace daemon {
namespace {

const MetricFamily* Find(const std::vector<MetricFamily>& families, const std::string& name) {
  for (const auto& f : families) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string Label(const MetricSample& s, const std::string& key) {
  for (const auto& [k, v] : s.labels) {
    if (k == key) return v;
  }
  return "";
}

v1::Job RunningJob(const std::string& id) {
  v1::Job job;
  job.set_job_id(id);
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_round(2);
  job.set_world_size(2);
  job.set_restart_count(1);
  for (int rank = 0; rank < 2; ++rank) {
    v1::WorkerStatus* w = job.add_workers();
    w->set_rank(rank);
    w->set_round(2);
    w->set_node_id("node-" + std::to_string(rank));
    v1::RankProgress* p = w->mutable_progress();
    p->set_rank(rank);
    p->set_step(10 + rank);
    p->set_forward_ms(250);
    p->set_samples_per_s(1000);
    p->set_bytes_reduced(4096);
  }
  // A worker of the previous round: never exported.
  v1::WorkerStatus* old = job.add_workers();
  old->set_rank(0);
  old->set_round(1);
  old->mutable_progress()->set_step(99);
  return job;
}

TEST(RankMetricNameTest, ConvertsUnitSuffixes) {
  EXPECT_EQ(RankMetricName("forward_ms"), std::make_pair(std::string("lockstep_rank_forward_seconds"), 0.001));
  EXPECT_EQ(RankMetricName("samples_per_s").first, "lockstep_rank_samples_per_second");
  EXPECT_EQ(RankMetricName("samples_per_s").second, 1);
  EXPECT_EQ(RankMetricName("bytes_reduced").first, "lockstep_rank_bytes_reduced");
  EXPECT_EQ(RankMetricName("step").first, "lockstep_rank_step");
}

// reported_mono_ns, an agent's steady clock, is no metric.
TEST(RankMetricsTest, EveryNumericFieldButRankIsAFamilyEvenWithoutJobs) {
  std::vector<MetricFamily> out;
  AppendRankMetrics({}, &out);
  const google::protobuf::Descriptor* d = v1::RankProgress::descriptor();
  int numeric = 0;
  for (int i = 0; i < d->field_count(); ++i) {
    const auto* f = d->field(i);
    if (f->name() == "rank" || f->name() == "reported_mono_ns" || f->is_repeated() ||
        f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_STRING ||
        f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE ||
        f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_ENUM) {
      continue;
    }
    ++numeric;
    EXPECT_NE(Find(out, RankMetricName(f->name()).first), nullptr) << f->name();
  }
  EXPECT_EQ(static_cast<int>(out.size()), numeric);
  EXPECT_EQ(Find(out, "lockstep_rank_reported_mono_ns"), nullptr);
  for (const auto& f : out) EXPECT_TRUE(f.samples.empty()) << f.name;
}

TEST(RankMetricsTest, ExportsTheCurrentRoundOfRunningJobsWithUnits) {
  v1::Job pending = RunningJob("j-pending");
  pending.set_state(v1::JOB_STATE_PENDING);
  std::vector<MetricFamily> out;
  AppendRankMetrics({RunningJob("j1"), pending}, &out);
  const MetricFamily* step = Find(out, "lockstep_rank_step");
  ASSERT_NE(step, nullptr);
  ASSERT_EQ(step->samples.size(), 2u);
  EXPECT_EQ(Label(step->samples[1], "job_id"), "j1");
  EXPECT_EQ(Label(step->samples[1], "rank"), "1");
  EXPECT_EQ(Label(step->samples[1], "node"), "node-1");
  EXPECT_EQ(step->samples[1].value, 11);
  const MetricFamily* fwd = Find(out, "lockstep_rank_forward_seconds");
  ASSERT_NE(fwd, nullptr);
  EXPECT_DOUBLE_EQ(fwd->samples[0].value, 0.25);
  EXPECT_EQ(Find(out, "lockstep_rank_samples_per_second")->samples[0].value, 1000);
  EXPECT_EQ(Find(out, "lockstep_rank_bytes_reduced")->samples[0].value, 4096);
  EXPECT_EQ(Find(out, "lockstep_rank_rank"), nullptr);
}

TEST(JobMetricsTest, CountsEveryStateAndBoundsPerJobSeries) {
  const int64_t now_ms = 100 * 60 * 1000;
  v1::Job old_done;
  old_done.set_job_id("old");
  old_done.set_state(v1::JOB_STATE_SUCCEEDED);
  old_done.set_finished_unix_ms(now_ms - 11 * 60 * 1000);
  v1::Job recent_fail = old_done;
  recent_fail.set_job_id("recent");
  recent_fail.set_state(v1::JOB_STATE_FAILED);
  recent_fail.set_finished_unix_ms(now_ms - 60 * 1000);
  std::vector<MetricFamily> out;
  AppendJobMetrics({RunningJob("j1"), old_done, recent_fail}, now_ms, &out);
  const MetricFamily* jobs = Find(out, "lockstep_jobs");
  ASSERT_NE(jobs, nullptr);
  EXPECT_EQ(jobs->samples.size(), 7u);  // every state but UNSPECIFIED
  std::map<std::string, double> by_state;
  for (const auto& s : jobs->samples) by_state[Label(s, "state")] = s.value;
  EXPECT_EQ(by_state["RUNNING"], 1);
  EXPECT_EQ(by_state["SUCCEEDED"], 1);
  EXPECT_EQ(by_state["FAILED"], 1);
  EXPECT_EQ(by_state["PENDING"], 0);
  const MetricFamily* restarts = Find(out, "lockstep_job_restarts_total");
  ASSERT_NE(restarts, nullptr);
  EXPECT_EQ(restarts->type, MetricType::kCounter);
  ASSERT_EQ(restarts->samples.size(), 2u);  // "old" left the window
  EXPECT_EQ(Label(restarts->samples[0], "job_id"), "j1");
  EXPECT_EQ(restarts->samples[0].value, 1);
  EXPECT_EQ(Label(restarts->samples[1], "job_id"), "recent");
  const MetricFamily* state = Find(out, "lockstep_job_state");
  ASSERT_NE(state, nullptr);
  ASSERT_EQ(state->samples.size(), 2u);
  EXPECT_EQ(Label(state->samples[0], "state"), "RUNNING");
  EXPECT_EQ(Label(state->samples[1], "state"), "FAILED");
  EXPECT_EQ(state->samples[1].value, 1);
}

TEST(NodeMetricsTest, CountsAliveAndKnown) {
  std::vector<v1::NodeInfo> nodes(3);
  nodes[0].set_alive(true);
  nodes[2].set_alive(true);
  std::vector<MetricFamily> out;
  AppendNodeMetrics(nodes, &out);
  EXPECT_EQ(Find(out, "lockstep_nodes_alive")->samples[0].value, 2);
  EXPECT_EQ(Find(out, "lockstep_nodes_known")->samples[0].value, 3);
}

TEST(WorkerExitCounterTest, CountsByOutcome) {
  WorkerExitCounter exits;
  v1::WorkerStatus ok;
  ok.set_state(v1::WORKER_STATE_EXITED);
  v1::WorkerStatus failed = ok;
  failed.mutable_exit()->set_signal(9);
  v1::WorkerStatus stopped = failed;
  stopped.set_state(v1::WORKER_STATE_STOPPED);
  v1::WorkerStatus oom = failed;
  oom.mutable_exit()->set_oom_killed(true);
  exits.Count(ok);
  exits.Count(failed);
  exits.Count(failed);
  exits.Count(oom);
  exits.Count(stopped);
  std::vector<MetricFamily> out;
  exits.AppendTo(&out);
  EXPECT_EQ(RenderExposition(out),
            "# HELP lockstep_agent_worker_exits_total Worker exits this agent reaped, by outcome "
            "(succeeded, failed, oom_killed, stopped)\n"
            "# TYPE lockstep_agent_worker_exits_total counter\n"
            "lockstep_agent_worker_exits_total{outcome=\"succeeded\"} 1\n"
            "lockstep_agent_worker_exits_total{outcome=\"failed\"} 2\n"
            "lockstep_agent_worker_exits_total{outcome=\"oom_killed\"} 1\n"
            "lockstep_agent_worker_exits_total{outcome=\"stopped\"} 1\n");
}

TEST(RpcStatsTest, HistogramAndCountsByMethodAndCode) {
  RpcStats stats;
  stats.Record("/lockstep.v1.CoordinatorService/GetJob", "OK", 0.002);
  stats.Record("/lockstep.v1.CoordinatorService/GetJob", "NOT_FOUND", 0.0001);
  std::vector<MetricFamily> out;
  stats.AppendTo(&out);
  const std::string text = RenderExposition(out);
  EXPECT_TRUE(absl::StrContains(
      text, "lockstep_rpc_duration_seconds_count{method=\"/lockstep.v1.CoordinatorService/GetJob\"} 2\n"));
  EXPECT_TRUE(absl::StrContains(
      text, "lockstep_rpc_duration_seconds_bucket{method=\"/lockstep.v1.CoordinatorService/GetJob\",le=\"0.0005\"} 1\n"));
  EXPECT_TRUE(absl::StrContains(
      text, "lockstep_rpcs_total{method=\"/lockstep.v1.CoordinatorService/GetJob\",code=\"NOT_FOUND\"} 1\n"));
}

TEST(RpcStatsTest, MethodLabelsAreBounded) {
  RpcStats stats;
  for (int i = 0; i < kMaxRpcMethods + 10; ++i) stats.Record(absl::StrCat("/m/", i), "OK", 0.001);
  std::vector<MetricFamily> out;
  stats.AppendTo(&out);
  const MetricFamily* calls = Find(out, "lockstep_rpcs_total");
  ASSERT_EQ(static_cast<int>(calls->samples.size()), kMaxRpcMethods + 1);
  std::map<std::string, double> by_method;
  for (const auto& s : calls->samples) by_method[Label(s, "method")] = s.value;
  EXPECT_EQ(by_method["other"], 10);
}

TEST(GrpcCodeNameTest, NamesCanonicalCodes) {
  EXPECT_EQ(GrpcCodeName(0), "OK");
  EXPECT_EQ(GrpcCodeName(5), "NOT_FOUND");
  EXPECT_EQ(GrpcCodeName(16), "UNAUTHENTICATED");
  EXPECT_EQ(GrpcCodeName(42), "42");
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
