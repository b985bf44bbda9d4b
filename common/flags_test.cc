#include "common/flags.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace {

TEST(FlagsTest, ParsesEveryFormAndReturnsPositionals) {
  std::string dir = "/var";
  int64_t port = 0;
  double lease = 5;
  bool coordinator = false;
  bool color = true;
  std::vector<std::string> env;
  FlagSet flags("t", "test");
  flags.String("state-dir", &dir, "");
  flags.Int("port", &port, "");
  flags.Double("lease", &lease, "");
  flags.Bool("coordinator", &coordinator, "");
  flags.Bool("color", &color, "");
  flags.StringList("env", &env, "");
  auto rest = flags.Parse({"--state-dir=/tmp/x", "--port", "7", "run", "--coordinator",
                           "--no-color", "--env", "A=1", "--env=B=2", "--lease=0.5", "--",
                           "--not-a-flag"});
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ(dir, "/tmp/x");
  EXPECT_EQ(port, 7);
  EXPECT_DOUBLE_EQ(lease, 0.5);
  EXPECT_TRUE(coordinator);
  EXPECT_FALSE(color);
  EXPECT_EQ(env, (std::vector<std::string>{"A=1", "B=2"}));
  EXPECT_EQ(*rest, (std::vector<std::string>{"run", "--not-a-flag"}));
  EXPECT_TRUE(flags.WasSet("port"));
  EXPECT_FALSE(flags.WasSet("env-missing"));
}

TEST(FlagsTest, StopAtFirstPositionalLeavesSubcommandFlags) {
  bool json = false;
  FlagSet flags("t", "test");
  flags.Bool("json", &json, "");
  auto rest = flags.Parse({"--json", "status", "--rank", "3"}, true);
  ASSERT_TRUE(rest.ok());
  EXPECT_EQ(*rest, (std::vector<std::string>{"status", "--rank", "3"}));
}

TEST(FlagsTest, ErrorsNameTheFlag) {
  int64_t port = 0;
  FlagSet flags("t", "test");
  flags.Int("port", &port, "listen port");
  auto unknown = flags.Parse({"--prot=1"});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("--prot"), std::string::npos);
  auto bad = flags.Parse({"--port=seven"});
  EXPECT_NE(bad.status().message().find("'seven'"), std::string::npos);
  auto missing = flags.Parse({"--port"});
  EXPECT_NE(missing.status().message().find("needs a value"), std::string::npos);
  auto help = flags.Parse({"--help"});
  EXPECT_EQ(help.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(help.status().message().find("listen port"), std::string::npos);
}

}  // namespace
}  // namespace lockstep

namespace lockstep {
namespace {

TEST(FlagsTest, ReportParseErrorExitsZeroForHelpAndTwoForErrors) {
  FlagSet flags("prog", "a program");
  int64_t n = 1;
  flags.Int("n", &n, "a number");
  auto help = flags.Parse({"--help"});
  ASSERT_TRUE(absl::IsNotFound(help.status()));
  testing::internal::CaptureStdout();
  EXPECT_EQ(FlagSet::ReportParseError(help.status()), 0);
  EXPECT_NE(testing::internal::GetCapturedStdout().find("--n"), std::string::npos);
  auto bad = flags.Parse({"--n=x"});
  ASSERT_FALSE(bad.ok());
  testing::internal::CaptureStderr();
  EXPECT_EQ(FlagSet::ReportParseError(bad.status()), 2);
  EXPECT_NE(testing::internal::GetCapturedStderr().find("--n"), std::string::npos);
}

}  // namespace
}  // namespace lockstep

