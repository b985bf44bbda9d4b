#include "daemon/sqlite_job_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <sqlite3.h>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace daemon {

StatusOr<std::unique_ptr<SqliteJobStore>> SqliteJobStore::Open(const std::string& path) {
  // The job table holds every spec: mode 0600, owned by this user, and not
  // a symlink someone planted (SQLite gives its -wal and -shm files the
  // same mode).
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == ELOOP) {
      return absl::PermissionDeniedError(
          absl::StrCat("job store ", path, " is a symlink; refused"));
    }
    return absl::UnavailableError(
        absl::StrCat("job store ", path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st;
  const bool stat_ok = ::fstat(fd, &st) == 0;
  const bool foreign = stat_ok && st.st_uid != ::geteuid();
  const bool mode_ok = stat_ok && !foreign && ::fchmod(fd, 0600) == 0;
  ::close(fd);
  if (foreign) {
    return absl::PermissionDeniedError(absl::StrCat("job store ", path, " belongs to uid ",
                                                    st.st_uid, ", not this daemon's (uid ",
                                                    ::geteuid(), "); refused"));
  }
  if (!mode_ok) {
    return absl::PermissionDeniedError(
        absl::StrCat("job store ", path, ": cannot make it mode 0600: ", std::strerror(errno)));
  }
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    if (db) sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat("job store ", path, ": cannot open: ", msg));
  }
  std::unique_ptr<SqliteJobStore> store(new SqliteJobStore(db, path));
  sqlite3_busy_timeout(db, 5000);
  RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode=WAL"));
  RETURN_IF_ERROR(store->Exec("PRAGMA synchronous=FULL"));
  // The table is read in full only at start; after that only jobs that left
  // the coordinator's memory are read back. A small page cache (256 KiB,
  // not SQLite's 2 MiB default) keeps the coordinator's memory flat as the
  // table grows.
  RETURN_IF_ERROR(store->Exec("PRAGMA cache_size=-256"));
  RETURN_IF_ERROR(store->Exec(
      "CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, data BLOB NOT NULL)"));
  RETURN_IF_ERROR(store->Exec(
      "CREATE TABLE IF NOT EXISTS nodes (id TEXT PRIMARY KEY, data BLOB NOT NULL)"));
  RETURN_IF_ERROR(store->Exec(
      "CREATE TABLE IF NOT EXISTS dir_deletions (node TEXT NOT NULL, job TEXT NOT NULL, "
      "PRIMARY KEY (node, job))"));
  return store;
}

SqliteJobStore::~SqliteJobStore() { sqlite3_close(db_); }

Status SqliteJobStore::Exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return absl::UnavailableError(absl::StrCat("job store ", path_, ": ", sql, ": ", msg));
  }
  return absl::OkStatus();
}

Status SqliteJobStore::Put(const char* table, const std::string& id, const std::string& data) {
  std::string sql = absl::StrCat("INSERT OR REPLACE INTO ", table, " (id, data) VALUES (?, ?)");
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
    return absl::UnavailableError(absl::StrCat("job store ", path_, ": ", sqlite3_errmsg(db_)));
  }
  sqlite3_bind_text(stmt, 1, id.data(), id.size(), SQLITE_TRANSIENT);
  sqlite3_bind_blob(stmt, 2, data.data(), data.size(), SQLITE_TRANSIENT);
  int rc = sqlite3_step(stmt);
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) {
    return absl::UnavailableError(absl::StrCat("job store ", path_, ": writing ", table, " row ",
                                               id, ": ", sqlite3_errmsg(db_)));
  }
  return absl::OkStatus();
}

StatusOr<std::vector<std::string>> SqliteJobStore::LoadAll(const char* table) {
  std::string sql = absl::StrCat("SELECT data FROM ", table, " ORDER BY id");
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
    return absl::UnavailableError(absl::StrCat("job store ", path_, ": ", sqlite3_errmsg(db_)));
  }
  std::vector<std::string> out;
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    const void* blob = sqlite3_column_blob(stmt, 0);
    int n = sqlite3_column_bytes(stmt, 0);
    out.emplace_back(static_cast<const char*>(blob), n);
  }
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) {
    return absl::UnavailableError(absl::StrCat("job store ", path_, ": reading ", table, ": ",
                                               sqlite3_errmsg(db_)));
  }
  return out;
}

Status SqliteJobStore::PutJob(const v1::Job& job) {
  return Put("jobs", job.job_id(), job.SerializeAsString());
}

Status SqliteJobStore::Run(const char* sql, const std::vector<std::string>& args,
                           const std::string& what) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, sql, -1, &stmt, nullptr) != SQLITE_OK) {
    return absl::UnavailableError(absl::StrCat("job store ", path_, ": ", sqlite3_errmsg(db_)));
  }
  for (size_t i = 0; i < args.size(); ++i) {
    sqlite3_bind_text(stmt, static_cast<int>(i + 1), args[i].data(),
                      static_cast<int>(args[i].size()), SQLITE_TRANSIENT);
  }
  const int rc = sqlite3_step(stmt);
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) {
    return absl::UnavailableError(
        absl::StrCat("job store ", path_, ": ", what, ": ", sqlite3_errmsg(db_)));
  }
  return absl::OkStatus();
}

