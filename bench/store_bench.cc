// Store throughput: N clients, each on its own gRPC Session stream (its own
// connection), run M sequential set, then get, then add operations on their
// own keys, exactly like ../shared/bench/tcpstore_bench.py does against
// PyTorch's TCPStore. Prints one JSON line per op kind:
//   {"system":"lockstep-grpc-store","op":"get","clients":8,"ops_per_s":...,"p50_us":...}
// ops_per_s = clients * ops / (slowest client's time for that kind);
// p50_us = median over clients of each client's median latency.
//
// With --tcpstore-script PATH it also runs that script with the same
// --clients/--ops/--value-bytes afterwards and passes its lines through, so
// both figures come from the same run.
//
//   bazel run --config=opt //bench:store_bench -- --clients 8 --ops 2000 \
//       --tcpstore-script /work/shared/bench/tcpstore_bench.py
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/flags.h"
#include "common/logging.h"
#include "rendezvous/store_client.h"
#include "rendezvous/store_server.h"

namespace lockstep {
namespace rendezvous {
namespace {

struct Config {
  int32_t clients = 8;
  int32_t ops = 2000;
  int32_t value_bytes = 64;
  std::string tcpstore_script;
  std::string python = "/usr/bin/python3";
};

constexpr const char* kKinds[] = {"set", "get", "add"};

struct KindResult {
  double seconds = 0;
  double p50_us = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int Run(const Config& config) {
  auto server = StoreServer::Start("127.0.0.1:0");
  if (!server.ok()) {
    std::cerr << server.status() << "\n";
    return 1;
  }
  std::vector<std::unique_ptr<Store>> stores;
  for (int i = 0; i < config.clients; ++i) {
    auto store = ConnectStore((*server)->address(), "bench/1", std::chrono::seconds(10));
    if (!store.ok()) {
      std::cerr << store.status() << "\n";
      return 1;
    }
    stores.push_back(std::move(*store));
  }
  std::vector<std::vector<KindResult>> results(config.clients, std::vector<KindResult>(3));
  const std::string value(config.value_bytes, 'x');
  std::vector<std::thread> threads;
  for (int i = 0; i < config.clients; ++i) {
    threads.emplace_back([&, i] {
      Store& store = *stores[i];
      for (int kind = 0; kind < 3; ++kind) {
        std::vector<double> lat;
        lat.reserve(config.ops);
        auto t0 = std::chrono::steady_clock::now();
        for (int k = 0; k < config.ops; ++k) {
          std::string key = absl::StrFormat("c%d/k%d", i, k % 64);
          auto s = std::chrono::steady_clock::now();
          bool ok = true;
          if (kind == 0) {
            ok = store.Set(key, value).ok();
          } else if (kind == 1) {
            ok = store.Get(key, std::chrono::seconds(10)).ok();
          } else {
            ok = store.Add(absl::StrFormat("c%d/n", i), 1).ok();
          }
          if (!ok) {
            std::cerr << "store op failed\n";
            std::exit(1);
          }
          lat.push_back(std::chrono::duration<double, std::micro>(
                            std::chrono::steady_clock::now() - s)
                            .count());
        }
        results[i][kind].seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        results[i][kind].p50_us = Median(std::move(lat));
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int kind = 0; kind < 3; ++kind) {
    double wall = 0;
    std::vector<double> p50s;
    for (const auto& r : results) {
      wall = std::max(wall, r[kind].seconds);
      p50s.push_back(r[kind].p50_us);
    }
    std::printf(
        "{\"system\": \"lockstep-grpc-store\", \"op\": \"%s\", \"clients\": %d, \"ops_per_s\": "
        "%.0f, \"p50_us\": %.1f}\n",
        kKinds[kind], config.clients, config.clients * config.ops / wall, Median(p50s));
  }
  std::fflush(stdout);
  stores.clear();
  (*server)->Shutdown();
  if (!config.tcpstore_script.empty()) {
    std::string command = absl::StrFormat("%s %s --clients %d --ops %d --value-bytes %d",
                                          config.python, config.tcpstore_script, config.clients,
                                          config.ops, config.value_bytes);
    return std::system(command.c_str()) == 0 ? 0 : 1;
  }
  return 0;
}

}  // namespace
}  // namespace rendezvous
}  // namespace lockstep

int main(int argc, char** argv) {
  lockstep::rendezvous::Config config;
  lockstep::FlagSet flags("store_bench", "Store set/get/add throughput over gRPC");
  flags.Int32("clients", &config.clients, "concurrent clients, one connection each");
  flags.Int32("ops", &config.ops, "operations per client per kind");
  flags.Int32("value-bytes", &config.value_bytes, "bytes per value");
  flags.String("tcpstore-script", &config.tcpstore_script,
               "also run this tcpstore_bench.py with the same settings");
  flags.String("python", &config.python, "interpreter for --tcpstore-script");
  auto rest = flags.Parse(argc, argv);
  (void)lockstep::InitLogging();
  if (!rest.ok()) {
    std::cerr << rest.status().message() << "\n";
    return rest.status().code() == absl::StatusCode::kNotFound ? 0 : 2;
  }
  if (config.clients < 1 || config.ops < 1 || config.value_bytes < 0) {
    std::cerr << "--clients and --ops must be >= 1\n";
    return 2;
  }
  return lockstep::rendezvous::Run(config);
}
