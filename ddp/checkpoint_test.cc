// SaveCheckpoint / RestoreCheckpoint on one process: round trips of model,
// buffers and optimizer state, atomicity and retention, and the errors.
#include "ddp/checkpoint.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace ddp {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Parameters in nested modules and BatchNorm buffers (running stats).
struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t hidden = 16) {
    fc1 = register_module("fc1", torch::nn::Linear(8, hidden));
    bn = register_module("bn", torch::nn::BatchNorm1d(hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(bn(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(Net);

std::string FreshDir(const std::string& name) {
  const char* tmp = getenv("TEST_TMPDIR");
  fs::path dir = fs::path(tmp ? tmp : "/tmp") / ("checkpoint_test_" + name);
  fs::remove_all(dir);
  return dir.string();
}

void TrainSteps(Net& net, torch::optim::Optimizer& opt, int steps, int64_t seed) {
  torch::manual_seed(seed);
  for (int i = 0; i < steps; ++i) {
    torch::Tensor x = torch::randn({32, 8});
    torch::Tensor y = torch::randint(0, 4, {32});
    opt.zero_grad();
    torch::nn::functional::cross_entropy(net->forward(x), y).backward();
    opt.step();
  }
}

// Every parameter and buffer of a and b, bit for bit.
void ExpectSameState(const Net& a, const Net& b) {
  auto pa = a->named_parameters(), pb = b->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& item : pa) {
    EXPECT_TRUE(torch::equal(item.value(), pb[item.key()])) << item.key();
  }
  auto ba = a->named_buffers(), bb = b->named_buffers();
  ASSERT_EQ(ba.size(), bb.size());
  for (const auto& item : ba) {
    EXPECT_TRUE(torch::equal(item.value(), bb[item.key()])) << item.key();
  }
}

std::vector<std::string> Names(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const auto& p : paths) out.push_back(fs::path(p).filename().string());
  return out;
}

// A dir several levels deep, named with a trailing slash, is made (and its
// new levels synced into their parents) by the first save.
TEST(CheckpointTest, SaveMakesANestedDir) {
  const std::string root = FreshDir("nested");
  const std::string dir = root + "/a/b/c/";
  Net net;
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {1, 1, 1}, *net, nullptr).ok());
  auto listed = ListCheckpoints(dir);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_THAT(Names(*listed), ElementsAre("ckpt-000000000001.pt"));
}

TEST(CheckpointTest, RestoreFromMissingDirMeansStartFresh) {
  const std::string dir = FreshDir("missing");
  Net net;
  auto restored = RestoreCheckpoint(dir, *net, nullptr);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_FALSE(restored->has_value());
}

TEST(CheckpointTest, RestoreFromDirWithoutCheckpointMeansStartFresh) {
  const std::string dir = FreshDir("empty");
  fs::create_directories(dir);
  std::ofstream(dir + "/notes.txt") << "not a checkpoint";
  Net net;
  auto restored = RestoreCheckpoint(dir, *net, nullptr);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_FALSE(restored->has_value());
}

// Training A for 5 steps, checkpointing, then 3 more steps must equal a fresh
// B restored from the checkpoint and trained the same 3 steps: parameters,
// buffers and the optimizer's state (momentum / Adam moments) came back.
template <typename MakeOptimizer>
void ExpectResumeEqualsUninterrupted(const std::string& dir, MakeOptimizer make_optimizer) {
  torch::manual_seed(1);
  Net a;
  auto opt_a = make_optimizer(a);
  TrainSteps(a, *opt_a, 5, /*seed=*/10);
  ASSERT_TRUE(SaveCheckpoint(dir, /*rank=*/0, {5, 3, 2}, *a, opt_a.get()).ok());

  torch::manual_seed(2);  // Other initial weights.
  Net b;
  auto opt_b = make_optimizer(b);
  auto restored = RestoreCheckpoint(dir, *b, opt_b.get());
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_TRUE(restored->has_value());
  EXPECT_EQ((*restored)->info.step, 5);
  EXPECT_EQ((*restored)->info.round, 3);
  EXPECT_EQ((*restored)->info.world_size, 2);
  EXPECT_EQ(fs::path((*restored)->path).filename(), "ckpt-000000000005.pt");
  ExpectSameState(a, b);

  TrainSteps(a, *opt_a, 3, /*seed=*/20);
  TrainSteps(b, *opt_b, 3, /*seed=*/20);
  ExpectSameState(a, b);
}

TEST(CheckpointTest, RoundTripRestoresModelBuffersAndSgdMomentum) {
  ExpectResumeEqualsUninterrupted(FreshDir("sgd"), [](Net& n) {
    return std::make_unique<torch::optim::SGD>(n->parameters(),
                                               torch::optim::SGDOptions(0.1).momentum(0.9));
  });
}

TEST(CheckpointTest, RoundTripRestoresAdamState) {
  ExpectResumeEqualsUninterrupted(FreshDir("adam"), [](Net& n) {
    return std::make_unique<torch::optim::Adam>(n->parameters(), torch::optim::AdamOptions(1e-2));
  });
}

// Without the momentum buffers the resumed run would differ: the round trip
// test above is not passing by accident.
// Each parameter group's options come back, as PyTorch's load_state_dict
// restores them: a learning rate a schedule lowered, Adam's betas. LibTorch's
// Optimizer::load read them and kept the constructor's.
TEST(CheckpointTest, RestoreBringsBackEachGroupsOptions) {
  const std::string dir = FreshDir("options");
  Net a;
  torch::optim::SGD sgd_a(
      std::vector<torch::optim::OptimizerParamGroup>{
          torch::optim::OptimizerParamGroup(a->fc1->parameters()),
          torch::optim::OptimizerParamGroup(a->fc2->parameters(),
                                            std::make_unique<torch::optim::SGDOptions>(0.3))},
      torch::optim::SGDOptions(0.1).momentum(0.9));
  TrainSteps(a, sgd_a, 2, /*seed=*/3);
  static_cast<torch::optim::SGDOptions&>(sgd_a.param_groups()[0].options()).lr(0.025).weight_decay(0.01);
  static_cast<torch::optim::SGDOptions&>(sgd_a.param_groups()[1].options()).lr(0.075);
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {2, 1, 1}, *a, &sgd_a).ok());

  Net b;
  torch::optim::SGD sgd_b(
      std::vector<torch::optim::OptimizerParamGroup>{
          torch::optim::OptimizerParamGroup(b->fc1->parameters()),
          torch::optim::OptimizerParamGroup(b->fc2->parameters(),
                                            std::make_unique<torch::optim::SGDOptions>(0.3))},
      torch::optim::SGDOptions(0.1).momentum(0.9));
  auto restored = RestoreCheckpoint(dir, *b, &sgd_b);
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_TRUE(restored->has_value());
  const auto& g0 = static_cast<const torch::optim::SGDOptions&>(sgd_b.param_groups()[0].options());
  const auto& g1 = static_cast<const torch::optim::SGDOptions&>(sgd_b.param_groups()[1].options());
  EXPECT_DOUBLE_EQ(g0.lr(), 0.025);
  EXPECT_DOUBLE_EQ(g0.weight_decay(), 0.01);
  EXPECT_DOUBLE_EQ(g0.momentum(), 0.9);
  EXPECT_DOUBLE_EQ(g1.lr(), 0.075);

  torch::manual_seed(1);
  Net c;
  torch::optim::Adam adam_c(c->parameters(), torch::optim::AdamOptions(1e-3).betas({0.8, 0.99}));
  TrainSteps(c, adam_c, 2, /*seed=*/4);
  static_cast<torch::optim::AdamOptions&>(adam_c.param_groups()[0].options()).lr(5e-4);
  const std::string adam_dir = FreshDir("options_adam");
  ASSERT_TRUE(SaveCheckpoint(adam_dir, 0, {2, 1, 1}, *c, &adam_c).ok());
  Net d;
  torch::optim::Adam adam_d(d->parameters(), torch::optim::AdamOptions(1e-3));
  ASSERT_TRUE(RestoreCheckpoint(adam_dir, *d, &adam_d).ok());
  const auto& o = static_cast<const torch::optim::AdamOptions&>(adam_d.param_groups()[0].options());
  EXPECT_DOUBLE_EQ(o.lr(), 5e-4);
  EXPECT_DOUBLE_EQ(std::get<0>(o.betas()), 0.8);
  EXPECT_DOUBLE_EQ(std::get<1>(o.betas()), 0.99);
}

