#include "ddp/init.h"
#include "ddp/missing_ranks.h"

#include <dlfcn.h>
#include <malloc.h>
#include <stdlib.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdlib>
#include <map>
#include <string>

#include "ddp/fake_store.h"
#include "ddp/nccl_communicator.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace ddp {
namespace {

TEST(KeepFreedMemoryTest, LargeBlocksComeFromTheHeapNotFreshMappings) {
  ::setenv("LOCKSTEP_KEEP_FREED_MEMORY", "0", 1);
  EXPECT_FALSE(KeepFreedMemory());
  ::unsetenv("LOCKSTEP_KEEP_FREED_MEMORY");
  ASSERT_TRUE(KeepFreedMemory());
  // 64 MB: far above glibc's default mmap threshold (128 KB .. 32 MB).
  const size_t mapped_before = ::mallinfo2().hblkhd;
  void* block = std::malloc(64 << 20);
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(::mallinfo2().hblkhd, mapped_before);
  std::free(block);
}

TEST(SetIntraOpThreadsTest, ReachesLibTorchAndOpenBlas) {
  EXPECT_EQ(SetIntraOpThreads(0).status().code(), absl::StatusCode::kInvalidArgument);
  using GetThreads = int (*)();
  auto openblas = reinterpret_cast<GetThreads>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  for (int threads : {2, 1}) {
    auto set = SetIntraOpThreads(threads);
    ASSERT_TRUE(set.ok()) << set.status();
    EXPECT_EQ(at::get_num_threads(), threads);
    if (openblas == nullptr) {
      EXPECT_EQ(*set, 0) << "no OpenBLAS is loaded";
    } else {
      // OpenBLAS's pool is set too (without this it kept one thread per core).
      EXPECT_EQ(*set, threads);
      EXPECT_EQ(openblas(), threads);
    }
  }
}

TEST(JoinStoreTest, EachRankJoinsOnceAndTheWorldSizeMustAgree) {
  FakeStore store;
  WorkerEnv env;
  env.job_id = "first";
  env.world_size = 2;
  env.master_addr = "127.0.0.1:29500";
  env.rank = 0;
  ASSERT_TRUE(JoinStore(&store, env).ok());
  env.rank = 1;
  ASSERT_TRUE(JoinStore(&store, env).ok());

  // Rank 1 of a second job on the same MASTER_ADDR:MASTER_PORT.
  env.job_id = "second";
  Status again = JoinStore(&store, env);
  EXPECT_TRUE(absl::IsAlreadyExists(again)) << again;
  EXPECT_NE(again.message().find("rank 1 of job second round 0 already joined the store at "
                                 "127.0.0.1:29500"),
            std::string::npos)
      << again;
  EXPECT_NE(again.message().find("another job uses this MASTER_ADDR:MASTER_PORT"),
            std::string::npos)
      << again;

  // A world of another size.
  env.world_size = 4;
  env.rank = 3;
  Status other = JoinStore(&store, env);
  EXPECT_TRUE(absl::IsFailedPrecondition(other)) << other;
  EXPECT_NE(other.message().find("belongs to a world of 2 ranks; rank 3 of job second expects 4: "
                                 "the ranks were started with different world sizes (WORLD_SIZE)"),
            std::string::npos)
      << other;
}

// A rank refused for another world size said so only to itself: the ranks
// that joined waited out their timeout and reported it as "did not arrive".
// They now name the refusal at their next look.
TEST(JoinStoreTest, PeersWaitingForARefusedRankNameTheRefusal) {
  FakeStore store;
  WorkerEnv env;
  env.world_size = 3;
  env.rank = 0;
  ASSERT_TRUE(JoinStore(&store, env).ok());
  ASSERT_TRUE(store.Set("boot/arrived/0", "1").ok());
  env.world_size = 2;
  env.rank = 1;
  ASSERT_FALSE(JoinStore(&store, env).ok());
  Status waited = WaitForRanks(&store, {{0, "boot/arrived/0"}, {1, "boot/arrived/1"}, {2, "boot/arrived/2"}},
                               std::chrono::seconds(60), "rank 0 bootstrapping", nullptr,
                               std::chrono::milliseconds(20));
  EXPECT_EQ(waited.code(), absl::StatusCode::kFailedPrecondition) << waited;
  EXPECT_EQ(waited.message(),
            "rank 0 bootstrapping: rank 1 was refused by the store: it came with a world of 2 "
            "ranks, not 3; every rank must be started with the same WORLD_SIZE");
}

TEST(OpenStoreTest, FileAddressOpensNamespacedDirectory) {
  WorkerEnv env;
  env.job_id = "job";
  env.round = 2;
  env.store_address = std::string("file:") + (getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp");
  auto store = OpenStore(env, std::chrono::seconds(1));
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE((*store)->Set("k", "v").ok());
}

TEST(OpenStoreTest, MasterAddrWithoutStoreNamesTheMissingVariable) {
  WorkerEnv env;
  env.master_addr = "127.0.0.1:29500";
  auto store = OpenStore(env, std::chrono::seconds(1));
  EXPECT_TRUE(absl::IsFailedPrecondition(store.status()));
  EXPECT_NE(store.status().message().find("LOCKSTEP_STORE"), std::string::npos);
}

// MASTER_PORT alone (no MASTER_ADDR, no LOCKSTEP_STORE) has no host to serve
// or reach rank 0's store at.
TEST(OpenStoreTest, MasterPortWithoutMasterAddrNamesTheMissingVariable) {
  WorkerEnv env;
  env.master_addr = ":29500";
  auto store = OpenStore(env, std::chrono::seconds(1));
  EXPECT_TRUE(absl::IsInvalidArgument(store.status())) << store.status();
  EXPECT_EQ(store.status().message(), "MASTER_ADDR is not set (MASTER_PORT=29500 is)");
}

TEST(OpenStoreTest, AnAddressThatIsNeitherADirNorHostPortIsRefusedNamingIt) {
  WorkerEnv env;
  env.job_id = "job";
  env.store_address = "file:";
  auto store = OpenStore(env, std::chrono::seconds(1));
  EXPECT_TRUE(absl::IsInvalidArgument(store.status())) << store.status();
  EXPECT_NE(store.status().message().find("LOCKSTEP_STORE=file: needs a directory"),
            std::string::npos)
      << store.status();
  env.store_address = "storehost";
  store = OpenStore(env, std::chrono::seconds(1));
  EXPECT_TRUE(absl::IsInvalidArgument(store.status())) << store.status();
  EXPECT_NE(store.status().message().find("LOCKSTEP_STORE='storehost' is neither file:/dir nor host:port"),
            std::string::npos)
      << store.status();
}

TEST(OpenStoreTest, HostPortUsesTheRegisteredFactory) {
  WorkerEnv env;
  env.store_address = "127.0.0.1:5000";
  EXPECT_TRUE(absl::IsFailedPrecondition(OpenStore(env, std::chrono::seconds(1)).status()));
  std::string seen_ns;
  RegisterStoreFactory([&](const std::string& address, const std::string& ns, Duration)
                           -> StatusOr<std::unique_ptr<rendezvous::Store>> {
    seen_ns = ns;
    return absl::UnavailableError("no server at " + address);
  });
  auto store = OpenStore(env, std::chrono::seconds(1));
  EXPECT_TRUE(absl::IsUnavailable(store.status()));
  EXPECT_EQ(seen_ns, "local/0");
  RegisterStoreFactory(nullptr);
}

// Sets a world of one on a file store for InitFromEnv.
void SetWorldOfOne(const std::string& dir) {
  setenv("LOCKSTEP_STORE", ("file:" + dir).c_str(), 1);
  setenv("LOCKSTEP_RANK", "0", 1);
  setenv("LOCKSTEP_WORLD_SIZE", "1", 1);
}

std::string TestDir(const char* leaf) {
  const char* tmp = getenv("TEST_TMPDIR");
  return std::string(tmp ? tmp : "/tmp") + "/" + leaf;
}

// torchrun restarts its workers with TORCHELASTIC_RESTART_COUNT one more
// and no LOCKSTEP_ROUND: on a store that outlives them (file:) each restart
// joins a namespace of its own. It joined the first one again and was
// refused ("already joined") at every restart until the budget was spent.
TEST(InitFromEnvTest, ATorchrunRestartJoinsAFileStoreAfresh) {
  SetWorldOfOne(TestDir("torchrun_restart"));
  unsetenv("LOCKSTEP_ROUND");
  setenv("TORCHELASTIC_RUN_ID", "run1", 1);
  for (const char* restart : {"0", "1"}) {
    SCOPED_TRACE(restart);
    setenv("TORCHELASTIC_RESTART_COUNT", restart, 1);
    auto group = InitFromEnv();
    ASSERT_TRUE(group.ok()) << group.status();
  }
  unsetenv("TORCHELASTIC_RESTART_COUNT");
  unsetenv("TORCHELASTIC_RUN_ID");
}

TEST(InitFromEnvTest, DefaultBackendIsGlooAndUnknownBackendIsNamed) {
  SetWorldOfOne(TestDir("backend"));
  unsetenv("LOCKSTEP_BACKEND");
  auto group = InitFromEnv();
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->communicator()->backend(), "gloo");
  setenv("LOCKSTEP_BACKEND", "mpi", 1);
  auto bad = InitFromEnv();  // Refused before it touches the store.
  unsetenv("LOCKSTEP_BACKEND");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_NE(bad.status().message().find("unknown communication backend 'mpi'"), std::string::npos)
      << bad.status();
}

TEST(InitFromEnvTest, ShmBackendFromTheEnvironmentReducesInSharedMemory) {
  SetWorldOfOne(TestDir("shm"));
  setenv("LOCKSTEP_BACKEND", "shm", 1);
  auto group = InitFromEnv();
  unsetenv("LOCKSTEP_BACKEND");
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->communicator()->backend(), "shm");
  at::Tensor t = at::full({3}, 2.0f);
  ASSERT_TRUE((*group)->communicator()->AllReduce(t, ReduceOp::kAvg)->Wait().ok());
  EXPECT_TRUE(t.equal(at::full({3}, 2.0f)));
}

TEST(InitFromEnvTest, NcclBackendWithoutNcclOrGpuSaysWhy) {
  SetWorldOfOne(TestDir("nccl"));
  InitOptions options;
  options.backend = "nccl";
  options.connect_timeout = std::chrono::seconds(5);
  auto group = InitFromEnv(options);
  if (group.ok()) {
    EXPECT_EQ((*group)->communicator()->backend(), "nccl");  // A GPU machine.
    return;
  }
  // Built without NCCL: Unimplemented naming the build option; with NCCL
  // but no device: FailedPrecondition naming the missing device.
  const std::string message(group.status().message());
  if (!NcclCompiledIn()) {
    EXPECT_TRUE(absl::IsUnimplemented(group.status())) << group.status();
    EXPECT_NE(message.find("nccl: built without NCCL (build with bazel --config=cuda"),
              std::string::npos)
        << group.status();
  } else {
    EXPECT_TRUE(absl::IsFailedPrecondition(group.status())) << group.status();
    EXPECT_NE(message.find("nccl: rank 0: no CUDA device is visible"), std::string::npos)
        << group.status();
  }
}

}  // namespace
}  // namespace ddp
}  // namespace lockstep
