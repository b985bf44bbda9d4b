#include "daemon/token_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace daemon {
namespace {

std::string Dir() {
  const char *d = std::getenv("TEST_TMPDIR");
  return std::string(d ? d : "/tmp");
}

// Writes `text` to `path` as a rotation would: a new file renamed over
// the old one, mode 0600.
void Replace(const std::string &path, const std::string &text) {
  const std::string tmp = path + ".new";
  std::ofstream(tmp) << text;
  ::chmod(tmp.c_str(), 0600);
  ASSERT_EQ(std::rename(tmp.c_str(), path.c_str()), 0);
}

class TokenFilesTest : public ::testing::Test {
protected:
  void SetUp() override {
    a_ = Dir() + "/a.token";
    b_ = Dir() + "/b.token";
    Replace(a_, "a1-token-0123456789abcdef\n");
    Replace(b_, "b1-token-0123456789abcdef\n");
  }
  std::string a_, b_;
  std::vector<std::vector<std::string>> applied_;
  int applies_ = 0;
};

TEST_F(TokenFilesTest, LoadsEveryFileAndSeesARotation) {
  TokenFiles files({a_, b_}, [&](const auto &t) {
    applied_ = t;
    ++applies_;
  });
  ASSERT_TRUE(files.Load().ok());
  EXPECT_EQ(applied_,
            (std::vector<std::vector<std::string>>{
                {"a1-token-0123456789abcdef"}, {"b1-token-0123456789abcdef"}}));
  EXPECT_FALSE(files.Changed());
  // The new token first, the old one still admitted after it.
  Replace(a_, "a2-token-0123456789abcdef\na1-token-0123456789abcdef\n");
  EXPECT_TRUE(files.Changed());
  ASSERT_TRUE(files.Load().ok());
  EXPECT_EQ(applied_,
            (std::vector<std::vector<std::string>>{
                {"a2-token-0123456789abcdef", "a1-token-0123456789abcdef"},
                {"b1-token-0123456789abcdef"}}));
  EXPECT_FALSE(files.Changed());
  EXPECT_EQ(applies_, 2);
}

// A file that no longer loads keeps the tokens in use, and says which.
TEST_F(TokenFilesTest, ABadFileKeepsTheTokensInUse) {
  TokenFiles files({a_, b_}, [&](const auto &t) {
    applied_ = t;
    ++applies_;
  });
  ASSERT_TRUE(files.Load().ok());
  Replace(b_, "\n");
  EXPECT_TRUE(files.Changed());
  Status s = files.Load();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), absl::StrCat("token file ", b_, " is empty"));
  Replace(b_, "b1-token-0123456789abcdef\n");
  ASSERT_TRUE(files.Load().ok());
  EXPECT_FALSE(files.Changed());
  // A chmod alone is a change: the next check sees the file refused.
  ::chmod(b_.c_str(), 0644);
  EXPECT_TRUE(files.Changed())
      << "a token file made readable by others went unnoticed";
  EXPECT_EQ(files.Load().code(), absl::StatusCode::kPermissionDenied);
  ::unlink(a_.c_str());
  EXPECT_EQ(files.Load().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(applies_, 2);
  EXPECT_EQ(applied_,
            (std::vector<std::vector<std::string>>{
                {"a1-token-0123456789abcdef"}, {"b1-token-0123456789abcdef"}}));
  EXPECT_TRUE(files.Changed()) << "still differs from what was last loaded";
}

} // namespace
} // namespace daemon
} // namespace lockstep