TEST(CheckpointTest, ResumeWithoutOptimizerStateDiverges) {
  const std::string dir = FreshDir("no_opt_state");
  torch::manual_seed(1);
  Net a;
  torch::optim::SGD opt_a(a->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  TrainSteps(a, opt_a, 5, 10);
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {5, 0, 1}, *a, &opt_a).ok());
  Net b;
  torch::optim::SGD opt_b(b->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  ASSERT_TRUE(RestoreCheckpoint(dir, *b, /*optimizer=*/nullptr).ok());
  TrainSteps(a, opt_a, 1, 20);
  TrainSteps(b, opt_b, 1, 20);
  EXPECT_FALSE(torch::equal(a->fc1->weight, b->fc1->weight));
}

// Dropout draws its masks from the default CPU generator.
struct DropoutNetImpl : torch::nn::Module {
  DropoutNetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    drop = register_module("drop", torch::nn::Dropout(0.5));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(drop(torch::relu(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(DropoutNet);

// Steps first..last; each step's batch is a function of the step alone
// (its own generator), so only dropout uses the default generator.
void TrainDropoutNet(DropoutNet& net, torch::optim::Optimizer& opt, int64_t first, int64_t last) {
  net->train();
  for (int64_t step = first; step <= last; ++step) {
    at::Generator data = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
    torch::Tensor x = torch::randn({32, 8}, data);
    torch::Tensor y = torch::randint(0, 4, {32}, data);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(net->forward(x), y).backward();
    opt.step();
  }
}

// A resumed run of a model with dropout draws the masks an uninterrupted
// one would: the checkpoint carries the default CPU generator's state.
TEST(CheckpointTest, ResumeWithDropoutEqualsUninterrupted) {
  const std::string dir = FreshDir("dropout");
  torch::manual_seed(1);
  DropoutNet a;
  torch::optim::SGD opt_a(a->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  TrainDropoutNet(a, opt_a, 1, 4);

  torch::manual_seed(1);
  DropoutNet b;
  torch::optim::SGD opt_b(b->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  TrainDropoutNet(b, opt_b, 1, 2);
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {2, 1, 1, "job-a"}, *b, &opt_b).ok());

  // A fresh process: another seed, other initial weights.
  torch::manual_seed(2);
  DropoutNet c;
  torch::optim::SGD opt_c(c->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto restored = RestoreCheckpoint(dir, *c, &opt_c, /*round=*/2, "job-a");
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_TRUE(restored->has_value());
  TrainDropoutNet(c, opt_c, (*restored)->info.step + 1, 4);
  for (const auto& item : a->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), c->named_parameters()[item.key()])) << item.key();
  }
}

// A checkpoint written before the generator's state was saved restores as
// it did, leaving the generator alone.
TEST(CheckpointTest, ACheckpointWithoutGeneratorStateRestoresAndLeavesTheGeneratorAlone) {
  const std::string dir = FreshDir("no_rng");
  fs::create_directories(dir);
  torch::manual_seed(1);
  Net saved;
  {
    torch::serialize::OutputArchive archive, meta, model;
    meta.write("format", torch::tensor(int64_t{1}));
    meta.write("step", torch::tensor(int64_t{10}));
    meta.write("round", torch::tensor(int64_t{1}));
    meta.write("world_size", torch::tensor(int64_t{2}));
    archive.write("meta", meta);
    saved->save(model);
    archive.write("model", model);
    archive.save_to(dir + "/ckpt-000000000010.pt");
  }
  torch::manual_seed(2);
  Net net;
  const torch::Tensor before = torch::rand({4});
  torch::manual_seed(2);
  Net again;
  auto restored = RestoreCheckpoint(dir, *net, nullptr);
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_TRUE(restored->has_value());
  EXPECT_EQ((*restored)->info.step, 10);
  EXPECT_EQ((*restored)->info.job_id, "");
  ExpectSameState(saved, net);
  EXPECT_TRUE(torch::equal(torch::rand({4}), before));
}

TEST(CheckpointTest, RestoreCopiesIntoTheExistingTensors) {
  const std::string dir = FreshDir("in_place");
  Net a, b;
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {1, 0, 1}, *a, nullptr).ok());
  const void* before = b->fc1->weight.data_ptr();
  ASSERT_TRUE(RestoreCheckpoint(dir, *b, nullptr).ok());
  EXPECT_EQ(b->fc1->weight.data_ptr(), before);
  EXPECT_TRUE(b->fc1->weight.requires_grad());
  ExpectSameState(a, b);
}

