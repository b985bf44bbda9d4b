#include "common/worker_env.h"

#include <initializer_list>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace lockstep {
namespace {

namespace we = worker_env;

// The first of `names` that is set and non-empty, or "".
std::string Read(const Getenv& getenv, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const char* v = getenv(name);
    if (v != nullptr && *v != '\0') return v;
  }
  return "";
}

// Reads the first of `names` that is set into *out; returns whether one was.
StatusOr<bool> ReadInt(const Getenv& getenv, std::initializer_list<const char*> names, int* out) {
  for (const char* name : names) {
    const char* v = getenv(name);
    if (v == nullptr || *v == '\0') continue;
    if (!absl::SimpleAtoi(v, out)) {
      return absl::InvalidArgumentError(
          absl::StrCat("environment variable ", name, "='", v, "' is not an integer"));
    }
    return true;
  }
  return false;
}

}  // namespace

bool WorkerEnv::operator==(const WorkerEnv& o) const {
  auto tie = [](const WorkerEnv& e) {
    return std::tie(e.job_id, e.rank, e.local_rank, e.world_size, e.local_world_size, e.node_rank,
                    e.num_nodes, e.round, e.restart_count, e.max_restarts, e.store_address,
                    e.store_token,
                    e.agent_address, e.agent_token, e.node_addr, e.master_addr, e.tls.ca,
                    e.tls.cert, e.tls.key);
  };
  return tie(*this) == tie(o);
}

StatusOr<WorkerEnv> ParseWorkerEnv(const Getenv& getenv) {
  WorkerEnv env;
  ASSIGN_OR_RETURN(bool has_rank, ReadInt(getenv, {we::kRank, we::kTorchRank}, &env.rank));
  ASSIGN_OR_RETURN(bool has_world,
                   ReadInt(getenv, {we::kWorldSize, we::kTorchWorldSize}, &env.world_size));
  if (!has_rank) return absl::InvalidArgumentError("LOCKSTEP_RANK (or RANK) is not set");
  if (!has_world) {
    return absl::InvalidArgumentError("LOCKSTEP_WORLD_SIZE (or WORLD_SIZE) is not set");
  }
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", env.rank, " is outside the world of size ", env.world_size));
  }
  env.local_rank = env.rank;
  env.local_world_size = env.world_size;
  RETURN_IF_ERROR(ReadInt(getenv, {we::kLocalRank, we::kTorchLocalRank}, &env.local_rank).status());
  RETURN_IF_ERROR(ReadInt(getenv, {we::kLocalWorldSize, we::kTorchLocalWorldSize},
                          &env.local_world_size)
                      .status());
  RETURN_IF_ERROR(ReadInt(getenv, {we::kNodeRank, we::kTorchGroupRank}, &env.node_rank).status());
  RETURN_IF_ERROR(ReadInt(getenv, {we::kNumNodes}, &env.num_nodes).status());
  RETURN_IF_ERROR(ReadInt(getenv, {we::kRound}, &env.round).status());
  RETURN_IF_ERROR(
      ReadInt(getenv, {we::kRestartCount, we::kTorchRestartCount}, &env.restart_count).status());
  RETURN_IF_ERROR(ReadInt(getenv, {we::kTorchMaxRestarts}, &env.max_restarts).status());
  const std::string job = Read(getenv, {we::kJobId, we::kTorchRunId});
  if (!job.empty()) env.job_id = job;
  env.store_address = Read(getenv, {we::kStore});
  env.store_token = Read(getenv, {we::kStoreToken});
  env.agent_address = Read(getenv, {we::kAgent});
  env.agent_token = Read(getenv, {we::kAgentToken});
  env.node_addr = Read(getenv, {we::kNodeAddr});
  const std::string master = Read(getenv, {we::kMasterAddr});
  const std::string port = Read(getenv, {we::kMasterPort});
  if (!master.empty() || !port.empty()) env.master_addr = master + ":" + port;
  env.tls = ReadWorkerTlsPem(getenv);
  return env;
}

WorkerTlsPem ReadWorkerTlsPem(const Getenv& getenv) {
  WorkerTlsPem tls;
  tls.ca = Read(getenv, {we::kTlsCaPem});
  tls.cert = Read(getenv, {we::kTlsCertPem});
  tls.key = Read(getenv, {we::kTlsKeyPem});
  return tls;
}

