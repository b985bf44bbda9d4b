#include "common/worker_env.h"

#include <algorithm>
#include <initializer_list>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/address.h"

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

// One value of the contract and the variable it was read from ("" when
// neither name is set; then `value` keeps its default).
template <typename T>
struct Found {
  std::string name;
  T value{};
  bool set() const { return !name.empty(); }
  // "RANK=2", for messages.
  std::string Describe() const { return absl::StrCat(name, "=", value); }
};

// Whether the two names of one value disagree: the agent writes both
// equal, so a difference is the user's (a LOCKSTEP_RANK left exported in
// the shell beside torchrun's RANK). Taking either would make this process
// someone it is not; refuse, naming both.
Status Differ(const char* ours, const std::string& ours_value, const char* theirs,
              const std::string& theirs_value) {
  return absl::InvalidArgumentError(absl::StrCat(
      ours, "=", ours_value, " and ", theirs, "=", theirs_value,
      " differ: the agent sets both to the same value, so one is left over from elsewhere (an "
      "export in the shell?); unset it or make them equal"));
}

// The integer under LOCKSTEP_* name `ours` or torchrun's `theirs` (nullptr:
// none); both set must agree.
StatusOr<Found<int>> ReadIntEither(const Getenv& getenv, const char* ours, const char* theirs,
                                   int default_value) {
  Found<int> found;
  found.value = default_value;
  ASSIGN_OR_RETURN(bool has_ours, ReadInt(getenv, {ours}, &found.value));
  if (has_ours) found.name = ours;
  if (theirs == nullptr) return found;
  int other = 0;
  ASSIGN_OR_RETURN(bool has_theirs, ReadInt(getenv, {theirs}, &other));
  if (!has_theirs) return found;
  if (has_ours && other != found.value) {
    return Differ(ours, getenv(ours), theirs, getenv(theirs));
  }
  if (!has_ours) {
    found.name = theirs;
    found.value = other;
  }
  return found;
}

// The string form of ReadIntEither.
StatusOr<Found<std::string>> ReadEither(const Getenv& getenv, const char* ours,
                                        const char* theirs) {
  Found<std::string> found;
  const std::string a = Read(getenv, {ours});
  const std::string b = Read(getenv, {theirs});
  if (!a.empty() && !b.empty() && a != b) return Differ(ours, a, theirs, b);
  if (!a.empty()) return Found<std::string>{ours, a};
  if (!b.empty()) return Found<std::string>{theirs, b};
  return found;
}

// "X=5 is outside 0 to 1 (why)".
Status Outside(const std::string& what, int low, int high, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, " is outside ", low, " to ", high, " (", why, ")"));
}

// The node layout (local rank and size, node rank and count) of a rank
// already in its world, range-checked, since later code divides by the
// local world size and takes the local rank as its CUDA device:
// 1 <= local world size <= world size, 0 <= local rank < local world size,
// 1 <= nodes <= world size, 0 <= node rank (< nodes where given). Unset,
// the local world is the whole world, the local rank the rank's place on
// its node (rank mod local world size), the node rank its node's place
// (rank / local world size) and the nodes as many as the world fills
// (at least the node rank's).
// Whether the layout is the uniform one (every node the same size, ranks
// numbered node by node) is left to the code that needs it: the shm
// backend across hosts checks it (ddp/hierarchical_communicator.h); Gloo
// and NCCL do not need it, and torchrun may start nodes of different sizes.
Status ParseLayout(const Getenv& getenv, const Found<int>& world, WorkerEnv* env) {
  ASSIGN_OR_RETURN(auto local_world, ReadIntEither(getenv, we::kLocalWorldSize,
                                                   we::kTorchLocalWorldSize, env->world_size));
  if (local_world.set() && (local_world.value < 1 || local_world.value > world.value)) {
    return Outside(local_world.Describe(), 1, world.value, world.Describe());
  }
  env->local_world_size = local_world.value;
  ASSIGN_OR_RETURN(auto local_rank, ReadIntEither(getenv, we::kLocalRank, we::kTorchLocalRank,
                                                  env->rank % env->local_world_size));
  if (local_rank.value < 0 || local_rank.value >= env->local_world_size) {
    return Outside(local_rank.Describe(), 0, env->local_world_size - 1,
                   local_world.set()
                       ? local_world.Describe()
                       : absl::StrCat("LOCAL_WORLD_SIZE is unset, so ", world.Describe()));
  }
  env->local_rank = local_rank.value;
  // Unset, the node rank and count follow from the node size as the local
  // rank does (ranks numbered node by node): ranks 2 and 3 of a world of 4
  // with LOCAL_WORLD_SIZE=2 are node 1 of 2. (Node 0 of 1 before: the shm
  // backend across hosts then refused ranks 2 and 3 and the others waited.)
  const int lws = env->local_world_size;
  ASSIGN_OR_RETURN(auto nodes, ReadIntEither(getenv, we::kNumNodes, we::kTorchGroupWorldSize,
                                             (world.value + lws - 1) / lws));
  if (nodes.set() && (nodes.value < 1 || nodes.value > world.value)) {
    return Outside(nodes.Describe(), 1, world.value, world.Describe());
  }
  env->num_nodes = nodes.value;
  ASSIGN_OR_RETURN(auto node_rank,
                   ReadIntEither(getenv, we::kNodeRank, we::kTorchGroupRank, env->rank / lws));
  if (node_rank.value < 0) {
    return absl::InvalidArgumentError(absl::StrCat(node_rank.Describe(), " is negative"));
  }
  if (nodes.set() && node_rank.value >= nodes.value) {
    return Outside(node_rank.Describe(), 0, nodes.value - 1, nodes.Describe());
  }
  env->node_rank = node_rank.value;
  if (!nodes.set()) env->num_nodes = std::max(env->num_nodes, env->node_rank + 1);
  return absl::OkStatus();
}

