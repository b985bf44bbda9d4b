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