Status SqliteJobStore::InTransaction(const std::function<Status()>& body) {
  RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  Status s = body();
  if (s.ok()) s = Exec("COMMIT");
  if (!s.ok()) (void)Exec("ROLLBACK");
  return s;
}

Status SqliteJobStore::DeleteJob(const std::string& job_id,
                                 const std::vector<std::string>& dir_on_nodes) {
  // One transaction: the job never goes without its directories queued.
  return InTransaction([&] {
    RETURN_IF_ERROR(
        Run("DELETE FROM jobs WHERE id = ?", {job_id}, absl::StrCat("deleting job ", job_id)));
    for (const auto& node : dir_on_nodes) {
      RETURN_IF_ERROR(Run("INSERT OR IGNORE INTO dir_deletions (node, job) VALUES (?, ?)",
                          {node, job_id},
                          absl::StrCat("queueing job ", job_id, "'s directory on node ", node)));
    }
    return absl::OkStatus();
  });
}

Status SqliteJobStore::ClearDirDeletions(const std::string& node_id,
                                         const std::vector<std::string>& job_ids) {
  if (job_ids.empty()) return absl::OkStatus();
  return InTransaction([&] {
    for (const auto& id : job_ids) {
      RETURN_IF_ERROR(Run("DELETE FROM dir_deletions WHERE node = ? AND job = ?", {node_id, id},
                          absl::StrCat("forgetting job ", id, "'s directory deletion on node ",
                                       node_id)));
    }
    return absl::OkStatus();
  });
}

StatusOr<std::map<std::string, std::set<std::string>>> SqliteJobStore::LoadDirDeletions() {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT node, job FROM dir_deletions", -1, &stmt, nullptr) !=
      SQLITE_OK) {
    return absl::UnavailableError(absl::StrCat("job store ", path_, ": ", sqlite3_errmsg(db_)));
  }
  std::map<std::string, std::set<std::string>> out;
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    auto text = [&](int column) {
      // The pointer first, then its length (SQLite's order).
      const auto* chars = reinterpret_cast<const char*>(sqlite3_column_text(stmt, column));
      const auto n = static_cast<size_t>(sqlite3_column_bytes(stmt, column));
      return chars == nullptr ? std::string() : std::string(chars, n);
    };
    out[text(0)].insert(text(1));
  }
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) {
    return absl::UnavailableError(absl::StrCat("job store ", path_, ": reading dir_deletions: ",
                                               sqlite3_errmsg(db_)));
  }
  return out;
}

Status SqliteJobStore::PutNode(const v1::NodeInfo& node) {
  return Put("nodes", node.node_id(), node.SerializeAsString());
}

StatusOr<std::vector<v1::Job>> SqliteJobStore::LoadJobs() {
  ASSIGN_OR_RETURN(std::vector<std::string> rows, LoadAll("jobs"));
  std::vector<v1::Job> jobs(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!jobs[i].ParseFromString(rows[i])) {
      return absl::DataLossError(absl::StrCat("job store ", path_, ": job row ", i, " is corrupt"));
    }
  }
  return jobs;
}

StatusOr<std::optional<v1::Job>> SqliteJobStore::LoadJob(const std::string& job_id) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT data FROM jobs WHERE id = ?", -1, &stmt, nullptr) !=
      SQLITE_OK) {
    return absl::UnavailableError(absl::StrCat("job store ", path_, ": ", sqlite3_errmsg(db_)));
  }
  sqlite3_bind_text(stmt, 1, job_id.data(), static_cast<int>(job_id.size()), SQLITE_TRANSIENT);
  std::optional<v1::Job> job;
  const int rc = sqlite3_step(stmt);
  if (rc == SQLITE_ROW) {
    job.emplace();
    const bool parsed = job->ParseFromArray(sqlite3_column_blob(stmt, 0), sqlite3_column_bytes(stmt, 0));
    sqlite3_finalize(stmt);
    if (!parsed) {
      return absl::DataLossError(absl::StrCat("job store ", path_, ": job ", job_id, " is corrupt"));
    }
    return job;
  }
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) {
    return absl::UnavailableError(absl::StrCat("job store ", path_, ": reading job ", job_id, ": ",
                                               sqlite3_errmsg(db_)));
  }
  return job;
}

StatusOr<std::vector<v1::NodeInfo>> SqliteJobStore::LoadNodes() {
  ASSIGN_OR_RETURN(std::vector<std::string> rows, LoadAll("nodes"));
  std::vector<v1::NodeInfo> nodes(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!nodes[i].ParseFromString(rows[i])) {
      return absl::DataLossError(absl::StrCat("job store ", path_, ": node row ", i, " is corrupt"));
    }
  }
  return nodes;
}

}  // namespace daemon
}  // namespace lockstep
