// Rendezvous latency: N simulated nodes join one job (min = max = N) over
// loopback gRPC, using the async callback stub so N joins are in flight
// without N threads (spread over --channels connections). Prints one JSON line:
//   {"bench": "rendezvous", "nodes": N, "from_first_join_s": ..., "from_last_join_s": ...}
// from_first_join_s: first join sent -> every node holds its rank;
// from_last_join_s: last join sent -> every node holds its rank.
//
//   bazel run --config=opt //bench:rendezvous_bench -- --nodes 1024
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/logging.h"
#include "lockstep/v1/rendezvous.grpc.pb.h"
#include "rendezvous/rendezvous_server.h"

namespace lockstep {
namespace rendezvous {
namespace {

struct Config {
  int32_t nodes = 256;
  int32_t channels = 16;
  int32_t repeat = 3;
};

struct Node {
  grpc::ClientContext ctx;
  v1::JoinRendezvousRequest request;
  v1::JoinRendezvousResponse response;
  grpc::Status status;
};

int Run(const Config& config) {
  auto core = std::make_shared<RendezvousCore>();
  auto server = RendezvousServer::Start("127.0.0.1:0", core);
  if (!server.ok()) {
    std::cerr << server.status() << "\n";
    return 1;
  }
  std::vector<std::unique_ptr<v1::RendezvousService::Stub>> stubs;
  for (int c = 0; c < config.channels; ++c) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto channel = grpc::CreateCustomChannel((*server)->address(),
                                             grpc::InsecureChannelCredentials(), args);
    channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10));
    stubs.push_back(v1::RendezvousService::NewStub(channel));
  }
  for (int trial = 0; trial < config.repeat; ++trial) {
    std::string job = absl::StrCat("bench-", trial);
    RendezvousJobConfig job_config;
    job_config.job_id = JobId(job);
    job_config.min_nodes = config.nodes;
    job_config.max_nodes = config.nodes;
    job_config.nproc_per_node = 8;
    if (Status s = core->CreateJob(job_config); !s.ok()) {
      std::cerr << s << "\n";
      return 1;
    }
    std::vector<std::unique_ptr<Node>> nodes(config.nodes);
    for (int i = 0; i < config.nodes; ++i) {
      nodes[i] = std::make_unique<Node>();
      nodes[i]->request.set_job_id(job);
      nodes[i]->request.set_node_id(absl::StrCat("node-", i));
      nodes[i]->request.set_timeout_ms(60000);
      nodes[i]->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    }
    std::mutex mu;
    std::condition_variable cv;
    int done = 0;
    auto first = std::chrono::steady_clock::now();
    for (int i = 0; i < config.nodes; ++i) {
      Node* node = nodes[i].get();
      stubs[i % stubs.size()]->async()->JoinRendezvous(
          &node->ctx, &node->request, &node->response, [&, node](grpc::Status status) {
            node->status = std::move(status);
            std::lock_guard<std::mutex> lock(mu);
            if (++done == config.nodes) cv.notify_all();
          });
    }
    auto last = std::chrono::steady_clock::now();
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return done == config.nodes; });
    }
    auto end = std::chrono::steady_clock::now();
    std::set<int> ranks;
    for (const auto& node : nodes) {
      if (!node->status.ok()) {
        std::cerr << "join failed: " << node->status.error_message() << "\n";
        return 1;
      }
      ranks.insert(node->response.result().node_rank());
    }
    if (static_cast<int>(ranks.size()) != config.nodes) {
      std::cerr << "ranks are not unique\n";
      return 1;
    }
    std::printf(
        "{\"bench\": \"rendezvous\", \"nodes\": %d, \"trial\": %d, \"from_first_join_s\": %.4f, "
        "\"from_last_join_s\": %.4f}\n",
        config.nodes, trial, std::chrono::duration<double>(end - first).count(),
        std::chrono::duration<double>(end - last).count());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace rendezvous
}  // namespace lockstep

int main(int argc, char** argv) {
  lockstep::rendezvous::Config config;
  lockstep::FlagSet flags("rendezvous_bench", "time for N nodes to rendezvous over gRPC");
  flags.Int32("nodes", &config.nodes, "simulated nodes joining one round");
  flags.Int32("channels", &config.channels, "client connections the nodes are spread over");
  flags.Int32("repeat", &config.repeat, "rounds to time (one job each)");
  auto rest = flags.Parse(argc, argv);
  (void)lockstep::InitLogging();
  if (!rest.ok()) return lockstep::FlagSet::ReportParseError(rest.status());
  if (config.nodes < 1 || config.channels < 1 || config.repeat < 1) {
    std::cerr << "--nodes, --channels and --repeat must be >= 1\n";
    return 2;
  }
  return lockstep::rendezvous::Run(config);
}
