#include "rendezvous/local_rendezvous.h"

#include <set>
#include <thread>

#include "gtest/gtest.h"

namespace lockstep {
namespace rendezvous {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(LocalRendezvousTest, NodesAsThreadsGetUniqueRanks) {
  RendezvousCore core;
  RendezvousJobConfig config;
  config.job_id = JobId("job");
  config.min_nodes = 4;
  config.max_nodes = 4;
  config.nproc_per_node = 2;
  ASSERT_TRUE(core.CreateJob(config).ok());
  LocalRendezvous rendezvous(&core);
  std::vector<StatusOr<RendezvousResult>> results(4, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      JoinRequest request;
      request.job_id = JobId("job");
      request.node_id = NodeId("n" + std::to_string(i));
      results[i] = rendezvous.Join(request, seconds(10));
    });
  }
  for (auto& t : threads) t.join();
  std::set<int> global_ranks;
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    global_ranks.insert(r->GlobalRank(0));
    global_ranks.insert(r->GlobalRank(1));
  }
  EXPECT_EQ(global_ranks, (std::set<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(rendezvous.GetState(JobId("job"))->phase, RoundPhase::kClosed);
}

TEST(LocalRendezvousTest, JoinTimeoutWithdrawsTheNode) {
  RendezvousCore core;
  RendezvousJobConfig config;
  config.job_id = JobId("job");
  config.min_nodes = 2;
  config.max_nodes = 2;
  ASSERT_TRUE(core.CreateJob(config).ok());
  LocalRendezvous rendezvous(&core);
  JoinRequest request;
  request.job_id = JobId("job");
  request.node_id = NodeId("alone");
  auto result = rendezvous.Join(request, milliseconds(50));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(rendezvous.GetState(JobId("job"))->participants.empty());
}

}  // namespace
}  // namespace rendezvous
}  // namespace lockstep
