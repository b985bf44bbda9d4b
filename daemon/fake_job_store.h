// In-memory JobStore for tests, with a failure switch. testonly.
#ifndef LOCKSTEP_DAEMON_FAKE_JOB_STORE_H_
#define LOCKSTEP_DAEMON_FAKE_JOB_STORE_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include "daemon/job_store.h"

namespace lockstep {
namespace daemon {

class FakeJobStore : public JobStore {
 public:
  Status PutJob(const v1::Job& job) override {
    if (fail_writes) return absl::UnavailableError("fake job store: writes disabled");
    jobs[job.job_id()] = job;
    ++job_writes;
    return absl::OkStatus();
  }
  Status PutNode(const v1::NodeInfo& node) override {
    if (fail_writes) return absl::UnavailableError("fake job store: writes disabled");
    nodes[node.node_id()] = node;
    return absl::OkStatus();
  }
  Status DeleteJob(const std::string& job_id,
                   const std::vector<std::string>& dir_on_nodes) override {
    if (fail_writes) return absl::UnavailableError("fake job store: writes disabled");
    jobs.erase(job_id);
    for (const auto& node : dir_on_nodes) dir_deletions[node].insert(job_id);
    return absl::OkStatus();
  }
  Status ClearDirDeletions(const std::string& node_id,
                           const std::vector<std::string>& job_ids) override {
    if (fail_writes) return absl::UnavailableError("fake job store: writes disabled");
    auto node = dir_deletions.find(node_id);
    if (node == dir_deletions.end()) return absl::OkStatus();
    for (const auto& id : job_ids) node->second.erase(id);
    if (node->second.empty()) dir_deletions.erase(node);
    return absl::OkStatus();
  }
  StatusOr<std::map<std::string, std::set<std::string>>> LoadDirDeletions() override {
    return dir_deletions;
  }
  StatusOr<std::vector<v1::Job>> LoadJobs() override {
    std::vector<v1::Job> out;
    for (const auto& [id, job] : jobs) out.push_back(job);
    return out;
  }
  StatusOr<std::optional<v1::Job>> LoadJob(const std::string& job_id) override {
    ++job_loads;
    auto it = jobs.find(job_id);
    if (it == jobs.end()) return std::optional<v1::Job>();
    return std::optional<v1::Job>(it->second);
  }
  StatusOr<std::vector<v1::NodeInfo>> LoadNodes() override {
    std::vector<v1::NodeInfo> out;
    for (const auto& [id, node] : nodes) out.push_back(node);
    return out;
  }

  bool fail_writes = false;
  int job_writes = 0;
  int job_loads = 0;  // LoadJob calls
  std::map<std::string, v1::Job> jobs;
  std::map<std::string, v1::NodeInfo> nodes;
  std::map<std::string, std::set<std::string>> dir_deletions;
};

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_FAKE_JOB_STORE_H_
