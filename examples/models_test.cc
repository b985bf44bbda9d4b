// The benchmark workloads are the peer script's models
// (../shared/bench/torch_ddp_bench.py): same parameter and buffer counts,
// same number of parameter tensors, same input shapes. The counts were read
// off PyTorch 1.13 running that script's make_model().
#include "examples/models.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace lockstep {
namespace examples {
namespace {

struct PeerModel {
  const char* name;
  int64_t params;
  int64_t param_tensors;
  int64_t buffer_elements;  // BatchNorm running stats and counters
  std::vector<int64_t> input_shape;
};

class ModelsTest : public ::testing::TestWithParam<PeerModel> {};

TEST_P(ModelsTest, MatchesThePeerScriptsDefinition) {
  const PeerModel& peer = GetParam();
  auto w = MakeWorkload(peer.name, 0);
  ASSERT_TRUE(w.ok()) << w.status();
  int64_t params = 0, tensors = 0, buffers = 0;
  for (const auto& p : w->root->parameters()) {
    params += p.numel();
    ++tensors;
  }
  for (const auto& b : w->root->buffers()) buffers += b.numel();
  EXPECT_EQ(params, peer.params);
  EXPECT_EQ(tensors, peer.param_tensors);
  EXPECT_EQ(buffers, peer.buffer_elements);
  EXPECT_EQ(w->input_shape, peer.input_shape);

  auto [x, y] = MakeBatch(*w, 2, 0);
  torch::NoGradGuard no_grad;
  torch::Tensor out = w->module.forward(x);
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 10}));
}

INSTANTIATE_TEST_SUITE_P(
    PeerWorkloads, ModelsTest,
    ::testing::Values(PeerModel{"mlp", 37801994, 8, 0, {1024}},
                      PeerModel{"convnet", 1112714, 22, 1669, {3, 32, 32}},
                      PeerModel{"transformer", 4820490, 74, 0, {32, 256}}),
    [](const ::testing::TestParamInfo<PeerModel>& info) { return std::string(info.param.name); });

// Not a peer model: ten linear layers, eight of them 2048x2048 (16 MB each).
TEST(ModelsTest, DeepMlpHasEqualLayers) {
  auto w = MakeWorkload("deep_mlp", 0);
  ASSERT_TRUE(w.ok()) << w.status();
  int64_t params = 0, square = 0;
  for (const auto& p : w->root->parameters()) {
    params += p.numel();
    square += p.dim() == 2 && p.size(0) == 2048 && p.size(1) == 2048;
  }
  EXPECT_EQ(params, 34117642);
  EXPECT_EQ(square, 8);
  auto [x, y] = MakeBatch(*w, 2, 0);
  torch::NoGradGuard no_grad;
  EXPECT_EQ(w->module.forward(x).sizes(), (std::vector<int64_t>{2, 10}));
}

TEST(ModelsTest, UnknownModelIsNamed) {
  auto w = MakeWorkload("resnet9000", 0);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("resnet9000"), std::string::npos);
}

}  // namespace
}  // namespace examples
}  // namespace lockstep