TEST(CheckpointTest, OnlyRankZeroWrites) {
  const std::string dir = FreshDir("rank1");
  Net net;
  ASSERT_TRUE(SaveCheckpoint(dir, /*rank=*/1, {10, 0, 2}, *net, nullptr).ok());
  auto list = ListCheckpoints(dir);
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
}

TEST(CheckpointTest, KeepsTheNewestCheckpointsAndRestoresTheNewest) {
  const std::string dir = FreshDir("keep");
  Net net;
  for (int64_t step : {10, 20, 30}) {
    ASSERT_TRUE(SaveCheckpoint(dir, 0, {step, 0, 1}, *net, nullptr).ok());
  }
  auto list = ListCheckpoints(dir);
  ASSERT_TRUE(list.ok());
  EXPECT_THAT(Names(*list), ElementsAre("ckpt-000000000030.pt", "ckpt-000000000020.pt"));
  CheckpointOptions one;
  one.keep = 1;
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {40, 0, 1}, *net, nullptr, one).ok());
  list = ListCheckpoints(dir);
  EXPECT_THAT(Names(*list), ElementsAre("ckpt-000000000040.pt"));
  auto restored = RestoreCheckpoint(dir, *net, nullptr);
  ASSERT_TRUE(restored.ok() && restored->has_value());
  EXPECT_EQ((*restored)->info.step, 40);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// DESIGN.md: a side effect that must not happen twice carries the round,
