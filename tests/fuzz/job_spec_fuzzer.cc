// job_spec_fuzzer: bytes -> lockstep.v1.SubmitJobRequest (ParseFromArray:
// the decoder gRPC runs on the coordinator's SubmitJob) -> the checks
// Coordinator::SubmitJob runs (ValidateJobSpec, then CheckJobEnv, then
// ApplyJobSpecDefaults) under three operator policies. Whatever they accept
// must have every property daemon/job_spec.h and daemon/job_env.h promise;
// whatever they refuse must be refused with the documented code and a short,
// printable message. The invariants are written out here from the headers
// and daemon/README.md (Limits, Security), not taken from the validator.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/worker_env.h"
#include "daemon/job_env.h"
#include "daemon/job_spec.h"
#include "lockstep/v1/coordinator.pb.h"
#include "tests/fuzz/fuzz_check.h"

namespace lockstep {
namespace daemon {
namespace {

using fuzz::CheckErrorMessage;

// The longest message a refusal may carry. The validator quotes at most
// kMaxQuotedBytes (64) of a value, escaped to at most 4 bytes each plus
// "...(N bytes)": under 300 bytes; a field name is at most "spec.env[" + a
// 256-byte name + "]"; the rest is fixed text and, for the allow-lists, the
// short operator lists below.
constexpr size_t kMaxErrorBytes = 1024;

struct Policy {
  std::vector<std::string> allowed_commands;
  JobEnvPolicy env;
};

// lockstepd's defaults; a node with --allowed-command and --allowed-env=*;
// an operator who tries to permit loader variables (they stay refused).
const std::vector<Policy>& Policies() {
  static const auto* policies = new std::vector<Policy>{
      {{}, {{}, false}},
      {{"/usr/bin/python3", "/bin/train"}, {{"*"}, true}},
      {{}, {{"MY_*", "PATH", "LD_LIBRARY_PATH", "LD_*", "BASH_ENV"}, false}},
  };
  return *policies;
}

bool HasByte(const std::string& s, bool any_control) {
  for (unsigned char c : s) {
    if (c == 0) return true;
    if (any_control && (c < 0x20 || c == 0x7f)) return true;
  }
  return false;
}

bool IsVariableName(const std::string& s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) {
      return false;
    }
  }
  return true;
}

bool SecondsOk(double s, double max) { return std::isfinite(s) && s >= 0 && s <= max; }

// What ValidateJobSpec promises about a spec it accepts (job_spec.h).
void CheckAcceptedSpec(const v1::JobSpec& spec, const std::vector<std::string>& allowed_commands) {
  const std::string s = spec.ShortDebugString().substr(0, 300);
  FUZZ_CHECK(spec.ByteSizeLong() <= kMaxJobSpecBytes, s);
  FUZZ_CHECK(spec.command_size() >= 1 && spec.command_size() <= kMaxArgs, s);
  const std::string& program = spec.command(0);
  FUZZ_CHECK(!program.empty() && program.size() <= kMaxPathBytes, s);
  FUZZ_CHECK(!HasByte(program, true), "control character in command[0]: " + s);
  for (int i = 1; i < spec.command_size(); ++i) {
    FUZZ_CHECK(spec.command(i).size() <= kMaxArgBytes, s);
    FUZZ_CHECK(!HasByte(spec.command(i), false), "NUL in an argument: " + s);
  }
  FUZZ_CHECK(spec.name().size() <= kMaxJobNameBytes && !HasByte(spec.name(), true), s);
  FUZZ_CHECK(spec.working_dir().size() <= kMaxPathBytes && !HasByte(spec.working_dir(), true), s);
  FUZZ_CHECK(spec.run_as().size() <= kMaxRunAsBytes && !HasByte(spec.run_as(), true), s);
  FUZZ_CHECK(spec.run_as() != "root" && spec.run_as() != "0", "workers as root: " + s);
  FUZZ_CHECK(spec.env_size() <= kMaxEnvEntries, s);
  for (const auto& [name, value] : spec.env()) {
    FUZZ_CHECK(name.size() <= kMaxEnvNameBytes && IsVariableName(name), "env name: " + s);
    FUZZ_CHECK(value.size() <= kMaxArgBytes && !HasByte(value, false), "env value: " + s);
  }
  FUZZ_CHECK(SecondsOk(spec.stop_grace_s(), kMaxStopGraceSeconds),
             absl::StrCat("stop_grace_s ", spec.stop_grace_s(), " accepted"));
  FUZZ_CHECK(SecondsOk(spec.last_call_timeout_s(), kMaxLastCallSeconds),
             absl::StrCat("last_call_timeout_s ", spec.last_call_timeout_s(), " accepted"));
  FUZZ_CHECK(SecondsOk(spec.join_timeout_s(), kMaxJoinTimeoutSeconds),
             absl::StrCat("join_timeout_s ", spec.join_timeout_s(), " accepted"));
  const v1::ResourceLimits& limits = spec.limits();
  FUZZ_CHECK(limits.max_open_files() >= 0 && limits.max_open_files() <= kMaxOpenFilesLimit,
             absl::StrCat("max_open_files ", limits.max_open_files(), " accepted"));
  FUZZ_CHECK(limits.max_address_space() >= 0 && limits.max_address_space() <= kMaxAddressSpaceLimit,
             absl::StrCat("max_address_space ", limits.max_address_space(), " accepted"));
  FUZZ_CHECK(limits.max_cpu_seconds() >= 0 && limits.max_cpu_seconds() <= kMaxCpuSecondsLimit,
             absl::StrCat("max_cpu_seconds ", limits.max_cpu_seconds(), " accepted"));
  FUZZ_CHECK(limits.max_processes() >= 0 && limits.max_processes() <= kMaxProcessesLimit,
             absl::StrCat("max_processes ", limits.max_processes(), " accepted"));
  FUZZ_CHECK(spec.working_dir().empty() || spec.working_dir()[0] == '/', "relative working_dir: " + s);
  FUZZ_CHECK(program[0] == '/' || program.find('/') == std::string::npos || !spec.working_dir().empty(),
             "relative command[0] without a working dir: " + s);
  const int max_nodes = spec.max_nodes() == 0 ? spec.min_nodes() : spec.max_nodes();
  FUZZ_CHECK(spec.min_nodes() >= 1 && spec.min_nodes() <= max_nodes && max_nodes <= kMaxNodes, s);
  FUZZ_CHECK(spec.nproc_per_node() >= 1 && spec.nproc_per_node() <= kMaxProcPerNode, s);
  FUZZ_CHECK(spec.max_restarts() >= 0 && spec.max_restarts() <= kMaxRestarts, s);
  if (!allowed_commands.empty()) {
    bool listed = false;
    for (const auto& c : allowed_commands) listed = listed || c == program;
    FUZZ_CHECK(listed, "command not in the allow-list: " + s);
  }
}

bool MatchesAny(const std::vector<std::string>& patterns, const std::string& name) {
  for (const auto& p : patterns) {
    if (!p.empty() && p.back() == '*' ? absl::StartsWith(name, p.substr(0, p.size() - 1)) : p == name) {
      return true;
    }
  }
  return false;
}

// What CheckJobEnv promises (job_env.h, daemon/README.md "Job environment").
void CheckAcceptedEnv(const v1::JobSpec& spec, const JobEnvPolicy& policy) {
  static const auto* loader = new std::vector<std::string>{
      "GCONV_PATH", "GLIBC_TUNABLES",   "LOCPATH",  "NLSPATH", "HOSTALIASES",
      "RESOLV_HOST_CONF", "BASH_ENV", "ENV", "MALLOC_TRACE"};
  static const auto* program = new std::vector<std::string>{
      "PATH",     "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME",        "PERL5LIB", "PERL5OPT",
      "RUBYLIB",  "RUBYOPT",    "NODE_OPTIONS",  "JAVA_TOOL_OPTIONS", "CLASSPATH"};
  static const auto* contract = new std::vector<std::string>{
      "LOCKSTEP_RANK", "LOCKSTEP_STORE", "LOCKSTEP_STORE_TOKEN", "LOCKSTEP_AGENT_TOKEN",
      "LOCKSTEP_FENCE_FD", "LOCKSTEP_STATUS_FD", "RANK", "LOCAL_RANK", "WORLD_SIZE",
      "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"};
  static const auto* engine = new std::vector<std::string>{
      "LOCKSTEP_BACKEND", "LOCKSTEP_GLOO_HOST", "LOCKSTEP_LOG_LEVEL", "LOCKSTEP_KEEP_FREED_MEMORY",
      "NCCL_*", "GLOO_*", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES"};
  const std::string s = spec.ShortDebugString().substr(0, 300);
  for (const auto& [name, value] : spec.env()) {
    FUZZ_CHECK(!absl::StartsWith(name, "LD_") && !MatchesAny(*loader, name),
               "loader variable accepted: " + name);
    FUZZ_CHECK(!MatchesAny(*contract, name) && !IsWorkerEnvName(name),
               "worker contract variable accepted: " + name);
    FUZZ_CHECK(!policy.command_allow_list || !MatchesAny(*program, name),
               "program-selection variable accepted under --allowed-command: " + name);
    FUZZ_CHECK(MatchesAny(*engine, name) || MatchesAny(policy.allowed, name),
               "variable outside the allow-list accepted: " + name);
  }
}

// Filler arguments ("xxx...") until `spec` serializes to exactly `target`
// bytes. Each filler is 16 KiB..kMaxArgBytes, so its length prefix is 3
// bytes and the size comes out exact. False when it cannot (too close to
// the target already, or no room for two more arguments).
bool PadTo(v1::JobSpec* spec, size_t target) {
  constexpr size_t kFieldOverhead = 4;  // tag + 3-byte length
  constexpr size_t kMinFiller = 16 * 1024;
  const size_t size = spec->ByteSizeLong();
  if (size > target || spec->command_size() + 2 > kMaxArgs) return false;
  size_t room = target - size;
  while (room >= kMaxArgBytes + kFieldOverhead + kMinFiller + kFieldOverhead) {
    spec->add_command(std::string(kMaxArgBytes, 'x'));
    room -= kMaxArgBytes + kFieldOverhead;
  }
  if (room < kMinFiller + kFieldOverhead || room - kFieldOverhead > kMaxArgBytes) return false;
  spec->add_command(std::string(room - kFieldOverhead, 'x'));
  FUZZ_CHECK(spec->ByteSizeLong() == target, std::to_string(spec->ByteSizeLong()));
  return true;
}

// The submit path for one policy. Returns whether the spec was accepted.
bool Submit(const v1::JobSpec& spec, const Policy& policy) {
  Status valid = ValidateJobSpec(spec, policy.allowed_commands);
  CheckErrorMessage(valid, kMaxErrorBytes, "ValidateJobSpec");
  FUZZ_CHECK(valid.ok() || absl::IsInvalidArgument(valid) || absl::IsPermissionDenied(valid),
             valid.ToString());
  if (!valid.ok()) return false;
  CheckAcceptedSpec(spec, policy.allowed_commands);

  Status env = CheckJobEnv(spec, policy.env);
  CheckErrorMessage(env, kMaxErrorBytes, "CheckJobEnv");
  FUZZ_CHECK(env.ok() || absl::IsPermissionDenied(env), env.ToString());
  if (!env.ok()) return false;
  CheckAcceptedEnv(spec, policy.env);

  // The coordinator stores and hands agents the spec with its defaults
  // filled in, and each agent validates it again before it spawns anything:
  // an accepted spec must stay valid with its defaults.
  v1::JobSpec full = spec;
  ApplyJobSpecDefaults(&full);
  FUZZ_CHECK(full.max_nodes() >= full.min_nodes(), full.ShortDebugString().substr(0, 300));
  FUZZ_CHECK(full.stop_grace_s() > 0, full.ShortDebugString().substr(0, 300));
  FUZZ_CHECK(full.max_nodes() == full.min_nodes() || full.last_call_timeout_s() > 0,
             full.ShortDebugString().substr(0, 300));
  Status again = ValidateJobSpec(full, policy.allowed_commands);
  FUZZ_CHECK(again.ok(), "the agent refuses an accepted spec with its defaults: " + again.ToString());
  Status env_again = CheckJobEnv(full, policy.env);
  FUZZ_CHECK(env_again.ok(), env_again.ToString());
  return true;
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  lockstep::fuzz::QuietProtobufLog();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lockstep::daemon;  // NOLINT
  lockstep::v1::SubmitJobRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  bool accepted_by_default = false;
  for (const Policy& policy : Policies()) {
    const bool accepted = Submit(request.spec(), policy);
    if (&policy == &Policies()[0]) accepted_by_default = accepted;
  }
  // Inputs stay small, so the size cap is probed by padding. The cap holds
  // for the spec as agents get it, with its defaults filled in
  // (job_spec.h): the spec grown to exactly the cap that way is accepted;
  // one byte more is refused.
  if (accepted_by_default) {
    lockstep::v1::JobSpec padded = request.spec();
    lockstep::v1::JobSpec full = padded;
    ApplyJobSpecDefaults(&full);
    const size_t growth = full.ByteSizeLong() - padded.ByteSizeLong();
    if (PadTo(&padded, kMaxJobSpecBytes - growth)) {
      FUZZ_CHECK(Submit(padded, Policies()[0]), "a spec at the size cap is refused");
      padded.mutable_command(padded.command_size() - 1)->push_back('x');
      lockstep::Status over = ValidateJobSpec(padded, {});
      FUZZ_CHECK(absl::IsInvalidArgument(over),
                 "a spec one byte over the size cap (with its defaults): " + over.ToString());
      CheckErrorMessage(over, kMaxErrorBytes, "ValidateJobSpec (over the size cap)");
    }
  }
  return 0;
}
