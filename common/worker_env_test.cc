#include "common/worker_env.h"

#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/address.h"

namespace lockstep {
namespace {

// A getenv over a map.
Getenv From(const std::map<std::string, std::string>& vars) {
  return [vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

WorkerEnv Full() {
  WorkerEnv env;
  env.job_id = "j-1";
  env.rank = 5;
  env.local_rank = 1;
  env.world_size = 8;
  env.local_world_size = 4;
  env.node_rank = 1;
  env.num_nodes = 2;
  env.round = 3;
  env.restart_count = 2;
  env.max_restarts = 6;
  env.store_address = "10.0.0.1:7070";
  env.store_token = "st";
  env.agent_address = "10.0.0.2:7071";
  env.agent_token = "pt";
  env.node_addr = "10.0.0.2";
  env.master_addr = "10.0.0.1:29500";
  env.tls = {"-----CA-----", "-----CERT-----", "-----KEY-----"};
  return env;
}

// What the agent writes, a worker reads back, field for field.
TEST(WorkerEnvTest, WhatTheAgentWritesAWorkerParsesBack) {
  const WorkerEnv env = Full();
  std::map<std::string, std::string> vars;
  for (const auto& [k, v] : WorkerEnvVars(env)) {
    EXPECT_TRUE(vars.emplace(k, v).second) << k << " written twice";
    EXPECT_TRUE(IsWorkerEnvName(k)) << k << " is written but not a contract name";
  }
  EXPECT_FALSE(IsWorkerEnvName("TRAINER_STEPS"));
  auto parsed = ParseWorkerEnv(From(vars));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(*parsed == env);
  // torchrun's names agree with ours.
  EXPECT_EQ(vars["RANK"], "5");
  EXPECT_EQ(vars["LOCAL_RANK"], "1");
  EXPECT_EQ(vars["WORLD_SIZE"], "8");
  EXPECT_EQ(vars["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(vars["GROUP_RANK"], "1");
  EXPECT_EQ(vars["MASTER_ADDR"], "10.0.0.1");
  EXPECT_EQ(vars["MASTER_PORT"], "29500");
  EXPECT_EQ(vars["TORCHELASTIC_RESTART_COUNT"], "2");
  EXPECT_EQ(vars["TORCHELASTIC_MAX_RESTARTS"], "6");
  EXPECT_EQ(vars["TORCHELASTIC_RUN_ID"], "j-1");
  EXPECT_EQ(vars["GROUP_WORLD_SIZE"], "2");
  EXPECT_EQ(vars["ROLE_RANK"], "5");
  EXPECT_EQ(vars["ROLE_WORLD_SIZE"], "8");
  EXPECT_EQ(vars["ROLE_NAME"], "default");
  EXPECT_EQ(vars["LOCKSTEP_TLS_CA_PEM"], "-----CA-----");
  EXPECT_EQ(vars["LOCKSTEP_TLS_CERT_PEM"], "-----CERT-----");
  EXPECT_EQ(vars["LOCKSTEP_TLS_KEY_PEM"], "-----KEY-----");
  EXPECT_TRUE(ReadWorkerTlsPem(From(vars)) == env.tls);
  // An IPv6 master survives the trip too: torchrun's MASTER_ADDR is bare,
  // the address bracketed (the agent writes it with JoinHostPort).
  WorkerEnv v6 = env;
  v6.master_addr = JoinHostPort("fd00::1", "29500");
  vars.clear();
  for (const auto& [k, v] : WorkerEnvVars(v6)) vars[k] = v;
  EXPECT_EQ(vars["MASTER_ADDR"], "fd00::1");
  EXPECT_EQ(vars["MASTER_PORT"], "29500");
  EXPECT_TRUE(*ParseWorkerEnv(From(vars)) == v6);
}

// A bare IPv6 MASTER_ADDR (torchrun takes one) made "::1:29500", read as a
// host with no port.
TEST(WorkerEnvTest, ABareIpv6MasterAddrIsBracketed) {
  auto env = ParseWorkerEnv(
      From({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "::1"}, {"MASTER_PORT", "29500"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->master_addr, "[::1]:29500");
  env = ParseWorkerEnv(From(
      {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "[::1]"}, {"MASTER_PORT", "29500"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->master_addr, "[::1]:29500");
}

TEST(WorkerEnvTest, EmptyTokensAndAddressesAreNotWritten) {
  WorkerEnv env;
  env.master_addr = "127.0.0.1:1";
  for (const auto& [k, v] : WorkerEnvVars(env)) {
    EXPECT_NE(k, "LOCKSTEP_STORE_TOKEN");
    EXPECT_NE(k, "LOCKSTEP_AGENT");
    EXPECT_NE(k, "LOCKSTEP_TLS_KEY_PEM");
    EXPECT_FALSE(v.empty()) << k;
  }
}

TEST(WorkerEnvTest, AHandStartedTorchrunWorkerParsesTheSame) {
  auto env = ParseWorkerEnv(From({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"},
                                  {"GROUP_RANK", "1"}, {"TORCHELASTIC_RESTART_COUNT", "4"},
                                  {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"},
                                  {"TORCHELASTIC_RUN_ID", "run7"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->node_rank, 1);
  EXPECT_EQ(env->restart_count, 4);
  EXPECT_EQ(env->rank, 1);
  EXPECT_EQ(env->world_size, 2);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->job_id, "run7");
  EXPECT_EQ(env->master_addr, "h:29500");
  // Both names set to the same value, as the agent writes them, are fine.
  env = ParseWorkerEnv(From({{"LOCKSTEP_RANK", "1"}, {"RANK", "01"}, {"WORLD_SIZE", "2"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 1);
}

// A stale LOCKSTEP_RANK=0 beside torchrun's RANK=1 made the process act as
// rank 0 (LOCKSTEP_* won) and fail as a second rank 0 would ("Address
// already in use"). The agent sets both names equal, so two values are the
// user's: refused, naming both.
TEST(WorkerEnvTest, ALockstepNameAndItsTorchrunNameThatDifferAreRefusedNamingBoth) {
  const std::map<std::string, std::string> base = {
      {"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
      {"GROUP_RANK", "0"}, {"TORCHELASTIC_RESTART_COUNT", "0"}, {"TORCHELASTIC_RUN_ID", "run"}};
  ASSERT_TRUE(ParseWorkerEnv(From(base)).ok());
  const std::pair<const char*, const char*> pairs[] = {
      {"LOCKSTEP_RANK", "RANK"},
      {"LOCKSTEP_WORLD_SIZE", "WORLD_SIZE"},
      {"LOCKSTEP_LOCAL_RANK", "LOCAL_RANK"},
      {"LOCKSTEP_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE"},
      {"LOCKSTEP_NODE_RANK", "GROUP_RANK"},
      {"LOCKSTEP_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"},
      {"LOCKSTEP_JOB_ID", "TORCHELASTIC_RUN_ID"}};
  for (const auto& [ours, theirs] : pairs) {
    auto vars = base;
    const std::string value = vars[theirs];
    vars[ours] = value;
    EXPECT_TRUE(ParseWorkerEnv(From(vars)).ok()) << ours << " equal to " << theirs;
    vars[ours] = value == "0" ? "3" : "0";
    auto env = ParseWorkerEnv(From(vars));
    ASSERT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument) << ours;
    EXPECT_NE(env.status().message().find(std::string(ours) + "=" + vars[ours] + " and " +
                                          theirs + "=" + value + " differ"),
              std::string::npos)
        << env.status();
  }
}

TEST(WorkerEnvTest, BadEnvironmentsNameTheVariable) {
  EXPECT_EQ(ParseWorkerEnv(From({{"WORLD_SIZE", "2"}})).status().message(),
            "LOCKSTEP_RANK (or RANK) is not set");
  EXPECT_EQ(ParseWorkerEnv(From({{"RANK", "0"}})).status().message(),
            "LOCKSTEP_WORLD_SIZE (or WORLD_SIZE) is not set");
  EXPECT_EQ(ParseWorkerEnv(From({{"RANK", "x"}, {"WORLD_SIZE", "2"}})).status().message(),
            "environment variable RANK='x' is not an integer");
  // Range errors name the variables they read.
  EXPECT_EQ(ParseWorkerEnv(From({{"RANK", "2"}, {"WORLD_SIZE", "2"}})).status().message(),
            "RANK=2 is outside the world of WORLD_SIZE=2 ranks (0 to 1)");
  EXPECT_EQ(ParseWorkerEnv(From({{"LOCKSTEP_RANK", "-1"}, {"LOCKSTEP_WORLD_SIZE", "2"}}))
                .status()
                .message(),
            "LOCKSTEP_RANK=-1 is outside the world of LOCKSTEP_WORLD_SIZE=2 ranks (0 to 1)");
  EXPECT_EQ(ParseWorkerEnv(From({{"RANK", "0"}, {"WORLD_SIZE", "0"}})).status().message(),
            "WORLD_SIZE=0 is not a world size (at least 1)");
}

// LOCAL_WORLD_SIZE=0 reached a division in InitFromEnv (SIGFPE), LOCAL_RANK
// past the node was accepted, and LOCAL_RANK=-1 made NCCL pick whatever
// CUDA device was current.
TEST(WorkerEnvTest, ALayoutOutOfRangeIsRefusedNamingTheVariables) {
  auto message = [](const std::map<std::string, std::string>& vars) {
    return std::string(ParseWorkerEnv(From(vars)).status().message());
  };
  EXPECT_EQ(message({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "0"}}),
            "LOCAL_WORLD_SIZE=0 is outside 1 to 2 (WORLD_SIZE=2)");
  EXPECT_EQ(message({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCKSTEP_LOCAL_WORLD_SIZE", "3"}}),
            "LOCKSTEP_LOCAL_WORLD_SIZE=3 is outside 1 to 2 (WORLD_SIZE=2)");
  EXPECT_EQ(message({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "5"},
                     {"LOCAL_WORLD_SIZE", "2"}}),
            "LOCAL_RANK=5 is outside 0 to 1 (LOCAL_WORLD_SIZE=2)");
  EXPECT_EQ(message({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "-1"}}),
            "LOCAL_RANK=-1 is outside 0 to 1 (LOCAL_WORLD_SIZE is unset, so WORLD_SIZE=2)");
  EXPECT_EQ(message({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCKSTEP_NUM_NODES", "0"}}),
            "LOCKSTEP_NUM_NODES=0 is outside 1 to 4 (WORLD_SIZE=4)");
  EXPECT_EQ(message({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"},
                     {"GROUP_RANK", "2"}, {"GROUP_WORLD_SIZE", "2"}}),
            "GROUP_RANK=2 is outside 0 to 1 (GROUP_WORLD_SIZE=2)");
  EXPECT_EQ(message({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCKSTEP_NODE_RANK", "-1"}}),
            "LOCKSTEP_NODE_RANK=-1 is negative");
  for (const auto& vars : std::vector<std::map<std::string, std::string>>{
           {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "0"}},
           {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "5"}, {"LOCAL_WORLD_SIZE", "2"}}}) {
    EXPECT_EQ(ParseWorkerEnv(From(vars)).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

// What torchrun writes for rank 3 of 2 nodes x 2, and a hand-started worker
// that gives the node size alone (its local rank is its place on the node).
TEST(WorkerEnvTest, AValidLayoutParsesAndAMissingLocalRankIsThePlaceOnTheNode) {
  auto env = ParseWorkerEnv(From({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"},
                                  {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "1"},
                                  {"GROUP_WORLD_SIZE", "2"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->local_world_size, 2);
  EXPECT_EQ(env->node_rank, 1);
  EXPECT_EQ(env->num_nodes, 2);
  env = ParseWorkerEnv(From({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->local_rank, 1);
  // LOCKSTEP_NUM_NODES and torchrun's GROUP_WORLD_SIZE are one value.
  env = ParseWorkerEnv(From({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCKSTEP_NUM_NODES", "2"},
                             {"GROUP_WORLD_SIZE", "4"}}));
  EXPECT_EQ(env.status().message().substr(0, 45),
            "LOCKSTEP_NUM_NODES=2 and GROUP_WORLD_SIZE=4 d");
}

// Without GROUP_RANK and GROUP_WORLD_SIZE, the node rank and count follow
// from LOCAL_WORLD_SIZE as the local rank does (they were 0 and 1 for every
// rank, and the shm backend across hosts refused ranks 2 and 3 of 2 x 2).
TEST(WorkerEnvTest, AMissingNodeRankIsTheRanksNodeOfTheLocalWorldSize) {
  auto env = ParseWorkerEnv(From({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->node_rank, 1);
  EXPECT_EQ(env->num_nodes, 2);
  env = ParseWorkerEnv(From({{"RANK", "2"}, {"WORLD_SIZE", "5"}, {"LOCAL_WORLD_SIZE", "2"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->node_rank, 1);
  EXPECT_EQ(env->num_nodes, 3);
  env = ParseWorkerEnv(From({{"RANK", "1"}, {"WORLD_SIZE", "2"}}));  // one node, as before
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->node_rank, 0);
  EXPECT_EQ(env->num_nodes, 1);
  // A GROUP_RANK given alone counts the nodes up to it.
  env = ParseWorkerEnv(From({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"GROUP_RANK", "1"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->node_rank, 1);
  EXPECT_EQ(env->num_nodes, 2);
}

// torchrun's restart count is the round where lockstepd gives none; negative
// rounds and counts are refused (a namespace "job/-1" before).
TEST(WorkerEnvTest, TheRoundIsTorchrunsRestartCountWithoutLockstepRoundAndNeverNegative) {
  auto env = ParseWorkerEnv(From({{"RANK", "0"}, {"WORLD_SIZE", "1"},
                                  {"TORCHELASTIC_RESTART_COUNT", "2"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->round, 2);
  env = ParseWorkerEnv(From({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCKSTEP_ROUND", "5"},
                             {"TORCHELASTIC_RESTART_COUNT", "2"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->round, 5);
  auto message = [](const std::map<std::string, std::string>& vars) {
    return std::string(ParseWorkerEnv(From(vars)).status().message());
  };
  EXPECT_EQ(message({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCKSTEP_ROUND", "-1"}}),
            "LOCKSTEP_ROUND=-1 is negative");
  EXPECT_EQ(message({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"TORCHELASTIC_RESTART_COUNT", "-3"}}),
            "TORCHELASTIC_RESTART_COUNT=-3 is negative");
  EXPECT_EQ(message({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"TORCHELASTIC_MAX_RESTARTS", "-1"}}),
            "TORCHELASTIC_MAX_RESTARTS=-1 is negative");
}

// MASTER_PORT=70000 listened on 4464 (mod 65536); 0 or empty made rank 0
// wait out its timeout for itself; "abc" failed rank 0 alone while the
// others waited out theirs. Every rank refuses them now.
TEST(WorkerEnvTest, AMasterPortThatIsNotAPortIsRefusedOnEveryRank) {
  for (const char* rank : {"0", "1"}) {
    for (const char* port : {"70000", "0", "abc", "+80", " 80", "65536", "-1", "295000"}) {
      auto env = ParseWorkerEnv(From(
          {{"RANK", rank}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", port}}));
      ASSERT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument) << port;
      EXPECT_EQ(env.status().message(),
                absl::StrCat("MASTER_PORT='", port, "' is not a port (1 to 65535 in digits)"));
    }
    auto env = ParseWorkerEnv(
        From({{"RANK", rank}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", ""}}));
    EXPECT_EQ(env.status().message(), "MASTER_PORT is not set (MASTER_ADDR='h' is)");
  }
  auto env = ParseWorkerEnv(From(
      {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "a b"}, {"MASTER_PORT", "29500"}}));
  EXPECT_EQ(env.status().message(), "MASTER_ADDR='a b' is not a host name or address");
  for (const char* port : {"1", "29500", "65535"}) {
    env = ParseWorkerEnv(
        From({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", port}}));
    ASSERT_TRUE(env.ok()) << env.status();
    EXPECT_EQ(env->master_addr, absl::StrCat("h:", port));
  }
}

// Log lines of a hand-started worker carry its rank (RANK), not -1.
TEST(WorkerEnvTest, IdentityFallsBackToTorchrunNamesAndNeverFails) {
  WorkerIdentity id = ReadWorkerIdentity(From({{"RANK", "3"}}));
  EXPECT_EQ(id.rank, 3);
  EXPECT_EQ(id.job_id, "-");
  id = ReadWorkerIdentity(From({{"LOCKSTEP_JOB_ID", "j"}, {"LOCKSTEP_RANK", "x"}, {"LOCKSTEP_ROUND", "4"}}));
  EXPECT_EQ(id.job_id, "j");
  EXPECT_EQ(id.rank, -1);
  EXPECT_EQ(id.round, 4);
  // Two names that differ leave the value unknown too.
  id = ReadWorkerIdentity(From({{"LOCKSTEP_RANK", "0"}, {"RANK", "1"}, {"LOCKSTEP_JOB_ID", "a"},
                                {"TORCHELASTIC_RUN_ID", "b"}}));
  EXPECT_EQ(id.rank, -1);
  EXPECT_EQ(id.job_id, "-");
}

}  // namespace
}  // namespace lockstep
