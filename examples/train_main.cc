// Synthetic-data trainer for the benchmark workloads (mlp, convnet,
// transformer; models.h), with DDP over the worker environment or --local
// (no communication). Prints one JSON line per step and a final checksum
// line. Start by hand, one process per rank:
//
//   export LOCKSTEP_STORE=file:/tmp/ls LOCKSTEP_WORLD_SIZE=2
//   LOCKSTEP_RANK=0 bazel-bin/examples/train --model mlp --steps 20 &
//   LOCKSTEP_RANK=1 bazel-bin/examples/train --model mlp --steps 20
//
// Data: a global batch of world*batch samples from --seed; rank r trains on
// its slice, so `--local --batch world*batch` is the single-process
// reference on the concatenated batch. The batch is the same at every step:
// what step s trains on is a pure function of (seed, world, rank), never of
// how the run got to step s, so a run resumed from a checkpoint sees the
// same data as an uninterrupted one.
//
// Checkpoints (--checkpoint-dir, --checkpoint-every; ddp/checkpoint.h): every
// rank restores the newest checkpoint before DDP is created, logs "resumed
// from step S (round R)" and continues at step S+1; rank 0 saves every N
// steps. A job that lockstepd restarts thus loses at most N steps.
#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/status.h"
#include "ddp/checkpoint.h"
#include "ddp/ddp.h"
#include "ddp/init.h"
#include "examples/models.h"

