// JobStore: durable storage for the coordinator's job table, node registry
// and the job directories deleted jobs left on nodes not yet told. The coordinator writes through it before acknowledging any
// change, and reloads everything from it on start.
//
// Implementations: SqliteJobStore (--state-dir/coordinator.db) and
// FakeJobStore (tests; in memory, with a failure switch).
//
// Thread safety: implementations need not be thread-safe; the coordinator
// serialises calls under its own lock.
// Errors: Unavailable / Internal when the medium fails; the caller then
// rolls back its in-memory change and returns the error.
#ifndef LOCKSTEP_DAEMON_JOB_STORE_H_
#define LOCKSTEP_DAEMON_JOB_STORE_H_

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "lockstep/v1/common.pb.h"

namespace lockstep {
namespace daemon {

class JobStore {
 public:
  virtual ~JobStore() = default;

  // Inserts or replaces the job with job.job_id(). Durable on return.
  virtual Status PutJob(const v1::Job& job) = 0;
  // Inserts or replaces the node with node.node_id(). Durable on return.
  virtual Status PutNode(const v1::NodeInfo& node) = 0;

  // Removes the job with that id (no error if there is none) and, in the
  // same transaction, records that each node in `dir_on_nodes` is to remove
  // the job's directory (LoadDirDeletions). Durable on return.
  virtual Status DeleteJob(const std::string& job_id,
                           const std::vector<std::string>& dir_on_nodes) = 0;
  // Forgets the directory deletions of these jobs recorded for `node_id`
  // (the node removed them); ids not recorded are ignored. Durable on return.
  virtual Status ClearDirDeletions(const std::string& node_id,
                                   const std::vector<std::string>& job_ids) = 0;
  // The directory deletions not yet delivered: node id -> job ids.
  virtual StatusOr<std::map<std::string, std::set<std::string>>> LoadDirDeletions() = 0;

  virtual StatusOr<std::vector<v1::Job>> LoadJobs() = 0;
  // The job with that id; nullopt if there is none.
  virtual StatusOr<std::optional<v1::Job>> LoadJob(const std::string& job_id) = 0;
  virtual StatusOr<std::vector<v1::NodeInfo>> LoadNodes() = 0;
};

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_JOB_STORE_H_
