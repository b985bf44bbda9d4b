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
  auto refused = LoadToken(path, false);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  // The mode as chmod takes it (it was printed in hex: "mode 1a4").
  EXPECT_NE(refused.status().message().find("(mode 0644)"), std::string::npos) << refused.status();
}

// Owner and kind are judged on the file read: a symlink to a good file
// works (a Kubernetes Secret volume), a file another uid owns and a
// directory are refused, naming why.
TEST(TokenTest, RefusesAFileOfAnotherOwnerOrNotAFileAndFollowsSymlinks) {
  const std::string path = Path("owned-token");
  ::unlink(path.c_str());
  ASSERT_TRUE(LoadToken(path, true).ok());
  const std::string link = Path("token-link");
  ::unlink(link.c_str());
  ASSERT_EQ(::symlink(path.c_str(), link.c_str()), 0);
  EXPECT_EQ(*LoadToken(link, false), *LoadToken(path, false));
  const std::string dir = Path("token-dir");
  ::mkdir(dir.c_str(), 0700);
  auto not_file = LoadToken(dir, false);
  EXPECT_EQ(not_file.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(not_file.status().message().find("not a regular file"), std::string::npos)
      << not_file.status();
  if (::geteuid() != 0) GTEST_SKIP() << "chown to another uid needs root";
  ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
  auto foreign = LoadToken(link, false);
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(foreign.status().message().find("is owned by uid 65534"), std::string::npos)
      << foreign.status();
}

TEST(TokenTest, SecretsAreCsprngHexAndCompareOnlyWhenEqual) {
  const std::string a = NewSecret("pt-"), b = NewSecret("pt-");
  EXPECT_EQ(a.size(), 3u + 64u);
  EXPECT_EQ(a.rfind("pt-", 0), 0u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef", 3), std::string::npos) << a;
  EXPECT_NE(a, b);
  EXPECT_TRUE(SecretsEqual(a, std::string(a)));
  EXPECT_FALSE(SecretsEqual(a, b));
  EXPECT_FALSE(SecretsEqual(a, a.substr(0, 10)));
  EXPECT_FALSE(SecretsEqual("", a));
  EXPECT_TRUE(SecretsEqual("", ""));
}

TEST(JobStoreTokenTest, IsDeterministicHexAndDiffersPerJobAndPerKey) {
  std::string t = JobStoreToken("key", "job-a");
  EXPECT_EQ(t.size(), 64u);
  EXPECT_EQ(t.find_first_not_of("0123456789abcdef"), std::string::npos) << t;
  EXPECT_EQ(t, JobStoreToken("key", "job-a"));
  EXPECT_NE(t, JobStoreToken("key", "job-b"));
  EXPECT_NE(t, JobStoreToken("key2", "job-a"));
  // RFC 4231 test case 2: HMAC-SHA256(key "Jefe", "what do ya want for nothing?").
  EXPECT_EQ(JobStoreToken("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(AuthorizeStoreTest, MissingOrNonBearerTokenIsUnauthenticatedNamingStore) {
  Status s = AuthorizeStore("", false, "admin", "job-a/0");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(s.message().find("store"), std::string::npos) << s;
  EXPECT_EQ(AuthorizeStore("Basic x", true, "admin", "job-a/0").code(),
            absl::StatusCode::kUnauthenticated);
}

// The admin token opens every namespace by its role (roles_test).
TEST(AuthorizeStoreTest, JobTokenOpensOnlyItsJob) {
  std::string job_a = "Bearer " + JobStoreToken("key", "job-a");
  EXPECT_TRUE(AuthorizeStore(job_a, true, "key", "job-a/0").ok());
  EXPECT_TRUE(AuthorizeStore(job_a, true, "key", "job-a/7/sub").ok());
  Status other = AuthorizeStore(job_a, true, "key", "job-b/0");
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(other.message().find("job-b/0"), std::string::npos) << other;
  // A prefix of the job id is not the job.
  EXPECT_EQ(AuthorizeStore(job_a, true, "key", "job-a2/0").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(AuthorizeStore("Bearer wrong", true, "key", "job-a/0").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(AuthorizeStore(job_a, true, "other-key", "job-a/0").code(),
            absl::StatusCode::kPermissionDenied);
  // The key itself is no bearer token.
  EXPECT_EQ(AuthorizeStore("Bearer key", true, "key", "job-a/0").code(),
            absl::StatusCode::kPermissionDenied);
}

// One token per line: the first is presented, all are admitted; blank
// lines and surrounding spaces do not count.
TEST(TokenTest, FileListsTheCurrentTokenFirst) {
  std::string path = Path("rotating.token");
  ::unlink(path.c_str());
  {
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs("  new-token-0123456789abcdef \n\nold-token-0123456789abcdef\n", f);
    std::fclose(f);
  }
  ::chmod(path.c_str(), 0600);
  auto all = LoadTokens(path, false);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, (std::vector<std::string>{"new-token-0123456789abcdef",
                                            "old-token-0123456789abcdef"}));
  EXPECT_EQ(*LoadToken(path, false), "new-token-0123456789abcdef");
  {
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(std::string(kMaxTokenFileBytes + 1, 'x').c_str(), f);
    std::fclose(f);
  }
  EXPECT_EQ(LoadTokens(path, false).status().code(), absl::StatusCode::kInvalidArgument);
}

// A short token is refused, naming the file, the line and the length, not
// the token; 24 characters are enough.
TEST(TokenTest, ShortTokensAreRefused) {
  std::string path = Path("short.token");
  auto write = [&](const std::string& text) {
    ::unlink(path.c_str());
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(text.c_str(), f);
    std::fclose(f);
    ::chmod(path.c_str(), 0600);
  };
  write("secret\n");
  Status s = LoadTokens(path, false).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(path + ", line 1: a token of 6 characters; at least 24"),
            std::string::npos)
      << s;
  EXPECT_EQ(s.message().find("secret"), std::string::npos) << "echoes the token: " << s;
  // A short one after a good one (an old token kept in a rotation) too.
  write(std::string(64, 'a') + "\n\nshort-old-token\n");
  s = LoadTokens(path, false).status();
  EXPECT_NE(s.message().find("line 3: a token of 15 characters"), std::string::npos) << s;
  write(std::string(24, 'b') + "\n");
  EXPECT_TRUE(LoadTokens(path, false).ok());
  // What lockstepd makes passes its own check.
  ::unlink(path.c_str());
  auto made = LoadToken(path, /*create=*/true);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(made->size(), 64u);
  EXPECT_TRUE(LoadToken(path, false).ok());
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
