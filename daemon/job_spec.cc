#include "daemon/job_spec.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace lockstep {
namespace daemon {
namespace {

bool HasControl(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
}

// Finite, >= 0 and <= max (0 keeps its meaning: default or no limit).
Status CheckSeconds(const std::string& field, double value, double max) {
  if (!std::isfinite(value) || value < 0 || value > max) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": must be a finite number of seconds in [0, ",
                                                   static_cast<int64_t>(max), "], got ", value));
  }
  return absl::OkStatus();
}

Status CheckLimit(const std::string& field, int64_t value, int64_t max) {
  if (value < 0 || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be in [0, ", max, "] (0 = inherit), got ", value));
  }
  return absl::OkStatus();
}

// Sizes, characters, numbers and ranges, field by field.
Status ValidateFields(const v1::JobSpec& spec) {
  const size_t bytes = spec.ByteSizeLong();
  if (bytes > kMaxJobSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat("spec: ", bytes, " bytes serialized exceeds the limit of ",
                                                   kMaxJobSpecBytes, " bytes (kMaxJobSpecBytes)"));
  }
  // The coordinator stores, and hands every agent, the spec with its
  // defaults filled in, and each agent validates that again: a spec a few
  // bytes under the cap would pass here and fail on every node. The defaults
  // read and write only these four fields, so their size change is measured
  // on a copy of them alone.
  v1::JobSpec scalars;
  scalars.set_min_nodes(spec.min_nodes());
  scalars.set_max_nodes(spec.max_nodes());
  scalars.set_stop_grace_s(spec.stop_grace_s());
  scalars.set_last_call_timeout_s(spec.last_call_timeout_s());
  const size_t before = scalars.ByteSizeLong();
  ApplyJobSpecDefaults(&scalars);
  const size_t with_defaults = bytes + scalars.ByteSizeLong() - before;
  if (with_defaults > kMaxJobSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec: ", bytes, " bytes serialized, ", with_defaults,
        " with its defaults filled in (max_nodes, stop_grace_s, last_call_timeout_s), exceeds the "
        "limit of ", kMaxJobSpecBytes, " bytes (kMaxJobSpecBytes)"));
  }
  RETURN_IF_ERROR(CheckString("spec.name", spec.name(), kMaxJobNameBytes, true));
  if (spec.command_size() > kMaxArgs) {
    return absl::InvalidArgumentError(absl::StrCat("spec.command: ", spec.command_size(),
                                                   " arguments exceeds the limit of ", kMaxArgs));
  }
  for (int i = 0; i < spec.command_size(); ++i) {
    RETURN_IF_ERROR(CheckString(absl::StrCat("spec.command[", i, "]"), spec.command(i),
                                i == 0 ? kMaxPathBytes : kMaxArgBytes, i == 0));
  }
  RETURN_IF_ERROR(CheckString("spec.working_dir", spec.working_dir(), kMaxPathBytes, true));
  RETURN_IF_ERROR(CheckString("spec.run_as", spec.run_as(), kMaxRunAsBytes, true));
  if (spec.env_size() > kMaxEnvEntries) {
    return absl::InvalidArgumentError(absl::StrCat("spec.env: ", spec.env_size(),
                                                   " variables exceeds the limit of ", kMaxEnvEntries));
  }
  for (const auto& [key, value] : spec.env()) {
    if (key.size() > kMaxEnvNameBytes || !IsEnvName(key)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.env: bad variable name ", QuoteForError(key), " (want [A-Za-z_][A-Za-z0-9_]*, at most ",
          kMaxEnvNameBytes, " bytes)"));
    }
    RETURN_IF_ERROR(CheckString(absl::StrCat("spec.env[", key, "]"), value, kMaxArgBytes, false));
  }
  RETURN_IF_ERROR(CheckSeconds("spec.stop_grace_s", spec.stop_grace_s(), kMaxStopGraceSeconds));
  RETURN_IF_ERROR(
      CheckSeconds("spec.last_call_timeout_s", spec.last_call_timeout_s(), kMaxLastCallSeconds));
  RETURN_IF_ERROR(
      CheckSeconds("spec.join_timeout_s", spec.join_timeout_s(), kMaxJoinTimeoutSeconds));
  RETURN_IF_ERROR(CheckLimit("spec.limits.max_open_files", spec.limits().max_open_files(),
                             kMaxOpenFilesLimit));
  RETURN_IF_ERROR(CheckLimit("spec.limits.max_address_space", spec.limits().max_address_space(),
                             kMaxAddressSpaceLimit));
  RETURN_IF_ERROR(CheckLimit("spec.limits.max_cpu_seconds", spec.limits().max_cpu_seconds(),
                             kMaxCpuSecondsLimit));
  RETURN_IF_ERROR(CheckLimit("spec.limits.max_processes", spec.limits().max_processes(),
                             kMaxProcessesLimit));
  return absl::OkStatus();
}

}  // namespace

// A string field: at most `max_bytes`, no NUL; with `single_line`, no
// control characters at all (newline, ESC, ...).
Status CheckString(const std::string& field, const std::string& value, size_t max_bytes,
                   bool single_line) {
  if (value.size() > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", value.size(),
                                                   " bytes exceeds the limit of ", max_bytes,
                                                   " bytes (", QuoteForError(value), ")"));
  }
  if (value.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": contains a NUL byte: ", QuoteForError(value)));
  }
  if (single_line && HasControl(value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": contains a control character (newline, tab, escape...): ", QuoteForError(value)));
  }
  return absl::OkStatus();
}

bool IsEnvName(const std::string& name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

Status ValidateJobSpec(const v1::JobSpec& spec, const std::vector<std::string>& allowed_commands) {
  if (spec.command_size() == 0 || spec.command(0).empty()) {
    return absl::InvalidArgumentError("spec.command: empty; give the program after `--`");
  }
  RETURN_IF_ERROR(ValidateFields(spec));
  if (!spec.working_dir().empty() && spec.working_dir()[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.working_dir: ", QuoteForError(spec.working_dir()),
        " is a relative path, which each node's agent would take from its own directory; give "
        "an absolute path (the lockstep CLI makes --working-dir absolute for you)"));
  }
  // A relative path would be taken from each node's own working dir (the
  // job's log dir by default), not from where the user typed it. A bare
  // name is a PATH lookup; a working dir (absolute, checked above) makes
  // the path mean the same on every node.
  const std::string& program = spec.command(0);
  if (program[0] != '/' && program.find('/') != std::string::npos && spec.working_dir().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.command: ", QuoteForError(program),
        " is a relative path, and workers start in their own directory on each node; give an "
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
  if (NamesRoot(spec.run_as())) {
    return absl::PermissionDeniedError("spec.run_as: workers never run as root");
  }
  if (!allowed_commands.empty() &&
      std::find(allowed_commands.begin(), allowed_commands.end(), spec.command(0)) ==
          allowed_commands.end()) {
    return absl::PermissionDeniedError(absl::StrCat("spec.command: ", QuoteForError(spec.command(0)),
                                                    " is not in the allowed list [",
                                                    absl::StrJoin(allowed_commands, ", "), "]"));
  }
  return absl::OkStatus();
}

bool NamesRoot(const std::string& run_as) {
  // As the agent's user lookup reads it: digits (absl::SimpleAtoi, so "00"
  // and " 0" too) are a uid, anything else a name.
  uint32_t uid = 1;
  return run_as == "root" || (absl::SimpleAtoi(run_as, &uid) && uid == 0);
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
