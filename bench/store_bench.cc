// Store throughput: N clients, each its own process with its own gRPC
// Session stream, run M sequential set, then get, then add operations on
// their own keys, exactly like ../shared/bench/tcpstore_bench.py does
// against PyTorch's TCPStore (whose clients are processes too; the server
// lives in the parent). Prints one JSON line per op kind:
//   {"system":"lockstep-grpc-store","op":"get","clients":8,"ops_per_s":...,"p50_us":...}
// ops_per_s = clients * ops / (slowest client's time for that kind);
// p50_us = median over clients of each client's median latency.
//
// The client processes are this binary re-executed with --child-address.
// --in-process runs the clients as threads of the server's process instead
// (then gRPC's single epoll poller is shared by server and all clients, and
// every completion costs a thread hop: slower, and not how workers run).
//
// With --tcpstore-script PATH it also runs that script with the same
// --clients/--ops/--value-bytes afterwards and passes its lines through, so
// both figures come from the same run.
//
//   bazel run --config=opt //bench:store_bench -- --clients 8 --ops 2000
//       --tcpstore-script /work/shared/bench/tcpstore_bench.py   (one line)
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/median.h"
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
  bool in_process = false;
  // Set in client processes only.
  std::string child_address;
  int32_t child_index = 0;
};

constexpr const char* kKinds[] = {"set", "get", "add"};

struct KindResult {
  double seconds = 0;
  double p50_us = 0;
};

// One client's loop: set, get, add; returns its time and median per kind.
StatusOr<std::vector<KindResult>> ClientLoop(const std::string& address, int index,
                                             const Config& config) {
  ASSIGN_OR_RETURN(std::unique_ptr<Store> store,
                   ConnectStore(address, "bench/1", std::chrono::seconds(30)));
  std::vector<KindResult> results(3);
  const std::string value(config.value_bytes, 'x');
  for (int kind = 0; kind < 3; ++kind) {
    std::vector<double> lat;
    lat.reserve(config.ops);
    auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < config.ops; ++k) {
      std::string key = absl::StrFormat("c%d/k%d", index, k % 64);
      auto s = std::chrono::steady_clock::now();
      Status status;
      if (kind == 0) {
        status = store->Set(key, value);
      } else if (kind == 1) {
        status = store->Get(key, std::chrono::seconds(10)).status();
      } else {
        status = store->Add(absl::StrFormat("c%d/n", index), 1).status();
      }
      RETURN_IF_ERROR(status);
      lat.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - s).count());
    }
    results[kind].seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    results[kind].p50_us = Median(std::move(lat));
  }
  return results;
}

int RunChild(const Config& config) {
  auto results = ClientLoop(config.child_address, config.child_index, config);
  if (!results.ok()) {
    std::cerr << "client " << config.child_index << ": " << results.status() << "\n";
    return 1;
  }
  for (const KindResult& r : *results) std::printf("%.9f %.3f\n", r.seconds, r.p50_us);
  return 0;
}

// Runs the clients as processes (this binary with --child-address).
StatusOr<std::vector<std::vector<KindResult>>> RunProcesses(const std::string& address,
                                                            const Config& config) {
  struct Child {
    pid_t pid;
    FILE* out;
  };
  std::vector<Child> children;
  for (int i = 0; i < config.clients; ++i) {
    int fds[2];
    if (pipe(fds) != 0) return absl::InternalError("pipe failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    std::vector<std::string> args = {"store_bench",
                                     "--child-address=" + address,
                                     "--child-index=" + std::to_string(i),
                                     "--ops=" + std::to_string(config.ops),
                                     "--value-bytes=" + std::to_string(config.value_bytes)};
    std::vector<char*> argv;
    for (auto& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    pid_t pid;
    int rc = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    if (rc != 0) return absl::InternalError("posix_spawn failed");
    children.push_back({pid, fdopen(fds[0], "r")});
  }
  std::vector<std::vector<KindResult>> results;
  bool failed = false;
  for (Child& child : children) {
    std::vector<KindResult> r(3);
    for (auto& kind : r) {
      if (std::fscanf(child.out, "%lf %lf", &kind.seconds, &kind.p50_us) != 2) failed = true;
    }
    std::fclose(child.out);
    int status = 0;
    waitpid(child.pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = true;
    results.push_back(std::move(r));
  }
  if (failed) return absl::InternalError("a client process failed");
  return results;
}

StatusOr<std::vector<std::vector<KindResult>>> RunThreads(const std::string& address,
                                                          const Config& config) {
  std::vector<StatusOr<std::vector<KindResult>>> results(config.clients,
                                                         absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < config.clients; ++i) {
    threads.emplace_back([&, i] { results[i] = ClientLoop(address, i, config); });
  }
  for (auto& t : threads) t.join();
  std::vector<std::vector<KindResult>> out;
  for (auto& r : results) {
    RETURN_IF_ERROR(r.status());
    out.push_back(std::move(*r));
  }
  return out;
}

int Run(const Config& config) {
  auto server = StoreServer::Start("127.0.0.1:0");
  if (!server.ok()) {
    std::cerr << server.status() << "\n";
    return 1;
  }
  auto results = config.in_process ? RunThreads((*server)->address(), config)
                                   : RunProcesses((*server)->address(), config);
  if (!results.ok()) {
    std::cerr << results.status() << "\n";
    return 1;
  }
  for (int kind = 0; kind < 3; ++kind) {
    double wall = 0;
    std::vector<double> p50s;
    for (const auto& r : *results) {
      wall = std::max(wall, r[kind].seconds);
      p50s.push_back(r[kind].p50_us);
    }
    std::printf(
        "{\"system\": \"lockstep-grpc-store\", \"op\": \"%s\", \"clients\": %d, "
        "\"ops_per_s\": %.0f, \"p50_us\": %.1f, \"clients_as\": \"%s\"}\n",
        kKinds[kind], config.clients, config.clients * config.ops / wall, Median(p50s),
        config.in_process ? "threads" : "processes");
  }
  std::fflush(stdout);
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
  flags.Bool("in-process", &config.in_process, "clients as threads of the server's process");
  flags.String("child-address", &config.child_address, "internal: run as client process");
  flags.Int32("child-index", &config.child_index, "internal: client process index");
  auto rest = flags.Parse(argc, argv);
  (void)lockstep::InitLogging();
  if (!rest.ok()) return lockstep::FlagSet::ReportParseError(rest.status());
  if (config.clients < 1 || config.ops < 1 || config.value_bytes < 0) {
    std::cerr << "--clients and --ops must be >= 1\n";
    return 2;
  }
  if (!config.child_address.empty()) return lockstep::rendezvous::RunChild(config);
  return lockstep::rendezvous::Run(config);
}
