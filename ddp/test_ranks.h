// DDP ranks as threads of one test process, over Gloo through a FakeStore:
// shared by the engine tests that train several ranks (bucket_schedule_test,
// sample_weighting_test; ConnectGloo also by comm_hook_test and
// ddp_any_module_test). Test-only.
#ifndef LOCKSTEP_DDP_TEST_RANKS_H_
#define LOCKSTEP_DDP_TEST_RANKS_H_

#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "common/status.h"
#include "ddp/ddp.h"
#include "ddp/fake_store.h"
#include "ddp/gloo_communicator.h"
#include "ddp/test_net.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace ddp {
namespace test_ranks {

using Ddp = TypedDistributedDataParallel<test_net::Net>;

// Rank `rank` of `world` over Gloo in `store`, with 30 s timeouts.
inline StatusOr<std::shared_ptr<Communicator>> ConnectGloo(rendezvous::Store* store, int rank,
                                                           int world) {
  GlooOptions gloo;
  gloo.timeout = std::chrono::seconds(30);
  gloo.connect_timeout = std::chrono::seconds(30);
  ASSIGN_OR_RETURN(auto comm, GlooCommunicator::Create(store, rank, world, gloo));
  return std::shared_ptr<Communicator>(std::move(comm));
}

// One rank (world size 1) over Gloo in `store`, with a fresh Net and
// progress off.
inline StatusOr<std::unique_ptr<Ddp>> SingleRank(FakeStore* store, DdpOptions options) {
  ASSIGN_OR_RETURN(auto comm, ConnectGloo(store, 0, 1));
  options.report_progress = false;
  return DistributedDataParallel::Create(test_net::Net(), comm, options);
}

// Runs body(rank, net, ddp) on `world` ranks as threads, each with a DDP
// over Gloo of its own replica of `init` (progress off, 30 s timeouts), and
// expects every rank's body to succeed.
using RankBody = std::function<Status(int rank, test_net::Net net, Ddp& ddp)>;
inline void RunRanks(int world, const test_net::Net& init, DdpOptions options,
                     const RankBody& body) {
  std::vector<test_net::Net> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(test_net::Replica(init));
  FakeStore store;
  std::vector<Status> status(world);
  std::vector<std::thread> threads;
  options.timeout = std::chrono::seconds(30);
  options.report_progress = false;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      status[rank] = [&]() -> Status {
        ASSIGN_OR_RETURN(auto comm, ConnectGloo(&store, rank, world));
        ASSIGN_OR_RETURN(auto ddp, DistributedDataParallel::Create(replicas[rank], comm, options));
        return body(rank, replicas[rank], *ddp);
      }();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
}

}  // namespace test_ranks
}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_TEST_RANKS_H_
