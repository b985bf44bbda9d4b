// ddp_bench: runs //examples:train as N processes (DDP over Gloo, or --local
// for the compute-only baseline: the same N processes without any
// communication) and prints one JSON line with rank 0's median step time.
//
//   bazel run --config=opt //bench:ddp_bench -- --model mlp --world 2 --steps 20
//
// Ranks bootstrap through a FileStore in a fresh temp directory.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/median.h"
#include "common/flags.h"
#include "common/status.h"

namespace lockstep {
namespace {

struct Config {
  std::string model = "mlp";
  int64_t world = 2;
  int64_t steps = 20;
  int64_t warmup = 3;
  int64_t batch = 32;
  double bucket_mb = 25;
  bool local = false;
  bool grad_as_bucket_view = true;
  bool set_to_none = true;
  bool overlap_optimizer = false;
  bool gradient_priority = false;
  bool overlap_forward = false;
  std::string comm_hook = "allreduce";
  std::string train = "";
  std::string backend = "gloo";
};

std::string FindTrainBinary(const char* argv0) {
  for (const std::string& candidate :
       {std::string("examples/train"), std::string(argv0) + ".runfiles/lockstep/examples/train"}) {
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

double Field(const std::string& line, const std::string& name) {
  auto at = line.find("\"" + name + "\":");
  if (at == std::string::npos) return -1;
  return std::atof(line.c_str() + at + name.size() + 3);
}

Status Run(const Config& cfg, const char* argv0) {
  if (cfg.backend != "gloo" && cfg.backend != "shm") {
    return absl::InvalidArgumentError("--backend must be gloo or shm, got '" + cfg.backend + "'");
  }
  for (const auto& [flag, value, least] :
       {std::tuple<const char*, int64_t, int64_t>{"--world", cfg.world, 1},
        {"--steps", cfg.steps, 1},
        {"--warmup", cfg.warmup, 0},
        {"--batch", cfg.batch, 1}}) {
    if (value < least) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": expected ", least, " or more, got ", value));
    }
  }
  const std::string train = cfg.train.empty() ? FindTrainBinary(argv0) : cfg.train;
  if (train.empty()) return absl::NotFoundError("cannot find examples/train; pass --train");
  // The ranks' outputs and file store; removed after a run that measured,
  // kept (and named) after one that failed.
  const char* tmpdir = getenv("TMPDIR");
  std::string templ = absl::StrCat(tmpdir != nullptr && *tmpdir ? tmpdir : "/tmp", "/ddp_bench_XXXXXX");
  if (mkdtemp(templ.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", templ, ": ", std::strerror(errno)));
  }
  const std::string dir = templ;
  std::vector<pid_t> pids;
  for (int r = 0; r < cfg.world; ++r) {
    const std::string out = absl::StrCat(dir, "/rank", r, ".out");
    pid_t pid = fork();
    if (pid == 0) {
      if (freopen(out.c_str(), "w", stdout) == nullptr) _exit(126);
      setenv("LOCKSTEP_STORE", ("file:" + dir + "/store").c_str(), 1);
      setenv("LOCKSTEP_JOB_ID", "bench", 1);
      setenv("LOCKSTEP_RANK", std::to_string(r).c_str(), 1);
      setenv("LOCKSTEP_WORLD_SIZE", std::to_string(cfg.world).c_str(), 1);
      setenv("LOCKSTEP_BACKEND", cfg.backend.c_str(), 1);
      std::vector<std::string> args = {train,
                                       "--model", cfg.model,
                                       "--steps", std::to_string(cfg.steps + cfg.warmup),
                                       "--batch", std::to_string(cfg.batch),
                                       "--bucket-mb", absl::StrCat(cfg.bucket_mb)};
      if (cfg.local) args.push_back("--local");
      args.push_back(absl::StrCat("--gradient-as-bucket-view=",
                                  cfg.grad_as_bucket_view ? "true" : "false"));
      args.push_back(absl::StrCat("--set-to-none=", cfg.set_to_none ? "true" : "false"));
      args.push_back("--comm-hook=" + cfg.comm_hook);
      // Options that are off by default go only when set, so an older train
      // without them still runs the default configuration (A/B runs).
      if (cfg.overlap_optimizer) args.push_back("--overlap-optimizer");
      if (cfg.gradient_priority) args.push_back("--gradient-priority");
      if (cfg.overlap_forward) args.push_back("--overlap-forward");
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(train.c_str(), argv.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  int failures = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
  }
  if (failures > 0) {
    return absl::InternalError(absl::StrCat(failures, " of ", cfg.world, " ranks failed; see ",
                                            dir));
  }
  std::ifstream in(dir + "/rank0.out");
  std::vector<double> step_ms, exposed_ms, backward_ms, cpu_ms, first_layer_ms;
  int buckets = 0;
  double bytes_reduced = 0, comm_memory = 0;
  for (std::string line; std::getline(in, line);) {
    const double step = Field(line, "step");
    if (step < 1 || line.find("\"step_ms\"") == std::string::npos) continue;
    if (step <= cfg.warmup) continue;
    step_ms.push_back(Field(line, "step_ms"));
    cpu_ms.push_back(Field(line, "cpu_ms"));
    exposed_ms.push_back(Field(line, "comm_exposed_ms"));
    backward_ms.push_back(Field(line, "backward_ms"));
    first_layer_ms.push_back(Field(line, "first_layer_reduced_after_backward_end_ms"));
    buckets = static_cast<int>(Field(line, "buckets"));
    bytes_reduced = Field(line, "bytes_reduced");
    comm_memory = Field(line, "buckets_in_comm_memory");
  }
  if (step_ms.empty()) {
    return absl::InternalError(absl::StrCat("no step lines after the ", cfg.warmup,
                                            " warm-up steps in ", dir, "/rank0.out"));
  }
  const double median = Median(step_ms);
  std::printf(
      R"({"system":"lockstep","model":"%s","world":%d,"backend":"%s","bucket_mb":%g,)"
      R"("batch_per_rank":%d,"steps":%d,"step_ms_median":%.2f,"step_ms_min":%.2f,)"
      R"("samples_per_s":%.1f,"comm_exposed_ms_median":%.2f,"backward_ms_median":%.2f,)"
      R"("buckets":%d,"gradient_as_bucket_view":%s,"set_to_none":%s,"cpu_ms_median":%.2f,)"
      R"("comm_hook":"%s","bytes_reduced":%.0f,"buckets_in_comm_memory":%s,)"
      R"("overlap_optimizer":%s,"gradient_priority":%s,"overlap_forward":%s,)"
      R"("first_layer_reduced_after_backward_end_ms_median":%.2f})" "\n",
      cfg.model.c_str(), static_cast<int>(cfg.world), cfg.local ? "local" : cfg.backend.c_str(),
      cfg.bucket_mb,
      static_cast<int>(cfg.batch), static_cast<int>(step_ms.size()), median,
      *std::min_element(step_ms.begin(), step_ms.end()), cfg.world * cfg.batch * 1000.0 / median,
      cfg.local ? 0.0 : Median(exposed_ms), cfg.local ? 0.0 : Median(backward_ms),
      cfg.local ? 0 : buckets, cfg.grad_as_bucket_view ? "true" : "false",
      cfg.set_to_none ? "true" : "false", Median(cpu_ms),
      cfg.comm_hook.c_str(), cfg.local ? 0.0 : bytes_reduced, comm_memory > 0 ? "true" : "false",
      cfg.overlap_optimizer ? "true" : "false", cfg.gradient_priority ? "true" : "false",
      cfg.overlap_forward ? "true" : "false", cfg.local ? 0.0 : Median(first_layer_ms));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return absl::OkStatus();
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  lockstep::Config cfg;
  lockstep::FlagSet flags("ddp_bench", "DDP step-time benchmark (JSON line per run)");
  flags.String("model", &cfg.model, "mlp | convnet | transformer | deep_mlp");
  flags.Int("world", &cfg.world, "number of processes");
  flags.Int("steps", &cfg.steps, "measured steps (after warm-up)");
  flags.Int("warmup", &cfg.warmup, "warm-up steps, not measured");
  flags.Int("batch", &cfg.batch, "samples per rank per step");
  flags.Double("bucket-mb", &cfg.bucket_mb, "DDP bucket cap (MB)");
  flags.Bool("local", &cfg.local, "compute-only baseline: N processes, no communication");
  flags.String("backend", &cfg.backend, "gloo | shm (LOCKSTEP_BACKEND of the ranks)");
  flags.Bool("gradient-as-bucket-view", &cfg.grad_as_bucket_view, "DDP gradient_as_bucket_view");
  flags.Bool("set-to-none", &cfg.set_to_none,
             "the trainer resets gradients to undefined each step (as the peer script's "
             "zero_grad(set_to_none=True)) instead of zeroing them");
  flags.String("comm-hook", &cfg.comm_hook, "allreduce | fp16 | bf16 | adasum (DDP comm hook)");
  flags.Bool("overlap-optimizer", &cfg.overlap_optimizer,
             "DDP overlap_optimizer (each bucket's parameters stepped as it is reduced)");
  flags.Bool("gradient-priority", &cfg.gradient_priority,
             "DDP gradient_priority (first layers' buckets first on the wire)");
  flags.Bool("overlap-forward", &cfg.overlap_forward,
             "DDP overlap_forward (with --overlap-optimizer: the next forward overlaps the last "
             "buckets)");
  flags.String("train", &cfg.train, "path of examples/train (default: from runfiles)");
  auto rest = flags.Parse(argc, argv);
  if (!rest.ok()) return lockstep::FlagSet::ReportParseError(rest.status());
  if (!rest->empty()) {  // "--local false" would leave it true, silently
    return lockstep::FlagSet::ReportParseError(absl::InvalidArgumentError(absl::StrCat(
        "unexpected argument '", (*rest)[0], "' (boolean flags take --flag=false; see ddp_bench --help)")));
  }
  lockstep::Status s = lockstep::Run(cfg, argv[0]);
  if (!s.ok()) {
    std::fprintf(stderr, "ddp_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