// and a write from an older round is refused. Round 2 of job-a restoring
// claims the dir; a late save from round 1 (a worker the fencing missed) is
// refused and leaves the checkpoints as they were; round 2's own save goes
// through.
TEST(CheckpointTest, ASaveFromARoundOlderThanOneThatRestoredIsRefused) {
  const std::string dir = FreshDir("rounds");
  Net net;
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {10, 1, 2, "job-a"}, *net, nullptr).ok());
  EXPECT_EQ(ReadFile(dir + "/lockstep-round"), "job-a 1\n");
  auto restored = RestoreCheckpoint(dir, *net, nullptr, /*round=*/2, "job-a");
  ASSERT_TRUE(restored.ok() && restored->has_value()) << restored.status();
  EXPECT_EQ((*restored)->info.step, 10);
  EXPECT_EQ((*restored)->info.job_id, "job-a");
  EXPECT_EQ(ReadFile(dir + "/lockstep-round"), "job-a 2\n");
  Status late = SaveCheckpoint(dir, 0, {20, 1, 2, "job-a"}, *net, nullptr);
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_THAT(std::string(late.message()),
              HasSubstr("checkpoint of step 20 from round 1 of job job-a refused: round 2 of "
                        "job job-a has restored from"))
      << late;
  auto list = ListCheckpoints(dir);
  ASSERT_TRUE(list.ok());
  EXPECT_THAT(Names(*list), ElementsAre("ckpt-000000000010.pt"));
  for (const auto& entry : fs::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos)
        << "the refused save left " << entry.path();
  }
  EXPECT_TRUE(SaveCheckpoint(dir, 0, {20, 2, 2, "job-a"}, *net, nullptr).ok());
  // A save raises the fence too: round 3's save, then round 2's is refused.
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {30, 3, 2, "job-a"}, *net, nullptr).ok());
  EXPECT_EQ(SaveCheckpoint(dir, 0, {31, 2, 2, "job-a"}, *net, nullptr).code(),
            absl::StatusCode::kFailedPrecondition);
  // Restoring without a round (0) claims nothing and reads the newest.
  restored = RestoreCheckpoint(dir, *net, nullptr);
  ASSERT_TRUE(restored.ok() && restored->has_value());
  EXPECT_EQ((*restored)->info.step, 30);
  EXPECT_EQ(ReadFile(dir + "/lockstep-round"), "job-a 3\n");
}