namespace lockstep {
namespace {

struct Config {
  std::string model = "mlp";
  int64_t steps = 20;
  int64_t batch = 32;
  double lr = 0.01;
  double momentum = 0;
  double bucket_mb = 25;
  bool local = false;
  int64_t seed = 0;
  int64_t micro_batches = 1;
  bool find_unused = false;
  bool grad_as_bucket_view = true;
  bool set_to_none = true;
  bool overlap_optimizer = false;
  bool gradient_priority = false;
  bool overlap_forward = false;
  std::string comm_hook = "allreduce";
  bool weight_by_samples = false;
  std::string batch_sizes;
  bool broadcast_buffers = true;
  double timeout_s = 300;
  std::string dump_params;
  int64_t stall_rank = -1;
  int64_t threads = 1;
  int64_t step_delay_ms = 0;
  int64_t slow_rank = -1;
  int64_t slow_ms = 0;
  int64_t leak_rank = -1;
  int64_t leak_mb = 0;
  std::string device = "cpu";
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
};

// CPU time of the whole process (every thread), in ms.
double ProcessCpuMs() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

// Parameters once each (tied weights once), registration order.
std::vector<torch::Tensor> UniqueParameters(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  std::unordered_set<const void*> seen;
  for (auto& p : m.parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  }
  return out;
}

// torch::chunk splits B into ceil(B/K)-sized parts: fewer than K when K
// does not fit (32 into 9 is 8 parts), and the step loop takes K.
Status CheckMicroBatches(int64_t micro, int64_t batch, const std::string& what) {
  const int64_t part = micro < 1 ? 0 : (batch + micro - 1) / micro;  // torch's chunk size
  if (micro < 1 || micro > batch || (batch + part - 1) / part != micro) {
    return absl::InvalidArgumentError(absl::StrCat("--micro-batches ", micro, " does not split ",
                                                   what, " ", batch, " into that many parts (1 to ",
                                                   batch, ", e.g. a divisor)"));
  }
  return absl::OkStatus();
}

Status Run(const Config& cfg) {
  if (cfg.device != "cpu" && cfg.device != "cuda") {
    return absl::InvalidArgumentError("--device must be cpu or cuda, got '" + cfg.device + "'");
  }
  // Checked before any rank connects.
  RETURN_IF_ERROR(examples::CheckModelName(cfg.model));
  ASSIGN_OR_RETURN(ddp::CommHook comm_hook, ddp::CommHookFromName(cfg.comm_hook));
  for (const auto& [flag, value] : {std::pair<const char*, double>{"--lr", cfg.lr},
                                    {"--momentum", cfg.momentum}}) {
    if (!std::isfinite(value) || value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": expected a finite number >= 0, got ", value));
    }
  }
  if (!std::isfinite(cfg.timeout_s) || cfg.timeout_s <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout-s: expected a finite number of seconds > 0, got ", cfg.timeout_s));
  }
  if (cfg.weight_by_samples && cfg.micro_batches != 1) {
    return absl::InvalidArgumentError("--weight-by-samples takes --micro-batches 1");
  }
  if (cfg.batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--batch: expected 1 or more, got ", cfg.batch));
  }
  if (cfg.steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--steps: expected 0 or more, got ", cfg.steps));
  }
  for (const auto& [flag, value, max] :
       {std::tuple<const char*, int64_t, int64_t>{"--step-delay-ms", cfg.step_delay_ms, 3600000},
        {"--slow-ms", cfg.slow_ms, 3600000},
        {"--leak-mb", cfg.leak_mb, int64_t{1} << 30}}) {
    if (value < 0 || value > max) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": expected 0 to ", max, ", got ", value));
    }
  }
  if (cfg.local && cfg.stall_rank >= 0) {
    return absl::InvalidArgumentError("--stall-rank needs DDP: it stalls a rank after DDP setup, "
                                      "and --local sets none up");
  }
  RETURN_IF_ERROR(CheckMicroBatches(cfg.micro_batches, cfg.batch, "--batch"));
  if (cfg.device == "cuda" && !torch::cuda::is_available()) {
    return absl::FailedPreconditionError(
        "--device cuda: this LibTorch sees no CUDA device (CPU-only build, or no GPU)");
  }
  // LibTorch's threads and OpenBLAS's: torch::set_num_threads alone left
  // OpenBLAS a thread per core.
  RETURN_IF_ERROR(ddp::SetIntraOpThreads(static_cast<int>(cfg.threads)).status());
  if (cfg.checkpoint_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint-every must be >= 0, got ", cfg.checkpoint_every));
  }
  if (cfg.checkpoint_every > 0 && cfg.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("--checkpoint-every needs --checkpoint-dir");
  }
  std::unique_ptr<ddp::ProcessGroup> group;
  int rank = 0, world = 1, round = 0;
  std::string job_id;  // the checkpoint fence's (ddp/checkpoint.h); none under --local
  // The same allocator settings InitFromEnv applies, so the --local baseline
  // differs from DDP only by communication.
  if (cfg.local) ddp::KeepFreedMemory();
  if (!cfg.local) {
    ddp::InitOptions init;
    init.timeout = FromSeconds(cfg.timeout_s);
    // The bootstrap (store, peers, mesh) is bounded by the same timeout.
    init.connect_timeout = FromSeconds(cfg.timeout_s);
    if (cfg.device == "cuda") init.backend = "nccl";
    ASSIGN_OR_RETURN(group, ddp::InitFromEnv(init));
    rank = group->env().rank;
    world = group->env().world_size;
    round = group->env().round;
    job_id = group->env().job_id;
  }
  // Rank r's batch: --batch samples, or the r-th of --batch-sizes; the
  // ranks' batches are consecutive slices of one synthetic global batch.
  std::vector<int64_t> sizes(world, cfg.batch);
  if (!cfg.batch_sizes.empty()) {
    sizes.clear();
    for (absl::string_view part : absl::StrSplit(cfg.batch_sizes, ',')) {
      int64_t n = 0;
      if (!absl::SimpleAtoi(part, &n) || n <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--batch-sizes: '", part, "' is not a positive integer"));
      }
      sizes.push_back(n);
    }
    if (static_cast<int>(sizes.size()) != world) {
      return absl::InvalidArgumentError(absl::StrCat("--batch-sizes has ", sizes.size(),
                                                     " entries for a world of ", world));
    }
    // Every rank checks every entry, so all refuse together.
    for (int r = 0; r < world; ++r) {
      RETURN_IF_ERROR(CheckMicroBatches(cfg.micro_batches, sizes[r],
                                        absl::StrCat("rank ", r, "'s --batch-sizes entry")));
    }
  }
  int64_t global_batch = 0, offset = 0;
  for (int r = 0; r < world; ++r) {
    if (r < rank) offset += sizes[r];
    global_batch += sizes[r];
  }
  ASSIGN_OR_RETURN(examples::Workload w, examples::MakeWorkload(cfg.model, cfg.seed));
  auto [x_all, y_all] = examples::MakeBatch(w, global_batch, cfg.seed);
  torch::Tensor x = x_all.narrow(0, offset, sizes[rank]);
  torch::Tensor y = y_all.narrow(0, offset, sizes[rank]);
  if (cfg.device == "cuda") {
    // One GPU per rank: the communicator's device (local rank under DDP).
    const torch::Device gpu =
        group ? group->communicator()->device() : torch::Device(torch::kCUDA, 0);
    w.root->to(gpu);
    x = x.to(gpu);
    y = y.to(gpu);
  }

  auto params = UniqueParameters(*w.root);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(cfg.lr).momentum(cfg.momentum));
  // Every rank restores before DDP Create (ddp/checkpoint.h): rank 0 cannot
  // train, and so write a newer checkpoint, until every rank has joined
  // Create's broadcast, so all ranks read the same file.
  int64_t first_step = 1;
  // The engine's job id and rank (its lines say job=local when the
  // environment names no job), so both components' lines agree.
  const Logger log("train", group ? group->env().job_id : "local", rank);
  if (!cfg.checkpoint_dir.empty()) {
    ASSIGN_OR_RETURN(auto restored,
                     ddp::RestoreCheckpoint(cfg.checkpoint_dir, *w.root, &opt, round, job_id));
    if (restored) {
      first_step = restored->info.step + 1;
      log.Info("resumed from step {} (round {}) in round {}: {} (world size {})",
               restored->info.step, restored->info.round, round, restored->path,
               restored->info.world_size);
      if (restored->info.world_size != world) {
        log.Warn("checkpoint was written with world size {}, now {}: each step's "
                 "global batch differs from the original run's",
                 restored->info.world_size, world);
      }
    } else {
      log.Info("no checkpoint in {}: starting at step 1", cfg.checkpoint_dir);
    }
    if (first_step > cfg.steps + 1) {
      log.Warn("the checkpoint is at step {}, past --steps {}: nothing left to train",
               first_step - 1, cfg.steps);
    }
  }
  if (group && !cfg.checkpoint_dir.empty()) {
    RETURN_IF_ERROR(ddp::CheckSameCheckpointStep(group->communicator().get(), first_step - 1,
                                                 cfg.checkpoint_dir, FromSeconds(cfg.timeout_s)));
  }

  std::unique_ptr<ddp::DistributedDataParallel> model;
  if (!cfg.local) {
    ddp::DdpOptions options;
    options.bucket_cap_mb = cfg.bucket_mb;
    options.find_unused_parameters = cfg.find_unused;
    options.gradient_as_bucket_view = cfg.grad_as_bucket_view;
    options.comm_hook = comm_hook;
    options.weight_by_samples = cfg.weight_by_samples;
    options.overlap_optimizer = cfg.overlap_optimizer;
    options.gradient_priority = cfg.gradient_priority;
    options.overlap_forward = cfg.overlap_forward;
    options.broadcast_buffers = cfg.broadcast_buffers;
    options.timeout = FromSeconds(cfg.timeout_s);
    ASSIGN_OR_RETURN(model, ddp::DistributedDataParallel::Create(w.module, group->communicator(),
                                                                 options));
    // The engine reports each step to this node's agent (`lockstep status`,
    // `watch`); after a restore it counts on from the checkpoint's step.
    model->ResumeAt(first_step - 1);
  }
  if (rank == cfg.stall_rank) {
    // Test hook: this rank never joins another collective.
    return group->store().Get("test/release", FromSeconds(cfg.timeout_s * 4)).status();
  }
  w.root->train();
  const int64_t k = cfg.micro_batches;
  auto xs = x.chunk(k), ys = y.chunk(k);

  for (int64_t step = first_step; step <= cfg.steps; ++step) {
    // Stand-in for data loading between steps, outside the timed step.
    if (cfg.step_delay_ms > 0 && step > first_step) {
      std::this_thread::sleep_for(std::chrono::milliseconds(cfg.step_delay_ms));
    }
    if (rank == cfg.slow_rank && cfg.slow_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(cfg.slow_ms));
    }
    if (rank == cfg.leak_rank && cfg.leak_mb > 0) {
      // Test hook: memory this rank never gives back, touched so that it
      // is charged (an OOM kill's cause, tests/e2e:oom_kill_test).
      static std::vector<std::unique_ptr<char[]>> leaked;
      const size_t bytes = static_cast<size_t>(cfg.leak_mb) << 20;
      leaked.push_back(std::make_unique<char[]>(bytes));
      std::memset(leaked.back().get(), 1, bytes);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const double cpu0 = ProcessCpuMs();
    if (cfg.set_to_none) {
      // What LibTorch 2.x's zero_grad() does by default (and PyTorch's
      // zero_grad(set_to_none=True)): backward then stores each gradient
      // instead of adding it to zeros. LibTorch 1.13's zero_grad() has no
      // such option. Under DDP a gradient that was a bucket view is copied
      // into its slot and becomes a view again.
      for (auto& group : opt.param_groups()) {
        for (auto& p : group.params()) p.mutable_grad().reset();
      }
    } else {
      opt.zero_grad();
    }
    double loss_sum = 0;
    for (int64_t m = 0; m < k; ++m) {
      const bool sync = m == k - 1;
      torch::Tensor out;
      if (model) {
        std::unique_ptr<ddp::DistributedDataParallel::NoSyncScope> no_sync;
        if (!sync) no_sync = std::make_unique<ddp::DistributedDataParallel::NoSyncScope>(model.get());
        ASSIGN_OR_RETURN(out, model->Forward(xs[m]));
      } else {
        out = w.module.forward(xs[m]);
      }
      torch::Tensor loss = torch::nn::functional::cross_entropy(out, ys[m]) / double(k);
      loss_sum += loss.item<double>();
      if (model) {
        RETURN_IF_ERROR(model->Backward(loss));
      } else {
        loss.backward();
      }
    }
    if (model) {
      model->OptimizerStep(opt);  // Times the optimizer and ends the step for progress.
    } else {
      opt.step();
    }
    const double step_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double cpu_ms = ProcessCpuMs() - cpu0;
    std::string line = absl::StrFormat(
        R"({"rank":%d,"step":%d,"loss":%.6f,"step_ms":%.3f,"cpu_ms":%.3f,"samples_per_s":%.1f)",
        rank, step, loss_sum, step_ms, cpu_ms, global_batch * 1000.0 / step_ms);
    if (model) {
      const ddp::StepStats s = model->last_stats();
      double overlap_ms = 0, launch_ms = 0, first_layer_ms = 0;
      if (!s.reducer.launch_order.empty()) {
        const size_t first = s.reducer.launch_order.front();
        overlap_ms = MillisBetween(s.reducer.bucket_comm_start[first], s.reducer.backward_end);
        launch_ms = MillisBetween(s.reducer.bucket_launched[first], s.reducer.backward_end);
        // The bucket holding the first parameter (the first layer's): when
        // the next forward could start, measured from backward's end.
        first_layer_ms = MillisBetween(s.reducer.backward_end,
                                       s.reducer.bucket_comm_end[model->reducer().bucket_of(0)]);
      }
      absl::StrAppendFormat(
          &line,
          R"(,"forward_ms":%.3f,"backward_ms":%.3f,"comm_exposed_ms":%.3f,"bytes_reduced":%d,)"
          R"("buckets":%d,"first_bucket_launch_before_backward_end_ms":%.3f,)"
          R"("first_bucket_start_before_backward_end_ms":%.3f,"buckets_in_comm_memory":%d,)"
          R"("first_layer_reduced_after_backward_end_ms":%.3f,"priority_agreements":%d,)"
          R"("bytes_read_in_place":%d)",
          s.forward_ms, s.backward_ms, s.comm_exposed_ms, s.bytes_reduced, s.buckets, launch_ms,
          overlap_ms, model->reducer().buckets_in_comm_memory() ? 1 : 0, first_layer_ms,
          s.reducer.priority_agreements, s.reducer.bytes_read_in_place);
    }
    line += "}";
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    if (cfg.checkpoint_every > 0 && step % cfg.checkpoint_every == 0) {
      // --overlap-forward: this step's buckets are stepped before saving.
      if (model) RETURN_IF_ERROR(model->CompletePendingStep());
      RETURN_IF_ERROR(ddp::SaveCheckpoint(cfg.checkpoint_dir, rank, {step, round, world, job_id},
                                          *w.root, &opt));
    }
  }
  // --overlap-forward: the last step's buckets, before the checksum.
  if (model) RETURN_IF_ERROR(model->CompletePendingStep());
  double sum = 0, abs_sum = 0;
  int64_t count = 0;
  for (const auto& p : params) {
    sum += p.sum().item<double>();
    abs_sum += p.abs().sum().item<double>();
    count += p.numel();
  }
  std::printf(R"({"rank":%d,"checksum":%.9g,"abs_checksum":%.9g,"params":%lld})" "\n", rank, sum,
              abs_sum, static_cast<long long>(count));
  if (!cfg.dump_params.empty()) {
    const std::string path = cfg.local ? cfg.dump_params : absl::StrCat(cfg.dump_params, ".", rank);
    std::ofstream out(path, std::ios::binary);
    for (const auto& p : params) {
      torch::Tensor c = p.detach().to(torch::kCPU, torch::kFloat).contiguous();
      out.write(static_cast<const char*>(c.data_ptr()), c.nbytes());
    }
    if (!out) return absl::InternalError("cannot write " + path);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  lockstep::Config cfg;
  lockstep::FlagSet flags("train", "DDP trainer on synthetic data");
  flags.String("model", &cfg.model, "mlp | convnet | transformer | deep_mlp (| mlp_small, "
                                    "transformer_small, tied, unused for tests)");
  flags.Int("steps", &cfg.steps, "training steps");
  flags.Int("batch", &cfg.batch, "samples per rank per step");
  flags.Double("lr", &cfg.lr, "SGD learning rate");
  flags.Double("momentum", &cfg.momentum, "SGD momentum (its buffers are checkpointed)");
  flags.Double("bucket-mb", &cfg.bucket_mb, "DDP bucket cap (MB)");
  flags.Bool("local", &cfg.local, "train without DDP or any communication");
  flags.Bool("set-to-none", &cfg.set_to_none,
             "zero_grad resets gradients to undefined (as LibTorch 2.x's zero_grad does) "
             "instead of filling them with zeros");
  flags.Bool("overlap-optimizer", &cfg.overlap_optimizer,
             "DDP overlap_optimizer: step each bucket's parameters as soon as that bucket is "
             "reduced, while later buckets are still being reduced");
  flags.Bool("gradient-priority", &cfg.gradient_priority,
             "DDP gradient_priority: the first layers' buckets go on the wire before later "
             "layers' buckets that are still queued");
  flags.Bool("overlap-forward", &cfg.overlap_forward,
             "DDP overlap_forward (needs --overlap-optimizer): the next forward starts before "
             "the last buckets are reduced; each bucket is stepped when forward reaches it");
  flags.Int("seed", &cfg.seed, "model and data seed");
  flags.Int("micro-batches", &cfg.micro_batches,
            "split each step into this many micro-batches; all but the last under no_sync");
  flags.Bool("find-unused-parameters", &cfg.find_unused, "DDP find_unused_parameters");
  flags.Bool("gradient-as-bucket-view", &cfg.grad_as_bucket_view, "DDP gradient_as_bucket_view");
  flags.String("comm-hook", &cfg.comm_hook,
               "how DDP reduces buckets: allreduce (average) | fp16 | bf16 | adasum");
  flags.Bool("weight-by-samples", &cfg.weight_by_samples,
             "DDP weight_by_samples: the gradient of the global batch, ranks weighted by their "
             "batch sizes (see --batch-sizes)");
  flags.String("batch-sizes", &cfg.batch_sizes,
               "per-rank batch sizes, comma-separated, one per rank (instead of --batch)");
  flags.Bool("broadcast-buffers", &cfg.broadcast_buffers, "DDP broadcast_buffers");
  flags.Double("timeout-s", &cfg.timeout_s,
               "collective and bootstrap timeout (seconds): a peer that never arrives is named "
               "after it");
  flags.String("dump-params", &cfg.dump_params, "write final parameters (float32) here; DDP ranks append .<rank>");
  flags.Int("stall-rank", &cfg.stall_rank, "test hook: this rank stops after DDP setup");
  flags.Int("threads", &cfg.threads, "intra-op threads");
  flags.String("device", &cfg.device, "cpu | cuda (DDP over NCCL, one GPU per local rank)");
  flags.Int("step-delay-ms", &cfg.step_delay_ms,
            "sleep this long before each step after the first (stands in for data loading)");
  flags.Int("slow-rank", &cfg.slow_rank,
            "test hook: this rank also sleeps --slow-ms in each step's data loading (a straggler)");
  flags.Int("slow-ms", &cfg.slow_ms, "see --slow-rank");
  flags.Int("leak-rank", &cfg.leak_rank,
            "test hook: this rank keeps --leak-mb MiB more memory each step (a leak)");
  flags.Int("leak-mb", &cfg.leak_mb, "see --leak-rank");
  flags.String("checkpoint-dir", &cfg.checkpoint_dir,
               "restore the newest checkpoint here at start (every rank), if any; save into it "
               "with --checkpoint-every");
  flags.Int("checkpoint-every", &cfg.checkpoint_every,
            "rank 0 saves a checkpoint after every N-th step (0: never)");
  auto rest = flags.Parse(argc, argv);
  if (!rest.ok()) return lockstep::FlagSet::ReportParseError(rest.status());
  if (!rest->empty()) {  // "--set-to-none false" would leave it true, silently
    return lockstep::FlagSet::ReportParseError(absl::InvalidArgumentError(absl::StrCat(
        "unexpected argument '", (*rest)[0], "' (boolean flags take --flag=false; see train --help)")));
  }
  lockstep::Status s = lockstep::InitLogging();  // Logs to stderr; stdout is JSON.
  if (s.ok()) s = lockstep::Run(cfg);
  if (!s.ok()) {
    std::fprintf(stderr, "train: error: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
