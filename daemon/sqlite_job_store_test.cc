#include "daemon/sqlite_job_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <gtest/gtest.h>

namespace lockstep {
namespace daemon {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

TEST(SqliteJobStoreTest, JobsAndNodesSurviveReopen) {
  std::string path = TempPath("jobs.db");
  std::remove(path.c_str());
  {
    auto store = SqliteJobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    v1::Job job;
    job.set_job_id("j-1");
    job.set_state(v1::JOB_STATE_RUNNING);
    job.set_restart_count(2);
    job.add_history()->set_detail("submitted");
    ASSERT_TRUE((*store)->PutJob(job).ok());
    job.set_state(v1::JOB_STATE_SUCCEEDED);
    ASSERT_TRUE((*store)->PutJob(job).ok());
    v1::NodeInfo node;
    node.set_node_id("n1");
    node.set_incarnation("inc-1");
    ASSERT_TRUE((*store)->PutNode(node).ok());
  }
  auto store = SqliteJobStore::Open(path);
  ASSERT_TRUE(store.ok());
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].state(), v1::JOB_STATE_SUCCEEDED);
  auto one = (*store)->LoadJob("j-1");
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(one->has_value());
  EXPECT_EQ((*one)->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ((*one)->history(0).detail(), "submitted");
  auto none = (*store)->LoadJob("j-2");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  EXPECT_EQ((*jobs)[0].restart_count(), 2);
  EXPECT_EQ((*jobs)[0].history(0).detail(), "submitted");
  auto nodes = (*store)->LoadNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_EQ((*nodes)[0].incarnation(), "inc-1");
}

// Deleting a job queues its directory on the nodes named, in the same
// transaction; the queue survives a reopen and is cleared node by node.
TEST(SqliteJobStoreTest, DirectoryDeletionsAreKeptWithTheDeleteAndClearedPerNode) {
  std::string path = TempPath("deletions.db");
  std::remove(path.c_str());
  {
    auto store = SqliteJobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    for (const char* id : {"j-1", "j-2"}) {
      v1::Job job;
      job.set_job_id(id);
      ASSERT_TRUE((*store)->PutJob(job).ok());
    }
    ASSERT_TRUE((*store)->DeleteJob("j-1", {"n1", "n2"}).ok());
    ASSERT_TRUE((*store)->DeleteJob("j-2", {"n2"}).ok());
    ASSERT_TRUE((*store)->DeleteJob("j-2", {"n2"}).ok());  // again: no error, no duplicate
  }
  auto store = SqliteJobStore::Open(path);
  ASSERT_TRUE(store.ok());
  EXPECT_TRUE((*store)->LoadJobs()->empty());
  auto pending = (*store)->LoadDirDeletions();
  ASSERT_TRUE(pending.ok()) << pending.status();
  const std::map<std::string, std::set<std::string>> want = {{"n1", {"j-1"}},
                                                            {"n2", {"j-1", "j-2"}}};
  EXPECT_EQ(*pending, want);
  // Only the acknowledged pairs go; unknown ids and nodes are no error.
  ASSERT_TRUE((*store)->ClearDirDeletions("n2", {"j-2", "j-9"}).ok());
  ASSERT_TRUE((*store)->ClearDirDeletions("n9", {"j-1"}).ok());
  pending = (*store)->LoadDirDeletions();
  ASSERT_TRUE(pending.ok());
  const std::map<std::string, std::set<std::string>> left = {{"n1", {"j-1"}}, {"n2", {"j-1"}}};
  EXPECT_EQ(*pending, left);
  ASSERT_TRUE((*store)->ClearDirDeletions("n2", {"j-1"}).ok());
  ASSERT_TRUE((*store)->ClearDirDeletions("n2", {}).ok());
  pending = (*store)->LoadDirDeletions();
  ASSERT_TRUE(pending.ok());
  const std::map<std::string, std::set<std::string>> last = {{"n1", {"j-1"}}};
  EXPECT_EQ(*pending, last);
}

TEST(SqliteJobStoreTest, OpenFailsWithPathInMessage) {
  auto store = SqliteJobStore::Open("/nonexistent-dir/x/jobs.db");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(store.status().message().find("/nonexistent-dir/x/jobs.db"), std::string::npos);
}

TEST(SqliteJobStoreTest, TheFileIsPrivateAndNeverASymlink) {
  std::string path = TempPath("private.db");
  std::remove(path.c_str());
  {
    std::ofstream(path) << "";
    ::chmod(path.c_str(), 0644);  // as an older version left it
    auto store = SqliteJobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
  }
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  std::string link = TempPath("link.db");
  std::remove(link.c_str());
  ASSERT_EQ(::symlink(path.c_str(), link.c_str()), 0);
  auto refused = SqliteJobStore::Open(link);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(refused.status().message().find("symlink"), std::string::npos) << refused.status();
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