// A worker of an ended round that restores (a restart the fencing raced)
// is refused at once, before it trains --checkpoint-every steps only to
// have its first save refused. The module is left as it was.
TEST(CheckpointTest, ARestoreFromAnOlderRoundOfTheSameJobIsRefusedAtRestore) {
  const std::string dir = FreshDir("stale_restore");
  torch::manual_seed(1);
  Net saved;
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {10, 3, 2, "job-a"}, *saved, nullptr).ok());
  torch::manual_seed(2);
  Net net;
  const torch::Tensor before = net->fc1->weight.clone();
  auto restored = RestoreCheckpoint(dir, *net, nullptr, /*round=*/2, "job-a");
  ASSERT_FALSE(restored.ok());
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kFailedPrecondition) << restored.status();
  EXPECT_THAT(std::string(restored.status().message()),
              HasSubstr("from round 2 of job job-a refused: round 3 of job job-a has restored "
                        "from or saved into " + dir))
      << restored.status();
  EXPECT_TRUE(torch::equal(net->fc1->weight, before));
  EXPECT_EQ(ReadFile(dir + "/lockstep-round"), "job-a 3\n");
}

// Round numbers count per job, the fence is per dir: job B's round 1 (a new
// job resuming job A's checkpoints) is not a stale worker of A's round 3.
// It takes the fence over; a hand-started run (round 0) has no fence at all.
TEST(CheckpointTest, ANewJobTakesTheFenceOverFromAnotherJob) {
  const std::string dir = FreshDir("other_job");
  Net net;
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {10, 3, 2, "job-a"}, *net, nullptr).ok());
  ASSERT_EQ(ReadFile(dir + "/lockstep-round"), "job-a 3\n");

  auto restored = RestoreCheckpoint(dir, *net, nullptr, /*round=*/1, "job-b");
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_TRUE(restored->has_value());
  EXPECT_EQ((*restored)->info.step, 10);
  EXPECT_EQ(ReadFile(dir + "/lockstep-round"), "job-b 1\n");
  Status saved = SaveCheckpoint(dir, 0, {20, 1, 2, "job-b"}, *net, nullptr);
  EXPECT_TRUE(saved.ok()) << saved;
  // Job A's round 3 is now the other job: it would take the fence back.
  EXPECT_EQ(ReadFile(dir + "/lockstep-round"), "job-b 1\n");

  // A --local or hand-started run: round 0, no lockstepd, no fence.
  restored = RestoreCheckpoint(dir, *net, nullptr, /*round=*/0, "local");
  ASSERT_TRUE(restored.ok() && restored->has_value()) << restored.status();
  EXPECT_EQ((*restored)->info.step, 20);
  saved = SaveCheckpoint(dir, 0, {30, 0, 1, "local"}, *net, nullptr);
  EXPECT_TRUE(saved.ok()) << saved;
  EXPECT_EQ(ReadFile(dir + "/lockstep-round"), "job-b 1\n");
}

