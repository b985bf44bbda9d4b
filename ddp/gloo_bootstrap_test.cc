// GlooCommunicator's bootstrap under hostile conditions: a stray connection
// that takes a pair's listening socket before the real peer, and a peer that
// dies mid-collective (SIGPIPE must not kill the survivor).
#include <arpa/inet.h>
#include <gloo/transport/tcp/address.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ddp/fake_store.h"
#include "ddp/gloo_communicator.h"
#include "gtest/gtest.h"
#include "rendezvous/file_store.h"

namespace lockstep {
namespace ddp {
namespace {

// Rank r's pair address for its one peer (a world of two).
sockaddr_in PairAddress(const std::string& blob) {
  gloo::transport::tcp::Address address(std::vector<char>(blob.begin(), blob.end()));
  return reinterpret_cast<const sockaddr_in&>(address.getSockaddr());
}

// Holds rank 1's address back until a stray client has connected to
// whichever side of pair (0, 1) listens (Gloo: the side whose port, as
// stored, is smaller) and sent it 5 bytes, so the stray is first in line.
class StrayConnectingStore : public FakeStore {
 public:
  Status Set(const std::string& key, const std::string& value) override {
    if (key == "gloo/mesh0/1" && !strayed.exchange(true)) {
      auto rank0 = FakeStore::Get("gloo/mesh0/0", std::chrono::seconds(30));
      if (rank0.ok()) {
        const sockaddr_in a0 = PairAddress(*rank0), a1 = PairAddress(value);
        sockaddr_in target = a0.sin_port < a1.sin_port ? a0 : a1;
        const int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, reinterpret_cast<sockaddr*>(&target), sizeof(target)) == 0) {
          stray_port = ntohs(target.sin_port);
          (void)!write(fd, "hello", 5);
        }
        close(fd);
      }
    }
    return FakeStore::Set(key, value);
  }
  std::atomic<bool> strayed{false};
  std::atomic<int> stray_port{0};
};

// Creates ranks 0 and 1 of a world of two over `store` (30 s timeouts),
// rank 1 on a thread of its own, which first runs `on_rank_one`.
std::array<StatusOr<std::unique_ptr<GlooCommunicator>>, 2> CreateTwoRanks(
    rendezvous::Store* store, const std::function<void()>& on_rank_one = {}) {
  GlooOptions options;
  options.timeout = std::chrono::seconds(30);
  options.connect_timeout = std::chrono::seconds(30);
  std::array<StatusOr<std::unique_ptr<GlooCommunicator>>, 2> comms;
  std::thread other([&] {
    if (on_rank_one) on_rank_one();
    comms[1] = GlooCommunicator::Create(store, 1, 2, options);
  });
  comms[0] = GlooCommunicator::Create(store, 0, 2, options);
  other.join();
  return comms;
}

TEST(GlooBootstrapTest, StrayConnectionToAPairPortIsSurvived) {
  StrayConnectingStore store;
  auto comms = CreateTwoRanks(&store);
  ASSERT_NE(store.stray_port.load(), 0) << "the stray client never connected";
  ASSERT_TRUE(comms[0].ok()) << comms[0].status();
  ASSERT_TRUE(comms[1].ok()) << comms[1].status();
  // The first mesh failed its check and a second one was built.
  EXPECT_TRUE(store.Get("gloo/mesh1/nonce", std::chrono::seconds(0)).ok());
  auto verdict = store.Get("gloo/mesh0/verdict/0", std::chrono::seconds(0));
  auto verdict1 = store.Get("gloo/mesh0/verdict/1", std::chrono::seconds(0));
  ASSERT_TRUE(verdict.ok() && verdict1.ok());
  EXPECT_TRUE(*verdict != "ok" || *verdict1 != "ok") << "mesh 0 should have failed its check";
  at::Tensor a = at::full({1000}, 1.0f), b = at::full({1000}, 2.0f);
  auto wa = (*comms[0])->AllReduce(a, ReduceOp::kSum);
  auto wb = (*comms[1])->AllReduce(b, ReduceOp::kSum);
  ASSERT_TRUE(wa->Wait().ok());
  ASSERT_TRUE(wb->Wait().ok());
  EXPECT_TRUE(a.equal(at::full({1000}, 3.0f)));
  EXPECT_TRUE(b.equal(at::full({1000}, 3.0f)));
  // Once the mesh is up no pair port listens (ddp/README.md): a connection
  // to any address either rank published, in either mesh, is refused.
  for (const char* key : {"gloo/mesh0/0", "gloo/mesh0/1", "gloo/mesh1/0", "gloo/mesh1/1"}) {
    auto blob = store.Get(key, std::chrono::seconds(0));
    ASSERT_TRUE(blob.ok()) << key << ": " << blob.status();
    sockaddr_in address = PairAddress(*blob);
    // (The stray above reached a port parsed the same way.)
    ASSERT_NE(address.sin_port, 0) << key;
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    const int rc = connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    const int error = errno;
    close(fd);
    EXPECT_EQ(rc, -1) << key << ": port " << ntohs(address.sin_port) << " still listens";
    EXPECT_EQ(error, ECONNREFUSED) << key << ": " << std::strerror(error);
  }
}

// Hands rank 1 (its thread sets the flag) another mesh nonce than rank 0's
// in every attempt: each mesh fails its check.
thread_local bool g_rank_one = false;
class ForeignNonceStore : public FakeStore {
 public:
  StatusOr<std::string> Get(const std::string& key, Duration timeout) override {
    auto got = FakeStore::Get(key, timeout);
    if (g_rank_one && got.ok() && absl::EndsWith(key, "/nonce")) return std::string("12345");
    return got;
  }
};

// A mesh that fails its check is built again, kMaxMeshAttempts times in
// all; then both ranks give up naming the check and the last failure.
TEST(GlooBootstrapTest, AMeshThatNeverPassesItsCheckFailsAfterThreeAttempts) {
  ForeignNonceStore store;
  auto comms = CreateTwoRanks(&store, [] { g_rank_one = true; });
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(comms[r].ok()) << "rank " << r;
    EXPECT_TRUE(absl::IsUnavailable(comms[r].status())) << comms[r].status();
    EXPECT_NE(comms[r].status().message().find(
                  absl::StrCat("the mesh of 2 ranks failed its check ", kMaxMeshAttempts, " times")),
              std::string::npos)
        << comms[r].status();
    EXPECT_NE(comms[r].status().message().find("a foreign or stray connection"), std::string::npos)
        << comms[r].status();
  }
  for (int attempt = 0; attempt < kMaxMeshAttempts; ++attempt) {
    EXPECT_TRUE(store.Get(absl::StrCat("gloo/mesh", attempt, "/nonce"), std::chrono::seconds(0)).ok())
        << "attempt " << attempt + 1 << " was not made";
  }
  EXPECT_FALSE(store.Get(absl::StrCat("gloo/mesh", kMaxMeshAttempts, "/nonce"),
                         std::chrono::seconds(0))
                   .ok())
      << "more than " << kMaxMeshAttempts << " attempts";
}

