// One simulated node as its own process, for the cross-process tests: joins
// the rendezvous, then uses the round's store namespace like a worker
// bootstrap would (publish an address, read everyone's, count in a barrier).
//
//   rendezvous_node --address HOST:PORT --job J --node N [--timeout-s 60]
// Prints one line on success: "rank=<node_rank> nodes=<n> world=<w> round=<r>"
// and exits 0; on failure prints the status to stderr and exits 1.
//
//   rendezvous_node --address HOST:PORT --store-get NS/KEY [--timeout-s 60]
// Only blocks in a store Get of KEY in namespace NS, then prints the value.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "rendezvous/rendezvous_client.h"
#include "rendezvous/store_client.h"

namespace lockstep {
namespace rendezvous {
namespace {

struct Config {
  std::string address;
  std::string job;
  std::string node;
  double timeout_s = 60;
  std::string store_get;
};

Status StoreGet(const Config& config) {
  size_t slash = config.store_get.rfind('/');
  if (slash == std::string::npos) return absl::InvalidArgumentError("--store-get wants NS/KEY");
  ASSIGN_OR_RETURN(auto store, ConnectStore(config.address, config.store_get.substr(0, slash),
                                            FromSeconds(config.timeout_s)));
  ASSIGN_OR_RETURN(std::string value, store->Get(config.store_get.substr(slash + 1),
                                                 FromSeconds(config.timeout_s)));
  std::printf("%s\n", value.c_str());
  return absl::OkStatus();
}

Status Run(const Config& config) {
  if (!config.store_get.empty()) return StoreGet(config);
  Duration timeout = FromSeconds(config.timeout_s);
  ASSIGN_OR_RETURN(auto client, RendezvousClient::Connect(config.address, timeout));
  JoinRequest request;
  request.job_id = JobId(config.job);
  request.node_id = NodeId(config.node);
  request.address = "127.0.0.1";
  ASSIGN_OR_RETURN(RendezvousResult result, client->Join(request, timeout));
  ASSIGN_OR_RETURN(auto store, ConnectStore(config.address, result.store_namespace, timeout));
  RETURN_IF_ERROR(store->Set(absl::StrCat("addr/", result.node_rank), config.node));
  std::vector<std::string> keys;
  for (int r = 0; r < result.num_nodes; ++r) keys.push_back(absl::StrCat("addr/", r));
  ASSIGN_OR_RETURN(std::vector<std::string> nodes, store->MultiGet(keys, timeout));
  for (int r = 0; r < result.num_nodes; ++r) {
    if (nodes[r] != result.node_ids[r].value()) {
      return absl::InternalError(absl::StrCat("rank ", r, " published node ", nodes[r],
                                              " but the rendezvous says ",
                                              result.node_ids[r].value()));
    }
  }
  ASSIGN_OR_RETURN(int64_t arrived, store->Add("barrier", 1));
  if (arrived == result.num_nodes) RETURN_IF_ERROR(store->Set("barrier/done", "1"));
  RETURN_IF_ERROR(store->Wait({"barrier/done"}, timeout));
  std::printf("rank=%d nodes=%d world=%d round=%d\n", result.node_rank, result.num_nodes,
              result.world_size, result.round);
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace
}  // namespace rendezvous
}  // namespace lockstep

int main(int argc, char** argv) {
  lockstep::rendezvous::Config config;
  lockstep::FlagSet flags("rendezvous_node", "one simulated node (test helper)");
  flags.String("address", &config.address, "rendezvous + store server host:port");
  flags.String("job", &config.job, "job id");
  flags.String("node", &config.node, "node id");
  flags.Double("timeout-s", &config.timeout_s, "timeout for each step");
  flags.String("store-get", &config.store_get, "only block in a store Get of NS/KEY");
  auto rest = flags.Parse(argc, argv);
  if (!rest.ok()) return lockstep::FlagSet::ReportParseError(rest.status());
  lockstep::Status status = lockstep::rendezvous::Run(config);
  if (!status.ok()) {
    std::cerr << "node " << config.node << ": " << status << "\n";
    return 1;
  }
  return 0;
}