// A fence written before fences named their job holds a round alone: it
// names no job, so any job takes it over.
TEST(CheckpointTest, AnOldFormatFenceIsTakenOverByAnyJob) {
  const std::string dir = FreshDir("old_fence");
  Net net;
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {10, 0, 1}, *net, nullptr).ok());
  std::ofstream(dir + "/lockstep-round") << "3\n";
  auto restored = RestoreCheckpoint(dir, *net, nullptr, /*round=*/1, "job-b");
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_TRUE(restored->has_value());
  EXPECT_EQ(ReadFile(dir + "/lockstep-round"), "job-b 1\n");
  Status saved = SaveCheckpoint(dir, 0, {20, 1, 1, "job-b"}, *net, nullptr);
  EXPECT_TRUE(saved.ok()) << saved;

  std::ofstream(dir + "/lockstep-round") << "3\n";
  saved = SaveCheckpoint(dir, 0, {30, 2, 1, "job-a"}, *net, nullptr);
  EXPECT_TRUE(saved.ok()) << saved;
  EXPECT_EQ(ReadFile(dir + "/lockstep-round"), "job-a 2\n");
}

// A caller that passes no job id (one written before the job id was a
// parameter) gets the fence as it was: rounds compared alone, whatever job
// the fence names, and a fence it raises names no job.
TEST(CheckpointTest, WithoutAJobIdTheFenceComparesRoundsAlone) {
  const std::string dir = FreshDir("no_job_id");
  Net net;
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {10, 3, 2, "job-a"}, *net, nullptr).ok());
  Status late = SaveCheckpoint(dir, 0, {20, 2, 2}, *net, nullptr);
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_THAT(std::string(late.message()),
              HasSubstr("checkpoint of step 20 from round 2 refused: round 3 of job job-a"))
      << late;
  auto restored = RestoreCheckpoint(dir, *net, nullptr, /*round=*/4);
  ASSERT_TRUE(restored.ok() && restored->has_value()) << restored.status();
  EXPECT_EQ(ReadFile(dir + "/lockstep-round"), "4\n");
  EXPECT_EQ(SaveCheckpoint(dir, 0, {20, 3, 2}, *net, nullptr).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(SaveCheckpoint(dir, 0, {20, 4, 2}, *net, nullptr).ok());
}

// A writer killed mid-save leaves only a temp file: readers ignore it (the
// previous checkpoint wins) and the next save removes it; a temp file whose
// writer still runs is left alone.
TEST(CheckpointTest, LeftoverTempFileIsIgnoredAndRemovedByTheNextSave) {
  const std::string dir = FreshDir("temp");
  Net net;
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {10, 0, 1}, *net, nullptr).ok());
  // A writer that died (a child that has exited and been reaped) and one
  // still running (this test's parent): only the dead one's file goes.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  const std::string temp = absl::StrCat(dir, "/ckpt-000000000020.pt.tmp-", child);
  const std::string live = absl::StrCat(dir, "/ckpt-000000000030.pt.tmp-", getppid());
  std::ofstream(temp) << "half a checkpoint";
  std::ofstream(live) << "a checkpoint being written";
  auto restored = RestoreCheckpoint(dir, *net, nullptr);
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_TRUE(restored->has_value());
  EXPECT_EQ((*restored)->info.step, 10);
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {20, 0, 1}, *net, nullptr).ok());
  EXPECT_FALSE(fs::exists(temp)) << "a dead writer's temp file was kept";
  EXPECT_TRUE(fs::exists(live)) << "a running writer's temp file was removed";
  EXPECT_TRUE(fs::exists(dir + "/ckpt-000000000020.pt"));
}

