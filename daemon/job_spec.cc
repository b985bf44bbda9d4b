#include "daemon/job_spec.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace lockstep {
namespace daemon {

bool IsSafeId(const std::string& id) {
  if (id.empty() || id.size() > 128 || id == "." || id == "..") return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == '-';
  });
}

Status ValidateJobSpec(const v1::JobSpec& spec, const std::vector<std::string>& allowed_commands) {
  if (spec.command_size() == 0 || spec.command(0).empty()) {
    return absl::InvalidArgumentError("spec.command: empty; give the program after `--`");
  }
  // A relative path would be taken from each node's own working dir (the
  // job's log dir by default), not from where the user typed it. A bare
  // name is a PATH lookup; an absolute working dir makes the path mean the
  // same on every node.
  const std::string& program = spec.command(0);
  if (!spec.working_dir().empty() && spec.working_dir()[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.working_dir: \"", spec.working_dir(),
        "\" is a relative path, which each node's agent would take from its own directory; give "
        "an absolute path (the lockstep CLI makes --working-dir absolute for you)"));
  }
  const bool absolute_working_dir = !spec.working_dir().empty() && spec.working_dir()[0] == '/';
  if (program[0] != '/' && program.find('/') != std::string::npos && !absolute_working_dir) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.command: \"", program,
        "\" is a relative path, and workers start in their own directory on each node; give an "
        "absolute path (the lockstep CLI resolves a relative one against the directory you run "
        "it from)"));
  }
  if (spec.min_nodes() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.nodes: min_nodes must be >= 1, got ", spec.min_nodes()));
  }
  int max_nodes = spec.max_nodes() == 0 ? spec.min_nodes() : spec.max_nodes();
  if (max_nodes < spec.min_nodes()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.nodes: min ", spec.min_nodes(),
                                                   " > max ", max_nodes, " (", spec.min_nodes(),
                                                   ":", max_nodes, ")"));
  }
  if (max_nodes > kMaxNodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.nodes: max ", max_nodes, " exceeds the limit ", kMaxNodes));
  }
  if (spec.nproc_per_node() < 1 || spec.nproc_per_node() > kMaxProcPerNode) {
    return absl::InvalidArgumentError(absl::StrCat("spec.nproc_per_node: must be in [1, ",
                                                   kMaxProcPerNode, "], got ",
                                                   spec.nproc_per_node()));
  }
  if (spec.max_restarts() < 0 || spec.max_restarts() > kMaxRestarts) {
    return absl::InvalidArgumentError(absl::StrCat("spec.max_restarts: must be in [0, ",
                                                   kMaxRestarts, "], got ", spec.max_restarts()));
  }
  for (const auto& [key, value] : spec.env()) {
    if (key.empty() || key.find('=') != std::string::npos || key.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("spec.env: bad variable name \"", key, "\""));
    }
  }
  if (spec.stop_grace_s() < 0 || spec.last_call_timeout_s() < 0 || spec.join_timeout_s() < 0) {
    return absl::InvalidArgumentError(
        "spec: stop_grace_s, last_call_timeout_s and join_timeout_s must be >= 0");
  }
  if (spec.limits().max_open_files() < 0 || spec.limits().max_address_space() < 0 ||
      spec.limits().max_cpu_seconds() < 0) {
    return absl::InvalidArgumentError("spec.limits: limits must be >= 0");
  }
  if (spec.run_as() == "root" || spec.run_as() == "0") {
    return absl::PermissionDeniedError("spec.run_as: workers never run as root");
  }
  if (!allowed_commands.empty() &&
      std::find(allowed_commands.begin(), allowed_commands.end(), spec.command(0)) ==
          allowed_commands.end()) {
    return absl::PermissionDeniedError(absl::StrCat("spec.command: \"", spec.command(0),
                                                    "\" is not in the allowed list [",
                                                    absl::StrJoin(allowed_commands, ", "), "]"));
  }
  return absl::OkStatus();
}

void ApplyJobSpecDefaults(v1::JobSpec* spec) {
  if (spec->max_nodes() == 0) spec->set_max_nodes(spec->min_nodes());
  if (spec->stop_grace_s() == 0) spec->set_stop_grace_s(kDefaultStopGraceSeconds);
  if (spec->last_call_timeout_s() == 0 && spec->max_nodes() > spec->min_nodes()) {
    spec->set_last_call_timeout_s(kDefaultLastCallSeconds);
  }
}

}  // namespace daemon
}  // namespace lockstep
