#include <map>
#include <string>
#include <thread>
#include <utility>

#include "ddp/init.h"
#include "ddp/missing_ranks.h"
#include "gtest/gtest.h"
#include "rendezvous/store_client.h"
#include "rendezvous/store_server.h"

namespace lockstep {
namespace ddp {
namespace {

// A port that was free a moment ago on `host` (a throwaway server picks it).
int FreePort(const std::string& host) {
  auto probe = rendezvous::StoreServer::Start(host + ":0");
  EXPECT_TRUE(probe.ok()) << probe.status();
  return probe.ok() ? (*probe)->port() : 0;
}

using StoreOr = StatusOr<std::unique_ptr<rendezvous::Store>>;

// Opens both ranks' stores at once, as two workers would.
std::pair<StoreOr, StoreOr> OpenBoth(const WorkerEnv& env0, const WorkerEnv& env1) {
  StoreOr s0 = absl::UnknownError(""), s1 = absl::UnknownError("");
  std::thread t0([&] { s0 = OpenStore(env0, std::chrono::seconds(10)); });
  std::thread t1([&] { s1 = OpenStore(env1, std::chrono::seconds(10)); });
  t0.join();
  t1.join();
  return {std::move(s0), std::move(s1)};
}

TEST(InitFromEnvGrpcTest, HostPortAddressConnectsTheStoreClientInTheRoundNamespace) {
  auto server = rendezvous::StoreServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  WorkerEnv env;
  env.job_id = "j";
  env.round = 3;
  env.store_address = (*server)->address();
  auto store = OpenStore(env, std::chrono::seconds(5));
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Set("k", "v").ok());
  env.round = 4;
  auto other_round = OpenStore(env, std::chrono::seconds(5));
  ASSERT_TRUE(other_round.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      (*other_round)->Get("k", std::chrono::milliseconds(50)).status()));
}

// Nothing at LOCKSTEP_STORE: the wait ends saying where and for how long
// (it waited without a word and said only that the server was not
// reachable).
TEST(InitFromEnvGrpcTest, AStoreThatCannotBeReachedIsNamedWithTheTimeWaited) {
  WorkerEnv env;
  env.job_id = "j";
  env.store_address = "127.0.0.1:" + std::to_string(FreePort("127.0.0.1"));
  auto store = OpenStore(env, std::chrono::seconds(2));
  ASSERT_FALSE(store.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(store.status())) << store.status();
  EXPECT_NE(store.status().message().find("the job's store at " + env.store_address +
                                          " (LOCKSTEP_STORE) could not be reached in 2 s"),
            std::string::npos)
      << store.status();
}

// The store server restarts (its coordinator did) while rank 1 waits for
// rank 0's arrival, which rank 0 had written before: the restarted store
// never holds it. The wait ends at its next look saying the store
// restarted, naming no rank; it said "ranks [0] did not arrive" after the
// whole timeout and marked rank 0, whom the coordinator then blamed.
TEST(InitFromEnvGrpcTest, AStoreThatRestartedUnderABootstrapWaitIsNamedNotARank) {
  auto server = rendezvous::StoreServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  auto rank1 = rendezvous::ConnectStore((*server)->address(), "j/1", std::chrono::seconds(5));
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  ASSERT_TRUE((*rank1)->Set("arrived/1", "x").ok());
  EXPECT_TRUE((*rank1)->Lost().ok());
  (*server)->Shutdown();
  server->reset();
  server = rendezvous::StoreServer::Start("127.0.0.1:" + std::to_string(port));
  ASSERT_TRUE(server.ok()) << server.status();
  const auto start = std::chrono::steady_clock::now();
  Status s = WaitForRanks(rank1->get(), {{0, "arrived/0"}}, std::chrono::seconds(20), "bootstrap",
                          nullptr, std::chrono::seconds(1));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("bootstrap: the store at 127.0.0.1:" + std::to_string(port) +
                             " restarted ("),
            std::string::npos)
      << s;
  EXPECT_EQ(s.message().find("did not arrive"), std::string::npos) << s;
  EXPECT_FALSE((*rank1)->Lost().ok());
}

// Both ranks open the store (rank 0 serving it) and what rank 1 sets,
// rank 0 reads.
void ExpectRankOneReachesRankZero(const WorkerEnv& env0, const WorkerEnv& env1) {
  auto [s0, s1] = OpenBoth(env0, env1);
  ASSERT_TRUE(s0.ok()) << s0.status();
  ASSERT_TRUE(s1.ok()) << s1.status();
  ASSERT_TRUE((*s1)->Set("from1", "x").ok());
  auto v = (*s0)->Get("from1", std::chrono::seconds(5));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "x");
}

