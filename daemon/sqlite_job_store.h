// SqliteJobStore: the JobStore in one SQLite file (WAL, synchronous=FULL,
// so a write is durable when PutJob returns). Rows hold the serialized
// v1.Job / v1.NodeInfo, keyed by id; dir_deletions holds (node, job) pairs.
//
// Thread safety: not thread-safe (see JobStore).
#ifndef LOCKSTEP_DAEMON_SQLITE_JOB_STORE_H_
#define LOCKSTEP_DAEMON_SQLITE_JOB_STORE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/job_store.h"

struct sqlite3;

namespace lockstep {
namespace daemon {

class SqliteJobStore : public JobStore {
 public:
  // Opens (creating if needed) the database at `path`. Errors: Unavailable
  // naming the path when SQLite cannot open or initialise it.
  static StatusOr<std::unique_ptr<SqliteJobStore>> Open(const std::string& path);
  ~SqliteJobStore() override;

  Status PutJob(const v1::Job& job) override;
  Status PutNode(const v1::NodeInfo& node) override;
  Status DeleteJob(const std::string& job_id,
                   const std::vector<std::string>& dir_on_nodes) override;
  Status ClearDirDeletions(const std::string& node_id,
                           const std::vector<std::string>& job_ids) override;
  StatusOr<std::map<std::string, std::set<std::string>>> LoadDirDeletions() override;
  StatusOr<std::vector<v1::Job>> LoadJobs() override;
  StatusOr<std::optional<v1::Job>> LoadJob(const std::string& job_id) override;
  StatusOr<std::vector<v1::NodeInfo>> LoadNodes() override;

 private:
  SqliteJobStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  Status Exec(const std::string& sql);
  // Runs `sql` with its ? bound to `args` in order; `what` names it in errors.
  Status Run(const char* sql, const std::vector<std::string>& args, const std::string& what);
  // `body` in one transaction: committed when it returns OK, else rolled back.
  Status InTransaction(const std::function<Status()>& body);
  Status Put(const char* table, const std::string& id, const std::string& data);
  StatusOr<std::vector<std::string>> LoadAll(const char* table);

  sqlite3* db_;
  std::string path_;
};

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_SQLITE_JOB_STORE_H_
