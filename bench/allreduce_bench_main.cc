// allreduce_bench: GlooCommunicator allreduce between N local processes,
// one JSON line per message size (the same sizes and fields as the peer
// ../shared/bench/torch_allreduce_bench.py): bytes, time_us (median),
// algbw_gbps, busbw_gbps (= algbw x 2(n-1)/n), plus cpu_us per call.
//
//   bazel run --config=opt //bench:allreduce_bench -- --world 2 [--max-mb 64] [--segment-kb 1024]
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/median.h"
#include "common/flags.h"
#include "common/status.h"
#include "ddp/gloo_communicator.h"
#include "ddp/shm_communicator.h"
#include "rendezvous/file_store.h"

namespace lockstep {
namespace {

double CpuUs() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 + ru.ru_utime.tv_usec +
         ru.ru_stime.tv_usec;
}

StatusOr<std::unique_ptr<ddp::Communicator>> Connect(const std::string& backend,
                                                     rendezvous::Store* store, int rank, int world,
                                                     int64_t segment_kb) {
  if (backend == "shm") {
    ASSIGN_OR_RETURN(auto comm, ddp::ShmCommunicator::Create(store, rank, world));
    return std::unique_ptr<ddp::Communicator>(std::move(comm));
  }
  if (backend != "gloo") {
    return absl::InvalidArgumentError("--backend must be gloo or shm, got '" + backend + "'");
  }
  ddp::GlooOptions options;
  if (segment_kb > 0) options.max_segment_bytes = static_cast<size_t>(segment_kb) * 1024;
  ASSIGN_OR_RETURN(auto comm, ddp::GlooCommunicator::Create(store, rank, world, options));
  return std::unique_ptr<ddp::Communicator>(std::move(comm));
}

int RunRank(int rank, int world, const std::string& dir, int64_t max_mb, int64_t segment_kb,
            const std::string& backend) {
  at::set_num_threads(1);
  auto store = rendezvous::FileStore::Open(dir);
  if (!store.ok()) return 1;
  auto comm = Connect(backend, store->get(), rank, world, segment_kb);
  if (!comm.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
    return 1;
  }
  const int64_t shown_segment_kb =
      backend == "gloo" ? (segment_kb > 0 ? segment_kb : ddp::kDefaultGlooSegmentBytes / 1024)
                        : static_cast<int64_t>(ddp::kDefaultShmSlotBytes / 2 / 1024);
  for (int64_t nbytes = 1 << 10; nbytes <= (max_mb << 20); nbytes <<= 2) {
    at::Tensor t = at::ones({nbytes / 4});
    const int iters = std::max<int64_t>(5, std::min<int64_t>(200, int64_t(4e8) / nbytes));
    for (int i = 0; i < 3; ++i) {
      if (!(*comm)->AllReduce(t, ddp::ReduceOp::kSum)->Wait().ok()) return 1;
    }
    std::vector<double> times;
    double cpu = 0;
    for (int i = 0; i < iters; ++i) {
      if (!(*comm)->Barrier()->Wait().ok()) return 1;
      const double c0 = CpuUs();
      const auto s = std::chrono::steady_clock::now();
      if (!(*comm)->AllReduce(t, ddp::ReduceOp::kSum)->Wait().ok()) return 1;
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count());
      cpu += CpuUs() - c0;
    }
    const double dt = Median(times);
    const double algbw = nbytes / dt / 1e9;
    if (rank == 0) {
      std::printf(
          R"({"system":"lockstep-%s","world":%d,"bytes":%lld,"time_us":%.1f,"algbw_gbps":%.3f,)"
          R"("busbw_gbps":%.3f,"cpu_us":%.1f,"segment_kb":%lld})" "\n",
          backend.c_str(), world, static_cast<long long>(nbytes), dt * 1e6, algbw,
          algbw * 2 * (world - 1) / world, cpu / iters, static_cast<long long>(shown_segment_kb));
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  int64_t world = 2, max_mb = 64, segment_kb = 0;
  std::string backend = "gloo";
  lockstep::FlagSet flags("allreduce_bench", "CPU allreduce bandwidth (Gloo or shared memory)");
  flags.String("backend", &backend, "gloo | shm");
  flags.Int("world", &world, "processes");
  flags.Int("max-mb", &max_mb, "largest message (MB)");
  flags.Int("segment-kb", &segment_kb, "Gloo ring segment size (KB); 0 = GlooOptions default (4096)");
  auto rest = flags.Parse(argc, argv);
  if (!rest.ok()) return lockstep::FlagSet::ReportParseError(rest.status());
  char templ[] = "/tmp/allreduce_bench_XXXXXX";
  if (mkdtemp(templ) == nullptr) return 1;
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid == 0) _exit(lockstep::RunRank(r, world, templ, max_mb, segment_kb, backend));
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  return failed == 0 ? 0 : 1;
}
