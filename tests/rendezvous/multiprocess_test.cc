// Rendezvous and store across real processes: 8 node processes (and a
// server in this test process) on loopback.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "rendezvous/rendezvous_server.h"
#include "rendezvous/store_client.h"

namespace lockstep {
namespace rendezvous {
namespace {

std::string NodeBinary() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return std::string(srcdir ? srcdir : ".") + "/" + (workspace ? workspace : "lockstep") +
         "/tests/rendezvous/rendezvous_node";
}

struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;
};

// Starts the node binary with `args`; its stdout comes back through a pipe.
Child Spawn(const std::vector<std::string>& args) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  Child child;
  child.pid = fork();
  if (child.pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> argv;
    std::string binary = NodeBinary();
    argv.push_back(binary.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  close(fds[1]);
  child.out = fdopen(fds[0], "r");
  return child;
}

// Waits for the child and returns its exit code and first output line.
std::pair<int, std::string> Reap(Child& child) {
  char line[256] = {0};
  std::string text;
  if (std::fgets(line, sizeof(line), child.out) != nullptr) text = line;
  std::fclose(child.out);
  int status = 0;
  waitpid(child.pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text};
}

TEST(MultiprocessTest, EightProcessesRendezvousWithUniqueGapFreeRanksAndShareTheStore) {
  constexpr int kNodes = 8;
  auto rendezvous = std::make_shared<RendezvousCore>();
  RendezvousJobConfig config;
  config.job_id = JobId("mp-job");
  config.min_nodes = kNodes;
  config.max_nodes = kNodes;
  config.nproc_per_node = 2;
  ASSERT_TRUE(rendezvous->CreateJob(config).ok());
  auto server = *RendezvousServer::Start("127.0.0.1:0", rendezvous);
  std::vector<Child> children;
  for (int i = 0; i < kNodes; ++i) {
    children.push_back(Spawn({"--address", server->address(), "--job", "mp-job", "--node",
                              "host-" + std::to_string(i), "--timeout-s", "60"}));
  }
  std::set<int> ranks;
  for (Child& child : children) {
    auto [code, line] = Reap(child);
    ASSERT_EQ(code, 0) << line;
    int rank = -1, nodes = 0, world = 0, round = 0;
    ASSERT_EQ(std::sscanf(line.c_str(), "rank=%d nodes=%d world=%d round=%d", &rank, &nodes,
                          &world, &round),
              4)
        << line;
    EXPECT_EQ(nodes, kNodes);
    EXPECT_EQ(world, 2 * kNodes);
    EXPECT_EQ(round, 1);
    ranks.insert(rank);
  }
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kNodes));
  EXPECT_EQ(*ranks.begin(), 0);
  EXPECT_EQ(*ranks.rbegin(), kNodes - 1);
  EXPECT_EQ(server->store_core()->TryGet("mp-job/1", "barrier").value(),
            std::to_string(kNodes));
}

TEST(MultiprocessTest, KilledClientMidWaitDoesNotDisturbTheServer) {
  auto server = *RendezvousServer::Start("127.0.0.1:0");
  RendezvousJobConfig config;
  config.job_id = JobId("kill-job");
  config.min_nodes = 2;
  config.max_nodes = 2;
  ASSERT_TRUE(server->rendezvous_core()->CreateJob(config).ok());
  // A node process that will wait forever for a partner; kill it mid-join.
  Child doomed = Spawn({"--address", server->address(), "--job", "kill-job", "--node", "doomed",
                        "--timeout-s", "60"});
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (server->rendezvous_core()->GetState(JobId("kill-job"))->participants.empty()) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "node never joined";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(doomed.pid, SIGKILL);
  Reap(doomed);
  while (!server->rendezvous_core()->GetState(JobId("kill-job"))->participants.empty()) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "killed node not withdrawn";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Two fresh processes complete the round.
  Child a = Spawn({"--address", server->address(), "--job", "kill-job", "--node", "a"});
  Child b = Spawn({"--address", server->address(), "--job", "kill-job", "--node", "b"});
  EXPECT_EQ(Reap(a).first, 0);
  EXPECT_EQ(Reap(b).first, 0);
}

TEST(MultiprocessTest, StoreClientKilledMidGetLeavesNoWaiterAndOthersAreServed) {
  auto server = *RendezvousServer::Start("127.0.0.1:0");
  Child doomed = Spawn({"--address", server->address(), "--store-get", "job/1/never"});
  Child patient = Spawn({"--address", server->address(), "--store-get", "job/1/later"});
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (server->store_core()->NumPendingWaiters() < 2) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "clients never waited";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(doomed.pid, SIGKILL);
  Reap(doomed);
  while (server->store_core()->NumPendingWaiters() != 1) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "killed client's wait not cancelled";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(server->store_core()->Set("job/1", "later", "served").ok());
  auto [code, line] = Reap(patient);
  EXPECT_EQ(code, 0);
  EXPECT_EQ(line, "served\n");
  EXPECT_EQ(server->store_core()->NumPendingWaiters(), 0);
}

}  // namespace
}  // namespace rendezvous
}  // namespace lockstep
