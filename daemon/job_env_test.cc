#include "daemon/job_env.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace daemon {
namespace {

v1::JobSpec WithEnv(std::initializer_list<std::pair<const char*, const char*>> env) {
  v1::JobSpec spec;
  spec.add_command("/bin/true");
  for (const auto& [k, v] : env) (*spec.mutable_env())[k] = v;
  return spec;
}

Status Check(std::initializer_list<std::pair<const char*, const char*>> env,
             std::vector<std::string> allowed = {}, bool command_allow_list = false) {
  return CheckJobEnv(WithEnv(env), {std::move(allowed), command_allow_list});
}

TEST(JobEnvTest, TheEnginesOwnVariablesArePermittedWithNoFlag) {
  EXPECT_TRUE(Check({{"LOCKSTEP_BACKEND", "shm"}, {"NCCL_DEBUG", "INFO"}, {"OMP_NUM_THREADS", "4"}}).ok());
  EXPECT_TRUE(Check({}).ok());
}

TEST(JobEnvTest, AnythingElseNeedsTheOperatorsPermission) {
  Status s = Check({{"MY_SETTING", "1"}});
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message().rfind("spec.env: MY_SETTING is not in the job environment allow-list", 0), 0u)
      << s;
  EXPECT_NE(s.message().find("lockstepd --allowed-env"), std::string::npos) << s;
  EXPECT_TRUE(Check({{"MY_SETTING", "1"}}, {"MY_SETTING"}).ok());
  EXPECT_TRUE(Check({{"TRAINER_STEPS", "1"}, {"TRAINER_OUT_DIR", "/x"}}, {"TRAINER_*"}).ok());
  EXPECT_FALSE(Check({{"TRAINERX", "1"}}, {"TRAINER_*"}).ok());
}

// --allowed-command /bin/true with LD_PRELOAD ran the attacker's library.
TEST(JobEnvTest, LoaderVariablesAreRefusedWhateverTheAllowList) {
  for (const char* name : {"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "GCONV_PATH",
                           "GLIBC_TUNABLES", "BASH_ENV"}) {
    Status s = Check({{name, "/tmp/evil.so"}}, {"*", name});
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << name;
    EXPECT_EQ(s.message().rfind(std::string("spec.env: ") + name + " is refused", 0), 0u) << s;
  }
}

TEST(JobEnvTest, OnANodeWithAllowedCommandsPathAndInterpreterVariablesAreRefused) {
  EXPECT_TRUE(Check({{"PATH", "/tmp/evil"}}, {"PATH"}, /*command_allow_list=*/false).ok());
  Status s = Check({{"PATH", "/tmp/evil"}}, {"PATH"}, /*command_allow_list=*/true);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("--allowed-command"), std::string::npos) << s;
  EXPECT_FALSE(Check({{"PYTHONPATH", "/tmp"}}, {"PYTHONPATH"}, true).ok());
  EXPECT_FALSE(Check({{"NODE_OPTIONS", "-r x"}}, {"*"}, true).ok());
}

TEST(JobEnvTest, TheWorkerContractBelongsToTheAgent) {
  for (const char* name : {"LOCKSTEP_RANK", "RANK", "MASTER_PORT", "LOCKSTEP_STORE_TOKEN",
                           "LOCKSTEP_FENCE_FD"}) {
    Status s = Check({{name, "0"}}, {"*"});
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << name;
    EXPECT_NE(s.message().find("the agent sets it"), std::string::npos) << s;
  }
}

TEST(JobEnvTest, PatternsAreNamesOrPrefixes) {
  EXPECT_TRUE(ValidateEnvPatterns({"A", "B_*", "c9", "*"}).ok());
  for (const char* bad : {"", "*x", "A B", "A=1", "**"}) {
    Status s = ValidateEnvPatterns({bad});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