TEST(InitFromEnvGrpcTest, MasterAddrMakesRankZeroServeTheStore) {
  const int port = FreePort("127.0.0.1");
  WorkerEnv env0, env1;
  env0.master_addr = env1.master_addr = "127.0.0.1:" + std::to_string(port);
  env0.world_size = env1.world_size = 2;
  env1.rank = 1;
  ExpectRankOneReachesRankZero(env0, env1);
}

// torchrun's MASTER_ADDR=::1 (bare IPv6): rank 0 serves [::1]:port and both
// ranks connect; it was read as the host "::1:port", "not a loopback address".
TEST(InitFromEnvGrpcTest, BareIpv6MasterAddrServesAndConnects) {
  auto probe = rendezvous::StoreServer::Start("[::1]:0");
  if (!probe.ok()) GTEST_SKIP() << "no IPv6 loopback here: " << probe.status();
  const std::string port = std::to_string((*probe)->port());
  probe->reset();
  auto parse = [&](const char* rank) {
    std::map<std::string, std::string> vars = {
        {"RANK", rank}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "::1"}, {"MASTER_PORT", port}};
    return ParseWorkerEnv([vars](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    });
  };
  auto env0 = parse("0");
  auto env1 = parse("1");
  ASSERT_TRUE(env0.ok()) << env0.status();
  ASSERT_TRUE(env1.ok()) << env1.status();
  ExpectRankOneReachesRankZero(*env0, *env1);
}

// A MASTER_ADDR that does not resolve made the other ranks wait out their
// timeout and blame rank 0 ("is rank 0 running?"). They still wait (DNS
// may lag behind a starting cluster), but the error says it does not resolve.
TEST(InitFromEnvGrpcTest, AnUnresolvableMasterAddrSaysSoWhenTheWaitEnds) {
  WorkerEnv env;
  env.master_addr = "nosuch.invalid:29500";
  env.store_token = "s3cret";
  env.world_size = 2;
  env.rank = 1;
  auto store = OpenStore(env, std::chrono::seconds(2));
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("MASTER_ADDR 'nosuch.invalid' does not resolve"),
            std::string::npos)
      << store.status();
  EXPECT_EQ(store.status().message().find("is rank 0 running?"), std::string::npos)
      << store.status();
}

// Beyond loopback (here the wildcard 0.0.0.0, reachable from other hosts),
// rank 0's store needs the job's token: none is an error naming
// LOCKSTEP_STORE_TOKEN; with one, the ranks that have it connect and a
// client without it is refused.
TEST(InitFromEnvGrpcTest, MasterStoreBeyondLoopbackNeedsAToken) {
  const int port = FreePort("0.0.0.0");
  WorkerEnv env0, env1;
  env0.master_addr = env1.master_addr = "0.0.0.0:" + std::to_string(port);
  env0.world_size = env1.world_size = 2;
  env1.rank = 1;
  auto open = OpenStore(env0, std::chrono::seconds(5));
  ASSERT_EQ(open.status().code(), absl::StatusCode::kFailedPrecondition) << open.status();
  EXPECT_NE(open.status().message().find("set LOCKSTEP_STORE_TOKEN"), std::string::npos)
      << open.status();

  env0.store_token = env1.store_token = "s3cret";
  auto [s0, s1] = OpenBoth(env0, env1);
  ASSERT_TRUE(s0.ok()) << s0.status();
  ASSERT_TRUE(s1.ok()) << s1.status();
  ASSERT_TRUE((*s1)->Set("from1", "x").ok());

  for (const std::string& token : {std::string(), std::string("s3cres")}) {
    rendezvous::StoreClientOptions options;
    options.connect_timeout = std::chrono::seconds(5);
    options.token = token;
    auto intruder = rendezvous::ConnectStore("127.0.0.1:" + std::to_string(port), "local/0", options);
    Status got = intruder.ok() ? (*intruder)->Set("evil", "1") : intruder.status();
    EXPECT_TRUE(absl::IsUnauthenticated(got)) << "token '" << token << "': " << got;
  }
  auto v = (*s0)->Get("evil", std::chrono::milliseconds(100));
  EXPECT_TRUE(absl::IsDeadlineExceeded(v.status())) << "an intruder wrote into the job's store";
}

}  // namespace
}  // namespace ddp
}  // namespace lockstep
