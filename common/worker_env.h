// The worker contract in one place (DESIGN.md, "Worker environment"): the
// names of the variables a worker gets, their parsed form, the one parser
// every reader uses and the one writer the agent uses.
//
// The agent sets every LOCKSTEP_* name and torchrun's names beside them
// (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
// MASTER_PORT, TORCHELASTIC_RESTART_COUNT), so a program written for
// torchrun runs unchanged. A reader takes the LOCKSTEP_* name or, where it
// is unset, torchrun's, so a worker started by hand the torchrun way (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT) parses the same. Where both names
// of one value are set they must agree: the agent writes them equal, so a
// difference is the user's (a stale exported LOCKSTEP_RANK beside
// torchrun's RANK), and taking either would make the process another rank
// (ParseWorkerEnv refuses it). The fence and status page descriptors are common/worker_link.h's.
//
// Thread safety: everything here is a pure function of its arguments.
#ifndef LOCKSTEP_COMMON_WORKER_ENV_H_
#define LOCKSTEP_COMMON_WORKER_ENV_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace lockstep {
namespace worker_env {

inline constexpr char kJobId[] = "LOCKSTEP_JOB_ID";
inline constexpr char kRank[] = "LOCKSTEP_RANK";
inline constexpr char kLocalRank[] = "LOCKSTEP_LOCAL_RANK";
inline constexpr char kWorldSize[] = "LOCKSTEP_WORLD_SIZE";
inline constexpr char kLocalWorldSize[] = "LOCKSTEP_LOCAL_WORLD_SIZE";
inline constexpr char kNodeRank[] = "LOCKSTEP_NODE_RANK";
inline constexpr char kNumNodes[] = "LOCKSTEP_NUM_NODES";
inline constexpr char kRound[] = "LOCKSTEP_ROUND";
inline constexpr char kRestartCount[] = "LOCKSTEP_RESTART_COUNT";
inline constexpr char kStore[] = "LOCKSTEP_STORE";
inline constexpr char kStoreToken[] = "LOCKSTEP_STORE_TOKEN";
inline constexpr char kAgent[] = "LOCKSTEP_AGENT";
inline constexpr char kAgentToken[] = "LOCKSTEP_AGENT_TOKEN";
inline constexpr char kNodeAddr[] = "LOCKSTEP_NODE_ADDR";
// The cluster's mutual TLS material as PEM text (rendezvous/tls.h): the CA,
// and the node's certificate and key, which the worker's store client and
// progress reporter present. In the environment, not in files, because a
// worker may run as another uid (--run-as, --job-uids) that cannot read
// the daemon's 0600 key files; /proc/PID/environ is readable only by the
// worker's own uid (and root). Unset when the daemon has no TLS.
inline constexpr char kTlsCaPem[] = "LOCKSTEP_TLS_CA_PEM";
inline constexpr char kTlsCertPem[] = "LOCKSTEP_TLS_CERT_PEM";
inline constexpr char kTlsKeyPem[] = "LOCKSTEP_TLS_KEY_PEM";
// torchrun's names.
inline constexpr char kTorchRank[] = "RANK";
inline constexpr char kTorchLocalRank[] = "LOCAL_RANK";
inline constexpr char kTorchWorldSize[] = "WORLD_SIZE";
inline constexpr char kTorchLocalWorldSize[] = "LOCAL_WORLD_SIZE";
inline constexpr char kTorchGroupRank[] = "GROUP_RANK";
inline constexpr char kTorchRestartCount[] = "TORCHELASTIC_RESTART_COUNT";
inline constexpr char kTorchRunId[] = "TORCHELASTIC_RUN_ID";
inline constexpr char kMasterAddr[] = "MASTER_ADDR";
inline constexpr char kMasterPort[] = "MASTER_PORT";
// torchrun's name for LOCKSTEP_NUM_NODES.
inline constexpr char kTorchGroupWorldSize[] = "GROUP_WORLD_SIZE";
// torchrun's other names, written for programs that read them (of these
// the parser reads only TORCHELASTIC_MAX_RESTARTS, the job's restart
// budget, which has no LOCKSTEP_* name). The role is always "default", as
// torchrun's single-role jobs; its rank and world are the job's.
inline constexpr char kTorchRoleRank[] = "ROLE_RANK";
inline constexpr char kTorchRoleWorldSize[] = "ROLE_WORLD_SIZE";
inline constexpr char kTorchRoleName[] = "ROLE_NAME";
inline constexpr char kTorchMaxRestarts[] = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr char kRoleName[] = "default";

}  // namespace worker_env

// LOCKSTEP_TLS_*_PEM: all empty when the worker has no TLS.
struct WorkerTlsPem {
  std::string ca;
  std::string cert;
  std::string key;
  bool operator==(const WorkerTlsPem& o) const {
    return ca == o.ca && cert == o.cert && key == o.key;
  }
};