// Ranks as processes; rank 1 is SIGKILLed after one allreduce. Rank 0 then
// broadcasts 16 MB as the root (it only writes), so its writes hit the dead
// peer's socket: it must fail with an error naming rank 1, not die of
// SIGPIPE.
TEST(GlooBootstrapTest, SurvivorOfADeadPeerFailsWithAnErrorNotASignal) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(tmp ? tmp : "/tmp") + "/sigpipe_XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  pid_t pids[2];
  for (int rank = 0; rank < 2; ++rank) {
    pids[rank] = fork();
    if (pids[rank] != 0) continue;
    auto store = rendezvous::FileStore::Open(dir);
    GlooOptions options;
    options.timeout = std::chrono::seconds(10);
    auto comm = store.ok() ? GlooCommunicator::Create(store->get(), rank, 2, options)
                           : StatusOr<std::unique_ptr<GlooCommunicator>>(store.status());
    if (!comm.ok()) _exit(2);
    // The mechanism: with SIGPIPE ignored a write to a dead peer fails with
    // EPIPE (Gloo notices most deaths on read first, so the race that
    // delivered SIGPIPE is not reproduced on demand here).
    struct sigaction pipe {};
    if (sigaction(SIGPIPE, nullptr, &pipe) != 0 || pipe.sa_handler != SIG_IGN) _exit(6);
    at::Tensor t = at::ones({4 << 20});
    if (!(*comm)->AllReduce(t, ReduceOp::kSum)->Wait().ok()) _exit(3);
    if (rank == 1) raise(SIGKILL);
    for (int i = 0; i < 100; ++i) {
      Status s = (*comm)->Broadcast(t, /*root=*/0)->Wait();
      if (!s.ok()) {
        std::fprintf(stderr, "rank 0: %s\n", s.ToString().c_str());
        _exit(s.message().find("ranks [1]") != std::string::npos ? 0 : 4);
      }
    }
    _exit(5);  // never noticed the dead peer
  }
  int status = 0;
  ASSERT_EQ(waitpid(pids[1], &status, 0), pids[1]);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "rank 1 was meant to die";
  ASSERT_EQ(waitpid(pids[0], &status, 0), pids[0]);
  ASSERT_FALSE(WIFSIGNALED(status)) << "rank 0 died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "exit code " << WEXITSTATUS(status)
      << " (4: the error did not name rank 1; 5: never noticed; 6: SIGPIPE not ignored)";
}

}  // namespace
}  // namespace ddp
}  // namespace lockstep