// MASTER_ADDR (bracketed if IPv6) and MASTER_PORT, one of them set. Checked
// on every rank before anything waits: a port out of range was taken mod
// 65536 (70000 listened on 4464), port 0 or none made rank 0 wait out its
// timeout for itself, and one rank refusing alone left the others waiting
// for it. MASTER_PORT alone (an empty host) is OpenStore's to refuse, where
// rank 0's store would need a host: under lockstepd only the store is used.
Status CheckMaster(const std::string& master, const std::string& port) {
  if (port.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("MASTER_PORT is not set (MASTER_ADDR='", master, "' is)"));
  }
  if (!IsPort(port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("MASTER_PORT='", port, "' is not a port (1 to 65535 in digits)"));
  }
  if (!master.empty() && !IsDialableAddress(JoinHostPort(master, port))) {
    return absl::InvalidArgumentError(
        absl::StrCat("MASTER_ADDR='", master, "' is not a host name or address"));
  }
  return absl::OkStatus();
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
  ASSIGN_OR_RETURN(auto rank, ReadIntEither(getenv, we::kRank, we::kTorchRank, 0));
  ASSIGN_OR_RETURN(auto world, ReadIntEither(getenv, we::kWorldSize, we::kTorchWorldSize, 1));
  if (!rank.set()) return absl::InvalidArgumentError("LOCKSTEP_RANK (or RANK) is not set");
  if (!world.set()) {
    return absl::InvalidArgumentError("LOCKSTEP_WORLD_SIZE (or WORLD_SIZE) is not set");
  }
  if (world.value < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(world.Describe(), " is not a world size (at least 1)"));
  }
  if (rank.value < 0 || rank.value >= world.value) {
    return absl::InvalidArgumentError(absl::StrCat(rank.Describe(), " is outside the world of ",
                                                   world.Describe(), " ranks (0 to ",
                                                   world.value - 1, ")"));
  }
  env.rank = rank.value;
  env.world_size = world.value;
  RETURN_IF_ERROR(ParseLayout(getenv, world, &env));
  ASSIGN_OR_RETURN(const bool round_set, ReadInt(getenv, {we::kRound}, &env.round));
  ASSIGN_OR_RETURN(auto restarts,
                   ReadIntEither(getenv, we::kRestartCount, we::kTorchRestartCount, 0));
  env.restart_count = restarts.value;
  RETURN_IF_ERROR(ReadInt(getenv, {we::kTorchMaxRestarts}, &env.max_restarts).status());
  if (env.round < 0) {
    return absl::InvalidArgumentError(absl::StrCat("LOCKSTEP_ROUND=", env.round, " is negative"));
  }
  if (env.restart_count < 0) {
    return absl::InvalidArgumentError(absl::StrCat(restarts.Describe(), " is negative"));
  }
  if (env.max_restarts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("TORCHELASTIC_MAX_RESTARTS=", env.max_restarts, " is negative"));
  }
  // Without lockstepd's round (torchrun), each restart is a round of its
  // own: a store that outlives the workers (LOCKSTEP_STORE=file:) gives the
  // restarted ranks a fresh namespace, where they found their own keys and
  // refused to join again ("already joined") until the budget was spent.
  if (!round_set) env.round = env.restart_count;
  ASSIGN_OR_RETURN(auto job, ReadEither(getenv, we::kJobId, we::kTorchRunId));
  if (job.set()) env.job_id = job.value;
  env.store_address = Read(getenv, {we::kStore});
  env.store_token = Read(getenv, {we::kStoreToken});
  env.agent_address = Read(getenv, {we::kAgent});
  env.agent_token = Read(getenv, {we::kAgentToken});
  env.node_addr = Read(getenv, {we::kNodeAddr});
  const std::string master = Read(getenv, {we::kMasterAddr});
  const std::string port = Read(getenv, {we::kMasterPort});
  if (!master.empty() || !port.empty()) {
    // A bare IPv6 address (torchrun takes MASTER_ADDR=::1) is bracketed,
    // else "::1:29500" would read as a host with no port.
    RETURN_IF_ERROR(CheckMaster(master, port));
    env.master_addr = JoinHostPort(master, port);
  }
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
  auto job = ReadEither(getenv, we::kJobId, we::kTorchRunId);
  if (job.ok() && job->set()) id.job_id = job->value;
  auto rank = ReadIntEither(getenv, we::kRank, we::kTorchRank, -1);
  if (rank.ok()) id.rank = rank->value;
  int v = 0;
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
  // torchrun's MASTER_ADDR is bare ("fd00::1"); env.master_addr is
  // "[fd00::1]:29500" (JoinHostPort).
  set(we::kMasterAddr, HostOfAddress(env.master_addr));
  set(we::kMasterPort, PortOfAddress(env.master_addr));
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
