// A data-parallel training program that uses Lockstep as a user would: the
// installed package, InitFromEnv, DDP around an nn::Sequential, SGD,
// checkpoints. Every rank trains on its own synthetic shard; DDP averages
// the gradients, so every rank ends with the same parameters, which it
// writes to --params-out (raw float32 bytes) for comparison.
//
//   RANK=0 WORLD_SIZE=2 LOCKSTEP_STORE=file:/tmp/store ./cmake_train --steps 20 &
//   RANK=1 WORLD_SIZE=2 LOCKSTEP_STORE=file:/tmp/store ./cmake_train --steps 20
//
// Under lockstepd the agent sets the environment, and the engine reports
// each step to it (`lockstep status` shows the step) with no code here.
// Flags: --steps N (20), --batch N (32), --device cpu|cuda (cpu; cuda uses
// GPU local_rank and the nccl backend unless LOCKSTEP_BACKEND says
// otherwise), --checkpoint-dir DIR, --checkpoint-every N, --params-out FILE.
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "ddp/checkpoint.h"
#include "ddp/ddp.h"
#include "ddp/init.h"

namespace {

struct Flags {
  int64_t steps = 20;
  int64_t batch = 32;
  std::string device = "cpu";
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  std::string params_out;
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "cmake_train: %s needs a value\n", name.c_str());
      return false;
    }
    const std::string value = argv[++i];
    if (name == "--steps") {
      f->steps = std::stoll(value);
    } else if (name == "--batch") {
      f->batch = std::stoll(value);
    } else if (name == "--device") {
      f->device = value;
    } else if (name == "--checkpoint-dir") {
      f->checkpoint_dir = value;
    } else if (name == "--checkpoint-every") {
      f->checkpoint_every = std::stoll(value);
    } else if (name == "--params-out") {
      f->params_out = value;
    } else {
      std::fprintf(stderr, "cmake_train: unknown flag %s\n", name.c_str());
      return false;
    }
  }
  return true;
}

lockstep::Status Train(const Flags& flags) {
  lockstep::ddp::InitOptions init;
  if (flags.device == "cuda" && std::getenv("LOCKSTEP_BACKEND") == nullptr) init.backend = "nccl";
  ASSIGN_OR_RETURN(auto group, lockstep::ddp::InitFromEnv(init));
  const lockstep::ddp::WorkerEnv& env = group->env();
  const torch::Device device = flags.device == "cuda"
                                   ? torch::Device(torch::kCUDA, env.local_rank)
                                   : torch::Device(torch::kCPU);

  torch::manual_seed(0);  // Rank 0's initial parameters win anyway (broadcast).
  torch::nn::Sequential model(torch::nn::Linear(16, 64), torch::nn::ReLU(),
                              torch::nn::Linear(64, 4));
  model->to(device);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  int64_t first_step = 1;
  if (!flags.checkpoint_dir.empty()) {
    ASSIGN_OR_RETURN(auto restored,
                     lockstep::ddp::RestoreCheckpoint(flags.checkpoint_dir, *model, &opt,
                                                     env.round, env.job_id));
    if (restored) first_step = restored->info.step + 1;
    RETURN_IF_ERROR(lockstep::ddp::CheckSameCheckpointStep(group->communicator().get(), first_step - 1,
                                                         flags.checkpoint_dir,
                                                         std::chrono::seconds(60)));
  }
  ASSIGN_OR_RETURN(auto ddp, lockstep::ddp::DistributedDataParallel::Create(
                                 model, group->communicator()));
  ddp->ResumeAt(first_step - 1);

  for (int64_t step = first_step; step <= flags.steps; ++step) {
    // This rank's shard of step `step`: the same data whatever the restarts.
    torch::manual_seed(1000 * step + env.rank);
    torch::Tensor x = torch::randn({flags.batch, 16}).to(device);
    torch::Tensor y = torch::randint(0, 4, {flags.batch}).to(device);
    opt.zero_grad();
    ASSIGN_OR_RETURN(torch::Tensor out, ddp->Forward(x));
    torch::Tensor loss = torch::nn::functional::cross_entropy(out, y);
    RETURN_IF_ERROR(ddp->Backward(loss));
    opt.step();
    std::printf("rank %d step %lld loss %.6f\n", env.rank, static_cast<long long>(step),
                loss.item<double>());
    std::fflush(stdout);
    if (flags.checkpoint_every > 0 && step % flags.checkpoint_every == 0) {
      RETURN_IF_ERROR(lockstep::ddp::SaveCheckpoint(
          flags.checkpoint_dir, env.rank, {step, env.round, env.world_size, env.job_id}, *model, &opt));
    }
  }

  if (!flags.params_out.empty()) {
    std::vector<torch::Tensor> flat;
    for (const auto& p : model->parameters()) flat.push_back(p.detach().reshape({-1}).cpu());
    torch::Tensor all = torch::cat(flat).contiguous();
    std::ofstream out(flags.params_out, std::ios::binary | std::ios::trunc);
    out.write(static_cast<const char*>(all.data_ptr()), all.nbytes());
    if (!out.good()) {
      return absl::InternalError("cannot write parameters to " + flags.params_out);
    }
  }
  std::printf("rank %d done: %lld steps, world size %d, backend %s\n", env.rank,
              static_cast<long long>(flags.steps), env.world_size,
              group->communicator()->backend().c_str());
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) return 2;
  lockstep::Status status = Train(flags);
  if (!status.ok()) {
    std::fprintf(stderr, "cmake_train: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