// An older version wrote the fence without fsync before its rename, so a
// crash could leave it empty (or torn). A save and a restore of any round
// take such a fence over instead of failing forever with "does not hold a
// round".
TEST(CheckpointTest, AnEmptyOrTornFenceIsTakenOverNotAPermanentFailure) {
  const std::string dir = FreshDir("empty_fence");
  Net net;
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {10, 1, 2, "job-a"}, *net, nullptr).ok());
  const std::string fence = dir + "/lockstep-round";
  fs::resize_file(fence, 0);
  Status saved = SaveCheckpoint(dir, 0, {20, 1, 2, "job-a"}, *net, nullptr);
  EXPECT_TRUE(saved.ok()) << saved;
  EXPECT_EQ(ReadFile(fence), "job-a 1\n");

  fs::resize_file(fence, 0);
  auto restored = RestoreCheckpoint(dir, *net, nullptr, /*round=*/2, "job-a");
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_TRUE(restored->has_value());
  EXPECT_EQ((*restored)->info.step, 20);
  EXPECT_EQ(ReadFile(fence), "job-a 2\n");
  // The fence works again: round 1 is refused.
  EXPECT_EQ(SaveCheckpoint(dir, 0, {30, 1, 2, "job-a"}, *net, nullptr).code(),
            absl::StatusCode::kFailedPrecondition);

  for (const char* torn : {"job-a ", "job-a 2x", "\n", "jo", "job-a 9"}) {
    std::ofstream(fence, std::ios::trunc) << torn;
    saved = SaveCheckpoint(dir, 0, {30, 2, 2, "job-a"}, *net, nullptr);
    EXPECT_TRUE(saved.ok()) << "fence \"" << torn << "\": " << saved;
    EXPECT_EQ(ReadFile(fence), "job-a 2\n") << "fence \"" << torn << "\"";
  }
}

// A fence write's temp file ("lockstep-round.tmp-<pid>") left by a writer
// killed mid-write is removed by the next save. Fence writes run under the
// dir's lock, which that save holds when it looks, so any such file is
// dead, whatever its pid.
TEST(CheckpointTest, LeftoverFenceTempFileIsRemovedByTheNextSave) {
  const std::string dir = FreshDir("fence_temp");
  Net net;
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {10, 1, 1, "job-a"}, *net, nullptr).ok());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  const std::string dead = absl::StrCat(dir, "/lockstep-round.tmp-", child);
  const std::string other_host = absl::StrCat(dir, "/lockstep-round.tmp-", getppid());
  std::ofstream(dead) << "job-a ";
  std::ofstream(other_host) << "job-a 7";
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {20, 1, 1, "job-a"}, *net, nullptr).ok());
  EXPECT_FALSE(fs::exists(dead)) << "a dead writer's fence temp file was kept";
  EXPECT_FALSE(fs::exists(other_host)) << "a fence temp file was kept";
  EXPECT_EQ(ReadFile(dir + "/lockstep-round"), "job-a 1\n");
}

// A write that fails (here EFBIG: a file-size limit, as a full disk fails
// with ENOSPC) is Internal naming the path and the reason, the previous
// checkpoint untouched. LibTorch's writer threw on the short write and
// again from its destructor: the process aborted. Run in a child process,
// whose limit and fate are its own.
TEST(CheckpointTest, AFailedWriteIsInternalNotAnAbort) {
  const std::string dir = FreshDir("efbig");
  Net small(16);
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {1, 1, 1}, *small, nullptr).ok());
  // Made before the fork: the child runs no tensor op (OpenMP's threads do
  // not survive a fork), only the save's serialization.
  Net big(20000);  // 8 * 20000 + 20000 * 4 floats: about 1 MB
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit limit = {256 << 10, 256 << 10};
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(10);
    const Status s = SaveCheckpoint(dir, 0, {2, 1, 1}, *big, nullptr);
    if (s.code() != absl::StatusCode::kInternal) _exit(11);
    const std::string m(s.message());
    if (m.find(dir) == std::string::npos || m.find("File too large") == std::string::npos) _exit(12);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: setrlimit; 11: not Internal; 12: the message";
  auto listed = ListCheckpoints(dir);
  ASSERT_TRUE(listed.ok());
  EXPECT_THAT(Names(*listed), ElementsAre("ckpt-000000000001.pt"));
  Net back(16);
  auto restored = RestoreCheckpoint(dir, *back, nullptr);
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_TRUE(restored->has_value());
  ExpectSameState(small, back);
}

TEST(CheckpointTest, TruncatedCheckpointIsDataLossNamingThePath) {
  const std::string dir = FreshDir("truncated");
  Net net;
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {10, 0, 1}, *net, nullptr).ok());
  const std::string path = dir + "/ckpt-000000000010.pt";
  fs::resize_file(path, fs::file_size(path) / 2);
  auto restored = RestoreCheckpoint(dir, *net, nullptr);
  ASSERT_FALSE(restored.ok());
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kDataLoss) << restored.status();
  EXPECT_THAT(std::string(restored.status().message()), HasSubstr(path));
}

