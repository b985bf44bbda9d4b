#include "daemon/job_env.h"

#include <algorithm>
#include <initializer_list>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/worker_env.h"
#include "common/worker_link.h"
#include "daemon/job_spec.h"

namespace lockstep {
namespace daemon {
namespace {

bool In(std::initializer_list<const char*> names, const std::string& name) {
  for (const char* n : names) {
    if (name == n) return true;
  }
  return false;
}

// Make any dynamically linked program (or its shell) run other code.
bool IsLoaderVariable(const std::string& name) {
  return absl::StartsWith(name, "LD_") ||
         In({"GCONV_PATH", "GLIBC_TUNABLES", "LOCPATH", "NLSPATH", "HOSTALIASES",
             "RESOLV_HOST_CONF", "BASH_ENV", "ENV", "MALLOC_TRACE"},
            name);
}

// Choose or change the program an allowed command runs.
bool IsProgramSelectionVariable(const std::string& name) {
  return In({"PATH", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PERL5LIB", "PERL5OPT",
             "RUBYLIB", "RUBYOPT", "NODE_OPTIONS", "JAVA_TOOL_OPTIONS", "CLASSPATH"},
            name);
}

// The worker contract's names and the worker link's descriptors.
bool IsContractVariable(const std::string& name) {
  return IsWorkerEnvName(name) || In({worker_link::kFenceFdEnv, worker_link::kStatusFdEnv}, name);
}

bool Matches(const std::string& pattern, const std::string& name) {
  if (!pattern.empty() && pattern.back() == '*') {
    return absl::StartsWith(name, absl::string_view(pattern).substr(0, pattern.size() - 1));
  }
  return pattern == name;
}

bool Permitted(const std::vector<std::string>& patterns, const std::string& name) {
  return std::any_of(patterns.begin(), patterns.end(),
                     [&](const std::string& p) { return Matches(p, name); });
}

}  // namespace

Status ValidateEnvPatterns(const std::vector<std::string>& patterns) {
  for (const auto& p : patterns) {
    const std::string body = !p.empty() && p.back() == '*' ? p.substr(0, p.size() - 1) : p;
    // "*" alone permits every name (the refused ones stay refused).
    const bool ok = p == "*" || IsEnvName(body);
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--allowed-env \"", p.substr(0, 64), "\": expected a variable name, PREFIX* or *"));
    }
  }
  return absl::OkStatus();
}

Status CheckJobEnv(const v1::JobSpec& spec, const JobEnvPolicy& policy) {
  RETURN_IF_ERROR(ValidateEnvPatterns(policy.allowed));
  // Sorted, so the error names the same variable every time.
  std::vector<std::string> names;
  for (const auto& [name, value] : spec.env()) names.push_back(name);
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    const std::string quoted = absl::StrCat("spec.env: ", name.substr(0, 64));
    if (IsLoaderVariable(name)) {
      return absl::PermissionDeniedError(absl::StrCat(
          quoted, " is refused: it makes the dynamic loader or the shell run code other than "
                  "the job's command"));
    }
    if (IsContractVariable(name)) {
      return absl::PermissionDeniedError(
          absl::StrCat(quoted, " is refused: the agent sets it for each worker"));
    }
    if (policy.command_allow_list && IsProgramSelectionVariable(name)) {
      return absl::PermissionDeniedError(absl::StrCat(
          quoted, " is refused on a node with --allowed-command: it would choose or change the "
                  "program that runs"));
    }
    if (!Permitted(kEngineEnv(), name) && !Permitted(policy.allowed, name)) {
      return absl::PermissionDeniedError(absl::StrCat(
          quoted, " is not in the job environment allow-list (the engine's own [",
          absl::StrJoin(kEngineEnv(), ", "), "]",
          policy.allowed.empty() ? "" : absl::StrCat(" and [", absl::StrJoin(policy.allowed, ", "), "]"),
          "); the operator permits more with lockstepd --allowed-env NAME, PREFIX* or *"));
    }
  }
  return absl::OkStatus();
}

}  // namespace daemon
}  // namespace lockstep
