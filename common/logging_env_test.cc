// A program that never calls InitLogging, as a worker linking //ddp need
// not, still gets the UTC line format and LOCKSTEP_LOG_LEVEL. Each case runs
// in a child process whose LockstepLogger() is made after the variable is
// set (this process never logs, so the children start fresh).
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "common/logging.h"

namespace lockstep {
namespace {

// Runs `body` in a child with LOCKSTEP_LOG_LEVEL=`level` (unset when null)
// and returns what it wrote to stderr.
std::string StderrOfChild(const char* level, const std::function<void()>& body) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/child_stderr.log";
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (level != nullptr) {
      ::setenv("LOCKSTEP_LOG_LEVEL", level, 1);
    } else {
      ::unsetenv("LOCKSTEP_LOG_LEVEL");
    }
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ::dup2(fd, 2) < 0) ::_exit(2);
    body();
    LockstepLogger()->flush();
    ::_exit(0);
  }
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

const char kStamp[] = R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)";

// The one warning an unknown LOCKSTEP_LOG_LEVEL gives, then `line` at info.
std::regex UnknownLevelThen(const std::string& name, const std::string& line) {
  return std::regex(std::string(kStamp) + R"( W \[logging\] LOCKSTEP_LOG_LEVEL: unknown log level ')" +
                    name + R"(' .*; logging at info\n)" + kStamp + " I " + line + "\n");
}

TEST(LoggingWithoutInitTest, LevelComesFromTheEnvironmentAndLinesCarryUtc) {
  const std::string out = StderrOfChild("debug", [] {
    Logger("ddp", "j-1", 0).Debug("shown at debug");
    Logger("ddp", "j-1", 0).Info("and at info");
  });
  EXPECT_TRUE(std::regex_match(out, std::regex(std::string(kStamp) +
                                               R"( D \[ddp\] job=j-1 rank=0 shown at debug\n)" +
                                               kStamp + R"( I \[ddp\] job=j-1 rank=0 and at info\n)")))
      << out;
}

TEST(LoggingWithoutInitTest, DefaultLevelIsInfo) {
  const std::string out = StderrOfChild(nullptr, [] {
    Logger("ddp", "j-1", 0).Debug("hidden");
    Logger("ddp", "j-1", 0).Warn("shown");
  });
  EXPECT_TRUE(std::regex_match(out, std::regex(std::string(kStamp) +
                                               R"( W \[ddp\] job=j-1 rank=0 shown\n)")))
      << out;
}

TEST(LoggingWithoutInitTest, UnknownLevelIsNamedOnceAndInfoUsed) {
  const std::string out = StderrOfChild("chatty", [] {
    Logger("ddp", "j-1", 0).Debug("hidden");
    Logger("ddp", "j-1", 0).Info("shown");
  });
  EXPECT_TRUE(std::regex_match(out, UnknownLevelThen("chatty", R"(\[ddp\] job=j-1 rank=0 shown)")))
      << out;
}

// InitLogging() (as examples/train calls it) with a name it does not know
// in the environment: one warning, info, no error (a job's typo must not
// stop its workers); a name passed to it is still refused.
TEST(LoggingWithoutInitTest, InitLoggingFromAnUnknownEnvironmentLevelWarnsOnceAndUsesInfo) {
  const std::string out = StderrOfChild("verbose", [] {
    if (!InitLogging().ok()) ::_exit(4);
    if (!InitLogging().ok()) ::_exit(5);
    if (InitLogging("verbose").code() != absl::StatusCode::kInvalidArgument) ::_exit(6);
    Logger("train", "j-1", 0).Debug("hidden");
    Logger("train", "j-1", 0).Info("shown");
  });
  EXPECT_TRUE(std::regex_match(out, UnknownLevelThen("verbose", R"(\[train\] job=j-1 rank=0 shown)")))
      << out;
}

// A program's own spdlog default logger is left as it was.
TEST(LoggingWithoutInitTest, SpdlogsDefaultLoggerIsNotTouched) {
  const std::string out = StderrOfChild(nullptr, [] {
    Logger("ddp", "j-1", 0).Info("ours");
    if (spdlog::default_logger_raw()->name() != "") ::_exit(3);
  });
  EXPECT_NE(out.find("ours"), std::string::npos) << out;
}

}  // namespace
}  // namespace lockstep