TEST(CheckpointTest, GarbageCheckpointIsDataLossNamingThePath) {
  const std::string dir = FreshDir("garbage");
  fs::create_directories(dir);
  const std::string path = dir + "/ckpt-000000000010.pt";
  std::ofstream(path) << "this is not a zip archive";
  Net net;
  auto restored = RestoreCheckpoint(dir, *net, nullptr);
  ASSERT_FALSE(restored.ok());
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kDataLoss) << restored.status();
  EXPECT_THAT(std::string(restored.status().message()), HasSubstr(path));
}

TEST(CheckpointTest, OtherModelShapeIsFailedPreconditionAndLeavesTheModelUnchanged) {
  const std::string dir = FreshDir("shape");
  Net small(16);
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {10, 0, 1}, *small, nullptr).ok());
  Net big(32);
  const torch::Tensor before = big->fc2->weight.clone();
  auto restored = RestoreCheckpoint(dir, *big, nullptr);
  ASSERT_FALSE(restored.ok());
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kFailedPrecondition) << restored.status();
  EXPECT_THAT(std::string(restored.status().message()), HasSubstr("fc1.weight"));
  EXPECT_THAT(std::string(restored.status().message()), HasSubstr("ckpt-000000000010.pt"));
  EXPECT_TRUE(torch::equal(big->fc2->weight, before));
}

// A checkpoint of a bigger model (a layer more) is refused naming what the
// model lacks, as PyTorch's strict load_state_dict does ("Unexpected
// key(s)"); it was restored into the smaller one without a word.
struct BiggerNetImpl : torch::nn::Module {
  BiggerNetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    bn = register_module("bn", torch::nn::BatchNorm1d(16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
    fc3 = register_module("fc3", torch::nn::Linear(4, 4));
    extra = register_parameter("extra", torch::zeros({2}));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::Tensor extra;
};
TORCH_MODULE(BiggerNet);

TEST(CheckpointTest, ACheckpointOfABiggerModelIsFailedPreconditionNamingWhatIsLeftOver) {
  const std::string dir = FreshDir("bigger");
  BiggerNet big;
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {1, 1, 1}, *big, nullptr).ok());
  Net net;
  const torch::Tensor before = net->fc1->weight.clone();
  auto restored = RestoreCheckpoint(dir, *net, nullptr);
  ASSERT_FALSE(restored.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(restored.status())) << restored.status();
  EXPECT_THAT(std::string(restored.status().message()),
              HasSubstr("does not match the model: it has "));
  EXPECT_THAT(std::string(restored.status().message()), HasSubstr(", which the model does not"));
  EXPECT_TRUE(torch::equal(net->fc1->weight, before)) << "the model changed";
  // And the same model still restores (nothing else is left over).
  Net same;
  const std::string dir2 = FreshDir("same");
  ASSERT_TRUE(SaveCheckpoint(dir2, 0, {1, 1, 1}, *same, nullptr).ok());
  Net back;
  auto ok = RestoreCheckpoint(dir2, *back, nullptr);
  ASSERT_TRUE(ok.ok()) << ok.status();
  ExpectSameState(same, back);
}

TEST(CheckpointTest, MissingOptimizerStateIsFailedPrecondition) {
  const std::string dir = FreshDir("no_opt");
  Net net;
  ASSERT_TRUE(SaveCheckpoint(dir, 0, {10, 0, 1}, *net, nullptr).ok());
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  auto restored = RestoreCheckpoint(dir, *net, &opt);
  ASSERT_FALSE(restored.ok());
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(restored.status().message()), HasSubstr("optimizer"));
}

TEST(CheckpointTest, NegativeStepIsInvalidArgument) {
  Net net;
  EXPECT_EQ(SaveCheckpoint(FreshDir("neg"), 0, {-1, 0, 1}, *net, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ddp
}  // namespace lockstep
