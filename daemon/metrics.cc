#include "daemon/metrics.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace lockstep {
namespace daemon {
namespace {

bool IsValidLabelName(absl::string_view name) {
  if (name.empty() || absl::ascii_isdigit(name[0])) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_') return false;
  }
  return true;
}

std::string EscapeHelp(absl::string_view help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kHistogram:
      return "histogram";
    case MetricType::kGauge:
      break;
  }
  return "gauge";
}

[[noreturn]] void Die(absl::string_view what) {
  std::fprintf(stderr, "metrics: invalid %.*s\n", static_cast<int>(what.size()), what.data());
  std::abort();
}

}  // namespace

bool IsValidMetricName(absl::string_view name) {
  if (name.empty() || absl::ascii_isdigit(name[0])) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != ':') return false;
  }
  return true;
}

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Shortest of %.15g / %.17g that reads back to the same double.
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.15g", value);
  if (std::strtod(buf, nullptr) != value) std::snprintf(buf, sizeof(buf), "%.17g", value);
  return buf;
}

std::string RenderExposition(const std::vector<MetricFamily>& families) {
  std::string out;
  for (const MetricFamily& f : families) {
    if (!IsValidMetricName(f.name)) Die("metric name " + f.name);
    absl::StrAppend(&out, "# HELP ", f.name, " ", EscapeHelp(f.help), "\n");
    absl::StrAppend(&out, "# TYPE ", f.name, " ", TypeName(f.type), "\n");
    for (const MetricSample& s : f.samples) {
      absl::StrAppend(&out, f.name, s.suffix);
      if (!s.labels.empty()) {
        out += '{';
        for (size_t i = 0; i < s.labels.size(); ++i) {
          if (!IsValidLabelName(s.labels[i].first)) Die("label name " + s.labels[i].first);
          absl::StrAppend(&out, i ? "," : "", s.labels[i].first, "=\"",
                          EscapeLabelValue(s.labels[i].second), "\"");
        }
        out += '}';
      }
      absl::StrAppend(&out, " ", FormatMetricValue(s.value), "\n");
    }
  }
  return out;
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
  for (size_t i = 1; i < bounds_.size(); ++i) {
    if (!(bounds_[i - 1] < bounds_[i])) Die("histogram bounds (not increasing)");
  }
}

void Histogram::Observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;  // le: value <= bound
  MutexLock lock(&mu_);
  ++counts_[i];
  sum_ += value;
}

void Histogram::AppendTo(const Labels& labels, MetricFamily* family) const {
  std::vector<uint64_t> counts;
  double sum;
  {
    MutexLock lock(&mu_);
    counts = counts_;
    sum = sum_;
  }
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts[i];
    Labels with_le = labels;
    with_le.emplace_back("le", i < bounds_.size() ? FormatMetricValue(bounds_[i]) : "+Inf");
    family->samples.push_back({"_bucket", std::move(with_le), static_cast<double>(cumulative)});
  }
  family->samples.push_back({"_sum", labels, sum});
  family->samples.push_back({"_count", labels, static_cast<double>(cumulative)});
}

std::vector<double> DefaultLatencyBuckets() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
          0.5,    1,     2.5,    5,     10,   30,    60};
}

std::vector<MetricFamily> MetricsRegistry::Collect() const {
  std::vector<MetricFamily> out;
  for (const Collector& c : collectors_) c(&out);
  return out;
}

std::string MetricsRegistry::Render() const { return RenderExposition(Collect()); }

}  // namespace daemon
}  // namespace lockstep
