// ddp_cuda_bench: training step time on one GPU, local training against
// DistributedDataParallel over a world-of-one NcclCommunicator, same model,
// batch and optimiser. With one rank the allreduce moves no data, so the
// difference is what the DDP engine itself costs on the GPU: the bucket
// copies, the per-bucket events and stream hops, and the 1/world scaling.
// The peer is bench/torch_ddp_cuda_bench.py (PyTorch DDP, NCCL, world 1).
//
// Prints one JSON line per mode (lockstep-local, lockstep-ddp): median step
// ms over --repeats rounds of --steps steps each, the modes alternating
// round by round so that clock drift hits both. Each step ends with a device
// synchronise, as the peer's does. lockstep-ddp adds the median exposed
// communication (backward's end waiting on buckets) and how long before
// backward's end the first bucket's collective had started on the GPU.
//
//   build-gpu/ddp_cuda_bench --model mlp [--steps 30 --repeats 3 --batch 32]
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "bench/median.h"
#include "common/flags.h"
#include "ddp/ddp.h"
#include "ddp/nccl_communicator.h"
#include "examples/models.h"
#include "rendezvous/memory_store.h"

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Config {
  std::string model = "mlp";
  int64_t steps = 30;
  int64_t warmup = 5;
  int64_t repeats = 3;
  int64_t batch = 32;
  double bucket_mb = 25;
};

struct Trainer {
  examples::Workload w;
  std::unique_ptr<torch::optim::SGD> opt;
  std::shared_ptr<ddp::DistributedDataParallel> ddp;  // Null: local training.
  std::vector<double> step_ms, exposed_ms, lead_ms;
};

Status Step(Trainer& t, const torch::Tensor& x, const torch::Tensor& y, bool record) {
  const auto start = Clock::now();
  t.opt->zero_grad();
  if (t.ddp == nullptr) {
    torch::nn::functional::cross_entropy(t.w.module.forward(x), y).backward();
  } else {
    ASSIGN_OR_RETURN(torch::Tensor out, t.ddp->Forward(x));
    RETURN_IF_ERROR(t.ddp->Backward(torch::nn::functional::cross_entropy(out, y)));
  }
  t.opt->step();
  torch::cuda::synchronize();
  if (!record) return absl::OkStatus();
  t.step_ms.push_back(Ms(Clock::now() - start));
  if (t.ddp != nullptr) {
    const ddp::StepStats s = t.ddp->last_stats();
    t.exposed_ms.push_back(s.comm_exposed_ms);
    if (!s.reducer.bucket_comm_start.empty()) {
      t.lead_ms.push_back(Ms(s.reducer.backward_end - s.reducer.bucket_comm_start.front()));
    }
  }
  return absl::OkStatus();
}

Status Run(const Config& cfg) {
  const torch::Device gpu(torch::kCUDA, 0);
  rendezvous::MemoryStore store;
  ddp::NcclOptions nccl;
  nccl.device = 0;
  ASSIGN_OR_RETURN(auto comm, ddp::NcclCommunicator::Create(&store, 0, 1, nccl));
  std::shared_ptr<ddp::Communicator> shared_comm = std::move(comm);

  Trainer local, dist;
  for (Trainer* t : {&local, &dist}) {
    ASSIGN_OR_RETURN(t->w, examples::MakeWorkload(cfg.model, /*seed=*/7));
    t->w.root->to(gpu);
    t->w.root->train();
    t->opt = std::make_unique<torch::optim::SGD>(t->w.root->parameters(),
                                                 torch::optim::SGDOptions(0.01));
  }
  ddp::DdpOptions options;
  options.bucket_cap_mb = cfg.bucket_mb;
  ASSIGN_OR_RETURN(dist.ddp, ddp::DistributedDataParallel::Create(dist.w.module, shared_comm,
                                                                   options));
  auto [x, y] = examples::MakeBatch(local.w, cfg.batch, /*seed=*/1);
  x = x.to(gpu);
  y = y.to(gpu);
  for (Trainer* t : {&local, &dist}) {
    for (int64_t i = 0; i < cfg.warmup; ++i) RETURN_IF_ERROR(Step(*t, x, y, false));
  }
  for (int64_t r = 0; r < cfg.repeats; ++r) {
    for (Trainer* t : {&local, &dist}) {
      for (int64_t i = 0; i < cfg.steps; ++i) RETURN_IF_ERROR(Step(*t, x, y, true));
    }
  }
  for (Trainer* t : {&local, &dist}) {
    const double ms = Median(t->step_ms);
    std::printf(R"({"system":"%s","model":"%s","world":1,"device":"cuda","batch":%lld,)"
                R"("steps":%zu,"step_ms_median":%.3f,"samples_per_s":%.1f)",
                t->ddp ? "lockstep-ddp" : "lockstep-local", cfg.model.c_str(),
                static_cast<long long>(cfg.batch), t->step_ms.size(), ms, cfg.batch * 1e3 / ms);
    if (t->ddp) {
      std::printf(R"(,"buckets":%d,"comm_exposed_ms_median":%.3f,"first_bucket_lead_ms_median":%.3f)",
                  t->ddp->last_stats().buckets, Median(t->exposed_ms), Median(t->lead_ms));
    }
    std::printf("}\n");
  }
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  lockstep::Config cfg;
  lockstep::FlagSet flags("ddp_cuda_bench", "DDP step time on one GPU against local training");
  flags.String("model", &cfg.model, "mlp | convnet | transformer");
  flags.Int("steps", &cfg.steps, "measured steps per round and mode");
  flags.Int("warmup", &cfg.warmup, "warm-up steps per mode, not measured");
  flags.Int("repeats", &cfg.repeats, "rounds; the modes alternate round by round");
  flags.Int("batch", &cfg.batch, "samples per step");
  flags.Double("bucket-mb", &cfg.bucket_mb, "DDP bucket cap (MB)");
  auto rest = flags.Parse(argc, argv);
  if (!rest.ok()) return lockstep::FlagSet::ReportParseError(rest.status());
  const std::string reason = lockstep::ddp::NcclUnavailableReason();
  if (!reason.empty()) {
    std::fprintf(stderr, "ddp_cuda_bench: cannot run: %s\n", reason.c_str());
    return 1;
  }
  for (const auto& [name, value, least] :
       {std::make_tuple("steps", cfg.steps, 1), std::make_tuple("repeats", cfg.repeats, 1),
        std::make_tuple("batch", cfg.batch, 1), std::make_tuple("warmup", cfg.warmup, 0)}) {
    if (value < least) {
      std::fprintf(stderr, "ddp_cuda_bench: --%s must be at least %d, got %lld\n", name, least,
                   static_cast<long long>(value));
      return 2;
    }
  }
  if (lockstep::Status s = lockstep::Run(cfg); !s.ok()) {
    std::fprintf(stderr, "ddp_cuda_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
