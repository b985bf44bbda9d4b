// nccl_allreduce_bench: NcclCommunicator allreduce on CUDA tensors, one rank
// per visible GPU (threads of this process, one device each), one JSON line
// per message size from 1 KB to --max-mb (x4 steps; 1 GB by default):
// bytes, time_us (median over --repeats batches of the per-call average of
// --iters back-to-back calls, as nccl-tests times), algbw_gbps, busbw_gbps
// (= algbw x 2(n-1)/n, nccl-tests' definition: 0 for one rank, where the
// call is a local in-place no-op and time_us is launch + completion latency),
// and wait_us (median latency of one call waited alone, which includes the
// watchdog's polling).
//
//   bazel run --config=opt --config=cuda //bench:nccl_allreduce_bench   (CUDA LibTorch)
//   build-gpu/nccl_allreduce_bench [--world 1] [--max-mb 1024]         (CMake build)
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/median.h"
#include "common/flags.h"
#include "ddp/nccl_communicator.h"
#include "rendezvous/memory_store.h"

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  int64_t world = 0;
  int64_t max_mb = 1024;
  int64_t repeats = 5;
};

// One rank; rank 0 prints. Returns false on any error (printed).
bool RunRank(int rank, int world, rendezvous::Store* store, const Config& cfg) {
  ddp::NcclOptions options;
  options.device = rank;
  options.connect_timeout = std::chrono::seconds(60);
  auto comm = ddp::NcclCommunicator::Create(store, rank, world, options);
  if (!comm.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
    return false;
  }
  const auto on_gpu = torch::TensorOptions().dtype(torch::kFloat).device(torch::kCUDA, rank);
  for (int64_t nbytes = 1 << 10; nbytes <= (cfg.max_mb << 20); nbytes <<= 2) {
    torch::Tensor t = torch::ones({nbytes / 4}, on_gpu);
    const int iters = static_cast<int>(std::max<int64_t>(5, std::min<int64_t>(200, int64_t(2e10) / nbytes)));
    auto call = [&] { return (*comm)->AllReduce(t, ddp::ReduceOp::kSum); };
    for (int i = 0; i < 5; ++i) {
      if (Status s = call()->Wait(); !s.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
        return false;
      }
    }
    std::vector<double> batch_us, wait_us;
    for (int r = 0; r < cfg.repeats; ++r) {
      if (!(*comm)->Barrier()->Wait().ok()) return false;
      const auto start = Clock::now();
      std::shared_ptr<ddp::Work> last;
      for (int i = 0; i < iters; ++i) last = call();
      if (Status s = last->Wait(); !s.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
        return false;
      }
      batch_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count() /
                         iters);
      const auto one = Clock::now();
      if (!call()->Wait().ok()) return false;
      wait_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - one).count());
    }
    const double us = Median(batch_us);
    const double algbw = nbytes / us / 1e3;
    if (rank == 0) {
      std::printf(
          R"({"system":"lockstep-nccl","world":%d,"device":"%s","bytes":%lld,"time_us":%.2f,)"
          R"("algbw_gbps":%.3f,"busbw_gbps":%.3f,"wait_us":%.2f,"iters":%d})"
          "\n",
          world, torch::cuda::device_count() > 0 ? "cuda" : "none",
          static_cast<long long>(nbytes), us, algbw, algbw * 2 * (world - 1) / world,
          Median(wait_us), iters);
      std::fflush(stdout);
    }
  }
  return true;
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  lockstep::Config cfg;
  lockstep::FlagSet flags("nccl_allreduce_bench", "NcclCommunicator allreduce bandwidth");
  flags.Int("world", &cfg.world, "ranks, one GPU each (0: every visible GPU)");
  flags.Int("max-mb", &cfg.max_mb, "largest message (MB)");
  flags.Int("repeats", &cfg.repeats, "timed batches per size (the median is reported)");
  auto rest = flags.Parse(argc, argv);
  if (!rest.ok()) return lockstep::FlagSet::ReportParseError(rest.status());
  const std::string reason = lockstep::ddp::NcclUnavailableReason();
  if (!reason.empty()) {
    std::fprintf(stderr, "nccl_allreduce_bench: cannot run: %s\n", reason.c_str());
    return 1;
  }
  const int gpus = lockstep::ddp::CudaDeviceCount();
  const int world = cfg.world > 0 ? static_cast<int>(cfg.world) : gpus;
  if (world > gpus) {
    std::fprintf(stderr, "nccl_allreduce_bench: --world %d needs %d GPUs, %d visible\n", world,
                 world, gpus);
    return 2;
  }
  lockstep::rendezvous::MemoryStore store;
  std::vector<std::thread> threads;
  std::vector<char> ok(world, 0);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] { ok[r] = lockstep::RunRank(r, world, &store, cfg) ? 1 : 0; });
  }
  for (auto& t : threads) t.join();
  return std::all_of(ok.begin(), ok.end(), [](char c) { return c != 0; }) ? 0 : 1;
}
