#include "daemon/token.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include <gtest/gtest.h>

namespace lockstep {
namespace daemon {
namespace {

std::string Path(const std::string& name) {
  const char* d = std::getenv("TEST_TMPDIR");
  return std::string(d ? d : "/tmp") + "/" + name;
}

TEST(TokenTest, CreatedOnceWithMode0600AndReadBack) {
  std::string path = Path("token");
  ::unlink(path.c_str());
  EXPECT_EQ(LoadToken(path, false).status().code(), absl::StatusCode::kNotFound);
  auto t1 = LoadToken(path, true);
  ASSERT_TRUE(t1.ok()) << t1.status();
  EXPECT_EQ(t1->size(), 64u);
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  auto t2 = LoadToken(path, true);
  ASSERT_TRUE(t2.ok());
  EXPECT_EQ(*t1, *t2);
}

TEST(TokenTest, RefusesAWorldReadableFile) {
  std::string path = Path("token-open");
  ::unlink(path.c_str());
  ASSERT_TRUE(LoadToken(path, true).ok());
  ::chmod(path.c_str(), 0644);
  EXPECT_EQ(LoadToken(path, false).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST(TokenTest, CheckBearer) {
  EXPECT_TRUE(CheckBearer("Bearer abc", true, "abc").ok());
  EXPECT_EQ(CheckBearer("", false, "abc").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(CheckBearer("Bearer abd", true, "abc").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(CheckBearer("Bearer ab", true, "abc").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(CheckBearer("Basic abc", true, "abc").code(), absl::StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
