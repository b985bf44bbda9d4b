#include "daemon/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

namespace lockstep {
namespace daemon {
namespace {

TEST(MetricsTest, RendersHelpTypeAndSamplesInOrder) {
  MetricFamily f;
  f.name = "lockstep_jobs";
  f.help = "Jobs by state";
  f.Add({{"state", "RUNNING"}}, 2);
  f.Add({{"state", "FAILED"}}, 0);
  MetricFamily g;
  g.name = "lockstep_rpcs_total";
  g.help = "Calls";
  g.type = MetricType::kCounter;
  g.Add({}, 7);
  EXPECT_EQ(RenderExposition({f, g}),
            "# HELP lockstep_jobs Jobs by state\n"
            "# TYPE lockstep_jobs gauge\n"
            "lockstep_jobs{state=\"RUNNING\"} 2\n"
            "lockstep_jobs{state=\"FAILED\"} 0\n"
            "# HELP lockstep_rpcs_total Calls\n"
            "# TYPE lockstep_rpcs_total counter\n"
            "lockstep_rpcs_total 7\n");
}

TEST(MetricsTest, FamilyWithoutSamplesKeepsItsHelpAndType) {
  MetricFamily f;
  f.name = "lockstep_rank_step";
  f.help = "h";
  EXPECT_EQ(RenderExposition({f}), "# HELP lockstep_rank_step h\n# TYPE lockstep_rank_step gauge\n");
}

TEST(MetricsTest, EscapesLabelValuesAndHelp) {
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(EscapeLabelValue("plain-job_1"), "plain-job_1");
  MetricFamily f;
  f.name = "m";
  f.help = "back\\slash\nnew \"quoted\"";
  f.Add({{"job", "j\"1\n"}}, 1);
  EXPECT_EQ(RenderExposition({f}),
            "# HELP m back\\\\slash\\nnew \"quoted\"\n# TYPE m gauge\nm{job=\"j\\\"1\\n\"} 1\n");
}

TEST(MetricsTest, FormatsValuesShortestAndSpecials) {
  EXPECT_EQ(FormatMetricValue(1), "1");
  EXPECT_EQ(FormatMetricValue(0.25), "0.25");
  EXPECT_EQ(FormatMetricValue(0.1), "0.1");
  EXPECT_EQ(FormatMetricValue(-3.5), "-3.5");
  EXPECT_EQ(FormatMetricValue(1e21), "1e+21");
  EXPECT_EQ(FormatMetricValue(123456789012), "123456789012");
  EXPECT_EQ(FormatMetricValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatMetricValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatMetricValue(std::nan("")), "NaN");
  const double third = 1.0 / 3;
  EXPECT_EQ(std::stod(FormatMetricValue(third)), third);
}

TEST(MetricsTest, ValidatesMetricNames) {
  EXPECT_TRUE(IsValidMetricName("lockstep_rank_step_seconds"));
  EXPECT_TRUE(IsValidMetricName("a:b_c"));
  EXPECT_FALSE(IsValidMetricName(""));
  EXPECT_FALSE(IsValidMetricName("1abc"));
  EXPECT_FALSE(IsValidMetricName("a-b"));
}

TEST(MetricsDeathTest, InvalidNameIsAProgrammerError) {
  MetricFamily f;
  f.name = "bad-name";
  EXPECT_DEATH(RenderExposition({f}), "invalid metric name bad-name");
  MetricFamily g;
  g.name = "ok";
  g.Add({{"bad label", "v"}}, 1);
  EXPECT_DEATH(RenderExposition({g}), "invalid label name");
}

TEST(HistogramTest, BucketsAreCumulativeWithLeAndInf) {
  Histogram h({0.125, 1});
  h.Observe(0.0625);
  h.Observe(0.125);  // on the bound: le is inclusive
  h.Observe(0.5);
  h.Observe(7);
  MetricFamily f;
  f.name = "lockstep_rpc_duration_seconds";
  f.help = "h";
  f.type = MetricType::kHistogram;
  h.AppendTo({{"method", "/x.Y/Z"}}, &f);
  EXPECT_EQ(RenderExposition({f}),
            "# HELP lockstep_rpc_duration_seconds h\n"
            "# TYPE lockstep_rpc_duration_seconds histogram\n"
            "lockstep_rpc_duration_seconds_bucket{method=\"/x.Y/Z\",le=\"0.125\"} 2\n"
            "lockstep_rpc_duration_seconds_bucket{method=\"/x.Y/Z\",le=\"1\"} 3\n"
            "lockstep_rpc_duration_seconds_bucket{method=\"/x.Y/Z\",le=\"+Inf\"} 4\n"
            "lockstep_rpc_duration_seconds_sum{method=\"/x.Y/Z\"} 7.6875\n"
            "lockstep_rpc_duration_seconds_count{method=\"/x.Y/Z\"} 4\n");
}

TEST(HistogramTest, ConcurrentObservationsAreAllCounted) {
  Histogram h(DefaultLatencyBuckets());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) h.Observe(0.002);
    });
  }
  for (auto& t : threads) t.join();
  MetricFamily f;
  f.name = "h";
  h.AppendTo({}, &f);
  EXPECT_EQ(f.samples.back().suffix, "_count");
  EXPECT_EQ(f.samples.back().value, 4000);
  EXPECT_EQ(f.samples[1].labels.back().second, "0.001");
  EXPECT_EQ(f.samples[1].value, 0);  // le 0.001
  EXPECT_EQ(f.samples[2].value, 4000);  // le 0.0025
}

TEST(MetricsRegistryTest, RunsEveryCollectorPerRender) {
  MetricsRegistry registry;
  int calls = 0;
  registry.AddCollector([&](std::vector<MetricFamily>* out) {
    ++calls;
    MetricFamily f;
    f.name = "a";
    f.Add({}, calls);
    out->push_back(f);
  });
  registry.AddCollector([](std::vector<MetricFamily>* out) {
    MetricFamily f;
    f.name = "b";
    out->push_back(f);
  });
  EXPECT_EQ(registry.Render(), "# HELP a \n# TYPE a gauge\na 1\n# HELP b \n# TYPE b gauge\n");
  EXPECT_EQ(registry.Collect().size(), 2u);
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
