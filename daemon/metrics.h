// Prometheus text exposition (format 0.0.4) for lockstepd's /metrics: the
// value types a scrape renders, a histogram, and the registry of collectors
// a scrape runs. Plain C++, no gRPC or protobuf.
//
// Words: a *family* is one metric name with its HELP and TYPE lines and its
// *samples*; a sample is name + suffix (histograms: "_bucket", "_sum",
// "_count"), labels and a value. Collectors build families at scrape time
// from the daemon's state (daemon_metrics.h); the only state kept here is a
// Histogram's counts.
//
// Format rules applied by Render: label values escape backslash, double
// quote and newline (\\, \", \n); HELP text escapes backslash and newline;
// values print as the shortest decimal that round-trips, with +Inf, -Inf and
// NaN spelled as Prometheus wants them. A family with no samples still gets
// its HELP and TYPE lines, so a daemon's /metrics names every metric it can
// export even before it has data (the dashboard test relies on it).
#ifndef LOCKSTEP_DAEMON_METRICS_H_
#define LOCKSTEP_DAEMON_METRICS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/mutex.h"

namespace lockstep {
namespace daemon {

using Labels = std::vector<std::pair<std::string, std::string>>;

struct MetricSample {
  std::string suffix;  // "" or, for histograms, "_bucket" / "_sum" / "_count"
  Labels labels;
  double value = 0;
};

enum class MetricType { kGauge, kCounter, kHistogram };

struct MetricFamily {
  std::string name;  // REQUIRES: IsValidMetricName
  std::string help;
  MetricType type = MetricType::kGauge;
  std::vector<MetricSample> samples;

  void Add(Labels labels, double value) { samples.push_back({"", std::move(labels), value}); }
};

// [a-zA-Z_:][a-zA-Z0-9_:]*
bool IsValidMetricName(absl::string_view name);
// "a\"b" for a"b: backslash, double quote and newline escaped.
std::string EscapeLabelValue(absl::string_view value);
// "1", "0.25", "+Inf", "NaN".
std::string FormatMetricValue(double value);
// The text exposition of `families`, in order. CHECK-fails on an invalid
// metric or label name (a programmer error).
std::string RenderExposition(const std::vector<MetricFamily>& families);

// Cumulative-bucket histogram. Thread-safe; Observe is a short critical
// section.
class Histogram {
 public:
  // `bounds`: strictly increasing upper bounds, +Inf implied.
  explicit Histogram(std::vector<double> bounds);

  void Observe(double value);
  // Appends this histogram's _bucket (with label le), _sum and _count
  // samples, each with `labels`, to `family`.
  void AppendTo(const Labels& labels, MetricFamily* family) const;

 private:
  const std::vector<double> bounds_;
  mutable Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // per bound, +1 for +Inf; not cumulative
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
};

// Default: the buckets of lockstep_rpc_duration_seconds, 0.5 ms to 60 s
// (long polls such as WatchJob and store waits land in the top buckets).
std::vector<double> DefaultLatencyBuckets();

// The collectors one scrape runs. Add them all before serving; Render may
// then be called from any thread, concurrently.
class MetricsRegistry {
 public:
  using Collector = std::function<void(std::vector<MetricFamily>* out)>;
  void AddCollector(Collector collector) { collectors_.push_back(std::move(collector)); }
  // Runs every collector and renders what they produced.
  std::string Render() const;
  // The families without rendering (tests, the names check).
  std::vector<MetricFamily> Collect() const;

 private:
  std::vector<Collector> collectors_;
};

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_METRICS_H_