struct WorkerEnv {
  std::string job_id = "local";
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int node_rank = 0;
  int num_nodes = 1;
  int round = 0;              // LOCKSTEP_ROUND; unset, the restart count (torchrun).
  int restart_count = 0;
  int max_restarts = 0;       // TORCHELASTIC_MAX_RESTARTS: the job's restart budget.
  std::string store_address;  // LOCKSTEP_STORE; may be empty.
  std::string store_token;    // LOCKSTEP_STORE_TOKEN: opens this job's namespaces only.
  std::string agent_address;  // LOCKSTEP_AGENT; empty when not under lockstepd.
  std::string agent_token;    // LOCKSTEP_AGENT_TOKEN: this run's progress token.
  std::string node_addr;      // LOCKSTEP_NODE_ADDR: the agent's advertised host.
  std::string master_addr;    // "MASTER_ADDR:MASTER_PORT", when either is set;
                              // an IPv6 MASTER_ADDR bracketed: "[::1]:29500".
  WorkerTlsPem tls;           // LOCKSTEP_TLS_*_PEM

  bool operator==(const WorkerEnv& o) const;
};

using Getenv = std::function<const char*(const char*)>;

// Parses a worker's environment through `getenv` (tests inject a map).
// Errors: InvalidArgument naming the variable and its value (missing rank
// or world size, a non-integer, a rank outside the world: "RANK=2 is
// outside the world of WORLD_SIZE=2 ranks (0 to 1)"), or naming both
// variables and values when a LOCKSTEP_* name and its torchrun name differ
// (LOCKSTEP_RANK/RANK, LOCKSTEP_WORLD_SIZE/WORLD_SIZE,
// LOCKSTEP_LOCAL_RANK/LOCAL_RANK, LOCKSTEP_LOCAL_WORLD_SIZE/LOCAL_WORLD_SIZE,
// LOCKSTEP_NODE_RANK/GROUP_RANK, LOCKSTEP_NUM_NODES/GROUP_WORLD_SIZE,
// LOCKSTEP_RESTART_COUNT/TORCHELASTIC_RESTART_COUNT,
// LOCKSTEP_JOB_ID/TORCHELASTIC_RUN_ID; integers compare by value), or
// naming the variable, its value and its bounds when the node layout is
// out of range ("LOCAL_RANK=5 is outside 0 to 1 (LOCAL_WORLD_SIZE=2)"):
// 1 <= LOCAL_WORLD_SIZE <= WORLD_SIZE, 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE,
// 1 <= NUM_NODES <= WORLD_SIZE, 0 <= NODE_RANK (< NUM_NODES where given).
// Unset: LOCAL_WORLD_SIZE is WORLD_SIZE, LOCAL_RANK is RANK mod
// LOCAL_WORLD_SIZE, NODE_RANK 0, NUM_NODES 1. Whether every node has the
// same size is not checked here (torchrun may start nodes of different
// sizes; the shm backend across hosts, which needs it, checks it). When
// MASTER_ADDR or MASTER_PORT is set: MASTER_PORT must be 1 to 65535 in
// digits and set, MASTER_ADDR a host name or address (a missing
// MASTER_ADDR is OpenStore's to refuse, where it would serve the store);
// InvalidArgument naming the variable and its value.
StatusOr<WorkerEnv> ParseWorkerEnv(const Getenv& getenv);

// The LOCKSTEP_TLS_*_PEM variables (what ParseWorkerEnv puts in `tls`),
// for readers that need no rank: never fails.
WorkerTlsPem ReadWorkerTlsPem(const Getenv& getenv);

// Who this process is, for log lines and progress reports: never fails.
// job_id "-" and rank -1 when the environment does not say (a program that
// is not a worker); a malformed number, or two names of the value that
// differ, makes the value unknown (-1, "-"), even where a torchrun name
// beside it is well-formed.
struct WorkerIdentity {
  std::string job_id = "-";
  int rank = -1;
  int round = 0;
};
WorkerIdentity ReadWorkerIdentity(const Getenv& getenv);

// The variables the agent hands a worker for `env`: every LOCKSTEP_* name
// and torchrun's beside it, in a fixed order. Tokens and addresses that are
// empty are left out (MASTER_ADDR/MASTER_PORT are always set, from
// env.master_addr "host:port", "[v6]:port" or "v6:port"; MASTER_ADDR
// without brackets, as torchrun writes it).
std::vector<std::pair<std::string, std::string>> WorkerEnvVars(const WorkerEnv& env);

// Whether `name` is one of the contract's variables (any WorkerEnvVars may
// write, or a reader falls back to): they belong to the agent, so a job's
// own environment may not set them.
bool IsWorkerEnvName(const std::string& name);

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_WORKER_ENV_H_
