// Logging facade over spdlog: one logger per component, job id and rank in
// every line, level from a flag or LOCKSTEP_LOG_LEVEL.
//
// Line format (UTC with its zone):
//   2026-11-24T00:40:12.345Z I [agent] job=j-3f9c0a1b2c3d4e5f rank=3 worker pid 4242 exited with code 1 by itself (not stopped by the agent)
//
// Every Logger writes to LockstepLogger(), not to spdlog's default logger:
// a program that links the worker library gets this format and
// LOCKSTEP_LOG_LEVEL without calling anything, and keeps its own spdlog
// setup untouched.
//
// Thread safety: Logger is immutable after construction and may be shared.
#ifndef LOCKSTEP_COMMON_LOGGING_H_
#define LOCKSTEP_COMMON_LOGGING_H_

#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "common/status.h"

namespace lockstep {

// Parses "trace|debug|info|warn|error|critical|off" (case-insensitive).
// Returns InvalidArgument naming the value otherwise.
StatusOr<spdlog::level::level_enum> ParseLogLevel(absl::string_view name);

// Sets LockstepLogger()'s level: `level` if non-empty, else
// LOCKSTEP_LOG_LEVEL, else info. Logs go to stderr. Safe to call more than
// once. Returns InvalidArgument for an unknown `level` (the level is then
// left as it was); an unknown LOCKSTEP_LOG_LEVEL gives info and one warning
// (a typo in a job's environment does not stop its workers).
Status InitLogging(absl::string_view level = "");

// The spdlog logger every Logger writes to, made at first use: stderr, the
// line format above, flushed at warn and above, its level from
// LOCKSTEP_LOG_LEVEL (info when unset; an unknown name gives info and one
// warning saying so) until InitLogging sets it. Not registered with spdlog.
spdlog::logger* LockstepLogger();

class Logger {
 public:
  // `component` names the subsystem ("agent", "store", "reducer"). Job and
  // rank default to LOCKSTEP_JOB_ID / LOCKSTEP_RANK from the environment,
  // or "-" when unset (a daemon's own events).
  explicit Logger(std::string component);
  Logger(std::string component, std::string job_id, int rank);

  Logger WithJob(std::string job_id) const;
  Logger WithRank(int rank) const;

  const std::string& component() const { return component_; }
  const std::string& job_id() const { return job_id_; }

  template <typename... Args>
  void Debug(fmt::format_string<Args...> f, Args&&... args) const {
    Log(spdlog::level::debug, f, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void Info(fmt::format_string<Args...> f, Args&&... args) const {
    Log(spdlog::level::info, f, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void Warn(fmt::format_string<Args...> f, Args&&... args) const {
    Log(spdlog::level::warn, f, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void Error(fmt::format_string<Args...> f, Args&&... args) const {
    Log(spdlog::level::err, f, std::forward<Args>(args)...);
  }

  template <typename... Args>
  void Log(spdlog::level::level_enum level, fmt::format_string<Args...> f,
           Args&&... args) const {
    spdlog::logger* sink = LockstepLogger();
    if (!sink->should_log(level)) return;
    sink->log(level, "{}{}", prefix_, fmt::format(f, std::forward<Args>(args)...));
  }

 private:
  void BuildPrefix();

  std::string component_;
  std::string job_id_;
  int rank_;
  std::string prefix_;
};

// Lets through at most one event per `interval`; for logging in hot loops.
// Keep one per object that logs (a member), not a function-local static,
// so that two of them in one process each log their own first event:
//   RateLimiter refused_log_{std::chrono::seconds(5)};
//   if (refused_log_.Allow()) log_.Warn(...);
// Thread-safe.
class RateLimiter {
 public:
  explicit RateLimiter(std::chrono::steady_clock::duration interval)
      : interval_(interval) {}
  bool Allow();

 private:
  std::chrono::steady_clock::duration interval_;
  std::atomic<int64_t> next_allowed_ns_{0};
};

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_LOGGING_H_
