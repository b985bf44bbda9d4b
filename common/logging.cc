#include "common/logging.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <cctype>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "common/worker_env.h"

namespace lockstep {
namespace {

std::string EnvOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? std::string(v) : std::string(fallback);
}

// The level LOCKSTEP_LOG_LEVEL names (info when unset). An unknown name
// gives info and a warning on `logger`, once per name: a typo in a job's
// environment must not stop its workers.
spdlog::level::level_enum EnvLevel(spdlog::logger* logger) {
  const std::string name = EnvOr("LOCKSTEP_LOG_LEVEL", "info");
  StatusOr<spdlog::level::level_enum> parsed = ParseLogLevel(name);
  if (parsed.ok()) return *parsed;
  static Mutex mu;
  static std::string* const warned = new std::string;
  {
    MutexLock lock(&mu);
    if (*warned == name) return spdlog::level::info;
    *warned = name;
  }
  logger->warn("[logging] LOCKSTEP_LOG_LEVEL: {}; logging at info",
               std::string(parsed.status().message()));
  return spdlog::level::info;
}

}  // namespace

StatusOr<spdlog::level::level_enum> ParseLogLevel(absl::string_view name) {
  std::string lower = absl::AsciiStrToLower(name);
  if (lower == "trace") return spdlog::level::trace;
  if (lower == "debug") return spdlog::level::debug;
  if (lower == "info") return spdlog::level::info;
  if (lower == "warn" || lower == "warning") return spdlog::level::warn;
  if (lower == "error") return spdlog::level::err;
  if (lower == "critical") return spdlog::level::critical;
  if (lower == "off") return spdlog::level::off;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown log level '", name,
      "' (expected trace, debug, info, warn, error, critical or off)"));
}

Status InitLogging(absl::string_view level) {
  spdlog::logger* logger = LockstepLogger();
  if (level.empty()) {
    logger->set_level(EnvLevel(logger));
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(spdlog::level::level_enum parsed, ParseLogLevel(level));
  logger->set_level(parsed);
  return absl::OkStatus();
}

spdlog::logger* LockstepLogger() {
  static spdlog::logger* const logger = [] {
    auto* made = new spdlog::logger("lockstep", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    // UTC with its zone, as the CLI prints times: lines from hosts in
    // different zones sort and compare as they are.
    made->set_pattern("%Y-%m-%dT%H:%M:%S.%eZ %L %v", spdlog::pattern_time_type::utc);
    made->flush_on(spdlog::level::warn);
    made->set_level(EnvLevel(made));
    return made;  // Never freed: loggers may log from static destructors.
  }();
  return logger;
}

Logger::Logger(std::string component) : component_(std::move(component)) {
  // A worker's identity from the worker contract (torchrun's names too).
  const WorkerIdentity id = ReadWorkerIdentity([](const char* n) { return std::getenv(n); });
  job_id_ = id.job_id;
  rank_ = id.rank;
  BuildPrefix();
}

Logger::Logger(std::string component, std::string job_id, int rank)
    : component_(std::move(component)), job_id_(std::move(job_id)), rank_(rank) {
  if (job_id_.empty()) job_id_ = "-";
  BuildPrefix();
}

Logger Logger::WithJob(std::string job_id) const {
  return Logger(component_, std::move(job_id), rank_);
}

Logger Logger::WithRank(int rank) const { return Logger(component_, job_id_, rank); }

void Logger::BuildPrefix() {
  prefix_ = absl::StrCat("[", component_, "] job=", job_id_,
                         " rank=", rank_ < 0 ? std::string("-") : absl::StrCat(rank_), " ");
}

bool RateLimiter::Allow() {
  int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now().time_since_epoch())
                    .count();
  int64_t next = next_allowed_ns_.load(std::memory_order_relaxed);
  if (now < next) return false;
  int64_t step = std::chrono::duration_cast<std::chrono::nanoseconds>(interval_).count();
  return next_allowed_ns_.compare_exchange_strong(next, now + step);
}

}  // namespace lockstep