namespace lockstep {
namespace {

TEST(FlagsTest, TorchrunSpellingsAliasesAndShortForms) {
  std::string nodes = "1";
  int32_t nproc = 1, restarts = 0;
  bool follow = false;
  FlagSet flags("t", "test");
  flags.String("nodes", &nodes, "");
  flags.Int32("nproc-per-node", &nproc, "");
  flags.Int32("max-restarts", &restarts, "");
  flags.Bool("follow", &follow, "");
  flags.Alias("nnodes", "nodes");
  flags.Short('f', "follow");
  flags.Short('n', "nproc-per-node");
  auto rest = flags.Parse({"--nnodes", "1:2", "--nproc_per_node=4", "--max_restarts", "3", "-f"});
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ(nodes, "1:2");
  EXPECT_EQ(nproc, 4);
  EXPECT_EQ(restarts, 3);
  EXPECT_TRUE(follow);
  EXPECT_TRUE(flags.WasSet("nproc-per-node"));  // by its registered name
  ASSERT_TRUE(flags.Parse({"-n", "2"}).ok());
  EXPECT_EQ(nproc, 2);
  auto unknown_short = flags.Parse({"-x", "2"});
  EXPECT_NE(unknown_short.status().message().find("unknown flag -x"), std::string::npos)
      << unknown_short.status();
  const std::string usage = flags.Usage();
  EXPECT_NE(usage.find("--nodes, --nnodes"), std::string::npos) << usage;
  EXPECT_NE(usage.find("-f, --follow"), std::string::npos) << usage;
}

TEST(FlagsTest, UnknownFlagSuggestsTheNearest) {
  int32_t nproc = 1;
  bool wait = false;
  FlagSet flags("lockstep submit", "test");
  flags.Int32("nproc-per-node", &nproc, "");
  flags.Bool("wait", &wait, "");
  auto typo = flags.Parse({"--nproc-per-nod=2"});
  EXPECT_NE(typo.status().message().find("did you mean --nproc-per-node?"), std::string::npos)
      << typo.status();
  auto prefix = flags.Parse({"--nproc", "2"});
  EXPECT_NE(prefix.status().message().find("did you mean --nproc-per-node?"), std::string::npos)
      << prefix.status();
  auto far = flags.Parse({"--coordinator=x"});
  EXPECT_EQ(far.status().message().find("did you mean"), std::string::npos) << far.status();
  auto dashes = flags.Parse({"---"});  // no name at all: an error, not a crash
  EXPECT_NE(dashes.status().message().find("unknown flag ---"), std::string::npos)
      << dashes.status();
  EXPECT_EQ(NearestMatch("stauts", {"submit", "status", "list", "logs"}), "status");
  EXPECT_EQ(NearestMatch("lsit", {"submit", "status", "list", "logs"}), "list");
  EXPECT_EQ(NearestMatch("frobnicate", {"submit", "status", "list", "logs"}), "");
}

TEST(FlagsTest, VersionAndHelpWithoutContradictions) {
  double grace = 0;
  int32_t nproc = 1;
  FlagSet flags("t", "test");
  flags.Double("stop-grace-s", &grace, "SIGTERM to SIGKILL grace (default 10)");
  flags.Int32("nproc-per-node", &nproc, "workers per node");
  flags.Version("t 1.2.3");
  auto version = flags.Parse({"--version"});
  ASSERT_TRUE(absl::IsNotFound(version.status()));
  EXPECT_EQ(version.status().message(), "t 1.2.3\n");
  const std::string usage = flags.Usage();
  EXPECT_NE(usage.find("(default 10)"), std::string::npos) << usage;
  EXPECT_EQ(usage.find("(default: 0)"), std::string::npos) << usage;
  EXPECT_NE(usage.find("workers per node (default: 1)"), std::string::npos) << usage;
}

TEST(FlagsTest, HiddenFlagsAreParsedButNeitherListedNorSuggested) {
  std::string coordinator, name;
  FlagSet flags("lockstep run", "test");
  flags.String("coordinator", &coordinator, "coordinator host:port");
  flags.String("name", &name, "a name");
  flags.Hide("coordinator");
  auto rest = flags.Parse({"--coordinator=h:1", "--name", "x"});
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ(coordinator, "h:1");
  EXPECT_TRUE(flags.WasSet("coordinator"));
  const std::string usage = flags.Usage();
  EXPECT_EQ(usage.find("coordinator"), std::string::npos) << usage;
  EXPECT_NE(usage.find("--name"), std::string::npos) << usage;
  auto typo = flags.Parse({"--coordinatr=h:1"});
  EXPECT_EQ(typo.status().message().find("did you mean"), std::string::npos) << typo.status();
}

}  // namespace
}  // namespace lockstep