WorkerIdentity ReadWorkerIdentity(const Getenv& getenv) {
  WorkerIdentity id;
  const std::string job = Read(getenv, {we::kJobId, we::kTorchRunId});
  if (!job.empty()) id.job_id = job;
  int v = 0;
  auto rank = ReadInt(getenv, {we::kRank, we::kTorchRank}, &v);
  if (rank.ok() && *rank) id.rank = v;
  auto round = ReadInt(getenv, {we::kRound}, &v);
  if (round.ok() && *round) id.round = v;
  return id;
}

bool IsWorkerEnvName(const std::string& name) {
  static const char* const kNames[] = {
      we::kJobId,           we::kRank,           we::kLocalRank,          we::kWorldSize,
      we::kLocalWorldSize,  we::kNodeRank,       we::kNumNodes,           we::kRound,
      we::kRestartCount,    we::kStore,          we::kStoreToken,         we::kAgent,
      we::kAgentToken,      we::kNodeAddr,       we::kTorchRank,          we::kTorchLocalRank,
      we::kTorchWorldSize,  we::kTorchLocalWorldSize, we::kTorchGroupRank, we::kTorchRestartCount,
      we::kTorchRunId,      we::kMasterAddr,     we::kMasterPort,         we::kTorchGroupWorldSize,
      we::kTorchRoleRank,   we::kTorchRoleWorldSize, we::kTorchRoleName,  we::kTorchMaxRestarts,
      we::kTlsCaPem,        we::kTlsCertPem,     we::kTlsKeyPem};
  for (const char* n : kNames) {
    if (name == n) return true;
  }
  return false;
}

std::vector<std::pair<std::string, std::string>> WorkerEnvVars(const WorkerEnv& env) {
  std::vector<std::pair<std::string, std::string>> vars;
  auto set = [&](const char* name, const std::string& value) { vars.emplace_back(name, value); };
  auto set_if = [&](const char* name, const std::string& value) {
    if (!value.empty()) set(name, value);
  };
  set(we::kJobId, env.job_id);
  set(we::kRank, std::to_string(env.rank));
  set(we::kLocalRank, std::to_string(env.local_rank));
  set(we::kWorldSize, std::to_string(env.world_size));
  set(we::kLocalWorldSize, std::to_string(env.local_world_size));
  set(we::kNodeRank, std::to_string(env.node_rank));
  set(we::kNumNodes, std::to_string(env.num_nodes));
  set(we::kRound, std::to_string(env.round));
  set(we::kRestartCount, std::to_string(env.restart_count));
  set_if(we::kStore, env.store_address);
  set_if(we::kStoreToken, env.store_token);
  set_if(we::kAgent, env.agent_address);
  set_if(we::kAgentToken, env.agent_token);
  set_if(we::kNodeAddr, env.node_addr);
  set_if(we::kTlsCaPem, env.tls.ca);
  set_if(we::kTlsCertPem, env.tls.cert);
  set_if(we::kTlsKeyPem, env.tls.key);
  set(we::kTorchRank, std::to_string(env.rank));
  set(we::kTorchLocalRank, std::to_string(env.local_rank));
  set(we::kTorchWorldSize, std::to_string(env.world_size));
  set(we::kTorchLocalWorldSize, std::to_string(env.local_world_size));
  set(we::kTorchGroupRank, std::to_string(env.node_rank));
  const auto colon = env.master_addr.rfind(':');
  set(we::kMasterAddr, colon == std::string::npos ? env.master_addr : env.master_addr.substr(0, colon));
  set(we::kMasterPort, colon == std::string::npos ? "" : env.master_addr.substr(colon + 1));
  set(we::kTorchRestartCount, std::to_string(env.restart_count));
  set(we::kTorchMaxRestarts, std::to_string(env.max_restarts));
  set(we::kTorchRunId, env.job_id);
  set(we::kTorchGroupWorldSize, std::to_string(env.num_nodes));
  set(we::kTorchRoleRank, std::to_string(env.rank));
  set(we::kTorchRoleWorldSize, std::to_string(env.world_size));
  set(we::kTorchRoleName, we::kRoleName);
  return vars;
}

}  // namespace lockstep
